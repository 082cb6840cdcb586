"""Every bad input to the head's command line (`python -m launcher ...`, i.e. `make run ARGS=...`) ends in one
`error: ...` line on stderr and exit status 2, never a traceback, and is refused before the head makes anything:
no run dir, no ipc temp dir (/tmp/mapx-*, mario-apex-*), no replay, no socket, no collector process.

Each case runs in-process through `launcher.__main__.main` (fast); a subset runs as a real subprocess too, to
prove the exit status, the single stderr line and an empty TMPDIR for the child.
"""

from __future__ import annotations

import errno
import importlib.util
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from config_optimized import load_profile
from envs.checks import spec_from_config
from envs.spec import EnvSpec
from launcher.__main__ import main
from launcher.cli import parse_args
from shared.config import ConfigError
from shared.config_checks import (
    COLLECTOR_NETWORK_COPIES,
    LEARNER_NETWORK_COPIES,
    estimate_network_bytes,
    estimate_network_params,
)

ROOT = Path(__file__).resolve().parents[1]
BASE = ["--profile", "cpu", "--max-seconds", "1", "--collectors", "0"]  # case flags come later and win
TEMP_PREFIXES = ("mapx-", "mario-apex-")  # shared/tempdirs.py (the head's ipc folders), and older versions


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    """Paths the cases refer to as {name}: a plain file, keys dirs in various states, run dirs to resume."""
    from shared.keys import AUTHORIZED, generate

    (tmp_path / "afile").write_text("not a directory\n")
    (tmp_path / "emptykeys").mkdir()
    generate(tmp_path / "goodkeys")
    generate(tmp_path / "noauth")
    (tmp_path / "noauth" / AUTHORIZED / "client.key").unlink()
    generate(tmp_path / "nosecret")
    (tmp_path / "nosecret" / "server.key_secret").unlink()
    generate(tmp_path / "badsecret")
    (tmp_path / "badsecret" / "server.key_secret").write_text("garbage\n")
    (tmp_path / "nockpt").mkdir()
    (tmp_path / "badckpt" / "checkpoint").mkdir(parents=True)
    (tmp_path / "badckpt" / "checkpoint" / "meta.json").write_text("{")
    (tmp_path / "cartrun").mkdir()  # a CartPole run's config.json: resumed by a command without --env
    (tmp_path / "cartrun" / "config.json").write_text('{"env": {"env_id": "CartPole-v1"}}')
    names = ("afile", "emptykeys", "goodkeys", "noauth", "nosecret", "badsecret", "nockpt", "badckpt", "cartrun")
    return {name: str(tmp_path / name) for name in names} | {"tmp": str(tmp_path)}


@pytest.fixture
def busy_port():
    """A control port another process already listens on (as a running head would)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _no_cuda() -> bool:
    import torch

    return not torch.cuda.is_available()


# (id, case flags with {file} placeholders, words the one error line must contain)
CASES = [
    ("env-unknown", ["--env", "Foo-v0"], ["Foo-v0", "not a registered Gymnasium id"]),
    ("set-env-unknown", ["--set", "env.env_id=Foo-v0"], ["Foo-v0", "not a registered Gymnasium id"]),
    ("env-continuous", ["--env", "Pendulum-v1"], ["Pendulum-v1", "continuous action space (Box", "Discrete"]),
    ("set-env-continuous", ["--set", "env.env_id=MountainCarContinuous-v0"],
     ["MountainCarContinuous-v0", "continuous action space", "Discrete"]),
    ("mario-world", ["--env", "SuperMarioBros-9-9-v0"], ["SuperMarioBros-9-9-v0", "W 1-8, S 1-4", "did you mean"]),
    ("set-mario-version", ["--set", "env.env_id=SuperMarioBros-1-1-v7"],
     ["SuperMarioBros-1-1-v7", "N 0-3", "SuperMarioBros-1-1-v3"]),
    ("mario-prefix", ["--env", "SuperMarioBros3-v0"], ["SuperMarioBros3-v0", "not supported"]),
    ("ale-without-ale-py", ["--env", "ALE/Pong-v5"], ["ALE/Pong-v5", "cannot be built", "ale-py"]),
    ("ale-unknown", ["--env", "ALE/Nope-v5"], ["ALE/Nope-v5", "unknown Atari env id", "did you mean", "ALE/Pong-v5"]),
    ("frame-too-small", ["--set", "env.frame_size=32"], ["env.frame_size=32", "36"]),
    ("max-seconds-nan", ["--max-seconds", "nan"], ["--max-seconds=nan", "finite"]),
    ("max-seconds-inf", ["--max-seconds", "inf"], ["--max-seconds=inf", "finite"]),
    ("max-seconds-negative", ["--max-seconds", "-5"], ["--max-seconds=-5", ">= 0"]),
    ("max-seconds-text", ["--max-seconds", "abc"], ["--max-seconds", "'abc'"]),
    ("target-return-nan", ["--target-return", "nan"], ["--target-return=nan", "finite"]),
    ("target-return-inf", ["--target-return=-inf"], ["--target-return=-inf", "finite"]),
    ("until-flags-above-one", ["--until-flags", "1.5"], ["logging.stop_flag_rate=1.5", "[0.0, 1.0]"]),
    ("until-flags-nan", ["--until-flags", "nan"], ["logging.stop_flag_rate=nan"]),
    ("until-flags-cartpole", ["--env", "CartPole-v1", "--until-flags", "0.8"],
     ["logging.stop_flag_rate=0.8", "CartPole-v1", "only Mario evaluations count flags"]),
    ("until-flags-no-evals", ["--until-flags", "0.8", "--set", "logging.eval_every_s=0"],
     ["logging.stop_flag_rate=0.8", "logging.eval_every_s=0"]),
    ("stop-flag-evals-zero", ["--until-flags", "0.8", "--set", "logging.stop_flag_evals=0"],
     ["logging.stop_flag_evals=0", "[1, 1000]"]),
    ("log-interval-nan", ["--log-interval", "nan"], ["logging.interval_s=nan", "(0.0, 86400.0]"]),
    ("lr-nan", ["--set", "learner.lr=nan"], ["learner.lr=nan"]),
    ("encoder-unknown", ["--set", "learner.encoder=resnet"], ["learner.encoder='resnet'", "nature, impala"]),
    ("encoder-width-nature", ["--set", "learner.encoder_width=2"], ["learner.encoder_width=2", "impala"]),
    ("encoder-vector-env", ["--env", "CartPole-v1", "--set", "learner.encoder=impala"],
     ["learner.encoder='impala'", "CartPole-v1", "vector observations"]),
    ("weight-decay-above-one", ["--set", "learner.weight_decay=2"], ["learner.weight_decay=2", "[0.0, 1.0]"]),
    ("augment-negative", ["--set", "learner.augment_shift=-1"], ["learner.augment_shift=-1", "[0, 32]"]),
    ("augment-past-a-quarter", ["--set", "learner.augment_shift=22"], ["learner.augment_shift=22", "[0, 21]", "84x84"]),
    ("augment-vector-env", ["--env", "CartPole-v1", "--set", "learner.augment_shift=4"],
     ["learner.augment_shift=4", "shape (4,)", "2-D frames"]),
    ("hidden-too-big", ["--env", "CartPole-v1", "--set", "learner.hidden=65536"],
     ["learner.hidden=65536", "GiB", "available"]),
    ("set-hidden-too-big", ["--set", "env.env_id=CartPole-v1", "--set", "learner.hidden=65536"],
     ["learner.hidden=65536", "available"]),
    ("bind-ipv6", ["--bind", "::1"], ["transport.bind='::1'", "IPv4", "127.0.0.1"]),
    ("set-bind-ipv6", ["--set", "transport.bind=fe80::1", "--curve-keys", "{noauth}"], ["fe80::1", "IPv4"]),
    ("bind-name", ["--bind", "nosuchif0", "--curve-keys", "{goodkeys}"],
     ["transport.bind='nosuchif0'", "IPv4 address", "not a host or interface name"]),
    ("bind-not-here", ["--bind", "192.0.2.1", "--curve-keys", "{goodkeys}"],  # TEST-NET-1: on no machine
     ["transport.bind='192.0.2.1'", "cannot bind 192.0.2.1:", "Cannot assign requested address"]),
    ("port-in-use", ["--port", "{busy_port}"], ["transport.port={busy_port}", "Address already in use", "another head", "--port N"]),
    ("run-dir-is-file", ["--run-dir", "{afile}"], ["--run-dir", "{afile}", "not a directory"]),
    ("run-dir-under-file", ["--run-dir", "{afile}/sub"], ["{afile}/sub", "not a directory"]),
    ("keys-missing", ["--curve-keys", "{tmp}/nokeys"], ["--curve-keys", "{tmp}/nokeys", "does not exist", "make keys"]),
    ("keys-empty", ["--curve-keys", "{emptykeys}"], ["{emptykeys}", "server.key_secret", "authorized_clients"]),
    ("keys-no-authorized", ["--curve-keys", "{noauth}"], ["{noauth}", "lacks authorized_clients/*.key"]),
    ("keys-no-secret", ["--curve-keys", "{nosecret}"], ["{nosecret}", "lacks server.key_secret"]),
    ("keys-bad-secret", ["--curve-keys", "{badsecret}"], ["server.key_secret", "not a readable CURVE certificate"]),
    ("device-cuda", ["--set", "learner.device=cuda"], ["learner.device='cuda'", "no CUDA device"]),
    ("backend-unknown", ["--set", "env.backend=snes"], ["env.backend='snes'", "allowed auto, nes-py, retro"]),
    ("backend-retro-missing", ["--set", "env.backend=retro"],
     ["env.backend='retro'", "stable-retro is not installed", "EXTRAS=retro"]),
    ("resume-no-checkpoint", ["--resume", "{nockpt}"], ["--resume", "{nockpt}", "no checkpoint found"]),
    ("resume-missing", ["--resume", "{tmp}/nothere"], ["--resume", "{tmp}/nothere", "no such run directory"]),
    ("resume-other-env", ["--resume", "{cartrun}"],
     ["--resume", "{cartrun}", "trained on CartPole-v1", "SuperMarioBros-1-1-v0", "add --env CartPole-v1"]),
]
# the real child processes: one per kind of check (flags, config, env, memory, keys, run dir, port, device)
SUBPROCESS = ("env-unknown", "env-continuous", "ale-unknown", "set-mario-version", "max-seconds-nan", "max-seconds-text",
              "hidden-too-big", "backend-unknown", "bind-ipv6", "bind-not-here", "port-in-use", "run-dir-is-file", "keys-empty", "device-cuda")


def _skip_reason(case_id: str) -> str | None:
    if case_id == "ale-without-ale-py" and importlib.util.find_spec("ale_py") is not None:
        return "ale_py is installed (setup.cfg pins it): ALE ids are registered"
    if case_id == "backend-retro-missing" and importlib.util.find_spec("stable_retro") is not None:
        return "stable-retro is installed (make install EXTRAS=retro): env.backend=retro runs"
    if case_id == "device-cuda" and not _no_cuda():
        return "this machine has a CUDA device"
    return None


def _fill(items: list[str], values: dict[str, object]) -> list[str]:
    return [item.format(**values) for item in items]


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ") or " ERROR " in line]


@pytest.mark.parametrize(("case_id", "flags", "words"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_error_line_and_status_2(case_id, flags, words, files, busy_port, tmp_path, capsys):
    if (reason := _skip_reason(case_id)) is not None:
        pytest.skip(reason)
    values = files | {"busy_port": busy_port}
    run_dir = tmp_path / "run"
    code = _run_main([*BASE, "--run-dir", str(run_dir), *_fill(flags, values)])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for word in _fill(words, values):
        assert word in lines[0], (word, lines[0])
    assert not run_dir.exists(), "refused before the run dir was created"


def _run_main(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own errors (bad flag, value of the wrong type) exit here
        return int(exc.code)


@pytest.mark.parametrize("case_id", SUBPROCESS)
def test_bad_input_in_a_real_process(case_id, files, busy_port, tmp_path):
    if (reason := _skip_reason(case_id)) is not None:
        pytest.skip(reason)
    _, flags, words = next(c for c in CASES if c[0] == case_id)
    values = files | {"busy_port": busy_port}
    run_dir = tmp_path / "run"
    proc, leftovers = _run_head([*BASE, "--run-dir", str(run_dir), *_fill(flags, values)], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for word in _fill(words, values):
        assert word in lines[0]
    assert proc.stdout == ""
    assert not run_dir.exists()
    assert leftovers == []


def test_corrupt_checkpoint_exits_2_and_leaves_no_temp_dirs(files, tmp_path):
    """--resume with a checkpoint the head cannot load fails inside the head (after replay, sockets and temp
    dirs exist, with ipc asked for): still exit 2, one logged error line naming the file, and a failed start
    removes what it made."""
    run_dir = tmp_path / "run"
    proc, leftovers = _run_head(["--profile", "cpu", "--env", "CartPole-v1", "--port", "0", "--collectors", "0",
                                 "--max-seconds", "1", "--run-dir", str(run_dir), "--resume", files["badckpt"],
                                 "--set", "transport.local_transport=ipc"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = _error_lines(proc.stderr)
    assert len(errors) == 1 and "meta.json" in errors[0], proc.stderr
    assert leftovers == [], "a failed start must remove its ipc temp dirs"


# Imported at the child's start (PYTHONPATH): records every tempfile.mkdtemp the child makes, wherever it
# puts it (shared/tempdirs.py falls back to /tmp when TMPDIR is too long for a unix socket path, as the
# child's can be here), so tests running at the same time, with heads of their own, cannot be mistaken for
# this child's leftovers.
_RECORDER = """
import os, tempfile
_mkdtemp = tempfile.mkdtemp
def _recording_mkdtemp(*args, **kwargs):
    path = _mkdtemp(*args, **kwargs)
    with open(os.environ["MAPX_TEST_MKDTEMP_LOG"], "a") as fh:
        fh.write(os.path.abspath(path) + "\\n")
    return path
tempfile.mkdtemp = _recording_mkdtemp
"""


def _run_head(argv: list[str], tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run `python -m launcher ARGV` with its own TMPDIR; return the process and the ipc temp dirs it left."""
    child_tmp = tmp_path / "child-tmp"
    child_tmp.mkdir(exist_ok=True)
    hook = tmp_path / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(_RECORDER)
    made = tmp_path / "mkdtemp.log"
    path = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, TMPDIR=str(child_tmp), PYTHONPATH=path, MAPX_TEST_MKDTEMP_LOG=str(made))
    proc = subprocess.run([sys.executable, "-m", "launcher", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    recorded = made.read_text().split() if made.exists() else []
    leftovers = [p for p in recorded if Path(p).name.startswith(TEMP_PREFIXES) and Path(p).exists()]
    leftovers += [str(p) for p in child_tmp.iterdir() if p.name.startswith(TEMP_PREFIXES) and str(p) not in leftovers]
    return proc, sorted(leftovers)


def test_unwritable_run_dir(tmp_path, capsys, monkeypatch):
    parent = tmp_path / "ro"
    parent.mkdir()
    real_access = os.access
    monkeypatch.setattr("launcher.cli.os.access", lambda p, mode: False if Path(p) == parent else real_access(p, mode))
    code = main([*BASE, "--run-dir", str(parent / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == f"error: --run-dir {parent / 'run'} is invalid: {parent} is not writable"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_unwritable_run_dir_for_real(tmp_path, capsys):
    parent = tmp_path / "ro"
    parent.mkdir(mode=0o500)
    code = main([*BASE, "--run-dir", str(parent / "run")])
    assert code == 2 and "not writable" in capsys.readouterr().err


def test_resolve_device_raises_config_error():
    if not _no_cuda():
        pytest.skip("this machine has a CUDA device")
    from launcher.head import resolve_device

    with pytest.raises(ConfigError, match="learner.device='cuda'"):
        resolve_device("cuda")
    assert str(resolve_device("auto")) == "cpu"


def test_good_input_still_parses(tmp_path):
    cfg, opts = parse_args([*BASE, "--env", "CartPole-v1", "--port", "0", "--run-dir", str(tmp_path / "run"),
                            "--max-seconds", "0", "--target-return", "475"])
    assert cfg.env.env_id == "CartPole-v1" and opts.max_seconds == 0 and opts.target_return == 475
    assert not (tmp_path / "run").exists()  # parsing creates nothing


# ---------------------------------------------------------------------- the network memory estimate
@pytest.mark.parametrize(
    ("overrides", "obs_shape", "stack", "num_actions"),
    [
        ([], None, None, None),  # Mario from the config alone: 84x84 x 4, simple (7 actions)
        (["env.action_set=right_only", "learner.dueling=false", "env.frame_size=36"], None, None, None),
        (["env.frame_size=100", "env.frame_stack=2", "learner.hidden=64"], None, None, None),
        (["env.env_id=CartPole-v1", "learner.hidden=256"], (4,), 1, 2),
        (["env.env_id=ApeXCounting-v0", "learner.hidden=32"], (84, 84), 4, 3),
        (["learner.encoder=impala"], None, None, None),  # Mario's 84x84 x 4 through the IMPALA CNN
        (["learner.encoder=impala", "learner.encoder_width=2", "env.frame_size=17", "env.frame_stack=2",
          "learner.dueling=false"], None, None, None),  # odd sides: every max pool rounds up
        (["env.env_id=ApeXCounting-v0", "learner.hidden=32", "learner.encoder=impala", "learner.encoder_width=3"],
         (84, 84), 4, 3),
        (["learner.quantiles=32"], None, None, None),  # QR-DQN: 32 quantiles per action and 32 values
        (["env.env_id=CartPole-v1", "learner.hidden=64", "learner.quantiles=7", "learner.dueling=false"], (4,), 1, 2),
        (["learner.noisy_sigma=0.5"], None, None, None),  # NoisyNet: a sigma beside every mu of the head
        (["env.env_id=CartPole-v1", "learner.hidden=64", "learner.noisy_sigma=0.1", "learner.quantiles=3",
          "learner.munchausen_alpha=0"], (4,), 1, 2),
    ],
)
def test_network_estimate_counts_the_built_network(overrides, obs_shape, stack, num_actions):
    from envs.mario.actions import num_actions as mario_actions
    from shared.network import build_q_network

    cfg = load_profile("cpu", overrides)
    e = cfg.env
    built = build_q_network(
        obs_shape or (e.frame_size, e.frame_size),
        stack or e.frame_stack,
        num_actions or mario_actions(e.action_set),
        hidden=cfg.learner.hidden,
        dueling=cfg.learner.dueling,
        encoder=cfg.learner.encoder,
        encoder_width=cfg.learner.encoder_width,
        quantiles=cfg.learner.quantiles,
        noisy_sigma=cfg.learner.noisy_sigma,
    )
    params = sum(p.numel() for p in built.parameters())
    # Mario's cases: the spec the config alone implies (what check_valid sizes the network by)
    spec = spec_from_config(cfg) if obs_shape is None else EnvSpec(
        obs_shape, np.uint8 if len(obs_shape) == 2 else np.float32, num_actions, stack)
    assert estimate_network_params(cfg, spec) == params
    copies = LEARNER_NETWORK_COPIES + COLLECTOR_NETWORK_COPIES * cfg.collectors.count
    assert estimate_network_bytes(cfg, spec) == 4 * params * copies


def test_unknown_vector_env_is_a_lower_bound():
    cfg = load_profile("cpu", ["env.env_id=CartPole-v1", "learner.hidden=256"])
    assert estimate_network_params(cfg) < estimate_network_params(cfg, EnvSpec((4,), np.float32, 2, 1))


def test_wide_network_is_refused_naming_learner_hidden():
    wide = load_profile("cpu", ["learner.hidden=65536"])  # Mario: ~412M parameters, 1.5 GiB a copy
    with pytest.raises(ConfigError) as err:
        wide.check_valid(available_bytes=16 * 2**30)
    message = str(err.value)
    assert "learner.hidden=65536" in message and "411,775,144 parameters" in message and "\n" not in message
    load_profile("cpu").check_valid(available_bytes=16 * 2**30)  # the default width fits easily
    # the replay alone too big still names replay.capacity, not learner.hidden
    with pytest.raises(ConfigError, match="replay.capacity"):
        load_profile("cpu", ["replay.capacity=3000000", "learner.hidden=65536"]).check_valid(4 * 2**30)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("field", ["learner.lr", "replay.gamma", "logging.interval_s", "env.reward_scale"])
def test_non_finite_floats_fail(field, value):
    cfg = load_profile("cpu", [f"{field}={value}"])
    section, name = field.split(".")
    assert not math.isfinite(getattr(getattr(cfg, section), name))  # parsed, then refused by check_valid
    with pytest.raises(ConfigError, match=field):
        cfg.check_valid(available_bytes=64 * 2**30)


@pytest.mark.parametrize(("code", "advice"), [(errno.EADDRINUSE, True), (errno.ENODEV, False)])
def test_bind_error_in_the_head_names_what_failed(code, advice, tmp_path, monkeypatch, caplog):
    """A bind that fails inside the head (a port taken after the CLI's probe, ...) is one ERROR line; only a
    port clash gets the "another head?" advice, anything else shows zmq's own error and the endpoint."""
    import zmq

    import launcher.__main__ as entry

    class FailingHead:
        def __init__(self, *args, **kwargs):
            error = zmq.ZMQError(code)
            error.strerror += " (addr='tcp://127.0.0.1:5555')"
            raise error

    monkeypatch.setattr(entry, "_setup_logging", lambda run_dir: None)  # keep the test process's logging as is
    monkeypatch.setattr(entry.signal, "signal", lambda *args: None)
    monkeypatch.setattr("launcher.head.Head", FailingHead)
    with caplog.at_level("ERROR", logger="mario_apex"):
        assert main([*BASE, "--port", "0", "--run-dir", str(tmp_path / "run")]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "\n" not in errors[0] and "tcp://127.0.0.1:5555" in errors[0], errors
    assert ("another head" in errors[0]) == advice
    assert os.strerror(code) in errors[0] or zmq.strerror(code) in errors[0]

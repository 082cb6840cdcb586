"""Command line of the head: `make run ARGS="..."` ends up here.

Turns a profile, the env's preset (both in config_optimized.py), `--set section.field=value`
overrides and the shortcut flags into one validated `Config` before anything is allocated; a bad
value exits with status 2 and a message naming the field, the value and what is allowed.
Validation covers what needs the outside world too (the env id and its spaces, memory for replay
and networks, the run dir, CURVE keys, CUDA, a checkpoint to resume or start from), so a bad input fails before
any socket, temp dir, buffer or process exists.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import json
import math
import os
import socket
import time
from dataclasses import dataclass, replace
from pathlib import Path

from config_optimized import PROFILES, backend_of, cpu_auto_split, load_config
from envs.spec import EnvSpec
from shared.config import Config, ConfigError, TransportConfig
from shared.config_checks import check_augment, check_memory

# Exit statuses of `python -m launcher` (the --help epilog lists them for a supervisor).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_PROGRESS_LOST = 3
EXIT_FORCED = 130
EXIT_CODES = f"""exit status:
  {EXIT_OK}    stopped by a limit, a target (--target-return, --until-flags) or a signal, with its final checkpoint written (or --no-train)
  {EXIT_FAILED}    the head stopped on an internal failure (head.log says which); the final checkpoint was written
  {EXIT_BAD_INPUT}    bad input: a flag, config value, env, run dir, keys, device, port or a checkpoint that cannot be
       resumed or started from; one `error:` line, nothing left running
  {EXIT_PROGRESS_LOST}    the run trained but its final checkpoint could not be written (e.g. a full disk): the
       training since its last checkpoint (or since it started) is lost; one ERROR line says why
  {EXIT_FORCED}  a second Ctrl-C forced the exit: no final checkpoint
"""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line (`error: ...`, status 2) instead of usage + error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {message} (see python -m launcher --help)\n")


@dataclass(frozen=True)
class RunOptions:
    """What the head does with a config: where it writes and when it stops."""

    run_dir: Path
    resume: Path | None
    max_env_steps: int | None
    max_updates: int | None
    max_seconds: float | None
    target_return: float | None
    train: bool
    inprocess: bool = False  # collectors as threads of the head (debugging: one process, one log)
    launcher: str = "local"  # who runs the collectors: "local" (child processes) or "ray" (actors on a Ray cluster)
    ray_address: str = ""  # the Ray cluster to join ("" = Ray's rule: RAY_ADDRESS, else a new local Ray)
    env_spec: EnvSpec | None = None  # the env's spec as the checks read it: the head reuses it (no second build)
    profile_note: str = ""  # what the profile chose and why, for the start-up log ("" when there is nothing to say)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m launcher",
        description="Train Mario Ape-X: the head binds the sockets, runs replay and learner, and starts collectors.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--profile", default="auto", choices=sorted(PROFILES), help="hardware profile (config_optimized.py)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="override one config field; repeatable")
    parser.add_argument("--env", dest="env_id",
                        help="any Gymnasium id (default: Mario 1-1); same as --set env.env_id=ID")
    parser.add_argument("--collectors", type=int, help="local collector processes (0 = only remote ones)")
    parser.add_argument("--bind", help="IPv4 address (or localhost) to bind; non-loopback requires --curve-keys")
    parser.add_argument("--port", type=int,
                        help="control port; weights on port + 1 (data sockets are assigned); 0: any free ports, "
                             "written to <run-dir>/endpoints.json and logged")
    parser.add_argument("--curve-keys", help="directory made by `make keys` (enables CURVE authentication)")
    parser.add_argument("--max-env-steps", type=int, help="stop after this many env steps")
    parser.add_argument("--max-updates", type=int, help="stop after this many learner updates")
    parser.add_argument("--max-seconds", type=float, help="stop after this much wall time")
    parser.add_argument("--target-return", type=float,
                        help="stop once the mean return of the last logging.episode_window episodes reaches this")
    parser.add_argument("--until-flags", dest="until_flags", type=float, metavar="RATE",
                        help="Mario: stop once logging.stop_flag_evals periodic evaluations in a row reach this flag "
                             "rate (e.g. 0.8), final checkpoint written; same as --set logging.stop_flag_rate=RATE")
    parser.add_argument("--run-dir", help="where logs, metrics and checkpoints go (default runs/<timestamp>)")
    parser.add_argument("--resume", help="checkpointed run directory to continue")
    parser.add_argument("--init-from", dest="init_from",
                        help="run or checkpoint directory whose network a new run starts from (fresh optimizer, "
                             "counters and replay); same as --set learner.init_from=PATH")
    parser.add_argument("--no-train", action="store_true", help="collect and drain replay without updates (benchmarks)")
    parser.add_argument("--inprocess", action="store_true",
                        help="run collectors as threads of the head over inproc:// sockets (same messages; for "
                             "debugging with one debugger and one log, not for speed)")
    parser.add_argument("--launcher", choices=("local", "ray"), default="local",
                        help="who runs the collectors: local child processes (default) or actors on a Ray cluster "
                             "(needs the ray extra: pip install -e '.[ray]')")
    parser.add_argument("--ray-address",
                        help="with --launcher ray: the cluster to join (auto = the one `ray start` made on this "
                             "node; default: RAY_ADDRESS, else a new Ray on this machine)")
    parser.add_argument("--log-interval", type=float, help="seconds between progress lines")
    parser.add_argument("--seed", type=int, help="base seed")
    return parser


def parse_args(argv: list[str] | None = None) -> tuple[Config, RunOptions]:
    """Parse and validate; raises ConfigError with a precise message on any bad value."""
    args = build_parser().parse_args(argv)
    overrides = list(args.overrides)
    shortcuts = {
        "env.env_id": args.env_id,
        "collectors.count": args.collectors,
        "transport.bind": args.bind,
        "transport.port": args.port,
        "transport.curve_keys_dir": args.curve_keys,
        "logging.interval_s": args.log_interval,
        "env.seed": args.seed,
        "learner.init_from": args.init_from,
        "logging.stop_flag_rate": args.until_flags,
    }
    overrides += [f"{key}={value}" for key, value in shortcuts.items() if value is not None]
    cfg = load_config(args.profile, overrides)  # profile, the env's preset (config_optimized.py), overrides
    for name in ("max_env_steps", "max_updates"):
        value = getattr(args, name)
        if value is not None and value < 0:
            raise ConfigError(f"--{name.replace('_', '-')}={value} is invalid: allowed a non-negative integer")
    if args.max_seconds is not None and not (math.isfinite(args.max_seconds) and args.max_seconds >= 0):
        raise ConfigError(f"--max-seconds={args.max_seconds} is invalid: allowed a finite number >= 0")
    if args.target_return is not None and not math.isfinite(args.target_return):
        raise ConfigError(f"--target-return={args.target_return} is invalid: allowed a finite number")
    check_launcher(args)
    resume = Path(args.resume) if args.resume else None
    if resume is not None and not resume.is_dir():
        raise ConfigError(f"--resume {resume}: no such run directory")
    if resume is not None:
        check_resumed_env(resume, cfg.env.env_id)
    run_dir = Path(args.run_dir or cfg.logging.run_dir or (resume or Path("runs") / time.strftime("%Y%m%d-%H%M%S")))
    cfg = replace(cfg, logging=replace(cfg.logging, run_dir=str(run_dir)))
    cfg.check_valid()
    check_run_dir(run_dir)
    spec = check_runtime(cfg, resume)
    return cfg, RunOptions(
        run_dir=run_dir,
        resume=resume,
        max_env_steps=args.max_env_steps,
        max_updates=args.max_updates,
        max_seconds=args.max_seconds,
        target_return=args.target_return,
        train=not args.no_train,
        inprocess=args.inprocess,
        launcher=args.launcher,
        ray_address=args.ray_address or "",
        env_spec=spec,
        profile_note=profile_note(args.profile, cfg),
    )


def profile_note(profile: str, cfg: Config) -> str:
    """The start-up log's line on how `auto` split a CPU-only machine's cores, with what the run really uses
    (an env preset or `--set` may change either); "" for other profiles and CUDA learners."""
    if profile != "auto" or cfg.learner.device != "cpu":
        return ""
    backend = backend_of([f"env.backend={cfg.env.backend}"], cfg.env.env_id)
    return (f"profile auto on a CPU-only machine: {cpu_auto_split(backend=backend).reason}; this run: collectors.count="
            f"{cfg.collectors.count}, learner.torch_threads={cfg.learner.torch_threads} (0: the learner's own rule)")


def check_resumed_env(resume: Path, env_id: str) -> None:
    """ConfigError when the run being resumed trained on another env than this command would (the settings of a
    resumed run come from the command line, not from the run's config.json): names the --env to add. A run
    without a readable config.json is left to the checkpoint's own checks."""
    try:
        trained = json.loads((resume / "config.json").read_text())["env"]["env_id"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    if isinstance(trained, str) and trained != env_id:
        raise ConfigError(f"--resume {resume}: the run trained on {trained}, this command on {env_id}: add "
                          f"--env {trained} (and the run's other --set options; a resume takes its settings from "
                          "the command line)")


def check_launcher(args: argparse.Namespace) -> None:
    """ConfigError for launcher flags that do not go together, or --launcher ray without Ray installed."""
    if args.launcher != "ray":
        if args.ray_address is not None:
            raise ConfigError("--ray-address is invalid without --launcher ray")
        return
    if args.inprocess:
        raise ConfigError("--inprocess is invalid with --launcher ray: in-process collectors are threads of the head")
    import importlib.util

    if importlib.util.find_spec("ray") is None:  # found, not imported: importing Ray takes seconds
        from launcher.ray_collectors import RAY_MISSING

        raise ConfigError(RAY_MISSING)


def check_run_dir(run_dir: Path) -> None:
    """ConfigError unless `run_dir` is a directory or can be created as one, and is writable (nothing is created)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"--run-dir {run_dir} is invalid: it exists and is not a directory")
    probe = run_dir
    while not probe.exists() and probe != probe.parent:  # the nearest existing ancestor decides
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"--run-dir {run_dir} is invalid: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"--run-dir {run_dir} is invalid: {probe} is not writable")


def check_runtime(cfg: Config, resume: Path | None = None) -> EnvSpec:
    """The checks that need more than the config: env id and spaces, memory with the real EnvSpec,
    CURVE keys, CUDA, a checkpoint to resume or start from and free TCP ports. ConfigError (one line) for each.
    Returns the EnvSpec it read (the head takes it rather than building the env again)."""
    from envs.factory import env_spec  # gymnasium: imported only once the config itself is valid

    spec = env_spec(cfg.env)
    check_memory(cfg, spec=spec)
    check_augment(cfg.learner, spec)
    if cfg.transport.curve_keys_dir:
        from shared.keys import load_server

        load_server(cfg.transport.curve_keys_dir)  # presence of every file and that each parses
    if cfg.learner.device == "cuda":
        from launcher.head import resolve_device  # torch: only when a GPU is demanded

        resolve_device(cfg.learner.device)
    if resume is not None:
        from learner.checkpoint import CheckpointError, find_checkpoint

        try:
            find_checkpoint(resume)  # loading (and its integrity checks) happens in the head
        except CheckpointError as exc:
            raise ConfigError(f"--resume {exc}") from exc
    elif cfg.learner.init_from:
        from learner.checkpoint import CheckpointError, find_checkpoint

        try:
            find_checkpoint(cfg.learner.init_from)  # the head loads it and checks that it fits the network
        except CheckpointError as exc:
            raise ConfigError(f"learner.init_from={cfg.learner.init_from!r} is invalid: {exc}") from exc
    check_ports(cfg.transport)
    return spec


def check_ports(t: TransportConfig) -> None:
    """ConfigError when the control or weights port cannot be bound (another head?), before the head binds.

    A probe, not a reservation: the head's own bind still reports a port taken in between. Skipped for
    port 0 (any free) and binds that are not IPv4 literals or localhost (interface names: zmq reports).
    """
    if t.port == 0:
        return
    try:
        ipaddress.IPv4Address(t.bind)
    except ValueError:
        if t.bind != "localhost":
            return
    for port in (t.port, t.port + 1):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as zmq does: TIME_WAIT is no clash
            try:
                sock.bind((t.bind, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise ConfigError(
                        f"transport.port={t.port}: cannot bind {t.bind}:{port}: {exc.strerror}. Is another head "
                        "running on this machine? Pick other ports with --port N (control N, weights N+1) or --set "
                        "transport.port=0 (any free)") from None
                raise ConfigError(f"transport.bind={t.bind!r}: cannot bind {t.bind}:{port}: "
                                  f"{exc.strerror or exc}") from None


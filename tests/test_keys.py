"""CURVE keys: secrets born private, loaders that refuse exposed secrets, one key pair per collector
machine, and a machine revoked by deleting its public key while the head keeps running.

The connection tests use real CURVE sockets on loopback (port 0) and wait on socket monitor events
(handshake succeeded / refused by authentication), never on a sleep.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import zmq
import zmq.auth
from zmq.utils.monitor import recv_monitor_message

from shared.config import ConfigError
from shared.keys import (
    AUTHORIZED,
    CurveClient,
    LoggingAuthenticator,
    generate,
    load_client,
    load_server,
    main,
    start_authenticator,
)
from tests.support.cluster import ROOT, head_env

HANDSHAKE_WAIT_MS = 30_000  # an upper bound for a loaded machine: the tests wait on the event itself


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _public(path: Path) -> bytes:
    return zmq.auth.load_certificate(str(path))[0]


# ---------------------------------------------------------------------- modes
def test_secrets_are_created_0600_in_a_0700_directory_not_chmodded_afterwards(tmp_path, monkeypatch) -> None:
    """With the most permissive umask and every chmod made a no-op, the secret files and the directories
    holding them still have their private modes: they are created that way, with no moment at which
    another user could open them."""
    monkeypatch.setattr(os, "chmod", lambda *a, **k: None)
    monkeypatch.setattr(os, "fchmod", lambda *a, **k: None)
    old = os.umask(0)
    try:
        root = generate(tmp_path / "keys", clients=["m1"])
        legacy = generate(tmp_path / "legacy")
    finally:
        os.umask(old)
    for path in (root, root / "clients", legacy):
        assert _mode(path) == 0o700, (path, oct(_mode(path)))
    secrets = sorted(p for d in (root, legacy) for p in d.rglob("*.key_secret"))
    assert [p.relative_to(tmp_path).as_posix() for p in secrets] == [
        "keys/clients/m1.key_secret", "keys/server.key_secret", "legacy/client.key_secret", "legacy/server.key_secret"]
    for path in secrets:
        assert _mode(path) == 0o600, (path, oct(_mode(path)))


def test_an_existing_open_directory_is_closed_before_any_secret_is_written(tmp_path) -> None:
    (tmp_path / "keys").mkdir(mode=0o755)
    os.chmod(tmp_path / "keys", 0o755)
    root = generate(tmp_path / "keys")
    assert _mode(root) == 0o700 and _mode(root / "server.key_secret") == 0o600


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660], ids=lambda m: f"0{m:o}")
def test_loaders_refuse_a_secret_key_others_can_read(tmp_path, mode: int) -> None:
    root = generate(tmp_path / "keys", clients=["m1"])
    generate(tmp_path / "legacy")
    cases = [(root / "server.key_secret", lambda: load_server(root)),
             (root / "clients" / "m1.key_secret", lambda: load_client(root, "m1")),
             (tmp_path / "legacy" / "client.key_secret", lambda: load_client(tmp_path / "legacy"))]
    for path, load in cases:
        load()  # 0600: loads
        os.chmod(path, mode)
        with pytest.raises(ConfigError) as exc:
            load()
        message = str(exc.value)
        assert str(path) in message and f"mode 0{mode:o}" in message and "chmod 600" in message, message
        assert "\n" not in message
        os.chmod(path, 0o600)


def test_the_head_cli_exits_2_naming_an_exposed_secret(tmp_path, capsys) -> None:
    from launcher.__main__ import main as launcher_main

    root = generate(tmp_path / "keys")
    os.chmod(root / "server.key_secret", 0o644)
    run = tmp_path / "run"
    code = launcher_main(["--profile", "cpu", "--max-seconds", "1", "--collectors", "0", "--curve-keys", str(root),
                          "--run-dir", str(run)])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert str(root / "server.key_secret") in lines[0] and "mode 0644" in lines[0]
    assert not run.exists()


@pytest.mark.parametrize("launcher_mode", [False, True], ids=["one_collector", "launcher"])
def test_the_collector_cli_exits_2_naming_an_exposed_secret(tmp_path, launcher_mode: bool) -> None:
    root = generate(tmp_path / "keys", clients=["m1"])
    os.chmod(root / "clients" / "m1.key_secret", 0o640)
    argv = [sys.executable, "-m", "actors", "--connect", "tcp://127.0.0.1:9", "--curve-keys", str(root),
            "--curve-client", "m1", "--register-timeout", "60"]
    argv += ["--collectors", "1"] if launcher_mode else ["--slot", "0"]
    proc = subprocess.run(argv, cwd=ROOT, env=head_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert str(root / "clients" / "m1.key_secret") in lines[0] and "mode 0640" in lines[0]


def test_a_collector_machine_name_needs_the_keys_dir() -> None:
    from actors.__main__ import load_curve, parse_args

    with pytest.raises(ConfigError, match="--curve-client m1 is invalid without --curve-keys DIR"):
        load_curve(parse_args(["--connect", "tcp://127.0.0.1:9", "--curve-client", "m1"]))
    assert load_curve(parse_args(["--connect", "tcp://127.0.0.1:9"])) is None


# ---------------------------------------------------------------------- one key pair per machine
def test_keys_cli_issues_one_key_pair_per_machine(tmp_path, capsys) -> None:
    root = tmp_path / "keys"
    assert main(["--dir", str(root), "--client", "m1", "--client", "m2,m3"]) == 0
    names = ("m1", "m2", "m3")
    for name in names:
        pair = zmq.auth.load_certificate(str(root / "clients" / f"{name}.key_secret"))
        assert pair[1] is not None and pair[0] == _public(root / "clients" / f"{name}.key")
        assert _public(root / AUTHORIZED / f"{name}.key") == pair[0]
        assert load_client(root, name) == CurveClient(pair[0], pair[1], _public(root / "server.key"))
    assert len({_public(root / AUTHORIZED / f"{n}.key") for n in names}) == 3  # one pair each
    assert sorted(p.name for p in (root / AUTHORIZED).iterdir()) == ["m1.key", "m2.key", "m3.key"]
    assert not (root / "client.key_secret").exists()  # no shared pair beside the machines' own
    server = (root / "server.key_secret").read_bytes()
    m1 = (root / "clients" / "m1.key_secret").read_bytes()
    # a machine added later: the head's key and the other machines' keys stay as they are
    assert main(["--dir", str(root), "--client", "m4"]) == 0
    assert (root / "server.key_secret").read_bytes() == server and (root / "clients" / "m1.key_secret").read_bytes() == m1
    assert (root / AUTHORIZED / "m4.key").is_file()
    capsys.readouterr()
    # refused with one line: an existing machine without --overwrite (status 1, as existing keys always were),
    # a name that is not a plain file name (status 2, bad input)
    for argv, status, words in ((["--client", "m1"], 1, ["m1", "already", "--overwrite"]),
                                (["--client", "../evil"], 2, ["'../evil'", "letters, digits"]),
                                (["--client", ""], 2, ["''"]),
                                (["--client", "m5", "m5"], 2, ["repeat", "m5"])):
        assert main(["--dir", str(root), *argv]) == status
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and all(w in err[0] for w in words), err
    assert (root / "clients" / "m1.key_secret").read_bytes() == m1 and not (tmp_path / "evil.key").exists()


def test_the_single_client_layout_still_works(tmp_path, capsys) -> None:
    root = tmp_path / "keys"
    assert main(["--dir", str(root)]) == 0
    assert load_client(root).public == _public(root / AUTHORIZED / "client.key")
    load_server(root)
    assert main(["--dir", str(root)]) == 1 and "--overwrite" in capsys.readouterr().err


def test_a_client_name_the_keys_dir_has_no_key_for_is_one_line(tmp_path) -> None:
    root = generate(tmp_path / "keys", clients=["m1"])
    with pytest.raises(ConfigError, match=r"lacks clients/m2\.key_secret; .*--client m2"):
        load_client(root, "m2")


# ---------------------------------------------------------------------- revocation at run time
@contextmanager
def _curve_head(keys: Path) -> Iterator[tuple[str, zmq.Context, zmq.Socket]]:
    """A CURVE ROUTER on a random loopback port behind the head's authenticator: (endpoint, context, ROUTER)."""
    ctx = zmq.Context()
    auth = start_authenticator(ctx, keys)
    server = ctx.socket(zmq.ROUTER)
    try:
        load_server(keys).apply(server)
        port = server.bind_to_random_port("tcp://127.0.0.1")
        yield f"tcp://127.0.0.1:{port}", ctx, server
    finally:
        server.close(0)
        auth.stop()
        ctx.destroy(linger=0)


def _handshake(ctx: zmq.Context, endpoint: str, curve: CurveClient) -> bool:
    """Connect a fresh CURVE client; True when the handshake succeeds, False when authentication refuses it."""
    sock = ctx.socket(zmq.DEALER)
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
    try:
        curve.apply(sock)
        sock.connect(endpoint)
        assert monitor.poll(HANDSHAKE_WAIT_MS), "no handshake outcome"
        return recv_monitor_message(monitor)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED
    finally:
        sock.disable_monitor()
        monitor.close(0)
        sock.close(0)


def test_deleting_a_public_key_refuses_that_machine_without_restarting_the_head(tmp_path) -> None:
    """Two machines admitted; one key file deleted while the authenticator runs: that machine's next
    handshake is refused, the other's still succeeds; put back, it is admitted again. Built with the
    single-client layout plus a second machine's public key, so it checks the authenticator alone."""
    keys = generate(tmp_path / "keys")
    other = generate(tmp_path / "other")
    shutil.copy(other / "client.key", keys / AUTHORIZED / "other.key")
    first, second = load_client(keys), load_client(other)
    second = CurveClient(second.public, second.secret, first.server_public)
    with _curve_head(keys) as (endpoint, ctx, _):
        assert _handshake(ctx, endpoint, first) and _handshake(ctx, endpoint, second)
        (keys / AUTHORIZED / "other.key").rename(tmp_path / "other.key.revoked")
        assert not _handshake(ctx, endpoint, second)
        assert _handshake(ctx, endpoint, first)
        (tmp_path / "other.key.revoked").rename(keys / AUTHORIZED / "other.key")
        assert _handshake(ctx, endpoint, second)
        # an edited file counts as well: the same name now holding another key
        shutil.copy(keys / "client.key", keys / AUTHORIZED / "other.key")
        assert not _handshake(ctx, endpoint, second)


def test_a_per_machine_collector_connects_with_its_own_key_and_is_revoked_alone(tmp_path) -> None:
    """Collector processes started with --curve-client: each registers with its machine's key (the head
    side reads the key from the ZAP User-Id of the HELLO); after m1's public key is deleted, a new m1
    collector is refused while m2 still gets in -- the head never restarted."""
    keys = generate(tmp_path / "keys", clients=["m1", "m2"])
    expected = {name: _public(keys / "clients" / f"{name}.key").decode() for name in ("m1", "m2")}
    with _curve_head(keys) as (endpoint, _, router):
        procs = []

        def start(name: str) -> subprocess.Popen:
            proc = subprocess.Popen(
                [sys.executable, "-m", "actors", "--connect", endpoint, "--slot", "0", "--parent-pid", str(os.getpid()),
                 "--curve-keys", str(keys), "--curve-client", name, "--register-timeout", "5"],
                cwd=ROOT, env=head_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)
            procs.append(proc)
            return proc

        def hello(timeout_ms: int = HANDSHAKE_WAIT_MS) -> tuple[bytes, str] | None:
            """(connection identity, client public key) of the next message, None if none came."""
            if not router.poll(timeout_ms):
                return None
            frames = router.recv_multipart(copy=False)
            return frames[0].bytes, frames[1].get("User-Id")  # User-Id: the authenticator's name, the public key

        try:
            start("m1")
            first = hello()
            assert first is not None and first[1] == expected["m1"]
            (keys / AUTHORIZED / "m1.key").unlink()
            denied = LoggingAuthenticator.denied
            refused = start("m1")
            assert refused.wait(timeout=120) != 0  # never registered: refused at the handshake, then its timeout
            assert LoggingAuthenticator.denied > denied  # the head's authenticator refused it (ZAP DENIED)
            start("m2")
            while (msg := hello()) is not None and msg[1] != expected["m2"]:
                assert msg == first, "a revoked machine's new connection reached the head"  # first m1's repeats
            assert msg is not None, "m2 never got in"
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()

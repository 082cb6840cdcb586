"""`python -m actors --connect ENDPOINT --collectors N [--curve-keys DIR [--curve-client NAME]]`.

With --curve-client NAME the collectors use this machine's own key pair (DIR/clients/NAME.key_secret,
written by `python -m shared.keys --dir DIR --client NAME`), so the head can revoke this machine
alone; without it, the pair every machine shares (DIR/client.key_secret). Keys that are missing,
unreadable or readable by group or others end the process with status 2 and one line.

Without --slot this is a launcher: it starts N collector processes (this same command with
--slot i --parent-pid <launcher>) and waits, forwarding SIGTERM/SIGINT. With --slot it is
one collector: register, collect until SIGTERM/SIGINT, a STOP broadcast or head silence, then
close its sockets with linger 0. Local children ask the kernel for SIGTERM when their parent
dies (PR_SET_PDEATHSIG), so they never outlive the head. `kill -USR1 PID` writes every thread's
stack to the collector's log (where a stuck collector is stuck).
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import logging
import os
import signal
import subprocess
import sys
import time

from shared.stop_flag import StopFlag

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported
log = logging.getLogger("actors")
PR_SET_PDEATHSIG = 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m actors", description=__doc__.splitlines()[0])
    p.add_argument("--connect", required=True, help="head control endpoint, e.g. tcp://127.0.0.1:5555")
    p.add_argument("--collectors", type=int, default=1, help="collector processes to start (launcher mode)")
    p.add_argument("--curve-keys", default="", help="directory with client.key_secret and server.key")
    p.add_argument("--curve-client", default=None, metavar="NAME",
                   help="use this machine's key pair, clients/NAME.key_secret in --curve-keys (make keys CLIENTS=NAME)")
    p.add_argument("--slot", type=int, default=None, help="run ONE collector for this slot (child mode)")
    p.add_argument("--parent-pid", type=int, default=0, help="exit when this process dies (local children)")
    p.add_argument("--register-timeout", type=float, default=60.0, help="seconds to wait for WELCOME")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def die_with_parent(parent_pid: int) -> None:
    """SIGTERM on parent death (Linux); exit at once if the parent is already gone."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
    if os.getppid() != parent_pid:
        raise SystemExit(0)


def load_curve(args: argparse.Namespace):
    """The collector's CURVE keys (None without --curve-keys); ConfigError (one line) for unusable ones."""
    from shared.config import ConfigError
    from shared.keys import load_client

    if args.curve_client is not None and not args.curve_keys:
        raise ConfigError(f"--curve-client {args.curve_client} is invalid without --curve-keys DIR")
    return load_client(args.curve_keys, args.curve_client) if args.curve_keys else None


def run_one(args: argparse.Namespace) -> int:
    import zmq

    from actors.client import RegistrationError
    from actors.session import collect
    from shared.config import ConfigError

    stop = StopFlag()  # not a threading.Event: a second signal inside the handler's set() would deadlock on its lock
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        curve = load_curve(args)
    except ConfigError as exc:
        log.error("%s", " ".join(str(exc).split()))
        return 2
    ctx = zmq.Context()
    try:
        collect(ctx, args.connect, args.slot, stop, curve, args.register_timeout)
        return 0
    except RegistrationError as exc:
        log.error("registration failed: %s", exc)
        return 2
    finally:
        ctx.destroy(linger=0)  # not term(): a socket a failed path left open would block it forever


def launch(args: argparse.Namespace) -> int:
    """Start N children and wait; SIGTERM/SIGINT are forwarded, kill only after a grace period."""
    from shared.config import ConfigError

    try:
        load_curve(args)  # once here: unusable keys are one line, not one per child
    except ConfigError as exc:
        log.error("%s", " ".join(str(exc).split()))
        return 2
    stop = StopFlag()  # not a threading.Event: a second signal inside the handler's set() would deadlock on its lock
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    procs = []
    for slot in range(args.collectors):
        argv = [sys.executable, "-m", "actors", "--connect", args.connect, "--slot", str(slot),
                "--parent-pid", str(os.getpid()), "--register-timeout", str(args.register_timeout),
                "--log-level", args.log_level]
        if args.curve_keys:
            argv += ["--curve-keys", args.curve_keys]
        if args.curve_client is not None:
            argv += ["--curve-client", args.curve_client]
        procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL))
    while not stop.is_set() and any(p.poll() is None for p in procs):
        stop.wait(0.2)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10.0
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("collector pid %d ignored SIGTERM for 10 s; killing it", p.pid)
            p.kill()
            p.wait()
    return max((p.returncode or 0 for p in procs), default=0)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID`: every thread's stack to stderr
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s[%(process)d] %(message)s")
    if args.parent_pid:
        die_with_parent(args.parent_pid)
    if args.slot is not None:
        return run_one(args)
    if args.collectors < 1:
        log.error("--collectors must be >= 1")
        return 2
    return launch(args)


if __name__ == "__main__":
    raise SystemExit(main())

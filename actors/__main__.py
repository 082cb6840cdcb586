"""`python -m actors --connect ENDPOINT --collectors N [--curve-keys DIR [--curve-client NAME]]`.

With --curve-client NAME the collectors use this machine's own key pair (DIR/clients/NAME.key_secret,
written by `python -m shared.keys --dir DIR --client NAME`), so the head can revoke this machine
alone; without it, the pair every machine shares (DIR/client.key_secret). Keys that are missing,
unreadable or readable by group or others end the process with status 2 and one line.

Without --slot this is a launcher: it starts N collector processes (this same command with
--slot i --parent-pid <launcher>) and waits, forwarding SIGTERM/SIGINT. With --slot it is
one collector: register, collect until SIGTERM/SIGINT or a STOP broadcast, then close its
sockets with linger 0. Local children ask the kernel for SIGTERM when their parent dies
(PR_SET_PDEATHSIG), so they never outlive the head. `kill -USR1 PID` writes every thread's
stack to the collector's log (where a stuck collector is stuck).

Head silence (nothing from the head for transport.head_timeout_s: a network partition, a head
restart): a collector started without --parent-pid registers again by itself, with a new HELLO
and fresh sockets, retried with backoff (1 s doubling to 30 s), until --rejoin-timeout seconds
have passed (default 86400, a day; 0: never give up), then exits 0; a launcher passes its
--rejoin-timeout to its collectors. A child of the head (--parent-pid without --rejoin-timeout)
exits instead: its head restarts it. See actors/session.py and docs/PROTOCOL.md.
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import logging
import math
import os
import signal
import subprocess
import sys
import time

from shared.stop_flag import StopFlag

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported
log = logging.getLogger("actors")
PR_SET_PDEATHSIG = 1
# A remote collector's default --rejoin-timeout: a day covers a network blip, a head restarted after an upgrade
# and a head crash noticed (and resumed) the next morning, so no collector machine needs a visit; a head gone for
# longer is a run given up, and its collectors should not join whatever listens on that endpoint next week.
DEFAULT_REJOIN_TIMEOUT_S = 86400.0


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
    p.add_argument("--rejoin-timeout", type=float, default=None, metavar="SECONDS",
                   help=f"after head silence, keep registering again for this long (0: forever; default "
                        f"{DEFAULT_REJOIN_TIMEOUT_S:.0f} without --parent-pid; a child of the head, with --parent-pid, "
                        f"exits instead)")
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


def rejoin_timeout(args: argparse.Namespace) -> float | None:
    """Seconds this collector keeps registering again after head silence (0: forever), or None: it exits then
    (a child of the head: --parent-pid without --rejoin-timeout)."""
    if args.rejoin_timeout is not None:
        return args.rejoin_timeout
    return None if args.parent_pid else DEFAULT_REJOIN_TIMEOUT_S


def option_error(args: argparse.Namespace) -> str | None:
    """The one-line complaint about a bad option value, or None."""
    if args.slot is None and args.collectors < 1:  # launcher mode
        return "--collectors must be >= 1"
    if args.rejoin_timeout is not None and not (math.isfinite(args.rejoin_timeout) and args.rejoin_timeout >= 0):
        return f"--rejoin-timeout must be a number of seconds >= 0 (0: never give up), got {args.rejoin_timeout}"
    return None


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
    from actors.session import Rejoin, collect
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
        seconds = rejoin_timeout(args)
        collect(ctx, args.connect, args.slot, stop, curve, args.register_timeout,
                None if seconds is None else Rejoin(seconds))
        return 0
    except RegistrationError as exc:
        log.error("registration failed: %s", exc)
        return 2
    finally:
        ctx.destroy(linger=0)  # not term(): a socket a failed path left open would block it forever


def child_argv(args: argparse.Namespace, slot: int) -> list[str]:
    """The command line of the launcher's collector for `slot`: this launcher's options, --parent-pid this process.
    The launcher's rejoin rule goes along explicitly: the child's --parent-pid is the launcher, not a head."""
    argv = [sys.executable, "-m", "actors", "--connect", args.connect, "--slot", str(slot),
            "--parent-pid", str(os.getpid()), "--register-timeout", str(args.register_timeout),
            "--log-level", args.log_level]
    if args.curve_keys:
        argv += ["--curve-keys", args.curve_keys]
    if args.curve_client is not None:
        argv += ["--curve-client", args.curve_client]
    seconds = rejoin_timeout(args)
    if seconds is not None:
        argv += ["--rejoin-timeout", repr(seconds)]
    return argv


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
    procs = [subprocess.Popen(child_argv(args, slot), stdin=subprocess.DEVNULL) for slot in range(args.collectors)]
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
    problem = option_error(args)
    if problem:
        log.error("%s", problem)
        return 2
    if args.parent_pid:
        die_with_parent(args.parent_pid)
    if args.slot is not None:
        return run_one(args)
    return launch(args)


if __name__ == "__main__":
    raise SystemExit(main())

"""`python -m launcher` (what `make run` calls): start a training cluster on this machine.

First SIGINT/SIGTERM: stop collectors, write the checkpoint, close everything, exit 0.
Second SIGINT: kill the local collectors and exit at once (status 130).
A bad input (flag, config value, env, run dir, keys, device, port) exits 2 with one `error: ...`
line on stderr (a logged ERROR line once logging is set up), never a traceback.
A run that trained but could not write its final checkpoint (a full disk) exits 3, so a supervisor
can tell lost progress from a clean stop. All statuses: launcher.cli.EXIT_CODES (`--help`).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported: extra threads fight the collectors
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import errno  # noqa: E402
import logging  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

from launcher.cli import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_FORCED, EXIT_OK, EXIT_PROGRESS_LOST, parse_args  # noqa: E402
from shared.config import ConfigError  # noqa: E402
from shared.stop_flag import StopFlag  # noqa: E402

log = logging.getLogger("mario_apex")


def _one_line(exc: BaseException | str) -> str:
    return " ".join(str(exc).split())


def _setup_logging(run_dir) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(fmt)
    file_handler = logging.FileHandler(run_dir / "head.log")
    file_handler.setFormatter(fmt)
    root.addHandler(console)
    root.addHandler(file_handler)


def main(argv: list[str] | None = None) -> int:
    try:
        cfg, opts = parse_args(argv)
    except ConfigError as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        _setup_logging(opts.run_dir)
    except OSError as exc:  # checked in parse_args; this is the race or the case os.access cannot see
        print(f"error: --run-dir {opts.run_dir}: cannot write there: {_one_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if opts.profile_note:
        log.info("%s", opts.profile_note)
    from launcher.head import FAILURE_REASONS, Head, StopAt
    from learner.checkpoint import CheckpointError

    stop = StopFlag()  # set by the handler below: an Event's lock could deadlock it
    head_box: list[Head] = []

    def on_signal(signum, _frame) -> None:
        if not stop.is_set():
            log.warning("signal %d: stopping gracefully (checkpoint, then exit); press Ctrl-C again to force", signum)
            stop.set()
            return
        log.error("second signal: forcing exit")
        if head_box:
            for pid in head_box[0].supervisor.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        os._exit(EXIT_FORCED)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    import zmq

    # A failing Head() has no object to close: it must release what it made so far (ipc temp dirs,
    # sockets, threads) itself before the exception gets here.
    try:
        head = Head(cfg, opts.run_dir, train=opts.train, resume=opts.resume, inprocess=opts.inprocess,
                    launcher=opts.launcher, ray_address=opts.ray_address, env_spec=opts.env_spec)
    except (ConfigError, CheckpointError) as exc:
        log.error("%s", _one_line(exc))
        return EXIT_BAD_INPUT
    except (zmq.ZMQError, OSError) as exc:  # TCP listeners are bound through Python sockets (OSError)
        if exc.errno == errno.EADDRINUSE:
            log.error("cannot bind the head's sockets: %s. Is another head running on this machine? Pick other "
                      "ports with --port N (control N, weights N+1) or --set transport.port=0 (any free)",
                      _one_line(exc))
        elif isinstance(exc, zmq.ZMQError) or exc.errno == errno.EADDRNOTAVAIL:
            log.error("cannot bind the head's sockets on transport.bind=%s: %s", cfg.transport.bind, _one_line(exc))
        else:  # e.g. the run dir filled up or vanished between the checks and here
            log.error("cannot start the head: %s", _one_line(exc))
        return EXIT_BAD_INPUT
    head_box.append(head)
    try:
        summary = head.run(StopAt(opts.max_env_steps, opts.max_updates, opts.max_seconds, opts.target_return), stop)
    finally:
        head.close()
    print(f"[DONE] {summary}", flush=True)
    if head.final_checkpoint_error is not None:  # close() logged the one line saying what is lost
        return EXIT_PROGRESS_LOST
    return EXIT_FAILED if summary.get("reason") in FAILURE_REASONS else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())

"""The head's ingest with remote collectors: CURVE over veth links against loopback without CURVE, in one run.

    python -m tests.hostile.remote_ingest [--collectors 4,8,16] [--seconds S] [--out FILE]
    make bench-remote ARGS="--collectors 4,8,16 --out runs/bench/remote_ingest.json"

What is measured is the head, not the envs: the senders are bench/scale.py's synthetic collectors, each a real
client of the protocol (HELLO/WELCOME registration, its own data DEALER, sequence numbers, CREDITs, heartbeats)
replaying the chunks recorded from the real Mario 1-1 env (bench/data/, bench/recorded.py), and the head is
bench/scale.py's head-side data plane (Registrar + ConsolidationThread + ReplayBuffer + WeightPublisher, as
launcher/head.py wires them) with its stand-in learner sampling the replay at --sample-pace batches of 512 a second.
The senders are unthrottled: each sends its next chunk whenever its credits (transport.max_chunks_in_flight) and
its socket allow, so what the head ingests is its capacity for that many collectors on this machine (scale.py's
capacity ladder ends with the same step, rate None; no ladder here: there is no sampling goal to hold).

Two transports, alternating per collector count (the first of a count goes second at the next, so drift in the
machine's load is shared out), the same senders and the same head code for both:

- curve_veth: the senders run in network namespaces, one per sender process (tests/hostile/netns.py, plain
  forwarding routers: host ==veth== router ==veth== root), and reach the head in the root namespace over TCP with
  CURVE (keys generated into a temp folder, shared/keys.py), the head bound to the harness's head address;
- loopback: the senders in the root namespace, TCP on 127.0.0.1 without CURVE.

For each count and transport, a fresh head (so each starts from the same replay) and, in its steady window of
--seconds (after scale.WARM_S): ingested transitions/s, the head process's CPU (all its threads: ingest, the
stand-in learner, ZeroMQ's I/O threads, where CURVE encrypts and decrypts) and that of its ingest thread and of
ZeroMQ's I/O threads, from /proc/<pid>/task/<tid>/stat; per transition (microseconds) and per core (transitions/s
per head core = ingested/s / head cores used). The senders' CPU is read from /proc over their whole row
(registration to BYE) and divided by the transitions they sent. JSON to --out (settings, machine, date, commit,
rows, the curve_veth/loopback ratios per count) and a table on stdout.

The collectors are spread over --sender-processes processes (default 2, as scale.py's SENDER_PROCESSES), each
owning N / P of them with their own sockets; with CURVE each process is a host of its own.

Everything is removed on exit, on an error, on Ctrl-C and on SIGTERM: the heads' and senders' processes
(bench/workers.py), the namespaces and links (HostNet.close), the temp folder with the keys. Killed (SIGKILL),
the harness's guardian removes the namespaces and links, the workers die with this process (PR_SET_PDEATHSIG),
and the temp folder, named after this process (shared/tempdirs.py), goes at the next run's start. Exit 0 when every row ingested, 1 when a row failed (the JSON says which), 2 on bad arguments or where
namespaces cannot be made (one line), 130 on Ctrl-C. Needs root and iproute2; Linux only.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.hostile.netns import PR_SET_PDEATHSIG, HostNet, _libc, inside, unavailable

TRANSPORTS = ("curve_veth", "loopback")
DEFAULT_COUNTS = (4, 8, 16)
DEFAULT_SECONDS = 8.0  # bench/scale.py's FULL_WINDOW_S
DEFAULT_OUT = "runs/bench/remote_ingest.json"
ROOT = Path(__file__).resolve().parents[2]


class NoNamespaces(OSError):
    """The harness could not build its network here (HostNet.start failed)."""


def _worker_signals() -> None:
    """In a spawned worker: a terminal's Ctrl-C is the run's to handle (it closes the workers), and the worker
    dies with the run should the run be killed (SIGKILL leaves no time for its cleanup)."""
    import multiprocessing

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # the run died before the line above
        os._exit(1)


def _senders_in(ns: str | None, index: int, cfg_dict: dict[str, Any], cmd_q: Any, ready_q: Any, result_q: Any,
                stop_evt: Any) -> None:
    """bench/scale.py's synthetic collectors, in namespace `ns` (None: where this process is): the main thread
    enters it before the ZeroMQ context exists, so the context's I/O threads and every connection live there."""
    from bench.scale import _our_senders

    _worker_signals()
    if ns is None:
        _our_senders(index, cfg_dict, cmd_q, ready_q, result_q, stop_evt)
        return
    with inside(ns):
        _our_senders(index, cfg_dict, cmd_q, ready_q, result_q, stop_evt)


def _head(cfg_dict: dict[str, Any], cmd_q: Any, ready_q: Any, result_q: Any, stop_evt: Any) -> None:
    """bench/scale.py's head, closed by the run (see _worker_signals)."""
    from bench.scale import _our_head

    _worker_signals()
    _our_head(cfg_dict, cmd_q, ready_q, result_q, stop_evt)


# ---------------------------------------------------------------------------- one row
def _row(transport: str, cfg: Any, senders: Any, net: HostNet, n: int, seconds: float,
         pace: float | None) -> dict[str, Any]:
    """A fresh head for `transport`; n unthrottled collectors over `senders` for WARM_S + `seconds`."""
    from bench import cpu_time, scale
    from bench.workers import WorkerGroup

    t0 = time.perf_counter()
    with WorkerGroup(_head, [(cfg.to_dict(),)]) as head:
        net.adopt(head.procs[0])  # killed by the harness's guardian should this process die first
        startup_s = time.perf_counter() - t0
        head.send([0], ("endpoint",))
        endpoint = head.results(1)[0]["endpoint"]
        pids = [p.pid for p in senders.procs]
        before = [cpu_time.process_cpu_s(p) for p in pids]
        row = scale._row(head, senders, endpoint, n, None, seconds, pace, scale._chunk_transitions())
        after = [cpu_time.process_cpu_s(p) for p in pids]
    tps, head_cores = row.get("ingested_tps") or 0.0, row.get("head_cpu_frac")
    ingest_cores, io_cores = row.get("ingest_thread_cpu_frac"), row.get("zmq_io_cpu_frac")
    sender_cpu_s = sum(b - a for a, b in zip(before, after, strict=True) if a is not None and b is not None)
    sent = row.get("sender_sent_transitions") or 0
    send_s = scale.WARM_S + seconds + 1.0  # how long scale._row has each sender send

    def per_transition_us(cores: float | None) -> float | None:
        return 1e6 * cores / tps if cores is not None and tps else None

    return {
        "transport": transport, "collectors": n, "endpoint": endpoint, "ingested_tps": tps,
        "head_cpu_frac": head_cores, "head_cpu_us_per_transition": per_transition_us(head_cores),
        "tps_per_head_core": tps / head_cores if head_cores else None,
        "ingest_thread_cpu_frac": ingest_cores, "ingest_thread_cpu_us_per_transition": per_transition_us(ingest_cores),
        "tps_per_ingest_core": tps / ingest_cores if ingest_cores else None,
        "zmq_io_cpu_frac": io_cores, "zmq_io_cpu_us_per_transition": per_transition_us(io_cores),
        "sender_cpu_s": sender_cpu_s, "sender_cpu_frac": sender_cpu_s / send_s,
        "sender_cpu_us_per_transition": 1e6 * sender_cpu_s / sent if sent else None,
        "sender_sent_transitions": sent, "sender_processes": row.get("sender_processes"),
        "sender_held_back": row.get("sender_held_back"),
        "sample_batches_per_s": row.get("sample_batches_per_s"), "sample_p50_ms": row.get("sample_p50_ms"),
        "sample_p99_ms": row.get("sample_p99_ms"), "window_s": row.get("window_s"),
        "open_registrations": row.get("open_registrations"), "rejected": row.get("rejected"),
        "rejected_by_reason": row.get("rejected_by_reason"), "gaps": row.get("gaps"),
        "head_startup_s": startup_s,
    }


def _ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per count: curve_veth's figures over loopback's (ingest rate, head and sender CPU per transition)."""
    out = []
    for n in sorted({r["collectors"] for r in rows}):
        by = {r["transport"]: r for r in rows if r["collectors"] == n and "error" not in r}
        if set(by) != set(TRANSPORTS):
            continue
        c, lo = by["curve_veth"], by["loopback"]
        entry: dict[str, Any] = {"collectors": n}
        for key in ("ingested_tps", "head_cpu_us_per_transition", "ingest_thread_cpu_us_per_transition",
                    "sender_cpu_us_per_transition", "tps_per_head_core"):
            entry[key] = c[key] / lo[key] if c.get(key) is not None and lo.get(key) else None
        out.append(entry)
    return out


# ---------------------------------------------------------------------------- the run
def _git_commit() -> dict[str, Any]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def _machine() -> dict[str, Any]:
    from bench.report import cpu_model

    return {"cores": os.cpu_count(), "cores_usable": len(os.sched_getaffinity(0)), "cpu_model": cpu_model(),
            "platform": platform.platform(), "python": platform.python_version(),
            "load_average": list(os.getloadavg())}


def run(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """Fill `report` as the rows come in (a failure or Ctrl-C keeps what was measured)."""
    from bench import scale
    from bench.workers import WorkerGroup
    from config_optimized import load_profile
    from shared.keys import generate
    from shared.tempdirs import owned_tempdir, sweep_stale

    base = load_profile(args.profile, [])
    sweep_stale()  # the folders of runs (and heads) killed before they could remove them
    work = Path(owned_tempdir())  # named after this process: the next run removes it should this one be killed
    report["settings"]["workdir"] = str(work)
    try:
        keys = generate(work / "keys")
        net = HostNet(args.sender_processes, forward=True)
        try:
            net.start()
        except OSError as exc:
            net.close()
            raise NoNamespaces(str(exc)) from None
        try:
            report["settings"]["netns_tag"] = net.tag
            cfgs = {"curve_veth": base.with_overrides([f"transport.bind={net.head_ip}",
                                                       f"transport.curve_keys_dir={keys}"]),
                    "loopback": base}
            report["settings"].update({
                "head_address": {"curve_veth": net.head_ip, "loopback": "127.0.0.1"},
                "sender_namespaces": [h.ns for h in net.hosts],
                "max_chunks_in_flight": base.transport.max_chunks_in_flight,
                "chunk_steps": base.collectors.chunk_steps, "chunk_transitions": scale._chunk_transitions(),
                "replay_capacity": base.replay.capacity})
            pools = {
                "curve_veth": WorkerGroup(_senders_in, [(h.ns, h.index, cfgs["curve_veth"].to_dict()) for h in net.hosts]),
                "loopback": WorkerGroup(_senders_in, [(None, i, base.to_dict()) for i in range(args.sender_processes)]),
            }
            with pools["curve_veth"], pools["loopback"]:
                for group in pools.values():
                    for proc in group.procs:
                        net.adopt(proc)
                report["settings"]["sender_startup_s"] = {k: g.startup_s for k, g in pools.items()}
                for k, n in enumerate(args.collectors):
                    for transport in (TRANSPORTS if k % 2 == 0 else TRANSPORTS[::-1]):
                        report["settings"]["order"].append(f"{transport}:{n}")
                        try:
                            row = _row(transport, cfgs[transport], pools[transport], net, n, args.seconds,
                                       args.sample_pace or None)
                        except Exception as exc:  # the report names the row that failed; the pools may hold
                            # its answers, so no later row could be trusted: the run stops here
                            report["rows"].append({"transport": transport, "collectors": n,
                                                   "error": f"{type(exc).__name__}: {exc}"})
                            raise
                        report["rows"].append(row)
                        print(_line(row), flush=True)
        finally:
            net.close()  # what runs in the namespaces, the namespaces, the links, the guardian
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------------------- output
_COLUMNS = (("transport", "{:<10}", "transport "), ("collectors", "{:>3}", "N"),
            ("ingested_tps", "{:>11,.0f}", "ingested/s"), ("head_cpu_frac", "{:>10.2f}", "head cores"),
            ("head_cpu_us_per_transition", "{:>10.1f}", "head us/t"), ("tps_per_head_core", "{:>12,.0f}", "/s per core"),
            ("ingest_thread_cpu_us_per_transition", "{:>11.1f}", "ingest us/t"),
            ("zmq_io_cpu_us_per_transition", "{:>11.1f}", "zmq io us/t"),
            ("sender_cpu_us_per_transition", "{:>11.1f}", "sender us/t"))


def _line(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"{row['transport']:<10} {row['collectors']:>3}  error: {row['error']}"
    cells = []
    for key, fmt, head in _COLUMNS:
        value = row.get(key)
        width = len(head) if key == "transport" else max(len(head), len(fmt.format(0)))
        cells.append(fmt.format(value).rjust(width) if value is not None else "-".rjust(width))
    return " ".join(cells)


def _header() -> str:
    cells = []
    for key, fmt, head in _COLUMNS:
        width = len(head) if key == "transport" else max(len(head), len(fmt.format(0)))
        cells.append(head.ljust(width) if key == "transport" else head.rjust(width))
    return " ".join(cells)


def leftovers(tag: str | None) -> list[str]:
    """The namespaces and root links of this run that still exist ([] once it is torn down)."""
    from tests.hostile import netns

    return [n for n in netns.namespaces() + netns.root_links() if tag and n.startswith(tag) and
            (n[len(tag):][:1].isalpha())]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {message} (see python -m tests.hostile.remote_ingest --help)\n")


def _counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of collector counts") from None
    if not counts or any(not 1 <= n <= 256 for n in counts):
        raise argparse.ArgumentTypeError(f"{text!r}: counts must be 1..256")
    return counts


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = _Parser(prog="python -m tests.hostile.remote_ingest", description=__doc__.split("\n\n")[0])
    p.add_argument("--collectors", type=_counts, default=DEFAULT_COUNTS, help="collector counts, e.g. 4,8,16")
    p.add_argument("--seconds", type=float, default=DEFAULT_SECONDS, help="each row's steady window")
    p.add_argument("--out", default=DEFAULT_OUT, help="the JSON report")
    p.add_argument("--sender-processes", type=int, default=2,
                   help="processes the collectors are spread over (bench/scale.py's SENDER_PROCESSES); with CURVE "
                        "each in a namespace of its own")
    p.add_argument("--sample-pace", type=float, default=100.0,
                   help="the stand-in learner's batches/s (bench/scale.py's SAMPLE_GOAL_PER_S); 0: as fast as it can")
    p.add_argument("--profile", default="auto", help="the hardware profile the head is configured by")
    args = p.parse_args(argv)
    if not 0.5 <= args.seconds <= 600:
        p.error(f"--seconds {args.seconds} is invalid: allowed 0.5..600")
    if not 1 <= args.sender_processes <= 16:
        p.error(f"--sender-processes {args.sender_processes} is invalid: allowed 1..16")
    if args.sample_pace < 0:
        p.error(f"--sample-pace {args.sample_pace} is invalid: allowed >= 0")
    if reason := unavailable():
        p.exit(2, f"error: {reason}: the remote ingest measurement needs network namespaces\n")
    return args


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "what": "the head's ingest with remote collectors: CURVE over veth links vs loopback without CURVE",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        **_git_commit(), "machine": _machine(),
        "command": " ".join([sys.executable, "-m", "tests.hostile.remote_ingest", *(sys.argv[1:] if argv is None else argv)]),
        "settings": {"collectors": list(args.collectors), "seconds": args.seconds, "rate": "unthrottled",
                     "warm_s": None, "sender_processes": args.sender_processes, "sample_pace": args.sample_pace or None,
                     "sample_batch": None, "profile": args.profile, "transports": list(TRANSPORTS), "order": []},
        "rows": [],
    }
    from bench import scale

    report["settings"].update({"warm_s": scale.WARM_S, "sample_batch": scale.SAMPLE_BATCH})
    signal.signal(signal.SIGTERM, _interrupt)  # as Ctrl-C: everything is taken down
    print(_header(), flush=True)
    interrupted, error = False, ""
    try:
        run(args, report)
    except KeyboardInterrupt:
        interrupted = True
    except NoNamespaces as exc:
        print(f"error: network namespaces could not be made here ({exc})", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - the report says what stopped the run
        error = f"{type(exc).__name__}: {exc}"
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not interrupt what the cleanup left
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    report["ratios_curve_veth_over_loopback"] = _ratios(report["rows"])
    report["leftovers"] = leftovers(report["settings"].get("netns_tag"))
    report["interrupted"], report["error"] = interrupted, error or None
    failed = bool(error) or any("error" in r or not r.get("ingested_tps") for r in report["rows"])
    report["ok"] = not failed and not interrupted and not report["leftovers"]
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    for r in report["ratios_curve_veth_over_loopback"]:
        fmt = {k: "-" if v is None else f"{v:.2f}" for k, v in r.items() if k != "collectors"}
        print(f"N={r['collectors']}: curve_veth / loopback: ingest x{fmt['ingested_tps']}, head CPU per transition "
              f"x{fmt['head_cpu_us_per_transition']}, sender CPU per transition x{fmt['sender_cpu_us_per_transition']}")
    if error:
        print(f"error: {error}", file=sys.stderr)
    if report["leftovers"]:
        print(f"error: left behind: {report['leftovers']}", file=sys.stderr)
    print(f"report: {out}")
    if interrupted:
        return 130
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""Collection throughput of a live CartPole head while a hostile peer attacks it (tests/hostile/attack.py).

    python -m tests.hostile.hostile xpub --windows 4 --window-s 20 [--distinct-topics]
    python -m tests.hostile.hostile tcp-burst --nofile 512 --count 1500 --window-s 20

`xpub`: quiet windows and xpub-spam windows, interleaved (the machine may be shared: compare within one
run). `tcp-burst`: a window before, one while `--count` idle TCP connections to the control port are held
(the head runs with soft and hard RLIMIT_NOFILE `--nofile`, so the burst exceeds it), one after; during the
burst a fresh collector HELLO must be answered. Each window reports the env steps/s of the head's 2 local
collectors (from its metrics.jsonl rows), the head process's CPU seconds (/proc/PID/stat utime+stime; the
collectors are other processes) and its open descriptors; attackers run under `nice -n 19` and their CPU
comes from wait4(). `--root DIR` runs the head from another checkout (e.g. an older commit); the attacks
always come from this one. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import zmq

from bench.cpu_time import process_cpu_s
from tests.hostile import attack as A
from tests.hostile.procs import rss_mb

ROOT = Path(__file__).resolve().parents[2]
HEAD_ARGS = ["--env", "CartPole-v1", "--profile", "cpu", "--collectors", "2", "--log-interval", "1",
             "--set", "collectors.envs_per_collector=4"]


def env() -> dict[str, str]:
    e = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    e["PYTHONPATH"] = str(ROOT)
    return e


def cpu_s(pid: int) -> float:
    """utime + stime of `pid` (0.0 once it is gone)."""
    return process_cpu_s(pid) or 0.0


def fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


class Head:
    """`python -m launcher` (CartPole, 2 local collectors, port 0) in its own session, from checkout `root`."""

    def __init__(self, run_dir: Path, root: Path, nofile: int | None = None) -> None:
        self.run_dir = run_dir

        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        head_env = dict(env(), PYTHONPATH=str(root))
        self.log = open(run_dir.parent / "head.out", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([sys.executable, "-m", "launcher", *HEAD_ARGS, "--port", "0",
                                      "--run-dir", str(run_dir)], cwd=root, env=head_env, stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=limit)
        self.pid = self.proc.pid
        path = run_dir / "endpoints.json"
        deadline = time.monotonic() + 300
        while not path.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the head did not start (exit {self.proc.poll()})")
            time.sleep(0.2)
        self.endpoints = json.loads(path.read_text())

    def rows(self) -> list[dict[str, Any]]:
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def wait_steps(self, steps: int, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.rows() or self.rows()[-1]["env_steps"] < steps:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the head reached no {steps} env steps (exit {self.proc.poll()})")
            time.sleep(0.5)

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            os.killpg(self.pid, 2)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.pid, 9)
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def steps_per_s(rows: list[dict[str, Any]], t0: float, t1: float) -> float | None:
    """Env steps/s between the first and last metrics rows written within wall-clock [t0, t1]."""
    inside = [r for r in rows if t0 <= r["time"] <= t1]
    if len(inside) < 2 or inside[-1]["time"] <= inside[0]["time"]:
        return None
    return (inside[-1]["env_steps"] - inside[0]["env_steps"]) / (inside[-1]["time"] - inside[0]["time"])


def running(pid: int) -> bool:
    """`pid` (a child) has not exited; it is not reaped, so wait4() still gets its CPU time."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None


def window(head: Head, seconds: float, attack: list[str] | None = None, connections: int = 0,
           during=None) -> dict[str, Any]:
    """One window: the head's rate, CPU and descriptors over `seconds`, with `attack` (tests.hostile.attack arguments)
    running under nice -n 19 meanwhile; it starts once the head holds `connections` more descriptors (the
    attacker is connected; its start-up is not measured). `during(result)` runs once, a third of the way in."""
    if head.proc.poll() is not None:
        return {"attack": attack[1] if attack else None, "head_alive_at_start": False, "head_exit": head.proc.returncode}
    proc = None
    if attack is not None:
        base = fds(head.pid)
        proc = subprocess.Popen(["nice", "-n", "19", sys.executable, "-m", "tests.hostile.attack",
                                 "--connect", head.endpoints["control"], *attack], cwd=ROOT, env=env(),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while fds(head.pid) < base + connections and running(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    c0, t0 = cpu_s(head.pid), time.time()
    out: dict[str, Any] = {"attack": attack[1] if attack else None, "head_alive_at_start": head.proc.poll() is None}
    time.sleep(seconds / 3)
    out["head_fds_third"] = fds(head.pid)
    if during is not None:
        during(out)
    end = t0 + seconds
    while time.time() < end:
        time.sleep(0.2)
    c1, t1 = cpu_s(head.pid), time.time()
    out["head_rss_mb_end"] = round(rss_mb(head.pid), 1)
    if proc is not None:
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        text = proc.stdout.read().decode(errors="replace").strip()
        proc.stdout.close()
        out["attacker_cpu_s"] = round(usage.ru_utime + usage.ru_stime, 2)
        out["attacker_exit"] = proc.returncode
        try:
            out["attacker"] = json.loads(text.splitlines()[-1])
        except (ValueError, IndexError):
            out["attacker"] = text[-500:]
    time.sleep(1.5)  # the row covering the window's end
    rate = steps_per_s(head.rows(), t0, t1)
    out.update(seconds=round(t1 - t0, 1), env_steps_per_s=None if rate is None else round(rate, 1),
               head_cpu_s=round(c1 - c0, 2),
               head_cpu_share=round((c1 - c0) / (t1 - t0), 3), head_fds_end=fds(head.pid))
    return out


def fresh_hello(connect: str, timeout_s: float = 20.0) -> dict[str, Any]:
    """A new collector's HELLO during the burst: answered (WELCOME) or not within `timeout_s`."""
    ctx = zmq.Context()
    t0 = time.monotonic()
    try:
        welcome = A.hello(ctx, connect, {"host": "bench", "pid": os.getpid(), "slot": -1,
                                         "nonce": uuid.uuid4().hex, "envs": 1}, timeout_s=timeout_s)
        return {"welcomed": "refused" not in welcome, "refused": welcome.get("refused"),
                "seconds": round(time.monotonic() - t0, 2)}
    except Exception as exc:  # noqa: BLE001 - reported, not raised: no answer is a result here
        return {"welcomed": False, "error": f"{type(exc).__name__}: {exc}", "seconds": round(time.monotonic() - t0, 2)}
    finally:
        ctx.destroy(linger=0)


def spread(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {"min": round(values[0], 3), "median": round(values[len(values) // 2], 3), "max": round(values[-1], 3),
            "n": len(values)}


def run_xpub(head: Head, windows: int, seconds: float, distinct: bool) -> dict[str, Any]:
    # the attacker's XSUB and 8 SUBs are connected when the head holds 9 more descriptors; it outlasts the window
    attack = ["--attack", "xpub-spam", "--seconds", str(seconds + 2), *(["--distinct-topics"] if distinct else [])]
    rows = []
    for _ in range(windows):
        rows.append(window(head, seconds))
        rows.append(window(head, seconds, attack, connections=9))
    quiet = [r for r in rows if r["attack"] is None]
    spam = [r for r in rows if r["attack"] is not None]
    ratios = [s["env_steps_per_s"] / q["env_steps_per_s"] for q, s in zip(quiet, spam, strict=True)
              if s["env_steps_per_s"] and q["env_steps_per_s"]]
    return {"windows": rows, "quiet_steps_per_s": spread([r["env_steps_per_s"] for r in quiet if r["env_steps_per_s"]]),
            "attack_steps_per_s": spread([r["env_steps_per_s"] for r in spam if r["env_steps_per_s"]]),
            "attack_over_quiet": spread(ratios) if ratios else None,
            "head_cpu_share_quiet": spread([r["head_cpu_share"] for r in quiet]),
            "head_cpu_share_attack": spread([r["head_cpu_share"] for r in spam]),
            "attacker_cpu_s": spread([r["attacker_cpu_s"] for r in spam])}


def run_burst(head: Head, count: int, seconds: float) -> dict[str, Any]:
    rows = [window(head, seconds)]
    burst = ["--attack", "tcp-burst", "--count", str(count), "--seconds", str(seconds + 2)]
    rows.append(window(head, seconds, burst, connections=100,
                       during=lambda out: out.update(fresh_hello=fresh_hello(head.endpoints["control"]))))
    rows.append(window(head, seconds))
    return {"windows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.hostile.hostile", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[1:]))
    parser.add_argument("mode", choices=["xpub", "tcp-burst"])
    parser.add_argument("--windows", type=int, default=4, help="xpub: quiet/attack window pairs")
    parser.add_argument("--window-s", type=float, default=20.0)
    parser.add_argument("--distinct-topics", action="store_true", help="xpub: a new topic per subscription")
    parser.add_argument("--nofile", type=int, default=512, help="tcp-burst: the head's open-file limit")
    parser.add_argument("--count", type=int, default=1500, help="tcp-burst: connections")
    parser.add_argument("--warmup-steps", type=int, default=20_000, help="env steps before the first window")
    parser.add_argument("--root", type=Path, default=ROOT, help="checkout the head runs from")
    parser.add_argument("--keep", type=Path, help="copy the head's output and run dir here")
    args = parser.parse_args(argv)
    if args.windows < 1 or args.window_s < 3:
        print("--windows must be >= 1 and --window-s >= 3", file=sys.stderr)
        return 2
    if not (args.root / "launcher").is_dir():
        print(f"--root {args.root}: no launcher package there", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        head = Head(Path(tmp) / "run", args.root.resolve(), args.nofile if args.mode == "tcp-burst" else None)
        try:
            head.wait_steps(args.warmup_steps)
            result = (run_xpub(head, args.windows, args.window_s, args.distinct_topics) if args.mode == "xpub"
                      else run_burst(head, args.count, args.window_s))
            result["head_alive_at_end"] = head.proc.poll() is None
        finally:
            code = head.stop()
        result.update(mode=args.mode, head_exit=code, root=str(args.root), argv=sys.argv[1:] if argv is None else argv)
        if args.mode == "tcp-burst":
            result["head_nofile"] = args.nofile
        if args.keep is not None:
            shutil.copytree(tmp, args.keep, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.ipc"))
    print(json.dumps(result, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

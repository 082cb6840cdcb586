"""Per-collector accepted transitions under the insert gate (issue: fair service, no false stalls).

Runs a real head (same CLI as `make run`) and, every --every seconds, prints per slot: accepted
transitions in that window, chunks, and the supervisor's restart count; at the end the spread
(max/min of accepted transitions per live slot over the whole run) and the weight lag.

    python scripts/gate_fairness.py --seconds 600 -- --profile cpu --set learner.max_insert_lead=2000 ...
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launcher.cli import parse_args  # noqa: E402
from launcher.head import Head, StopAt  # noqa: E402


def per_slot(stats) -> dict[int, int]:
    out: dict[int, int] = {}
    for c in stats.collectors.values():
        out[c["slot"]] = out.get(c["slot"], 0) + int(c["transitions"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--every", type=float, default=60.0)
    ap.add_argument("--json", help="write the summary here")
    ap.add_argument("head_args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    head_args = [x for x in a.head_args if x != "--"]
    cfg, opts = parse_args(head_args)
    head = Head(cfg, opts.run_dir, train=True)
    stop = threading.Event()
    windows: list[dict] = []

    def monitor() -> None:
        prev: dict[int, int] = {}
        t0 = time.monotonic()
        while not stop.wait(a.every):
            s = head.consolidation.stats()
            cur = per_slot(s)
            win = {slot: cur.get(slot, 0) - prev.get(slot, 0) for slot in sorted(cur)}
            prev = cur
            lag = head.learner.updates - min((c["weight_version"] for c in s.collectors.values() if not c["closed"]),
                                             default=head.learner.updates)
            rec = {"t": round(time.monotonic() - t0), "accepted_by_slot": win, "restarts": head.supervisor.restarts_total,
                   "registrations": s.registrations, "updates": head.learner.updates, "lag": lag,
                   "gated_rounds": getattr(head.consolidation, "gated_rounds", None)}
            windows.append(rec)
            print("[FAIRNESS]", json.dumps(rec), flush=True)

    th = threading.Thread(target=monitor, daemon=True)
    th.start()
    try:
        summary = head.run(StopAt(seconds=a.seconds), threading.Event())
    finally:
        stop.set()
        s = head.consolidation.stats()
        total = per_slot(s)
        head.close()
    live = [v for v in total.values()]
    spread = max(live) / max(1, min(live)) if live else float("nan")
    out = {"summary": summary, "accepted_by_slot": total, "spread_max_over_min": spread, "windows": windows}
    print("[FAIRNESS-SUMMARY]", json.dumps(out, default=str), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

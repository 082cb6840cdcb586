"""Periodic evaluation while training: play the current weights in a separate process, keep the best.

A DQN run's checkpoints oscillate (on Mario 1-1 the 80-minute checkpoint reached the flag 5 times in 10,
the 90-minute one once), so the last checkpoint is not the one to keep. Every `logging.eval_every_s`
the head writes an eval-only snapshot of the online weights (`Learner.save_eval_snapshot`) and starts

    python -m evaluate <snapshot> --episodes N --epsilon E --no-video --out <snapshot>/eval

at low CPU priority, so training keeps its cores. When it finishes, its summary becomes one row of
`<run>/evals.jsonl`, and a snapshot better than every earlier one (flag rate, then mean x_pos, then mean
return) replaces `<run>/best/`, which `make eval CHECKPOINT=<run>/best` plays. One evaluation runs at a
time: a due one waits for the previous to finish.

Ten episodes rank snapshots coarsely (a 1-3 snapshot at 7/10 played 16/30 and then 9/30), so with
`keep` > 1 (`logging.eval_keep`) the runners-up stay too: the keep - 1 best-scoring snapshots after best/,
each under `<run>/kept/<updates>/` with its eval/, for choosing what to ship by more episodes afterwards
(`python -m evaluate.suite <run>/best <run>/kept/* --levels ...`). Every other snapshot is deleted.

`cleared(rate, evals)` is the train-until-cleared rule (`logging.stop_flag_rate`, `--until-flags`): the last
`evals` finished evaluations, a resumed run's rows in evals.jsonl included, each reached `rate` flags.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shared.ranking import score

log = logging.getLogger("mario_apex.eval")

EVALS_DIR = "evals"  # snapshots being evaluated live in <run>/evals/<updates>/
BEST_DIR = "best"
KEPT_DIR = "kept"  # runners-up to best/ (keep > 1): <run>/kept/<updates>/
ROWS_FILE = "evals.jsonl"
FLAG_HISTORY = 1_000  # finished evaluations' flag rates kept for the stop rule (its evals is at most this)
NICE = 10  # below the collectors and the learner: an evaluation only takes idle CPU when cores are short


class PeriodicEvaluator:
    """Starts at most one evaluation process at a time and folds finished ones into evals.jsonl and best/."""

    def __init__(self, run_dir: Path, every_s: float, episodes: int, epsilon: float,
                 write_snapshot: Callable[[Path], Path], seed: int = 0, clock: Callable[[], float] = time.monotonic,
                 python: str = sys.executable, keep: int = 1) -> None:
        self.run_dir = Path(run_dir)
        self.every_s = every_s
        self.episodes = episodes
        self.epsilon = epsilon
        self.write_snapshot = write_snapshot  # writes <dir>/checkpoint/ and returns it
        self.seed = seed
        self.clock = clock
        self.python = python
        self.keep = max(1, int(keep))
        self.enabled = every_s > 0
        self.next_due = clock() + every_s
        self.best: tuple[float, float, float] | None = None
        self.last: dict[str, Any] | None = None
        self.completed = 0
        self.failed = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._snapshot: Path | None = None
        self._meta: dict[str, Any] = {}
        self._log_file: Any = None
        self._best_updates: int | None = None
        rows = self._rows()
        self.flag_rates: list[float] = [_flag_rate(r) for r in rows][-FLAG_HISTORY:]  # finished ones, oldest first
        best_rows = [r for r in rows if r.get("best")]
        if best_rows:  # a resumed run keeps its best, and only a better snapshot replaces it
            self.best = score(best_rows[-1])
            self._best_updates = int(best_rows[-1].get("updates", 0))
        self.kept: list[tuple[tuple[float, float, float], Path]] = self._scan_kept()  # best first
        self._trim_kept()

    # ------------------------------------------------------------------ the head's calls
    def poll(self, counters: dict[str, Any]) -> None:
        """Fold in a finished evaluation; start the next one when due and none is running."""
        if not self.enabled:
            return
        if self._proc is not None and self._proc.poll() is not None:
            self._finish()
        if self._proc is None and self.clock() >= self.next_due:
            self.next_due = self.clock() + self.every_s
            self._start(counters)

    def close(self) -> None:
        """Stop a running evaluation (its snapshot is dropped): nothing is left running or half-written."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=5.0)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
            self._proc = None
            self._drop_snapshot()
        evals = self.run_dir / EVALS_DIR
        if evals.is_dir() and not any(evals.iterdir()):
            evals.rmdir()

    def cleared(self, rate: float, evals: int) -> bool:
        """True once the last `evals` finished evaluations each reached a flag rate of at least `rate` (> 0)."""
        return cleared(self.flag_rates, rate, evals)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # ------------------------------------------------------------------ internals
    def _start(self, counters: dict[str, Any]) -> None:
        updates = int(counters.get("updates", 0))
        snapshot = self.run_dir / EVALS_DIR / f"{updates:010d}"
        if snapshot.exists():  # no update since the last one: nothing new to evaluate
            return
        try:
            ckpt = self.write_snapshot(snapshot)
        except Exception as exc:  # noqa: BLE001 - e.g. a full disk or non-finite weights: skip this one
            self.failed += 1
            log.warning("evaluation skipped: cannot write the snapshot (%s)", exc)
            shutil.rmtree(snapshot, ignore_errors=True)
            return
        cmd = [self.python, "-m", "evaluate", str(ckpt), "--episodes", str(self.episodes), "--epsilon",
               str(self.epsilon), "--no-video", "--seed", str(self.seed + self.completed + self.failed),
               "--out", str(snapshot / "eval")]
        self._log_file = open(snapshot / "evaluate.log", "wb")  # noqa: SIM115 - closed in _finish/_drop
        self._proc = subprocess.Popen(cmd, stdout=self._log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      cwd=os.getcwd(), preexec_fn=_lower_priority)
        self._snapshot = snapshot
        self._meta = {"updates": updates, "env_steps": int(counters.get("env_steps", 0)),
                      "elapsed_s": float(counters.get("elapsed_s", 0.0)), "started_unix": time.time()}

    def _finish(self) -> None:
        proc, snapshot, meta = self._proc, self._snapshot, self._meta
        self._proc = None
        assert proc is not None and snapshot is not None
        self._close_log()
        report = snapshot / "eval" / "eval.json"
        try:
            summary = json.loads(report.read_text())["summary"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self.failed += 1
            tail = _tail(snapshot / "evaluate.log")
            log.warning("evaluation at %d updates failed (exit %s, %s): %s", meta["updates"], proc.returncode,
                        exc, tail)
            self._drop_snapshot()
            return
        self.completed += 1
        better = self.best is None or score(summary) > self.best
        row = {**meta, "episodes": summary.get("episodes"), "epsilon": self.epsilon,
               "mean_x_pos": summary.get("mean_x_pos"), "max_x_pos": summary.get("max_x_pos"),
               "flag_rate": summary.get("flag_rate"), "mean_return": summary.get("mean_return"),
               "mean_length": summary.get("mean_length"), "best": better,
               "eval_s": round(time.time() - meta["started_unix"], 1)}
        with open(self.run_dir / ROWS_FILE, "a") as fh:
            fh.write(json.dumps(row, sort_keys=True) + "\n")
        self.last = row
        self.flag_rates = (self.flag_rates + [_flag_rate(row)])[-FLAG_HISTORY:]
        if better:
            demoted = self.best
            self.best = score(summary)
            self._promote(snapshot, demoted)
            self._best_updates = meta["updates"]
        elif self.keep > 1:
            self._keep(snapshot, score(summary), meta["updates"])
        else:
            self._drop_snapshot()
        log.info("evaluation at %d updates (%d env steps): mean x_pos %.0f, flags %d/%d, return %.1f%s",
                 meta["updates"], meta["env_steps"], row["mean_x_pos"] or 0.0,
                 round((row["flag_rate"] or 0.0) * (row["episodes"] or 0)), row["episodes"] or 0,
                 row["mean_return"] or 0.0, " -> best/" if better else "")

    def _promote(self, snapshot: Path, demoted: tuple[float, float, float] | None) -> None:
        """Atomically make `snapshot` the run's best/ (a rename within the run dir); the one it replaces
        becomes a runner-up when runners-up are kept (`demoted`: its score)."""
        best = self.run_dir / BEST_DIR
        old = self.run_dir / f".{BEST_DIR}.old"
        shutil.rmtree(old, ignore_errors=True)
        if best.exists():
            os.replace(best, old)
        os.replace(snapshot, best)
        self._snapshot = None
        if old.exists() and self.keep > 1 and demoted is not None and self._best_updates is not None:
            self._keep(old, demoted, self._best_updates)
        shutil.rmtree(old, ignore_errors=True)

    def _keep(self, snapshot: Path, snapshot_score: tuple[float, float, float], updates: int) -> None:
        """Move `snapshot` (its evaluation finished, its log closed) to kept/ and delete whichever runner-up
        now falls outside the keep - 1 best."""
        dest = self.run_dir / KEPT_DIR / f"{updates:010d}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(snapshot, dest)
        if self._snapshot == snapshot:
            self._snapshot = None
        self.kept = [k for k in self.kept if k[1] != dest] + [(snapshot_score, dest)]
        self._trim_kept()

    def _trim_kept(self) -> None:
        """Keep the keep - 1 best-scoring runners-up (the later snapshot wins a tie); delete the rest."""
        self.kept.sort(key=lambda k: (k[0], k[1].name), reverse=True)
        for _, path in self.kept[self.keep - 1:]:
            shutil.rmtree(path, ignore_errors=True)
        del self.kept[self.keep - 1:]

    def _scan_kept(self) -> list[tuple[tuple[float, float, float], Path]]:
        """The runners-up a resumed run left in kept/, each scored by its own eval/eval.json; a folder
        without a readable one is not a finished snapshot and is removed."""
        kept = []
        root = self.run_dir / KEPT_DIR
        for path in sorted(root.iterdir()) if root.is_dir() else []:
            try:
                kept.append((score(json.loads((path / "eval" / "eval.json").read_text())["summary"]), path))
            except (OSError, ValueError, KeyError, TypeError):
                shutil.rmtree(path, ignore_errors=True)
        return kept

    def _drop_snapshot(self) -> None:
        self._close_log()
        if self._snapshot is not None:
            shutil.rmtree(self._snapshot, ignore_errors=True)
            self._snapshot = None

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def _rows(self) -> list[dict[str, Any]]:
        path = self.run_dir / ROWS_FILE
        if not path.is_file():
            return []
        rows = []
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
        return rows


def cleared(flag_rates: list[float], rate: float, evals: int) -> bool:
    """The stop rule over finished evaluations' flag rates (oldest first): the last `evals` all reach `rate`."""
    if rate <= 0 or evals < 1 or len(flag_rates) < evals:
        return False
    return all(r >= rate - 1e-9 for r in flag_rates[-evals:])  # 8/10 is 0.8 whatever the float rounding


def _flag_rate(row: dict[str, Any]) -> float:
    value = row.get("flag_rate")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _lower_priority() -> None:  # runs in the child between fork and exec
    os.nice(NICE)


def _tail(path: Path, chars: int = 300) -> str:
    try:
        return " ".join(path.read_text(errors="replace")[-chars:].split())
    except OSError:
        return ""

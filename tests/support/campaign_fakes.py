"""Fakes for the level campaign's seams (evaluate/campaign_parts.py), and `python -m tests.support.campaign_fakes MODE
ARGS...`: the campaign's own main() with them, as a process a test can kill or signal.

FakeTrainer writes what a head leaves in a run (metrics.jsonl rows with elapsed_s, checkpoint/, best/, kept/,
config.json) and stops with the next scripted reason; FakeEvaluator writes suite.json, exports, GIFs and
random-policy rows in the shapes the campaign reads, recording every call.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import config_optimized as opt
from evaluate.campaign_parts import Children, LauncherTrainer, TrainJob, TrainOutcome

MARKER = "fake trainer: segment written"  # printed once a blocking segment's rows are on disk


def write_segment(run_dir: Path, env_id: str, seconds: float, env_steps: int, overrides: Sequence[str] = ()) -> None:
    """A head's traces of one segment of `seconds`: metrics rows (elapsed_s from 0), the config (with the job's --set
    overrides, as the launcher writes it), a checkpoint, best/, kept/."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "metrics.jsonl", "a") as fh:
        for frac in (0.5, 1.0):
            fh.write(json.dumps({"elapsed_s": seconds * frac, "env_steps": int(env_steps * frac)}) + "\n")
    cfg = opt.load_config("cpu", [f"env.env_id={env_id}", *overrides])
    (run_dir / "config.json").write_text(json.dumps(cfg.to_dict()))
    for ckpt in (run_dir, run_dir / "best", run_dir / "kept" / "0000000100", run_dir / "kept" / "0000000200"):
        (ckpt / "checkpoint").mkdir(parents=True, exist_ok=True)
        (ckpt / "checkpoint" / "meta.json").write_text(json.dumps({"counters": {"env_steps": env_steps}}))


@dataclass
class FakeTrainer:
    """Each train() is one segment of min(segment_s, job.max_seconds) training seconds, ending with the next
    reason of `reasons` (max_seconds when they run out); `block`: write the segment, then wait to be killed."""

    segment_s: float = 1000.0
    reasons: list[str] = field(default_factory=list)
    block: bool = False
    jobs: list[TrainJob] = field(default_factory=list)

    def command(self, job: TrainJob) -> list[str]:
        return LauncherTrainer(Children()).command(job)

    def train(self, job: TrainJob) -> TrainOutcome:
        self.jobs.append(job)
        seconds = min(self.segment_s, job.max_seconds)
        write_segment(job.run_dir, job.env_id, seconds, env_steps=1000 * len(self.jobs), overrides=job.overrides)
        if self.block:
            print(MARKER, flush=True)
            threading.Event().wait()  # until the test kills this process
        return TrainOutcome(0, self.reasons.pop(0) if self.reasons else "max_seconds")


@dataclass
class FakeEvaluator:
    """suite(): flag rate per snapshot folder name from `flags` (default 0.1); calls recorded as (kind, args)."""

    flags: dict[str, float] = field(default_factory=dict)
    calls: list[tuple[str, Any]] = field(default_factory=list)

    def suite(self, checkpoints: Sequence[Path], level: str, seeds: Sequence[int], episodes: int, out: Path,
              baselines: Path) -> str:
        self.calls.append(("suite", (list(checkpoints), level, tuple(seeds))))
        from evaluate.evaluate import find_baseline
        from evaluate.levels import parse_level

        lv = parse_level(level)
        env = opt.load_config("cpu", [f"env.env_id={lv.env_id}"]).env  # the env write_segment's runs train on
        results, entries = [], []
        for ckpt in checkpoints:
            meta = json.loads((ckpt / "checkpoint" / "meta.json").read_text())
            entries.append({"path": str(ckpt / "checkpoint"), "counters": meta["counters"],
                            "env": {"env_id": lv.env_id}})
            rate = self.flags.get(ckpt.name, 0.1)
            results.append({"checkpoint": str(ckpt / "checkpoint"), "flag_rate": rate, "episodes": episodes * len(seeds),
                            "mean_x_pos": 1000.0 + 1000 * rate, "mean_return": 10.0})
        found = find_baseline(env, baselines)
        report = {"settings": {"eval_seeds": list(seeds), "episodes_per_seed": episodes}, "checkpoints": entries,
                  "levels": [{"name": lv.name, "checkpoints": results,
                              "random": {"flag_rate": 0.0, "mean_x_pos": found[0]["mean_x_pos"]} if found else None}]}
        out.mkdir(parents=True, exist_ok=True)
        (out / "suite.json").write_text(json.dumps(report))
        return f"fake suite {level} {','.join(map(str, seeds))}"

    def export(self, source: Path, out: Path) -> str:
        self.calls.append(("export", source))
        (out / "checkpoint").mkdir(parents=True, exist_ok=True)
        (out / "checkpoint" / "meta.json").write_bytes((source / "checkpoint" / "meta.json").read_bytes())
        return f"fake export {source} {out}"

    def gif(self, checkpoint: Path, out: Path, seed: int, episodes: int) -> str:
        self.calls.append(("gif", seed))
        out.mkdir(parents=True, exist_ok=True)
        (out / "best_episode.gif").write_bytes(b"GIF89a")
        return "fake gif"

    def random_policy(self, config: Path, level: str, out_dir: Path, episodes: int) -> str:
        self.calls.append(("random", level))
        from evaluate.levels import level_env_config, parse_level
        from shared.config import Config

        env = level_env_config(Config.from_dict(json.loads(config.read_text())).env, parse_level(level))
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"random_policy_{level}_{env.action_set}.json").write_text(json.dumps(
            {"env_id": env.env_id, "action_set": env.action_set, "frame_skip": env.frame_skip, "mean_x_pos": 300.0,
             "flag_rate": 0.0}))
        return "fake random"


STUB_LAUNCHER = """
import os, signal, sys, threading
out = sys.argv[sys.argv.index('--run-dir') + 1]
os.makedirs(out, exist_ok=True)
signals = []
done = threading.Event()
def on_signal(signum, frame):
    signals.append(signum)
    open(os.path.join(out, 'signals'), 'a').write(f'{signum}\\n')
    done.set()
signal.signal(signal.SIGINT, on_signal)
open(os.path.join(out, 'pid'), 'w').write(str(os.getpid()))
print('stub head: ready', flush=True)
done.wait()
print("[DONE] {'reason': 'signal', 'elapsed_s': 1.0}", flush=True)
"""


def main(argv: list[str]) -> int:
    from evaluate import campaign

    mode, args = argv[0], argv[1:]
    if mode == "block":
        return campaign.main(args, parts=lambda children, plan: (FakeTrainer(block=True), FakeEvaluator()))
    if mode == "stub-launcher":  # the real trainer, with a stand-in for python -m launcher that waits for SIGINT
        return campaign.main(args, parts=lambda children, plan: (
            LauncherTrainer(children, launcher=(sys.executable, "-c", STUB_LAUNCHER)), FakeEvaluator()))
    raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

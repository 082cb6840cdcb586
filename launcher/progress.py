"""Turns the head's counters into one record per interval and the human `[PROGRESS]` line.

Rates are computed between consecutive records (not since start), so the line shows what the
system does now. Episode statistics cover the last `window` episodes reported by collectors.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any

from ingest.consolidation_types import ConsolidationStats


class ProgressTracker:
    def __init__(self, window: int, base_env_steps: int = 0) -> None:
        self.window = window
        self.base_env_steps = base_env_steps
        self._episodes: deque[Any] = deque(maxlen=window)
        self._seen_episodes = 0
        self._best_x = 0
        self._flags = 0
        self._stages: dict[str, dict[str, int]] = {}  # Mario "W-S" -> episodes, flags, best x_pos since the start
        self._start = time.monotonic()
        self._last_t = self._start
        self._last_steps = base_env_steps
        self._last_updates: int | None = None
        self._last_samples: int | None = None

    def record(self, stats: ConsolidationStats, learner: dict[str, Any], replay_size: int, replay_capacity: int,
               weight_version: int, restarts: int, counters: dict[str, int]) -> dict[str, Any]:
        now = time.monotonic()
        dt = max(1e-9, now - self._last_t)
        self._take_episodes(stats)
        env_steps = self.base_env_steps + stats.transitions
        updates = int(learner.get("updates", 0))
        samples = int(learner.get("samples", 0))
        if self._last_updates is None:
            self._last_updates = int(counters.get("updates", updates))
            self._last_samples = samples
        live = [c for c in stats.collectors.values() if not c["closed"]]  # reclaimed ones are already gone
        # the weights collectors act with, read from their chunks: a peer that never delivered a transition (a
        # registration still waiting for its first chunk, or one that only ever sends summaries) has none
        versions = [c["weight_version"] for c in live if c["transitions"] > 0]
        epsilons = [c["epsilon"] for c in live]
        # the learning curve: the least-exploring slot's episodes are the closest to the greedy policy
        greedy_slot = min(live, key=lambda c: c["epsilon"])["slot"] if live else None
        greedy = stats.recent_by_slot.get(greedy_slot, []) if greedy_slot is not None else []
        returns = [e.episode_return for e in self._episodes]
        xs = [e.x_pos for e in self._episodes]
        record: dict[str, Any] = {
            "time": time.time(),
            "elapsed_s": now - self._start,
            "env_steps": env_steps,
            "env_steps_per_s": (env_steps - self._last_steps) / dt,
            "updates": updates,
            "updates_per_s": (updates - self._last_updates) / dt,
            "samples_per_s": (samples - (self._last_samples or 0)) / dt,
            "replay_size": int(replay_size),
            "replay_capacity": int(replay_capacity),
            "episodes": counters.get("episodes", 0) + stats.episodes,
            "mean_return_20": _mean(returns),
            "mean_x_pos_20": _mean(xs),
            "mean_x_pos_20_greedy": _mean([e.x_pos for e in greedy]),  # the lowest-epsilon slot's last 20
            "mean_return_20_greedy": _mean([e.episode_return for e in greedy]),
            "flag_rate_20_greedy": _mean([float(e.flag_get) for e in greedy]),
            "greedy_epsilon": min((c["epsilon"] for c in live), default=float("nan")),
            "best_x_pos": self._best_x,
            "flags": self._flags,
            "stages": {stage: dict(counts) for stage, counts in sorted(self._stages.items())},
            "weight_version": weight_version,
            "weight_lag": (weight_version - min(versions)) if versions else float("nan"),
            "epsilon_mean": _mean(epsilons),
            "collectors_alive": len(live),
            "collectors_waiting": sum(bool(c.get("waiting")) for c in live),  # held by the insert gate / credits
            # collectors whose data has arrived at least once: the bench's steady window starts when all have
            "collectors_delivered": sum(c["transitions"] > 0 for c in stats.collectors.values()),
            "restarts": restarts,
            "rejected": stats.rejected,
            "rejected_by_reason": dict(stats.rejected_by_reason),
            "registrations_reclaimed": stats.reclaimed,
            "gaps": stats.gaps,
            "consolidation_errors": stats.errors,
        }
        for key in ("loss", "td_error", "mean_q", "grad_norm", "data_wait_frac", "ratio_state", "replay_ratio",
                    "compile_s", "samples", "skipped_updates"):
            if key in learner:
                record[key] = learner[key]
        self._last_t, self._last_steps = now, env_steps
        self._last_updates, self._last_samples = updates, samples
        return record

    def _take_episodes(self, stats: ConsolidationStats) -> None:
        """Fold in the episodes that arrived since the last record (stats keeps a window of them)."""
        new = stats.episodes - self._seen_episodes
        if new <= 0:
            return
        recent = list(stats.recent_episodes)[-min(new, len(stats.recent_episodes)):] if stats.recent_episodes else []
        for episode in recent:
            self._episodes.append(episode)
            self._best_x = max(self._best_x, int(episode.x_pos))
            self._flags += int(bool(episode.flag_get))
            if episode.world:  # a Mario episode says its stage (random stages draw one per episode)
                counts = self._stages.setdefault(f"{episode.world}-{episode.stage}",
                                                 {"episodes": 0, "flags": 0, "best_x_pos": 0})
                counts["episodes"] += 1
                counts["flags"] += int(bool(episode.flag_get))
                counts["best_x_pos"] = max(counts["best_x_pos"], int(episode.x_pos))
        self._seen_episodes = stats.episodes

    @staticmethod
    def progress_line(r: dict[str, Any]) -> str:
        cap = r.get("replay_capacity") or 0
        fill = f" ({100 * r['replay_size'] / cap:.0f}%)" if cap else ""
        wait = r.get("data_wait_frac")
        return (
            f"[PROGRESS] {r['elapsed_s']:.0f}s env {r['env_steps']:,} ({r['env_steps_per_s']:.0f}/s) "
            f"upd {r['updates']:,} ({r['updates_per_s']:.1f}/s) replay {r['replay_size']:,}/{cap:,}{fill} "
            f"ret20 {_fmt(r['mean_return_20'])} x20 {_fmt(r['mean_x_pos_20'], 0)} "
            f"(greedy slot {_fmt(r.get('mean_x_pos_20_greedy', float('nan')), 0)}, "
            f"flags {_pct(r.get('flag_rate_20_greedy', float('nan')))}) best_x {r['best_x_pos']:,} "
            f"flags {r['flags']} lag {_fmt(r['weight_lag'], 1)} "
            f"wait {'-' if wait is None else f'{100 * wait:.0f}%'} "
            f"collectors {r['collectors_alive']} ({r.get('collectors_waiting', 0)} waiting) restarts {r['restarts']}"
            + (f" eval x {r['eval_mean_x_pos']:,.0f} flags {round(r['eval_flag_rate'] * r['eval_episodes'])}/"
               f"{r['eval_episodes']} @{r['eval_updates']:,}" if r.get("eval_episodes") else "")
            + (" stages " + " ".join(f"{s} {c['flags']}/{c['episodes']}" for s, c in r["stages"].items())
               if len(r.get("stages") or {}) > 1 else "")
            + (f" HEAD ERRORS {r['consolidation_errors']}" if r.get("consolidation_errors") else "")
            + f" {r.get('ratio_state', '')}".rstrip()
        )


def _mean(values: list[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


def _pct(value: float) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.0f}%"


def _fmt(value: float, digits: int = 1) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:,.{digits}f}"

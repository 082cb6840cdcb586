"""Aggregate statistics across training seeds, as rliable reports them (Agarwal et al., 2021,
"Deep Reinforcement Learning at the Edge of the Statistical Precipice").

Interquartile mean (IQM): the mean of the middle 50% of the scores -- sort the n scores, drop
floor(n / 4) from each end, average the rest (scipy.stats.trim_mean(scores, 0.25), which rliable's
IQM calls, over all runs and tasks together). Less swayed by one outlying seed than the mean, less
coarse than the median. With n < 4 nothing is dropped: the IQM is the mean.

Confidence interval: a stratified percentile bootstrap. `scores` is (runs, tasks): each resample
draws, for every task (stratum) on its own, `runs` runs with replacement from that task's runs, and
recomputes the statistic over the resampled table; the interval is the (1 - c) / 2 and (1 + c) / 2
quantiles (numpy's linear interpolation) of the statistic over the resamples. For one task the
strata are trivial and this is the plain bootstrap over seeds. A single run has nothing to resample:
every resample is the point, so the interval collapses to it (it measures no spread across seeds).
The resampling generator is seeded: the same scores give the same interval.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95


def iqm(scores: np.ndarray) -> float:
    """Interquartile mean of all `scores` (any shape), as scipy.stats.trim_mean(scores, 0.25, axis=None)."""
    flat = np.sort(np.asarray(scores, dtype=np.float64).ravel())
    if flat.size == 0:
        raise ValueError("iqm of no scores")
    cut = flat.size // 4
    return float(flat[cut:flat.size - cut].mean())


def _iqm_rows(samples: np.ndarray) -> np.ndarray:
    """IQM of each row of a 2-D array (one resample a row)."""
    rows = np.sort(samples, axis=1)
    cut = rows.shape[1] // 4
    return rows[:, cut:rows.shape[1] - cut].mean(axis=1)


def stratified_bootstrap_ci(scores: np.ndarray, *, resamples: int = BOOTSTRAP_RESAMPLES,
                            confidence: float = CONFIDENCE, seed: int = BOOTSTRAP_SEED,
                            statistic: Callable[[np.ndarray], np.ndarray] = _iqm_rows) -> tuple[float, float]:
    """(low, high) percentile interval of `statistic` over stratified resamples of `scores` (runs, tasks).

    A 1-D `scores` is one task. `statistic` maps a (resamples, runs * tasks) array to one value per row.
    """
    table = np.asarray(scores, dtype=np.float64)
    if table.ndim == 1:
        table = table[:, None]
    if table.ndim != 2 or table.size == 0:
        raise ValueError(f"scores must be a non-empty (runs, tasks) table, got shape {np.shape(scores)}")
    if resamples < 1 or not 0.0 < confidence < 1.0:
        raise ValueError(f"resamples={resamples}, confidence={confidence}: allowed >= 1 and (0, 1)")
    runs, tasks = table.shape
    rng = np.random.default_rng(seed)
    picks = rng.integers(runs, size=(resamples, runs, tasks))  # run indices, drawn per task
    resampled = table[picks, np.arange(tasks)]  # (resamples, runs, tasks)
    values = statistic(resampled.reshape(resamples, runs * tasks))
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(values, [tail, 1.0 - tail])
    return float(low), float(high)


def aggregate(scores: np.ndarray, **bootstrap: object) -> dict[str, object]:
    """{"iqm", "ci_low", "ci_high", "runs"} of `scores` (runs, tasks) or (runs,)."""
    table = np.asarray(scores, dtype=np.float64)
    low, high = stratified_bootstrap_ci(table, **bootstrap)  # type: ignore[arg-type]
    return {"iqm": iqm(table), "ci_low": low, "ci_high": high, "runs": int(table.shape[0])}

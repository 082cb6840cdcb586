"""Learning evidence through the whole system: CartPole-v1 within 150k env steps.

Why: unit tests show each part computes the right thing; only an end-to-end run shows that the
parts together learn (collectors -> ZeroMQ -> prioritized replay -> learner -> weight broadcast).
The head runs as a subprocess with the out-of-the-box CartPole preset (config_optimized.py), a
fixed seed, a 150k env-step budget and `--target-return 475` (it stops by itself once solved).

What is asserted: the run starts untrained (a random policy scores ~22; the collectors' seeded
initial networks for seed 1 score ~10 and ~12 greedy), the mean return of
the last 20 episodes reaches 475 within 150k env steps, and the head stopped itself for that
reason. CleanRL's single-process DQN needs 217k-294k (BENCHMARKS.md). A multi-process run is
not deterministic even with a fixed seed (thread and socket timing decide which transitions each
update samples): 20 seeds of the CartPole defaults solved it in 24k-114k env steps, median 45k
(BENCHMARKS.md), and one run of this test on a fast machine had not by 100k (best 395): the
budget is the slowest seed measured plus a third. Wall time is printed, not asserted.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.cluster import children_of, kill_tree, read_metrics, start_head, stop_head
from tests.support.waits import wait_for

SEED = 1
MAX_ENV_STEPS = 150_000
SOLVED_RETURN = 475.0
RANDOM_POLICY_RETURN = 22.0

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def _summary(log_text: str) -> dict:
    lines = [line for line in log_text.splitlines() if line.startswith("[DONE] ")]
    assert lines, f"the head printed no [DONE] summary:\n{log_text[-3000:]}"
    return ast.literal_eval(lines[-1][len("[DONE] "):])


def test_cartpole_learns_through_the_whole_system(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "head.log"
    proc = start_head(
        ["--env", "CartPole-v1", "--profile", "cpu", "--seed", str(SEED), "--max-env-steps", str(MAX_ENV_STEPS),
         "--target-return", str(SOLVED_RETURN), "--log-interval", "2", "--run-dir", str(run_dir),
         "--set", "transport.port=0"],
        log,
    )
    try:
        rc = proc.wait(timeout=1200)  # the budget is env steps; the deadline only catches a run that hangs
        assert rc == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            try:
                stop_head(proc, timeout=30)
            finally:
                kill_tree(proc)
    assert wait_for(lambda: not children_of(proc.pid), timeout=60), "collectors outlived the head"

    summary = _summary(log.read_text())
    assert summary["reason"] in ("target_return", "max_env_steps"), summary
    assert (run_dir / "checkpoint").is_dir(), "no checkpoint written at the end of the run"
    rows = [r for r in read_metrics(run_dir) if r.get("mean_return_20") is not None and r["env_steps"] <= MAX_ENV_STEPS]
    assert rows, "no episode statistics within the step budget"
    # it starts out untrained: the mean episode length (= return on CartPole) of every episode before the first row.
    # Collectors act with their own initial network until the first weights arrive, seeded by the run's seed: an
    # untrained network's greedy policy can balance for long (300 unseeded draws: median 10.6, 90th percentile 68,
    # 99th 274, one 449); unseeded, a run whose first collector to deliver drew such a network started at 129.
    # Up to 20 episodes that is the row's window, from the episodes' own summaries; beyond, env steps over episodes
    # (a fast run may have learned within the last 20 by then). Not that ratio for a few episodes: env steps come
    # with chunks and episodes with their summaries, so a row can count a chunk whose episodes' summaries are still
    # on their way (one chunk of 384 steps over 2 episodes once looked like a trained policy)
    first = rows[0]
    start = first["mean_return_20"] if first["episodes"] <= 20 else first["env_steps"] / first["episodes"]
    assert start < 4 * RANDOM_POLICY_RETURN, \
        {k: first.get(k) for k in ("env_steps", "episodes", "mean_return_20", "updates", "collectors_delivered")}
    best = max(r["mean_return_20"] for r in rows)
    assert summary["reason"] == "target_return" and summary["env_steps"] <= MAX_ENV_STEPS, \
        f"mean return of the last 20 episodes never reached {SOLVED_RETURN} within {MAX_ENV_STEPS} env steps " \
        f"(best {best:.1f}): {summary}"  # ...and learns
    print(f"mean return {SOLVED_RETURN} reached at env_steps={summary['env_steps']} after {summary['updates']} "
          f"updates in {summary['elapsed_s']:.1f} s (head run time)")

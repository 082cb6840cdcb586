"""Learning evidence through the whole system: CartPole-v1 solved within 100k env steps.

Why: unit tests show each part computes the right thing; only an end-to-end run shows that the
parts together learn (collectors -> ZeroMQ -> prioritized replay -> learner -> weight broadcast).
The head runs as a subprocess with the out-of-the-box CartPole defaults (learner/cli.py), a
fixed seed and `--target-return 475`, so it stops by itself once the mean return of the last 20
episodes reaches 475, or at the 100k-step budget. No wall-time assert: speed against the CleanRL
reference is measured by scripts/cartpole_race.py and recorded in BENCHMARKS.md.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.cluster_helpers import children_of, kill_tree, read_metrics, start_head, stop_head, wait_for

SEED = 1
MAX_ENV_STEPS = 100_000
SOLVED_RETURN = 475.0

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def _summary(log_text: str) -> dict:
    lines = [line for line in log_text.splitlines() if line.startswith("[DONE] ")]
    assert lines, f"the head printed no [DONE] summary:\n{log_text[-3000:]}"
    return ast.literal_eval(lines[-1][len("[DONE] "):])


def test_cartpole_solved_within_100k_env_steps(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "head.log"
    proc = start_head(
        ["--env", "CartPole-v1", "--profile", "cpu", "--seed", str(SEED), "--max-env-steps", str(MAX_ENV_STEPS),
         "--target-return", str(SOLVED_RETURN), "--log-interval", "2", "--run-dir", str(run_dir),
         "--set", "transport.port=0"],
        log,
    )
    try:
        rc = proc.wait(timeout=380)
        assert rc == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            try:
                stop_head(proc, timeout=30)
            finally:
                kill_tree(proc)
    assert wait_for(lambda: not children_of(proc.pid), timeout=15), "collectors outlived the head"

    summary = _summary(log.read_text())
    rows = read_metrics(run_dir)
    assert rows, "the head wrote no metrics"
    best = max((r["mean_return_20"] for r in rows if r.get("mean_return_20") is not None), default=None)
    assert summary["reason"] == "target_return", (
        f"mean return of the last 20 episodes never reached {SOLVED_RETURN} within {MAX_ENV_STEPS} env steps "
        f"(stopped by {summary['reason']} at {summary['env_steps']} steps; best logged mean {best})")
    assert summary["env_steps"] <= MAX_ENV_STEPS, summary
    assert (run_dir / "checkpoint").is_dir(), "no checkpoint written at the end of the run"
    print(f"solved at env_steps={summary['env_steps']} updates={summary['updates']} "
          f"elapsed_s={summary['elapsed_s']:.1f}")

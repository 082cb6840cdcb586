"""CartPole race: the full distributed system against the single-process CleanRL-style DQN, one seed.

Why: "learning works through the whole system" is only convincing next to a known baseline, run in
the same sitting on the same machine. Both runs are timed from the moment we launch their process
(interpreter and torch start-up included) to the first point where the mean return of the last 20
episodes is >= 475. The system is the real head (`python -m launcher --env CartPole-v1`, collectors,
ZeroMQ, prioritized replay, learner) with the out-of-the-box CartPole preset of config_optimized.py.
The head stops itself once solved (`--target-return 475`); we read its metrics.jsonl.

Usage: python -m experiments.cartpole_race --seeds 1 2 3 [--system-only] [--set section.field=value ...]
Prints one JSON line per run and a JSON summary at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SOLVED_RETURN = 475.0
BUDGET_STEPS = 100_000


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written right now
            break
    return rows


def first_solved(rows: list[dict[str, Any]], max_env_steps: int = BUDGET_STEPS) -> dict[str, Any] | None:
    """The first metrics row within the step budget whose 20-episode mean return is >= 475."""
    for row in rows:
        ret = row.get("mean_return_20")
        if ret is not None and ret >= SOLVED_RETURN and row.get("env_steps", 0) <= max_env_steps:
            return row
    return None


def _stop(proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """SIGINT the head (clean shutdown of its collectors); SIGKILL its process group if it hangs."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_system(seed: int, overrides: list[str] | None = None, max_env_steps: int = BUDGET_STEPS,
               stop_on_solve: bool = True, run_dir: Path | None = None, log_interval: float = 1.0) -> dict[str, Any]:
    """Run the real head on CartPole; return steps and wall time (from launch) to mean-20 >= 475."""
    run_dir = run_dir or Path(tempfile.mkdtemp(prefix=f"cartpole-race-s{seed}-"))
    args = [sys.executable, "-m", "launcher", "--env", "CartPole-v1", "--profile", "cpu", "--seed", str(seed),
            "--max-env-steps", str(max_env_steps), "--log-interval", str(log_interval), "--run-dir", str(run_dir),
            "--set", "transport.port=0"]
    if stop_on_solve:
        args += ["--target-return", str(SOLVED_RETURN)]
    for item in overrides or []:
        args += ["--set", item]
    launched = time.time()
    with open(run_dir.parent / f"{run_dir.name}.log", "wb") as log:
        proc = subprocess.Popen(args, env=_env(), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        while proc.poll() is None:
            if stop_on_solve and first_solved(_metrics(run_dir), max_env_steps) is not None:
                break
            time.sleep(0.5)
    finally:
        _stop(proc)
    rows = _metrics(run_dir)
    solved = first_solved(rows, max_env_steps)
    last = rows[-1] if rows else {}
    return {
        "system": "mario_apex_head",
        "seed": seed,
        "steps_to_475": solved["env_steps"] if solved else None,
        "wall_s_to_475": solved["time"] - launched if solved else None,
        "updates_at_475": solved["updates"] if solved else None,
        "solved_within_100k": solved is not None and solved["env_steps"] <= BUDGET_STEPS,
        "final_env_steps": last.get("env_steps"),
        "final_mean_return_20": last.get("mean_return_20"),
        "best_mean_return_20": max((r["mean_return_20"] for r in rows if r.get("mean_return_20") is not None),
                                   default=None),
        "run_dir": str(run_dir),
        "overrides": overrides or [],
    }


def run_reference(seed: int, total_timesteps: int = 500_000) -> dict[str, Any]:
    """Run experiments/cleanrl_dqn.py in its own process, stopping at its first mean-20 >= 475."""
    launched = time.time()
    out = subprocess.run([sys.executable, "-m", "experiments.cleanrl_dqn", "--seed", str(seed),
                          "--total-timesteps", str(total_timesteps), "--stop-on-solve",
                          "--process-start", repr(launched)],
                         env=_env(), capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result.pop("args", None)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.cartpole_race", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="extra override for the system (defaults: config_optimized.py CARTPOLE_PRESET)")
    parser.add_argument("--system-only", action="store_true", help="skip the reference DQN (tuning sweeps)")
    parser.add_argument("--max-env-steps", type=int, default=BUDGET_STEPS)
    ns = parser.parse_args(argv)
    table = []
    for seed in ns.seeds:
        sysres = run_system(seed, ns.overrides, ns.max_env_steps)
        print(json.dumps(sysres), flush=True)
        row = {"seed": seed, "system_steps": sysres["steps_to_475"], "system_wall_s": sysres["wall_s_to_475"]}
        if not ns.system_only:
            ref = run_reference(seed)
            print(json.dumps(ref), flush=True)
            row.update(reference_steps=ref["steps_to_475"], reference_wall_s=ref["wall_s_to_475"],
                       reference_solved_within_100k=ref["solved_within_100k"])
        table.append(row)
    print(json.dumps({"summary": table}, indent=1))


if __name__ == "__main__":
    main()

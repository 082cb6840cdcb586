"""One proxy run of a learning lever: train, then evaluate the final checkpoint.

Trains Mario with the defaults plus the given overrides for --seconds (`python -m launcher`), then
plays the final checkpoint for 10 episodes at epsilon 0.05 (`python -m evaluate`, no video) into
RUN_DIR/final_eval/. The head's periodic evaluations (every logging.eval_every_s) are in
RUN_DIR/evals.jsonl. Any other launcher option (--profile, --env, --collectors, ...) is passed on.

    python -m experiments.proxy RUN_DIR --seed SEED --seconds SECONDS [--set section.field=value ...]
    python -m experiments.proxy runs/lever-stream-s0 --seed 0 --seconds 1800 --set collectors.eps_per=stream
"""

from __future__ import annotations

import argparse
import subprocess
import sys

EVAL_EPISODES = 10
EVAL_EPSILON = 0.05


def commands(run_dir: str, seed: int, seconds: float, launcher_args: list[str]) -> list[list[str]]:
    """The training command, then the evaluation command. The head binds any free port unless told one."""
    port = [] if any(a == "--port" or a.startswith(("--port=", "transport.port=")) for a in launcher_args) \
        else ["--set", "transport.port=0"]
    train = [sys.executable, "-m", "launcher", "--max-seconds", str(seconds), "--log-interval", "60",
             "--seed", str(seed), "--run-dir", run_dir, *port, *launcher_args]
    evaluate = [sys.executable, "-m", "evaluate", run_dir, "--episodes", str(EVAL_EPISODES),
                "--epsilon", str(EVAL_EPSILON), "--no-video", "--out", f"{run_dir}/final_eval"]
    return [train, evaluate]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.proxy", description=__doc__.splitlines()[0],
                                 epilog="Other options are passed to `python -m launcher`.")
    ap.add_argument("run_dir", help="where the run (and final_eval/) goes")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--seconds", type=float, required=True, help="training wall time")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                    help="config override for the run; repeatable")
    args, launcher_args = ap.parse_known_args(argv)
    if args.seconds <= 0:
        ap.error(f"--seconds={args.seconds}: allowed a number > 0")
    for item in args.overrides:
        launcher_args += ["--set", item]
    for cmd in commands(args.run_dir, args.seed, args.seconds, launcher_args):
        rc = subprocess.run(cmd).returncode
        if rc != 0:
            print(f"error: `{' '.join(cmd[1:3])}` exited {rc}", file=sys.stderr)
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())

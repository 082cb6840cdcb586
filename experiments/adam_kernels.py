"""Adam's kernels on the learner's parameters: foreach against fused, milliseconds per optimizer step.

The Mario network (Nature CNN, dueling head of 512, 5 actions: 3.3M parameters) with fixed gradients;
both optimizers step the same parameters, in rounds that alternate which goes first (ABBA), so a
machine whose speed drifts affects both alike. foreach makes one pass over memory per elementwise op
of Adam's update (about ten); fused makes one pass per parameter tensor. `learner/dqn.py` picks fused
on CPU and CUDA from this comparison.

    python -m experiments.adam_kernels [--threads 1] [--rounds 8] [--steps 50] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from bench.report import cpu_model
from bench.steady import spread
from shared.network import build_q_network

KERNELS = ("foreach", "fused")


def measure(threads: int, rounds: int, steps: int, warmup: int = 3) -> dict:
    """ms per Adam step for each kernel, one value per round (the mean over `steps` steps)."""
    torch.set_num_threads(threads)
    net = build_q_network((84, 84), 4, 5)
    params = list(net.parameters())
    generator = torch.Generator().manual_seed(0)
    for p in params:
        p.grad = torch.randn(p.shape, generator=generator) * 1e-3
    optimizers = {k: torch.optim.Adam(params, lr=1e-4, **{k: True}) for k in KERNELS}
    values: dict[str, list[float]] = {k: [] for k in KERNELS}
    for r in range(rounds):
        for kernel in (KERNELS if r % 2 == 0 else tuple(reversed(KERNELS))):
            opt = optimizers[kernel]
            for _ in range(warmup):
                opt.step()
            t0 = time.perf_counter()
            for _ in range(steps):
                opt.step()
            values[kernel].append(round((time.perf_counter() - t0) / steps * 1e3, 3))
    summary = {k: spread(v) for k, v in values.items()}
    return {"adam_ms_per_step": summary, "foreach_over_fused": round(summary["foreach"]["median"]
                                                                     / summary["fused"]["median"], 2),
            "params": sum(p.numel() for p in params), "threads": threads, "rounds": rounds, "steps": steps,
            "torch": torch.__version__, "cpu": cpu_model() or "unknown"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.adam_kernels", description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--rounds", type=int, default=8, help="alternating rounds (default 8)")
    ap.add_argument("--steps", type=int, default=50, help="timed steps per kernel and round (default 50)")
    ap.add_argument("--out", type=Path, help="also write the JSON to this file")
    args = ap.parse_args(argv)
    for name in ("threads", "rounds", "steps"):
        if getattr(args, name) < 1:
            print(f"error: --{name} must be >= 1 (got {getattr(args, name)})", file=sys.stderr)
            return 2
    result = measure(args.threads, args.rounds, args.steps)
    text = json.dumps(result, indent=1, sort_keys=True)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

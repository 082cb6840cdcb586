"""Average the online networks of several checkpoints of one run into one evaluation-only checkpoint.

    python -m evaluate.average runs/<run>/snaps/A runs/<run>/snaps/B ... --out docs/checkpoints/<name>

Stochastic weight averaging applied after the fact: snapshots of one training run taken some
thousands of updates apart lie close enough in weight space that their parameter-wise mean is
itself a network, and often a steadier one than any single snapshot (Izmailov et al. 2018;
Nikishin et al. 2018 for DQN). Every checkpoint must hold the same geometry (meta.json) and the
same tensors; floating-point tensors are averaged with equal weights (or --weights), anything
else (integer buffers) is taken from the last checkpoint, as are its counters and config. The
result is written like `python -m evaluate.export` writes (online network in fp32, no optimizer,
replay or RNG; at most 15 MiB) with `average.json` beside it naming the sources, so `make eval
CHECKPOINT=<out>` and `python -m evaluate.suite <out>` read it as any checkpoint. Whether the
mean plays better than its parts is a measurement, not a promise: evaluate it on episodes the
snapshots were not chosen by.

Exit status 2 with one line: a missing or corrupt checkpoint, fewer than two, bad weights, or a
checkpoint whose geometry or tensors (keys, shapes, dtypes) differ from the first one's.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from evaluate.export import ExportError, write_eval_only
from learner.checkpoint import (
    CheckpointData,
    CheckpointError,
    check_geometry,
    check_state_dict,
    eval_only,
    load_checkpoint,
)


class AverageError(Exception):
    """Checkpoints that cannot be averaged; the message is one line that names the problem."""


def average_networks(datas: Sequence[CheckpointData], weights: Sequence[float] | None = None,
                     names: Sequence[str] | None = None) -> CheckpointData:
    """The eval-only checkpoint whose online network is the weighted mean of `datas`' online networks."""
    if len(datas) < 2:
        raise AverageError(f"averaging needs at least two checkpoints, got {len(datas)}")
    names = list(names) if names is not None else [f"checkpoint {i}" for i in range(len(datas))]
    w = [1.0] * len(datas) if weights is None else [float(x) for x in weights]
    if len(w) != len(datas):
        raise AverageError(f"{len(w)} weights for {len(datas)} checkpoints")
    if any(not (math.isfinite(x) and x >= 0.0) for x in w) or sum(w) <= 0.0:
        raise AverageError(f"weights {w} must be finite and >= 0 with a positive sum")
    total = sum(w)
    first = datas[0]
    for name, data in zip(names[1:], datas[1:], strict=True):
        check_geometry(first.geometry, data.geometry, name, against="first checkpoint")
        check_state_dict(first.model["online"], data.model["online"], f"{name}[online]", against="first checkpoint")
    mean: dict[str, torch.Tensor] = {}
    for k, ref in datas[-1].model["online"].items():
        if not ref.is_floating_point():
            mean[k] = ref.detach().clone()
            continue
        acc = torch.zeros(ref.shape, dtype=torch.float64)
        for x, data in zip(w, datas, strict=True):
            acc += (x / total) * data.model["online"][k].detach().to(torch.float64)
        mean[k] = acc.to(torch.float32)
    last = datas[-1]
    return eval_only(CheckpointData(
        geometry=dict(last.geometry), model={"online": mean, "target": mean}, optimizer={}, scaler={},
        counters=dict(last.counters), config_json=last.config_json,
    ))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evaluate.average", description=__doc__.splitlines()[0])
    ap.add_argument("sources", nargs="+", help="run dirs or checkpoint dirs of one run (the last one's config is kept)")
    ap.add_argument("--out", required=True, help="directory to write (its checkpoint/ is replaced)")
    ap.add_argument("--weights", type=float, nargs="+", help="one weight per source (default: equal)")
    args = ap.parse_args(argv)
    try:
        datas = [load_checkpoint(src) for src in args.sources]
        averaged = average_networks(datas, args.weights, args.sources)
        path, size = write_eval_only(Path(args.out), averaged)
    except (CheckpointError, AverageError, ExportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    record = {
        "sources": [{"path": src, "counters": dict(d.counters)} for src, d in zip(args.sources, datas, strict=True)],
        "weights": list(args.weights) if args.weights else [1.0] * len(datas),
    }
    (Path(args.out) / "average.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path} ({size / 2**20:.1f} MiB), the mean of {len(datas)} networks")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Write a small, evaluation-only copy of a run's checkpoint, for shipping in the repo.

    python -m evaluate.export runs/<run> docs/checkpoints/<name>

`<name>/checkpoint/` is an ordinary checkpoint (same layout, sizes and sha256 in meta.json, so
`make eval CHECKPOINT=docs/checkpoints/<name>` reads it with the usual checks) holding only what
playing needs: the online network in fp32 (the target entry shares its tensors, so they are
stored once) and no optimizer moments, replay or RNG streams. It cannot be resumed from: that
needs the full checkpoint. The run's config.json, counters and metrics.jsonl travel with it.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from learner.checkpoint import CheckpointData, CheckpointError, eval_only, load_checkpoint, save_checkpoint

MAX_BYTES = 15 * 2**20  # what the repository takes per shipped checkpoint


class ExportError(Exception):
    """A copy that cannot be shipped; the message is one line."""


def write_eval_only(out: Path, small: CheckpointData) -> tuple[Path, int]:
    """Write `small` (an eval_only() checkpoint) to out/checkpoint/; returns its path and size in bytes.

    ExportError, with nothing written, when the copy would exceed MAX_BYTES (it is sized in a
    staging folder beside `out` first)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".export-", dir=out.parent))
    try:
        staged = save_checkpoint(stage, small)
        size = sum(f.stat().st_size for f in staged.rglob("*") if f.is_file())
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    if size > MAX_BYTES:
        raise ExportError(f"its evaluation-only copy is {size} bytes, over the {MAX_BYTES}-byte limit for a "
                          f"shipped checkpoint; nothing written")
    return save_checkpoint(out, small), size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evaluate.export", description=__doc__.splitlines()[0])
    ap.add_argument("source", help="run dir or checkpoint dir")
    ap.add_argument("out", help="directory to write (its checkpoint/ is replaced)")
    args = ap.parse_args(argv)
    try:
        data = load_checkpoint(args.source)
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    try:
        path, size = write_eval_only(out, eval_only(data))
    except ExportError as exc:
        print(f"error: {args.source}: {exc}", file=sys.stderr)
        return 2
    metrics = (data.path or Path(args.source)).parent / "metrics.jsonl"
    if metrics.is_file():  # the learning curve travels too (make eval draws it)
        shutil.copyfile(metrics, out / "metrics.jsonl")
    print(f"wrote {path} ({size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Record bench/data/mario_1_1_chunks.npz: real Mario 1-1 chunks for the scale simulation.

A real `Collector` (the cpu profile's network, epsilon, frame skip and reward scale; one env)
steps SuperMarioBros-1-1 and its chunks are captured instead of sent: real frames, actions,
rewards and the initial priorities its network computed. bench/scale.py replays them. Chunks
hold the profile's `collectors.chunk_steps` new transitions (128 in every profile) unless
--chunk-steps says otherwise: the head's per-message costs scale with the chunk count.

    make record-scale-chunks
    python -m bench.record_scale_chunks [--chunks 24] [--chunk-steps N] [--out PATH]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


class CapturingLink:
    """The collector's Link with no head: chunks are kept, everything else is a no-op."""

    weight_version = 0

    def __init__(self) -> None:
        self.chunks: list = []

    def poll_head(self) -> None: ...
    def take_weights(self) -> None: return None
    def must_exit(self) -> bool: return False
    def head_silent(self) -> bool: return False
    def maybe_heartbeat(self) -> None: ...
    def send_episode(self, summary) -> bool: return True

    def send_chunk(self, chunk) -> bool:
        self.chunks.append(chunk)
        return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.record_scale_chunks", description=__doc__.splitlines()[0])
    p.add_argument("--chunks", type=int, default=24, help="chunks to record")
    p.add_argument("--chunk-steps", type=int, default=None, help="new transitions per chunk (default: the profile's)")
    p.add_argument("--out", default=None, help="default: bench/data/mario_1_1_chunks.npz")
    args = p.parse_args(argv)

    import torch

    from actors.collector import Collector
    from bench.recorded import RECORDED_CHUNKS, save_chunks
    from config_optimized import load_profile
    from shared.chunk import nstep_targets

    torch.manual_seed(0)
    steps = [f"collectors.chunk_steps={args.chunk_steps}"] if args.chunk_steps else []
    cfg = load_profile("cpu", ["collectors.envs_per_collector=1", *steps])
    link = CapturingLink()
    collector = Collector(cfg, 0, cfg.collectors.eps_base, link, seed=cfg.env.seed)
    try:
        while len(link.chunks) < args.chunks:
            collector.step()
    finally:
        collector.close()
    chunks = link.chunks[:args.chunks]
    r = cfg.replay
    counts = [len(nstep_targets(c.actions, c.rewards, c.flags, c.first_start, r.n_step, r.gamma).starts) for c in chunks]
    out = Path(args.out) if args.out else RECORDED_CHUNKS
    out.parent.mkdir(parents=True, exist_ok=True)
    save_chunks(out, chunks, counts, {"env_id": cfg.env.env_id, "frame_skip": str(cfg.env.frame_skip),
                                      "action_set": cfg.env.action_set, "epsilon": str(cfg.collectors.eps_base),
                                      "chunk_steps": str(cfg.collectors.chunk_steps), "n_step": str(r.n_step),
                                      "recorded_by": "bench/record_scale_chunks.py"})
    print(f"wrote {out}: {len(chunks)} chunks, {sum(counts)} transitions, "
          f"{sum(c.num_frames for c in chunks)} frames, {out.stat().st_size / 2**20:.2f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

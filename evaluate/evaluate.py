"""`python -m evaluate.evaluate RUN_OR_CHECKPOINT_DIR`: greedy episodes from a checkpoint, as evidence.

Why a separate player: training metrics mix 16 collectors with different epsilons; this plays
the learner's online network (epsilon 0 unless --epsilon) on an env built from the run's own
config with the collector's frame-stack convention (a reset pads the stack with the first
frame), so what it reports is what the checkpoint can do. Outputs, under --out (default
<run>/eval): eval.json (per-episode and summary numbers), best_episode.gif (+ .mp4 when
OpenCV can encode one) of the best episode by x_pos then return, and learning_curve.png from
<run>/metrics.jsonl with the random-policy baseline (docs/random_policy_*.json for the same
env, action set and frame skip, or --baseline) drawn as reference lines.

Mario's emulator is deterministic: with --epsilon 0 every episode is the same one; a small
epsilon (e.g. 0.01) shows how robust the policy is. Exit status 2: bad arguments or a
missing/corrupt/mismatched checkpoint (the message names the file).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from evaluate.video import GRAY_UPSCALE, FrameRecorder, to_rgb, write_gif, write_mp4

ROOT = Path(__file__).resolve().parent.parent
MAX_VIDEO_FRAMES = 400  # per episode; the stride doubles beyond this (memory stays ~75 MB for Mario RGB)

Policy = Callable[[np.ndarray], int]


@dataclass
class EpisodeResult:
    episode: int
    steps: int
    ret: float
    x_pos: int  # final info x_pos, as the collectors report it (0 for non-Mario envs)
    flag_get: bool
    world: int
    stage: int
    ended_by: str  # terminated / truncated (env time limit) / max_steps (--max-steps)


class FrameSource:
    """Picks how to picture a step: env.render() RGB when it works, else the upscaled observation."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.use_render = getattr(env, "render_mode", None) == "rgb_array"
        self.kind: str | None = None  # "rgb" / "observation" / None (nothing to show)

    def grab(self, obs: Any) -> np.ndarray | None:
        if self.use_render:
            try:
                frame = to_rgb(self.env.render())
            except Exception:  # noqa: BLE001 - e.g. CartPole without pygame: fall back, keep playing
                frame = None
            if frame is not None:
                self.kind = "rgb"
                return frame
            self.use_render = False
        frame = to_rgb(np.asarray(obs), upscale=GRAY_UPSCALE)
        self.kind = "observation" if frame is not None else None
        return frame


def play_episode(env: Any, policy: Policy, stack: int, episode: int, *, seed: int | None,
                 max_steps: int | None = None, frames: FrameRecorder | None = None,
                 source: FrameSource | None = None) -> EpisodeResult:
    """One episode with a rolling stack of the last `stack` observations (padded with the first)."""
    from envs.factory import episode_continues, episode_info

    obs, info = env.reset(seed=seed)
    first = np.asarray(obs)
    stacked = np.empty((stack, *first.shape), dtype=first.dtype)
    stacked[:] = first
    if frames is not None and source is not None and (pic := source.grab(obs)) is not None:
        frames.add(pic)
    total, steps, flag, ended_by = 0.0, 0, False, "max_steps"
    while max_steps is None or steps < max_steps:
        obs, reward, terminated, truncated, info = env.step(policy(stacked))
        total += float(info.get("raw_reward", reward))  # the game's score where the env clips (Atari)
        steps += 1
        flag = flag or bool(info.get("flag_get", False))
        stacked[:-1] = stacked[1:]
        stacked[-1] = obs
        if frames is not None and source is not None and (pic := source.grab(obs)) is not None:
            frames.add(pic)
        if terminated and episode_continues(info):  # a lost life (Atari): the game goes on, the stack restarts
            obs, info = env.reset()
            stacked[:] = np.asarray(obs)
            continue
        if terminated or truncated:
            ended_by = "terminated" if terminated else "truncated"
            break
    x_pos, _, world, stage = episode_info(info)
    return EpisodeResult(episode, steps, total, x_pos, flag, world, stage, ended_by)


def summarize(results: list[EpisodeResult]) -> dict[str, Any]:
    xs = np.array([r.x_pos for r in results], dtype=np.float64)
    rets = np.array([r.ret for r in results], dtype=np.float64)
    lens = np.array([r.steps for r in results], dtype=np.float64)
    return {
        "episodes": len(results),
        "mean_x_pos": float(xs.mean()), "std_x_pos": float(xs.std()), "max_x_pos": int(xs.max()),
        "flag_rate": float(np.mean([r.flag_get for r in results])),
        "mean_return": float(rets.mean()), "std_return": float(rets.std()), "max_return": float(rets.max()),
        "mean_length": float(lens.mean()), "max_length": int(lens.max()),
    }


def find_baseline(env_cfg: Any, docs: Path = ROOT / "docs") -> tuple[dict[str, Any], Path] | None:
    """A docs/random_policy_*.json recorded on the same env id, action set and frame skip."""
    for path in sorted(docs.glob("random_policy_*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and (data.get("env_id"), data.get("action_set"), data.get("frame_skip")) == (
                env_cfg.env_id, env_cfg.action_set, env_cfg.frame_skip):
            return data, path
    return None


# ---------------------------------------------------------------------- loading
class EvalError(Exception):
    """A user-facing failure (exit 2); the message names the file."""


def load_run(path: Path) -> tuple[Any, Any, Path]:
    """(checkpoint data, Config, run dir) of a run dir or its checkpoint/ dir; EvalError for anything missing,
    corrupt or inconsistent."""
    from learner.checkpoint import CheckpointError, load_checkpoint
    from shared.config import Config, ConfigError

    try:
        data = load_checkpoint(path)
    except CheckpointError as exc:
        raise EvalError(str(exc)) from exc
    ckpt_dir = data.path or path
    run_dir = ckpt_dir.parent
    config_path, text = ckpt_dir / "config.json", data.config_json
    if not text.strip() or text.strip() == "{}":
        config_path = run_dir / "config.json"
        text = config_path.read_text() if config_path.is_file() else ""
    if not text.strip():
        raise EvalError(f"{ckpt_dir / 'config.json'}: the checkpoint has no run config (nor has {config_path})")
    try:
        cfg = Config.from_dict(json.loads(text))
    except (ValueError, TypeError, ConfigError) as exc:
        raise EvalError(f"{config_path}: not a valid run config ({exc})") from exc
    return data, cfg, run_dir


def load_greedy(data: Any, env: Any) -> tuple[Policy, int, int]:
    """The checkpoint's online network as a greedy policy on `env`; (greedy, stack, num_actions).

    EvalError when the checkpoint's geometry does not match the env's spaces."""
    import torch

    from learner.checkpoint import CheckpointError, check_state_dict
    from shared.config import ENCODERS
    from shared.network import NOISY_SIGMA0, build_q_network

    g = data.geometry
    where = (data.path or Path(".")) / "model.pt"
    try:
        obs_shape = tuple(int(d) for d in g["obs_shape"])
        stack, num_actions = int(g["stack"]), int(g["num_actions"])
        hidden, dueling = int(g.get("hidden", 512)), bool(g.get("dueling", True))
        encoder, encoder_width = str(g.get("encoder", "nature")), int(g.get("encoder_width", 1))
        quantiles = int(g.get("quantiles", 0))
        noisy = g.get("noisy", False)
        if not isinstance(noisy, bool):
            raise ValueError(f"noisy {noisy!r} is not true or false")
        if encoder not in ENCODERS:
            raise ValueError(f"encoder {encoder!r} is not one of {', '.join(ENCODERS)}")
    except (KeyError, TypeError, ValueError) as exc:
        raise EvalError(f"{(data.path or Path('.')) / 'meta.json'}: bad geometry {g!r} ({exc})") from exc
    env_shape = tuple(int(d) for d in env.observation_space.shape)
    env_actions = int(getattr(env.action_space, "n", -1))
    if env_shape != obs_shape or env_actions != num_actions:
        raise EvalError(f"{where}: checkpoint geometry (obs {obs_shape}, {num_actions} actions) does not match the "
                        f"env built from its config (obs {env_shape}, {env_actions} actions)")
    torch.set_num_threads(1)
    # a NoisyNet checkpoint plays with its mean weights (sigma0 sets only the init, which the load replaces)
    net = build_q_network(obs_shape, stack, num_actions, hidden, dueling, encoder, encoder_width, quantiles,
                          NOISY_SIGMA0 if noisy else 0.0).eval().set_noise(False)
    try:
        check_state_dict(net.state_dict(), data.model["online"], f"{where}[online]")
    except CheckpointError as exc:
        raise EvalError(str(exc)) from exc
    net.load_state_dict(data.model["online"])

    def greedy(stacked: np.ndarray) -> int:
        with torch.inference_mode():
            return int(net(torch.from_numpy(stacked[None])).argmax(dim=1).item())

    return greedy, stack, num_actions


def epsilon_greedy(greedy: Policy, num_actions: int, epsilon: float, rng: np.random.Generator) -> Policy:
    """`greedy`, except with probability `epsilon` a uniform action; both draws come from `rng`."""

    def policy(stacked: np.ndarray) -> int:
        if epsilon > 0 and rng.random() < epsilon:
            return int(rng.integers(num_actions))
        return greedy(stacked)

    return policy


def build_policy(data: Any, env: Any, epsilon: float, rng: np.random.Generator) -> tuple[Policy, int]:
    """Online network from the checkpoint as an epsilon-greedy policy; (policy, stack)."""
    greedy, stack, num_actions = load_greedy(data, env)
    return epsilon_greedy(greedy, num_actions, epsilon, rng), stack


def make_eval_env(env_cfg: Any) -> Any:
    """The run's env, with RGB rendering when the env offers it (Mario does; asking others warns)."""
    from envs.factory import make_env
    from shared.config import is_mario

    if is_mario(str(env_cfg.env_id)):
        return make_env(env_cfg, render_mode="rgb_array")
    env = make_env(env_cfg)
    if "rgb_array" not in (getattr(env, "metadata", {}) or {}).get("render_modes", []):
        return env
    env.close()
    try:
        return make_env(env_cfg, render_mode="rgb_array")
    except Exception:  # noqa: BLE001 - its renderer is unavailable: the plain env
        return make_env(env_cfg)


_load, _build_policy = load_run, build_policy  # the names tests/test_shipped_checkpoint.py imports


# ---------------------------------------------------------------------- CLI
def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m evaluate", description=__doc__.split("\n")[0])
    p.add_argument("path", type=Path, help="run dir (runs/<run>) or its checkpoint/ dir")
    p.add_argument("--episodes", type=int, default=10, help="episodes to play (default 10)")
    p.add_argument("--epsilon", type=float, default=0.0, help="random-action probability (default 0: greedy)")
    p.add_argument("--out", type=Path, default=None, help="output dir (default <run>/eval)")
    p.add_argument("--max-steps", type=int, default=None, help="cap on agent steps per episode (default: env limit)")
    p.add_argument("--seed", type=int, default=0, help="seeds env resets and epsilon draws")
    p.add_argument("--baseline", type=Path, default=None,
                   help="random-policy JSON for the plot (default: a matching docs/random_policy_*.json)")
    p.add_argument("--no-video", action="store_true", help="skip the GIF/MP4")
    args = p.parse_args(argv)
    if args.episodes < 1:
        p.error(f"--episodes={args.episodes}: allowed an integer >= 1")
    if not (0.0 <= args.epsilon <= 1.0) or math.isnan(args.epsilon):
        p.error(f"--epsilon={args.epsilon}: allowed a number in [0, 1]")
    if args.max_steps is not None and args.max_steps < 1:
        p.error(f"--max-steps={args.max_steps}: allowed an integer >= 1")
    return args


def _fmt(r: EpisodeResult, n: int) -> str:
    return (f"episode {r.episode + 1:>3}/{n}: return {r.ret:9.1f}  x_pos {r.x_pos:5d}  "
            f"flag {'yes' if r.flag_get else 'no ':3}  steps {r.steps:5d}  ({r.ended_by})")


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    try:
        data, cfg, run_dir = load_run(args.path)
        env = make_eval_env(cfg.env)
        rng = np.random.default_rng(args.seed)
        policy, stack = build_policy(data, env, args.epsilon, rng)
    except EvalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = args.out if args.out is not None else run_dir / "eval"
    counters = dict(data.counters)
    from shared.config import is_mario

    mario = f" ({cfg.env.action_set}, skip {cfg.env.frame_skip})" if is_mario(cfg.env.env_id) else ""
    print(f"checkpoint {data.path}  env {cfg.env.env_id}{mario}  "
          f"env_steps {counters.get('env_steps', '?')}  updates {counters.get('updates', '?')}  "
          f"epsilon {args.epsilon}", flush=True)

    source = None if args.no_video else FrameSource(env)
    best: tuple[tuple[float, float], EpisodeResult, list[np.ndarray], int] | None = None
    results: list[EpisodeResult] = []
    t0 = time.perf_counter()
    try:
        for i in range(args.episodes):
            frames = None if source is None else FrameRecorder(MAX_VIDEO_FRAMES)
            r = play_episode(env, policy, stack, i, seed=args.seed + i, max_steps=args.max_steps,
                             frames=frames, source=source)
            results.append(r)
            print(_fmt(r, args.episodes), flush=True)
            key = (float(r.x_pos), r.ret)
            if best is None or key > best[0]:
                best = (key, r, frames.frames if frames else [], frames.stride if frames else 1)
    finally:
        env.close()
    elapsed = time.perf_counter() - t0
    summary = summarize(results)
    print(f"summary ({summary['episodes']} episodes, epsilon {args.epsilon}): "
          f"x_pos mean {summary['mean_x_pos']:.1f} max {summary['max_x_pos']} | "
          f"flag rate {summary['flag_rate']:.0%} | return mean {summary['mean_return']:.1f} "
          f"max {summary['max_return']:.1f} | length mean {summary['mean_length']:.1f} "
          f"max {summary['max_length']}  [{elapsed:.1f}s]")
    if args.epsilon == 0 and len(results) > 1 and len({(r.ret, r.steps, r.x_pos) for r in results}) == 1:
        print("note: all episodes identical (deterministic env, greedy policy); try --epsilon 0.01 for spread")

    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "checkpoint": str(data.path), "run_dir": str(run_dir), "counters": counters,
        "env": asdict(cfg.env), "epsilon": args.epsilon, "seed": args.seed, "max_steps": args.max_steps,
        "elapsed_s": elapsed, "summary": summary, "episodes": [asdict(r) for r in results],
        "best_episode": None, "video": {}, "learning_curve": None, "baseline": None,
    }
    _, best_r, best_frames, stride = best if best is not None else (None, results[0], [], 1)
    report["best_episode"] = best_r.episode
    if best_frames and len(best_frames) > 1:
        # real-time pace for short episodes; a subsampled long one plays as a stride-x time-lapse
        fps = float(getattr(env, "metadata", {}).get("render_fps") or 15.0)
        gif = write_gif(best_frames, out / "best_episode.gif", fps)
        mp4 = write_mp4(best_frames, out / "best_episode.mp4", fps)
        report["video"] = {"gif": str(gif), "mp4": str(mp4) if mp4 else None, "frames": len(best_frames),
                           "stride": stride, "source": source.kind if source else None}
        pace = "real time" if stride == 1 else f"{stride}x speed"
        print(f"video: {gif} ({len(best_frames)} frames, every {stride} step(s), {pace}, "
              f"{source.kind if source else ''})"
              + (f" + {mp4}" if mp4 else ""))
    elif not args.no_video:
        print("video: skipped (the env has no picture: no rgb_array render and non-image observations)")

    baseline = _baseline(args.baseline, cfg.env)
    if baseline is not None:
        report["baseline"] = {"path": str(baseline[1]), "mean_x_pos": baseline[0].get("mean_x_pos"),
                              "mean_return": baseline[0].get("mean_return")}
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        from evaluate.plots import plot_learning_curve

        try:
            png = plot_learning_curve(metrics, out / "learning_curve.png", baseline[0] if baseline else None,
                                      title=f"{run_dir.name}: {cfg.env.env_id}",
                                      eval_point=_eval_point(counters, summary))
            report["learning_curve"] = str(png)
            print(f"learning curve: {png}" + (f" (random baseline {baseline[1]})" if baseline else ""))
        except ValueError as exc:
            print(f"learning curve: skipped ({exc})")
    else:
        print(f"learning curve: skipped ({metrics} not found)")
    (out / "eval.json").write_text(json.dumps(report, indent=2, sort_keys=True))
    print(f"summary: {out / 'eval.json'}")
    return 0


def _eval_point(counters: dict[str, Any], summary: dict[str, Any]) -> dict[str, float] | None:
    steps = counters.get("env_steps")
    if not isinstance(steps, (int, float)):
        return None
    return {"env_steps": float(steps), "mean_x_pos": summary["mean_x_pos"], "mean_return": summary["mean_return"]}


def _baseline(path: Path | None, env_cfg: Any) -> tuple[dict[str, Any], Path] | None:
    if path is None:
        return find_baseline(env_cfg)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"baseline: ignored ({path}: {exc})")
        return None
    return (data, path) if isinstance(data, dict) else None


if __name__ == "__main__":
    sys.exit(main())

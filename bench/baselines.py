"""The reference points every pipeline figure is divided by.

1. The emulator ceiling: raw gym-super-mario-bros env steps per second (unwrapped, frame_skip
   repeats per agent step, random actions), no learning, no transport, no stacking, one process
   per collector slot. `pipeline_sps / emulator_ceiling_sps` is the headline efficiency.
   Two caveats the numbers showed: the project's own env (envs.factory) fuses the frame
   skip and skips the package's per-frame Python work, so it can beat this "ceiling"; it is
   measured too (project_env_sps). And step cost depends on the policy (random actions die
   more often, and deaths/resets cost frames), so compare figures with the same policy.
2. The naive pipeline the seed design started from: collectors put one pickled transition at a
   time on a `multiprocessing.Queue`; the main process moves them into a lock-guarded deque and
   trains on `random.sample` + `np.stack` batches. Run with and without training to separate
   the transport/drain cost from the learner's share of the cores.

Workers are started with `spawn` (as the real collectors are) and wait for a command after
building their envs, so process start-up and imports are never inside a timed window.
"""

from __future__ import annotations

import copy
import queue
import random
import threading
import time
from collections import deque
from dataclasses import asdict
from typing import Any

import numpy as np

from bench.workers import STARTUP_TIMEOUT_S, WorkerGroup
from envs.mario.backend import resolve_backend
from envs.spec import EnvSpec
from shared.config import Config, EnvConfig, LearnerConfig, ReplayConfig, is_atari, is_mario

# ---------------------------------------------------------------------- env helpers

def mario_action_masks(action_set: str) -> list[int]:
    """NES controller bitmasks of the configured action set (what JoypadSpace would send)."""
    from envs.mario.actions import action_buttons

    return list(action_buttons(action_set))


def make_raw_env(env_id: str, backend: str = "nes-py") -> Any:
    """The package env with every wrapper stripped: the fastest the emulator can be driven.

    Mario on env.backend=retro: the FCEUmm core driven the same way (joypad byte, one frame, the screen) with
    none of the project's per-frame logic (envs/mario/retro.py RawRetroMario).

    Non-Mario ids (the counting env in tests) go through Gymnasium's registry, unwrapped too;
    ALE ids at one emulator frame per step (their registered frameskip 4 would multiply with ours).
    """
    if is_mario(env_id) and resolve_backend(backend) == "retro":
        from envs.factory import parse_mario_id
        from envs.mario.retro import RawRetroMario
        from envs.mario.stages import stage_env_ids

        return RawRetroMario(*parse_mario_id(stage_env_ids(env_id)[0]))
    if is_mario(env_id):
        import warnings

        from envs.mario.emulator import import_mario_package

        gym_super_mario_bros = import_mario_package()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "SuperMarioBros-1-1-v0 is out of date": v0 is the naive design's env
            return gym_super_mario_bros.make(env_id).unwrapped
    if is_atari(env_id):
        from envs.atari import make_raw_ale

        return make_raw_ale(env_id)
    import gymnasium

    import envs.testing  # noqa: F401 - registers ApeXCounting-v0

    return gymnasium.make(env_id).unwrapped


def make_project_env(env_config: EnvConfig) -> tuple[Any, EnvSpec]:
    """(env, its EnvSpec) from the project's env factory, as collectors build it (the spec read from that env)."""
    from envs.factory import env_spec, make_env

    env = make_env(env_config)
    return env, env_spec(env_config, env)


# ---------------------------------------------------------------------- emulator ceiling
def _ceiling_worker(
    index: int, env_dict: dict[str, Any], num_envs: int,
    cmd_q: Any, ready_q: Any, result_q: Any, stop_evt: Any,
) -> None:
    """Per command (kind, seconds): step K envs round-robin with random actions; report agent steps.

    kind "raw": the package env, unwrapped, driven frame_skip times per agent step (the ceiling).
    kind "project": the env factory's env (what collectors step), built on first use.
    """
    try:
        env_config = EnvConfig(**env_dict)
        env_id, frame_skip = env_config.env_id, env_config.frame_skip
        rng = random.Random(1000 + index)
        raw = [make_raw_env(env_id, env_config.backend) for _ in range(num_envs)]
        for env in raw:
            env.reset()
        actions = mario_action_masks(env_config.action_set) if is_mario(env_id) else list(range(int(raw[0].action_space.n)))
        project: list[Any] = []
        ready_q.put(index)
        while (command := cmd_q.get()) is not None:
            kind, seconds = command
            if kind == "project" and not project:
                project = [make_project_env(env_config)[0] for _ in range(num_envs)]
                for i, env in enumerate(project):
                    env.reset(seed=env_config.seed + 1000 * index + i)
            steps, t0 = 0, time.perf_counter()
            end = t0 + float(seconds)
            while time.perf_counter() < end:
                if kind == "raw":
                    for env in raw:
                        action = rng.choice(actions)
                        done = False
                        for _ in range(frame_skip):  # the action repeat the project's env applies
                            out = env.step(action)
                            done = bool(out[2]) if len(out) == 4 else bool(out[2] or out[3])  # old gym / Gymnasium
                            if done:
                                break
                        if done:
                            env.reset()
                        steps += 1
                else:
                    for env in project:
                        _, _, terminated, truncated, _ = env.step(rng.randrange(env.action_space.n))
                        if terminated or truncated:
                            env.reset()
                        steps += 1
            result_q.put({"index": index, "steps": steps, "elapsed_s": time.perf_counter() - t0})
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
        result_q.put({"error": f"{type(exc).__name__}: {exc}"})


class EmulatorCeiling:
    """A group of ceiling workers built once, measured many times (interleaved with other designs).

    Idle workers block on their command queue (no CPU), so the group can stay up while the
    pipeline runs between its measurements. Each measurement also reads the CPU seconds of this
    process tree (bench/cpu_time.py) around the window: the ceiling's CPU per step.
    """

    def __init__(self, env_config: EnvConfig, width: int, envs_per_collector: int) -> None:
        self.env_config, self.envs_per_collector = env_config, envs_per_collector
        args = [(i, asdict(env_config), envs_per_collector) for i in range(width)]
        self.group = WorkerGroup(_ceiling_worker, args)
        self._project_built = 0  # workers that have built their project envs (built on first use)

    def __enter__(self) -> EmulatorCeiling:
        self.group.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.group.close()

    def measure(self, kind: str, n: int, seconds: float) -> dict[str, Any]:
        """Sum over the first n workers of agent steps/s ("raw" package env or "project" env)."""
        from bench import cpu_time

        if kind == "project" and n > self._project_built:  # build them outside the timed and CPU-counted window
            self.group.send(list(range(n)), (kind, 0.0))
            self.group.results(n)
            self._project_built = n
        cpu0 = cpu_time.tree_cpu()
        self.group.send(list(range(n)), (kind, seconds))
        results = sorted(self.group.results(n), key=lambda r: r["index"])
        cpu_s = cpu_time.cpu_between(cpu0, cpu_time.tree_cpu())
        per = [r["steps"] / r["elapsed_s"] for r in results]
        steps = int(sum(r["steps"] for r in results))
        return {
            "sps": float(sum(per)), "per_collector_sps": per, "frames_per_s": float(sum(per)) * self.env_config.frame_skip,
            "steps": steps, "collectors": n, "env": kind, "envs_per_collector": self.envs_per_collector,
            "seconds": seconds, "startup_s": self.group.startup_s, "cpu_s": cpu_s,
            "cpu_s_per_1k_steps": cpu_time.per_1k(cpu_s, steps),
        }


def run_emulator_ceiling(
    env_config: EnvConfig, counts: list[int], envs_per_collector: int, seconds: float,
    project_counts: list[int] | tuple[int, ...] = (),
) -> dict[str, dict[int, dict[str, Any]]]:
    """{"raw": {n: ...}, "project": {n: ...}}: sum over n parallel processes of agent steps/s.

    One group of max(counts) processes is built once; for each n the first n run while the rest
    wait idle on their command queue (blocked, no CPU). "project" counts step the env factory's
    env instead, which skips the package's per-frame Python work and can beat the raw ceiling.
    """
    out: dict[str, dict[int, dict[str, Any]]] = {"raw": {}, "project": {}}
    with EmulatorCeiling(env_config, max([*counts, *project_counts]), envs_per_collector) as ceiling:
        for kind, kind_counts in (("raw", counts), ("project", project_counts)):
            for n in kind_counts:
                out[kind][n] = ceiling.measure(kind, n, seconds)
    return out


# ---------------------------------------------------------------------- naive pipeline
def _naive_collector(
    index: int, env_dict: dict[str, Any], num_envs: int, hidden: int, dueling: bool, epsilon: float, data_q: Any,
    cmd_q: Any, ready_q: Any, result_q: Any, stop_evt: Any,
) -> None:
    """The naive design's collector: batched eps-greedy over K envs, one pickled transition per queue put."""
    try:
        import torch

        from shared.network import build_q_network

        torch.set_num_threads(1)
        env_config = EnvConfig(**env_dict)
        built = [make_project_env(env_config) for _ in range(num_envs)]
        envs = [b[0] for b in built]
        spec = built[0][1]
        stack, num_actions = spec.stack, spec.num_actions
        net = build_q_network(spec.obs_shape, stack, num_actions, hidden, dueling).eval()
        rng = np.random.default_rng(env_config.seed + index)
        frames: list[deque[np.ndarray]] = []
        for i, env in enumerate(envs):
            obs, _ = env.reset(seed=env_config.seed + 1000 * index + i)
            frames.append(deque([np.asarray(obs)] * stack, maxlen=stack))
        ready_q.put(index)
        if cmd_q.get() is None:
            return
        sent = 0
        while not stop_evt.is_set():
            states = [np.stack(f) for f in frames]
            with torch.no_grad():
                greedy = net(torch.from_numpy(np.stack(states))).argmax(dim=1).numpy()
            for i, env in enumerate(envs):
                action = int(rng.integers(num_actions)) if rng.random() < epsilon else int(greedy[i])
                obs, reward, terminated, truncated, _ = env.step(action)
                frames[i].append(np.asarray(obs))
                data_q.put((states[i], action, float(reward), np.stack(frames[i]), bool(terminated)))
                sent += 1
                if terminated or truncated:
                    obs, _ = env.reset()
                    frames[i] = deque([np.asarray(obs)] * stack, maxlen=stack)
        result_q.put({"index": index, "sent": sent})
    except Exception as exc:  # noqa: BLE001
        result_q.put({"error": f"{type(exc).__name__}: {exc}"})


class NaiveLearner:
    """The same update the real learner runs: Nature CNN, dueling, double DQN, Huber, Adam, clip."""

    def __init__(self, lc: LearnerConfig, rc: ReplayConfig, spec: EnvSpec) -> None:
        import torch

        from shared.network import build_q_network

        device = lc.device if lc.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        self.device = torch.device(device)
        self.net = build_q_network(spec.obs_shape, spec.stack, spec.num_actions, lc.hidden, lc.dueling).to(self.device)
        self.target = copy.deepcopy(self.net).eval()
        self.opt = torch.optim.Adam(self.net.parameters(), lr=lc.lr, eps=lc.adam_eps)
        try:  # the precision our learner would run, so the comparison is of pipelines, not dtypes
            from learner.precision import resolve_precision

            policy = resolve_precision(lc.precision, self.device)
            precision, self.amp_dtype, use_scaler = policy.name, policy.autocast_dtype, policy.use_scaler
        except ImportError:
            precision = lc.precision if lc.precision != "auto" else ("fp32" if device == "cpu" else "fp16")
            self.amp_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
            use_scaler = precision == "fp16"
        self.precision = precision
        self.scaler = torch.amp.GradScaler(device) if use_scaler else None
        self.gamma, self.double_q, self.clip = rc.gamma, lc.double_q, lc.max_grad_norm
        self.target_every, self.updates = lc.target_update_every, 0

    def update(self, batch: list[tuple[Any, ...]]) -> float:
        import torch
        import torch.nn.functional as F

        s, a, r, s2, d = (np.stack(col) for col in zip(*batch, strict=True))  # the naive design's np.stack batching
        dev = self.device
        s_t, s2_t = torch.from_numpy(s).to(dev), torch.from_numpy(s2).to(dev)
        a_t = torch.from_numpy(a.astype(np.int64)).to(dev)
        r_t = torch.from_numpy(r.astype(np.float32)).to(dev)
        d_t = torch.from_numpy(d.astype(np.float32)).to(dev)
        with torch.autocast(dev.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
            q = self.net(s_t).gather(1, a_t[:, None]).squeeze(1)
            with torch.no_grad():
                q_next_target = self.target(s2_t)
                a2 = (self.net(s2_t) if self.double_q else q_next_target).argmax(dim=1, keepdim=True)
                y = r_t + self.gamma * (1.0 - d_t) * q_next_target.gather(1, a2).squeeze(1).float()
        loss = F.smooth_l1_loss(q.float(), y)
        self.opt.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.opt)
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.clip)
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.clip)
            self.opt.step()
        self.updates += 1
        if self.updates % self.target_every == 0:
            self.target.load_state_dict(self.net.state_dict())
        return float(loss.detach())


def run_naive_pipeline(
    cfg: Config, seconds: float, phases: tuple[str, ...] = ("drain", "train"), warmup: int = 1000
) -> dict[str, dict[str, Any]]:
    """Transitions consumed per second by the seed design, per phase ("drain" and/or "train").

    Both phases share one collector group: drain first (the learner idles, so this is the
    transport + deque ceiling), then train, whose warmup the drain phase has already filled.
    """
    import torch

    from envs.factory import env_spec

    torch.set_num_threads(max(1, cfg.learner.torch_threads))  # 0 (auto) is the real learner's rule: the naive one keeps 1
    c = cfg.collectors
    spec = env_spec(cfg.env)
    import multiprocessing as mp

    data_q = mp.get_context("spawn").Queue()  # unbounded, as in the seed
    replay: deque[tuple[Any, ...]] = deque(maxlen=cfg.replay.capacity)
    lock = threading.Lock()
    consumed = [0]
    stop_drain = threading.Event()

    def timed(learner: NaiveLearner | None) -> dict[str, Any]:
        from bench import cpu_time

        cpu0 = cpu_time.tree_cpu()
        t0, c0, updates = time.perf_counter(), consumed[0], 0
        while time.perf_counter() - t0 < seconds:
            if learner is None:
                time.sleep(0.01)
                continue
            with lock:
                batch = random.sample(replay, cfg.learner.batch_size)
            learner.update(batch)  # np.stack + forward/backward outside the lock, as in the seed
            updates += 1
        elapsed, got = time.perf_counter() - t0, consumed[0] - c0
        cpu_s = cpu_time.cpu_between(cpu0, cpu_time.tree_cpu())
        return {
            "cpu_s": cpu_s, "cpu_s_per_1k_steps": cpu_time.per_1k(cpu_s, got),
            "sps": got / elapsed, "consumed": got, "elapsed_s": elapsed, "updates": updates,
            "updates_per_s": updates / elapsed, "replay_len": len(replay),
            "device": str(learner.device) if learner else None, "precision": learner.precision if learner else None,
        }

    eps = [c.eps_base ** (1 + c.eps_alpha * i / max(1, c.count - 1)) for i in range(c.count)]
    args = [(i, asdict(cfg.env), c.envs_per_collector, cfg.learner.hidden, cfg.learner.dueling, eps[i], data_q)
            for i in range(c.count)]
    common: dict[str, Any] = {"collectors": c.count, "envs_per_collector": c.envs_per_collector,
                              "policy": "local net copy, eps-greedy, no weight sync", "transport": "mp.Queue, 1 transition/put",
                              "batch_size": cfg.learner.batch_size}
    out: dict[str, dict[str, Any]] = {}
    learner = NaiveLearner(cfg.learner, cfg.replay, spec) if "train" in phases else None
    drainer = threading.Thread(target=naive_drain, args=(data_q, replay, lock, consumed, stop_drain),
                               name="naive-drain", daemon=True)
    with WorkerGroup(_naive_collector, args, data_queue=data_q) as group:
        common["startup_s"] = group.startup_s
        drainer.start()
        group.send(list(range(c.count)), "go")
        try:
            for phase in phases:
                if phase == "train":
                    need = max(warmup, cfg.learner.batch_size)
                    fill_deadline = time.monotonic() + STARTUP_TIMEOUT_S
                    while len(replay) < need:  # untimed: the naive design's warmup
                        if time.monotonic() > fill_deadline:
                            raise TimeoutError(f"naive replay reached {len(replay)} of {need} warmup transitions")
                        time.sleep(0.01)
                    for _ in range(2):  # untimed: first-call kernel selection and allocator growth
                        with lock:
                            batch = random.sample(replay, cfg.learner.batch_size)
                        learner.update(batch)
                    out[phase] = {**timed(learner), "warmup": need, **common}
                else:
                    out[phase] = {**timed(None), **common}
        finally:
            stop_drain.set()
            drainer.join(timeout=5.0)
    return out


def naive_drain(data_q: Any, replay: deque[tuple[Any, ...]], lock: threading.Lock, consumed: list[int],
                stop: threading.Event) -> None:
    """The naive design's drain thread: one pickled transition at a time off the mp.Queue into the
    locked deque (`consumed[0]` counts them), until `stop`."""
    while not stop.is_set():
        try:
            item = data_q.get(timeout=0.05)
        except queue.Empty:
            continue
        with lock:
            replay.append(item)
            consumed[0] += 1

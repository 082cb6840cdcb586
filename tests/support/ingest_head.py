"""The head's side of the wire for ingest tests: a consolidation thread and registrar over real sockets, with
sinks that record or refuse what it writes, small configs, and real chunks cut from the counting env."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace

import gymnasium as gym
import numpy as np
import torch
import zmq

import envs.testing  # noqa: F401
from actors.client import register
from actors.stream import StreamRecorder
from envs import bounds as env_bounds
from ingest.consolidation import ConsolidationThread
from ingest.registration import Registrar
from replay.buffer import ReplayBuffer
from shared import protocol as P
from shared.chunk import TransitionChunk
from shared.config import CollectorConfig, Config, ReplayConfig, TransportConfig

SPEC = P.ObsSpec((84, 84), np.dtype(np.uint8), 4, max_streams=4)
TEMPLATE = {"w": torch.zeros(4)}  # a HeadLink's network layout; these tests publish no weights


class Gate:
    """The insert side of a rate limiter, as a test controls it."""

    def __init__(self, may_insert: Callable[[], bool]) -> None:
        self._may_insert = may_insert

    def may_insert(self, pending: int = 0) -> bool:
        return self._may_insert()


class RecordingSink:
    """Stands in for the replay: records chunks, or refuses them like add_chunk's ValueError."""

    def __init__(self, refuse: bool = False) -> None:
        self.chunks: list[TransitionChunk] = []
        self.refuse = refuse

    def add_chunk(self, chunk: TransitionChunk) -> int:
        if self.refuse:
            raise ValueError("inconsistent chunk")
        self.chunks.append(chunk)
        return 1

    def add_chunks(self, chunks: list[TransitionChunk]) -> list[int | ValueError]:
        out: list[int | ValueError] = []
        for chunk in chunks:
            try:
                out.append(self.add_chunk(chunk))
            except ValueError as exc:
                out.append(exc)
        return out

    def __len__(self) -> int:
        return len(self.chunks)

    def check_valid(self) -> None:
        pass


def small_config(**transport) -> Config:
    cfg = Config()
    return replace(cfg, collectors=CollectorConfig(count=2, envs_per_collector=2, chunk_steps=8),
                   replay=ReplayConfig(capacity=4096), transport=TransportConfig(**transport))


def make_replay():
    return ReplayBuffer(4096, (84, 84), np.uint8, 4, 3, 0.99)


def counting_chunks(count: int, stream: int = 0) -> list[TransitionChunk]:
    """Real chunks cut by the collector's StreamRecorder from the counting env."""
    return counting_stream(count, stream)[0]


def counting_stream(count: int, stream: int = 0, episode_length: int = 37) -> tuple[list[TransitionChunk],
                                                                                   list[P.EpisodeSummary]]:
    """`count` chunks as counting_chunks cuts them, and the EPISODE_SUMMARY of each episode that ended meanwhile
    (what the reference collector sends: length and the sum of the rewards, reward_scale 1)."""
    env = gym.make("ApeXCounting-v0", disable_env_checker=True, episode_length=episode_length)
    rec = StreamRecorder(stream, 4, 3, 0.99, 8, 4)
    obs, _ = env.reset(seed=stream)
    rec.begin_episode(obs)
    rng = np.random.default_rng(0)
    out, summaries, length, ret = [], [], 0, 0.0
    while len(out) < count:
        rec.set_q(rng.random(4).astype(np.float32))
        if rec.ready():
            out.append(rec.build_chunk())
        a = int(rng.integers(4))
        obs, r, te, tr, _ = env.step(a)
        rec.record_step(a, r, obs, te, tr)
        length, ret = length + 1, ret + r
        if te or tr:
            summaries.append(P.EpisodeSummary(stream, length, ret, 100, False, 1, 1))
            length, ret = 0, 0.0
            obs, _ = env.reset()
            rec.begin_episode(obs)
    return out, summaries


def make_registrar(ctx: zmq.Context, config: Config, control_endpoint: str, spec: P.ObsSpec = SPEC,
                   weights_endpoints: dict[str, str] | None = None) -> Registrar:
    """A Registrar built from `config`'s sections, as the launcher builds one."""
    return Registrar(spec, {} if weights_endpoints is None else weights_endpoints, ctx, transport=config.transport,
                     collectors=config.collectors, replay=config.replay, welcome_config=config.to_dict(),
                     control_endpoint=control_endpoint)


class Head:
    """A running consolidation thread plus a registered raw data socket to poke it with."""

    def __init__(self, replay, config: Config | None = None, version: Callable[[], int] = lambda: 5,
                 curve=None, raw_socket: bool = True, may_insert: Callable[[], bool] = lambda: True,
                 slot: int = 0) -> None:
        self.ctx = zmq.Context()
        self.config = config or small_config()
        c = self.config
        spec = replace(SPEC, max_abs_reward=env_bounds.max_abs_reward(c.env),  # the head's, as ObsSpec.of gives it
                       max_episode_steps=c.env.max_episode_steps)
        registrar = make_registrar(self.ctx, c, "tcp://127.0.0.1:0", spec, {"local": "inproc://w", "remote": "inproc://w"})
        self.thread = ConsolidationThread(replay, spec, registrar, transport=c.transport,
                                          collectors=c.collectors, episode_window=c.logging.episode_window,
                                          latest_weight_version=version, gate=Gate(may_insert))
        self.thread.start()
        self.replay = replay
        self.welcome = register(self.ctx, self.thread.control_endpoint, slot=slot, curve=curve, timeout_s=10)
        self.cid = self.welcome.collector_id
        self.welcome_pid = os.getpid()
        self.push = self.ctx.socket(zmq.DEALER)  # the head binds a ROUTER per collector
        self.push.linger = 0
        self.push.setsockopt(zmq.ROUTING_ID, self.welcome.data_token)  # the owner's proof (from WELCOME)
        if curve is not None:
            curve.apply(self.push)
        if raw_socket:  # off when a real HeadLink takes the endpoint (a second peer would get half the CREDITs)
            self.push.connect(self.welcome.data_endpoint)
        self.seq = 0

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def send(self, parts) -> None:
        P.send_parts(self.push, parts)

    def wait_handled(self, before: int, n: int = 1, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while self.handled() < before + n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"head handled {self.handled() - before} of {n} messages")
            time.sleep(0.002)

    def handled(self) -> int:
        s = self.thread.stats()
        return s.chunks + s.rejected + s.heartbeats + s.episodes

    def close(self) -> None:
        self.push.close(0)
        self.thread.stop()
        self.ctx.term()

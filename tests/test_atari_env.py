"""Atari preprocessing (envs/atari.py) on a scripted emulator, the real ALE, the image path for any
RGB env, and the collector's handling of a lost life (terminal for learning, one episode per game). No torch
outside the collector test."""

from __future__ import annotations

from dataclasses import replace

import cv2
import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from envs.atari import EPISODE_CONTINUES, FIRE, NOOP, AtariEnv, make_raw_ale
from envs.factory import describe_env, env_spec, episode_continues, make_env
from envs.spec import EnvSpec
from shared.config import CollectorConfig, Config, EnvConfig, LearnerConfig, ReplayConfig

pytestmark = pytest.mark.envonly  # torch only in the collector test, which skips without it

H, W = 24, 20  # the fake screen
MEANINGS_FIRE = ("NOOP", "FIRE", "UP", "DOWN")
MEANINGS_NO_FIRE = ("NOOP", "UP", "DOWN")


class FakeEmulator:
    """A scripted game: frame f's screen encodes f (even frames light the left half, odd the right, as
    flickering sprites do), a life is lost every `life_frames` frames, `reward_every`-th frames pay `reward`."""

    def __init__(self, meanings=MEANINGS_FIRE, lives=3, life_frames=40, reward_every=7, reward=5.0) -> None:
        self.action_meanings = tuple(meanings)
        self.screen_shape = (H, W)
        self.start_lives, self.life_frames = lives, life_frames
        self.reward_every, self.reward = reward_every, reward
        self.frame = 0
        self.log: list[tuple[str, int | None]] = []  # ("reset", seed) and ("act", action) in order

    def reset(self, seed):
        self.frame = 0
        self.log.append(("reset", seed))

    def act(self, action):
        assert not self.game_over()
        self.frame += 1
        self.log.append(("act", action))
        return self.reward if self.frame % self.reward_every == 0 else 0.0

    def lives(self):
        return max(0, self.start_lives - self.frame // self.life_frames)

    def game_over(self):
        return self.lives() == 0

    def truncated(self):
        return False

    @staticmethod
    def screen(f: int) -> np.ndarray:
        out = np.zeros((H, W), np.uint8)
        half = slice(0, W // 2) if f % 2 == 0 else slice(W // 2, W)
        out[:, half] = 10 + f % 200
        return out

    def gray_into(self, out):
        out[:] = self.screen(self.frame)

    def rgb(self):
        return np.repeat(self.screen(self.frame)[:, :, None], 3, axis=2)

    def close(self):
        pass

    def acts_since_last_reset(self) -> list[int]:
        last = max(i for i, (kind, _) in enumerate(self.log) if kind == "reset")
        return [a for kind, a in self.log[last + 1:] if kind == "act"]


def _env(emu: FakeEmulator, **kwargs) -> AtariEnv:
    kwargs = {"frame_skip": 4, "frame_size": 12, "noop_max": 0, **kwargs}
    return AtariEnv(emu, **kwargs)


def _expected_obs(frame: int, size: int = 12) -> np.ndarray:
    pooled = np.maximum(FakeEmulator.screen(frame - 1), FakeEmulator.screen(frame))
    return cv2.resize(pooled, (size, size), interpolation=cv2.INTER_AREA)


# ---------------------------------------------------------------------- scripted emulator
def test_frame_skip_max_pools_the_last_two_frames_and_sums_rewards() -> None:
    emu = FakeEmulator(MEANINGS_NO_FIRE, reward_every=3, reward=2.0)
    env = _env(emu)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (12, 12) and obs.dtype == np.uint8
    obs, reward, terminated, truncated, info = env.step(2)
    assert emu.frame == 4 and emu.acts_since_last_reset() == [2, 2, 2, 2]
    assert reward == 2.0 and info["raw_reward"] == 2.0  # frame 3 pays, frames 1, 2, 4 do not
    assert not terminated and not truncated
    # the max of frames 3 and 4 lights both halves; either frame alone lights one
    np.testing.assert_array_equal(obs, _expected_obs(4))
    single = cv2.resize(FakeEmulator.screen(4), (12, 12), interpolation=cv2.INTER_AREA)
    assert (obs > single).any()
    assert env.observation_space.contains(obs)


def test_rewards_are_clipped_when_asked_and_the_raw_score_is_kept() -> None:
    for clip, expected in ((True, 1.0), (False, 5.0)):
        env = _env(FakeEmulator(MEANINGS_NO_FIRE, reward_every=4, reward=5.0), clip_rewards=clip)
        env.reset(seed=0)
        _, reward, _, _, info = env.step(0)
        assert reward == expected and info["raw_reward"] == 5.0
    env = _env(FakeEmulator(MEANINGS_NO_FIRE, reward_every=4, reward=-3.0), clip_rewards=True)
    env.reset(seed=0)
    assert env.step(0)[1] == -1.0


def test_life_loss_is_terminal_for_learning_and_the_game_goes_on() -> None:
    emu = FakeEmulator(MEANINGS_NO_FIRE, lives=3, life_frames=40)
    env = _env(emu)
    env.reset(seed=1)
    ends = []
    for _ in range(200):
        _, _, terminated, truncated, info = env.step(1)
        if terminated or truncated:
            ends.append((emu.frame, terminated, info[EPISODE_CONTINUES], info["lives"]))
            if not info[EPISODE_CONTINUES]:
                break
            resets = sum(kind == "reset" for kind, _ in emu.log)
            _, reset_info = env.reset()
            assert reset_info["continued"]
            assert sum(kind == "reset" for kind, _ in emu.log) == resets  # the emulator was not reset
            assert emu.acts_since_last_reset()[-4:] == [NOOP] * 4  # one NOOP agent step after the lost life
    # lives 3 -> 2 at frame 40, 2 -> 1 at 80, game over at 120: two lost lives, then the game's end
    assert ends == [(40, True, True, 2), (80, True, True, 1), (120, True, False, 0)]
    # a full reset afterwards (the game is over) restarts the emulator
    _, reset_info = env.reset()
    assert not reset_info["continued"] and emu.log[-1] == ("reset", None)


def test_life_loss_not_terminal_when_off() -> None:
    emu = FakeEmulator(MEANINGS_NO_FIRE, lives=3, life_frames=40)
    env = _env(emu, life_loss_terminal=False)
    env.reset(seed=1)
    steps = 0
    while True:
        _, _, terminated, truncated, info = env.step(1)
        steps += 1
        if terminated or truncated:
            break
    assert steps == 30 and emu.frame == 120 and terminated and not info[EPISODE_CONTINUES]


def test_a_seeded_reset_starts_a_new_game_even_after_a_lost_life() -> None:
    emu = FakeEmulator(MEANINGS_NO_FIRE, lives=3, life_frames=8)
    env = _env(emu)
    env.reset(seed=1)
    while not env.step(0)[2]:  # until the first lost life
        pass
    _, reset_info = env.reset(seed=2)
    assert not reset_info["continued"] and emu.log[-1] == ("reset", 2)


def test_fire_on_reset_only_where_the_game_has_fire() -> None:
    emu = FakeEmulator(MEANINGS_FIRE, lives=3, life_frames=40)
    env = _env(emu)
    assert env.needs_fire
    env.reset(seed=0)
    assert emu.acts_since_last_reset() == [FIRE] * 4 + [2] * 4  # FIRE, then action 2, one agent step each
    while not env.step(3)[2]:  # play until the first lost life
        pass
    mark = len(emu.log)
    env.reset()
    assert [a for _, a in emu.log[mark:]] == [NOOP] * 4 + [FIRE] * 4 + [2] * 4

    emu = FakeEmulator(MEANINGS_NO_FIRE)
    env = _env(emu)
    assert not env.needs_fire
    env.reset(seed=0)
    assert emu.acts_since_last_reset() == []


def test_noop_starts_are_random_single_frames_up_to_noop_max() -> None:
    counts = []
    for seed in range(40):
        emu = FakeEmulator(MEANINGS_NO_FIRE)
        env = _env(emu, noop_max=30)
        env.reset(seed=seed)
        acts = emu.acts_since_last_reset()
        assert set(acts) <= {NOOP}
        counts.append(len(acts))
    assert min(counts) >= 1 and max(counts) <= 30 and len(set(counts)) > 10
    again = FakeEmulator(MEANINGS_NO_FIRE)
    _env(again, noop_max=30).reset(seed=7)
    assert len(again.acts_since_last_reset()) == counts[7]  # the seed decides
    none = FakeEmulator(MEANINGS_NO_FIRE)
    _env(none, noop_max=0).reset(seed=3)
    assert none.acts_since_last_reset() == []


def test_time_limit_counts_agent_steps_of_the_whole_game() -> None:
    emu = FakeEmulator(MEANINGS_NO_FIRE, lives=5, life_frames=20)  # a life lost at agent step 5, not at 7
    env = _env(emu, max_episode_steps=7)
    env.reset(seed=0)
    steps = 0
    while True:
        _, _, terminated, truncated, info = env.step(0)
        steps += 1
        if terminated or truncated:
            if info[EPISODE_CONTINUES]:
                env.reset()
                continue
            break
    assert steps == 7 and truncated and not terminated and not info[EPISODE_CONTINUES]


def test_bad_actions_and_misuse_are_clear_errors() -> None:
    env = _env(FakeEmulator(MEANINGS_NO_FIRE))
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(0)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"action=3 is invalid: allowed an integer in \[0, 2\]"):
        env.step(3)
    with pytest.raises(ValueError, match="noop_max=-1"):
        _env(FakeEmulator(), noop_max=-1)


# ---------------------------------------------------------------------- the real ALE
def test_pong_through_the_factory_is_an_84x84_uint8_image_env() -> None:
    cfg = EnvConfig(env_id="ALE/Pong-v5")
    assert env_spec(cfg) == EnvSpec((84, 84), np.dtype(np.uint8), 6, 4, frame_skip=4)
    text = describe_env(cfg)
    assert "Atari preprocessing" in text and "image path: Nature CNN on 4 x 84x84 uint8" in text
    assert "FIRE reset on" in text and "NOOP FIRE RIGHT LEFT RIGHTFIRE LEFTFIRE" in text
    env = make_env(cfg)
    try:
        obs, info = env.reset(seed=0)
        assert obs.shape == (84, 84) and obs.dtype == np.uint8 and obs.any()
        for _ in range(50):
            obs, reward, terminated, truncated, info = env.step(int(env.action_space.sample()))
            assert obs.shape == (84, 84) and reward in (-1.0, 0.0, 1.0)
            assert not truncated and EPISODE_CONTINUES in info
    finally:
        env.close()


def test_ale_is_deterministic_for_a_seed() -> None:
    def play(seed: int) -> list[bytes]:
        env = make_env(EnvConfig(env_id="ALE/Pong-v5"))  # sticky actions and no-op starts follow the seed
        try:
            frames = [env.reset(seed=seed)[0].tobytes()]
            frames += [env.step(t % 6)[0].tobytes() for t in range(60)]
            return frames
        finally:
            env.close()

    assert play(5) == play(5)


def test_breakout_life_loss_continues_the_game_until_game_over() -> None:
    env = make_env(EnvConfig(env_id="ALE/Breakout-v5", max_episode_steps=5000))
    try:
        env.reset(seed=0)
        lost = 0
        for _ in range(3000):  # NOOP after the serve: the ball is missed, a life at a time
            _, _, terminated, truncated, info = env.step(0)
            if terminated or truncated:
                if not episode_continues(info):
                    break
                lost += 1
                _, reset_info = env.reset()
                assert reset_info["continued"] and reset_info["lives"] == info["lives"]
        assert lost == 4 and terminated and info["lives"] == 0  # Breakout has 5 lives
    finally:
        env.close()


def test_raw_ale_env_steps_one_frame() -> None:
    env = make_raw_ale("ALE/Pong-v5")
    try:
        env.reset(seed=0)
        before = env.ale.getEpisodeFrameNumber()
        env.step(0)
        assert env.ale.getEpisodeFrameNumber() == before + 1
    finally:
        env.close()


# ---------------------------------------------------------------------- any RGB env
class RgbEnv(gym.Env):
    """A 60x80 RGB image env (what a non-Atari pixel env looks like)."""

    def __init__(self) -> None:
        self.observation_space = spaces.Box(0, 255, (60, 80, 3), np.uint8)
        self.action_space = spaces.Discrete(3)
        self._t = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros((60, 80, 3), np.uint8)
        obs[:, :, 0] = self._t % 256  # red only: the gray frame is 0.299 x red
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        self._t += 50
        return self._obs(), 0.0, False, False, {}


RGB_ID = "ApeXTestRgb-v0"
if RGB_ID not in gym.registry:
    gym.register(id=RGB_ID, entry_point=RgbEnv)


def test_an_rgb_env_takes_the_image_path() -> None:
    cfg = EnvConfig(env_id=RGB_ID, frame_stack=3)
    assert env_spec(cfg) == EnvSpec((84, 84), np.dtype(np.uint8), 3, 3)
    text = describe_env(cfg)
    assert "image observation (60, 80, 3) uint8 -> gray 84x84" in text
    assert "image path: Nature CNN on 3 x 84x84 uint8" in text
    env = make_env(cfg)
    env.reset(seed=0)
    obs = env.step(0)[0]
    assert obs.shape == (84, 84) and obs.dtype == np.uint8
    assert int(obs[40, 40]) == round(0.299 * 50)
    assert "vector path: MLP" in describe_env(EnvConfig(env_id="CartPole-v1"))


# ---------------------------------------------------------------------- the collector
FAKE_ATARI_ID = "ApeXTestAtari-v0"


def _fake_atari(**_: object) -> AtariEnv:
    # 3 lives of 40 frames (10 agent steps each), 5 points every 7th frame; clipped to 1
    return AtariEnv(FakeEmulator(MEANINGS_NO_FIRE, lives=3, life_frames=40), frame_size=84, noop_max=0,
                    clip_rewards=True, max_episode_steps=1000)


if FAKE_ATARI_ID not in gym.registry:
    gym.register(id=FAKE_ATARI_ID, entry_point=_fake_atari)


def test_collector_reports_games_and_flags_lives_terminal() -> None:
    pytest.importorskip("torch")
    from actors.collector import Collector
    from shared.chunk import FLAG_FIRST, FLAG_TERMINATED, nstep_targets
    from tests.support.fake_link import FakeLink

    cfg = Config(
        env=EnvConfig(env_id=FAKE_ATARI_ID, frame_stack=2, reward_scale=0.5),
        collectors=CollectorConfig(envs_per_collector=1, chunk_steps=8),
        replay=ReplayConfig(n_step=1, capacity=10_000),
        learner=LearnerConfig(hidden=16),
    )
    cfg = replace(cfg, collectors=replace(cfg.collectors, count=1))
    link = FakeLink()
    collector = Collector(cfg, 0, 0.5, link, seed=1)
    try:
        collector.run(max_steps=95)
    finally:
        collector.close()
    # One episode per game, not per life: a game is 10 + 9 + 9 agent steps (frames 0-40, then after each lost
    # life's NOOP step 44-80 and 84-120). Its return is the unclipped score: 5 for each multiple of 7 up to 119
    # but 42 and 84 (those frames fall in the NOOP steps, whose rewards are dropped)
    assert [e.length for e in link.episodes] == [28, 28, 28]
    assert [e.episode_return for e in link.episodes] == [75.0, 75.0, 75.0]
    # every lost life is a terminal transition followed by a fresh stack; rewards are clipped, then scaled
    sent_flags, sent_rewards = [], []
    for c in link.chunks:
        starts = nstep_targets(c.actions, c.rewards, c.flags, c.first_start, 1, cfg.replay.gamma).starts
        sent_flags.append(c.flags[starts])
        sent_rewards.append(c.rewards[starts])
    flags, rewards = np.concatenate(sent_flags), np.concatenate(sent_rewards)
    assert len(flags) >= 84
    assert 9 <= int(np.count_nonzero(flags & FLAG_TERMINATED)) <= 10  # 3 per game: 2 lost lives and the game over
    assert int(np.count_nonzero(flags & FLAG_FIRST)) >= 9
    assert set(np.unique(rewards)) == {0.0, 0.5}

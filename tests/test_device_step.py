"""The learner's whole update as one device step (learner/device_step.py, learner.step_mode=device/captured).

On the CPU, at a fixed seed, from the same replay contents and the same uniforms: the device step and the
eager learner (learner/update.py feeding learner/step.py) give the same loss, gradients, grad norm, new priorities,
weights, Adam state and target network, update after update (fp32, bf16, gradient accumulation); a
non-finite update leaves weights, Adam state and priorities unchanged on the device; the fp16 loss scale
and its skips follow GradScaler's; a checkpoint mid-run resumes to the uninterrupted run; the same step
compiles with torch.compile(fullgraph=True) under inductor; on CUDA it is one CUDA graph per update; the
real head trains with it beside its ingest thread, checkpoints and resumes (the captured graph on CUDA).
"""

from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import pytest
import torch

from envs.spec import EnvSpec
from learner.device_source import DeviceSource
from learner.precision import PrecisionPolicy, cpu_has_native_bf16
from learner.step import autograd_gradients, func_gradients
from replay.buffer import ReplayBuffer
from replay.device_batch import sample_batch
from replay.device_ring import MASS, RET
from shared.config import Config, LearnerConfig, ReplayConfig
from tests.support.learner_pairs import (
    ACTIONS,
    GAMMA,
    IMAGE,
    N_STEP,
    STACK,
    VECTOR,
    assert_same_learners,
    config,
    filled_replay,
    learner_on,
    sim_chunks,
)

WAIT_S = 60.0

PRECISIONS = ["fp32", pytest.param("bf16", marks=pytest.mark.skipif(
    not cpu_has_native_bf16(), reason="bf16 on a CPU without native kernels runs 10-30x slower"))]


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("batch, accum", [(8, 1), (4, 2)])
def test_device_step_equals_the_eager_learner(precision: str, batch: int, accum: int) -> None:
    """Six updates each (a hard target copy every 2, beta annealed over 10), same init and replay contents;
    the device ring draws its uniforms from its replay's generator, so both train on the same rows."""
    rtol, atol = (1e-4, 1e-6) if precision == "fp32" else (2e-2, 1e-4)
    eager = learner_on(config(precision=precision, batch_size=batch, grad_accum_steps=accum), filled_replay(IMAGE))
    device = learner_on(config(precision=precision, batch_size=batch, grad_accum_steps=accum, step_mode="device"),
                        filled_replay(IMAGE))
    try:
        for _ in range(6):
            se, sd = eager.train_step(), device.train_step()
            assert sd["skipped"] == se["skipped"] == 0.0
            for key in ("loss", "td_error", "mean_q", "grad_norm"):
                assert sd[key] == pytest.approx(se[key], rel=max(rtol, 1e-5)), key
            assert (sd["updates"], sd["samples"]) == (se["updates"], se["samples"])
            assert_same_learners(eager, device, rtol, atol)
        assert device.stats()["skipped_updates"] == 0
        assert isinstance(device._source, DeviceSource) and device._source.stale_rows == 0
    finally:
        eager.close()
        device.close()


LEVERS = {"munchausen": {"munchausen_alpha": 0.9}, "quantiles": {"quantiles": 4},
          "target_epsilon": {"target_epsilon": 0.05, "munchausen_alpha": 0.9},
          "target_epsilon_from": {"target_epsilon": 0.05, "munchausen_alpha": 0.9, "target_epsilon_from": 2},
          "weight_decay": {"weight_decay": 1.0, "lr": 0.01}}  # AdamW: 1% a step, so 4 updates show it
# what each lever is compared with: the same settings without the lever's own keys, so a lever that did nothing on
# top of the others (the epsilon-greedy bootstrap on Munchausen targets once did) trains exactly as its baseline
WITHOUT = {"munchausen": {}, "quantiles": {}, "target_epsilon": {"munchausen_alpha": 0.9},
           "target_epsilon_from": {"munchausen_alpha": 0.9}, "weight_decay": {"lr": 0.01}}


@pytest.mark.parametrize("lever", LEVERS)
@pytest.mark.parametrize("batch, accum", [(8, 1), (4, 2)])
def test_with_a_target_lever_the_device_step_equals_the_eager_learner(lever: str, batch: int, accum: int) -> None:
    """learner.munchausen_alpha > 0, learner.quantiles > 0 or learner.target_epsilon > 0 (a target: learner/dqn.py) or
    learner.weight_decay > 0 (AdamW: torch's fused kernel in the eager learner, the formula in the device step): both
    paths train to the same weights, Adam state and priorities."""
    levers = {**LEVERS[lever], "batch_size": batch, "grad_accum_steps": accum}
    eager = learner_on(config(**levers), filled_replay(IMAGE))
    device = learner_on(config(step_mode="device", **levers), filled_replay(IMAGE))
    plain = learner_on(config(step_mode="device", batch_size=batch, grad_accum_steps=accum, **WITHOUT[lever]),
                       filled_replay(IMAGE))
    starts = LEVERS[lever].get("target_epsilon_from", 0)
    try:
        for u in range(4):
            se, sd, sp = eager.train_step(), device.train_step(), plain.train_step()
            for key in ("loss", "td_error", "mean_q", "grad_norm"):  # mean_q starts near 0: an absolute bound too
                assert sd[key] == pytest.approx(se[key], rel=1e-5, abs=1e-7), key
            if u < starts:  # before the lever's first update: the baseline's update
                assert sd["loss"] == pytest.approx(sp["loss"], rel=1e-6), u
        assert sd["loss"] != pytest.approx(sp["loss"], rel=1e-4)  # the lever changed the target
        assert_same_learners(eager, device, 1e-4, 1e-6)
    finally:
        for learner in (eager, device, plain):
            learner.close()


# the options that act between the updates: NoisyNet's draw before each, the periodic reset after the period's last
# and random shifts of the inputs (drawn from torch's generator inside the update, as NoisyNet's noise is before it)
BETWEEN = {"noisy": {"noisy_sigma": 0.5}, "resets": {"reset_every_updates": 2, "shrink_perturb": 0.5},
           "noisy_resets": {"noisy_sigma": 0.5, "reset_every_updates": 3}, "augment": {"augment_shift": 4},
           "augment_accum": {"augment_shift": 2, "grad_accum_steps": 2, "noisy_sigma": 0.5}}


@pytest.mark.parametrize("option", BETWEEN)
def test_with_noise_resets_or_shifts_the_device_step_equals_the_eager_learner(option: str) -> None:
    """learner.noisy_sigma > 0 (fresh noise in place before every update), learner.reset_every_updates > 0 (the
    reset in place after every period) and learner.augment_shift > 0 (random shifts inside the update): the device step trains to the eager learner's weights, Adam state and
    priorities, and to other weights than the same step without the option."""
    eager = learner_on(config(**BETWEEN[option]), filled_replay(IMAGE))
    device = learner_on(config(step_mode="device", **BETWEEN[option]), filled_replay(IMAGE))
    plain = learner_on(config(step_mode="device"), filled_replay(IMAGE))
    try:
        def step(learner, u: int) -> dict:  # the noise comes from torch's global generator: the same draws for each
            torch.manual_seed(1000 + u)
            return learner.train_step()

        for u in range(6):
            se, sd, sp = step(eager, u), step(device, u), step(plain, u)
            assert sd["skipped"] == se["skipped"] == 0.0
            for key in ("loss", "td_error", "mean_q", "grad_norm"):
                assert sd[key] == pytest.approx(se[key], rel=1e-5, abs=1e-7), key
            assert_same_learners(eager, device, 1e-4, 1e-6)
        assert sd["loss"] != pytest.approx(sp["loss"], rel=1e-4)  # the option changed the training
        if "reset_every_updates" in BETWEEN[option]:  # a reset restarts Adam: its step counts are behind the plain's
            steps = {float(st["step"]) for st in device.optimizer.state.values()}
            assert min(steps) < 6.0, steps
    finally:
        for learner in (eager, device, plain):
            learner.close()


def test_with_uniform_replay_the_device_step_equals_the_eager_learner_and_keeps_the_masses() -> None:
    eager = learner_on(config(), filled_replay(IMAGE, prioritized=False))
    device = learner_on(config(step_mode="device"), filled_replay(IMAGE, prioritized=False))
    try:
        for _ in range(3):
            se, sd = eager.train_step(), device.train_step()
            assert sd["loss"] == pytest.approx(se["loss"], rel=1e-5)
        assert_same_learners(eager, device, 1e-4, 1e-6)
        mass = device._source.ring.table[MASS]
        assert set(mass.unique().tolist()) == {0.0, 1.0}  # uniform leaves: nothing written back
    finally:
        eager.close()
        device.close()


def test_device_gradients_equal_the_eager_backward() -> None:
    """The gradients themselves (before clipping), on the same drawn batch, with accumulation over 2 micro-batches."""
    cfg = config(batch_size=6, grad_accum_steps=2)
    eager = learner_on(cfg, filled_replay(IMAGE))
    device = learner_on(replace(cfg, learner=replace(cfg.learner, step_mode="device")), filled_replay(IMAGE))
    device._ensure_source()
    src = device._source
    reader = eager.replay.reader
    state = reader.rng.bit_generator.state
    host = eager.replay.sample(12, beta=0.5)
    step = eager._new_eager_step()
    grads_e, loss_e, td_e, _ = autograd_gradients(step.cfg, step.state, eager.online, eager.target, host, 0)
    src.ring.reader.rng.bit_generator.state = state
    src.ring.refill_uniforms(0, force=True)
    batch = sample_batch(src.ring.table, src.ring.frames, src.ring.claim, src.ring.uniforms[0],
                         torch.tensor(0.5, dtype=torch.float64), STACK)
    assert np.array_equal(batch.slots.numpy(), host.indices % eager.replay.capacity)
    grads, loss_d, td_d, _ = func_gradients(src.runner.cfg, src.state, device.online, device.target, batch)
    assert float(loss_d) == pytest.approx(float(loss_e), rel=1e-5)
    torch.testing.assert_close(td_d, td_e, rtol=1e-5, atol=1e-6)
    for p, g, ge in zip(eager.params, grads, grads_e, strict=True):
        assert ge is p.grad  # autograd's are the parameters' own
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-7)
    eager.close()
    device.close()


@pytest.mark.filterwarnings("ignore:learner. skipped an optimizer update")
def test_a_non_finite_update_changes_nothing_on_the_device() -> None:
    learner = learner_on(config(step_mode="device", target_update_every=1000), filled_replay(IMAGE))
    try:
        learner.train_step()
        src = learner._source
        before = ({k: v.clone() for k, v in learner.online.state_dict().items()},
                  {k: {n: t.clone() for n, t in v.items()} for k, v in learner.optimizer.state_dict()["state"].items()},
                  src.ring.table[MASS].clone())
        returns = src.ring.table[RET].clone()
        src.ring.table[RET] = torch.where(src.ring.table[MASS] > 0, torch.inf, 0.0)  # every target infinite
        out = learner.train_step()
        assert out["skipped"] == 1.0 and not np.isfinite(out["loss"])
        for k, v in learner.online.state_dict().items():
            assert torch.equal(v, before[0][k]), k
        for k, v in learner.optimizer.state_dict()["state"].items():
            for n, t in v.items():
                assert torch.equal(t, before[1][k][n]), (k, n)
        assert torch.equal(src.ring.table[MASS], before[2])
        st = learner.stats()
        assert st["skipped_updates"] == 1 and st["updates"] == 2
        src.ring.table[RET] = returns
        assert learner.train_step()["skipped"] == 0.0  # and it trains again
    finally:
        learner.close()


def test_fp16_loss_scaling_and_skips_follow_the_grad_scaler() -> None:
    """CPU fp16 autocast with a GradScaler on both paths (the CUDA configuration, run on the CPU): the same
    scale after growth (interval 2) and after the back-off of a poisoned update, the same skip count and
    losses and, within a few Adam steps, weights."""
    fp16 = PrecisionPolicy("fp16", "cpu", torch.float16, True)
    learners = []
    for mode in ("eager", "device"):
        learner = learner_on(config(step_mode=mode, target_update_every=1000), filled_replay(IMAGE))
        learner.precision = fp16
        learner.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
        learners.append(learner)
    eager, device = learners
    try:
        scales = []
        for k in range(5):
            if k == 3:  # a poisoned batch: every target infinite, the update is skipped and the scale backs off
                returns, ring_returns = eager.replay.storage.ret.copy(), device._source.ring.table[RET].clone()
                eager.replay.storage.ret[:] = np.inf
                device._source.ring.table[RET] = torch.where(device._source.ring.table[MASS] > 0, torch.inf, 0.0)
            se, sd = eager.train_step(), device.train_step()
            if k == 3:
                eager.replay.storage.ret[:] = returns
                device._source.ring.table[RET] = ring_returns
            assert sd["skipped"] == se["skipped"] == (1.0 if k == 3 else 0.0), k
            assert float(device.scaler.get_scale()) == float(eager.scaler.get_scale()), k
            scales.append(float(device.scaler.get_scale()))
            if not se["skipped"]:
                assert sd["loss"] == pytest.approx(se["loss"], rel=1e-2), k
        assert scales == [2.0**10, 2.0**11, 2.0**11, 2.0**10, 2.0**10]  # grown after 2 clean updates, halved after 1 bad
        # fp16 rounding differs between the two backward passes; Adam turns that into steps of up to lr (1e-4)
        # wherever a gradient is near 0, so the weights agree to a few such steps
        for name, t in eager.online.state_dict().items():
            torch.testing.assert_close(device.online.state_dict()[name], t, rtol=1e-2, atol=5e-4)
        assert device.state_dict()["scaler"] == eager.state_dict()["scaler"]
    finally:
        eager.close()
        device.close()


def test_a_checkpoint_mid_run_resumes_to_the_uninterrupted_run(tmp_path) -> None:
    """3 updates, a checkpoint with the replay, 4 more; a new learner and replay (another seed) restored from
    the checkpoint make the same 4 updates: same weights, Adam state, priorities and generator."""
    cfg = config(step_mode="device", save_replay=True)
    first = learner_on(cfg, filled_replay(IMAGE, seed=5))
    try:
        first.run_updates(3)
        first.save_checkpoint(tmp_path / "run", first.replay)
        first.run_updates(4)
        with first._source.pause():  # the device priorities into the host tree, to compare
            leaves = first.replay.reader.tree.leaves().copy()
            rng_state = first.replay.reader.rng.bit_generator.state
    finally:
        first.close()
    second = learner_on(cfg, filled_replay(IMAGE, seed=99), seed=7)
    try:
        second.load_checkpoint(tmp_path / "run", second.replay)
        second.run_updates(4)
        with second._source.pause():
            assert np.array_equal(second.replay.reader.tree.leaves(), leaves)
            assert second.replay.reader.rng.bit_generator.state == rng_state
        for name, t in first.online.state_dict().items():
            assert torch.equal(second.online.state_dict()[name], t), name
        assert second.updates == first.updates == 7
    finally:
        second.close()


def train_beside_a_writer(learner, buf: ReplayBuffer, chunks: list, updates: int = 40) -> None:
    """`updates` updates while a writer thread adds a batch of chunks each time the learner starts one
    (an event, not a clock); then the replay's invariants hold and every update was counted."""
    tick, stop = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        k = 12
        try:
            while not stop.is_set():
                if tick.wait(WAIT_S):
                    tick.clear()
                    buf.add_chunks([chunks[(k + j) % len(chunks)] for j in range(6)])
                    k += 6
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        for _ in range(updates):
            tick.set()
            learner.run_updates(1)
            assert not errors, errors
    finally:
        stop.set()
        tick.set()
        thread.join(WAIT_S)
        learner.close()
    assert not errors and buf.transitions_added > 3 * buf.capacity
    with learner._source.pause():
        buf.check_valid()
    assert learner.stats()["updates"] == updates


def test_the_device_step_trains_while_a_writer_thread_inserts() -> None:
    """The ingest side keeps writing: updates go on, drained segments are mirrored, the replay stays valid."""
    chunks = sim_chunks(IMAGE, seed=22)
    buf = ReplayBuffer(600, IMAGE, np.uint8, STACK, N_STEP, GAMMA, max_chunk_frames=64, seed=3)
    buf.add_chunks(chunks[:12])
    train_beside_a_writer(learner_on(config(step_mode="device"), buf), buf, chunks)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_step_compiles_with_fullgraph_and_matches_the_eager_step() -> None:
    """step_mode=captured on the CPU: torch.compile(device_update, fullgraph=True) under inductor -- it raises
    on any graph break -- then three updates equal the uncompiled step's. A tiny MLP keeps compiling short."""
    states = {}
    for mode in ("device", "captured"):
        learner = learner_on(config(step_mode=mode, hidden=16), filled_replay(VECTOR))
        try:
            outs = [learner.train_step() for _ in range(3)]
            states[mode] = (learner.online.state_dict(), outs, learner.stats(),
                            learner._source.ring.table[MASS].clone())
        finally:
            learner.close()
    device, captured = states["device"], states["captured"]
    assert captured[2]["compiled"] and captured[2]["compile_s"] > 0 and not device[2]["compiled"]
    for a, b in zip(device[1], captured[1], strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    for name, t in device[0].items():
        torch.testing.assert_close(captured[0][name], t, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(captured[3], device[3], rtol=1e-5, atol=0)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_step_autotune_compiles_the_captured_step_with_max_autotune_and_it_matches(monkeypatch) -> None:
    """learner.step_autotune asks inductor for max-autotune without CUDA graphs of its own (the runner records
    the one graph). What reaches torch.compile is recorded; the traced graph runs on the eager backend, so the
    test takes seconds (inductor's kernel timing is measured by `python -m bench.learner_step --modes autotuned`),
    and the autotuned learner trains as the op-by-op step does."""
    calls = []
    real_compile = torch.compile

    def recording_compile(fn, **kwargs):
        calls.append(kwargs)
        return real_compile(fn, **{k: v for k, v in kwargs.items() if k != "mode"}, backend="eager")

    monkeypatch.setattr(torch, "compile", recording_compile)
    torch._dynamo.reset()
    states = {}
    for mode, autotune in (("device", False), ("captured", True)):
        learner = learner_on(config(step_mode=mode, step_autotune=autotune, hidden=16), filled_replay(VECTOR))
        try:
            outs = [learner.train_step() for _ in range(3)]
            states[mode] = (learner.online.state_dict(), outs, learner._source.runner.compile_mode)
        finally:
            learner.close()
    torch._dynamo.reset()
    assert calls == [{"fullgraph": True, "dynamic": False, "mode": "max-autotune-no-cudagraphs"}]
    assert states["captured"][2] == "max-autotune-no-cudagraphs" and states["device"][2] is None
    for a, b in zip(states["device"][1], states["captured"][1], strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    for name, t in states["device"][0].items():
        torch.testing.assert_close(states["captured"][0][name], t, rtol=1e-5, atol=1e-6)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("lever", [*LEVERS, *BETWEEN])
def test_with_a_target_lever_the_step_traces_as_one_graph(monkeypatch, lever: str) -> None:
    """The Munchausen or quantile target, NoisyNet's noisy layers or random shifts inside the captured step, resets
    between its calls: dynamo traces it with fullgraph=True (it raises on a graph break); the eager backend runs the traced graph
    without inductor's code generation, which the test above already covers, so this takes seconds. Its updates
    equal the op-by-op step's."""
    import functools

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    torch._dynamo.reset()
    states = {}
    for mode in ("device", "captured"):
        options = {**LEVERS, **BETWEEN}[lever]
        shape = IMAGE if "augment_shift" in options else VECTOR  # random shifts move the pixels of frames
        learner = learner_on(config(step_mode=mode, hidden=16, **options), filled_replay(shape))
        try:
            outs = []
            for u in range(3):  # the draws inside the step come from torch's generator: the same ones in both modes
                torch.manual_seed(1000 + u)
                outs.append(learner.train_step())
            states[mode] = (learner.online.state_dict(), outs, learner.stats())
        finally:
            learner.close()
    torch._dynamo.reset()
    assert states["captured"][2]["compiled"]
    for a, b in zip(states["device"][1], states["captured"][1], strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    for name, t in states["device"][0].items():
        torch.testing.assert_close(states["captured"][0][name], t, rtol=1e-5, atol=1e-6)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_space_to_depth_step_traces_as_one_graph_and_equals_the_eager_learner(monkeypatch) -> None:
    """learner.space_to_depth=on (what auto picks with CUDA): the captured step over the Nature CNN traces with
    fullgraph=True (eager backend, seconds) and trains as the eager learner with the plain convolution does."""
    import functools

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    torch._dynamo.reset()
    eager = learner_on(config(), filled_replay(IMAGE))
    captured = learner_on(config(step_mode="captured", space_to_depth="on"), filled_replay(IMAGE))
    try:
        assert captured.space_to_depth and captured.online.torso.space_to_depth
        assert captured.target.torso.space_to_depth and not eager.space_to_depth  # CPU: auto is off
        for _ in range(3):
            a, b = eager.train_step(), captured.train_step()
            assert b["loss"] == pytest.approx(a["loss"], rel=1e-4)
        assert captured.stats()["compiled"]
        assert_same_learners(eager, captured, rtol=1e-4, atol=1e-5)
    finally:
        eager.close()
        captured.close()
        torch._dynamo.reset()


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@CUDA
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_on_cuda_the_captured_step_is_one_graph_and_matches_the_eager_step(precision: str) -> None:
    """Frames and table on the GPU; step_mode=captured records one CUDA graph and replays it per update;
    its results equal the uncompiled device step's within AMP tolerance."""
    from learner.trainer import Learner

    results = {}
    for mode in ("device", "captured"):
        buf = ReplayBuffer(3000, IMAGE, np.uint8, STACK, N_STEP, GAMMA, max_chunk_frames=64, seed=5, device="cuda")
        buf.add_chunks(sim_chunks(IMAGE))
        cfg = config(step_mode=mode, precision=precision, device="cuda")
        torch.manual_seed(0)
        learner = Learner(cfg.learner, cfg.replay, EnvSpec(IMAGE, np.uint8, ACTIONS, STACK), buf, "cuda",
                          config_json=cfg.to_json())
        try:
            outs = [learner.train_step() for _ in range(5)]
            if mode == "captured":
                assert learner._source.runner._graph is not None
            results[mode] = ({k: v.cpu() for k, v in learner.online.state_dict().items()}, outs)
        finally:
            learner.close()
    for a, b in zip(results["device"][1], results["captured"][1], strict=True):
        assert b["skipped"] == a["skipped"]
        if not a["skipped"]:
            assert b["loss"] == pytest.approx(a["loss"], rel=2e-2)
    for name, t in results["device"][0].items():
        torch.testing.assert_close(results["captured"][0][name], t, rtol=5e-2, atol=1e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_on_cuda_the_captured_step_trains_while_a_writer_thread_inserts() -> None:
    """The head's situation on a GPU: the ingest thread writes frames and records into the device ring
    while the learner replays its CUDA graph; the ring laps (capacity 600) and the replay stays valid."""
    from learner.trainer import Learner

    chunks = sim_chunks(IMAGE, seed=22)
    buf = ReplayBuffer(600, IMAGE, np.uint8, STACK, N_STEP, GAMMA, max_chunk_frames=64, seed=3, device="cuda")
    buf.add_chunks(chunks[:12])
    cfg = config(step_mode="captured", precision="bf16", device="cuda")
    torch.manual_seed(0)
    learner = Learner(cfg.learner, cfg.replay, EnvSpec(IMAGE, np.uint8, ACTIONS, STACK), buf, "cuda",
                      config_json=cfg.to_json())
    train_beside_a_writer(learner, buf, chunks)
    assert learner._source.runner._graph is not None


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("device, mode", [
    ("cpu", "device"),
    pytest.param("cuda", "captured", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")),
])
def test_a_head_trains_with_the_device_step_checkpoints_and_resumes(tmp_path, device: str, mode: str) -> None:
    """The real system with the step: collectors over sockets, the ingest thread writing while the learner
    steps, the replay saved by the final checkpoint and restored by a resume that trains on."""
    from launcher.head import Head, StopAt
    from tests.support.head_runs import cartpole

    base = cartpole()
    cfg = replace(base, learner=replace(base.learner, device=device, step_mode=mode))
    first = Head(cfg, tmp_path / "run")
    try:
        # the ingest thread writes into the replay while the learner trains: it pauses while a graph is recorded
        assert first.learner.capture_guard == first.consolidation.writes_paused
        summary = first.run(StopAt(env_steps=6_000), threading.Event())
        assert isinstance(first.learner._source, DeviceSource)
    finally:
        first.close()  # the final checkpoint, replay included
    assert summary["updates"] > 0 and summary["rejected"] == 0
    steps = first.env_steps()
    second = Head(cfg, tmp_path / "run2", resume=tmp_path / "run")
    try:
        assert second.learner.updates == summary["updates"] and second.env_steps() == steps
        resumed = second.run(StopAt(env_steps=steps + 1_000), threading.Event())
        # check_valid needs the writer quiescent too: collectors still stream until close()
        with second.consolidation.writes_paused(), second.learner._source.pause():
            second.replay.check_valid()
    finally:
        second.close(checkpoint=False)
    assert resumed["updates"] > summary["updates"]


def test_step_mode_is_checked_with_one_line_errors() -> None:
    from shared.config import ConfigError

    for learner, replay, match in (
        ({"step_mode": "graph"}, {}, "learner.step_mode='graph' is invalid: allowed one of eager, device, captured"),
        ({"step_mode": "captured", "compile_mode": "default"}, {}, "set learner.compile_mode=off"),
        ({"step_mode": "device", "device": "cuda"}, {"storage_device": "cpu"}, "storage_device auto or learner"),
        ({"step_mode": "device", "step_autotune": True}, {}, "only the captured step is compiled"),
        ({"step_mode": "captured", "step_autotune": 1}, {}, "learner.step_autotune=1 is invalid: allowed true or false"),
    ):
        cfg = Config(learner=LearnerConfig(**learner), replay=ReplayConfig(**replay))
        with pytest.raises(ConfigError, match=match) as err:
            cfg.check_valid()
        assert "\n" not in str(err.value)
    assert Config(learner=LearnerConfig(step_mode="captured")).check_valid().learner.step_mode == "captured"
    assert Config(learner=LearnerConfig(step_mode="captured", step_autotune=True)).check_valid().learner.step_autotune


def test_a_replay_without_the_ring_is_refused_at_the_first_update() -> None:
    from tests.support.learner_fakes import FakeReplay

    fake = FakeReplay(obs_shape=IMAGE, stack=STACK, num_actions=ACTIONS)
    learner = learner_on(config(step_mode="device"), fake)
    with pytest.raises(ValueError, match="learner.step_mode=device: needs the project's ReplayBuffer"):
        learner.train_step()

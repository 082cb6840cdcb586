"""Mixed-precision policy and CPU bf16 accuracy against fp32 on the same batch."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from learner.dqn import dqn_loss
from learner.precision import PrecisionPolicy, cpu_has_native_bf16, resolve_precision
from shared.network import build_q_network
from tests.support.learner_fakes import SMALL_OBS, FakeReplay, make_learner, small_config

CPU = torch.device("cpu")


def test_cpu_policies() -> None:
    assert resolve_precision("fp32", CPU).autocast_dtype is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # warns where the CPU lacks native bf16
        bf16 = resolve_precision("bf16", CPU)
    assert bf16.autocast_dtype is torch.bfloat16 and not bf16.use_scaler
    auto = resolve_precision("auto", CPU)
    # auto is the fastest path: bf16 only where oneDNN has native bf16 kernels
    assert auto.name == ("bf16" if cpu_has_native_bf16() else "fp32")
    with pytest.warns(RuntimeWarning, match="fp16"):
        fp16 = resolve_precision("fp16", CPU)
    assert fp16.name in ("bf16", "fp32") and not fp16.use_scaler
    with pytest.raises(ValueError, match="precision"):
        resolve_precision("fp8", CPU)


def test_scaler_disabled_without_fp16() -> None:
    scaler = resolve_precision("fp32", CPU).make_scaler()
    assert not scaler.is_enabled()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_policies() -> None:
    dev = torch.device("cuda")
    auto = resolve_precision("auto", dev)
    assert auto.name == "fp16" and auto.use_scaler


def test_bf16_loss_and_gradients_close_to_fp32() -> None:
    """CPU bf16 autocast vs fp32 on one batch.

    Tolerance: bf16 keeps 8 mantissa bits (relative rounding 2^-8 ~ 0.4% per op); through five
    layers the error compounds to ~1-2%, so we allow 5% relative on the loss and require the
    full gradient to agree in direction (cosine > 0.99) and norm (5% relative). Element-wise
    gradient checks would flag near-zero entries whose relative error is meaningless.
    """
    torch.manual_seed(0)
    net = build_q_network(SMALL_OBS, 4, 5, hidden=64, dueling=True)
    target = copy.deepcopy(net)
    b = FakeReplay(seed=5).sample(16, beta=0.5)
    results = {}
    for name in ("fp32", "bf16"):
        net.zero_grad(set_to_none=True)
        policy = resolve_precision("fp32", CPU) if name == "fp32" else PrecisionPolicy("bf16", "cpu", torch.bfloat16, False)
        with policy.autocast():
            out = dqn_loss(net, target, b.obs, b.actions, b.returns, b.discounts, b.next_obs, b.weights)
        out.loss.backward()
        grad = torch.cat([p.grad.flatten() for p in net.parameters()])
        results[name] = (out.loss.item(), grad, out.td_abs)
    (l32, g32, td32), (l16, g16, td16) = results["fp32"], results["bf16"]
    assert l16 == pytest.approx(l32, rel=0.05)
    cos = torch.nn.functional.cosine_similarity(g32, g16, dim=0).item()
    assert cos > 0.99
    assert g16.norm().item() == pytest.approx(g32.norm().item(), rel=0.05)
    assert td16.dtype == torch.float32  # priorities stay float32 under autocast
    torch.testing.assert_close(td16, td32, rtol=0.05, atol=0.05)


@pytest.mark.filterwarnings("ignore:learner.precision=bf16")
def test_learner_reports_resolved_precision() -> None:
    learner = make_learner(small_config(precision="bf16", batch_size=4))
    try:
        assert learner.precision.name == "bf16"
        stats = learner.train_step()
        assert stats["loss"] > 0
        assert learner.stats()["precision"] == "bf16"
    finally:
        learner.close()


def test_auto_learner_threads_follow_the_precision_that_runs() -> None:
    from learner.precision import FP32_CPU_LEARNER_THREADS, learner_threads

    fp32 = PrecisionPolicy("fp32", "cpu", None, False)
    bf16 = PrecisionPolicy("bf16", "cpu", torch.bfloat16, False)
    cuda = PrecisionPolicy("fp32", "cuda", None, False)
    assert learner_threads(3, fp32, cores=2) == 3 and learner_threads(1, fp32, cores=8) == 1  # asked for: kept
    assert learner_threads(0, fp32, cores=8) == FP32_CPU_LEARNER_THREADS == 2
    assert learner_threads(0, fp32, cores=1) == 1
    assert learner_threads(0, bf16, cores=8) == 1 and learner_threads(0, cuda, cores=8) == 1


def test_a_learner_on_auto_threads_sets_what_its_precision_takes() -> None:
    import os

    from learner.precision import learner_threads

    before = torch.get_num_threads()
    learner = make_learner(small_config(torch_threads=0, precision="fp32"))
    try:
        assert torch.get_num_threads() == learner_threads(0, learner.precision) == min(2, os.cpu_count() or 1)
    finally:
        learner.close()
        torch.set_num_threads(before)

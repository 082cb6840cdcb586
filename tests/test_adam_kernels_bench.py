"""The Adam kernel bench's plumbing (the figure itself is `python -m experiments.adam_kernels`), and the learner's choice."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from experiments.adam_kernels import KERNELS, measure
from learner.dqn import make_optimizer


@pytest.mark.experiments
def test_one_round_reports_both_kernels_on_the_learner_s_parameters() -> None:
    result = measure(threads=1, rounds=2, steps=1, warmup=0)
    assert set(result["adam_ms_per_step"]) == set(KERNELS)
    for kernel in KERNELS:
        assert len(result["adam_ms_per_step"][kernel]["values"]) == 2
        assert result["adam_ms_per_step"][kernel]["min"] > 0
    assert result["params"] > 3_000_000 and result["foreach_over_fused"] > 0


def test_the_learner_s_adam_is_fused_on_the_cpu() -> None:
    opt = make_optimizer([torch.nn.Parameter(torch.zeros(3))], lr=1e-3, eps=1e-8, device=torch.device("cpu"))
    assert opt.param_groups[0]["fused"] is True


@pytest.mark.experiments
def test_a_bad_count_exits_2_with_one_line() -> None:
    done = subprocess.run([sys.executable, "-m", "experiments.adam_kernels", "--rounds", "0"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip() == "error: --rounds must be >= 1 (got 0)"


@pytest.mark.experiments
def test_out_writes_the_printed_json(tmp_path) -> None:
    out = tmp_path / "adam.json"
    done = subprocess.run([sys.executable, "-m", "experiments.adam_kernels", "--rounds", "1", "--steps", "1", "--out",
                           str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text()) == json.loads(done.stdout)

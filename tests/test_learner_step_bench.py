"""Smoke test of the step bench's plumbing (the measurement itself is `python -m bench.learner_step`)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from bench.learner_step import learner_config, run_step_bench


def test_quick_step_bench_reports_every_key_with_reasons_for_nulls() -> None:
    out = run_step_bench(quick=True, device="cpu", capacity=2000, seconds=0.05, batches=(4,), precisions=("fp32",))
    assert set(out["learner_updates_per_s"]) == {"eager_fp32_b4", "device_fp32_b4"}
    assert all(v > 0 for v in out["learner_updates_per_s"].values())
    assert set(out["learner_host_cpu_ms_per_update"]) == set(out["learner_updates_per_s"])
    assert all(0.0 <= v <= 1.0 for v in out["learner_wait_frac"].values())
    assert out["learner_device_busy_frac"] is None and "CPU" in out["errors"]["learner_device_busy_frac"]
    assert out["learner_host_launch_ms_per_update"] is None and "CPU" in out["errors"]["learner_host_launch_ms_per_update"]
    assert "captured_fp32_b4" in out["skipped"]  # --quick on a CPU does not compile
    assert out["ratios"]["device_fp32_b4_vs_eager"] > 0
    assert out["details"]["skipped_updates"] == {"eager_fp32_b4": [0], "device_fp32_b4": [0]}
    assert out["learner_space_to_depth"] == {"eager_fp32_b4": False, "device_fp32_b4": False}  # auto: off on a CPU


def test_modes_pick_what_is_measured_and_autotuned_is_a_compiled_mode() -> None:
    out = run_step_bench(quick=True, device="cpu", capacity=2000, seconds=0.05, batches=(4,), precisions=("fp32",),
                         modes=("device", "autotuned"))
    assert set(out["learner_updates_per_s"]) == {"device_fp32_b4"}
    assert "autotuned_fp32_b4" in out["skipped"]  # compiled like captured: not under --quick on a CPU
    assert out["ratios"] == {}  # no eager figure to compare with


@pytest.mark.parametrize("mode, step_mode, compile_mode", [
    ("eager", "eager", "off"), ("device", "device", "off"), ("captured", "captured", "off"),
    ("autotuned", "captured", "off"), ("compiled", "eager", "default"),
])
def test_each_mode_runs_its_own_step_and_compile(mode: str, step_mode: str, compile_mode: str) -> None:
    lc = learner_config(mode, 32, "fp32", torch.device("cpu"))
    assert (lc.step_mode, lc.compile_mode, lc.step_autotune) == (step_mode, compile_mode, mode == "autotuned")
    assert lc.warmup_transitions == 0 and lc.samples_per_insert == 0.0


def test_compiled_networks_are_a_compiled_mode_left_out_of_quick_cpu_runs() -> None:
    out = run_step_bench(quick=True, device="cpu", capacity=2000, seconds=0.05, batches=(4,), precisions=("fp32",),
                         modes=("eager", "compiled"))
    assert set(out["learner_updates_per_s"]) == {"eager_fp32_b4"}
    assert "compiled_fp32_b4" in out["skipped"]


def test_space_to_depth_values_are_measured_side_by_side_with_their_ratio() -> None:
    out = run_step_bench(quick=True, device="cpu", capacity=2000, seconds=0.05, batches=(4,), precisions=("fp32",),
                         modes=("eager",), space_to_depth=("off", "on"))
    assert set(out["learner_updates_per_s"]) == {"eager_fp32_b4_s2d-off", "eager_fp32_b4_s2d-on"}
    assert out["ratios"]["eager_fp32_b4_s2d-on_vs_s2d-off"] > 0
    assert out["learner_space_to_depth"] == {"eager_fp32_b4_s2d-off": False, "eager_fp32_b4_s2d-on": True}
    assert learner_config("captured", 32, "fp16", torch.device("cuda"), "on").space_to_depth == "on"


@pytest.mark.parametrize("argv, message", [
    (["--repeats", "0"], "--repeats=0"),
    (["--batches", "32,x"], "--batches='32,x'"),
    (["--precisions", "fp8"], "--precisions='fp8'"),
    (["--seconds", "-1"], "--seconds=-1"),
    (["--modes", "eager,turbo"], "--modes='eager,turbo'"),
    (["--space-to-depth", "on,sometimes"], "--space-to-depth='on,sometimes'"),
])
def test_bad_arguments_exit_2_with_one_line(argv: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "bench.learner_step", *argv], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 2 and message in done.stderr and done.stdout == ""

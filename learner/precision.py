"""Mixed-precision policy: which autocast dtype and whether a GradScaler is needed.

Policy (``learner.precision``):

- CUDA, ``auto`` or ``fp16``: fp16 autocast + GradScaler (fp16's narrow exponent range needs
  loss scaling; tensor cores are fastest on every CUDA generation we target).
- CUDA, ``bf16``: bf16 autocast, no scaler (bf16 has fp32's exponent range); falls back to
  fp16 + scaler with one warning when ``torch.cuda.is_bf16_supported()`` is false.
- CPU, ``bf16``: bf16 autocast (no scaler).
- CPU, ``auto``: bf16 only where oneDNN has native bf16 kernels (AVX512-BF16/AMX); otherwise
  fp32. Why: on an AVX2-only CPU bf16 convolutions fall back to ATen's slow reference kernels
  (measured 10-30x *slower* than fp32 on the Nature CNN), so "auto" must not pick them.
- CPU, ``fp16``: no fast CPU fp16 path; uses bf16 when native, else fp32, with one warning.
- ``fp32``: no autocast anywhere.

The loss itself is always computed in float32 (see `learner.dqn`).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PrecisionPolicy:
    name: str  # "fp32", "bf16" or "fp16": what actually runs
    device_type: str  # "cpu" or "cuda"
    autocast_dtype: torch.dtype | None  # None = no autocast
    use_scaler: bool  # GradScaler for fp16

    def autocast(self) -> contextlib.AbstractContextManager:
        """Context for the forward passes; a no-op for fp32."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.autocast_dtype)

    def make_scaler(self) -> torch.amp.GradScaler:
        """A GradScaler that is a transparent pass-through unless fp16 needs it."""
        return torch.amp.GradScaler(self.device_type, enabled=self.use_scaler)


def cpu_has_native_bf16() -> bool:
    """True where oneDNN runs bf16 convolutions/matmuls natively (not the slow reference path)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


# A CPU learner in fp32 (no native bf16 kernels) costs ~4x a bf16 one: it sets the pace, its collectors wait at
# the insert gate and the second core idles, so it takes two threads (BENCHMARKS.md, "Design measurements")
FP32_CPU_LEARNER_THREADS = 2


def learner_threads(requested: int, policy: PrecisionPolicy, cores: int | None = None) -> int:
    """Torch intra-op threads for a CPU learner: `requested`, or for 0 (auto) one with bf16 (the learner and the
    emulators then share the cores about evenly) and FP32_CPU_LEARNER_THREADS (at most the cores) in fp32."""
    if requested > 0:
        return int(requested)
    if policy.device_type != "cpu" or policy.name != "fp32":
        return 1
    return max(1, min(FP32_CPU_LEARNER_THREADS, cores if cores is not None else (os.cpu_count() or 1)))


def cuda_bf16_supported() -> bool:
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    except (AssertionError, RuntimeError):
        return False


def resolve_precision(requested: str, device: torch.device) -> PrecisionPolicy:
    """Map the configured precision to what runs on `device` (see the module docstring)."""
    if requested not in ("auto", "fp32", "bf16", "fp16"):
        raise ValueError(f"learner.precision={requested!r}: allowed auto, fp32, bf16, fp16")
    dev = device.type
    if requested == "fp32":
        return PrecisionPolicy("fp32", dev, None, False)
    if dev == "cuda":
        if requested == "bf16":
            if cuda_bf16_supported():
                return PrecisionPolicy("bf16", dev, torch.bfloat16, False)
            warnings.warn(
                "learner.precision=bf16: this GPU does not support bf16; using fp16 autocast + GradScaler",
                RuntimeWarning,
                stacklevel=2,
            )
        return PrecisionPolicy("fp16", dev, torch.float16, True)
    if dev != "cpu":
        raise ValueError(f"resolve_precision: unsupported device type {dev!r} (cpu or cuda)")
    native = cpu_has_native_bf16()
    if requested == "bf16":
        if not native:
            warnings.warn(
                "learner.precision=bf16: this CPU has no native bf16 kernels (oneDNN falls back to "
                "reference convolutions, measured 10-30x slower than fp32); precision=auto picks fp32 here",
                RuntimeWarning,
                stacklevel=2,
            )
        return PrecisionPolicy("bf16", dev, torch.bfloat16, False)
    if requested == "fp16":
        fallback = "bf16" if native else "fp32"
        warnings.warn(
            f"learner.precision=fp16 has no fast CPU path; using {fallback} on CPU",
            RuntimeWarning,
            stacklevel=2,
        )
        return PrecisionPolicy(fallback, dev, torch.bfloat16 if native else None, False)
    # auto on CPU
    if native:
        return PrecisionPolicy("bf16", dev, torch.bfloat16, False)
    return PrecisionPolicy("fp32", dev, None, False)

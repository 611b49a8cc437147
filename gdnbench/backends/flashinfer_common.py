"""Shared by the three FlashInfer adapters (flashinfer.prefill, flashinfer.decode, flashinfer.mtp).

Envelopes were read from flashinfer-python 0.7.2.post1 (``flashinfer/gdn_prefill.py``,
``flashinfer/gdn_decode.py`` and the CuTe-DSL kernels under ``flashinfer/gdn_kernels/``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from gdnbench.problem import Problem
from gdnbench.suite import Case

PACKAGE = "flashinfer-python"
DTYPES = ("bf16", "fp16")  # every FlashInfer GDN kernel asserts fp16/bf16 q/k/v
DECODE_K = 128  # decode/MTP kernels tile K as one 128-wide tile per warp (TILE_K = 128, K // vec_size == 32)


def capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def sm(cc: tuple[int, int]) -> str:
    return f"SM{cc[0]}{cc[1]}"


def accepted(fn: Callable[..., Any], **pins: Any) -> dict[str, Any]:
    """The pins among ``pins`` that ``fn`` takes: older releases lack some (``backend=``, ``max_seqlen=``).

    The caller records which were passed in ``Prepared.path``, so a row says what was pinned.
    """
    params = inspect.signature(fn).parameters
    return {name: value for name, value in pins.items() if name in params}


def describe(pins: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in pins.items()) or "no version-dependent pins taken by this release"


def decode_envelope(name: str, case: Case, device: torch.device, *, v_multiple: int) -> str | None:
    """The decode kernels' limits: SM90+, K=128, bf16 pools K=V=128, fp32 pools V>=128 in V tiles."""
    cc = capability(device)
    if cc < (9, 0):
        return f"{name}: needs SM90 or newer, this GPU is {sm(cc)}"
    if case.K != DECODE_K:
        return f"{name}: K=128 only, case has K={case.K}"
    if case.state_dtype == "bf16" and case.V != 128:
        return f"{name}: bf16 state pools need K=V=128, case has V={case.V}"
    if case.V < 128 or case.V % v_multiple:
        return f"{name}: fp32 state pools need V >= 128 and a multiple of {v_multiple}, case has V={case.V}"
    return None


def fused_gating(p: Problem) -> dict[str, torch.Tensor]:
    """Raw gating inputs as the fused decode kernels take them (g and beta are computed in-kernel)."""
    return {"A_log": p.A_log, "a": p.a, "dt_bias": p.dt_bias, "b": p.b}

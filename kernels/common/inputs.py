"""Argument checks shared by the bundled kernels' launchers, in the canonical conventions (docs/design.md,
"Conventions")."""

from __future__ import annotations

import torch
from torch import Tensor

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_inputs(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor | None, a: Tensor | None,
                 b: Tensor | None, A_log: Tensor | None, dt_bias: Tensor | None, *,
                 head_dim_limit: str) -> tuple[int, int, int, int, int, int]:
    """Validate q, k [B, T, H, K] and v [B, T, HV, V] (one dtype, HV a multiple of H, head dims up to
    256: ``head_dim_limit`` says why) and the gating: g, beta [B, T, HV], or raw a, b [B, T, HV] with
    A_log, dt_bias [HV] and no g, beta. Returns (B, T, H, K, HV, V)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if k.shape != q.shape or v.shape[:2] != (B, T) or HV % H:
        raise ValueError(f"bad shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if max(K, V) > 256:
        raise ValueError(f"head dims up to 256 ({head_dim_limit}), got K={K}, V={V}")
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one of bf16/fp16/fp32, got {q.dtype}, {k.dtype}, {v.dtype}")
    if a is not None:
        if b is None or A_log is None or dt_bias is None or g is not None or beta is not None:
            raise ValueError("raw gating takes a, b, A_log and dt_bias (and no g, beta)")
        if a.shape != (B, T, HV) or b.shape != (B, T, HV) or A_log.shape != (HV,) or dt_bias.shape != (HV,):
            raise ValueError("a, b must be [B, T, HV] and A_log, dt_bias [HV]")
    elif g is None or beta is None or g.shape != (B, T, HV) or beta.shape != (B, T, HV):
        raise ValueError("g and beta [B, T, HV] are required (or a, b, A_log, dt_bias for raw gating)")
    return B, T, H, K, HV, V


def output_buffer(out: Tensor | None, q: Tensor, B: int, T: int, HV: int, V: int) -> Tensor:
    """``out`` checked as the o [B, T, HV, V] of q's dtype (contiguous), or a new one."""
    if out is None:
        return torch.empty(B, T, HV, V, dtype=q.dtype, device=q.device)
    if out.shape != (B, T, HV, V) or out.dtype != q.dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous [B, T, HV, V] tensor of dtype {q.dtype}")
    return out

"""Conversions between the canonical tensors and the conventions of third-party libraries.

Every adapter converts in one place, here, outside the timed region (DESIGN.md section 2 and
shared/reference/backends.md section 11): 3-D token-major layouts, cu_seqlens dtypes, log g vs
linear alpha, K-first vs V-first states, GVA head expansion, in-place state pools, raw gating.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from gdnbench.problem import Problem
from gdnbench.reference import gate_from_raw


def flat_tokens(x: Tensor) -> Tensor:
    """[B, T, ...] -> [B*T, ...]: the 3-D, token-major layout of FlashInfer / cuDNN / MAX."""
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:]).contiguous()


def unflat_tokens(x: Tensor, B: int, T: int) -> Tensor:
    """[B*T, ...] -> [B, T, ...]."""
    return x.reshape(B, T, *x.shape[1:])


def cu_seqlens(p: Problem, dtype: torch.dtype = torch.int64) -> Tensor:
    """Sequence boundaries of the packed tokens; a padded batch is B sequences of T tokens."""
    if p.cu_seqlens is not None:
        return p.cu_seqlens.to(dtype)
    B, T = p.q.shape[:2]
    return torch.arange(0, (B + 1) * T, T, dtype=dtype, device=p.device)


def swap_kv(state: Tensor) -> Tensor:
    """K-first [..., K, V] <-> V-first [..., V, K] (the transpose is its own inverse)."""
    return state.transpose(-1, -2).contiguous()


def repeat_heads(x: Tensor, HV: int) -> Tensor:
    """q/k [B, T, H, K] -> [B, T, HV, K] for libraries without GVA (value head h reads h // (HV // H))."""
    H = x.shape[2]
    return x if H == HV else x.repeat_interleave(HV // H, dim=2)


def alpha(g: Tensor) -> Tensor:
    """Linear decay alpha = exp(g) (FlashInfer prefill, MAX), fp32."""
    return g.float().exp()


GateFn = Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


def gating(p: Problem, library_gate: GateFn | None = None) -> Callable[[], tuple[Tensor, Tensor]]:
    """What an unfused backend runs to get (g, beta), to be called inside its timed region.

    ``gating: pre`` cases hand over the canonical g and beta (no work). ``gating: raw`` cases compute
    them from a, b, A_log, dt_bias, with the library's own gating function when it has one
    (``library_gate(a, b, A_log, dt_bias) -> (g, beta)``), else in PyTorch: either way the step is
    timed, so fused and unfused kernels are compared on the same work.
    """
    if p.case.gating == "pre":
        return lambda: (p.g, p.beta)
    gate = library_gate or gate_from_raw
    return lambda: gate(p.a, p.b, p.A_log, p.dt_bias)


class WorkingPool:
    """A library-layout copy of the decode pool that the kernel updates in place.

    ``reset()`` restores it from a pristine copy (converted once, outside the timed region) so that
    every sample starts from the same state; ``canonical()`` converts it back for the check.
    """

    def __init__(self, p: Problem, v_first: bool = False, dtype: torch.dtype | None = None,
                 extra_slots: int = 0) -> None:
        assert p.state_pool is not None, "not a decode problem"
        pool = swap_kv(p.state_pool) if v_first else p.state_pool
        pool = pool.to(dtype or pool.dtype)
        if extra_slots:  # e.g. a sacrificial null slot for libraries whose padding index aliases one
            pool = torch.cat([pool, pool.new_zeros(extra_slots, *pool.shape[1:])])
        self.v_first, self.extra, self.dtype = v_first, extra_slots, p.state_pool.dtype
        self.pristine = pool.contiguous()
        self.pool = self.pristine.clone()

    def reset(self) -> None:
        self.pool.copy_(self.pristine)

    def canonical(self) -> Tensor:
        pool = self.pool[: self.pool.shape[0] - self.extra] if self.extra else self.pool
        pool = swap_kv(pool) if self.v_first else pool
        return pool.to(self.dtype)

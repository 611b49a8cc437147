"""Shared by the two pure-PyTorch reference backends and by the correctness gate."""

from __future__ import annotations

from collections.abc import Callable

import torch

from gdnbench import reference
from gdnbench.backends.base import Outputs, Prepared
from gdnbench.problem import Problem

ALGORITHMS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor | None]]] = {
    "recurrent": reference.gdn_recurrent,
    "chunk": reference.gdn_chunk,
}


def solve(p: Problem, algorithm: str, compute_dtype: torch.dtype, *, state_pool: torch.Tensor | None = None,
          g: torch.Tensor | None = None, beta: torch.Tensor | None = None) -> Outputs:
    """Run a reference algorithm on a problem. Decode writes into ``state_pool`` (default: a copy)."""
    fn = ALGORITHMS[algorithm]
    common = dict(scale=p.scale, qk_l2norm=p.qk_l2norm_in_kernel, compute_dtype=compute_dtype)
    g = p.g if g is None else g
    beta = p.beta if beta is None else beta
    if p.case.op == "decode":
        pool = p.fresh_pool() if state_pool is None else state_pool
        o = reference.gdn_decode(fn, p.q, p.k, p.v, g, beta, state_pool=pool, slot_idx=p.slot_idx, **common)
        return Outputs(o=o, state_pool=pool)
    o, final = fn(p.q, p.k, p.v, g, beta, initial_state=p.initial_state, cu_seqlens=p.cu_seqlens,
                  output_final_state=p.case.output_final_state, **common)
    return Outputs(o=o, final_state=final)


def prepare(p: Problem, algorithm: str) -> Prepared:
    """The reference as a timed backend: fp32 compute, gating from raw inputs inside the call."""
    pool = p.fresh_pool() if p.case.op == "decode" else None
    result: dict[str, Outputs] = {}

    def call() -> None:
        g, beta = (reference.gate_from_raw(p.a, p.b, p.A_log, p.dt_bias) if p.case.gating == "raw"
                   else (p.g, p.beta))
        result["out"] = solve(p, algorithm, torch.float32, state_pool=pool, g=g, beta=beta)

    reset = (lambda: pool.copy_(p.state_pool)) if pool is not None else None
    return Prepared(call=call, outputs=lambda: result["out"], reset=reset, path=f"torch {algorithm} fp32")

"""Shared by the two pure-PyTorch reference backends and by the correctness gate."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gdnbench import reference
from gdnbench.backends.base import Outputs, Prepared
from gdnbench.problem import Problem

ALGORITHMS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor | None]]] = {
    "recurrent": reference.gdn_recurrent,
    "chunk": reference.gdn_chunk,
}


def layouts(p: Problem) -> dict[str, Any]:
    """Host-side index work done once, so that a timed call has no host syncs (graph-capturable)."""
    if p.case.op == "decode":
        return {"slot_idx": reference.SlotLayout(p.slot_idx, p.state_pool.shape[0], p.num_accepted_tokens)}
    if p.cu_seqlens is not None:
        return {"cu_seqlens": reference.VarlenLayout.build(p.cu_seqlens, p.q.shape[1])}
    return {}


def solve(p: Problem, algorithm: str, compute_dtype: torch.dtype, *, state_pool: torch.Tensor | None = None,
          g: torch.Tensor | None = None, beta: torch.Tensor | None = None,
          layout: dict[str, Any] | None = None) -> Outputs:
    """Run a reference algorithm on a problem. Decode writes into ``state_pool`` (default: a copy)."""
    fn = ALGORITHMS[algorithm]
    layout = layouts(p) if layout is None else layout
    common = dict(scale=p.scale, qk_l2norm=p.qk_l2norm_in_kernel, compute_dtype=compute_dtype)
    g = p.g if g is None else g
    beta = p.beta if beta is None else beta
    if p.case.op == "decode":
        pool = p.fresh_pool() if state_pool is None else state_pool
        o = reference.gdn_decode(fn, p.q, p.k, p.v, g, beta, state_pool=pool, slot_idx=layout["slot_idx"],
                                 **common)
        return Outputs(o=o, state_pool=pool)
    o, final = fn(p.q, p.k, p.v, g, beta, initial_state=p.initial_state, cu_seqlens=layout.get("cu_seqlens"),
                  output_final_state=p.case.output_final_state, **common)
    return Outputs(o=o, final_state=final)


def prepare(p: Problem, algorithm: str) -> Prepared:
    """The reference as a timed backend: fp32 compute, gating from raw inputs inside the call."""
    pool = p.fresh_pool() if p.case.op == "decode" else None
    layout = layouts(p)
    result: dict[str, Outputs] = {}

    def call() -> None:
        g, beta = (reference.gate_from_raw(p.a, p.b, p.A_log, p.dt_bias) if p.case.gating == "raw"
                   else (p.g, p.beta))
        result["out"] = solve(p, algorithm, torch.float32, state_pool=pool, g=g, beta=beta, layout=layout)

    reset = (lambda: pool.copy_(p.state_pool)) if pool is not None else None
    return Prepared(call=call, outputs=lambda: result["out"], reset=reset, path=f"torch {algorithm} fp32")

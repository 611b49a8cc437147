"""sglang.recurrent: SGLang's decode kernels, in place on a V-first state pool (-1 = padding).

``gating: raw`` runs ``fused_sigmoid_gating_delta_rule_update`` (what SGLang's Triton GDN backend
calls for decode: gating fused, pool read at the start and written once at the end, PDL on SM90+).
``gating: pre`` runs ``fused_recurrent_gated_delta_rule_update`` from SGLang's vendored FLA, the
pool-indexed variant of FLA's fused_recurrent (so no gather/scatter around it).
"""

from __future__ import annotations

import torch

from gdnbench.backends.base import Outputs, Prepared, backend
from gdnbench.backends.convert import StatePool
from gdnbench.backends.serving_common import zero_padding_rows
from gdnbench.problem import Problem

_SIGMOID = "sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent"
_RECURRENT = "sglang.kernels.ops.attention.fla.fused_recurrent"


@backend("sglang.recurrent", triton=True, ops={"decode"}, gating={"pre", "raw"}, requires=(_SIGMOID, _RECURRENT),
         package="sglang")
def sglang_recurrent(p: Problem) -> Prepared:
    """SGLang's decode (fused sigmoid-gating / pool-indexed fused_recurrent), in place on a V-first pool."""
    from sglang.kernels.ops.attention.fla.fused_recurrent import fused_recurrent_gated_delta_rule_update
    from sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent import (
        fused_sigmoid_gating_delta_rule_update,
    )

    pool = StatePool(p.state_pool, v_first=True, slots=p.slot_idx)
    common = dict(q=p.q, k=p.k, v=p.v, scale=p.scale, initial_state_source=pool.pool,
                  initial_state_indices=p.slot_idx, use_qk_l2norm_in_kernel=p.qk_l2norm_in_kernel)
    if p.case.gating == "raw":
        fn = fused_sigmoid_gating_delta_rule_update
        extra = dict(A_log=p.A_log, a=p.a, b=p.b, dt_bias=p.dt_bias, softplus_beta=1.0, softplus_threshold=20.0)
    else:
        fn = fused_recurrent_gated_delta_rule_update
        extra = dict(g=p.g, beta=p.beta)
    result: dict[str, torch.Tensor] = {}

    def call() -> None:
        result["o"] = fn(**common, **extra)

    def outputs() -> Outputs:
        # padding rows (slot -1) start from a zero state and still produce an output in SGLang
        o = zero_padding_rows(result["o"], p.slot_idx).to(p.v.dtype)
        return Outputs(o=o, state_pool=pool.canonical())

    path = f"sglang triton {fn.__name__} (in place on a V-first pool, slot -1 = padding)"
    return Prepared(call=call, outputs=outputs, reset=pool.reset, path=path)

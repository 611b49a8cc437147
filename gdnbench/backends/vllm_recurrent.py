"""vllm.recurrent: the decode kernels of vLLM's vendored FLA ops, in place on a V-first state pool.

``gating: pre`` runs ``fused_recurrent_gated_delta_rule``; ``gating: raw`` runs
``fused_sigmoid_gating_delta_rule_update``, which fuses g = -exp(A_log) * softplus(a + dt_bias) and
beta = sigmoid(b). Both read pool[ssm_state_indices[n, 0]] and write the state after token t to
pool[ssm_state_indices[n, t]] (inplace_final_state=True). vLLM reserves slot 0 (an index <= 0 is
NULL_BLOCK_ID), so the working pool has a sacrificial slot in front and canonical slot s is s + 1.
"""

from __future__ import annotations

import torch

from gdnbench.backends.base import Outputs, Prepared, backend
from gdnbench.backends.convert import StatePool
from gdnbench.backends.serving_common import (
    require_v_first,
    vllm_ops,
    vllm_state_indices,
    vllm_unavailable,
    zero_padding_rows,
)
from gdnbench.problem import Problem
from gdnbench.suite import Case


def _check(case: Case, device: torch.device) -> str | None:
    return vllm_unavailable("vllm.recurrent")


@backend("vllm.recurrent", triton=True, ops={"decode"}, gating={"pre", "raw"}, requires=("vllm",), package="vllm",
         check=_check)
def vllm_recurrent(p: Problem) -> Prepared:
    """vLLM's vendored FLA decode (fused_recurrent / fused_sigmoid_gating), in place on a V-first pool."""
    ops = vllm_ops()
    T = p.q.shape[1]
    pool = StatePool(p.state_pool, v_first=True, null_slots=1, slots=p.slot_idx)
    common = dict(q=p.q, k=p.k, v=p.v, scale=p.scale, initial_state=pool.pool, inplace_final_state=True,
                  ssm_state_indices=vllm_state_indices(p.slot_idx, T),
                  use_qk_l2norm_in_kernel=p.qk_l2norm_in_kernel)
    if p.case.gating == "raw":
        fn = ops.fused_sigmoid_gating_delta_rule_update
        # beta/threshold here are softplus parameters, not the delta-rule beta.
        extra = dict(A_log=p.A_log, a=p.a, b=p.b, dt_bias=p.dt_bias, beta=1.0, threshold=20.0)
    else:
        fn = ops.fused_recurrent_gated_delta_rule
        extra = dict(g=p.g, beta=p.beta)
    require_v_first(fn)
    result: dict[str, torch.Tensor] = {}

    def call() -> None:
        result["o"] = fn(**common, **extra)[0]

    def outputs() -> Outputs:
        o = zero_padding_rows(result["o"], p.slot_idx).to(p.v.dtype)
        return Outputs(o=o, state_pool=pool.canonical())

    indices = "ssm_state_indices [N]" if T == 1 else "per-token ssm_state_indices [N, T], state written every token"
    path = (f"vllm vendored FLA triton {fn.__name__} ({ops.__name__}); in place on a V-first pool, "
            f"slot s at s+1 (slot 0 reserved); {indices}")
    return Prepared(call=call, outputs=outputs, reset=pool.reset, path=path)

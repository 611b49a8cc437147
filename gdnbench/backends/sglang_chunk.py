"""sglang.chunk: SGLang's chunked prefill (its vendored FLA, Triton), through a V-first state pool.

SGLang's ``chunk_gated_delta_rule`` returns ``(o, None, h)`` and no final state: it reads the initial
state from ``initial_state[initial_state_indices[n]]`` and writes the final state back there
(``inplace_update``). So the adapter keeps a pool of N fp32 slots holding the initial states (zeros
when the case has none), passes indices 0..N-1, reads the final states back from the pool, and
restores the pool before every call.
"""

from __future__ import annotations

import torch

from gdnbench.backends.base import Outputs, Prepared, backend
from gdnbench.backends.convert import gating
from gdnbench.backends.convert import StatePool, initial_states
from gdnbench.backends.serving_common import token_gate
from gdnbench.problem import Problem
from gdnbench.suite import Case

_CHUNK = "sglang.kernels.ops.attention.fla.chunk"
_GATE = "sglang.kernels.ops.attention.linear.fused_gdn_gating"


def _check(case: Case, device: torch.device) -> str | None:
    if case.K > 256:  # chunk_gated_delta_rule_fwd_h asserts it; V has no such limit
        return f"sglang.chunk: K <= 256 only, case has K={case.K}"
    return None


@backend("sglang.chunk", triton=True, ops={"prefill"}, dtypes={"bf16", "fp16"}, gating={"pre", "raw"},
         requires=(_CHUNK, _GATE), package="sglang", check=_check)
def sglang_chunk(p: Problem) -> Prepared:
    """SGLang's chunk_gated_delta_rule (vendored FLA, Triton), in place on a V-first state pool."""
    from sglang.kernels.ops.attention.fla.chunk import chunk_gated_delta_rule
    from sglang.kernels.ops.attention.linear.fused_gdn_gating import fused_gdn_gating

    pool = StatePool(initial_states(p), v_first=True, dtype=torch.float32)
    indices = torch.arange(p.case.N, dtype=torch.int32, device=p.device)
    gate = gating(p, token_gate(fused_gdn_gating))
    result: dict[str, torch.Tensor] = {}

    def call() -> None:
        g, beta = gate()
        result["o"] = chunk_gated_delta_rule(
            q=p.q, k=p.k, v=p.v, g=g, beta=beta, scale=p.scale,
            initial_state=pool.pool, initial_state_indices=indices, cu_seqlens=p.cu_seqlens,
            use_qk_l2norm_in_kernel=p.qk_l2norm_in_kernel,
            inplace_update=p.case.output_final_state,
        )[0]

    def outputs() -> Outputs:
        final = pool.canonical() if p.case.output_final_state else None
        return Outputs(o=result["o"], final_state=final)

    path = ("sglang vendored FLA triton chunk (pool-indexed, final state read back from an fp32 V-first pool "
            "of N slots; chunk tables from sglang's tensor cache)")
    if p.case.gating == "raw":
        path += "; gating by sglang fused_gdn_gating"
    return Prepared(call=call, outputs=outputs, reset=pool.reset, path=path)

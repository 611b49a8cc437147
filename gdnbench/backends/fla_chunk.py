"""fla.chunk: FLA's Triton chunked prefill (fla.ops.gated_delta_rule.chunk_gated_delta_rule).

FLA 0.6.0 routes K=V=128 fp16/bf16 calls to FlashQLA when flash_qla is installed; that redirection is
switched off per call (see fla_common.NO_REDIRECT), so this backend always measures FLA's own kernels.
"""

from __future__ import annotations

from typing import Any

from gdnbench.backends.base import Outputs, Prepared, backend
from gdnbench.backends.fla_common import NO_REDIRECT, dispatch_note, fla_kwargs, gating_note, pinned_env
from gdnbench.problem import Problem

CHUNK_SIZE = 64  # FLA's default; the precomputed chunk_indices must match it


# The Triton chunk kernels query the GPU driver ("0 active drivers" on a CPU, even under
# TRITON_INTERPRET=1), so CUDA only. chunk_gated_delta_rule_fwd_h asserts K <= 256.
@backend("fla.chunk", triton=True, ops={"prefill"}, devices={"cuda"}, max_head_dim=256, gating={"pre", "raw"},
         requires=("fla.ops.gated_delta_rule",), package="fla-core")
def fla_chunk(p: Problem) -> Prepared:
    """FLA Triton chunk_gated_delta_rule (FlashQLA dispatch off; raw gating fused)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    kw: dict[str, Any] = fla_kwargs(p)
    kw.update(initial_state=p.initial_state, output_final_state=p.case.output_final_state, cu_seqlens=p.cu_seqlens,
              chunk_size=CHUNK_SIZE)
    notes = ""
    if p.cu_seqlens is not None:
        # Without chunk_indices FLA derives them from cu_seqlens on the host in the call (a sync that
        # breaks CUDA-graph capture); serving engines precompute them once per batch, as here.
        from fla.ops.utils import prepare_chunk_indices

        kw["chunk_indices"] = prepare_chunk_indices(p.cu_seqlens, CHUNK_SIZE, cu_seqlens_cpu=p.cu_seqlens.cpu())
        notes = "; chunk_indices precomputed"
    out: dict[str, Any] = {}

    def call() -> None:
        with pinned_env(NO_REDIRECT):
            out["o"], out["state"] = chunk_gated_delta_rule(**kw)

    return Prepared(call=call, outputs=lambda: Outputs(o=out["o"], final_state=out["state"]),
                    path=f"fla triton chunk C={CHUNK_SIZE}; {dispatch_note()}{notes}{gating_note(p)}")

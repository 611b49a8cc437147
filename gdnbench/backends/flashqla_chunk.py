"""flashqla.chunk: FlashQLA's TileLang chunked prefill (flash_qla.chunk_gated_delta_rule).

K = V = 128, fp16/bf16, SM90 / SM100 / SM103 / SM120 / SM121 only; ``import flash_qla`` itself raises
on other GPUs or without one, which makes the backend unavailable with that reason. FlashQLA has no
gating options, so ``gating: raw`` cases run FLA's gating kernels (PyTorch without FLA) in the call.
"""

from __future__ import annotations

from typing import Any

import torch

from gdnbench.backends import convert
from gdnbench.backends.base import Outputs, Prepared, backend
from gdnbench.backends.fla_common import fla_gate
from gdnbench.problem import Problem
from gdnbench.suite import Case

# The library default, pinned so a change of default cannot change what is measured: with B = 1
# (varlen, or one dense sequence) FlashQLA may split sequences across SMs (intra-card context
# parallelism), which is how it is meant to serve long prefills.
AUTO_CP = True


def _check(case: Case, device: torch.device) -> str | None:
    major, minor = torch.cuda.get_device_capability(device)
    if major == 12 and case.dtype == "fp16":
        # FLA 0.6.0 routes these away from FlashQLA for the same reason
        return f"flashqla.chunk: the SM{major}{minor} forward kernel does not compile for fp16 (bf16 only)"
    return None


@backend("flashqla.chunk", ops={"prefill"}, devices={"cuda"}, dtypes={"bf16", "fp16"}, head_dims={128},
         gating={"pre", "raw"}, archs={(9, 0), (10, 0), (10, 3), (12, 0), (12, 1)}, requires=("flash_qla",),
         package="flash-qla", check=_check)
def flashqla_chunk(p: Problem) -> Prepared:
    """FlashQLA (TileLang) chunk_gated_delta_rule, auto_cp=True (K=V=128)."""
    import flash_qla

    gate = fla_gate() if p.case.gating == "raw" else None
    gating = convert.gating(p, gate)
    kw: dict[str, Any] = dict(q=p.q, k=p.k, v=p.v, scale=p.scale, initial_state=p.initial_state,
                              output_final_state=p.case.output_final_state,
                              use_qk_l2norm_in_kernel=p.qk_l2norm_in_kernel, cu_seqlens=p.cu_seqlens,
                              state_v_first=False, auto_cp=AUTO_CP)
    out: dict[str, Any] = {}

    def call() -> None:
        g, beta = gating()
        out["o"], out["state"] = flash_qla.chunk_gated_delta_rule(g=g, beta=beta, **kw)

    path = f"flash_qla tilelang chunk; auto_cp={AUTO_CP}"
    if p.case.gating == "raw":
        path += "; raw gating in the call by " + ("fla fused_gdn_gate + fused_beta_sigmoid" if gate else "torch")
    return Prepared(call=call, outputs=lambda: Outputs(o=out["o"], final_state=out["state"]), path=path)

"""flashinfer.decode: FlashInfer's T=1 GDN decode (``flashinfer.gdn_decode.gated_delta_rule_decode_pretranspose``).

The kernel always fuses gating (it takes raw a, b, A_log, dt_bias), so only ``gating: raw`` cases run.
Pool mode: ``initial_state`` is a V-first pool [S, HV, V, K] read at ``initial_state_indices`` and written
back in place to the same slots (``output_state_indices=None``). An fp32 pool runs the "pretranspose"
kernel, a bf16 pool the bf16-state kernel. ``backend="flashinfer"`` pins the generic kernels (``"auto"``
may pick the opt-in Cake kernels or, on SM107, a Rubin-tuned one).

Padding index -1 means "skip" on the fp32 path but aliases slot 0 on the bf16 path; canonical slot_idx
is never negative, so no sacrificial slot (``StatePool(null_slots=1)``) is needed yet.
"""

from __future__ import annotations

import torch

from gdnbench.backends import convert
from gdnbench.backends.base import Outputs, Prepared, backend
from gdnbench.backends.flashinfer_common import DTYPES, PACKAGE, accepted, decode_envelope, describe, fused_gating
from gdnbench.problem import Problem
from gdnbench.suite import Case


def _check(case: Case, device: torch.device) -> str | None:
    if case.T != 1:
        return f"flashinfer.decode: T=1 only, case has T={case.T} (T>1 is flashinfer.mtp)"
    # the fp32 pretranspose kernel walks V in tiles of 8 (TILE_V)
    return decode_envelope("flashinfer.decode", case, device, v_multiple=8)


@backend("flashinfer.decode", ops={"decode"}, dtypes=DTYPES, gating={"raw"},
         requires=("flashinfer.gdn_decode",), package=PACKAGE, check=_check)
def flashinfer_decode(p: Problem) -> Prepared:
    """FlashInfer T=1 decode on a V-first pool, gating fused (gating: raw only; K=128; SM90+)."""
    from flashinfer.gdn_decode import gated_delta_rule_decode_pretranspose

    pool = convert.StatePool(p.state_pool, v_first=True, slots=p.slot_idx)
    pins = accepted(gated_delta_rule_decode_pretranspose, backend="flashinfer")
    gates = fused_gating(p)
    result: dict[str, torch.Tensor] = {}

    def call() -> None:
        result["o"], _ = gated_delta_rule_decode_pretranspose(
            q=p.q, k=p.k, v=p.v, state=None, **gates, scale=p.scale, use_qk_l2norm=p.qk_l2norm_in_kernel,
            initial_state=pool.pool, initial_state_indices=p.slot_idx, output_state_indices=None, **pins)

    kernel = "bf16-state kernel" if p.case.state_dtype == "bf16" else "fp32 pretranspose kernel"
    return Prepared(call, lambda: Outputs(o=result["o"], state_pool=pool.canonical()), reset=pool.reset,
                    path=f"flashinfer gated_delta_rule_decode_pretranspose, {kernel}, V-first pool in place; "
                         f"{describe(pins)}; use_qk_l2norm={p.qk_l2norm_in_kernel}")

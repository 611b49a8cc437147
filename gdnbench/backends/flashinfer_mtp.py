"""flashinfer.mtp: FlashInfer's multi-token GDN decode (speculative verify), for decode cases with T >= 2.

Canonical semantics of such a case: sequence b runs its T tokens from pool[slot_idx[b]], every token gets
an output, and the state after the last token is written back to pool[slot_idx[b]]. FlashInfer expresses
exactly that with ``initial_state_indices=slot_idx`` (read and write slot), ``disable_state_update=False``
(its default is still True, with a deprecation warning, so it is passed) and neither of the per-token
caches: ``ssm_state_indices`` [B, T] would scatter every intermediate state h_1..h_T into the pool (T
writes where the canonical case has one) and ``intermediate_states_buffer`` would add a dense
[B, T, HV, V, K] snapshot write; both serve rollback, which the canonical case does not model.

``gated_delta_rule_mtp`` takes fp32 pools only; its docstring sends bf16 pools (K=V=128) to
``gated_delta_rule_decode_pretranspose``, which dispatches T > 1 to the bf16-state MTP kernel with the
same semantics. The row's path names the entry point that ran.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gdnbench.backends import convert
from gdnbench.backends.base import Outputs, Prepared, backend
from gdnbench.backends.flashinfer_common import DTYPES, PACKAGE, accepted, decode_envelope, describe, fused_gating
from gdnbench.problem import Problem
from gdnbench.suite import Case


def _check(case: Case, device: torch.device) -> str | None:
    if case.T < 2:
        return f"flashinfer.mtp: T >= 2 only, case has T={case.T} (T=1 is flashinfer.decode)"
    # the fp32 MTP kernel picks V tiles of 8..64 by batch size (get_mtp_config); V must divide all of them
    return decode_envelope("flashinfer.mtp", case, device, v_multiple=64)


@backend("flashinfer.mtp", ops={"decode"}, dtypes=DTYPES, gating={"raw"},
         requires=("flashinfer.gdn_decode",), package=PACKAGE, check=_check)
def flashinfer_mtp(p: Problem) -> Prepared:
    """FlashInfer multi-token (spec-verify) decode, T>=2, gating fused (gating: raw only; K=128; SM90+)."""
    from flashinfer.gdn_decode import gated_delta_rule_decode_pretranspose, gated_delta_rule_mtp

    pool = convert.StatePool(p.state_pool, v_first=True, slots=p.slot_idx)
    common = dict(q=p.q, k=p.k, v=p.v, **fused_gating(p), scale=p.scale, use_qk_l2norm=p.qk_l2norm_in_kernel,
                  initial_state=pool.pool, initial_state_indices=p.slot_idx, output_state_indices=None,
                  intermediate_states_buffer=None, disable_state_update=False)
    fn: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    extra: dict[str, None]
    if p.case.state_dtype == "fp32":
        fn, entry, extra = gated_delta_rule_mtp, "gated_delta_rule_mtp (fp32 pool)", {}
        pins = accepted(fn, ssm_state_indices=None)
    else:
        fn, extra = gated_delta_rule_decode_pretranspose, {"state": None}
        entry = "gated_delta_rule_decode_pretranspose -> bf16-state MTP kernel"
        pins = accepted(fn, backend="flashinfer")
    result: dict[str, torch.Tensor] = {}

    def call() -> None:
        result["o"], _ = fn(**common, **extra, **pins)

    return Prepared(call, lambda: Outputs(o=result["o"], state_pool=pool.canonical()), reset=pool.reset,
                    path=f"flashinfer {entry}, V-first pool in place, final state to the read slot; "
                         f"disable_state_update=False, no intermediate-state caches; {describe(pins)}; "
                         f"use_qk_l2norm={p.qk_l2norm_in_kernel}")

"""fla.recurrent: FLA's fused recurrent kernel (fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule).

Serves decode (T tokens per sequence on a state pool) and recurrent prefill. FLA has no pool API, so
decode gathers the slots into initial_state and scatters the final state back, inside the timed call.
Not dispatched by FLA (no FlashQLA redirection to switch off). Runs on a CPU in Triton's interpreter.
"""

from __future__ import annotations

from typing import Any

from gdnbench.backends.base import Outputs, Prepared, backend
from gdnbench.backends.convert import GATHER_NOTE, GatheredPool
from gdnbench.backends.fla_common import fla_kwargs, gating_note
from gdnbench.problem import Problem


@backend("fla.recurrent", triton=True, ops={"prefill", "decode"}, devices={"cpu", "cuda"}, gating={"pre", "raw"},
         requires=("fla.ops.gated_delta_rule",), package="fla-core")
def fla_recurrent(p: Problem) -> Prepared:
    """FLA Triton fused_recurrent_gated_delta_rule (decode via gather/scatter; raw gating fused)."""
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    kw: dict[str, Any] = fla_kwargs(p)
    out: dict[str, Any] = {}
    path = "fla triton fused_recurrent" + gating_note(p)

    if p.case.op == "decode":
        pool = GatheredPool(p)

        def call() -> None:
            o, final = fused_recurrent_gated_delta_rule(**kw, initial_state=pool.gather(), output_final_state=True)
            pool.scatter(final)
            out["o"] = o

        return Prepared(call=call, outputs=lambda: Outputs(o=out["o"], state_pool=pool.canonical()),
                        reset=pool.reset, path=f"{path}; {GATHER_NOTE}")

    kw.update(initial_state=p.initial_state, output_final_state=p.case.output_final_state, cu_seqlens=p.cu_seqlens)

    def prefill() -> None:
        out["o"], out["state"] = fused_recurrent_gated_delta_rule(**kw)

    return Prepared(call=prefill, outputs=lambda: Outputs(o=out["o"], final_state=out["state"]), path=path)

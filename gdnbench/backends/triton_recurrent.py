"""triton.recurrent: the bundled fused recurrent Triton kernel (gdnbench_kernels.recurrent).

Serves decode (T tokens per sequence on a state pool, updated in place at slot_idx: no gather or
scatter) and recurrent prefill (initial_state / final_state, padded or varlen). Raw gating, q/k L2
normalisation and GVA happen inside the kernel. Runs on a CPU in Triton's interpreter.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from gdnbench.backends.base import Outputs, Prepared, backend
from gdnbench.backends.convert import StatePool, swap_kv
from gdnbench.problem import Problem
from gdnbench.suite import Case

KERNEL = "gdnbench_kernels.recurrent"
# The kernel's state layout: V-first ([.., V, K], as serving engines keep their pools) puts each token's
# reductions over K inside a warp. Canonical K-first states are converted outside the timed call.
V_FIRST = True


def _check(case: Case, device: torch.device) -> str | None:
    # Triton decides between compiling and interpreting when the kernel module is imported: if that
    # happened before TRITON_INTERPRET=1 was set, the kernel was compiled for a GPU that is not there.
    loaded = sys.modules.get(KERNEL)
    if device.type == "cpu" and loaded is not None and not loaded.INTERPRETED:
        return f"triton.recurrent on cpu: {KERNEL} was imported before TRITON_INTERPRET=1 was set"
    return None


@backend("triton.recurrent", triton=True, ops={"prefill", "decode"}, devices={"cpu", "cuda"}, gating={"pre", "raw"},
         max_head_dim=256, per_token_slots=True, requires=(KERNEL,), package="triton", check=_check)
def triton_recurrent(p: Problem) -> Prepared:
    """Bundled Triton fused recurrent kernel (decode in place on the pool; raw gating fused)."""
    from gdnbench_kernels import recurrent as kern

    case = p.case
    if case.gating == "raw":
        kw: dict[str, Any] = dict(a=p.a, b=p.b, A_log=p.A_log, dt_bias=p.dt_bias)
    else:
        kw = dict(g=p.g, beta=p.beta)
    kw.update(scale=p.scale, cu_seqlens=p.cu_seqlens, qk_l2norm=p.qk_l2norm_in_kernel, v_first=V_FIRST)
    o = torch.empty(*p.v.shape[:3], case.V, dtype=p.q.dtype, device=p.device)  # written by every call
    out: dict[str, Any] = {}
    notes = ["gdnbench triton fused recurrent"]
    if case.gating == "raw":
        notes.append("raw gating fused")
    if p.qk_l2norm_in_kernel:
        notes.append("q/k l2norm in kernel")

    N = p.cu_seqlens.shape[0] - 1 if p.cu_seqlens is not None else p.q.shape[0]
    key = kern.tune_key(case.K, case.V, pool=case.op == "decode", N=N, H=case.H, HV=case.HV,
                        tokens=p.q.shape[0] * p.q.shape[1], per_token=case.per_token_slots, v_first=V_FIRST)
    layout = "V-first" if V_FIRST else "K-first"

    if case.op == "decode":
        # the pool's own dtype, the kernel's layout
        pool = StatePool(p.state_pool, v_first=V_FIRST, slots=p.slot_idx)

        def call() -> None:
            kern.recurrent_gdn(p.q, p.k, p.v, **kw, state_pool=pool.pool, slot_idx=p.slot_idx,
                               num_accepted_tokens=p.num_accepted_tokens, out=o)

        outputs = lambda: Outputs(o=o, state_pool=pool.canonical())  # noqa: E731
        reset = pool.reset
        notes.append(f"{layout} pool {case.state_dtype} in place at slot_idx"
                     + (", a slot per token from num_accepted_tokens" if case.per_token_slots else ""))
    else:
        h0 = p.initial_state
        if h0 is not None and V_FIRST:
            h0 = swap_kv(h0)

        def call() -> None:
            _, out["state"] = kern.recurrent_gdn(p.q, p.k, p.v, **kw, initial_state=h0,
                                                 output_final_state=case.output_final_state, out=o)

        def outputs() -> Outputs:
            state = out.get("state")
            return Outputs(o=o, final_state=swap_kv(state) if state is not None and V_FIRST else state)

        reset = None
        notes.append(f"{layout} state")

    if len(kern.CONFIGS) > 1:  # autotune (or hit its cache) now, untimed, so the row says which config runs
        call()
        if reset is not None:
            reset()
    cfg = kern.best_config(key)
    notes.append(kern.config_str(cfg) + (" (triton interpreter)" if kern.INTERPRETED else ""))
    return Prepared(call=call, outputs=outputs, reset=reset, path="; ".join(notes))

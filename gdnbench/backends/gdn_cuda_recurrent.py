"""gdn_cuda.recurrent: the recurrent decode of kingsleykimm/h100_gdn_cuda (``gdn_cuda.recurrent_forward``).

One SM90 kernel (``sm90_bf16_gdn_recurrent.cuh``) compiled at run time; see gdn_cuda_common for the
JIT's setup and the SM90-only dispatch. Conventions that differ from the canonical ones (read at afe3ded):

- q, k, v, beta, the log decay ``gate`` and the states are all bf16: the launcher hands the gate to the
  kernel as a bf16 pointer without checking its dtype, so g is cast to bf16 in ``prepare``;
- states are V-first [B, HV, V, K] and the call returns a new final state rather than updating one in
  place. The library has no pool API, so the pool is kept V-first in bf16 and, inside the timed call,
  pool[slot_idx] is gathered as the initial state and the final state scattered back (as fla.recurrent
  does). States are bf16 only, so only bf16 pools run: an fp32 pool's untouched slots would not survive
  the round trip bit for bit;
- ``inference_mode`` Prefill and Decode run the same kernel (only SpecVerify differs: it stores a state
  per token); Decode is passed. With ``num_accepted_tokens`` the kernel runs only the first accepted
  tokens of each sequence, which is not the canonical per-token-slot verify, so ``per_token_slots`` is
  not served;
- ``is_qk_norm`` L2-normalises q and k in the kernel;
- K must equal V: q's head dim sets the padding of q, k and v and the state is [D, D]
  (``csrc/apis/gdn_forward.cpp``);
- GVA: value head h reads q/k head h * H // HV, which is h // (HV // H); the library's C++ tests run KH < VH.

The kernel forms the delta from the state before this token's decay, S' = exp(g) S - beta (S k - v) k^T,
where the gated delta rule decays first, S' = exp(g) S - beta (exp(g) S k - v) k^T; the two agree only where
g = 0. On an H200 one decode step matches the first rule (output relative error 0.0015) and misses the second
(0.22; results/records/h200/gdn-cuda-parity/repro_accuracy.py), so its rows FAIL the correctness gate wherever
the decay is not 0 (results/baselines/h200/decode-gdn-cuda).
"""

from __future__ import annotations

from typing import Any

import torch

from gdnbench.backends.base import Outputs, Prepared, backend
from gdnbench.backends.convert import GATHER_NOTE, GatheredPool
from gdnbench.backends.gdn_cuda_common import (ARCHS, DTYPES, PACKAGE, init, jit_note, padding_note, preload_note,
                                              runtime_unavailable)
from gdnbench.problem import Problem
from gdnbench.suite import Case


def _check(case: Case, device: torch.device) -> str | None:
    return runtime_unavailable("gdn_cuda.recurrent")


@backend("gdn_cuda.recurrent", ops={"decode"}, dtypes=DTYPES, state_dtypes=("bf16",), equal_kv=True,
         gating={"pre"}, archs=ARCHS, requires=("gdn_cuda",), package=PACKAGE, check=_check)
def gdn_cuda_recurrent(p: Problem) -> Prepared:
    """h100_gdn_cuda recurrent_forward: SM90 decode kernel, JIT-compiled (bf16 pool, gather/scatter; K = V)."""
    import gdn_cuda

    init()
    pool = GatheredPool(p, v_first=True)
    kw: dict[str, Any] = dict(query=p.q, key=p.k, value=p.v, beta=p.beta, gate=p.g.to(torch.bfloat16),
                              inference_mode=int(gdn_cuda.InferenceMode.Decode),
                              is_qk_norm=p.qk_l2norm_in_kernel, scale=p.scale)
    out: dict[str, torch.Tensor] = {}

    def call() -> None:
        out["o"], final = gdn_cuda.recurrent_forward(initial_state=pool.gather(), **kw)
        pool.scatter(final)

    path = (f"gdn_cuda recurrent_forward (SM90, {jit_note()}{preload_note()}), inference_mode=Decode; "
            f"g cast to bf16 in prepare; is_qk_norm={p.qk_l2norm_in_kernel}; V-first bf16 pool, {GATHER_NOTE}"
            f"{padding_note(p.case.K)}")
    return Prepared(call=call, outputs=lambda: Outputs(o=out["o"], state_pool=pool.canonical()), reset=pool.reset,
                    path=path)

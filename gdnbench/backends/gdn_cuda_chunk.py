"""gdn_cuda.chunk: the chunked prefill of kingsleykimm/h100_gdn_cuda (``gdn_cuda.chunked_forward``).

SM90 CUTLASS kernels (cumsum, W/U, sequential state pass, output pass) compiled at run time; see
gdn_cuda_common for the JIT's setup and the SM90-only dispatch. Conventions that differ from the canonical
ones, converted in ``prepare`` and ``outputs()``, outside the timed call (read at afe3ded):

- padded q/k [B, T, H, K], or varlen 3-D [T_total, H, K] with int32 ``cu_seqlens``, ``chunk_indices``
  (flat (sequence, chunk) pairs), ``cu_chunks`` and the chunk count, all built in ``prepare``;
- ``gate`` is the log decay g in fp32 before its cumsum (``HOST_ASSERT`` on fp32); beta bf16;
- states are bf16 and V-first [N, HV, V, K], the initial one read at that shape in both modes (the
  TMA descriptors of ``sm90_bf16_chunked_seq_state.hpp``, and the initial states of
  ``test/test_cpp/test_gdn_fwd.cpp``; the binding's docstring says [B, num_chunks, ...], which is the
  internal per-chunk buffer), and the final state is always returned;
- no in-kernel q/k L2 norm (on the README's roadmap), so ``qk_l2norm: pre`` only;
- K must equal V: one padding amount, taken from v's head dim, pads q, k and v, and the state is
  [D, D] (``csrc/apis/gdn_forward.cpp``; ``SHAPE_K == SHAPE_V`` and ``<= 256`` are static asserts of
  ``sm90_bf16_chunked_seq_state_update2.cuh``);
- GVA: the kernels read q/k head h // (HV // H) for value head h, as canonical; the library's C++
  end-to-end tests run KH < VH (its Python benchmark only H == HV).

Where it shows in the timing: head dims that are not a multiple of 64 are zero-padded inside the call;
the call allocates its buffers and prints ``aligned_dim`` to stdout every time.
"""

from __future__ import annotations

from typing import Any

import torch

from gdnbench.backends import convert
from gdnbench.backends.base import Outputs, Prepared, backend
from gdnbench.backends.gdn_cuda_common import (ARCHS, DTYPES, PACKAGE, init, jit_note, padding_note, preload_note,
                                              runtime_unavailable)
from gdnbench.problem import Problem
from gdnbench.suite import Case

CHUNK = 64  # the kernels' only chunk size (compute_O's HOST_ASSERT, the state pass's static assert)
MAX_HEAD_DIM = 256  # after padding to a multiple of 64: the state pass's WGMMA static assert


def _check(case: Case, device: torch.device) -> str | None:
    return runtime_unavailable("gdn_cuda.chunk")


@backend("gdn_cuda.chunk", ops={"prefill"}, dtypes=DTYPES, max_head_dim=MAX_HEAD_DIM, equal_kv=True,
         gating={"pre"}, qk_l2norm={"pre"}, archs=ARCHS, requires=("gdn_cuda",), package=PACKAGE, check=_check)
def gdn_cuda_chunk(p: Problem) -> Prepared:
    """h100_gdn_cuda chunked_forward: SM90 CUTLASS kernels JIT-compiled at run time (bf16, K = V <= 256)."""
    import gdn_cuda

    init()
    case = p.case
    B, T = p.q.shape[:2]
    varlen = p.cu_seqlens is not None
    tokens = convert.flat_tokens if varlen else (lambda x: x)  # varlen: 3-D [T_total, heads, D]
    # scale always given: the library's default is 1/sqrt of the padded head dim (compute_O's launcher)
    kw: dict[str, Any] = dict(query=tokens(p.q), key=tokens(p.k), value=tokens(p.v), beta=tokens(p.beta),
                              gate=tokens(p.g), scale=p.scale)
    layout = "padded"
    if varlen:
        chunk_indices, cu_chunks, total = convert.chunk_tables(p.cu_seqlens, CHUNK)
        kw.update(cu_seqlens=p.cu_seqlens.to(torch.int32), chunk_indices=chunk_indices, cu_chunks=cu_chunks,
                  total_chunks=total)
        layout = f"varlen: int32 cu_seqlens, chunk_indices and cu_chunks ({total} chunks) built in prepare"
    if p.initial_state is not None:
        kw["initial_state"] = convert.swap_kv(p.initial_state).to(torch.bfloat16)
    out: dict[str, torch.Tensor] = {}

    def call() -> None:
        out["o"], out["state"] = gdn_cuda.chunked_forward(**kw)

    def outputs() -> Outputs:
        o = convert.unflat_tokens(out["o"], B, T) if varlen else out["o"]
        final = convert.swap_kv(out["state"]).float() if case.output_final_state else None
        return Outputs(o=o, final_state=final)

    initial = "; initial state cast to bf16 V-first in prepare" if p.initial_state is not None else ""
    path = (f"gdn_cuda chunked_forward (SM90 CUTLASS, {jit_note()}{preload_note()}); {layout}; "
            f"log g fp32, beta bf16{initial}; final state bf16 V-first, made K-first fp32 after the call"
            f"{padding_note(case.K)}")
    return Prepared(call=call, outputs=outputs, path=path)

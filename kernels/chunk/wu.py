"""Stage (c) of the multi-kernel pipeline: W = Ai (beta exp(gc) o K) and U = Ai (beta o V) per chunk."""

from __future__ import annotations

import triton
import triton.language as tl

from ..common.device import cast, dot, exp
from .tiles import chunk_bounds, chunk_program, load_qk, load_tile, store_tile


@triton.jit
def _wu_store(b_ai, b_k, b_gc, b_beta, v, W, U, bos, rows, n_tok, i_h, HV: tl.constexpr, K: tl.constexpr,
              V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, FP32: tl.constexpr):
    """W = Ai (beta exp(gc) o K) and U = Ai (beta o V) of one chunk (V in BV-column blocks), stored in
    W's dtype; b_ai: (I + A)^-1 in the dot dtype."""
    b_kb = cast(b_k * (b_beta * exp(b_gc))[:, None], b_ai.dtype)
    store_tile(W + bos * HV * K + i_h * K, rows, n_tok, HV * K, tl.arange(0, BK), K, dot(b_ai, b_kb, FP32))
    for i_v in range(tl.cdiv(V, BV)):
        cols = i_v * BV + tl.arange(0, BV)
        b_vb = load_tile(v + bos * HV * V + i_h * V, rows, n_tok, HV * V, cols, V) * b_beta[:, None]
        b_u = dot(b_ai, cast(b_vb, b_ai.dtype), FP32)
        store_tile(U + bos * HV * V + i_h * V, rows, n_tok, HV * V, cols, V, b_u)


@triton.jit
def wu_kernel(k, v, beta, gc, Ai, W, U, seq_bounds, chunk_indices,
              H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
              BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr, FP32: tl.constexpr):
    i_c, i_h, _ = chunk_program(HV, 1)
    bos, i_t, n_tok = chunk_bounds(seq_bounds, chunk_indices, i_c)
    rows = i_t * BT + tl.arange(0, BT)
    valid = rows < n_tok
    b_ai = load_tile(Ai + bos * HV * BT + i_h * BT, rows, n_tok, HV * BT, tl.arange(0, BT), BT)
    b_k = load_qk(k + bos * H * K + (i_h // (HV // H)) * K, rows, n_tok, H * K, K, BK, L2NORM)
    b_gc = tl.load(gc + (bos + rows) * HV + i_h, mask=valid, other=0.0)
    b_beta = tl.load(beta + (bos + rows) * HV + i_h, mask=valid, other=0.0).to(tl.float32)
    _wu_store(b_ai, b_k, b_gc, b_beta, v, W, U, bos, rows, n_tok, i_h, HV, K, V, BK, BV, FP32)

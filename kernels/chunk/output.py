"""Stage (e): the outputs from q, k, gc, the chunk-entry states h and v_new, per (block of chunks, value head, V-block).

``output_tile`` is also what the state pass computes when the output is fused into it.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from ..common.device import cast, dot, exp
from ..common.ints import cdiv
from ..common.tuning import TunedKernel
from .configs import bv_prune, make_configs
from .launch import Launch, shape_constexprs
from .layout import ChunkLayout, chunk_tier
from .tiles import chunk_bounds, chunk_program, decay_masked, load_qk, load_tile, store_tile


@triton.jit
def output_tile(b_q, b_k, b_gc, b_h, b_v, rows, scale, FP32: tl.constexpr):
    """scale * (exp(gc) o (Q S) + lowerIncl(Gamma o Q K^T) v_new) for one chunk, fp32 [C, BV].

    b_h: the state entering the chunk and b_v: v_new, both in the dot dtype."""
    b_o = dot(b_q, b_h, FP32) * exp(b_gc)[:, None]
    return (b_o + _scores_times_v(b_q, b_k, b_v, b_gc, b_gc, rows, rows, FP32)) * scale


@triton.jit
def _scores_times_v(b_q, b_k, b_v, gc_r, gc_c, rows_r, rows_c, FP32: tl.constexpr):
    """lowerIncl(Gamma o Q K^T) v of the query rows rows_r against the key rows rows_c (Gamma_ij =
    exp(gc_r_i - gc_c_j), both cumulative from one start), fp32 [len(rows_r), BV]. No row bound: the rows
    are the true token indices, so a key past a sequence's end comes after every valid query, and the
    callers do not store the outputs of the queries past it."""
    b_s = decay_masked(dot(b_q, tl.trans(b_k), FP32), gc_r, gc_c, rows_r[:, None] >= rows_c[None, :])
    return dot(cast(b_s, b_v.dtype), b_v, FP32)


# (64, 4, 2) runs with its registers capped at 128: 4 programs per SM instead of 3 (0019).
OUTPUT_CANDIDATES = [(64, 4, 2, 128), (64, 4, 3), (128, 4, 2), (128, 8, 3)]
OUTPUT_CONFIGS = make_configs(OUTPUT_CANDIDATES)


@triton.jit
def _output_fn(q, k, gc, h, v_new, o, seq_bounds, block_indices, scale, chunk_tier,
               H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
               BK: tl.constexpr, SPAN: tl.constexpr, L2NORM: tl.constexpr, FP32: tl.constexpr,
               BV: tl.constexpr):
    # one program per block of SPAN chunks (block_indices: the layout's chunk_indices or pair_indices),
    # value head and V-block; h holds the state entering each block. Chunk j of a block takes the
    # block's state through Q S, and chunks 0..j through their [BT, BT] score blocks, one at a time (a
    # [SPAN * BT]^2 score tile would need 8 warps at SPAN 2); gc restarts at every chunk, so over a block
    # chunk j's rows add the decay of the chunks before it (``carry``).
    i_c, i_h, i_v = chunk_program(HV, (V + BV - 1) // BV)
    bos, i_b, n_tok = chunk_bounds(seq_bounds, block_indices, i_c)
    i_hk = i_h // (HV // H)
    cols_k = tl.arange(0, BK)
    cols_v = i_v * BV + tl.arange(0, BV)
    b_h = load_tile(h + (i_c.to(tl.int64) * HV + i_h) * K * V, cols_k, K, V, cols_v, V)
    carry_j = 0.0
    # rows past the sequence's end re-read its last token, as in the state pass: no row bound on any load
    # or score; as keys the causal mask drops them (a block's earlier chunks are full unless its later
    # ones lie wholly past the end), as queries they are not stored
    for j in range(SPAN):  # a dynamic loop: unrolled, the pair's tiles were all loaded up front (spills)
        rows_j = (i_b * SPAN + j) * BT + tl.arange(0, BT)
        in_j = tl.minimum(rows_j, n_tok - 1)
        b_q = load_qk(q + bos * H * K + i_hk * K, in_j, None, H * K, K, BK, L2NORM)
        gc_j = tl.load(gc + (bos + in_j) * HV + i_h) + carry_j
        b_o = dot(b_q, b_h, FP32) * exp(gc_j)[:, None]
        carry_i = 0.0
        for i in range(j + 1):
            rows_i = (i_b * SPAN + i) * BT + tl.arange(0, BT)
            in_i = tl.minimum(rows_i, n_tok - 1)
            b_k = load_qk(k + bos * H * K + i_hk * K, in_i, None, H * K, K, BK, L2NORM)
            gc_i = tl.load(gc + (bos + in_i) * HV + i_h) + carry_i
            b_v = load_tile(v_new + bos * HV * V + i_h * V, in_i, None, HV * V, cols_v, V)
            b_o += _scores_times_v(b_q, b_k, b_v, gc_j, gc_i, rows_j, rows_i, FP32)
            last = (i_b * SPAN + i) * BT + BT - 1
            carry_i += tl.load(gc + (bos + last) * HV + i_h, mask=last < n_tok, other=0.0)
        store_tile(o + bos * HV * V + i_h * V, rows_j, n_tok, HV * V, cols_v, V, b_o * scale)
        last = (i_b * SPAN + j) * BT + BT - 1
        carry_j += tl.load(gc + (bos + last) * HV + i_h, mask=last < n_tok, other=0.0)


output_kernel = TunedKernel(_output_fn, OUTPUT_CONFIGS, ["K", "V", "SPAN", "chunk_tier"], bv_prune)


OUTPUT_SPAN2_CANDIDATES = [(64, 4, 1), (32, 4, 1), (128, 4, 1), (64, 8, 1)]
output_span2_kernel = TunedKernel(_output_fn, make_configs(OUTPUT_SPAN2_CANDIDATES),
                                   ["K", "V", "SPAN", "chunk_tier"], bv_prune)


def output_kernel_for(span: int) -> TunedKernel:
    """The tuned output pass for blocks of ``span`` chunks."""
    return output_span2_kernel if span == 2 else output_kernel


def output_pass(x: Launch, kernel: TunedKernel, over: ChunkLayout, h: Tensor | None = None) -> None:
    """(e) over the blocks of x.span chunks of ``over``; h as for state_pass."""
    blocks, block_indices, _ = over.blocks(x.span)
    if blocks:
        kernel[lambda meta: (blocks * x.HV * cdiv(x.V, meta["BV"]),)](
            x.q, x.k, x.ws.gc, x.ws.h if h is None else h, x.ws.v_new, x.out, over.seq_bounds, block_indices,
            x.scale, chunk_tier(over.NT, x.HV), SPAN=x.span, **shape_constexprs(x))

"""Chunked gated delta rule (prefill), Triton: the standard multi-kernel chunkwise pipeline.

The algorithm is the one derived in ``gdnbench.reference`` (module docstring): chunks of C = 64
tokens, chunk-local cumulative log decay gc, A = strictLower(diag(beta)(Gamma o K K^T)),
(I + A)^-1, W = (I + A)^-1 diag(beta) (exp(gc) o K), U = (I + A)^-1 diag(beta) V, then a sequential
pass over chunks for the state (v_new = U - W S, S <- exp(gc_C) S + (exp(gc_C - gc) o K)^T v_new)
and a parallel pass for the outputs (O = exp(gc) o (Q S) + lowerIncl(Gamma o Q K^T) v_new, scaled).

One kernel per stage (K K^T and the solve are one, as in FLA 0.6), every other intermediate
round-trips through global memory (as FLA's pipeline does, which is what this variant is measured
against; ``chunk_fused`` removes the round trips):

  (a) ``_chunk_gate_kernel``   per (chunk, value head): gc = cumsum(g) (raw gating: g and beta from
                               a, b, A_log, dt_bias first) -> gc fp32 (and beta fp32 for raw gating);
  (b) ``_chunk_kkt_solve_kernel`` per (chunk, value head): A (one 64 x 64 tensor-core dot over the key
                               tile) and (I + A)^-1 (``_kkt_inverse``, below) -> Ai, input dtype; A
                               itself never leaves the program but for its four 16 x 16 diagonal
                               blocks, written to a small scratch (A_diag) and re-read by pointer;
  (c) ``_chunk_wu_kernel``     per (chunk, value head): W = Ai (beta exp(gc) o K), U = Ai (beta o V);
  (d) ``_chunk_state_kernel``  per (sequence, value head, V-block of BV columns): walks the chunks of
                               its sequence with the [K, BV] state slice in registers (fp32), stores
                               the chunk-entry states h [NT, HV, K, V] and v_new (input dtype), takes
                               initial_state, writes final_state (fp32);
  (e) ``_chunk_output_kernel`` per (chunk, value head, V-block): the outputs from q, k, gc, h, v_new.
                               With ``SPAN`` = 2 (chunk_fused, see OUTPUT_SPAN2_CANDIDATES there), (d)
                               stores the state entering every other chunk only, h [NP, HV, K, V], and
                               (e) runs per pair of chunks: half the h bytes written and read.

(d) can also take each chunk's writes from Ai diag(beta) and V, v_new = Ai diag(beta) (V - exp(gc) o (K S)),
instead of from W and U (``FROM_AI``, chunk_fused's path: W and U are then never stored). (d) can also
compute the outputs itself (``FUSE_OUTPUT``; then h and v_new are never stored): one launch and no h
round trip instead of parallelism over chunks, which ``chunk_fused`` uses for short sequences. Both
variants share (d) and (e) and every device function below. (d) can also run
chunk-parallel (``SegmentLayout``, used by chunk_fused: the state of each segment of a sequence from
zero and its transition, a scan over segments (``_segment_scan_kernel``), then (d) over all segments at
once from their entering states), for a few long sequences. On an H100 it lost to the sequential pass
at every segment size and qwen3-next case measured (1.2-1.4x slower, BENCHMARKS.md): at those sizes
the plain pass is bandwidth-, not latency-bound, and this one does three walks' work.

Layout: every token-indexed buffer is flat over tokens ([B * T, heads, dim], the canonical tensors'
own memory), and every kernel finds its sequence through ``seq_bounds`` ([N, 2]: first token, end; a
padded batch gets b * T, (b + 1) * T), so padded and varlen batches are one code path, and a layout may
also take sub-ranges of sequences (chunk_fused's pipeline groups). Chunks never straddle sequences: a
``ChunkLayout`` (built once on the host, outside any timed call) lists each chunk's (sequence, chunk)
and each sequence's first chunk; rows past a sequence's end have g = beta = 0, so they neither decay nor
write (the chunk-parallel kernels load them as zeros; the state and output passes, whose loops run
longest, re-read the sequence's last token there, which needs no row bound on a load). GVA: value head h
reads q/k head h // (HV // H). Head dims are padded to a power of two >= 16 (tl.dot's minimum) and
masked, so 60 and 100 run in 64 and 128 tiles.

Hopper (sm_90) design choices and what they should buy:
  * C = 64 and one [64, K] key tile per chunk: K K^T, W, U, Q K^T, Q S and the state update are
    64-row tensor-core dots with bf16/fp16 operands and fp32 accumulation (fp32 inputs: real fp32,
    ``input_precision="ieee"``). The key dim is one tile (K <= 256) rather than 64-wide blocks because
    the in-kernel q/k L2 norm needs whole rows; at K = 128 that is a 16 KB operand, fine at 4 warps.
  * the inverse (b) is latency bound (a chain of dependent steps per chunk), so its serial part is
    kept short and cheap: the four diagonal 16 x 16 blocks are inverted together in 15 steps, each
    a [64, 16] multiply plus a row sum inside a warp, with the coefficients re-loaded from the
    L1/L2-resident scratch rather than extracted from a register tile (a masked reduction over the
    whole tile per row, through shared memory and a barrier, 2 x 60 times, as this kernel did before
    at 425 us for T = 16384, HV = 32); the rest of the inverse is four 64 x 64 tensor-core dots.
    Fusing K K^T into it saves A's fp32 round trip (256 bytes per token and head, written and read).
  * the state pass (d) is the only sequential part: its parallelism is N * HV * V / BV programs, so
    BV is tuned with a parallelism tier in the key (``state_tier``): 32 or 64, and 16 for a few
    long sequences (B = 1, HV = 32, V = 128: 256 programs on 132 SMs instead of 128 or 64); 4 warps,
    2 or 3 stages: the pipeliner prefetches the next chunk's W, U, k and gc by async copies into
    shared memory (82 KB at BV 32, 2 stages) while the current dots run. Measured on an H100 at
    B=1 T=16384 HV=32: these 4-warp 32/64 candidates gave 314 us, while a list of BV 16 (2 stages),
    32 (2 stages, 4 or 8 warps) and 64 (8 warps, 3 stages) gave 450 us (64 w8 s3 picked): narrow
    blocks at 2 stages lose there, so BV 16 is offered with 3 stages only, next to the others.
  * the output pass (e) tunes BV in {64, 128} (fewer programs re-reading q, k vs more parallelism).
Register pressure (ptxas for sm_90, bf16, K = V = 128, pointers 16-byte aligned as the JIT specializes
them, see tests/sm90.py; without that every tile load is scalar and the counts nearly double): (b)
136 registers at 4 warps, no spills, three programs per SM; (c) 64 at 8 warps (126 at 4); the state
pass at 4 warps, 2 stages: 73 / 114 / 184 at BV 16 / 32 / 64, no spills (``FROM_AI``: 128 at BV 32);
with the output fused in (and ``FROM_AI``) 234 at BV 16, 4 warps, and a few spilled bytes at 8 warps
(the tuner weighs that against the saved launch); the output pass 141 at BV 64, 4 warps (215 over
pairs of chunks, 166 at BV 32).
Tuning is limited to (d) and (e), keyed on (K, V), a size tier (``state_tier``, ``chunk_tier``:
a config tuned on a tiny case must not carry over to large ones) and the arguments' dtypes, at most five
candidates each (after the tier cut), timed side by side in CUDA graphs (``tuning.TunedKernel``, as for
the decode kernel: Triton's autotuner, which times them one after another, picked flukes); the other
kernels have one fixed launch config. Under the Triton interpreter there is one config per kernel and no
tuning; bf16 dots are computed from fp32 copies there (the interpreter's bf16 tl.dot is wrong) and fp32 ->
bf16 casts round to nearest even (``recurrent._cast``).
"""

from __future__ import annotations

import heapq
import os
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl
from torch import Tensor

from .common.device import EPS as _EPS, cast as _cast, dot as _dot, exp as _exp, softplus as _softplus
from .common.inputs import check_inputs, output_buffer
from .common.tuning import TunedKernel

__all__ = ["chunk_gdn", "ChunkLayout", "WalkOrder", "SegmentLayout", "ChunkWorkspace", "CHUNK",
           "INTERPRETED", "describe", "chunk_tier", "state_tier", "deal_longest_first",
           "warm_up_loads"]

CHUNK = 64  # tokens per chunk; the block inverse below is written for 4 x 16
_INTERPRET_ENV = os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on", "yes")
# A warm-up segment (SegmentLayout.warm_up) starts as many chunks back as their summed log decay needs to reach this.
# With unit-norm keys and beta in [0, 1] each token's transition exp(g) (I - beta k k^T) has norm <= exp(g),
# so the state it drops is scaled by at most exp(-20) ~ 2e-9 before it reaches the segment.
WARM_UP_LOG_DECAY = -20.0
_WARM_UP_LOG_DECAY: tl.constexpr = tl.constexpr(WARM_UP_LOG_DECAY)
# a WalkOrder row: walk, first token, first token output, end, flags
WALK_ROW = 5
WALK_TAKES_H0 = 1
WALK_STORES_HT = 2


# ---- device functions shared by both variants ---------------------------------------------------------

@triton.jit
def _seq_bounds(seq_bounds, i_n):
    """(first token, length) of sequence i_n of a layout's seq_bounds [N, 2]."""
    bos = tl.load(seq_bounds + 2 * i_n)
    return bos, (tl.load(seq_bounds + 2 * i_n + 1) - bos).to(tl.int32)


@triton.jit
def _chunk_bounds(seq_bounds, chunk_indices, i_c):
    """(first token of the sequence, chunk index within it, sequence length) of global chunk i_c."""
    i_n = tl.load(chunk_indices + 2 * i_c).to(tl.int64)
    i_t = tl.load(chunk_indices + 2 * i_c + 1)
    bos, n_tok = _seq_bounds(seq_bounds, i_n)
    return bos, i_t, n_tok


@triton.jit
def _chunk_program(HV: tl.constexpr, NV: tl.constexpr):
    """(global chunk, value head, V-block) of a chunk-parallel kernel's program in its 1-D grid of
    NT * HV * NV, V-blocks then value heads fastest: the programs that read one q/k tile (a chunk's
    V-blocks, its GVA value heads) run side by side and share it in L2 instead of each fetching it
    from memory (with the chunk fastest, they ran NT programs apart)."""
    pid = tl.program_id(0)
    return pid // (HV * NV), (pid // NV) % HV, pid % NV


@triton.jit
def _load_tile(base, rows, n_rows, row_stride, cols, n_cols):
    """base[rows, cols] (rows >= n_rows and cols >= n_cols read as 0; n_rows None: every row is read, for
    rows already clamped inside). Offsets from base are int32 (the launcher checks a sequence's extent
    fits); base itself carries the 64-bit sequence offset."""
    ptrs = base + rows[:, None] * row_stride + cols[None, :]
    if n_rows is None:
        return tl.load(ptrs, mask=cols[None, :] < n_cols, other=0.0)
    else:
        return tl.load(ptrs, mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), other=0.0)


@triton.jit
def _store_tile(base, rows, n_rows, row_stride, cols, n_cols, x):
    """base[rows, cols] = x (cast to base's dtype), inside the bounds only."""
    ptrs = base + rows[:, None] * row_stride + cols[None, :]
    if x.dtype != base.dtype.element_ty:  # _cast narrows fp32 only
        x = _cast(x, base.dtype.element_ty)
    tl.store(ptrs, x, mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols))


@triton.jit
def _load_qk(base, rows, n_rows, row_stride, K: tl.constexpr, BK: tl.constexpr, L2NORM: tl.constexpr):
    """A [rows, BK] tile of q or k in its own dtype, L2-normalised per row in fp32 if L2NORM."""
    x = _load_tile(base, rows, n_rows, row_stride, tl.arange(0, BK), K)
    if L2NORM:
        xf = x.to(tl.float32)
        x = _cast(xf * tl.rsqrt(tl.sum(xf * xf, 1) + _EPS)[:, None], x.dtype)
    return x


@triton.jit
def _gate_rows(g, beta, a, b, A_log, dt_bias, tok, valid, i_h, HV: tl.constexpr, RAW_GATE: tl.constexpr):
    """(log decay, beta) of value head i_h at flat token indices tok, fp32, 0 where not valid.

    Zero on invalid rows (past the sequence's end) keeps their cumulative decay equal to the last
    valid one, so no exp() of a decay difference that involves them can overflow.
    """
    if RAW_GATE:
        x = tl.load(a + tok * HV + i_h, mask=valid, other=0.0).to(tl.float32) + tl.load(dt_bias + i_h).to(tl.float32)
        b_g = -tl.exp(tl.load(A_log + i_h).to(tl.float32)) * _softplus(x)
        b_beta = tl.sigmoid(tl.load(b + tok * HV + i_h, mask=valid, other=0.0).to(tl.float32))
    else:
        b_g = tl.load(g + tok * HV + i_h, mask=valid, other=0.0).to(tl.float32)
        b_beta = tl.load(beta + tok * HV + i_h, mask=valid, other=0.0).to(tl.float32)
    return tl.where(valid, b_g, 0.0), tl.where(valid, b_beta, 0.0)


@triton.jit
def _decay_masked(s, gc_r, gc_c, keep):
    """s o Gamma where keep (Gamma_ij = exp(gc_i - gc_j)), 0 elsewhere. A dropped entry's exponent is
    -inf (above the diagonal the difference is positive and could overflow), so its exp is 0 and one
    select per entry does (s is a finite dot product)."""
    return s * _exp(tl.where(keep, gc_r[:, None] - gc_c[None, :], float("-inf")))


@triton.jit
def _kkt_block(k_r, k_c, gc_r, gc_c, beta_r, rows, cols, n_valid, IEEE: tl.constexpr):
    """The (rows, cols) block of A = strictLower(diag(beta) (Gamma o K K^T)), fp32; rows past
    n_valid are 0, so a short last chunk's I + A is the identity there."""
    keep = (rows[:, None] > cols[None, :]) & (rows[:, None] < n_valid)
    return _decay_masked(_dot(k_r, tl.trans(k_c), IEEE), gc_r, gc_c, keep) * beta_r[:, None]


@triton.jit
def _diag_scratch(A_diag, i_c, i_h, HV: tl.constexpr, BT: tl.constexpr):
    """Chunk i_c's, value head i_h's [BT, 16] region of the solve's scratch A_diag [NT, HV, BT, 16]: its own,
    so that the solve may write and read all of it (a token-indexed one ends where the next sequence's
    rows begin)."""
    return A_diag + (i_c.to(tl.int64) * HV + i_h) * (BT * 16)


@triton.jit
def _kkt_inverse(b_k, b_gc, b_beta, rows, n_valid, diag, BT: tl.constexpr, IEEE: tl.constexpr):
    """(I + A)^-1 of one chunk, fp32 [BT, BT], for A = strictLower(diag(beta)(Gamma o K K^T)) of the
    [BT, BK] key tile b_k (one tensor-core dot).

    diag: this chunk's own [BT, 16] fp32 scratch (``_diag_scratch``), through which A's 16 x 16 diagonal
    blocks are re-read by pointer (L1/L2-resident; a register tile has no cheap row or column access),
    transposed: row 16 b + j holds column j of block b. Every entry is written, A's zeros included (above
    the diagonal, rows past n_valid), so the loads below need no mask: each is one contiguous 16-vector
    per block, which a thread reads in 16-byte pieces (masked, they were single floats and predicates):
      1. the four 16 x 16 diagonal blocks are inverted together, stacked as X [BT, 16], by backward
         column substitution: X (I + A_bb) = I gives column j = e_j - X[:, j+1:] A_bb[j+1:, j], whose
         coefficients are loaded (they depend only on the row's block) and whose sum runs along a row,
         inside a warp: 15 steps of a [BT, 16] multiply and row sum, no shared memory, no barrier;
         unrolled, so that the 15 loads (L2 hits: the stores just before do not fill L1) can all
         issue ahead of the chain (a dynamic loop waits for each, and triton does not pipeline a loop
         without a dot);
      2. with D = blockdiag(X) and L the blocks of A below the diagonal, I + A = D^-1 (I + D L) and
         (D L)^4 = 0, so (I + A)^-1 = (I - M + M^2 - M^3) D with M = D L: four [BT, BT] dots
         (M, P = I - P M twice, P D). Their operands are rounded to b_k's dtype (fp32 inputs: IEEE
         fp32), as the callers round the result: a half-precision accumulator-to-operand move stays in
         registers, where a tf32 one shuffles, and P M (P and M commute) keeps the running P the
         register operand and M the shared-memory one. D enters only the first and last dots.
    """
    r = tl.arange(0, BT)
    m = tl.arange(0, 16)
    blk_r = r // 16
    b_A = _kkt_block(b_k, b_k, b_gc, b_gc, b_beta, rows, rows, n_valid, IEEE)
    same = blk_r[:, None] == blk_r[None, :]
    # A[r, c] -> scratch[c, r % 16] within a block
    tl.store(diag + r[None, :] * 16 + (r % 16)[:, None], b_A, mask=same)
    tl.debug_barrier()  # the scratch rows were written by other threads of this program
    X = tl.where((r % 16)[:, None] == m[None, :], 1.0, 0.0)
    for jj in tl.static_range(1, 16):  # column 15 of the inverse is e_15
        j = 15 - jj
        coef = tl.load(diag + (blk_r * 16 + j)[:, None] * 16 + m[None, :])  # A_bb[m, j], 0 for m <= j
        X = tl.where(m[None, :] == j, X - tl.sum(X * coef, 1)[:, None], X)
    dt: tl.constexpr = b_k.dtype
    D = _cast(tl.where(same, tl.reshape(tl.broadcast_to(X[:, None, :], (BT, BT // 16, 16)), (BT, BT)), 0.0), dt)
    M = _dot(D, _cast(tl.where(blk_r[:, None] > blk_r[None, :], b_A, 0.0), dt), IEEE)
    eye = r[:, None] == r[None, :]
    P = tl.where(eye, 1.0, 0.0) - M
    M = _cast(M, dt)
    for _ in tl.static_range(BT // 16 - 2):
        P = tl.where(eye, 1.0, 0.0) - _dot(_cast(P, dt), M, IEEE)
    return _dot(_cast(P, dt), D, IEEE)


@triton.jit
def _output_tile(b_q, b_k, b_gc, b_h, b_v, rows, scale, IEEE: tl.constexpr):
    """scale * (exp(gc) o (Q S) + lowerIncl(Gamma o Q K^T) v_new) for one chunk, fp32 [C, BV].

    b_h: the state entering the chunk and b_v: v_new, both in the dot dtype."""
    b_o = _dot(b_q, b_h, IEEE) * _exp(b_gc)[:, None]
    return (b_o + _scores_times_v(b_q, b_k, b_v, b_gc, b_gc, rows, rows, IEEE)) * scale


@triton.jit
def _scores_times_v(b_q, b_k, b_v, gc_r, gc_c, rows_r, rows_c, IEEE: tl.constexpr):
    """lowerIncl(Gamma o Q K^T) v of the query rows rows_r against the key rows rows_c (Gamma_ij =
    exp(gc_r_i - gc_c_j), both cumulative from one start), fp32 [len(rows_r), BV]. No row bound: the rows
    are the true token indices, so a key past a sequence's end comes after every valid query, and the
    callers do not store the outputs of the queries past it."""
    b_s = _decay_masked(_dot(b_q, tl.trans(b_k), IEEE), gc_r, gc_c, rows_r[:, None] >= rows_c[None, :])
    return _dot(_cast(b_s, b_v.dtype), b_v, IEEE)


# ---- (a) - (c): the chunk-parallel stages --------------------------------------------------------------

@triton.jit
def _gate_chunk(g, beta, a, b, A_log, dt_bias, gc, bos, rows, valid, i_h, HV: tl.constexpr, RAW_GATE: tl.constexpr):
    """Stores a chunk's cumulative log decay gc (fp32) and returns (gc, beta), fp32, 0 past n_tok."""
    tok = bos + rows
    b_g, b_beta = _gate_rows(g, beta, a, b, A_log, dt_bias, tok, valid, i_h, HV, RAW_GATE)
    b_gc = tl.cumsum(b_g, 0)
    tl.store(gc + tok * HV + i_h, b_gc, mask=valid)
    return b_gc, b_beta


@triton.jit
def _wu_store(b_ai, b_k, b_gc, b_beta, v, W, U, bos, rows, n_tok, i_h, HV: tl.constexpr, K: tl.constexpr,
              V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, IEEE: tl.constexpr):
    """W = Ai (beta exp(gc) o K) and U = Ai (beta o V) of one chunk (V in BV-column blocks), stored in
    W's dtype; b_ai: (I + A)^-1 in the dot dtype."""
    b_kb = _cast(b_k * (b_beta * _exp(b_gc))[:, None], b_ai.dtype)
    _store_tile(W + bos * HV * K + i_h * K, rows, n_tok, HV * K, tl.arange(0, BK), K, _dot(b_ai, b_kb, IEEE))
    for i_v in range(tl.cdiv(V, BV)):
        cols = i_v * BV + tl.arange(0, BV)
        b_vb = _load_tile(v + bos * HV * V + i_h * V, rows, n_tok, HV * V, cols, V) * b_beta[:, None]
        b_u = _dot(b_ai, _cast(b_vb, b_ai.dtype), IEEE)
        _store_tile(U + bos * HV * V + i_h * V, rows, n_tok, HV * V, cols, V, b_u)


@triton.jit
def _chunk_gate_kernel(g, beta, a, b, A_log, dt_bias, gc, beta_out, seq_bounds, chunk_indices,
                       HV: tl.constexpr, BT: tl.constexpr, RAW_GATE: tl.constexpr):
    i_c, i_h, _ = _chunk_program(HV, 1)
    bos, i_t, n_tok = _chunk_bounds(seq_bounds, chunk_indices, i_c)
    rows = i_t * BT + tl.arange(0, BT)
    valid = rows < n_tok
    _, b_beta = _gate_chunk(g, beta, a, b, A_log, dt_bias, gc, bos, rows, valid, i_h, HV, RAW_GATE)
    if RAW_GATE:
        tl.store(beta_out + (bos + rows) * HV + i_h, b_beta, mask=valid)


@triton.jit
def _chunk_kkt_solve_kernel(k, beta, gc, A_diag, Ai, seq_bounds, chunk_indices,
                            H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                            L2NORM: tl.constexpr, IEEE: tl.constexpr):
    i_c, i_h, _ = _chunk_program(HV, 1)
    bos, i_t, n_tok = _chunk_bounds(seq_bounds, chunk_indices, i_c)
    rows = i_t * BT + tl.arange(0, BT)
    valid = rows < n_tok
    b_k = _load_qk(k + bos * H * K + (i_h // (HV // H)) * K, rows, n_tok, H * K, K, BK, L2NORM)
    b_gc = tl.load(gc + (bos + rows) * HV + i_h, mask=valid, other=0.0)
    b_beta = tl.load(beta + (bos + rows) * HV + i_h, mask=valid, other=0.0).to(tl.float32)
    b_ai = _kkt_inverse(b_k, b_gc, b_beta, rows, n_tok, _diag_scratch(A_diag, i_c, i_h, HV, BT), BT, IEEE)
    _store_tile(Ai + bos * HV * BT + i_h * BT, rows, n_tok, HV * BT, tl.arange(0, BT), BT, b_ai)


@triton.jit
def _chunk_wu_kernel(k, v, beta, gc, Ai, W, U, seq_bounds, chunk_indices,
                     H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                     BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr, IEEE: tl.constexpr):
    i_c, i_h, _ = _chunk_program(HV, 1)
    bos, i_t, n_tok = _chunk_bounds(seq_bounds, chunk_indices, i_c)
    rows = i_t * BT + tl.arange(0, BT)
    valid = rows < n_tok
    b_ai = _load_tile(Ai + bos * HV * BT + i_h * BT, rows, n_tok, HV * BT, tl.arange(0, BT), BT)
    b_k = _load_qk(k + bos * H * K + (i_h // (HV // H)) * K, rows, n_tok, H * K, K, BK, L2NORM)
    b_gc = tl.load(gc + (bos + rows) * HV + i_h, mask=valid, other=0.0)
    b_beta = tl.load(beta + (bos + rows) * HV + i_h, mask=valid, other=0.0).to(tl.float32)
    _wu_store(b_ai, b_k, b_gc, b_beta, v, W, U, bos, rows, n_tok, i_h, HV, K, V, BK, BV, IEEE)


# ---- (d) the state pass and (e) the output pass (both variants) ----------------------------------------

def _tile_width(n: int) -> int:
    """The tile width for a head dim: the next power of two, at least 16 (tl.dot's minimum)."""
    return max(16, triton.next_power_of_2(n))


def _state_prune(configs, named_args):
    """BV no wider than V needs; at most 64 fp32 state elements per thread (more spills on sm_90); with
    the output fused in, no single-stage config narrower than 64 (``_miscompiled``), and at V = 128 only
    ``FUSED_WALK_V128``."""
    BK, V = named_args["BK"], named_args["V"]
    keep, seen = [], set()
    for c in configs:
        c = _with_bv(c, min(c.kwargs["BV"], _tile_width(V)))
        if BK * c.kwargs["BV"] / (32 * c.num_warps) > 64 or _settings(c) in seen:
            continue
        if named_args["FUSE_OUTPUT"] and (_miscompiled(c) or (V == 128 and _settings(c)[:3] != FUSED_WALK_V128)):
            continue
        seen.add(_settings(c))
        keep.append(c)
    return keep or [triton.Config({"BV": 16}, num_warps=4, num_stages=2)]


# The walk with the output fused in at V = 128 has one config (BV, warps, stages), so nothing is tuned there.
# Every candidate forced on every parity D = 128 row (whole calls, default path; BENCHMARKS.md, twenty-seventh
# and twenty-ninth sessions), on an H200 and on an H100, and on qwen3-next B=4 T=8192 (H100): this one was the
# fastest on each; (64, 8, 3) was 9-58% slower, (64, 4, 1) 5-33%, BV 32 1-37%. Offered the others, Triton's
# autotuner (which tuned these kernels then) picked one now and then on the first case of a key, and the key's
# other cases ran it: H200 varlen N=32 T=4096 at BV 32, 44.9 us against 37.1; H100 B=4 T=1024 at (64, 8, 3),
# 37.4 against 33.4, and varlen N=32 T=4096 after it, 55.8 against 38.9. Rerun alone, Triton's timing ranked
# that row's configs as the whole calls do ((64, 8, 3) 14% behind): a fluke of the moment of one run, which a
# tuner timing the candidates one after another, not interleaved, cannot rule out.
# At V = 64 the candidates stay: BV 32 wins the small cases there by 4-8%.
FUSED_WALK_V128 = (64, 4, 2)


def _miscompiled(c: triton.Config) -> bool:
    """A config of the walk with the output fused in that Triton 3.6 compiles wrongly for sm_90: one
    stage at BV 16 or 32 (the (64, 4, 1) candidate with BV capped at D = 16 or 32). Rows 16-63 of every
    output tile come out wrong (only the first warp's are right) and graph replays hit an illegal address;
    BV 64 at one stage, and BV 16 / 32 at two or three stages, are right (tests/test_kernel_chunk_gpu.py,
    H100). The walk without the output is not affected."""
    return c.num_stages == 1 and c.kwargs["BV"] < 64


def _state_prune_by_tier(configs, named_args):
    """_state_prune after a cut by parallelism tier (``state_tier``): BV 16 only at tiers 0 and 3 (a few
    sequences, too few programs for the GPU); with programs enough it only re-reads W and k more."""
    tier = named_args["state_tier"]
    keep = [c for c in configs if tier % 3 == 0 or c.kwargs["BV"] >= 32]
    return _state_prune(keep, named_args)


def _bv_prune(configs, named_args):
    """BV no wider than V needs (duplicates dropped)."""
    V = named_args["V"]
    keep, seen = [], set()
    for c in configs:
        c = _with_bv(c, min(c.kwargs["BV"], _tile_width(V)))
        if _settings(c) not in seen:
            seen.add(_settings(c))
            keep.append(c)
    return keep


def _with_bv(c: triton.Config, bv: int) -> triton.Config:
    """c with block width bv, every other setting (warps, stages, register cap) kept."""
    return triton.Config({**c.kwargs, "BV": bv}, num_warps=c.num_warps, num_stages=c.num_stages, maxnreg=c.maxnreg)


def _settings(c: triton.Config) -> tuple:
    """What tells two configs apart (the prune functions drop duplicates)."""
    return c.kwargs["BV"], c.num_warps, c.num_stages, c.maxnreg


def _configs(candidates: list[tuple[int, ...]], block: bool = True) -> list[triton.Config]:
    """(BV, num_warps, num_stages[, maxnreg]) candidates on a GPU (maxnreg: ptxas's register cap per
    thread, more programs per SM for some spills), without BV for a kernel with no block width (not
    ``block``); one config (BV 32, 4 warps) in the interpreter, where nothing is tuned and
    BV 32 still splits V = 60 / 64 into two blocks."""
    if _INTERPRET_ENV:
        return [triton.Config({"BV": 32} if block else {}, num_warps=4, num_stages=1)]
    return [config_from(c, block) for c in candidates]


def config_from(candidate: tuple[int, ...], block: bool = True) -> triton.Config:
    """The triton config of one (BV, num_warps, num_stages[, maxnreg]) candidate, as it is; without BV
    (num_warps, num_stages[, maxnreg]) when not ``block``."""
    bv, (warps, stages, *cap) = (candidate[0], candidate[1:]) if block else (None, candidate)
    return triton.Config({} if bv is None else {"BV": bv}, num_warps=warps, num_stages=stages,
                         maxnreg=cap[0] if cap else None)


# the parallelism tier (see state_tier) is a key; BV 16 for tiers 0 and 3 only (_state_prune_by_tier)
# (the GPU's candidate tuples are kept for the tests, which force each one under the interpreter)
STATE_CANDIDATES = [(16, 4, 3), (32, 4, 2), (32, 4, 3), (64, 4, 2), (64, 4, 3)]
# (64, 4, 2) runs with its registers capped at 128 (4 programs per SM instead of 3): forced and interleaved
# on an H100 (whole chunk_fused call, us), parity D=64 rows 73.1 -> 71.9, 78.5 -> 76.0, 82.8 -> 80.9,
# 42.4 -> 40.5, the others within 0.5%; qwen3-next B=1 T=16384 910 -> 904, B=4 T=8192 1700 -> 1686.
OUTPUT_CANDIDATES = [(64, 4, 2, 128), (64, 4, 3), (128, 4, 2), (128, 8, 3)]
STATE_CONFIGS = _configs(STATE_CANDIDATES)
OUTPUT_CONFIGS = _configs(OUTPUT_CANDIDATES)


@triton.jit
def _chunk_state_fn(q, k, v, W, U, Ai, gc, h, v_new, o, h0, ht, seq_bounds, h_offsets, seg_parent, parent_bounds,
                    scale, state_tier,
                    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                    BK: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr, FUSE_OUTPUT: tl.constexpr,
                    SEGMENT: tl.constexpr, SPAN: tl.constexpr, FROM_AI: tl.constexpr, L2NORM: tl.constexpr,
                    IEEE: tl.constexpr, BV: tl.constexpr):
    # state_tier: only a key of the tuner. h_offsets: each sequence's first h entry (its first chunk,
    # or with SPAN = 2 its first pair of chunks: then the state entering every other chunk is stored).
    # SEGMENT (the chunk-parallel pass, see SegmentLayout; each "sequence" is then a segment): 0 the plain
    # pass; 1 from a zero state, only the final state (ht); 2 the transition M (ht, V = K): the state from
    # the identity with U taken as 0; 3 warm-up (SegmentLayout.warm_up): from zero, or from h0 at its
    # sequence's start (seg_parent: each segment's sequence, parent_bounds: the sequences' seq_bounds), the
    # chunks back to where the decay reaches _WARM_UP_LOG_DECAY walked first, state only; the last segment
    # of a sequence stores its final state (ht).
    # 1-D grid, a walk's V-blocks side by side: they read the same W and k tiles, which they then share in
    # L2 (with the V-block as a second grid axis, every walk's first block ran before any second one)
    NV: tl.constexpr = (V + BV - 1) // BV
    i_nh, i_v = tl.program_id(0) // NV, tl.program_id(0) % NV
    i_n, i_h = i_nh // HV, i_nh % HV
    i_hk = i_h // (HV // H)
    bos, n_tok = _seq_bounds(seq_bounds, i_n)
    first_h = tl.load(h_offsets + i_n).to(tl.int64)
    cols_k = tl.arange(0, BK)
    cols_v = i_v * BV + tl.arange(0, BV)
    dt = k.dtype.element_ty

    i_t0 = 0
    ht_rows = K
    if SEGMENT == 3:
        i_n = tl.load(seg_parent + i_n).to(tl.int64)  # from here on: the sequence (h0, ht)
        seq_bos, seq_len = _seq_bounds(parent_bounds, i_n)
        log_decay = 0.0
        # the chunks before a segment are whole: each one's decay is gc at its last token
        while (bos + i_t0 * BT > seq_bos) & (log_decay > _WARM_UP_LOG_DECAY):
            i_t0 -= 1
            log_decay += tl.load(gc + (bos + i_t0 * BT + BT - 1) * HV + i_h)
        if USE_H0:  # h0 enters only where the warm-up reaches the sequence's start (masked load: zeros)
            b_h = _load_tile(h0 + (i_n * HV + i_h).to(tl.int64) * K * V, cols_k,
                             tl.where(bos + i_t0 * BT == seq_bos, K, 0), V, cols_v, V)
        else:
            b_h = tl.zeros([BK, BV], dtype=tl.float32)
        ht_rows = tl.where(bos + n_tok == seq_bos + seq_len, K, 0)  # only a sequence's last segment stores ht
    elif USE_H0:
        b_h = _load_tile(h0 + (i_n * HV + i_h).to(tl.int64) * K * V, cols_k, K, V, cols_v, V)
    elif SEGMENT == 2:
        b_h = tl.where((cols_k[:, None] == cols_v[None, :]) & (cols_v[None, :] < V), 1.0, 0.0)
    else:
        b_h = tl.zeros([BK, BV], dtype=tl.float32)
    base_k = k + bos * H * K + i_hk * K
    for i_t in range(i_t0, tl.cdiv(n_tok, BT)):
        rows = i_t * BT + tl.arange(0, BT)
        # A short last chunk's rows past the sequence's end re-read its last token (rows_in) rather than
        # load masked zeros, so no load and no score needs a row bound (sm_90 SASS from triton 3.9, K = V
        # = 128, 4 warps: loop 1,222 -> 1,078 instructions with the output fused in at BV 64, 540 -> 458
        # without at BV 32). What they compute is finite and goes nowhere: Ai's (and W's) columns for
        # them are 0 (beta = 0 there), the causal mask drops them as keys, their outputs are not
        # stored, and the state update drops their writes (``valid``).
        rows_in = tl.minimum(rows, n_tok - 1)
        valid = rows < n_tok
        b_hd = _cast(b_h, dt)
        if not FUSE_OUTPUT and SEGMENT == 0:
            if i_t % SPAN == 0:
                _store_tile(h + ((first_h + i_t // SPAN) * HV + i_h) * K * V, cols_k, K, V, cols_v, V, b_hd)
        b_k = _load_qk(base_k, rows_in, None, H * K, K, BK, L2NORM)
        b_gc = tl.load(gc + (bos + rows_in) * HV + i_h)
        # v_new, what this chunk actually writes: U - W S, or from (I + A)^-1 diag(beta) as
        # Ai (V - exp(gc) o (K S)) (W and U never stored); the transition (SEGMENT 2) takes V as 0
        if FROM_AI:
            b_x = -_dot(b_k, b_hd, IEEE) * _exp(b_gc)[:, None]
            if SEGMENT != 2:
                b_x += _load_tile(v + bos * HV * V + i_h * V, rows_in, None, HV * V, cols_v, V).to(tl.float32)
            b_ai = _load_tile(Ai + bos * HV * BT + i_h * BT, rows_in, None, HV * BT, tl.arange(0, BT), BT)
            b_v = _dot(b_ai, _cast(b_x, dt), IEEE)
        else:
            b_v = -_dot(_load_tile(W + bos * HV * K + i_h * K, rows_in, None, HV * K, cols_k, K), b_hd, IEEE)
            if SEGMENT != 2:
                b_v += _load_tile(U + bos * HV * V + i_h * V, rows_in, None, HV * V, cols_v, V).to(tl.float32)
        b_vd = _cast(b_v, dt)
        if FUSE_OUTPUT:
            b_q = _load_qk(q + bos * H * K + i_hk * K, rows_in, None, H * K, K, BK, L2NORM)
            b_o = _output_tile(b_q, b_k, b_gc, b_hd, b_vd, rows, scale, IEEE)
            rows_o = rows
            if SEGMENT == 3:  # a warm-up chunk (i_t < 0) is the segment before's: it stores nothing
                rows_o = tl.where(rows >= 0, rows, n_tok)
            _store_tile(o + bos * HV * V + i_h * V, rows_o, n_tok, HV * V, cols_v, V, b_o)
        elif SEGMENT == 0:
            _store_tile(v_new + bos * HV * V + i_h * V, rows, n_tok, HV * V, cols_v, V, b_vd)
        gc_last = tl.load(gc + (bos + tl.minimum(i_t * BT + BT, n_tok) - 1) * HV + i_h)
        # decay each write to the chunk's end on the [C, BV] side (cheaper than on the [C, K] keys)
        b_vdec = _cast(b_v * tl.where(valid, _exp(gc_last - b_gc), 0.0)[:, None], dt)
        b_h = b_h * _exp(gc_last) + _dot(tl.trans(b_k), b_vdec, IEEE)
    if STORE_HT:
        _store_tile(ht + (i_n * HV + i_h).to(tl.int64) * K * V, cols_k, ht_rows, V, cols_v, V, b_h)


_chunk_state_kernel = TunedKernel(_chunk_state_fn, STATE_CONFIGS,
                                  ["K", "V", "FUSE_OUTPUT", "SEGMENT", "SPAN", "FROM_AI", "state_tier"],
                                  _state_prune_by_tier)


@triton.jit
def _chunk_output_fn(q, k, gc, h, v_new, o, seq_bounds, block_indices, scale, chunk_tier,
                     H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                     BK: tl.constexpr, SPAN: tl.constexpr, L2NORM: tl.constexpr, IEEE: tl.constexpr,
                     BV: tl.constexpr):
    # one program per block of SPAN chunks (block_indices: the layout's chunk_indices or pair_indices),
    # value head and V-block; h holds the state entering each block. Chunk j of a block takes the
    # block's state through Q S, and chunks 0..j through their [BT, BT] score blocks, one at a time (a
    # [SPAN * BT]^2 score tile would need 8 warps at SPAN 2); gc restarts at every chunk, so over a block
    # chunk j's rows add the decay of the chunks before it (``carry``).
    i_c, i_h, i_v = _chunk_program(HV, (V + BV - 1) // BV)
    bos, i_b, n_tok = _chunk_bounds(seq_bounds, block_indices, i_c)
    i_hk = i_h // (HV // H)
    cols_k = tl.arange(0, BK)
    cols_v = i_v * BV + tl.arange(0, BV)
    b_h = _load_tile(h + (i_c.to(tl.int64) * HV + i_h) * K * V, cols_k, K, V, cols_v, V)
    carry_j = 0.0
    # rows past the sequence's end re-read its last token, as in the state pass: no row bound on any load
    # or score; as keys the causal mask drops them (a block's earlier chunks are full unless its later
    # ones lie wholly past the end), as queries they are not stored
    for j in range(SPAN):  # a dynamic loop: unrolled, the pair's tiles were all loaded up front (spills)
        rows_j = (i_b * SPAN + j) * BT + tl.arange(0, BT)
        in_j = tl.minimum(rows_j, n_tok - 1)
        b_q = _load_qk(q + bos * H * K + i_hk * K, in_j, None, H * K, K, BK, L2NORM)
        gc_j = tl.load(gc + (bos + in_j) * HV + i_h) + carry_j
        b_o = _dot(b_q, b_h, IEEE) * _exp(gc_j)[:, None]
        carry_i = 0.0
        for i in range(j + 1):
            rows_i = (i_b * SPAN + i) * BT + tl.arange(0, BT)
            in_i = tl.minimum(rows_i, n_tok - 1)
            b_k = _load_qk(k + bos * H * K + i_hk * K, in_i, None, H * K, K, BK, L2NORM)
            gc_i = tl.load(gc + (bos + in_i) * HV + i_h) + carry_i
            b_v = _load_tile(v_new + bos * HV * V + i_h * V, in_i, None, HV * V, cols_v, V)
            b_o += _scores_times_v(b_q, b_k, b_v, gc_j, gc_i, rows_j, rows_i, IEEE)
            last = (i_b * SPAN + i) * BT + BT - 1
            carry_i += tl.load(gc + (bos + last) * HV + i_h, mask=last < n_tok, other=0.0)
        _store_tile(o + bos * HV * V + i_h * V, rows_j, n_tok, HV * V, cols_v, V, b_o * scale)
        last = (i_b * SPAN + j) * BT + BT - 1
        carry_j += tl.load(gc + (bos + last) * HV + i_h, mask=last < n_tok, other=0.0)


_chunk_output_kernel = TunedKernel(_chunk_output_fn, OUTPUT_CONFIGS, ["K", "V", "SPAN", "chunk_tier"], _bv_prune)


SCAN_BV = 32  # V columns per program of the segment scan; 8 warps hold its [K, K] fp32 transition


@triton.jit
def _segment_scan_kernel(M, L, h0, seg_init, ht, seg_offsets, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                         BK: tl.constexpr, BV: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr,
                         IEEE: tl.constexpr):
    """Per (sequence, value head, V-block): the state entering each segment, S_j+1 = M_j S_j + L_j from
    the initial state (fp32; stored to seg_init), and the final state."""
    i_nh, i_v = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // HV, i_nh % HV
    cols_k = tl.arange(0, BK)
    cols_v = i_v * BV + tl.arange(0, BV)
    if USE_H0:
        b_s = _load_tile(h0 + (i_n * HV + i_h).to(tl.int64) * K * V, cols_k, K, V, cols_v, V)
    else:
        b_s = tl.zeros([BK, BV], dtype=tl.float32)
    first = tl.load(seg_offsets + i_n).to(tl.int64)
    for j in range(0, tl.load(seg_offsets + i_n + 1) - first):
        head = (first + j) * HV + i_h
        _store_tile(seg_init + head * K * V, cols_k, K, V, cols_v, V, b_s)
        b_m = _load_tile(M + head * K * K, cols_k, K, K, cols_k, K)
        b_s = _dot(b_m, b_s, IEEE) + _load_tile(L + head * K * V, cols_k, K, V, cols_v, V)
    if STORE_HT:
        _store_tile(ht + (i_n * HV + i_h).to(tl.int64) * K * V, cols_k, K, V, cols_v, V, b_s)


try:
    from triton.runtime.interpreter import InterpretedFunction as _Interpreted

    INTERPRETED: bool = isinstance(_chunk_gate_kernel, _Interpreted)
except ImportError:  # pragma: no cover - older layouts of triton
    INTERPRETED = _INTERPRET_ENV


# ---- host side ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ChunkLayout:
    """Where every chunk of a padded or varlen batch sits; built on the host once, outside timed calls.

    A padded [B, T] batch is described like a varlen one (bounds b * T), so kernels have one path. A
    sequence is a token range [start, end) of the token-indexed buffers; ranges need not be adjacent
    and may be empty (a pipeline group takes a sub-range of each sequence of a batch).
    """

    N: int  # sequences
    NT: int  # chunks over all sequences
    max_len: int  # the longest sequence, in tokens
    tokens: int  # B * T: the token-indexed buffers' length, which every sequence bound stays within
    spans: tuple[tuple[int, int], ...]  # each sequence's [start, end) tokens, on the host
    seq_bounds: Tensor  # [N, 2] int64: the same on the device, which the kernels read
    chunk_indices: Tensor  # [NT, 2] int32: (sequence, chunk within it), sequence-major
    chunk_offsets: Tensor  # [N + 1] int32: global index of each sequence's first chunk
    # the same for pairs of chunks (a sequence's last pair may hold one), the output pass's blocks at SPAN 2
    NP: int
    pair_indices: Tensor  # [NP, 2] int32
    pair_offsets: Tensor  # [N + 1] int32
    _walk_orders: dict[tuple[int, int], WalkOrder] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(cls, B: int, T: int, cu_seqlens: Tensor | None, device: torch.device | str) -> ChunkLayout:
        if cu_seqlens is None:
            bounds = [b * T for b in range(B + 1)]
        else:
            if B != 1 or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
                raise ValueError("varlen needs B == 1 and cu_seqlens [N + 1]")
            bounds = cu_seqlens.tolist()  # the one host sync: layouts are built before timing
        if bounds[0] != 0 or bounds[-1] != B * T or any(e < s for s, e in zip(bounds, bounds[1:])):
            raise ValueError(f"cu_seqlens must start at 0, be non-decreasing and end at T={T}, got {bounds}")
        return cls.from_spans(list(zip(bounds, bounds[1:])), B * T, device)

    @classmethod
    def from_spans(cls, spans: list[tuple[int, int]], tokens: int, device: torch.device | str) -> ChunkLayout:
        """The layout of the sequences [start, end) of token-indexed buffers of ``tokens`` rows (``build``
        checks that they cover a batch; a pipeline group covers part of one)."""
        if any(not 0 <= s <= e <= tokens for s, e in spans):
            raise ValueError(f"sequence spans must lie within the {tokens} tokens, got {spans}")
        lens = [e - s for s, e in spans]

        def blocks(size: int) -> tuple[int, Tensor, Tensor]:
            counts = [triton.cdiv(n, size) for n in lens]
            offsets = [0]
            for c in counts:
                offsets.append(offsets[-1] + c)
            indices = [(n, c) for n, count in enumerate(counts) for c in range(count)]
            return (offsets[-1], torch.tensor(indices, dtype=torch.int32, device=device).reshape(-1, 2),
                    torch.tensor(offsets, dtype=torch.int32, device=device))

        (NT, chunk_indices, chunk_offsets), (NP, pair_indices, pair_offsets) = blocks(CHUNK), blocks(2 * CHUNK)
        spans = tuple((int(s), int(e)) for s, e in spans)
        return cls(N=len(lens), NT=NT, max_len=max(lens), tokens=tokens, spans=spans,
                   seq_bounds=torch.tensor(spans, dtype=torch.int64, device=device).reshape(-1, 2),
                   chunk_indices=chunk_indices, chunk_offsets=chunk_offsets,
                   NP=NP, pair_indices=pair_indices, pair_offsets=pair_offsets)

    def walk_order(self, heads: int, programs: int) -> WalkOrder:
        """The N * heads walks (sequence n, head h: walk n * heads + h) dealt to ``programs`` persistent programs
        (``WalkOrder.deal``); built on the host on first use and kept, so that timed calls only read it."""
        key = heads, programs
        if key not in self._walk_orders:
            rows = [(n * heads + h, start, start, end, WALK_TAKES_H0 | WALK_STORES_HT)
                    for n, (start, end) in enumerate(self.spans) for h in range(heads)]
            loads = [triton.cdiv(end - start, CHUNK) for _, start, _, end, _ in rows]
            self._walk_orders[key] = WalkOrder.deal(rows, loads, programs, self.seq_bounds.device)
        return self._walk_orders[key]

    def blocks(self, span: int) -> tuple[int, Tensor, Tensor]:
        """(count, [count, 2] indices, [N + 1] offsets) of the blocks of ``span`` chunks (1 or 2)."""
        if span not in (1, 2):
            raise ValueError(f"output blocks span 1 or 2 chunks, got {span}")
        return (self.NT, self.chunk_indices, self.chunk_offsets) if span == 1 else \
            (self.NP, self.pair_indices, self.pair_offsets)


def deal_longest_first(chunks: list[int], programs: int) -> tuple[list[list[int]], list[int]]:
    """Walks of these many chunks dealt longest first, each to the program with the fewest chunks so far (the
    lowest-numbered on a tie): each program's walks in its order, and its chunks in all."""
    if programs < 1:
        raise ValueError(f"walks need at least one program, got {programs}")
    dealt: list[list[int]] = [[] for _ in range(programs)]
    loads = [(0, p) for p in range(programs)]  # a heap of (chunks, program)
    for walk in sorted(range(len(chunks)), key=lambda w: -chunks[w]):
        load, p = heapq.heappop(loads)
        dealt[p].append(walk)
        heapq.heappush(loads, (load + chunks[walk], p))
    program_chunks = [0] * programs
    for load, p in loads:
        program_chunks[p] = load
    return dealt, program_chunks


def warm_up_loads(lengths: list[int], chunks: int) -> list[int]:
    """The chunks each warm-up segment of ``chunks`` chunks, of sequences of ``lengths`` chunks, is expected to
    walk: its own, and one of warm-up (strong decay) but on its sequence's first; in ``SegmentLayout.build``'s
    order (an empty sequence keeps one empty segment)."""
    return [min(chunks, n - first) + (first > 0) for n in lengths for first in range(0, n, chunks) or [0]]


@dataclass(frozen=True)
class WalkOrder:
    """Walks dealt to persistent programs that each take theirs in turn: program p walks counts[p] walks, its
    i-th in row i * programs + p of ``walks``, program_chunks[p] chunks in all (as dealt). A row holds its walk's
    bounds, so that a program reads them in one round trip at the walk's start (a walk index, then its sequence's
    bounds, took two, which cost 3-4% on walks of one to four chunks, H200). Rows go round the programs so that a
    program finds its first walk's without reading its count first.

    A row (WALK_ROW int32): the walk's index (n * heads + h: sequence n, head h), its first token, the first token it
    outputs, its end, and flags (WALK_TAKES_H0: it starts from its sequence's h0; WALK_STORES_HT: it ends with its
    final state). A whole sequence outputs from its first token and has both flags. A warm-up segment
    (``SegmentLayout.walks``) holds its sequence's start as its first token and WALK_STORES_HT only where it ends its
    sequence: its warm-up starts in between, where the gates' decay runs out, which the kernel that walks it finds
    (``chunk_specialized_sm90``), and it starts from h0 where that is the sequence's start."""

    programs: int
    makespan: int  # chunks of the most loaded program
    chunks: int  # over all walks, the outputs' (no warm-ups)
    counts: Tensor  # [programs] int32: walks a program
    walks: Tensor  # [rounds * programs, WALK_ROW] int32 ((-1, 0, 0, 0, 0): none)
    program_chunks: Tensor  # [programs] int32
    empty: Tensor  # [E] int64: the walks of no chunk left out (``deal``'s drop_empty), whose final state is their h0
    first_rows: tuple[tuple[int, int, int, int, int], ...]  # each program's first row, on the host
    _regular: dict[int, tuple[int, int]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def deal(cls, rows: list[tuple[int, int, int, int, int]], loads: list[int], programs: int,
             device: torch.device | str, drop_empty: bool = False) -> WalkOrder:
        """The walks of ``rows`` (a row each) longest first by ``loads`` (the chunks each is expected to walk), each
        to the program with the fewest chunks so far, the lowest-numbered on a tie: equal walks go round the programs
        in order, and the longest of unequal ones no longer meet on one program, as in order they may (parity's
        varlen N=64 T=6656: 9 chunks on one program where 7 suffice). drop_empty: the walks of no token are dealt to
        no program but listed in ``empty``, for a kernel whose programs learn a walk's bounds with its first chunk
        (``chunk_specialized_sm90`` over warm-up segments), which such a walk never has."""
        empty = [row[0] for row in rows if drop_empty and row[1] == row[3]]
        if empty:
            loads = [load for row, load in zip(rows, loads) if row[1] != row[3]]
            rows = [row for row in rows if row[1] != row[3]]
        dealt, program_chunks = deal_longest_first(loads, programs)
        rounds = max(1, *(len(mine) for mine in dealt))  # a row at least: a program reads its first before its count
        table = [rows[mine[i]] if i < len(mine) else (-1, 0, 0, 0, 0) for i in range(rounds) for mine in dealt]
        return cls(programs=programs, makespan=max(program_chunks),
                   chunks=sum(triton.cdiv(end - first, CHUNK) for _, _, first, end, _ in rows),
                   counts=torch.tensor([len(mine) for mine in dealt], dtype=torch.int32, device=device),
                   walks=torch.tensor(table, dtype=torch.int32, device=device).reshape(-1, WALK_ROW),
                   program_chunks=torch.tensor(program_chunks, dtype=torch.int32, device=device),
                   empty=torch.tensor(empty, dtype=torch.int64, device=device), first_rows=tuple(table[:programs]))

    def regular(self, heads: int) -> tuple[int, int]:
        """(T, flags) where every program p's first row is walk p over T tokens from T (p // heads), with the flags
        of program 0's (a padded batch's whole sequences, or one segment each, dealt in order: a kernel can compute
        that row where it would read it, a round trip sooner at the launch); (0, 0) where not. Kept per heads."""
        if heads not in self._regular:
            _, start, _, end, flags = self.first_rows[0]
            period = end - start
            regular = period > 0 and all(row == (p, period * (p // heads), period * (p // heads),
                                                 period * (p // heads + 1), flags)
                                         for p, row in enumerate(self.first_rows))
            self._regular[heads] = (period, flags) if regular else (0, 0)
        return self._regular[heads]

    def fill(self, slots: int) -> float:
        """The share of ``slots`` programs' time over the makespan that walks take (1: none idle)."""
        return self.chunks / (slots * self.makespan) if self.makespan else 1.0


@dataclass(frozen=True)
class SegmentLayout:
    """The sequences of a ChunkLayout cut into segments of at most ``chunks`` chunks, for the
    chunk-parallel state pass: (d1) each segment's state from zero (L) and (d2) its transition M, both
    parallel over segments; (d3) a scan over each sequence's segments, S_j+1 = M_j S_j + L_j, for the
    state entering each one; (d4) the state pass over all segments at once from those states. The
    sequential walk shrinks from a sequence's chunks to its segments, for 3x the state pass's work.

    With ``warm_up``, one pass instead: each segment walks, state only, the chunks before it back to where
    their decay reaches exp(WARM_UP_LOG_DECAY) (or its sequence's start, from h0), then its own chunks with
    the outputs. The state this leaves out is scaled by at most exp(WARM_UP_LOG_DECAY) (unit-norm keys);
    where decay is strong (the suites' gates: about -31 a chunk at gate_norm 1) one chunk suffices, where
    it is weak the warm-up reaches back to the sequence's start and the walk is as long as the sequential one.
    Built on the host once, outside any timed call.
    """

    chunks: int  # chunks per segment
    layout: ChunkLayout  # the segments as sequences: same tokens, same global chunk numbering
    seg_offsets: Tensor  # [N + 1] int32: each sequence's first segment
    parent: Tensor  # [segments] int32: each segment's sequence
    parent_bounds: Tensor  # the sequences' ChunkLayout.seq_bounds
    sequences: tuple[int, ...]  # parent's, on the host
    sequence_spans: tuple[tuple[int, int], ...]  # parent_bounds', on the host
    warm_up: bool = False
    _walks: dict[tuple[int, int], WalkOrder] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(cls, layout: ChunkLayout, chunks: int, warm_up: bool = False) -> SegmentLayout:
        if chunks < 1:
            raise ValueError(f"a segment needs at least one chunk, got {chunks}")
        span, device = chunks * CHUNK, layout.seq_bounds.device
        seg_spans, offsets = [], [0]
        for start, end in layout.spans:
            # an empty sequence keeps one empty segment: the program that stores its final state
            seg_spans += [(t, min(t + span, end)) for t in range(start, end, span)] or [(start, end)]
            offsets.append(len(seg_spans))
        sequences = [n for n in range(layout.N) for _ in range(offsets[n + 1] - offsets[n])]
        return cls(chunks=chunks, layout=ChunkLayout.from_spans(seg_spans, layout.tokens, device),
                   seg_offsets=torch.tensor(offsets, dtype=torch.int32, device=device),
                   parent=torch.tensor(sequences, dtype=torch.int32, device=device), parent_bounds=layout.seq_bounds,
                   sequences=tuple(sequences), sequence_spans=layout.spans, warm_up=warm_up)

    def walks(self, heads: int, programs: int) -> WalkOrder:
        """These warm-up segments as walks (``WalkOrder``'s rows of warm-up segments; segment s, head h: its sequence
        n's walk n * heads + h) dealt to ``programs`` persistent programs, each as the chunks it is expected to walk
        (``warm_up_loads``: dealt as they stand, the segments of 3 chunks of parity's varlen N=64 T=6656 met on
        programs of 7 chunks, where 5 suffice); built on first use and kept."""
        if not self.warm_up:
            raise ValueError("walks over segments take their entering states from warm-ups (warm_up=True)")
        key = heads, programs
        if key not in self._walks:
            rows = []
            for (first, end), n in zip(self.layout.spans, self.sequences):
                start, last = self.sequence_spans[n]
                rows += [(n * heads + h, start, first, end, WALK_STORES_HT if end == last else 0) for h in range(heads)]
            loads = warm_up_loads([triton.cdiv(end - start, CHUNK) for start, end in self.sequence_spans], self.chunks)
            self._walks[key] = WalkOrder.deal(rows, [load for load in loads for _ in range(heads)], programs,
                                              self.parent.device, drop_empty=True)
        return self._walks[key]


@dataclass
class ChunkWorkspace:
    """Every intermediate of one problem size, allocated once so that a timed call allocates nothing.

    Token-indexed buffers are flat over the B * T tokens. Tests read the intermediates from here.
    """

    gc: Tensor  # [B*T, HV] fp32, chunk-local cumulative log decay
    A_diag: Tensor  # [NT, HV, C, 16] fp32 scratch of the solve: A's 16 x 16 diagonal blocks, transposed
    # [B*T, HV, C] input dtype, each chunk's rows of (I + A)^-1 (multi-kernel) or of (I + A)^-1 diag(beta)
    # (chunk_fused, whose state pass takes v_new from it and never stores W or U)
    Ai: Tensor
    W: Tensor | None  # [B*T, HV, K] input dtype (multi-kernel)
    U: Tensor | None  # [B*T, HV, V] input dtype (multi-kernel)
    beta: Tensor | None  # [B*T, HV] fp32 sigmoid(b): raw gating in the multi-kernel pipeline
    v_new: Tensor | None  # [B*T, HV, V] input dtype (None: output fused into the state pass)
    h: Tensor | None  # [NT or NP, HV, K, V] input dtype, the state entering each output block (None likewise)
    final_state: Tensor | None  # [N, HV, K, V] fp32
    # the chunk-parallel state pass (SegmentLayout), fp32, per segment: state from zero, transition,
    # entering state
    seg_L: Tensor | None = None  # [segments, HV, K, V]
    seg_M: Tensor | None = None  # [segments, HV, K, K]
    seg_init: Tensor | None = None  # [segments, HV, K, V]
    # chunk_fused's pipeline (PipelineLayout): the state one group hands the next, two in turn, fp32
    handoff: Tensor | None = None  # [2, N, HV, K, V]

    @classmethod
    def allocate(cls, layout: ChunkLayout, q: Tensor, v: Tensor, *, stages: bool, raw_gate: bool,
                 fuse_output: bool, final_state: bool, segments: SegmentLayout | None = None,
                 output_span: int = 1, pipeline: bool = False) -> ChunkWorkspace:
        """stages: the multi-kernel pipeline's W and U (and beta for raw gating) buffers too; segments: the
        chunk-parallel state pass's; output_span: chunks per output block (h holds one state per block);
        pipeline: chunk_fused's groups' hand-off states."""
        B, T, _, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        BT, dt, dev = B * T, q.dtype, q.device

        def empty(*shape, dtype=dt):
            return torch.empty(*shape, dtype=dtype, device=dev)

        return cls(
            gc=empty(BT, HV, dtype=torch.float32), A_diag=empty(layout.NT, HV, CHUNK, 16, dtype=torch.float32),
            Ai=empty(BT, HV, CHUNK), W=empty(BT, HV, K) if stages else None, U=empty(BT, HV, V) if stages else None,
            beta=empty(BT, HV, dtype=torch.float32) if stages and raw_gate else None,
            v_new=None if fuse_output else empty(BT, HV, V),
            h=None if fuse_output else empty(layout.blocks(output_span)[0], HV, K, V),
            final_state=empty(layout.N, HV, K, V, dtype=torch.float32) if final_state else None,
            **({} if segments is None or segments.warm_up else dict(
                seg_L=empty(segments.layout.N, HV, K, V, dtype=torch.float32),
                seg_M=empty(segments.layout.N, HV, K, K, dtype=torch.float32),
                seg_init=empty(segments.layout.N, HV, K, V, dtype=torch.float32))),
            handoff=empty(2, layout.N, HV, K, V, dtype=torch.float32) if pipeline else None,
        )


def chunk_tier(NT: int, HV: int) -> int:
    """Autotuner key of the chunk-parallel kernels (prep, output): 0 below 128 (chunk, value head)
    pairs, 1 below 2048, 2 above. Without it a kernel was tuned once per head dim, on whichever case
    came first: parity's one-chunk case (timings a config cannot be told apart by) picked 8 warps for
    the output pass, which then made parity's larger K = 64 cases 1.2-1.3x slower (H100)."""
    pairs = NT * HV
    return 0 if pairs < 128 else 1 if pairs < 2048 else 2


def state_tier(N: int, HV: int, V: int, max_len: int) -> int:
    """Autotuner key of the state pass: its parallelism in walks of 128 value columns (N * HV * V /
    128), 0 below 64 (a long single sequence: too few programs to fill the GPU, narrow V-blocks win),
    1 below 512, 2 above; plus 3 for walks of 8 chunks or more. Without the walk length, parity's
    one-chunk case (1 pair) tuned the pass for its B=4 T=2048 HV=8 case (32 pairs, 32 chunks each):
    110 us instead of 84 of kernels on an H100. Counted in (sequence, head) pairs instead of columns,
    V = 64 cases got half the programs of V = 128 ones at the same tier: parity's varlen N=16 T=8192
    HV=4 D=64 (64 pairs) lost BV 16, whole call 57.7 us at BV 32 forced vs 53.9 at BV 16 (H100)."""
    walks = N * HV * V / 128
    return (0 if walks < 64 else 1 if walks < 512 else 2) + 3 * (max_len >= 8 * CHUNK)


@dataclass
class _Args:
    """A launch's validated arguments (tensors contiguous, flat over tokens where kernels index them)."""

    q: Tensor
    k: Tensor
    v: Tensor
    g: Tensor | None
    beta: Tensor | None
    a: Tensor | None
    b: Tensor | None
    A_log: Tensor | None
    dt_bias: Tensor | None
    h0: Tensor | None
    out: Tensor
    ws: ChunkWorkspace
    lay: ChunkLayout
    scale: float
    H: int
    HV: int
    K: int
    V: int
    BK: int
    l2norm: bool
    ieee: bool
    span: int  # chunks per output block
    stages: bool  # the multi-kernel pipeline (W and U stored), else chunk_fused's (Ai diag(beta) stored)

    @property
    def raw(self) -> bool:
        return self.a is not None


def _setup(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor | None, a: Tensor | None,
           b: Tensor | None, A_log: Tensor | None, dt_bias: Tensor | None, *, scale: float,
           initial_state: Tensor | None, output_final_state: bool, cu_seqlens: Tensor | None,
           layout: ChunkLayout | None, qk_l2norm: bool, out: Tensor | None, workspace: ChunkWorkspace | None,
           stages: bool, fuse_output: bool, segments: SegmentLayout | None = None, output_span: int = 1,
           pipeline: bool = False) -> _Args:
    """Validate a launch of either variant and fill in its layout, workspace and output."""
    B, T, H, K, HV, V = check_inputs(q, k, v, g, beta, a, b, A_log, dt_bias,
                                     head_dim_limit="one key tile per chunk")
    lay = ChunkLayout.build(B, T, cu_seqlens, q.device) if layout is None else layout
    if layout is not None and (tuple(layout.seq_bounds.shape) != (lay.N, 2) or lay.tokens != B * T or
                               tuple(lay.chunk_indices.shape) != (lay.NT, 2) or lay.chunk_offsets.numel() != lay.N + 1 or
                               (cu_seqlens is None and lay.N != B) or (cu_seqlens is not None and B != 1)):
        # a layout of a longer batch would send every kernel past the ends of this one's buffers
        raise ValueError("layout does not describe this batch")
    if lay.max_len * HV * max(K, V, CHUNK) >= 2**31:
        # tiles index rows inside a sequence in int32 (64-bit pointer math per element costs registers)
        raise ValueError(f"a sequence of {lay.max_len} tokens x {HV} heads x {max(K, V)} overflows int32 offsets")
    if initial_state is not None and initial_state.shape != (lay.N, HV, K, V):
        raise ValueError(f"initial_state must be [N, HV, K, V] = {(lay.N, HV, K, V)}")
    if segments is not None and (segments.layout.tokens != lay.tokens or segments.seg_offsets.numel() != lay.N + 1):
        raise ValueError("segments must cut this batch's layout")
    if segments is not None and output_span != 1:  # a segment may end inside a pair of the batch's chunks
        raise ValueError("the chunk-parallel state pass stores the state of every chunk (output_span 1)")
    if segments is not None and segments.warm_up and not fuse_output:
        # its warm-up chunks belong to the segment before, whose entering states are never stored
        raise ValueError("warm-up segments compute the outputs in the state pass (fuse_output=True)")
    ws = workspace or ChunkWorkspace.allocate(lay, q, v, stages=stages, raw_gate=a is not None,
                                              fuse_output=fuse_output, final_state=output_final_state,
                                              segments=segments, output_span=output_span, pipeline=pipeline)
    seg = segments is not None and not segments.warm_up  # the scan's buffers
    missing = [name for name, need in (("W", stages), ("U", stages), ("beta", stages and a is not None),
                                       ("h", not fuse_output), ("v_new", not fuse_output),
                                       ("final_state", output_final_state), ("seg_L", seg), ("seg_M", seg),
                                       ("seg_init", seg), ("handoff", pipeline)) if need and getattr(ws, name) is None]
    if missing or ws.Ai.shape != (B * T, HV, CHUNK) or ws.Ai.dtype != q.dtype or \
            (stages and (ws.W.shape != (B * T, HV, K) or ws.U.shape != (B * T, HV, V))) or \
            (not fuse_output and ws.h.shape[0] != lay.blocks(output_span)[0]):
        raise ValueError(f"workspace does not fit this call (missing {missing})" if missing
                         else "workspace was allocated for another problem size or dtype")
    out = output_buffer(out, q, B, T, HV, V)

    def flat(x: Tensor | None) -> Tensor | None:
        return None if x is None else x.contiguous()

    return _Args(q=q.contiguous(), k=k.contiguous(), v=v.contiguous(), g=flat(g), beta=flat(beta), a=flat(a),
                 b=flat(b), A_log=flat(A_log), dt_bias=flat(dt_bias),
                 h0=None if initial_state is None else initial_state.contiguous().float(),
                 out=out, ws=ws, lay=lay, scale=scale, H=H, HV=HV, K=K, V=V,
                 BK=_tile_width(K), l2norm=qk_l2norm, ieee=q.dtype == torch.float32, span=output_span,
                 stages=stages)


def _shape(x: _Args) -> dict:
    """The constexpr shape arguments every state and output pass launch takes."""
    return dict(H=x.H, HV=x.HV, K=x.K, V=x.V, BT=CHUNK, BK=x.BK, L2NORM=x.l2norm, IEEE=x.ieee)


def _state_pass(x: _Args, state_kernel, over: ChunkLayout, h0: Tensor | None, ht: Tensor | None,
                segment: int = 0, fuse: bool = False, h: Tensor | None = None,
                seg_parent: Tensor | None = None) -> None:
    """(d) over the sequences of ``over`` from h0 (fp32, or zero), the final states to ht (or not
    stored); h: where the first block's entering state goes (default: the workspace's h, whose start
    is over's first block); seg_parent: with segment 3 (over: segments of x.lay), each one's sequence."""
    ws = x.ws
    V = x.K if segment == 2 else x.V  # the transition's columns run over K
    state_kernel[lambda meta: (over.N * x.HV * triton.cdiv(V, meta["BV"]),)](
        x.q, x.k, x.v, ws.W, ws.U, ws.Ai, ws.gc, ws.h if h is None else h, ws.v_new, x.out, h0, ht,
        over.seq_bounds, over.blocks(x.span)[2], seg_parent, x.lay.seq_bounds, x.scale,
        state_tier(over.N, x.HV, V, over.max_len),
        USE_H0=h0 is not None, STORE_HT=ht is not None, FUSE_OUTPUT=fuse, SEGMENT=segment, SPAN=x.span,
        FROM_AI=not x.stages, **{**_shape(x), "V": V})


def _output_pass(x: _Args, output_kernel, over: ChunkLayout, h: Tensor | None = None) -> None:
    """(e) over the blocks of x.span chunks of ``over``; h as for _state_pass."""
    blocks, block_indices, _ = over.blocks(x.span)
    if blocks:
        output_kernel[lambda meta: (blocks * x.HV * triton.cdiv(x.V, meta["BV"]),)](
            x.q, x.k, x.ws.gc, x.ws.h if h is None else h, x.ws.v_new, x.out, over.seq_bounds, block_indices,
            x.scale, chunk_tier(over.NT, x.HV), SPAN=x.span, **_shape(x))


def _state_and_output(x: _Args, state_kernel, *, fuse_output: bool, output_final_state: bool,
                      segments: SegmentLayout | None = None, output_kernel=None) -> None:
    """(d), and (e) unless the output is fused into (d); with ``segments``, (d) chunk-parallel
    (SegmentLayout: d1-d4, or one warm-up pass). state_kernel: a TunedKernel of _chunk_state_fn; output_kernel: one of
    _chunk_output_fn (default: ``_chunk_output_kernel``), run on blocks of x.span chunks."""
    lay, ws = x.lay, x.ws
    final = ws.final_state if output_final_state else None
    if segments is None:
        _state_pass(x, state_kernel, lay, x.h0, final, fuse=fuse_output)
    elif segments.warm_up:
        _state_pass(x, state_kernel, segments.layout, x.h0, final, 3, fuse=fuse_output, seg_parent=segments.parent)
    else:
        _state_pass(x, state_kernel, segments.layout, None, ws.seg_L, 1)
        _state_pass(x, state_kernel, segments.layout, None, ws.seg_M, 2)
        _segment_scan_kernel[(lay.N * x.HV, triton.cdiv(x.V, SCAN_BV))](
            ws.seg_M, ws.seg_L, x.h0, ws.seg_init, final, segments.seg_offsets, HV=x.HV, K=x.K, V=x.V, BK=x.BK,
            BV=SCAN_BV, USE_H0=x.h0 is not None, STORE_HT=final is not None, IEEE=x.ieee, num_warps=8)
        _state_pass(x, state_kernel, segments.layout, ws.seg_init, None, fuse=fuse_output)
    if not fuse_output:
        _output_pass(x, output_kernel or _chunk_output_kernel, lay)


def chunk_gdn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None = None,
    beta: Tensor | None = None,
    *,
    a: Tensor | None = None,
    b: Tensor | None = None,
    A_log: Tensor | None = None,
    dt_bias: Tensor | None = None,
    scale: float,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    layout: ChunkLayout | None = None,
    qk_l2norm: bool = False,
    out: Tensor | None = None,
    workspace: ChunkWorkspace | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Chunked gated delta rule prefill, one kernel per stage (five launches).

    q, k [B, T, H, K]; v [B, T, HV, V]; HV a multiple of H; K, V <= 256. Gating: g (log decay, fp32) and
    beta (post-sigmoid) [B, T, HV], or raw a, b [B, T, HV] with A_log, dt_bias [HV]. Varlen: B = 1 and
    cu_seqlens [N + 1] int64. initial_state [N, HV, K, V] fp32 (K-first). ``layout`` (from
    ``ChunkLayout.build``), ``workspace`` (``ChunkWorkspace.allocate(..., stages=True)``) and ``out``
    prebuilt make the call free of host syncs and allocations (CUDA-graph capturable); without them
    they are built here (cu_seqlens is then read on the host). Returns (o [B, T, HV, V] in q's dtype,
    final_state [N, HV, K, V] fp32 or None).
    """
    x = _setup(q, k, v, g, beta, a, b, A_log, dt_bias, scale=scale, initial_state=initial_state,
               output_final_state=output_final_state, cu_seqlens=cu_seqlens, layout=layout, qk_l2norm=qk_l2norm,
               out=out, workspace=workspace, stages=True, fuse_output=False)
    lay, ws = x.lay, x.ws
    if lay.NT:
        grid = (lay.NT * x.HV,)
        beta_f = ws.beta if x.raw else x.beta
        _chunk_gate_kernel[grid](x.g, x.beta, x.a, x.b, x.A_log, x.dt_bias, ws.gc, ws.beta, lay.seq_bounds,
                                 lay.chunk_indices, HV=x.HV, BT=CHUNK, RAW_GATE=x.raw, num_warps=1)
        _chunk_kkt_solve_kernel[grid](x.k, beta_f, ws.gc, ws.A_diag, ws.Ai, lay.seq_bounds, lay.chunk_indices,
                                      H=x.H, HV=x.HV, K=x.K, BT=CHUNK, BK=x.BK, L2NORM=x.l2norm, IEEE=x.ieee,
                                      num_warps=4, num_stages=1)
        _chunk_wu_kernel[grid](x.k, x.v, beta_f, ws.gc, ws.Ai, ws.W, ws.U, lay.seq_bounds, lay.chunk_indices,
                               H=x.H, HV=x.HV, K=x.K, V=x.V, BT=CHUNK, BK=x.BK, BV=min(64, _tile_width(x.V)),
                               L2NORM=x.l2norm, IEEE=x.ieee, num_warps=8, num_stages=2)
    _state_and_output(x, _chunk_state_kernel, fuse_output=False, output_final_state=output_final_state)
    return x.out, ws.final_state if output_final_state else None


def config_label(cfg: triton.Config) -> str:
    """A chunk kernel's config as result rows print it: "BV=64 w4 s1" ("w4 s1" without a block width),
    " r128" added for a register cap."""
    bv = f"BV={cfg.kwargs['BV']} " if "BV" in cfg.kwargs else ""
    return f"{bv}w{cfg.num_warps} s{cfg.num_stages}" + (f" r{cfg.maxnreg}" if cfg.maxnreg else "")


def _config_str(kernel) -> str:
    """The config a TunedKernel ran last (the only one under the interpreter)."""
    cfg = getattr(kernel, "best_config", None) or (kernel.configs[0] if len(kernel.configs) == 1 else None)
    return "not tuned yet" if cfg is None else config_label(cfg)


def describe(state_kernel=None, *, fuse_output: bool = False, output_kernel=None, output_span: int = 1) -> str:
    """The state (and output) pass configs of the latest launch, for a result row's path."""
    state = f"state[{_config_str(state_kernel or _chunk_state_kernel)}]"
    if fuse_output:
        return state + "+output fused"
    per = "" if output_span == 1 else f" per {output_span} chunks"
    return state + f", output{per}[{_config_str(output_kernel or _chunk_output_kernel)}]"

"""Stage (b): A = strictLower(diag(beta)(Gamma o K K^T)) and (I + A)^-1 per (chunk, value head).

``kkt_solve_kernel`` is the multi-kernel pipeline's (after the gate kernel); ``fused_prep_kernel`` computes
the gate too and stores Ai = (I + A)^-1 diag(beta), from which the state pass takes each chunk's writes.
``run_prep`` launches it, or the Gluon prep kernel for Hopper (``sm90.prep``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..common.device import cast, dot
from ..common.tuning import TunedKernel
from .configs import make_configs
from .gate import gate_chunk
from .launch import Launch
from .layout import CHUNK, ChunkLayout, chunk_tier
from .sm90 import prep as sm90_prep
from .tiles import chunk_bounds, chunk_program, decay_masked, load_qk, store_tile
from .warm_up import SlowWalks, slow_args, walk_is_slow


@triton.jit
def _kkt_block(k_r, k_c, gc_r, gc_c, beta_r, rows, cols, n_valid, FP32: tl.constexpr):
    """The (rows, cols) block of A = strictLower(diag(beta) (Gamma o K K^T)), fp32; rows past
    n_valid are 0, so a short last chunk's I + A is the identity there."""
    keep = (rows[:, None] > cols[None, :]) & (rows[:, None] < n_valid)
    return decay_masked(dot(k_r, tl.trans(k_c), FP32), gc_r, gc_c, keep) * beta_r[:, None]


@triton.jit
def _diag_scratch(A_diag, i_c, i_h, HV: tl.constexpr, BT: tl.constexpr):
    """Chunk i_c's, value head i_h's [BT, 16] region of the solve's scratch A_diag [NT, HV, BT, 16]: its own,
    so that the solve may write and read all of it (a token-indexed one ends where the next sequence's
    rows begin)."""
    return A_diag + (i_c.to(tl.int64) * HV + i_h) * (BT * 16)


@triton.jit
def _kkt_inverse(b_k, b_gc, b_beta, rows, n_valid, diag, BT: tl.constexpr, FP32: tl.constexpr):
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
         (M, P = I - P M twice, P D). Their operands are rounded to b_k's dtype (fp32 inputs: kept
         fp32), as the callers round the result: a half-precision accumulator-to-operand move stays in
         registers, where a tf32 one shuffles, and P M (P and M commute) keeps the running P the
         register operand and M the shared-memory one. D enters only the first and last dots.
    """
    r = tl.arange(0, BT)
    m = tl.arange(0, 16)
    blk_r = r // 16
    b_A = _kkt_block(b_k, b_k, b_gc, b_gc, b_beta, rows, rows, n_valid, FP32)
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
    D = cast(tl.where(same, tl.reshape(tl.broadcast_to(X[:, None, :], (BT, BT // 16, 16)), (BT, BT)), 0.0), dt)
    M = dot(D, cast(tl.where(blk_r[:, None] > blk_r[None, :], b_A, 0.0), dt), FP32)
    eye = r[:, None] == r[None, :]
    P = tl.where(eye, 1.0, 0.0) - M
    M = cast(M, dt)
    for _ in tl.static_range(BT // 16 - 2):
        P = tl.where(eye, 1.0, 0.0) - dot(cast(P, dt), M, FP32)
    return dot(cast(P, dt), D, FP32)


@triton.jit
def kkt_solve_kernel(k, beta, gc, A_diag, Ai, seq_bounds, chunk_indices,
                     H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                     L2NORM: tl.constexpr, FP32: tl.constexpr):
    i_c, i_h, _ = chunk_program(HV, 1)
    bos, i_t, n_tok = chunk_bounds(seq_bounds, chunk_indices, i_c)
    rows = i_t * BT + tl.arange(0, BT)
    valid = rows < n_tok
    b_k = load_qk(k + bos * H * K + (i_h // (HV // H)) * K, rows, n_tok, H * K, K, BK, L2NORM)
    b_gc = tl.load(gc + (bos + rows) * HV + i_h, mask=valid, other=0.0)
    b_beta = tl.load(beta + (bos + rows) * HV + i_h, mask=valid, other=0.0).to(tl.float32)
    b_ai = _kkt_inverse(b_k, b_gc, b_beta, rows, n_tok, _diag_scratch(A_diag, i_c, i_h, HV, BT), BT, FP32)
    store_tile(Ai + bos * HV * BT + i_h * BT, rows, n_tok, HV * BT, tl.arange(0, BT), BT, b_ai)


# (warps, stages[, register cap]): the inverse is latency bound, so what counts is how many programs overlap on
# an SM; a register cap fits one more (docs/decisions/0019-chunk-kernel-configs.md).
PREP_CANDIDATES = [(4, 1), (4, 1, 96)]
PREP_CONFIGS = make_configs(PREP_CANDIDATES, block=False)


def _prep_prune(configs, named_args):
    """No register cap with a 128-wide key tile, where it ran level or slower (0019)."""
    if named_args["BK"] >= 128:
        return [c for c in configs if c.maxnreg is None]
    return configs


@triton.jit
def _prep_fn(k, g, beta, a, b, A_log, dt_bias, gc, A_diag, Ai, seq_bounds, chunk_indices, chunk_tier, slow_marks,
             seg_offsets, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
             RAW_GATE: tl.constexpr, L2NORM: tl.constexpr, FP32: tl.constexpr):
    i_c, i_h, _ = chunk_program(HV, 1)
    walked = True
    if slow_marks is not None:  # only the chunks of the walks marked slow: the others' segments prep their own
        walked = walk_is_slow(slow_marks, seg_offsets, tl.load(chunk_indices + 2 * i_c), i_h, HV)
    if walked:
        bos, i_t, n_tok = chunk_bounds(seq_bounds, chunk_indices, i_c)
        rows = i_t * BT + tl.arange(0, BT)
        b_gc, b_beta = gate_chunk(g, beta, a, b, A_log, dt_bias, gc, bos, rows, rows < n_tok, i_h, HV, RAW_GATE)
        b_k = load_qk(k + bos * H * K + (i_h // (HV // H)) * K, rows, n_tok, H * K, K, BK, L2NORM)
        b_ai = _kkt_inverse(b_k, b_gc, b_beta, rows, n_tok, _diag_scratch(A_diag, i_c, i_h, HV, BT), BT, FP32)
        store_tile(Ai + bos * HV * BT + i_h * BT, rows, n_tok, HV * BT, tl.arange(0, BT), BT,
                   b_ai * b_beta[None, :])


fused_prep_kernel = TunedKernel(_prep_fn, PREP_CONFIGS, ["K", "chunk_tier"], _prep_prune)


def run_prep(x: Launch, over: ChunkLayout, prep: str, first_chunk: int = 0, slow: SlowWalks | None = None) -> None:
    """The prep kernel (``plan_prep``'s) over the chunks of ``over``, the first of which is the batch's
    ``first_chunk``; with ``slow``, over the chunks of the walks it marks slow alone."""
    if not over.NT:
        return
    if prep == "sm90":
        sm90_prep.chunk_prep(x.k, x.g, x.beta, x.ws.gc, x.ws.Ai, over.seq_bounds, over.chunk_indices, x.HV, slow)
    else:
        fused_prep_kernel[(over.NT * x.HV,)](
            x.k, x.g, x.beta, x.a, x.b, x.A_log, x.dt_bias, x.ws.gc, x.ws.A_diag[first_chunk:], x.ws.Ai,
            over.seq_bounds, over.chunk_indices, chunk_tier(over.NT, x.HV), *slow_args(slow), H=x.H, HV=x.HV, K=x.K,
            BT=CHUNK, BK=x.BK, RAW_GATE=x.raw, L2NORM=x.l2norm, FP32=x.fp32)

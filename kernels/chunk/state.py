"""Stage (d): the state walk over each sequence's chunks, per (sequence, value head, V-block).

The [K, BV] state slice stays in registers (fp32) across the walk. One Triton kernel serves every
variant: chunk-entry states stored for the output pass, or the outputs computed in the walk
(``FUSE_OUTPUT``); writes from W and U, or from Ai and V (``FROM_AI``); whole sequences or warm-up segments.
``walk_with_output`` runs the walk with the output fused in, in Triton or as a Gluon kernel for Hopper.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from ..common.device import cast, dot, exp
from ..common.ints import cdiv
from ..common.tuning import TunedKernel
from .configs import config_settings, make_configs, tile_width, with_bv
from .launch import Launch, shape_constexprs
from .layout import CHUNK, WARM_UP_LOG_DECAY, ChunkLayout, SegmentLayout, state_tier
from .output import output_tile
from .plan import SM90_LONG_WALK_MIN_CHUNKS
from .sm90 import GLUON_WALKS
from .tiles import load_qk, load_tile, sequence_bounds, store_tile
from .warm_up import SlowWalks, slow_args, walk_is_slow

_WARM_UP_LOG_DECAY: tl.constexpr = tl.constexpr(WARM_UP_LOG_DECAY)


def _state_prune(configs, named_args):
    """BV no wider than V needs; at most 64 fp32 state elements per thread (more spills on sm_90); with
    the output fused in, no single-stage config narrower than 64 (``_miscompiled``), and at V = 128 only
    ``FUSED_WALK_V128``."""
    BK, V = named_args["BK"], named_args["V"]
    keep, seen = [], set()
    for c in configs:
        c = with_bv(c, min(c.kwargs["BV"], tile_width(V)))
        if BK * c.kwargs["BV"] / (32 * c.num_warps) > 64 or config_settings(c) in seen:
            continue
        if named_args["FUSE_OUTPUT"] and (_miscompiled(c) or (V == 128 and config_settings(c)[:3] != FUSED_WALK_V128)):
            continue
        seen.add(config_settings(c))
        keep.append(c)
    return keep or [triton.Config({"BV": 16}, num_warps=4, num_stages=2)]


# The walk with the output fused in has one config at V = 128, the fastest on every row measured; at V = 64 the
# candidates stay (docs/decisions/0019-chunk-kernel-configs.md).
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


# The walk without the output; BV 16 only at parallelism tiers 0 and 3 (``_state_prune_by_tier``).
STATE_CANDIDATES = [(16, 4, 3), (32, 4, 2), (32, 4, 3), (64, 4, 2), (64, 4, 3)]
STATE_CONFIGS = make_configs(STATE_CANDIDATES)


@triton.jit
def _state_fn(q, k, v, W, U, Ai, gc, h, v_new, o, h0, ht, seq_bounds, h_offsets, seg_parent, parent_bounds,
              slow_marks, seg_offsets, scale, state_tier,
              H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
              BK: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr, FUSE_OUTPUT: tl.constexpr,
              WARM_UP: tl.constexpr, SPAN: tl.constexpr, FROM_AI: tl.constexpr, L2NORM: tl.constexpr,
              FP32: tl.constexpr, BV: tl.constexpr):
    # state_tier: only a key of the tuner. h_offsets: each sequence's first h entry (its first chunk,
    # or with SPAN = 2 its first pair of chunks: then the state entering every other chunk is stored).
    # WARM_UP (each "sequence" is then a warm-up segment, see SegmentLayout): from zero, or from h0 at its
    # sequence's start (seg_parent: each segment's sequence, parent_bounds: the sequences' seq_bounds), the
    # chunks back to where the decay reaches _WARM_UP_LOG_DECAY walked first, state only; the last segment
    # of a sequence stores its final state (ht). slow_marks, seg_offsets (beside warm-up segments,
    # warm_up.SlowWalks): the segments skip the walks marked slow, the whole sequences' walk (WARM_UP False) the others.
    # 1-D grid, a walk's V-blocks side by side: they read the same W and k tiles, which they then share in
    # L2 (with the V-block as a second grid axis, every walk's first block ran before any second one)
    NV: tl.constexpr = (V + BV - 1) // BV
    i_nh, i_v = tl.program_id(0) // NV, tl.program_id(0) % NV
    i_n, i_h = i_nh // HV, i_nh % HV
    i_hk = i_h // (HV // H)
    bos, n_tok = sequence_bounds(seq_bounds, i_n)
    first_h = tl.load(h_offsets + i_n).to(tl.int64)
    cols_k = tl.arange(0, BK)
    cols_v = i_v * BV + tl.arange(0, BV)
    dt = k.dtype.element_ty

    i_t0 = 0
    ht_rows = K
    if WARM_UP:
        i_n = tl.load(seg_parent + i_n).to(tl.int64)  # from here on: the sequence (h0, ht)
    skip = False
    if slow_marks is not None:
        slow = walk_is_slow(slow_marks, seg_offsets, i_n, i_h, HV)
        skip = slow if WARM_UP else slow == 0
        n_tok = tl.where(skip, 0, n_tok)
    if WARM_UP:
        seq_bos, seq_len = sequence_bounds(parent_bounds, i_n)
        seq_bos = tl.where(skip, bos, seq_bos)  # no warm-up either
        log_decay = 0.0
        # the chunks before a segment are whole: each one's decay is gc at its last token
        while (bos + i_t0 * BT > seq_bos) & (log_decay > _WARM_UP_LOG_DECAY):
            i_t0 -= 1
            log_decay += tl.load(gc + (bos + i_t0 * BT + BT - 1) * HV + i_h)
        if USE_H0:  # h0 enters only where the warm-up reaches the sequence's start (masked load: zeros)
            b_h = load_tile(h0 + (i_n * HV + i_h).to(tl.int64) * K * V, cols_k,
                            tl.where(bos + i_t0 * BT == seq_bos, K, 0), V, cols_v, V)
        else:
            b_h = tl.zeros([BK, BV], dtype=tl.float32)
        ht_rows = tl.where(bos + n_tok == seq_bos + seq_len, K, 0)  # only a sequence's last segment stores ht
    elif USE_H0:
        b_h = load_tile(h0 + (i_n * HV + i_h).to(tl.int64) * K * V, cols_k, K, V, cols_v, V)
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
        b_hd = cast(b_h, dt)
        if not FUSE_OUTPUT:
            if i_t % SPAN == 0:
                store_tile(h + ((first_h + i_t // SPAN) * HV + i_h) * K * V, cols_k, K, V, cols_v, V, b_hd)
        b_k = load_qk(base_k, rows_in, None, H * K, K, BK, L2NORM)
        b_gc = tl.load(gc + (bos + rows_in) * HV + i_h)
        # v_new, what this chunk actually writes: U - W S, or from (I + A)^-1 diag(beta) as
        # Ai (V - exp(gc) o (K S)) (W and U never stored)
        if FROM_AI:
            b_x = -dot(b_k, b_hd, FP32) * exp(b_gc)[:, None]
            b_x += load_tile(v + bos * HV * V + i_h * V, rows_in, None, HV * V, cols_v, V).to(tl.float32)
            b_ai = load_tile(Ai + bos * HV * BT + i_h * BT, rows_in, None, HV * BT, tl.arange(0, BT), BT)
            b_v = dot(b_ai, cast(b_x, dt), FP32)
        else:
            b_v = -dot(load_tile(W + bos * HV * K + i_h * K, rows_in, None, HV * K, cols_k, K), b_hd, FP32)
            b_v += load_tile(U + bos * HV * V + i_h * V, rows_in, None, HV * V, cols_v, V).to(tl.float32)
        b_vd = cast(b_v, dt)
        if FUSE_OUTPUT:
            b_q = load_qk(q + bos * H * K + i_hk * K, rows_in, None, H * K, K, BK, L2NORM)
            b_o = output_tile(b_q, b_k, b_gc, b_hd, b_vd, rows, scale, FP32)
            rows_o = rows
            if WARM_UP:  # a warm-up chunk (i_t < 0) is the segment before's: it stores nothing
                rows_o = tl.where(rows >= 0, rows, n_tok)
            store_tile(o + bos * HV * V + i_h * V, rows_o, n_tok, HV * V, cols_v, V, b_o)
        else:
            store_tile(v_new + bos * HV * V + i_h * V, rows, n_tok, HV * V, cols_v, V, b_vd)
        gc_last = tl.load(gc + (bos + tl.minimum(i_t * BT + BT, n_tok) - 1) * HV + i_h)
        # decay each write to the chunk's end on the [C, BV] side (cheaper than on the [C, K] keys)
        b_vdec = cast(b_v * tl.where(valid, exp(gc_last - b_gc), 0.0)[:, None], dt)
        b_h = b_h * exp(gc_last) + dot(tl.trans(b_k), b_vdec, FP32)
    if STORE_HT:
        store_tile(ht + (i_n * HV + i_h).to(tl.int64) * K * V, cols_k, tl.where(skip, 0, ht_rows), V, cols_v, V, b_h)


state_kernel = TunedKernel(_state_fn, STATE_CONFIGS,
                                  ["K", "V", "FUSE_OUTPUT", "WARM_UP", "SPAN", "FROM_AI", "state_tier"],
                                  _state_prune_by_tier)


# The walk with the output fused in: each candidate wins somewhere (docs/decisions/0019-chunk-kernel-configs.md).
FUSED_STATE_CANDIDATES = [(32, 4, 2), (64, 4, 1), (64, 4, 2), (64, 8, 3)]
FUSED_STATE_CONFIGS = make_configs(FUSED_STATE_CANDIDATES)


fused_state_kernel = TunedKernel(_state_fn, FUSED_STATE_CONFIGS, ["K", "V", "FUSE_OUTPUT", "state_tier"], _state_prune)


def state_pass(x: Launch, kernel, over: ChunkLayout, h0: Tensor | None, ht: Tensor | None,
               fuse: bool = False, h: Tensor | None = None, seg_parent: Tensor | None = None,
               slow: SlowWalks | None = None) -> None:
    """(d) over the sequences of ``over`` from h0 (fp32, or zero), the final states to ht (or not
    stored); h: where the first block's entering state goes (default: the workspace's h, whose start
    is over's first block); seg_parent: each warm-up segment's sequence where over holds the segments of x.lay;
    slow (``warm_up.mark_slow_walks``): beside warm-up segments, which skip the walks it marks slow, the whole
    sequences walk only those."""
    ws = x.ws
    kernel[lambda meta: (over.N * x.HV * cdiv(x.V, meta["BV"]),)](
        x.q, x.k, x.v, ws.W, ws.U, ws.Ai, ws.gc, ws.h if h is None else h, ws.v_new, x.out, h0, ht,
        over.seq_bounds, over.blocks(x.span)[2], seg_parent, x.lay.seq_bounds, *slow_args(slow), x.scale,
        state_tier(over.N, x.HV, x.V, over.max_len),
        USE_H0=h0 is not None, STORE_HT=ht is not None, FUSE_OUTPUT=fuse, WARM_UP=seg_parent is not None, SPAN=x.span,
        FROM_AI=not x.stages, **shape_constexprs(x))


def walk_with_output(x: Launch, over: ChunkLayout, h0: Tensor | None, ht: Tensor | None, walk: str,
                     segments: SegmentLayout | None = None, slow: SlowWalks | None = None) -> None:
    """The state pass with the output fused in, over the sequences of ``over`` from h0 (or zero), final states
    to ht (or not stored): the Triton walk or a Gluon one (``GLUON_WALKS[walk]``), over warm-up segments of
    ``over`` where given (a Gluon walk with TAKES_WARM_UP_SEGMENTS); slow as for ``state_pass``."""
    if walk in GLUON_WALKS:
        walked, over_segments = (over, {}) if segments is None else (segments.layout, {"segments": segments})
        if slow is not None:
            over_segments["slow"] = slow
        GLUON_WALKS[walk].fused_walk(x.q, x.k, x.v, x.ws.gc, x.ws.Ai, x.out, h0, ht, over.seq_bounds, over.N, x.scale,
                                     long_walk=walked.max_len >= SM90_LONG_WALK_MIN_CHUNKS * CHUNK, **over_segments)
    elif segments is None:
        state_pass(x, fused_state_kernel, over, h0, ht, fuse=True, slow=slow)
    else:
        state_pass(x, fused_state_kernel, segments.layout, h0, ht, fuse=True, seg_parent=segments.parent,
                   slow=slow)

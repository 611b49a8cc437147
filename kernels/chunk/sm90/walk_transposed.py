"""The fused pipeline's walk with the output fused in, for Hopper (sm_90), in Gluon, with the state transposed.

The math of ``walk`` (and of ``state``'s Triton walk with FROM_AI and FUSE_OUTPUT), computed on
transposed tiles: one program per (sequence, value head, V-block of 64 columns) keeps S^T [64, K] in registers,
so that the state itself is the register A operand of K S and Q S, and the key and query tiles are read from
shared memory once per 64 value columns instead of once per 32. Per chunk:

    (K S)^T and (Q S)^T = S^T k^T and S^T q^T             issued together
    X^T = V^T - (K S)^T o exp(gc),  v_new^T = X^T Ai^T     (A operands from registers)
    S^T <- exp(gc_last) S^T + (v_new decayed to the chunk's end)^T k       } issued together with the next
    O^T = (Q S)^T o exp(gc) + v_new^T P^T                                   } chunk's scores K Q^T

P^T [j, i] = k_j . q_i exp(gc_i - gc_j) for i >= j goes to shared memory, as the B operand of the output. The
output is stored while the next chunk's scores finish. Tiles arrive by TMA: q and k two chunks ahead, v and Ai
one, or on long walks two (``long_walk``).

Why a second Gluon walk: its programs are twice as wide as ``walk``'s (BV 64 in one warpgroup, 255
registers; the untransposed kernel spills there), which pays where 64-column programs outnumber the SMs
and in more waves, over the Triton walk on walks of 4 chunks or more. On long walks at one program per SM
its longer chain per chunk loses to ``walk``'s two narrow ones; on walks of 4 to 11 chunks it still wins
there, down to half the SMs. It also walks warm-up segments (``layout.SegmentLayout``: each segment first
walks a few chunks before it, state only, as ``state``'s Triton walk with WARM_UP), whose sizes give it about
two programs per SM (``plan.walk_default``; the measurements are in docs/decisions/0016-gluon-walks.md).

Envelope and short last chunks as ``walk``'s (its ``unsupported``): a short last chunk's columns
past the sequence end hold the next sequence's tokens, which X, v_new and the masked output store drop.
Gluon has no interpreter: the CPU tests compile this kernel for sm_90; the GPU tests run it.
"""

from __future__ import annotations

from torch import Tensor

from ..layout import WARM_UP_LOG_DECAY, SegmentLayout
from ..warm_up import SlowWalks, slow_args
from .walk import launch, unsupported
from .gluon_hopper import GLUON_MISSING

if GLUON_MISSING is None:
    from .walk import fetch, program_walk, walk_is_slow
    from .gluon_hopper import (cta_barrier, exp, fence_async_shared, gl, gluon, mbarrier, tma, tma_store,
                               warpgroup_mma, warpgroup_mma_wait)

__all__ = ["fused_walk", "unsupported", "BV", "describe"]

BT = 64  # tokens per chunk (layout.CHUNK)
BV = 64  # value columns per program: the M of every product but the scores
WARPS = 4  # one warpgroup
TAKES_WARM_UP_SEGMENTS = True  # fused_walk(segments=...)


if GLUON_MISSING is None:
    _WARM_UP_LOG_DECAY = gl.constexpr(WARM_UP_LOG_DECAY)

    @gluon.jit
    def _gates(gc, tok, eos, i_h, HV: gl.constexpr, BT: gl.constexpr, mma: gl.constexpr):
        """gc of the chunk starting at token tok, tokens along columns and along rows of mma tiles, and at its
        last token; tokens past eos read the last one."""
        c = gl.arange(0, BT, layout=gl.SliceLayout(0, mma))
        r = gl.arange(0, BT, layout=gl.SliceLayout(1, mma))
        last = gl.minimum(tok + BT, eos) - 1
        return (gl.load(gc + gl.minimum(tok + c, last) * HV + i_h),
                gl.load(gc + gl.minimum(tok + r, last) * HV + i_h), gl.load(gc + last * HV + i_h))

    @gluon.jit
    def _scores_issue(t, k_s, q_s, bars, BT: gl.constexpr, NB: gl.constexpr, mma: gl.constexpr):
        """Chunk t's K Q^T ([j, i] = k_j . q_i), in flight."""
        mbarrier.wait(bars.index(2 * NB + 2 + t % 2), (t // 2) & 1)
        mbarrier.wait(bars.index(t % 2), (t // 2) & 1)
        return warpgroup_mma(k_s.index(t % 2), q_s.index(t % 2).permute((1, 0)),
                             gl.zeros([BT, BT], gl.float32, mma), use_acc=False, is_async=True)

    @gluon.jit
    def _scores_store(PT, gates, p_s, BT: gl.constexpr, mma: gl.constexpr):
        """p_s <- P^T: K Q^T [j, i] times exp(gc_i - gc_j) where i >= j, else 0."""
        gc_c, gc_r, _ = gates
        c = gl.arange(0, BT, layout=gl.SliceLayout(0, mma))
        r = gl.arange(0, BT, layout=gl.SliceLayout(1, mma))
        P = PT * exp(gl.where(c[None, :] >= r[:, None], gc_c[None, :] - gc_r[:, None], float("-inf")))
        p_s.store(P.to(p_s.dtype))
        fence_async_shared()
    @gluon.jit
    def _chunk_front(t, NT, bos, eos, S, gates, q_s, k_s, v_s, ai_s, bars, q_desc, v_desc, ai_desc, i_h, col_k,
                     col_v, BV: gl.constexpr, BT: gl.constexpr, mma: gl.constexpr, NB: gl.constexpr):
        """Chunk t up to v_new; refills q, v and Ai. Returns v_new^T and v_new^T decayed to the chunk's end (A
        operands) and (Q S)^T o exp(gc), the output's accumulator."""
        dt: gl.constexpr = q_desc.dtype
        a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        tok = bos + t * BT
        gc_c, _, gc_last = gates
        c = gl.arange(0, BT, layout=gl.SliceLayout(0, mma))
        valid = (tok + c < eos)[None, :]
        Sa = gl.convert_layout(S.to(dt), a_op)
        zero = gl.zeros([BV, BT], gl.float32, mma)
        KS = warpgroup_mma(Sa, k_s.index(t % 2).permute((1, 0)), zero, use_acc=False, is_async=True)
        QS = warpgroup_mma(Sa, q_s.index(t % 2).permute((1, 0)), zero, use_acc=False, is_async=True)
        # both waited here: Sa's registers are free for the rest of the chunk (255 without spills)
        KS, QS, Sa = warpgroup_mma_wait(num_outstanding=0, deps=(KS, QS, Sa))
        fetch(q_desc, tok + 2 * BT, col_k, bars.index(t % 2), q_s.index(t % 2), t + 2 < NT)
        b = t % NB  # this chunk's v and Ai buffers, and their barriers' phase
        ph = (t // NB) & 1
        mbarrier.wait(bars.index(2 + b), ph)
        X = gl.where(valid, v_s.index(b).permute((1, 0)).load(mma).to(gl.float32) - exp(gc_c)[None, :] * KS, 0.0)
        Xa = gl.convert_layout(X.to(dt), a_op)
        mbarrier.wait(bars.index(2 + NB + b), ph)
        VN = warpgroup_mma(Xa, ai_s.index(b).permute((1, 0)), zero, use_acc=False, is_async=True)
        VN, Xa = warpgroup_mma_wait(num_outstanding=0, deps=(VN, Xa))
        cta_barrier()  # every thread's reads of v_s are done before the next chunk's tiles land there
        more = t + NB < NT
        fetch(v_desc, tok + NB * BT, col_v, bars.index(2 + b), v_s.index(b), more)
        fetch(ai_desc, tok + NB * BT, i_h * BT, bars.index(2 + NB + b), ai_s.index(b), more)
        VN = gl.where(valid, VN, 0.0)
        vn_a = gl.convert_layout(VN.to(dt), a_op)
        vnd_a = gl.convert_layout((VN * exp(gc_last - gc_c)[None, :]).to(dt), a_op)
        return vn_a, vnd_a, QS * exp(gc_c)[None, :]

    @gluon.jit
    def _chunk_back(t, NT, bos, eos, S, vn_a, vnd_a, QSd, gates, gc, i_h, k_s, q_s, p_s, o_s, bars, k_desc,
                    o_desc, o, col_k, col_v, scale, HV: gl.constexpr, V: gl.constexpr, BV: gl.constexpr,
                    BT: gl.constexpr, NB: gl.constexpr, mma: gl.constexpr, LAST: gl.constexpr,
                    STORE_O: gl.constexpr):
        """Chunk t's state update and output, issued with the next chunk's scores (the last chunk's again after
        it: its tiles are still there, and no branch splits an accumulator); stores the output (STORE_O: not
        a warm-up chunk's), refills k, and stores the next chunk's scores. LAST: the last chunk,
        which may be short. Returns (S, the next chunk's gates)."""
        k_cur = k_s.index(t % 2)
        S = warpgroup_mma(vnd_a, k_cur, S * exp(gates[2]), is_async=True)
        O = warpgroup_mma(vn_a, p_s, QSd, is_async=True)
        tok = bos + t * BT
        nxt = _gates(gc, tok + BT, eos, i_h, HV, BT, mma)
        PT = _scores_issue(gl.minimum(t + 1, NT - 1), k_s, q_s, bars, BT, NB, mma)
        S, O, vn_a, vnd_a = warpgroup_mma_wait(num_outstanding=1, deps=(S, O, vn_a, vnd_a))
        fetch(k_desc, tok + 2 * BT, col_k, bars.index(2 * NB + 2 + t % 2), k_cur, t + 2 < NT)
        if STORE_O:
            tma.store_wait(pendings=0)  # the last chunk's output has left o_s
            store_output(O * scale, o_s, tok, eos, o_desc, o, col_v, HV, V, BT, BV, LAST)
        PT = warpgroup_mma_wait(num_outstanding=0, deps=(PT, ))
        _scores_store(PT, nxt, p_s, BT, mma)
        return S, nxt

    @gluon.jit
    def _chunk(t, NT, bos, eos, S, gates, tiles, o, gc, i_h, col_k, col_v, scale, HV: gl.constexpr,
               V: gl.constexpr, BV: gl.constexpr, BT: gl.constexpr, NB: gl.constexpr, mma: gl.constexpr,
               LAST: gl.constexpr, STORE_O: gl.constexpr):
        """Chunk t, front and back (LAST, STORE_O: ``_chunk_back``'s). Returns (S, the next chunk's gates)."""
        q_s, k_s, v_s, ai_s, p_s, o_s, bars, q_desc, k_desc, v_desc, ai_desc, o_desc = tiles
        vn_a, vnd_a, QSd = _chunk_front(t, NT, bos, eos, S, gates, q_s, k_s, v_s, ai_s, bars, q_desc, v_desc,
                                        ai_desc, i_h, col_k, col_v, BV, BT, mma, NB)
        return _chunk_back(t, NT, bos, eos, S, vn_a, vnd_a, QSd, gates, gc, i_h, k_s, q_s, p_s, o_s, bars, k_desc,
                           o_desc, o, col_k, col_v, scale, HV, V, BV, BT, NB, mma, LAST, STORE_O)

    @gluon.jit
    def store_output(O, o_t, tok, eos, o_desc, o, col_v, HV: gl.constexpr, V: gl.constexpr, BT: gl.constexpr,
                     BV: gl.constexpr, LAST: gl.constexpr = True):
        """A chunk's O^T [BV, BT] (its tokens from tok, value columns from col_v) into the output o: by TMA through
        the shared-memory tile o_t, free by then, or where the chunk is short (only a walk's LAST may be), row by
        row: TMA would write its rows past the end, into the next sequence's."""
        if not LAST or tok + BT <= eos:
            o_t.permute((1, 0)).store(O.to(o_t.dtype))
            fence_async_shared()
            tma_store(o_desc, [tok, col_v], o_t)
        else:
            mma: gl.constexpr = O.type.layout
            c = gl.arange(0, BT, layout=gl.SliceLayout(0, mma))
            r = gl.arange(0, BV, layout=gl.SliceLayout(1, mma))
            ptrs = o + (tok + c).to(gl.int64)[None, :] * (HV * V) + (col_v + r)[:, None]
            gl.store(ptrs, O.to(o_t.dtype), mask=(tok + c < eos)[None, :])

    @gluon.jit
    def state_offsets(i_nh, i_v, K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr, mma_s: gl.constexpr):
        """Offsets of the program's S^T [BV, K] in h0 / ht [N, HV, K, V]."""
        r = gl.arange(0, BV, layout=gl.SliceLayout(1, mma_s))
        c = gl.arange(0, K, layout=gl.SliceLayout(0, mma_s))
        return i_nh.to(gl.int64) * K * V + c[None, :] * V + (i_v * BV + r)[:, None]

    @gluon.jit
    def _state_of_walk(i_nh, i_h, first, eos, seg_parent, parent_bounds, HV: gl.constexpr, WARM_UP: gl.constexpr):
        """(the walk's state's row in h0 / ht, the token its walk starts from h0 at (its sequence's start),
        whether it ends with ht): a warm-up segment (layout.SegmentLayout) takes its sequence's h0 where
        its walk starts at the sequence's start, and stores its ht where it ends the sequence; a whole sequence,
        both always."""
        if WARM_UP:
            i_seq = gl.load(seg_parent + i_nh // HV)
            return (i_seq * HV + i_h, gl.load(parent_bounds + 2 * i_seq).to(gl.int32),
                    eos == gl.load(parent_bounds + 2 * i_seq + 1).to(gl.int32))
        else:
            return i_nh, first, True

    @gluon.jit
    def chunk_tokens(BT: gl.constexpr):
        """0 .. BT - 1 over the calling partition's warps: a token a thread, or more where its warps are fewer."""
        return gl.arange(0, BT, layout=gl.BlockedLayout([max(BT // (32 * gl.num_warps()), 1)], [32], [gl.num_warps()],
                                                        [0]))

    @gluon.jit
    def warm_up_start(gates, bos, seq_bos, i_h, HV: gl.constexpr, BT: gl.constexpr, CUMSUM: gl.constexpr):
        """Where a warm-up segment starting at bos starts walking: as many whole chunks back as their summed
        log decay needs to reach WARM_UP_LOG_DECAY, or its sequence's start. gates: the chunk-local cumulative log
        decays gc (CUMSUM: a chunk's sum is its last token's), or the log decays g, a chunk's summed over its
        tokens (``specialized``'s loader, which keeps no gc in memory)."""
        start = bos
        log_decay = 0.0
        while (start > seq_bos) & (log_decay > _WARM_UP_LOG_DECAY):
            start -= BT
            if CUMSUM:
                log_decay += gl.load(gates + (start + BT - 1) * HV + i_h)
            else:
                i = chunk_tokens(BT)
                log_decay += gl.sum(gl.load(gates + (start + i) * HV + i_h).to(gl.float32), axis=0)
        return start

    @gluon.jit
    def _skipped(slow_marks, seg_offsets, i_state, HV: gl.constexpr, WARM_UP: gl.constexpr):
        """1 where this program walks nothing, else 0 (int32): beside warm-up segments the segments skip the walks
        marked slow, the whole sequences the others."""
        slow = walk_is_slow(slow_marks, seg_offsets, i_state // HV, i_state % HV, HV)
        if WARM_UP:
            return slow
        else:
            return 1 - slow

    @gluon.jit
    def _fused_walk_kernel(q_desc, k_desc, v_desc, ai_desc, o_desc, o, gc, h0, ht, seq_bounds, scale, seg_parent,
                           parent_bounds, slow_marks, seg_offsets, H: gl.constexpr, HV: gl.constexpr,
                           K: gl.constexpr, V: gl.constexpr,
                           BV: gl.constexpr, BT: gl.constexpr, USE_H0: gl.constexpr, STORE_HT: gl.constexpr,
                           LONG_WALK: gl.constexpr, WARM_UP: gl.constexpr):
        NB: gl.constexpr = 2 if LONG_WALK else 1  # v and Ai buffers (q and k: 2)
        i_nh, i_h, i_v, first, eos, NT = program_walk(seq_bounds, HV, V, BV, BT)
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
        mma_s: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, K, 16])
        i_state, seq_bos, _ = _state_of_walk(i_nh, i_h, first, eos, seg_parent, parent_bounds, HV, WARM_UP)
        skip = 0
        if slow_marks is not None:
            skip = _skipped(slow_marks, seg_offsets, i_state, HV, WARM_UP)
        bos = first
        if WARM_UP:  # from a few chunks before the segment
            bos = warm_up_start(gc, first, seq_bos + skip * (first - seq_bos), i_h, HV, BT, True)
            NT = (eos - bos + BT - 1) // BT
        NT = NT * (1 - skip)
        if USE_H0:
            S = gl.where(bos == seq_bos, gl.load(h0 + state_offsets(i_state, i_v, K, V, BV, mma_s)), 0.0)
        else:
            S = gl.zeros([BV, K], gl.float32, mma_s)
        dt: gl.constexpr = q_desc.dtype
        q_s = gl.allocate_shared_memory(dt, [2, BT, K], q_desc.layout)
        k_s = gl.allocate_shared_memory(dt, [2, BT, K], k_desc.layout)
        v_s = gl.allocate_shared_memory(dt, [NB, BT, BV], v_desc.layout)
        ai_s = gl.allocate_shared_memory(dt, [NB, BT, BT], ai_desc.layout)
        p_s = gl.allocate_shared_memory(dt, [BT, BT], ai_desc.layout)
        o_s = gl.allocate_shared_memory(dt, [BT, BV], o_desc.layout)
        # q: 2, v and Ai: NB each, k: 2
        bars = gl.allocate_shared_memory(gl.int64, [2 * NB + 4, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2 * NB + 4):
            mbarrier.init(bars.index(i), count=1)
        if NT > 0:  # an empty sequence (varlen) keeps h0
            col_v = i_h * V + i_v * BV
            col_k = (i_h // (HV // H)) * K
            for i in gl.static_range(2):
                fetch(q_desc, bos + i * BT, col_k, bars.index(i), q_s.index(i), NT > i)
                fetch(k_desc, bos + i * BT, col_k, bars.index(2 * NB + 2 + i), k_s.index(i), NT > i)
            for i in gl.static_range(NB):
                fetch(v_desc, bos + i * BT, col_v, bars.index(2 + i), v_s.index(i), NT > i)
                fetch(ai_desc, bos + i * BT, i_h * BT, bars.index(2 + NB + i), ai_s.index(i), NT > i)
            gates = _gates(gc, bos, eos, i_h, HV, BT, mma)
            PT = warpgroup_mma_wait(num_outstanding=0, deps=(_scores_issue(0, k_s, q_s, bars, BT, NB, mma), ))
            _scores_store(PT, gates, p_s, BT, mma)
            tiles = (q_s, k_s, v_s, ai_s, p_s, o_s, bars, q_desc, k_desc, v_desc, ai_desc, o_desc)
            warm_up_chunks = (first - bos) // BT
            for t in range(0, warm_up_chunks):  # state only (a loop of its own: no more registers in the other)
                S, gates = _chunk(t, NT, bos, eos, S, gates, tiles, o, gc, i_h, col_k, col_v, scale, HV, V, BV, BT,
                                  NB, mma, False, False)
            for t in range(warm_up_chunks, NT - 1):
                S, gates = _chunk(t, NT, bos, eos, S, gates, tiles, o, gc, i_h, col_k, col_v, scale, HV, V, BV, BT,
                                  NB, mma, False, True)
            S, gates = _chunk(NT - 1, NT, bos, eos, S, gates, tiles, o, gc, i_h, col_k, col_v, scale, HV, V, BV, BT,
                              NB, mma, True, True)
            tma.store_wait(pendings=0)
        for i in gl.static_range(2 * NB + 4):
            mbarrier.invalidate(bars.index(i))
        if STORE_HT:  # computed anew (+ min(NT, 0) = 0): kept from the start, these spill the walk
            i_state, _, to_ht = _state_of_walk(i_nh + gl.minimum(NT, 0), i_h, first, eos, seg_parent, parent_bounds, HV,
                                               WARM_UP)
            if slow_marks is not None:
                to_ht = to_ht & (_skipped(slow_marks, seg_offsets, i_state, HV, WARM_UP) == 0)
            if to_ht:
                gl.store(ht + state_offsets(i_state, i_v, K, V, BV, mma_s), S)


def fused_walk(q: Tensor, k: Tensor, v: Tensor, gc: Tensor, Ai: Tensor, out: Tensor, h0: Tensor | None,
               ht: Tensor | None, seq_bounds: Tensor, N: int, scale: float, long_walk: bool,
               segments: SegmentLayout | None = None, slow: SlowWalks | None = None) -> None:
    """``walk.fused_walk``'s call and result. long_walk: v and Ai tiles two chunks ahead (16 KB
    more shared memory). segments: warm-up segments (``layout.SegmentLayout``) of the N sequences
    of seq_bounds, walked instead of whole sequences, each from a few chunks before it (its outputs only).
    slow (``warm_up.mark_slow_walks``): segments skip the walks it marks slow, whole sequences walk only those."""
    slow_marks, seg_offsets = slow_args(slow)
    if segments is None:
        launch(_fused_walk_kernel, BV, q, k, v, gc, Ai, out, h0, ht, seq_bounds, N, scale, long_walk,
               seg_parent=None, parent_bounds=None, slow_marks=slow_marks, seg_offsets=seg_offsets, WARM_UP=False)
    else:
        launch(_fused_walk_kernel, BV, q, k, v, gc, Ai, out, h0, ht, segments.layout.seq_bounds, segments.layout.N,
               scale, long_walk, seg_parent=segments.parent, parent_bounds=seq_bounds, slow_marks=slow_marks,
               seg_offsets=seg_offsets, WARM_UP=True)


def describe() -> str:
    """The walk's settings, for a result row's path."""
    return f"gluon sm90 transposed walk BV={BV} w{WARPS} (async wgmma, TMA)"

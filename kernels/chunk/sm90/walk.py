"""The fused pipeline's walk with the output fused in, for Hopper (sm_90), in Gluon with asynchronous wgmma.

The same math as ``state``'s Triton walk with FROM_AI and FUSE_OUTPUT: one program per (sequence, value
head, V-block of BV columns) walks the sequence's chunks with its [K, BV] state in registers, reading the prep
kernel's gc and Ai = (I + A)^-1 diag(beta). Per chunk:

    K S and Q S               issued together (the state goes through shared memory in the input dtype)
    X = V - exp(gc) o (K S),  v_new = Ai X, and Q K^T issued after it
    S <- exp(gc_last) S + K^T (v_new decayed to the chunk's end)    } issued together; only the state
    O = exp(gc) o (Q S) + lowerIncl(Gamma o Q K^T) v_new           } is waited for

The output is retired, and stored, while the next chunk's K S runs. Tiles arrive by TMA: k two chunks ahead
(two buffers); q, v and Ai one chunk ahead, or on long walks two (``long_walk``, with the gates loaded one
chunk ahead), so that no load waits on the chain.

Why a second kernel: Triton (3.6) waits for every wgmma right after issuing it, so the Triton walk runs its
six products one after the other. Here only K S -> Ai X -> the state
update is serial. Its programs are BV 32 wide: at BV 64 this kernel needs more than 255 registers and
spills. Q K^T issued after Ai X, rather than with K S, runs while v_new is stored and takes 17 fewer
registers (docs/decisions/0016-gluon-walks.md has both measurements). So it pays where BV 32's programs make one
wave of two per SM and ``walk_transposed``'s twice as wide ones would leave over half the SMs idle,
or run long walks one per SM (``plan.walk_default``, with the measurements). Given slow marks
(``warm_up.mark_slow_walks``) it walks only the walks they mark, whole, after the warp-specialized kernel's warm-up
segments of the others (``plan.ChunkPlan.whole_walk``).

Envelope (``unsupported``): sm_90, bf16 or fp16 inputs, K = V = 128, q and k normalised beforehand (the
Triton walk normalises them per tile). Any sequence lengths: a short last chunk's rows past the sequence
end hold the next sequence's tokens (TMA cannot clamp rows), which its masks drop as the Triton walk's
clamped rows are dropped: Ai's columns for them are 0 (beta = 0 there), X and v_new are zeroed there, the
causal mask drops them as keys, the state update drops their writes, and that chunk's output is stored row by row.
Gluon has no interpreter: the CPU tests compile this kernel for sm_90; the GPU tests run it.
"""

from __future__ import annotations

from torch import Tensor

from ..warm_up import SlowWalks, slow_args
from .gluon_hopper import GLUON_MISSING, descriptor, unsupported_inputs

if GLUON_MISSING is None:
    from .gluon_hopper import (cta_barrier, exp, fence_async_shared, gl, gluon, mbarrier, tma, tma_load, tma_store,
                               warpgroup_mma, warpgroup_mma_wait)

__all__ = ["fused_walk", "unsupported", "BV", "describe"]

BT = 64  # tokens per chunk (layout.CHUNK)
BV = 32  # value columns per program (see the module docstring)
WARPS = 4  # one warpgroup
TAKES_WARM_UP_SEGMENTS = False  # whole sequences only


if GLUON_MISSING is None:
    @gluon.jit
    def fetch(desc, row, col, bar, dst, pred):
        """dst <- desc's tile at (row, col) by TMA, completing on bar (nothing when not pred)."""
        mbarrier.expect(bar, desc.block_type.nbytes, pred=pred)
        tma_load(desc, [row, col], bar, dst, pred=pred)

    @gluon.jit
    def _gates(gc, tok, eos, i_h, HV: gl.constexpr, BT: gl.constexpr, mma_v: gl.constexpr, mma_t: gl.constexpr):
        """gc of the chunk starting at token tok: its rows in the layouts of the [BT, BV] tiles (rows) and of the
        scores (rows, columns), and at its last token; rows past eos read the last one."""
        r_v = gl.arange(0, BT, layout=gl.SliceLayout(1, mma_v))
        r_t = gl.arange(0, BT, layout=gl.SliceLayout(1, mma_t))
        c_t = gl.arange(0, BT, layout=gl.SliceLayout(0, mma_t))
        last = gl.minimum(tok + BT, eos) - 1
        return (gl.load(gc + gl.minimum(tok + r_v, last) * HV + i_h),
                gl.load(gc + gl.minimum(tok + r_t, last) * HV + i_h),
                gl.load(gc + gl.minimum(tok + c_t, last) * HV + i_h), gl.load(gc + last * HV + i_h))

    @gluon.jit
    def _chunk_front(t, NT, bos, eos, S, O, gates, q_s, k_s, v_s, ai_s, s_s, x_s, vn_s, o_s, bars, q_desc, v_desc,
                     ai_desc, o_desc, gc, i_h, col_k, col_v, scale, HV: gl.constexpr, BT: gl.constexpr,
                     BV: gl.constexpr, mma_v: gl.constexpr, mma_t: gl.constexpr, HAS_O: gl.constexpr,
                     LONG_WALK: gl.constexpr, NB: gl.constexpr):
        """Chunk t up to v_new, storing O (chunk t - 1's pending output) on the way. Leaves v_new in vn_s and
        its rows decayed to the chunk's end in x_s; returns (the scores as an A operand, exp(gc) o Q S,
        gc at the chunk's last token, gates). q_s, v_s and ai_s hold NB buffers, refilled NB chunks ahead.
        LONG_WALK: ``gates`` holds this chunk's gc (``_gates``), and the next chunk's are loaded here and
        returned, so that their latency hides behind this chunk; else this chunk's are loaded here and
        ``gates`` passes through."""
        dt: gl.constexpr = q_desc.dtype
        tok = bos + t * BT
        r_v = gl.arange(0, BT, layout=gl.SliceLayout(1, mma_v))
        r_t = gl.arange(0, BT, layout=gl.SliceLayout(1, mma_t))
        c_t = gl.arange(0, BT, layout=gl.SliceLayout(0, mma_t))
        if LONG_WALK:
            gc_v, gc_r, gc_c, gc_last = gates
            gates = _gates(gc, tok + BT, eos, i_h, HV, BT, mma_v, mma_t)
        else:
            gc_v, gc_r, gc_c, gc_last = _gates(gc, tok, eos, i_h, HV, BT, mma_v, mma_t)
        valid = (tok + r_v < eos)[:, None]
        s_s.store(S.to(dt))
        fence_async_shared()
        k_cur = k_s.index(t % 2)
        b = t % NB  # this chunk's q, v and Ai buffers, and their barriers' phase
        ph = (t // NB) & 1
        q_cur = q_s.index(b)
        mbarrier.wait(bars.index(3 * NB + t % 2), (t // 2) & 1)
        zero = gl.zeros([BT, BV], gl.float32, mma_v)
        KS = warpgroup_mma(k_cur, s_s, zero, use_acc=False, is_async=True)
        mbarrier.wait(bars.index(b), ph)
        QS = warpgroup_mma(q_cur, s_s, zero, use_acc=False, is_async=True)
        if HAS_O:  # in-order completion: K S done means chunk t - 1's output is too
            KS, O = warpgroup_mma_wait(num_outstanding=1, deps=(KS, O))
            _store_tile(O * scale, tok - BT, col_v, o_s, o_desc)
        else:
            KS = warpgroup_mma_wait(num_outstanding=1, deps=(KS, ))
        mbarrier.wait(bars.index(NB + b), ph)
        X = gl.where(valid, v_s.index(b).load(mma_v).to(gl.float32) - exp(gc_v)[:, None] * KS, 0.0)
        x_s.store(X.to(dt))
        fence_async_shared()
        mbarrier.wait(bars.index(2 * NB + b), ph)
        VN = warpgroup_mma(ai_s.index(b), x_s, zero, use_acc=False, is_async=True)
        # Q K^T after Ai X, not with K S: it then runs while v_new is stored rather than ahead of Ai X
        QK = warpgroup_mma(q_cur, k_cur.permute((1, 0)), gl.zeros([BT, BT], gl.float32, mma_t), use_acc=False,
                           is_async=True)
        VN, QS = warpgroup_mma_wait(num_outstanding=1, deps=(VN, QS))
        cta_barrier()  # every thread's reads of v_s are done before the next chunk's tiles land there
        more = t + NB < NT
        fetch(v_desc, tok + NB * BT, col_v, bars.index(NB + b), v_s.index(b), more)
        fetch(ai_desc, tok + NB * BT, i_h * BT, bars.index(2 * NB + b), ai_s.index(b), more)
        VN = gl.where(valid, VN, 0.0)
        vn_s.store(VN.to(dt))
        x_s.store((VN * exp(gc_last - gc_v)[:, None]).to(dt))
        fence_async_shared()
        QK = warpgroup_mma_wait(num_outstanding=0, deps=(QK, ))
        fetch(q_desc, tok + NB * BT, col_k, bars.index(b), q_cur, more)
        P = QK * exp(gl.where(r_t[:, None] >= c_t[None, :], gc_r[:, None] - gc_c[None, :], float("-inf")))
        Pa = gl.convert_layout(P.to(dt), gl.DotOperandLayout(operand_index=0, parent=mma_v, k_width=2))
        return Pa, QS * exp(gc_v)[:, None], gc_last, gates

    @gluon.jit
    def _chunk_back(t, NT, bos, S, Pa, QSd, gc_last, k_s, x_s, vn_s, bars, k_desc, col_k, BT: gl.constexpr,
                    NB: gl.constexpr):
        """Chunk t's state update and output, issued together; waits for the state only and refills the
        chunk's k buffer with chunk t + 2. Returns (S, the output still in flight)."""
        k_cur = k_s.index(t % 2)
        S = warpgroup_mma(k_cur.permute((1, 0)), x_s, S * exp(gc_last), is_async=True)
        O = warpgroup_mma(Pa, vn_s, QSd, is_async=True)
        S = warpgroup_mma_wait(num_outstanding=1, deps=(S, ))
        fetch(k_desc, bos + (t + 2) * BT, col_k, bars.index(3 * NB + t % 2), k_cur, t + 2 < NT)
        return S, O

    @gluon.jit
    def program_walk(seq_bounds, HV: gl.constexpr, V: gl.constexpr, BV: gl.constexpr, BT: gl.constexpr):
        """This program's walk: (sequence * HV + value head, value head, V-block, the sequence's first token, its
        end, its chunks)."""
        i_nh = gl.program_id(0) // (V // BV)
        i_n = i_nh // HV
        bos = gl.load(seq_bounds + 2 * i_n).to(gl.int32)
        eos = gl.load(seq_bounds + 2 * i_n + 1).to(gl.int32)
        return i_nh, i_nh % HV, gl.program_id(0) % (V // BV), bos, eos, (eos - bos + BT - 1) // BT

    @gluon.jit
    def walk_is_slow(marks, seg_offsets, i_n, i_h, HV: gl.constexpr):
        """Whether the walk of sequence i_n, value head i_h is too slow for warm-up segments (``warm_up.SlowWalks``),
        as int32 1 or 0."""
        block: gl.constexpr = 32 * gl.num_warps()
        s = gl.arange(0, block, layout=gl.BlockedLayout([1], [32], [gl.num_warps()], [0]))
        lo = gl.load(seg_offsets + i_n)
        hi = gl.load(seg_offsets + i_n + 1)
        slow = gl.to_tensor(0)
        for s0 in range(lo, hi, block):
            slow = gl.maximum(slow, gl.max(gl.load(marks + (s0 + s) * HV + i_h, mask=s0 + s < hi, other=0), axis=0))
        return slow

    @gluon.jit
    def _store_tile(O, row, col, o_s, o_desc):
        """O to the output tile at (row, col) by TMA, through o_s (once its previous tile has left)."""
        tma.store_wait(pendings=0)
        o_s.store(O.to(o_s.dtype))
        fence_async_shared()
        tma_store(o_desc, [row, col], o_s)

    @gluon.jit
    def _fused_walk_kernel(q_desc, k_desc, v_desc, ai_desc, o_desc, o, gc, h0, ht, seq_bounds, scale, slow_marks,
                           seg_offsets, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                           BV: gl.constexpr, BT: gl.constexpr, USE_H0: gl.constexpr, STORE_HT: gl.constexpr,
                           LONG_WALK: gl.constexpr):
        NB: gl.constexpr = 2 if LONG_WALK else 1  # q, v and Ai buffers
        i_nh, i_h, i_v, bos, eos, NT = program_walk(seq_bounds, HV, V, BV, BT)
        walks = 1  # with slow marks, only the walks they mark (the others run as warm-up segments elsewhere)
        if slow_marks is not None:
            walks = walk_is_slow(slow_marks, seg_offsets, i_nh // HV, i_h, HV)
        NT = NT * walks
        mma_v: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BV, 16])
        mma_t: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
        rows_k = gl.arange(0, K, layout=gl.SliceLayout(1, mma_v))
        cols_v = gl.arange(0, BV, layout=gl.SliceLayout(0, mma_v))
        h_off = i_nh.to(gl.int64) * K * V + rows_k[:, None] * V + (i_v * BV + cols_v)[None, :]
        if USE_H0:
            S = gl.load(h0 + h_off)
        else:
            S = gl.zeros([K, BV], gl.float32, mma_v)
        dt: gl.constexpr = q_desc.dtype
        q_s = gl.allocate_shared_memory(dt, [NB, BT, K], q_desc.layout)
        k_s = gl.allocate_shared_memory(dt, [2, BT, K], k_desc.layout)
        v_s = gl.allocate_shared_memory(dt, [NB, BT, BV], v_desc.layout)
        ai_s = gl.allocate_shared_memory(dt, [NB, BT, BT], ai_desc.layout)
        s_s = gl.allocate_shared_memory(dt, [K, BV], v_desc.layout)
        x_s = gl.allocate_shared_memory(dt, [BT, BV], v_desc.layout)
        vn_s = gl.allocate_shared_memory(dt, [BT, BV], v_desc.layout)
        o_s = gl.allocate_shared_memory(dt, [BT, BV], o_desc.layout)
        # q, v and Ai: NB each, then k: 2
        bars = gl.allocate_shared_memory(gl.int64, [3 * NB + 2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(3 * NB + 2):
            mbarrier.init(bars.index(i), count=1)
        if NT > 0:  # an empty sequence (varlen) keeps h0
            col_v = i_h * V + i_v * BV
            col_k = (i_h // (HV // H)) * K
            for i in gl.static_range(NB):
                fetch(q_desc, bos + i * BT, col_k, bars.index(i), q_s.index(i), NT > i)
                fetch(v_desc, bos + i * BT, col_v, bars.index(NB + i), v_s.index(i), NT > i)
                fetch(ai_desc, bos + i * BT, i_h * BT, bars.index(2 * NB + i), ai_s.index(i), NT > i)
            for i in gl.static_range(2):
                fetch(k_desc, bos + i * BT, col_k, bars.index(3 * NB + i), k_s.index(i), NT > i)
            gates = _gates(gc, bos, eos, i_h, HV, BT, mma_v, mma_t)
            Pa, QSd, gc_last, gates = _chunk_front(0, NT, bos, eos, S, None, gates, q_s, k_s, v_s, ai_s, s_s, x_s,
                                                   vn_s, o_s, bars, q_desc, v_desc, ai_desc, o_desc, gc, i_h, col_k,
                                                   col_v, scale, HV, BT, BV, mma_v, mma_t, False, LONG_WALK, NB)
            for t in range(1, NT):
                S, O = _chunk_back(t - 1, NT, bos, S, Pa, QSd, gc_last, k_s, x_s, vn_s, bars, k_desc, col_k, BT, NB)
                Pa, QSd, gc_last, gates = _chunk_front(t, NT, bos, eos, S, O, gates, q_s, k_s, v_s, ai_s, s_s, x_s,
                                                       vn_s, o_s, bars, q_desc, v_desc, ai_desc, o_desc, gc, i_h,
                                                       col_k, col_v, scale, HV, BT, BV, mma_v, mma_t, True, LONG_WALK,
                                                       NB)
            S, O = _chunk_back(NT - 1, NT, bos, S, Pa, QSd, gc_last, k_s, x_s, vn_s, bars, k_desc, col_k, BT, NB)
            O = warpgroup_mma_wait(num_outstanding=0, deps=(O, )) * scale
            tok = bos + (NT - 1) * BT
            if tok + BT <= eos:
                _store_tile(O, tok, col_v, o_s, o_desc)
            else:  # a short last chunk: TMA would write its rows past the end, into the next sequence's
                r = gl.arange(0, BT, layout=gl.SliceLayout(1, mma_v))
                ptrs = o + (tok + r).to(gl.int64)[:, None] * (HV * V) + (col_v + cols_v)[None, :]
                gl.store(ptrs, O.to(dt), mask=(tok + r < eos)[:, None])
            tma.store_wait(pendings=0)
        for i in gl.static_range(3 * NB + 2):
            mbarrier.invalidate(bars.index(i))
        if STORE_HT:
            if walks != 0:
                gl.store(ht + h_off, S)


def unsupported(q: Tensor, V: int, qk_l2norm: bool) -> str | None:
    """Why this kernel cannot run a call with these inputs (None: it can)."""
    K = q.shape[-1]
    why = unsupported_inputs(q)
    if why:
        return why
    if K != 128 or V != 128:
        return f"written for K = V = 128, got K={K}, V={V}"
    if qk_l2norm:
        return "takes q and k normalised beforehand"
    return None


def fused_walk(q: Tensor, k: Tensor, v: Tensor, gc: Tensor, Ai: Tensor, out: Tensor, h0: Tensor | None,
               ht: Tensor | None, seq_bounds: Tensor, N: int, scale: float, long_walk: bool,
               slow: SlowWalks | None = None) -> None:
    """Outputs into ``out`` and final states into ``ht`` (or not stored) of the N sequences of seq_bounds
    ([N, 2] token ranges into the flat batch; each starts at a chunk boundary of its sequence) from h0 (fp32,
    or zero): ``state``'s Triton walk with FROM_AI and FUSE_OUTPUT. q, k [B, T, H, 128], v, out
    [B, T, HV, 128], gc [B*T, HV] fp32, Ai [B*T, HV, 64], all contiguous (see ``unsupported``).
    long_walk: load each chunk's gc one chunk ahead and its q, v and Ai tiles two (28 KB more shared memory; for
    long walks: ``state.walk_with_output``). slow (``warm_up.mark_slow_walks``): only the walks it marks slow, whose
    warm-up segments are walked elsewhere; the others write nothing."""
    slow_marks, seg_offsets = slow_args(slow)
    launch(_fused_walk_kernel, BV, q, k, v, gc, Ai, out, h0, ht, seq_bounds, N, scale, long_walk,
           slow_marks=slow_marks, seg_offsets=seg_offsets)


def launch(kernel, bv: int, q: Tensor, k: Tensor, v: Tensor, gc: Tensor, Ai: Tensor, out: Tensor,
           h0: Tensor | None, ht: Tensor | None, seq_bounds: Tensor, N: int, scale: float, long_walk: bool,
           **extra) -> None:
    """A Gluon walk kernel (this module's or walk_transposed's, which take the same arguments, and
    ``extra``) over programs of bv value columns, one warpgroup each; the rest as ``fused_walk``."""
    H, K, HV, V = q.shape[2], q.shape[3], v.shape[2], v.shape[3]
    tokens = q.shape[0] * q.shape[1]
    descs = (descriptor(q.view(tokens, H * K), [BT, K]), descriptor(k.view(tokens, H * K), [BT, K]),
             descriptor(v.view(tokens, HV * V), [BT, bv]), descriptor(Ai.view(tokens, HV * BT), [BT, BT]),
             descriptor(out.view(tokens, HV * V), [BT, bv]))
    kernel[(N * HV * (V // bv),)](*descs, out, gc, h0, ht, seq_bounds, scale, **extra, H=H, HV=HV, K=K, V=V, BV=bv,
                                  BT=BT, USE_H0=h0 is not None, STORE_HT=ht is not None, LONG_WALK=long_walk,
                                  num_warps=WARPS)


def describe() -> str:
    """The walk's settings, for a result row's path."""
    return f"gluon sm90 walk BV={BV} w{WARPS} (async wgmma, TMA)"

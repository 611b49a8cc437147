"""``chunk_fused``'s prep and walk in one warp-specialized kernel for Hopper (sm_90), in Gluon.

The two-kernel path runs the prep kernel (``chunk_prep_sm90``) over every chunk, then the walk
(``chunk_walk_transposed_sm90``): the prep's time and the walk's dependent chain add up, while neither fills
the SM on its own (BENCHMARKS.md, thirty-third session: the walk alone takes about FlashInfer's whole time).
Here one program per SM takes (sequence, value head) pairs in turn, and its three warpgroups overlap them:

  - the prep warpgroup issues the TMA loads (k, q, v) two chunks ahead, and computes each chunk's gc =
    cumsum(g), Ai = (I + A)^-1 diag(beta) (``chunk_prep_sm90``'s code, its block inverses through shared memory)
    and the gated scores P^T [j, i] = k_j . q_i exp(gc_i - gc_j) for i >= j, into shared memory, one chunk ahead
    of the walkers;
  - two walker warpgroups (value columns 0-63 and 64-127) each keep S^T [64, K] in registers and run
    ``chunk_walk_transposed_sm90``'s chain on them: (K S)^T and (Q S)^T, X^T = V^T - (K S)^T o exp(gc),
    v_new^T = X^T Ai^T, then the state update and O^T = (Q S)^T o exp(gc) + v_new^T P^T.

Shared memory (221 KB, one program per SM): k, q and v in three stages (the prep loads chunk c + 2 once it has
computed c, while the walkers walk c - 1), Ai, P^T and gc in two (the Ai stage holds L during the solve); each
walker's S^T in bf16, for (K S)^T and (Q S)^T, whose first half then takes the output on its way out by TMA.
Registers: setmaxnreg gives the walkers 176 each and the prep 152.

Measured on an H100 (BENCHMARKS.md, thirty-fourth session): 1.01-1.09x faster than the prep kernel and the Triton
walk on many walks of one chunk (parity B=64 T=64: 1.07x) and 1.01-1.04x on 512+ walks of two; 0.86x at
qwen3-next B=4 T=8192 and slower still on few long walks (it walks whole sequences only, where the default cuts
them into warm-up segments). The prep warpgroup's chain, about 11,000 cycles a chunk, set the pace. Thirty-fifth
session: with no spills in the prep warpgroup, its gates loaded two chunks ahead and its block inverses through
the diagonal blocks alone, 1.12-1.19x faster again (B=4 T=8192: 0.95x of the default path).

Thirty-sixth session: with S^T as the walkers' A operand in registers, ptxas serialized every wgmma of this
kernel ("insufficient register resources"), so that no asynchronous issue overlapped anything. S^T from shared
memory leaves the walkers 128 registers of tiles in flight, and the wgmmas pipeline: 1.02-1.14x (B=4 T=8192: 1.14x,
now 1.05x faster than the two-kernel path). ``chunk_fused.walk_default`` picks this kernel where it wins
(``SPECIALIZED_*``).

Envelope as ``chunk_prep_sm90``'s and the Gluon walks' together (``unsupported``): sm_90, bf16 or fp16,
K = V = 128, gates given, q and k normalised beforehand. Rows past a sequence's end within its last chunk
hold the next sequence's tokens, which the masks drop as the two kernels drop them.
Gluon has no interpreter: the CPU tests compile this kernel for sm_90; the GPU tests run it.
"""

from __future__ import annotations

from torch import Tensor

from .chunk_prep_sm90 import unsupported as _prep_unsupported
from .chunk_walk_sm90 import unsupported as _walk_unsupported
from .gluon_hopper import GLUON_MISSING, descriptor

if GLUON_MISSING is None:
    from .chunk_prep_sm90 import BAND, _chunk_cumsum, _gated_kkt, _solve
    from .chunk_walk_transposed_sm90 import _scores_store, _state_offsets
    from .gluon_hopper import (cta_barrier, exp, fence_async_shared, gl, gluon, mbarrier, reinterpret, tma, tma_load,
                               tma_store, warpgroup_mma, warpgroup_mma_wait)

__all__ = ["chunk_specialized", "unsupported", "describe"]

BT = 64  # tokens per chunk (chunk.CHUNK)
BV = 64  # value columns per walker
NA = 3  # stages of k, q and v
NC = 2  # stages of Ai, P^T and gc
WARPS = 4  # per warpgroup: the default one walks columns 0-63
WALK_REGS = 176  # of 504 for the three (168 each at launch); at 168 / 168 ptxas serializes the wgmmas again
PREP_REGS = 152
MAX_REGS = (2 * WALK_REGS + PREP_REGS) // 3  # at launch, for three warpgroups; setmaxnreg moves them


if GLUON_MISSING is None:
    @gluon.jit
    def _item_bounds(item, seq_bounds, HV: gl.constexpr, BT: gl.constexpr):
        """(value head, first token, end, chunks) of the (sequence, value head) pair ``item``."""
        i_n = item // HV
        bos = gl.load(seq_bounds + 2 * i_n).to(gl.int32)
        eos = gl.load(seq_bounds + 2 * i_n + 1).to(gl.int32)
        return item % HV, bos, eos, (eos - bos + BT - 1) // BT

    @gluon.jit
    def _first_chunk(n_items, step, seq_bounds, HV: gl.constexpr, BT: gl.constexpr):
        """This program's first chunk as a ``_next_chunk`` cursor."""
        return _next_chunk((gl.program_id(0) - step, 0, 0, 0, 0, 0), n_items, step, seq_bounds, HV, BT)

    @gluon.jit
    def _next_chunk(cursor, n_items, step, seq_bounds, HV: gl.constexpr, BT: gl.constexpr):
        """The chunk after ``cursor`` = (item, t, chunks, value head, first token, end): chunk t of ``item`` in this
        program's order (items pid, pid + step, ...; empty sequences have none); item >= n_items past the last.
        The bounds are loaded only when the item changes."""
        item, t, NT, i_h, bos, eos = cursor
        t += 1
        while (item < n_items) & (t >= NT):
            item += step
            t = 0
            i_h, bos, eos, NT = _item_bounds(gl.minimum(item, n_items - 1), seq_bounds, HV, BT)
        return item, t, NT, i_h, bos, eos

    @gluon.jit
    def _load_chunk(cursor, it, ring, descs, n_items, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr,
                    BT: gl.constexpr, BV: gl.constexpr, NA: gl.constexpr):
        """k, q and both halves of v of the ``_next_chunk`` cursor's chunk (this program's chunk ``it``) into stage
        it % NA, once the walkers have let go of its chunk it - NA; nothing past the last item."""
        k_s, q_s, v_s, kq_ready, kq_free = ring
        q_desc, k_desc, v_desc, _ = descs
        item, t, _, i_h, bos, _ = cursor
        live = item < n_items
        s = it % NA
        mbarrier.wait(kq_free.index(s), ((it // NA) & 1) ^ 1, pred=live)
        tok = bos + t * BT
        col_k = (i_h // (HV // H)) * K
        mbarrier.expect(kq_ready.index(s), 2 * k_desc.block_type.nbytes + 2 * v_desc.block_type.nbytes, pred=live)
        tma_load(k_desc, [tok, col_k], kq_ready.index(s), k_s.index(s), pred=live)
        tma_load(q_desc, [tok, col_k], kq_ready.index(s), q_s.index(s), pred=live)
        for half in gl.static_range(2):
            tma_load(v_desc, [tok, i_h * 2 * BV + half * BV], kq_ready.index(s), v_s.index(2 * s + half), pred=live)

    @gluon.jit
    def _prep_gates(g, beta, cursor, n_items, HV: gl.constexpr, BT: gl.constexpr):
        """(g, beta) of the ``_next_chunk`` cursor's chunk (0 past the sequence's end, or past the last item), one
        token a thread: loaded two chunks ahead, in few registers, and spread over the mma tiles' layouts through
        shared memory when used (``_prep_chunk``). In their own dtypes: a conversion here would wait for the loads
        (clock64 stamps: about 1,900 cycles a chunk, BENCHMARKS.md, thirty-fifth session)."""
        L: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        i = gl.arange(0, BT, layout=L)
        item, t, _, i_h, bos, eos = cursor
        tok = bos + t * BT
        live = (i < eos - tok) & (item < n_items)
        return gl.load(g + (tok + i) * HV + i_h, mask=live, other=0.0), gl.load(beta + (tok + i) * HV + i_h, mask=live,
                                                                                other=0.0)

    @gluon.jit
    def _prep_chunk(tok, n_valid, i_h, gates, k_cur, q_cur, ai_dst, p_dst, gc_dst, work, HV: gl.constexpr,
                    BT: gl.constexpr):
        """gc, Ai and P^T of one chunk (``chunk_prep_sm90``'s math and rounding for gc and Ai) into gc_dst, ai_dst
        and p_dst; k_cur and q_cur hold its tiles, gates its ``_prep_gates``."""
        d_s, band_s, gate_s = work
        dt: gl.constexpr = k_cur.dtype
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
        gate_s.index(0).store(gates[0].to(gl.float32))  # one round trip for the three layouts (the last chunk's
        gate_s.index(1).store(gates[1].to(gl.float32))  # reads: its end)
        cta_barrier()
        g_c = gate_s.index(0).load(gl.SliceLayout(0, mma))
        beta_r = gate_s.index(1).load(gl.SliceLayout(1, mma))
        gc_r, gc_c = _chunk_cumsum(g_c, BT, mma)
        gc_dst.store(gc_c)
        A = _gated_kkt(k_cur, gc_r, gc_c, beta_r, n_valid, BT, mma)
        # beta and gc along the columns (16 registers each) are read again after the solve rather than kept
        # through it: at 136 registers that spilled (1.04-1.07x, BENCHMARKS.md, thirty-fifth session)
        Ai = _solve(A, d_s, ai_dst, p_dst, band_s, BT, mma)  # ai_dst: L until Ai, p_dst: -M until the scores
        ai_dst.store((Ai * gate_s.index(1).load(gl.SliceLayout(0, mma))[None, :]).to(dt))
        gc_c = gc_dst.load(gl.SliceLayout(0, mma))

        # the gated scores, as chunk_walk_transposed_sm90 stores them: [j, i] = k_j . q_i exp(gc_i - gc_j), i >= j
        PT = warpgroup_mma(k_cur, q_cur.permute((1, 0)), gl.zeros([BT, BT], gl.float32, mma), use_acc=False)
        _scores_store(PT, (gc_c, gc_r, None), p_dst, BT, mma)
        cta_barrier()  # every thread's stores are done before the one arrival

    @gluon.jit
    def _prep_partition(args, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                        BT: gl.constexpr, BV: gl.constexpr, NA: gl.constexpr, NC: gl.constexpr, USE_H0: gl.constexpr,
                        STORE_HT: gl.constexpr):
        """Loads every chunk's tiles two chunks ahead and computes its gc, Ai and P^T one stage ahead of the
        walkers."""
        ring, made, work, descs, s_s, seq_bounds, g, beta, o, h0, ht, scale, n_items = args
        k_s, q_s, v_s, kq_ready, kq_free = ring
        ai_s, p_s, gc_s, c_ready, c_free = made
        step = gl.num_programs(0)
        # the first two chunks' loads; the load cursor then stays two chunks ahead of the computed one (cur), and
        # the next chunk's cursor (nxt) is the load cursor's previous one: no bounds loaded twice
        cur = _first_chunk(n_items, step, seq_bounds, HV, BT)
        _load_chunk(cur, 0, ring, descs, n_items, H, HV, K, BT, BV, NA)
        nxt = _next_chunk(cur, n_items, step, seq_bounds, HV, BT)
        _load_chunk(nxt, 1, ring, descs, n_items, H, HV, K, BT, BV, NA)
        ld = _next_chunk(nxt, n_items, step, seq_bounds, HV, BT)
        gates = _prep_gates(g, beta, cur, n_items, HV, BT)
        gates_next = _prep_gates(g, beta, nxt, n_items, HV, BT)
        it = 0
        while cur[0] < n_items:
            # two chunks ahead: the copy into gates_next at the loop's end waits for the loads (1.00-1.04x over one
            # chunk ahead, BENCHMARKS.md, thirty-fifth session)
            gates_far = _prep_gates(g, beta, ld, n_items, HV, BT)
            s = it % NA
            cs = it % NC
            mbarrier.wait(kq_ready.index(s), (it // NA) & 1)
            mbarrier.wait(c_free.index(cs), ((it // NC) & 1) ^ 1)
            tok = cur[4] + cur[1] * BT
            _prep_chunk(tok, cur[5] - tok, cur[3], gates, k_s.index(s), q_s.index(s), ai_s.index(cs), p_s.index(cs),
                        gc_s.index(cs), work, HV, BT)
            mbarrier.arrive(c_ready.index(cs), count=1)
            # chunk it + 2 into the stage of chunk it - 1, which the walkers leave while this one was computed
            _load_chunk(ld, it + 2, ring, descs, n_items, H, HV, K, BT, BV, NA)
            cur = nxt
            nxt = ld
            ld = _next_chunk(ld, n_items, step, seq_bounds, HV, BT)
            gates = gates_next
            gates_next = gates_far
            it += 1

    @gluon.jit
    def _walk_chunk(it, tok, eos, S, ring, made, s_s, o_desc, o, col_v, scale, HALF: gl.constexpr, HV: gl.constexpr,
                    V: gl.constexpr, BT: gl.constexpr, BV: gl.constexpr, NA: gl.constexpr, NC: gl.constexpr):
        """This program's chunk ``it`` (its tokens from tok) on this walker's S^T; stores its output. s_s: this walker's
        [BV, K] tile for S^T and the output. Returns S."""
        k_s, q_s, v_s, kq_ready, kq_free = ring
        ai_s, p_s, gc_s, c_ready, c_free = made
        dt: gl.constexpr = k_s.dtype
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
        a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        s = it % NA
        cs = it % NC
        c = gl.arange(0, BT, layout=gl.SliceLayout(0, mma))
        valid = (tok + c < eos)[None, :]
        zero = gl.zeros([BV, BT], gl.float32, mma)
        # S^T goes to shared memory for (K S)^T and (Q S)^T: from registers, its 32 more registers kept the two
        # products from pipelining, and ptxas serialized every wgmma of the kernel (1.02-1.14x, BENCHMARKS.md,
        # thirty-sixth session); the output leaves through the same buffer
        tma.store_wait(pendings=0)
        s_s.store(S.to(dt))
        fence_async_shared()
        mbarrier.wait(kq_ready.index(s), (it // NA) & 1)
        k_cur = k_s.index(s)
        KS = warpgroup_mma(s_s, k_cur.permute((1, 0)), zero, use_acc=False, is_async=True)
        QS = warpgroup_mma(s_s, q_s.index(s).permute((1, 0)), zero, use_acc=False, is_async=True)
        KS, QS = warpgroup_mma_wait(num_outstanding=0, deps=(KS, QS))
        mbarrier.wait(c_ready.index(cs), (it // NC) & 1)
        gc_c = gc_s.index(cs).load(gl.SliceLayout(0, mma))  # past the end: the last token's
        gc_last = gl.sum(gl.where(c == BT - 1, gc_c, 0.0), axis=0)
        X = gl.where(valid, v_s.index(2 * s + HALF).permute((1, 0)).load(mma).to(gl.float32) - exp(gc_c)[None, :] * KS,
                     0.0)
        Xa = gl.convert_layout(X.to(dt), a_op)
        VN = warpgroup_mma(Xa, ai_s.index(cs).permute((1, 0)), zero, use_acc=False, is_async=True)
        VN, Xa = warpgroup_mma_wait(num_outstanding=0, deps=(VN, Xa))
        VN = gl.where(valid, VN, 0.0)
        vn_a = gl.convert_layout(VN.to(dt), a_op)
        vnd_a = gl.convert_layout((VN * exp(gc_last - gc_c)[None, :]).to(dt), a_op)
        S = warpgroup_mma(vnd_a, k_cur, S * exp(gc_last), is_async=True)
        O = warpgroup_mma(vn_a, p_s.index(cs), QS * exp(gc_c)[None, :], is_async=True)
        S, O, vn_a, vnd_a = warpgroup_mma_wait(num_outstanding=0, deps=(S, O, vn_a, vnd_a))
        fence_async_shared()  # this walker's reads of the stages are done before TMA refills them
        cta_barrier()
        mbarrier.arrive(kq_free.index(s), count=1)
        mbarrier.arrive(c_free.index(cs), count=1)
        O = O * scale
        if tok + BT <= eos:
            o_layout: gl.constexpr = o_desc.layout
            o_t = reinterpret(s_s, dt, [2, BT, BV], o_layout).index(0)  # the first half of s_s
            o_t.permute((1, 0)).store(O.to(dt))
            fence_async_shared()
            tma_store(o_desc, [tok, col_v], o_t)
        else:  # a short last chunk: TMA would write its rows past the end, into the next sequence's
            r = gl.arange(0, BV, layout=gl.SliceLayout(1, mma))
            ptrs = o + (tok + c).to(gl.int64)[None, :] * (HV * V) + (col_v + r)[:, None]
            gl.store(ptrs, O.to(dt), mask=valid)
        return S

    @gluon.jit
    def _walker(args, HALF: gl.constexpr, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                BT: gl.constexpr, BV: gl.constexpr, NA: gl.constexpr, NC: gl.constexpr, USE_H0: gl.constexpr,
                STORE_HT: gl.constexpr):
        """Walks this program's items on value columns [HALF * BV, (HALF + 1) * BV)."""
        ring, made, work, descs, s_s, seq_bounds, g, beta, o, h0, ht, scale, n_items = args
        o_desc = descs[3]
        mma_s: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, K, 16])
        pid = gl.program_id(0)
        step = gl.num_programs(0)
        it = 0
        for item in range(pid, n_items, step):
            i_h, bos, eos, NT = _item_bounds(item, seq_bounds, HV, BT)
            if USE_H0:
                S = gl.load(h0 + _state_offsets(item, HALF, K, V, BV, mma_s))
            else:
                S = gl.zeros([BV, K], gl.float32, mma_s)
            col_v = i_h * V + HALF * BV
            for t in range(NT):
                S = _walk_chunk(it, bos + t * BT, eos, S, ring, made, s_s.index(HALF), o_desc, o, col_v, scale, HALF,
                                HV, V, BT, BV, NA, NC)
                it += 1
            if STORE_HT:
                gl.store(ht + _state_offsets(item, HALF, K, V, BV, mma_s), S)
        tma.store_wait(pendings=0)

    @gluon.jit
    def _walker_low(args, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr,
                    BV: gl.constexpr, NA: gl.constexpr, NC: gl.constexpr, USE_H0: gl.constexpr, STORE_HT: gl.constexpr):
        _walker(args, 0, H, HV, K, V, BT, BV, NA, NC, USE_H0, STORE_HT)

    @gluon.jit
    def _walker_high(args, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr,
                     BV: gl.constexpr, NA: gl.constexpr, NC: gl.constexpr, USE_H0: gl.constexpr,
                     STORE_HT: gl.constexpr):
        _walker(args, 1, H, HV, K, V, BT, BV, NA, NC, USE_H0, STORE_HT)

    @gluon.jit
    def _specialized_kernel(q_desc, k_desc, v_desc, o_desc, o, g, beta, h0, ht, seq_bounds, scale, n_items,
                            H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr,
                            BV: gl.constexpr, NA: gl.constexpr, NC: gl.constexpr, USE_H0: gl.constexpr,
                            STORE_HT: gl.constexpr, WALK_REGS: gl.constexpr, PREP_REGS: gl.constexpr):
        dt: gl.constexpr = q_desc.dtype
        tile: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BT], dt)
        k_s = gl.allocate_shared_memory(dt, [NA, BT, K], k_desc.layout)
        q_s = gl.allocate_shared_memory(dt, [NA, BT, K], q_desc.layout)
        v_s = gl.allocate_shared_memory(dt, [2 * NA, BT, BV], v_desc.layout)
        ai_s = gl.allocate_shared_memory(dt, [NC, BT, BT], tile)
        p_s = gl.allocate_shared_memory(dt, [NC, BT, BT], tile)
        gc_s = gl.allocate_shared_memory(gl.float32, [NC, BT], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
        s_s = gl.allocate_shared_memory(dt, [2, BV, K], gl.NVMMASharedLayout.get_default_for([BV, K], dt))
        d_s = gl.allocate_shared_memory(dt, [BT, BT], tile)
        band_s = gl.allocate_shared_memory(gl.float32, [BT, 16], BAND)
        kq_ready = gl.allocate_shared_memory(gl.int64, [NA, 1], mbarrier.MBarrierLayout())
        kq_free = gl.allocate_shared_memory(gl.int64, [NA, 1], mbarrier.MBarrierLayout())
        c_ready = gl.allocate_shared_memory(gl.int64, [NC, 1], mbarrier.MBarrierLayout())
        c_free = gl.allocate_shared_memory(gl.int64, [NC, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(NA):
            mbarrier.init(kq_ready.index(i), count=1)
            mbarrier.init(kq_free.index(i), count=2)  # both walkers
        for i in gl.static_range(NC):
            mbarrier.init(c_ready.index(i), count=1)
            mbarrier.init(c_free.index(i), count=2)
        ring = (k_s, q_s, v_s, kq_ready, kq_free)  # loaded by the prep warpgroup, read by all
        made = (ai_s, p_s, gc_s, c_ready, c_free)  # made by the prep warpgroup for the walkers
        gate_s = gl.allocate_shared_memory(gl.float32, [2, BT], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
        work = (d_s, band_s, gate_s)  # the prep warpgroup's own
        args = (ring, made, work, (q_desc, k_desc, v_desc, o_desc), s_s, seq_bounds, g, beta, o, h0, ht, scale, n_items)
        # constexprs listed in each partition's tuple: a tuple built apart turns them into tensors
        gl.warp_specialize([(_walker_low, (args, H, HV, K, V, BT, BV, NA, NC, USE_H0, STORE_HT)),
                            (_walker_high, (args, H, HV, K, V, BT, BV, NA, NC, USE_H0, STORE_HT)),
                            (_prep_partition, (args, H, HV, K, V, BT, BV, NA, NC, USE_H0, STORE_HT))],
                           [4, 4], [WALK_REGS, PREP_REGS])


def unsupported(q: Tensor, V: int, raw_gate: bool, qk_l2norm: bool) -> str | None:
    """Why this kernel cannot run a call with these inputs (None: it can)."""
    return _walk_unsupported(q, V, qk_l2norm) or _prep_unsupported(q, raw_gate, qk_l2norm)


def chunk_specialized(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, out: Tensor, h0: Tensor | None,
                      ht: Tensor | None, seq_bounds: Tensor, N: int, scale: float, sms: int) -> None:
    """Outputs into ``out`` and final states into ``ht`` (or not stored) of the N sequences of seq_bounds ([N, 2]
    token ranges into the flat batch) from h0 (fp32 [N, HV, K, V], or zero), in one program per SM (sms: the
    device's count). q, k [B, T, H, 128], v, out [B, T, HV, 128], g, beta [B, T, HV], all contiguous (see
    ``unsupported``)."""
    H, K, HV, V = q.shape[2], q.shape[3], v.shape[2], v.shape[3]
    tokens = q.shape[0] * q.shape[1]
    descs = (descriptor(q.view(tokens, H * K), [BT, K]), descriptor(k.view(tokens, H * K), [BT, K]),
             descriptor(v.view(tokens, HV * V), [BT, BV]), descriptor(out.view(tokens, HV * V), [BT, BV]))
    n_items = N * HV
    _specialized_kernel[(max(min(n_items, sms), 1),)](
        *descs, out, g, beta, h0, ht, seq_bounds, scale, n_items, H=H, HV=HV, K=K, V=V, BT=BT, BV=BV, NA=NA, NC=NC,
        USE_H0=h0 is not None, STORE_HT=ht is not None, WALK_REGS=WALK_REGS, PREP_REGS=PREP_REGS, num_warps=WARPS,
        maxnreg=MAX_REGS)


def describe() -> str:
    """The kernel's settings, for a result row's path."""
    return f"gluon sm90 warp-specialized prep + walk BV={BV} (regs {WALK_REGS}/{WALK_REGS}/{PREP_REGS})"

"""The fused pipeline's prep and walk in one warp-specialized kernel for Hopper (sm_90), in Gluon.

The two-kernel path runs the prep kernel (``prep``) over every chunk, then the walk
(``walk_transposed``): the prep's time and the walk's dependent chain add up, while neither fills
the SM on its own (the walk alone takes about FlashInfer's whole time).
Here one program per SM takes (sequence, value head) pairs in turn, or warm-up segments of them (WARM_UP:
``layout.SegmentLayout.walks``, whose warm-up chunks store no output), dealt on the host longest first
(``layout.WalkOrder``), and its four warpgroups overlap them:

  - the loader warpgroup (one warp of it on whole walks) issues the TMA loads (k, q, v) and loads the gates,
    gc = cumsum(g) and beta, with the exps the walkers take of them, -2^gc, 2^(gc_last - gc) and the output's scale
    2^gc (gc in log2 units), as many chunks ahead as the stages let it;
  - the prep warpgroup computes each chunk's Ai = (I + A)^-1 diag(beta) (``prep``'s code, its block
    inverses in each warp's registers) and the gated scores P [i, j] = q_i . k_j exp(gc_i - gc_j) for i >= j
    (whose gates are A's; P carries the attention scale), into shared memory, one chunk ahead of the walkers;
  - two walker warpgroups (value columns 0-63 and 64-127) each keep S^T [64, K] in registers and run
    ``walk_transposed``'s chain on them: (K S)^T and (Q S)^T, X^T = V^T - (K S)^T o exp(gc),
    v_new^T = X^T Ai^T, then the state update and O^T = (Q S)^T o scale exp(gc) + v_new^T P^T.

Shared memory (one program per SM): k, q and v in three stages (a stage's k and q in one tile), the gates and their
exps in three, Ai and P in two (the Ai stage holds -L during the solve), the solve's D and its block inverses' 4 KB
exchange: 192.1 KB, so 34.9 of the 227 are free. The output
leaves by TMA through the walker's half of the chunk's v tile, once read.
Registers: setmaxnreg gives the walkers 176 each, the prep 136 and the loader 24.

Measured against the prep kernel and the transposed walk (docs/decisions/0017-specialized-kernel.md) it wins
where many walks keep its programs busy; ``plan.walk_default`` takes it there. Its design choices and what each
bought are in docs/decisions/0020-specialized-kernel-design.md.

Envelope as ``prep``'s and the Gluon walks' together (``unsupported``): sm_90, bf16 or fp16,
K = V = 128, gates given, q and k normalised beforehand. Rows past a sequence's end within its last chunk
hold the next sequence's tokens, which the masks drop as the two kernels drop them.
Gluon has no interpreter: the CPU tests compile this kernel for sm_90; the GPU tests run it.
"""

from __future__ import annotations

from torch import Tensor

from ..layout import WALK_ROW, WALK_STORES_HT, WALK_TAKES_H0, WALK_WHOLE, WalkOrder
from ..warm_up import SlowWalks, slow_args
from .prep import unsupported as prep_unsupported
from .walk import unsupported as walk_unsupported
from .gluon_hopper import GLUON_MISSING, descriptor

if GLUON_MISSING is None:
    from .prep import exchange_buffer, solve_inverse
    from .walk import walk_is_slow
    from .walk_transposed import chunk_tokens, state_offsets, store_output, warm_up_start
    from .gluon_hopper import (LOG2E, cta_barrier, exp2, fence_async_shared, gl, gluon, mbarrier, tma, tma_load,
                               unhoisted, warpgroup_mma, warpgroup_mma_wait)

__all__ = ["chunk_specialized", "unsupported", "describe"]

BT = 64  # tokens per chunk (layout.CHUNK)
BV = 64  # value columns per walker
NA = 3  # stages of k, q and v
NC = 2  # stages of Ai and P
WARPS = 4  # per warpgroup: the default one walks columns 0-63
WALK_REGS = 176  # of 512 for the four (128 each at launch); at 168 ptxas serializes the wgmmas
PREP_REGS = 136
LOAD_REGS = 24
MAX_REGS = (2 * WALK_REGS + PREP_REGS + LOAD_REGS) // 4  # at launch; setmaxnreg moves them


if GLUON_MISSING is None:
    _WALK_ROW = gl.constexpr(WALK_ROW)
    _WALK_TAKES_H0 = gl.constexpr(WALK_TAKES_H0)
    _WALK_STORES_HT = gl.constexpr(WALK_STORES_HT)
    _WALK_WHOLE = gl.constexpr(WALK_WHOLE)
    # a chunk's gates (``_gate_rows``), in the stage of its k, q and v (the loader refills it once both walkers have
    # released that stage, after reading the gates and after the prep, which read them before it published the
    # chunk's Ai: a barrier of their own, released by all three, cost each a barrier and an arrival)
    GATE_ROWS = gl.constexpr(5)

    @gluon.jit
    def _gate_rows(gate_s, s):
        """Stage s's rows of gates, [BT] each: gc, beta, -2^gc, 2^(gc_last - gc), scale 2^gc (the output's decay:
        the attention scale folded in, with P's in the prep, where the output took a multiply of its own)."""
        return (gate_s.index(GATE_ROWS * s), gate_s.index(GATE_ROWS * s + 1), gate_s.index(GATE_ROWS * s + 2),
                gate_s.index(GATE_ROWS * s + 3), gate_s.index(GATE_ROWS * s + 4))

    @gluon.jit
    def _keys(kq):
        """The k tile [BT, K] of a stage of k and q (its first BT rows)."""
        return kq.slice(0, kq.shape[0] // 2, dim=0)

    @gluon.jit
    def _queries(kq):
        """The q tile [BT, K] of a stage of k and q (its last BT rows)."""
        return kq.slice(kq.shape[0] // 2, kq.shape[0] // 2, dim=0)

    @gluon.jit
    def _my_walks(order):
        """How many walks this program takes (``layout.WalkOrder``)."""
        return gl.load(order[0] + gl.program_id(0))

    @gluon.jit
    def _walk_bounds(order, i, HV: gl.constexpr, BT: gl.constexpr):
        """(walk, value head, first token, first token output, end, chunks, flags) of this program's i-th walk in
        order (``layout.WalkOrder``'s row): walk n * HV + h is sequence n's value head h."""
        row = order[1] + _WALK_ROW * (i * gl.num_programs(0) + gl.program_id(0))
        walk = gl.load(row)
        bos = gl.load(row + 1)
        eos = gl.load(row + 3)
        return walk, walk % HV, bos, gl.load(row + 2), eos, (eos - bos + BT - 1) // BT, gl.load(row + 4)

    @gluon.jit
    def _first_walk_bounds(order, HV: gl.constexpr, BT: gl.constexpr):
        """``_walk_bounds`` of this program's first walk: computed where its row is regular (``WalkOrder.regular``
        gave its period and flags: order[3] > 0), which spares the loader a round trip before its first copies."""
        period = order[3]
        if period > 0:
            walk = gl.program_id(0)
            bos = walk // HV * period
            first = bos
            eos = bos + period
            flags = order[4]
        else:
            walk, _, bos, first, eos, _, flags = _walk_bounds(order, 0, HV, BT)
        return walk, walk % HV, bos, first, eos, (eos - bos + BT - 1) // BT, flags

    @gluon.jit
    def _walk_row(order, w, it, kq_ready, walk_s, HV: gl.constexpr, BT: gl.constexpr, NA: gl.constexpr,
                  WARM_UP: gl.constexpr):
        """``_walk_bounds`` of this program's walk w, whose first chunk is its chunk ``it``: from memory, or
        (WARM_UP) as the loader left it in that chunk's stage, its warm-up start found (``_share_walk``)."""
        if WARM_UP:
            mbarrier.wait(kq_ready.index(it % NA), (it // NA) & 1)
            return _shared_walk(walk_s.index(it % NA), HV, BT)
        else:
            return _walk_bounds(order, w, HV, BT)

    @gluon.jit
    def _share_walk(walk_s, walk, bos, first, eos, flags):
        """A warm-up segment's row, its warm-up start found, into walk_s (its first chunk's slot) for the prep and the
        walkers, who read it once that chunk's stage is ready. Only there: on whole walks, which the prep and the
        walkers read from memory, waiting for the first chunk to read it cost parity's short walks 1-3% (H200)."""
        j = gl.arange(0, 8, layout=gl.BlockedLayout([1], [32], [gl.num_warps()], [0]))
        walk_s.store(gl.where(j == 0, walk, gl.where(j == 1, bos, gl.where(j == 2, first, gl.where(j == 3, eos,
                                                                                                  flags)))))

    @gluon.jit
    def _shared_walk(walk_s, HV: gl.constexpr, BT: gl.constexpr):
        """(walk, value head, first token, first token output, end, chunks, flags) of the row ``_share_walk`` left."""
        row_layout: gl.constexpr = gl.BlockedLayout([8], [32], [4], [0])  # the whole row in each thread
        j = gl.arange(0, 8, layout=row_layout)
        row = walk_s.load(row_layout)
        walk = gl.sum(gl.where(j == 0, row, 0), axis=0)
        bos = gl.sum(gl.where(j == 1, row, 0), axis=0)
        eos = gl.sum(gl.where(j == 3, row, 0), axis=0)
        return (walk, walk % HV, bos, gl.sum(gl.where(j == 2, row, 0), axis=0), eos, (eos - bos + BT - 1) // BT,
                gl.sum(gl.where(j == 4, row, 0), axis=0))

    @gluon.jit
    def _add(a, b):
        return a + b

    @gluon.jit
    def _loader_partition(args, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                          BT: gl.constexpr, BV: gl.constexpr, NA: gl.constexpr, NC: gl.constexpr,
                          USE_H0: gl.constexpr, STORE_HT: gl.constexpr, WARM_UP: gl.constexpr):
        """Loads every chunk's k, q and v by TMA into their stages, and its gates, gc = cumsum(g) and beta (0 past the
        sequence's end), with the exps the walkers take of them, into the same stage (``_gate_rows``), as far
        ahead of the prep as the stages let it. One token a thread: the cumsum is a scan, not ``prep``'s
        masked row sum over a [64, 64] tile (32 registers a thread)."""
        ring, made, d_s, descs, g, beta, o, h0, ht, scale, order, gate_s, _ = args
        # every program has a walk (WalkOrder.deal): the first one's loads go out without waiting for the count,
        # a round trip sooner at the launch, and where its row is regular without reading it either
        first = _first_walk_bounds(order, HV, BT)
        it = _load_walk(args, first, gl.to_tensor(0), H, HV, K, BT, BV, NA, WARM_UP)
        for w in range(1, _my_walks(order)):
            it = _load_walk(args, _walk_bounds(order, w, HV, BT), it, H, HV, K, BT, BV, NA, WARM_UP)

    @gluon.jit
    def _load_walk(args, bounds, it, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, BT: gl.constexpr,
                   BV: gl.constexpr, NA: gl.constexpr, WARM_UP: gl.constexpr):
        """The loader's part of this program's walk of these bounds (``_walk_bounds``), from its chunk ``it`` on;
        returns the chunk after its last.
        WARM_UP: the row holds the sequence's start, and the walk starts where the decay before its first output
        token runs out (``layout.WalkOrder``): found here, where a kernel of its own launched before this one did it
        (qwen3-next B=1 1.02-1.06x, H200)."""
        ring, made, d_s, descs, g, beta, o, h0, ht, scale, order, gate_s, slow = args
        kq_s, v_s, kq_ready, kq_free, walk_s = ring
        q_desc, k_desc, v_desc, _ = descs
        i = chunk_tokens(BT)  # one token a thread, or two where the loader is one warp (``_specialized_kernel``)
        walk, i_h, bos, first, eos, NT, flags = bounds
        if WARM_UP:
            # beside whole walks, segments skip the walks too slow for them (``warm_up.mark_slow_walks``), whole walks
            # the others: a skipped walk becomes one chunk of warm-up from zero that stores nothing, so that the prep
            # and the walkers, who learn its row with its first chunk, need no case of their own
            skip = 0
            if slow[0] is not None:
                whole = ((flags & _WALK_WHOLE) != 0).to(gl.int32)
                skip = walk_is_slow(slow[0], slow[1], walk // HV, i_h, HV) ^ whole
            seq_bos = bos
            bos = warm_up_start(g, first, seq_bos + skip * (first - seq_bos), i_h, HV, BT, False)
            flags = (1 - skip) * (flags + (bos == seq_bos).to(gl.int32) * _WALK_TAKES_H0)
            eos = eos + skip * (gl.minimum(eos, bos + BT) - eos)
            first = first + skip * BT  # past the one chunk's tokens: no output
            NT = (eos - bos + BT - 1) // BT
        col_k = (i_h // (HV // H)) * K
        for t in range(NT):
            tok = bos + t * BT
            s = it % NA
            mbarrier.wait(kq_free.index(s), ((it // NA) & 1) ^ 1)
            if WARM_UP:
                if t == 0:  # published by this stage's arrival below
                    _share_walk(walk_s.index(s), walk, bos, first, eos, flags)
                    cta_barrier()
            # at the start, one chunk's copies in flight at a time: every SM loads at once then, and the first
            # chunk's bytes, which the prep waits for, shared the bandwidth with the next two chunks'
            if (it > 0) & (it < NA):
                mbarrier.wait(kq_ready.index(it - 1), 0)
            mbarrier.expect(kq_ready.index(s), 2 * k_desc.block_type.nbytes + 2 * v_desc.block_type.nbytes)
            tma_load(k_desc, [tok, col_k], kq_ready.index(s), _keys(kq_s.index(s)))
            tma_load(q_desc, [tok, col_k], kq_ready.index(s), _queries(kq_s.index(s)))
            for half in gl.static_range(2):
                tma_load(v_desc, [tok, i_h * 2 * BV + half * BV], kq_ready.index(s), v_s.index(2 * s + half))
            live = i < eos - tok
            g_t = gl.load(g + (tok + i) * HV + i_h, mask=live, other=0.0).to(gl.float32)
            b_t = gl.load(beta + (tok + i) * HV + i_h, mask=live, other=0.0).to(gl.float32)
            g_t = g_t * LOG2E  # log2 units: each exp of gc is one bare ex2
            gc = gl.associative_scan(g_t, 0, _add)
            # gc_last - gc as a scan from the end: gc_last by a reduction cost one-chunk walks 6-8% (parity B=64 T=64)
            to_end = gl.associative_scan(g_t, 0, _add, reverse=True) - g_t
            gc_row, beta_row, minus_decay_row, to_end_row, out_row = _gate_rows(gate_s, s)
            decay = exp2(gc)
            gc_row.store(gc)
            beta_row.store(b_t)
            minus_decay_row.store(-decay)
            to_end_row.store(exp2(to_end))
            out_row.store(decay * scale)
            cta_barrier()  # every thread's stores are done before the one arrival
            mbarrier.arrive(kq_ready.index(s), count=1)  # the stage's second arrival, with the copies' bytes
            it += 1
        return it

    @gluon.jit
    def _prep_chunk(gc_g, beta_g, k_cur, q_cur, ai_dst, p_dst, d_s, p_scale, BT: gl.constexpr):
        """Ai and P of one chunk into ai_dst and p_dst; k_cur and q_cur hold its tiles, gc_g and beta_g its gates;
        d_s: the solve's D tile and exchange buffer (``prep.solve_inverse``). P carries the attention scale
        (p_scale: log2 of it, minus its inverse), put into the gates' rows and taken back out of beta's for A: two
        numbers a thread where the walkers' output took a multiply an element ; the minus makes
        -A, which ``solve_inverse`` takes.

        P [i, j] = q_i . k_j exp(gc_i - gc_j) for i >= j, which the walkers read as P^T, comes first: its gates
        are A's, so one exp serves both ; masked to 0 above the diagonal, where
        they may overflow, before either product (the solve never reads A there), which spares a select a pair of
        P's packed elements ."""
        dt: gl.constexpr = k_cur.dtype
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
        log2_scale, minus_inv_scale = p_scale
        gc_r = gc_g.load(gl.SliceLayout(1, mma)) + log2_scale
        gc_c = gc_g.load(gl.SliceLayout(0, mma))
        beta_r = beta_g.load(gl.SliceLayout(1, mma)) * minus_inv_scale
        zero = gl.zeros([BT, BT], gl.float32, mma)
        r = gl.arange(0, BT, layout=gl.SliceLayout(1, mma))
        c = gl.arange(0, BT, layout=gl.SliceLayout(0, mma))
        # Q K^T, then K K^T, each waited for: with both in flight beside the gates the prep spilled 15 registers
        QK = warpgroup_mma(q_cur, k_cur.permute((1, 0)), zero, use_acc=False)
        gates = gl.where(r[:, None] >= unhoisted(c)[None, :], exp2(gc_r[:, None] - gc_c[None, :]), 0.0)
        p_dst.store((QK * gates).to(dt))
        M = warpgroup_mma(k_cur, k_cur.permute((1, 0)), zero, use_acc=False) * gates * beta_r[:, None]  # -A
        Ai = solve_inverse(M, d_s[0], ai_dst, d_s[1], BT, mma)  # ai_dst: -L until Ai
        ai_dst.store((Ai * beta_g.load(gl.SliceLayout(0, mma))[None, :]).to(dt))
        fence_async_shared()
        cta_barrier()  # every thread's stores are done before the one arrival

    @gluon.jit
    def _prep_partition(args, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                        BT: gl.constexpr, BV: gl.constexpr, NA: gl.constexpr, NC: gl.constexpr,
                        USE_H0: gl.constexpr, STORE_HT: gl.constexpr, WARM_UP: gl.constexpr):
        """Computes every chunk's Ai and P^T, one stage ahead of the walkers."""
        ring, made, d_s, descs, g, beta, o, h0, ht, scale, order, gate_s, _ = args
        kq_ready, walk_s = ring[2], ring[4]
        p_scale = (gl.log2(scale), -1.0 / scale)  # P's (``_prep_chunk``), once
        if WARM_UP:  # the loader finds where each walk starts: its chunks come with its row
            it = 0
            for w in range(_my_walks(order)):
                for t in range(_walk_row(order, w, it, kq_ready, walk_s, HV, BT, NA, WARM_UP)[5]):
                    _prep_step(it, ring, made, d_s, gate_s, p_scale, BT, NA, NC)
                    it += 1
        else:  # this program's chunks, whichever walks they are of
            for it in range(gl.load(order[2] + gl.program_id(0))):
                _prep_step(it, ring, made, d_s, gate_s, p_scale, BT, NA, NC)

    @gluon.jit
    def _prep_step(it, ring, made, d_s, gate_s, p_scale, BT: gl.constexpr, NA: gl.constexpr, NC: gl.constexpr):
        """The prep of this program's chunk ``it``, once its tiles and gates are in and its stage of Ai is free."""
        kq_s, v_s, kq_ready, kq_free, walk_s = ring
        ai_s, p_s, c_ready = made
        s = it % NA
        cs = it % NC
        mbarrier.wait(kq_ready.index(s), (it // NA) & 1)
        # the stage of Ai and P is free once both walkers have released the k, q and v stage of the chunk that used it
        done = gl.maximum(it - NC, 0)
        mbarrier.wait(kq_free.index(done % NA), (done // NA) & 1, pred=it >= NC)
        gc_row, beta_row, _, _, _ = _gate_rows(gate_s, s)
        _prep_chunk(gc_row, beta_row, _keys(kq_s.index(s)), _queries(kq_s.index(s)), ai_s.index(cs), p_s.index(cs),
                    d_s, p_scale, BT)
        mbarrier.arrive(c_ready.index(cs), count=1)

    @gluon.jit
    def _release_last_stage(it, kq_free, NA: gl.constexpr):
        """The stage of this program's chunk before ``it`` back to the loader, once its output has left its v tile,
        and with it that chunk's stage of Ai and P to the prep (``_prep_step``)."""
        if it > 0:
            fence_async_shared()  # this walker's reads of the chunk's stages are done before the prep refills them
            # the fence before the wait: after it, Triton put a barrier of its own between the wait and the fence
            tma.store_wait(pendings=0)
            cta_barrier()
            mbarrier.arrive(kq_free.index((it - 1) % NA), count=1)

    @gluon.jit
    def _walk_chunk(it, tok, first, eos, S, fresh, ring, made, gate_s, o_desc, o, col_v, HALF: gl.constexpr,
                    HV: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BV: gl.constexpr, NA: gl.constexpr,
                    NC: gl.constexpr, WARM_UP: gl.constexpr):
        """This program's chunk ``it`` (its tokens from tok) on this walker's S^T; stores its output unless (WARM_UP)
        tok is before the walk's first output token (a warm-up chunk, ``layout.SegmentLayout.walks``); fresh: S is 0,
        so (K S)^T and (Q S)^T are too. Returns S.

        (K S)^T and (Q S)^T take S^T from registers as their A operand, one half of K at a time, the first half's
        products waited for before the second half's operand is made: with both halves' operands live at once ptxas
        serialized every wgmma of the kernel, and through shared memory S^T cost a store and a fence a chunk and the
        shared-memory reads of both products . The two are one
        product of N = 2 BT over the stage's k and q rows, which lie one after the other (``_keys``, ``_queries``):
        half the wgmma instructions of two of N = BT, 30 fewer instructions a chunk ."""
        kq_s, v_s, kq_ready, kq_free, _ = ring
        ai_s, p_s, c_ready = made
        dt: gl.constexpr = kq_s.dtype
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
        a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        # (K S)^T and (Q S)^T side by side, [BV, 2 BT]: one product of N = 2 BT over the stage's k and q rows
        mma_kq: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, 2 * BT, 16])
        a_kq: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_kq, k_width=2)
        s = it % NA
        cs = it % NC
        zero = gl.zeros([BV, BT], gl.float32, mma)
        # the gates' exps from the loader, past the end the last token's
        _, _, minus_decay_row, to_end_row, out_row = _gate_rows(gate_s, s)
        mbarrier.wait(kq_ready.index(s), (it // NA) & 1)
        kq_cur = kq_s.index(s)
        k_cur = _keys(kq_cur)
        # WARM_UP first: whole walks pass fresh as a constant that Triton keeps as a branch, whose arrival cost each
        # chunk a barrier where the branches join (Triton's shared-memory analysis)
        if WARM_UP and fresh:
            _release_last_stage(it, kq_free, NA)
            KS = zero
            QS = zero
        else:
            K2: gl.constexpr = S.shape[1] // 2
            S_lo, S_hi = gl.split(gl.permute(gl.reshape(S, [BV, 2, K2]), (0, 2, 1)))
            S_a = gl.convert_layout(S_lo.to(dt), a_kq)
            KQS = warpgroup_mma(S_a, kq_cur.slice(0, K2, dim=1).permute((1, 0)), gl.zeros([BV, 2 * BT], gl.float32,
                                mma_kq), use_acc=False, is_async=True)
            KQS, S_a = warpgroup_mma_wait(num_outstanding=0, deps=(KQS, S_a))
            S_a = gl.convert_layout(S_hi.to(dt), a_kq)
            KQS = warpgroup_mma(S_a, kq_cur.slice(K2, K2, dim=1).permute((1, 0)), KQS, is_async=True)
            _release_last_stage(it, kq_free, NA)  # while these run
            KQS, S_a = warpgroup_mma_wait(num_outstanding=0, deps=(KQS, S_a))
            KS, QS = gl.split(gl.permute(gl.reshape(KQS, [BV, 2, BT]), (0, 2, 1)))  # register bits: no moves
            KS = gl.convert_layout(KS, mma)
            # scaled here: scaled where the output's product takes it, the row's registers made ptxas serialize
            # every wgmma of the kernel (C7512)
            QS = gl.convert_layout(QS, mma) * out_row.load(gl.SliceLayout(0, mma))[None, :]
        mbarrier.wait(c_ready.index(cs), (it // NC) & 1)
        minus_decay = minus_decay_row.load(gl.SliceLayout(0, mma))
        decay_to_end = to_end_row.load(gl.SliceLayout(0, mma))
        # 2^gc_last, the row's last element read alone: picking it from the row took a reduction across lanes
        one: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        decay_last = -gl.sum(minus_decay_row.slice(BT - 1, 1).load(one), axis=0)
        # no masks past the sequence's end: beta is 0 there, so Ai's rows and columns of those tokens are 0 and
        # v_new's columns of them come out 0 (X and v_new finite: TMA fills past the tensor's end with zeros)
        # an added product of -2^gc: Triton negates by flipping the sign bit, an instruction an element that ptxas
        # does not fold into the FFMA (32 a walker's chunk)
        X = v_s.index(2 * s + HALF).permute((1, 0)).load(mma).to(gl.float32) + minus_decay[None, :] * KS
        Xa = gl.convert_layout(X.to(dt), a_op)
        VN = warpgroup_mma(Xa, ai_s.index(cs).permute((1, 0)), zero, use_acc=False, is_async=True)
        VN, Xa = warpgroup_mma_wait(num_outstanding=0, deps=(VN, Xa))
        vn_a = gl.convert_layout(VN.to(dt), a_op)
        vnd_a = gl.convert_layout((VN * decay_to_end[None, :]).to(dt), a_op)
        S = warpgroup_mma(vnd_a, k_cur, S * decay_last, is_async=True)
        O = warpgroup_mma(vn_a, p_s.index(cs).permute((1, 0)), QS, is_async=True)  # P^T
        S, O, vn_a, vnd_a = warpgroup_mma_wait(num_outstanding=0, deps=(S, O, vn_a, vnd_a))
        # the output leaves through this walker's v tile, read into X above; the stage goes back to the loader at the
        # next chunk, once the copy has read it (``_release_last_stage``)
        if not WARM_UP or tok >= first:
            store_output(O, v_s.index(2 * s + HALF), tok, eos, o_desc, o, col_v, HV, V, BT, BV)
        return S

    @gluon.jit
    def _walker(args, HALF: gl.constexpr, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                BT: gl.constexpr, BV: gl.constexpr, NA: gl.constexpr, NC: gl.constexpr,
                USE_H0: gl.constexpr, STORE_HT: gl.constexpr, WARM_UP: gl.constexpr):
        """Walks this program's walks on value columns [HALF * BV, (HALF + 1) * BV); WARM_UP: warm-up segments
        (``layout.SegmentLayout.walks``), which take h0 only where they reach their sequence's start, store ht only at
        its end and output from their first token on."""
        ring, made, d_s, descs, g, beta, o, h0, ht, scale, order, gate_s, _ = args
        kq_ready, walk_s = ring[2], ring[4]
        o_desc = descs[3]
        mma_s: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, K, 16])
        it = 0
        for w in range(_my_walks(order)):
            walk, i_h, bos, first, eos, NT, flags = _walk_row(order, w, it, kq_ready, walk_s, HV, BT, NA, WARM_UP)
            if WARM_UP:
                takes_h0 = (flags & _WALK_TAKES_H0) != 0
                stores_ht = (flags & _WALK_STORES_HT) != 0
            else:  # a whole walk starts from h0 and stores ht, known at compile time
                takes_h0 = True
                stores_ht = True
            S = gl.zeros([BV, K], gl.float32, mma_s)
            if USE_H0:
                if takes_h0:
                    S = gl.load(h0 + state_offsets(walk, HALF, K, V, BV, mma_s))
            col_v = i_h * V + HALF * BV
            for t in range(NT):
                if WARM_UP:  # a segment that takes no h0 starts from S = 0
                    fresh = (t == 0) & (not USE_H0 or not takes_h0)
                else:  # so do whole walks without h0, but skipping their first products cost B=4 T=8192 3%
                    fresh = False
                S = _walk_chunk(it, bos + t * BT, first, eos, S, fresh, ring, made, gate_s, o_desc, o, col_v, HALF,
                                HV, V, BT, BV, NA, NC, WARM_UP)
                it += 1
            if STORE_HT:
                if stores_ht:
                    gl.store(ht + state_offsets(walk, HALF, K, V, BV, mma_s), S)
        tma.store_wait(pendings=0)

    @gluon.jit
    def _walker_low(args, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr,
                    BV: gl.constexpr, NA: gl.constexpr, NC: gl.constexpr, USE_H0: gl.constexpr,
                    STORE_HT: gl.constexpr, WARM_UP: gl.constexpr):
        _walker(args, 0, H, HV, K, V, BT, BV, NA, NC, USE_H0, STORE_HT, WARM_UP)

    @gluon.jit
    def _walker_high(args, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr,
                     BV: gl.constexpr, NA: gl.constexpr, NC: gl.constexpr, USE_H0: gl.constexpr,
                     STORE_HT: gl.constexpr, WARM_UP: gl.constexpr):
        _walker(args, 1, H, HV, K, V, BT, BV, NA, NC, USE_H0, STORE_HT, WARM_UP)

    @gluon.jit
    def _specialized_kernel(q_desc, k_desc, v_desc, o_desc, o, g, beta, h0, ht, scale, order_counts, order_walks,
                            order_chunks, order_period, order_flags, slow_marks, seg_offsets,
                            H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr,
                            BV: gl.constexpr, NA: gl.constexpr, NC: gl.constexpr,
                            USE_H0: gl.constexpr, STORE_HT: gl.constexpr, WARM_UP: gl.constexpr,
                            WALK_REGS: gl.constexpr, PREP_REGS: gl.constexpr, LOAD_REGS: gl.constexpr):
        dt: gl.constexpr = q_desc.dtype
        tile: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BT], dt)
        kq_s = gl.allocate_shared_memory(dt, [NA, 2 * BT, K], k_desc.layout)  # a chunk's k rows, then its q rows
        v_s = gl.allocate_shared_memory(dt, [2 * NA, BT, BV], v_desc.layout)
        ai_s = gl.allocate_shared_memory(dt, [NC, BT, BT], tile)
        p_s = gl.allocate_shared_memory(dt, [NC, BT, BT], tile)
        d_s = (gl.allocate_shared_memory(dt, [BT, BT], tile),  # the prep's D and its block inverses' exchange
               exchange_buffer(BT))
        kq_ready = gl.allocate_shared_memory(gl.int64, [NA, 1], mbarrier.MBarrierLayout())
        kq_free = gl.allocate_shared_memory(gl.int64, [NA, 1], mbarrier.MBarrierLayout())
        c_ready = gl.allocate_shared_memory(gl.int64, [NC, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(NA):
            mbarrier.init(kq_ready.index(i), count=2)  # the copies (with their bytes) and the gates
            mbarrier.init(kq_free.index(i), count=2)  # both walkers
        for i in gl.static_range(NC):
            mbarrier.init(c_ready.index(i), count=1)
        made = (ai_s, p_s, c_ready)  # made by the prep warpgroup for the walkers
        gate_s = gl.allocate_shared_memory(gl.float32, [GATE_ROWS * NA, BT],
                                           gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
        walk_s = gl.allocate_shared_memory(gl.int32, [NA, 8], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
        ring = (kq_s, v_s, kq_ready, kq_free, walk_s)  # loaded by the loader warpgroup, read by the others
        args = (ring, made, d_s, (q_desc, k_desc, v_desc, o_desc), g, beta, o, h0, ht, scale,
                (order_counts, order_walks, order_chunks, order_period, order_flags), gate_s, (slow_marks, seg_offsets))
        # constexprs listed in each partition's tuple: a tuple built apart turns them into tensors
        # the loader one warp on whole walks (Triton pads its warpgroup with warps that only give up their registers):
        # four warps each did the whole chunk's gates, with 14 barriers a chunk between them; over warm-up segments
        # one warp at 24 registers spills 62 finding the warm-up starts
        gl.warp_specialize([(_walker_low, (args, H, HV, K, V, BT, BV, NA, NC, USE_H0, STORE_HT, WARM_UP)),
                            (_walker_high, (args, H, HV, K, V, BT, BV, NA, NC, USE_H0, STORE_HT, WARM_UP)),
                            (_prep_partition, (args, H, HV, K, V, BT, BV, NA, NC, USE_H0, STORE_HT, WARM_UP)),
                            (_loader_partition, (args, H, HV, K, V, BT, BV, NA, NC, USE_H0, STORE_HT, WARM_UP))],
                           [4, 4, 4 if WARM_UP else 1], [WALK_REGS, PREP_REGS, LOAD_REGS])


def unsupported(q: Tensor, V: int, raw_gate: bool, qk_l2norm: bool) -> str | None:
    """Why this kernel cannot run a call with these inputs (None: it can)."""
    return walk_unsupported(q, V, qk_l2norm) or prep_unsupported(q, raw_gate, qk_l2norm)


def chunk_specialized(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, out: Tensor, h0: Tensor | None,
                      ht: Tensor | None, order: WalkOrder, scale: float, warm_up: bool = False,
                      slow: SlowWalks | None = None) -> None:
    """Outputs into ``out`` and final states into ``ht`` (or not stored) of the walks of ``order``
    (``ChunkLayout.walk_order(HV, programs)``, one program per SM at most; walk n * HV + h: sequence n, value head
    h) from h0 (fp32 [N, HV, K, V], or zero). warm_up: the walks are warm-up segments (``SegmentLayout.walks``), whose
    warm-up starts the loader finds from g; with slow, whole sequences beside them, and the segments skip the walks it
    marks slow (``warm_up.mark_slow_walks``), the whole sequences the others. q, k [B, T, H, 128], v, out
    [B, T, HV, 128], g, beta [B, T, HV], all contiguous (see ``unsupported``)."""
    # the prep takes log2(scale): a scale of 0 or below runs as |scale| (or 1), and the output, linear in the scale
    # (the states do not see it), is scaled after
    run_scale = scale if scale > 0 else abs(scale) or 1.0
    H, K, HV, V = q.shape[2], q.shape[3], v.shape[2], v.shape[3]
    tokens = q.shape[0] * q.shape[1]
    descs = (descriptor(q.view(tokens, H * K), [BT, K]), descriptor(k.view(tokens, H * K), [BT, K]),
             descriptor(v.view(tokens, HV * V), [BT, BV]), descriptor(out.view(tokens, HV * V), [BT, BV]))
    _specialized_kernel[(order.programs,)](
        *descs, out, g, beta, h0, ht, run_scale, order.counts, order.walks, order.program_chunks, *order.regular(HV),
        *slow_args(slow),
        H=H, HV=HV, K=K, V=V, BT=BT, BV=BV, NA=NA, NC=NC, USE_H0=h0 is not None, STORE_HT=ht is not None,
        WARM_UP=warm_up, WALK_REGS=WALK_REGS, PREP_REGS=PREP_REGS, LOAD_REGS=LOAD_REGS, num_warps=WARPS,
        maxnreg=MAX_REGS)
    if run_scale != scale:
        out.mul_(scale / run_scale)
    if ht is not None and order.empty.numel():  # empty sequences' walks, which no program took
        states = ht.view(-1, K, V)
        if h0 is None:
            states.index_fill_(0, order.empty, 0.0)
        else:
            states.index_copy_(0, order.empty, h0.view(-1, K, V).index_select(0, order.empty))


def describe() -> str:
    """The kernel's settings, for a result row's path."""
    return (f"gluon sm90 warp-specialized loads + prep + walk BV={BV} "
            f"(regs {WALK_REGS}/{WALK_REGS}/{PREP_REGS}/{LOAD_REGS})")

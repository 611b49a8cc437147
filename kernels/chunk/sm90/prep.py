"""The fused pipeline's prep kernel for Hopper (sm_90), in Gluon: the same math as ``chunk.prep``'s
``fused_prep_kernel`` with pre-computed gates, for each (chunk, value head):

    gc = cumsum(g), A = strictLower(diag(beta)(Gamma o K K^T)), Ai = (I + A)^-1 diag(beta)

The Triton kernel is bound by its L1 / shared-memory traffic, not by its arithmetic. Gluon lets this one avoid
most of it:

  - the key tile comes by TMA straight into the wgmma's shared-memory layout;
  - A's diagonal 16 x 16 blocks are inverted in the registers of the warp that holds them in the wgmma's
    layout, by doubling with mma_v2 (``_block_inverses``), with no scratch round trip;
  - Ai leaves by TMA;
  - the programs are persistent, three an SM (two at K = 256), each taking every P-th (chunk, value head) in
    turn with the next one's key tile on its way by TMA, and its thread-indexed addresses and masks computed
    once.

Given slow marks (``warm_up.mark_slow_walks``) it preps only the chunks of the walks they mark, which a Gluon walk
then walks whole (``plan.ChunkPlan.whole_walk``): the others' key tiles are neither loaded nor solved.

Then with D = blockdiag(Y_01, Y_23), the diagonal 32 x 32 blocks' inverses (the 16 x 16 ones joined by two more
mma_v2 products, after an exchange between warps), and L = A below them, (I + A)^-1 = D - (D L) D in two wgmma
products whose operands are rounded to the input dtype, each over the half of K that is not 0
(``solve_inverse``, which ``specialized`` shares). ``plan.plan_prep`` runs it wherever it can; what it buys and
its accuracy against the Triton kernel are in docs/decisions/0021-gluon-prep.md.

Envelope (``unsupported``): sm_90, bf16 or fp16, K in 64, 128, 256, gates given (``gating: pre``: raw gates
and the in-kernel L2 norm stay with the Triton kernel). Rows past a sequence's end within its last chunk
hold the next sequence's keys (TMA does not clamp rows), which the masks drop as the Triton kernel drops
its clamped rows; that chunk's Ai is stored row by row.
Gluon has no interpreter: the CPU tests compile this kernel for sm_90; the GPU tests run it.
"""

from __future__ import annotations

from torch import Tensor

from ..warm_up import SlowWalks, slow_args
from .gluon_hopper import GLUON_MISSING, descriptor, sm_count, unsupported_inputs

if GLUON_MISSING is None:
    from .walk import fetch, walk_is_slow
    from .gluon_hopper import cta_barrier, exp, fence_async_shared, gl, gluon, mbarrier, mma_v2, tma, \
        tma_store, warpgroup_mma

__all__ = ["chunk_prep", "unsupported", "describe"]

BT = 64  # tokens per chunk (layout.CHUNK)
WARPS = 4  # one warpgroup
HEAD_DIMS = (64, 128, 256)
# the persistent grid: programs per SM, as registers (146 a thread: three warpgroups) and shared memory (two key
# tiles, two 64 x 64 ones and 4 KB: 36, 52 and 84 KB at K = 64, 128 and 256) let them all run at once
PROGRAMS_PER_SM = {64: 3, 128: 3, 256: 2}


if GLUON_MISSING is None:
    @gluon.jit
    def exchange_buffer(BT: gl.constexpr):
        """The block inverses' exchange between warps (``_block_inverses``): 2 BT / 16 blocks of 16 x 16 (fp16, a
        power of 2 of them), zeroed once, as the blocks the even warps load must not hold a NaN. The zeros are in
        before any read: a barrier precedes it (the block inverses' own, and in a warp-specialized kernel, whose
        default warps store them, the partitions' start)."""
        x_s = gl.allocate_shared_memory(gl.float16, [2 * (BT // 16), 16, 16],
                                        gl.SwizzledSharedLayout(1, 1, 1, order=[2, 1, 0]))
        x_s.store(gl.zeros([2 * (BT // 16), 16, 16], gl.float16,
                           gl.BlockedLayout([1, 1, 2], [1, 16, 2], [4, 1, 1], [2, 1, 0])))
        return x_s

    @gluon.jit
    def _half(x, operand: gl.constexpr):
        """x rounded to fp16 as mma_v2's operand in the layout ``operand``."""
        return gl.convert_layout(x.to(gl.float16), operand)

    @gluon.jit
    def _column_blocks(A, BT: gl.constexpr):
        """A's four blocks of 16 columns, [BT, 16] each: in an mma layout the block index is register bits, so that
        picking a row's block is a select per register (where a masked sum over the four was a select and an add)."""
        lo, hi = gl.split(gl.permute(gl.reshape(A, [BT, 2, 2, 16]), (0, 3, 1, 2)))  # column 32 b1 + 16 b0 + j
        c0, c2 = gl.split(lo)
        c1, c3 = gl.split(hi)
        return c0, c1, c2, c3

    @gluon.jit
    def _block_inverses(M, x_s, BT: gl.constexpr, mma: gl.constexpr):
        """D = blockdiag(Y_01, Y_23), the inverses of I + A's two diagonal 32 x 32 blocks (strictly lower parts),
        from M = -A (in and D out in the layout mma; M on and above its diagonal is never read: ``_gated_kkt`` may
        leave anything there), by doubling inverted blocks along the diagonal. Every product below takes -A, not A:
        given A, each negation cost an instruction an element (``solve_inverse``).

        In the layout mma warp b holds rows 16 b to 16 b + 15, so its 16 x 16 diagonal block N_b stays in its
        registers: with Y the inverses of the s x s blocks and L the part of N_b below them within the 2s x 2s
        blocks, those of the 2s x 2s blocks are Y - (Y L) Y, for s = 2, 4, 8 (s = 1: Y = I - L), in six mma_v2
        products (operands fp16). Then each odd warp b takes Y_{b-1} through x_s (``exchange_buffer``) for the block
        below the diagonal, X_b = Y_b (M_{b,b-1} Y_{b-1}), in the layout of the levels (one barrier, where an
        exchange into a per-warp layout takes four): warp b stores Y_b into block 2 b + 1 and loads block
        4 (b >> 1) + (b & 1) as a B operand, which is Y_{b-1}'s in the odd warps and a zero block in the even ones
        (where M_{b,b-1} is 0), so no warp computes a product it then discards. Doubling keeps the chain short where
        forward substitution takes 15 dependent steps, and stays accurate where the Neumann form
        (I - N)(I + N^2)(I + N^4)(I + N^8) loses digits to cancellation (docs/decisions/0021-gluon-prep.md)."""
        c0, c1, c2, c3 = _column_blocks(M, BT)
        rb = (gl.arange(0, BT, layout=gl.SliceLayout(1, c0.type.layout)) // 16)[:, None]  # = the warp
        mv2: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1, 1], instr_shape=[1, 16, 8])
        even = (rb & 1) == 0
        upper = (rb & 2) == 0  # as rb < 2, ptxas moved a uniform predicate into a register before every select
        M_pair_left = gl.where(upper, c0, c2)  # M's column block 2 (b >> 1): -N_b in the even warps, M_{b,b-1} odd
        minus_N = gl.where(even, M_pair_left, gl.where(upper, c1, c3))  # M's diagonal block
        minus_N = gl.convert_layout(gl.reshape(minus_N, [BT // 16, 16, 16]), mv2)
        i = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(2, mv2)))[None, :, None]
        k = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, mv2)))[None, None, :]
        a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mv2, k_width=2)
        b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mv2, k_width=2)
        zero = gl.zeros([BT // 16, 16, 16], gl.float32, mv2)
        Y = gl.where(i == k, 1.0, gl.where((i // 2 == k // 2) & (i > k), minus_N, 0.0))
        minus_N_b = _half(minus_N, b_op)  # once: converted at each level, it cost the prep's loop 8 instructions
        i_b = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(2, b_op)))[None, :, None]
        k_b = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, b_op)))[None, None, :]
        for level in gl.static_range(1, 4):  # Y - (Y L) Y: the accumulator's layout is A's, B's is a shuffle away
            below = (i_b >> (level + 1) == k_b >> (level + 1)) & (i_b >> level > k_b >> level)  # s = 2^level
            YL = mma_v2(_half(Y, a_op), gl.where(below, minus_N_b, 0.0), zero)  # Y (-L)
            Y = mma_v2(_half(YL, a_op), _half(Y, b_op), Y)
        # views of blocks 2 b + 1 and 4 (b >> 1) + (b & 1) (a subslice's offset is a multiple of its size, and a
        # subslice cannot be reshaped: the register tensors are)
        x_s.reshape([BT // 16, 2, 16, 16]).slice(1, 1, dim=1).store(gl.reshape(Y.to(gl.float16), [BT // 16, 1, 16, 16]))
        M_left = _half(gl.reshape(gl.where(even, 0.0, M_pair_left), [BT // 16, 16, 16]), a_op)  # M_{b,b-1}, odd b
        cta_barrier()  # Y_0 and Y_2 were stored by warps 0 and 2
        loaded: gl.constexpr = gl.reshape(minus_N_b, [2, 1, 2, 16, 16]).type.layout  # b_op, batch split as the view
        Y_above = x_s.reshape([2, 2, 2, 16, 16]).slice(0, 1, dim=1).load(loaded)
        MY = mma_v2(M_left, gl.convert_layout(gl.reshape(Y_above, [BT // 16, 16, 16]), b_op), zero)
        X = mma_v2(_half(Y, a_op), _half(MY, b_op), zero)
        Y = gl.convert_layout(gl.reshape(Y, [BT, 16]), c0.type.layout)
        X = gl.convert_layout(gl.reshape(X, [BT, 16]), c0.type.layout)
        # D's column blocks: Y_b on the diagonal, X_b left of it in the odd row blocks (the warps' upper or lower
        # half of the blocks from two selects shared by both, where each block took its own)
        left = gl.where(even, Y, X)  # column block b - (b odd)
        right = gl.where(even, 0.0, Y)  # column block b in the odd warps
        D = gl.join(gl.join(gl.where(upper, left, 0.0), gl.where(upper, 0.0, left)),
                    gl.join(gl.where(upper, right, 0.0), gl.where(upper, 0.0, right)))
        return gl.convert_layout(gl.reshape(gl.permute(D, (0, 2, 3, 1)), [BT, BT]), mma)

    @gluon.jit
    def _chunk_cumsum(g_c, BT: gl.constexpr, mma: gl.constexpr):
        """gc = cumsum(g) of a chunk's gates g_c (along the columns of mma tiles; 0 past the sequence's end, so
        that gc there repeats the last token's), along rows and along columns."""
        r = gl.arange(0, BT, layout=gl.SliceLayout(1, mma))
        c = gl.arange(0, BT, layout=gl.SliceLayout(0, mma))
        gc_r = gl.sum(gl.where(c[None, :] <= r[:, None], g_c[None, :], 0.0), axis=1)
        return gc_r, gl.convert_layout(gc_r, gl.SliceLayout(0, mma))

    @gluon.jit
    def _kkt(k_s, BT: gl.constexpr, mma: gl.constexpr):
        """K K^T of the key tile k_s (fp32, in the layout mma)."""
        return warpgroup_mma(k_s, k_s.permute((1, 0)), gl.zeros([BT, BT], gl.float32, mma), use_acc=False)

    @gluon.jit
    def _gated_kkt(KK, gc_r, gc_c, beta_r, BT: gl.constexpr, mma: gl.constexpr):
        """-A = -diag(beta)(Gamma o K K^T) (``solve_inverse``'s input) from KK = K K^T below the diagonal, 0 on and
        above it. The callers' beta is 0 past the sequence's end, which zeroes those rows: their gates gc_r - gc_c
        repeat the last token's row, finite where it is. The gates above the diagonal, which ``solve_inverse`` never
        reads, are masked: left to overflow, this kernel is 1.6-3.3% slower."""
        r = gl.arange(0, BT, layout=gl.SliceLayout(1, mma))
        c = gl.arange(0, BT, layout=gl.SliceLayout(0, mma))
        gates = exp(gl.where(r[:, None] > c[None, :], gc_r[:, None] - gc_c[None, :], float("-inf")))
        return KK * gates * (-beta_r)[:, None]

    @gluon.jit
    def _half_columns(x, BT: gl.constexpr):
        """x's columns [0, BT / 2) and [BT / 2, BT), for wgmma A operands of K = BT / 2."""
        return gl.split(gl.permute(gl.reshape(x, [BT, 2, BT // 2]), (0, 2, 1)))

    @gluon.jit
    def solve_inverse(M, d_s, l_s, x_s, BT: gl.constexpr, mma: gl.constexpr):
        """(I + A)^-1 (fp32, mma layout) of the strictly lower part of A, from the tile M = -A (nothing on or above
        the diagonal is read; given A, the negations in here and in ``_block_inverses`` cost the warp-specialized
        prep's loop 34 instructions a chunk: ); Ai is it times diag(beta), which
        the callers apply (beta's columns need not stay in registers through the solve). d_s and l_s: [BT, BT] tiles
        for D and -L; x_s: the block inverses' exchange buffer (``exchange_buffer``); wgmma operands are
        rounded to d_s's dtype.

        With D = blockdiag(Y_01, Y_23) the inverses of the diagonal 32 x 32 blocks (``_block_inverses``) and L =
        A's block below them, (I + A)^-1 = D + (D (-L)) D in two wgmma products, each of K = BT / 2: L's first BT / 2
        rows and D L's last BT / 2 columns are 0. Those halves left out, the warp-specialized kernel, which computed
        (I - E + E^2 - E^3) D with E = D L from the 16 x 16 blocks in four products of K = BT, went 1.03-1.10x
        faster; over full K, D - (D L) D had measured 0.92-1.04x there ."""
        dt: gl.constexpr = d_s.dtype
        c = gl.arange(0, BT, layout=gl.SliceLayout(0, mma))
        a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        l_s.store(gl.where((c < BT // 2)[None, :], M, 0.0).to(dt))  # -L: its rows from BT / 2 on are read
        D = _block_inverses(M, x_s, BT, mma)
        D_op = D.to(dt)
        d_s.store(D_op)
        fence_async_shared()
        _, D_right = _half_columns(D_op, BT)
        minus_DL = warpgroup_mma(gl.convert_layout(D_right, a_op), l_s.slice(BT // 2, BT // 2, dim=0),
                                 gl.zeros([BT, BT], gl.float32, mma), use_acc=False)
        minus_DL_left, _ = _half_columns(minus_DL.to(dt), BT)
        return warpgroup_mma(gl.convert_layout(minus_DL_left, a_op), d_s.slice(0, BT // 2, dim=0), D)

    @gluon.jit
    def _chunk_rows(item, chunk_indices, seq_bounds, HV: gl.constexpr, BT: gl.constexpr):
        """The first token of item's chunk (items: (chunk, value head), value heads fastest, as
        tiles.chunk_program: GVA heads share the key tile in L2) and the chunk's rows in its sequence."""
        i_c = item // HV
        i_n = gl.load(chunk_indices + 2 * i_c)
        tok = gl.load(seq_bounds + 2 * i_n).to(gl.int32) + gl.load(chunk_indices + 2 * i_c + 1) * BT
        return tok, gl.load(seq_bounds + 2 * i_n + 1).to(gl.int32) - tok

    @gluon.jit
    def _item_is_slow(item, chunk_indices, slow_marks, seg_offsets, HV: gl.constexpr):
        """1 where item's chunk belongs to a walk the slow marks mark, else 0."""
        return walk_is_slow(slow_marks, seg_offsets, gl.load(chunk_indices + 2 * (item // HV)), item % HV, HV)

    @gluon.jit
    def _chunk_prep_kernel(k_desc, ai_desc, Ai, g, beta, gc, seq_bounds, chunk_indices, n_items, slow_marks,
                           seg_offsets, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, BT: gl.constexpr):
        # persistent: the items dealt round the programs, each one's key tile landing while the one before is
        # solved (then a program's set-up and thread-indexed addresses serve all its items)
        pid = gl.program_id(0)
        P = gl.num_programs(0)
        dt: gl.constexpr = k_desc.dtype

        k_s = gl.allocate_shared_memory(dt, [2, BT, K], k_desc.layout)
        tile: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BT], dt)
        d_s = gl.allocate_shared_memory(dt, [BT, BT], tile)
        l_s = gl.allocate_shared_memory(dt, [BT, BT], tile)  # then Ai on its way out
        x_s = exchange_buffer(BT)  # the solve's scratch
        bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for b in gl.static_range(2):
            mbarrier.init(bars.index(b), count=1)
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
        r = gl.arange(0, BT, layout=gl.SliceLayout(1, mma))
        c = gl.arange(0, BT, layout=gl.SliceLayout(0, mma))
        t = gl.arange(0, BT, layout=gl.BlockedLayout([1], [32], [4], [0]))  # a chunk's gates, one load each

        n_mine = gl.cdiv(n_items - pid, P)
        tok, n_valid = _chunk_rows(pid, chunk_indices, seq_bounds, HV, BT)
        prepped = gl.to_tensor(1)  # every chunk's, or with slow marks those of the walks they mark alone
        if slow_marks is not None:
            prepped = _item_is_slow(pid, chunk_indices, slow_marks, seg_offsets, HV)
        fetch(k_desc, tok, (pid % HV // (HV // H)) * K, bars.index(0), k_s.index(0), prepped != 0)
        # the tiles each key buffer has received: its barrier's phase (an item not prepped loads none)
        landed0 = 0
        landed1 = 0
        for j in range(n_mine):
            item = pid + j * P
            i_h = item % HV
            buf = j % 2
            nxt = gl.minimum(item + P, n_items - 1)
            tok_nxt, n_valid_nxt = _chunk_rows(nxt, chunk_indices, seq_bounds, HV, BT)
            prepped_nxt = gl.to_tensor(1)
            if slow_marks is not None:
                prepped_nxt = _item_is_slow(nxt, chunk_indices, slow_marks, seg_offsets, HV)
            fetch_nxt = (j + 1 < n_mine) & (prepped_nxt != 0)
            if prepped != 0:
                # gc = cumsum(g) as a masked row sum, 0 past the sequence's end
                g_t = gl.load(g + (tok + t) * HV + i_h, mask=t < n_valid, other=0.0).to(gl.float32)
                beta_t = gl.load(beta + (tok + t) * HV + i_h, mask=t < n_valid, other=0.0).to(gl.float32)
                mbarrier.wait(bars.index(buf), (landed0 * (1 - buf) + landed1 * buf) & 1)
                landed0 += 1 - buf
                landed1 += buf
                KK = _kkt(k_s.index(buf), BT, mma)
                tma.store_wait(pendings=0)  # the last Ai has left l_s
                cta_barrier()  # and every warp's K K^T before this one has read the other key tile
                fetch(k_desc, tok_nxt, (nxt % HV // (HV // H)) * K, bars.index(1 - buf), k_s.index(1 - buf), fetch_nxt)
                gc_r, gc_c = _chunk_cumsum(gl.convert_layout(g_t, gl.SliceLayout(0, mma)), BT, mma)
                gl.store(gc + (tok + r) * HV + i_h, gc_r, mask=r < n_valid)
                A = _gated_kkt(KK, gc_r, gc_c, gl.convert_layout(beta_t, gl.SliceLayout(1, mma)), BT, mma)
                Ai_t = solve_inverse(A, d_s, l_s, x_s, BT, mma) * \
                    gl.convert_layout(beta_t, gl.SliceLayout(0, mma))[None, :]
                if n_valid >= BT:
                    l_s.store(Ai_t.to(dt))
                    fence_async_shared()
                    tma_store(ai_desc, [tok, i_h * BT], l_s)
                else:  # a short last chunk: TMA would write its rows past the end, into the next sequence's
                    gl.store(Ai + (tok + r).to(gl.int64)[:, None] * (HV * BT) + i_h * BT + c[None, :], Ai_t.to(dt),
                             mask=(r < n_valid)[:, None])
            else:  # nothing read the other key tile since the last barrier, which every warp has passed
                fetch(k_desc, tok_nxt, (nxt % HV // (HV // H)) * K, bars.index(1 - buf), k_s.index(1 - buf), fetch_nxt)
            tok, n_valid, prepped = tok_nxt, n_valid_nxt, prepped_nxt
        tma.store_wait(pendings=0)


def unsupported(k: Tensor, raw_gate: bool, qk_l2norm: bool) -> str | None:
    """Why this kernel cannot run a call with these keys (None: it can)."""
    why = unsupported_inputs(k)
    if why:
        return why
    if k.shape[-1] not in HEAD_DIMS:
        return f"written for K in {HEAD_DIMS}, got K={k.shape[-1]}"
    if raw_gate:
        return "takes the gates computed beforehand (gating: pre)"
    if qk_l2norm:
        return "takes k normalised beforehand"
    return None


def chunk_prep(k: Tensor, g: Tensor, beta: Tensor, gc: Tensor, Ai: Tensor, seq_bounds: Tensor, chunk_indices: Tensor,
               HV: int, slow: SlowWalks | None = None) -> None:
    """gc [tokens, HV] (fp32) and Ai [tokens, HV, 64] of the chunks in chunk_indices ([NT, 2]: sequence, chunk
    within it) of the sequences in seq_bounds ([N, 2] token ranges), as ``chunk.prep``'s fused prep kernel computes
    them; with ``slow``, of the walks it marks alone. k [B, T, H, K], g, beta [B, T, HV], all contiguous (see
    ``unsupported``)."""
    H, K = k.shape[2], k.shape[3]
    tokens = k.shape[0] * k.shape[1]
    items = chunk_indices.shape[0] * HV  # at least one: prep.run_prep skips layouts without chunks
    descs = descriptor(k.view(tokens, H * K), [BT, K]), descriptor(Ai.view(tokens, HV * BT), [BT, BT])
    programs = min(items, sm_count(k.device) * PROGRAMS_PER_SM[K])
    _chunk_prep_kernel[(programs,)](*descs, Ai, g, beta, gc, seq_bounds, chunk_indices, items, *slow_args(slow), H=H,
                                    HV=HV, K=K, BT=BT, num_warps=WARPS)


def describe() -> str:
    """The kernel's settings, for a result row's path."""
    return f"gluon sm90 prep w{WARPS} (TMA, wgmma)"

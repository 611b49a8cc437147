"""``chunk_fused``'s prep kernel for Hopper (sm_90), in Gluon: the same math and rounding as
``chunk_fused._chunk_prep_fn`` with pre-computed gates, one program per (chunk, value head):

    gc = cumsum(g), A = strictLower(diag(beta)(Gamma o K K^T)), Ai = (I + A)^-1 diag(beta)

The Triton kernel is bound by its L1 / shared-memory traffic, not by its arithmetic: ncu on qwen3-next
B=4 T=8192 (H100) put it at 82% of the L1/TEX throughput, 3,392 L1 wavefronts a program, 127 registers (BENCHMARKS.md,
thirty-first session). What Gluon lets this kernel do instead, each measured as part of the whole:

  - the key tile comes by TMA straight into the wgmma's shared-memory layout (Triton loads it into
    registers, then stores it to shared memory);
  - A's diagonal 16 x 16 blocks go to a 4 KB shared band from the wgmma's own register layout (Triton converts
    the whole [64, 64] fp32 tile through shared memory first, to store a quarter of it in a global scratch);
  - each block is inverted by forward substitution with one column of the inverse per thread,
    (I + A_b) Y = I column by column: the column stays in the thread's registers, and each step reads
    one column of A_b, the same for the block's 16 threads (Triton's column substitution sums along a
    row across threads at each of its 15 steps);
  - Ai leaves by TMA.

Then, as in Triton, with D = blockdiag(Y) and L = A below the diagonal blocks, (I + A)^-1 = (I - M + M^2
- M^3) D with M = D L, in four wgmma products whose operands are rounded to the input dtype (``_solve``, which
``chunk_specialized_sm90`` shares). H100 (BENCHMARKS.md,
thirty-first session): the prep kernel alone 1.24-1.27x at qwen3-next's shapes (B=4 T=8192: 287 -> 229 us;
FlashQLA's gate-free kkt_solve takes 221) and 1.06-1.18x on parity's rows; whole calls 1.07x on qwen3-next
and 1.02-1.11x on parity's rows it serves.

Envelope (``unsupported``): sm_90, bf16 or fp16, K in 64, 128, 256, gates given (``gating: pre``: raw gates
and the in-kernel L2 norm stay with the Triton kernel). Rows past a sequence's end within its last chunk
hold the next sequence's keys (TMA does not clamp rows), which the masks drop as the Triton kernel drops
its clamped rows; that chunk's Ai is stored row by row.
Gluon has no interpreter: the CPU tests compile this kernel for sm_90; the GPU tests run it.
"""

from __future__ import annotations

from torch import Tensor

from .gluon_hopper import GLUON_MISSING, descriptor, unsupported_inputs

if GLUON_MISSING is None:
    from .gluon_hopper import cta_barrier, exp, fence_async_shared, gl, gluon, mbarrier, reinterpret, tma, tma_load, \
        tma_store, warpgroup_mma

__all__ = ["chunk_prep", "unsupported", "describe"]

BT = 64  # tokens per chunk (chunk.CHUNK)
WARPS = 4  # one warpgroup
HEAD_DIMS = (64, 128, 256)


if GLUON_MISSING is None:
    # A's four diagonal 16 x 16 blocks in shared memory as [64, 16] fp32 (4 KB), [16 b + i, k] = A[16 b + i, 16 b + k]
    # at offset 256 b + 16 k + i: stored from the mma layout's rows, read flat by columns (``_flat``)
    BAND = gl.constexpr(gl.SharedLinearLayout(
        offset_bases=[[1, 0], [2, 0], [4, 0], [8, 0], [0, 1], [0, 2], [0, 4], [0, 8], [16, 0], [32, 0]]))

    @gluon.jit
    def _flat(band_s, shape: gl.constexpr):
        """band_s (BAND) as a row-major tensor of ``shape``, [4, 256] ([b, k * 16 + i]) or [4, 16, 16] ([b, k, i])."""
        plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=list(range(len(shape) - 1, -1, -1)))
        return reinterpret(band_s, gl.float32, shape, plain)

    @gluon.jit
    def _block_inverses(A, band_s, BT: gl.constexpr, mma: gl.constexpr):
        """D = blockdiag(Y_b), Y_b = (I + A_b)^-1, of the fp32 tile A's four diagonal 16 x 16 blocks (in and out in
        the layout mma), by forward substitution, each thread holding column c of one Y_b in registers (each
        column twice over the four warps). Step k reads column k of every A_b, the same for the block's 16
        threads, takes Y_b[k, c], final by then, and subtracts its share from the rows below: A_b on and above its
        diagonal is never read (``_gated_kkt`` may leave anything there). The -0.0 and 0.0 of the selects along the
        in-thread axis fold away in compilation.

        The blocks go through band_s (BAND, 4 KB), each thread storing the 8 of its 32 values of A that lie in
        them: the whole tile through shared memory meets the banks 4 ways in the mma layout, and a global
        scratch (L1-resident) was 1.02-1.03x slower on qwen3-next's prefill (BENCHMARKS.md, thirty-sixth
        session). The caller orders band_s's reuse (the previous chunk's reads end in a barrier in
        chunk_specialized_sm90._prep_chunk)."""
        L3: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1, 16], threads_per_warp=[2, 16, 1],
                                            warps_per_cta=[2, 2, 1], order=[2, 1, 0])  # [b, c, i]
        Lbi: gl.constexpr = gl.SliceLayout(1, L3)
        Lbc: gl.constexpr = gl.SliceLayout(2, L3)
        c3 = gl.expand_dims(gl.expand_dims(gl.arange(0, 16, layout=gl.SliceLayout(0, Lbc)), 0), 2)
        i3 = gl.expand_dims(gl.expand_dims(gl.arange(0, 16, layout=gl.SliceLayout(0, Lbi)), 0), 1)
        # the blocks picked out of each thread's registers: mma's column blocks are register bits
        A3 = gl.reshape(A, [BT, BT // 16, 16])
        L3A: gl.constexpr = A3.type.layout
        bidx = gl.arange(0, BT // 16, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3A)))
        ridx = gl.arange(0, BT, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3A)))
        keep = (ridx // 16)[:, None, None] == bidx[None, :, None]
        band_s.store(gl.sum(gl.where(keep, A3, 0.0), axis=1))
        columns = _flat(band_s, [BT // 16, 256])
        cta_barrier()  # the columns were written by other threads
        Y = gl.where(i3 == c3, 1.0, 0.0) + gl.zeros([BT // 16, 16, 16], gl.float32, L3)
        for k in gl.static_range(16):
            a_k = columns.slice(k * 16, 16, dim=1).load(Lbi)  # A_b[i, k]
            y_k = gl.sum(gl.where(i3 == k, Y, -0.0), axis=2)  # Y_b[k, c]
            Y = Y - gl.where(i3 > k, gl.expand_dims(a_k, 1) * gl.expand_dims(y_k, 2), 0.0)
        cta_barrier()  # every column of A_b read before Y_b takes its place
        _flat(band_s, [BT // 16, 16, 16]).store(Y)  # [b, c, i] = Y_b[i, c]: where BAND keeps D[16 b + i, 16 b + c]
        cta_barrier()
        band = band_s.load(gl.SliceLayout(1, L3A))
        return gl.convert_layout(gl.reshape(gl.where(keep, gl.expand_dims(band, 1), 0.0), [BT, BT]), mma)

    @gluon.jit
    def _chunk_cumsum(g_c, BT: gl.constexpr, mma: gl.constexpr):
        """gc = cumsum(g) of a chunk's gates g_c (along the columns of mma tiles; 0 past the sequence's end, so
        that gc there repeats the last token's), along rows and along columns."""
        r = gl.arange(0, BT, layout=gl.SliceLayout(1, mma))
        c = gl.arange(0, BT, layout=gl.SliceLayout(0, mma))
        gc_r = gl.sum(gl.where(c[None, :] <= r[:, None], g_c[None, :], 0.0), axis=1)
        return gc_r, gl.convert_layout(gc_r, gl.SliceLayout(0, mma))

    @gluon.jit
    def _gated_kkt(k_s, gc_r, gc_c, beta_r, BT: gl.constexpr, mma: gl.constexpr, MASKED: gl.constexpr):
        """A = diag(beta)(Gamma o K K^T) of the key tile k_s (fp32) below the diagonal; on and above it 0 where
        MASKED, else values that ``_solve`` never reads (the gates there may overflow). The callers' beta is 0 past
        the sequence's end, which zeroes those rows: their gates gc_r - gc_c repeat the last token's row, finite
        where it is. Unmasked, chunk_specialized_sm90 is 1.01-1.03x faster (ptxas had kept r > c through the solve,
        for the scores, as a bitmask of predicates rebuilt every chunk) and this module's kernel 1.6-3.3% slower
        (BENCHMARKS.md, thirty-eighth session)."""
        r = gl.arange(0, BT, layout=gl.SliceLayout(1, mma))  # before the product, as ever: the prep kernel's SASS
        c = gl.arange(0, BT, layout=gl.SliceLayout(0, mma))  # changes (56 instructions fewer, untimed) if after it
        A = warpgroup_mma(k_s, k_s.permute((1, 0)), gl.zeros([BT, BT], gl.float32, mma), use_acc=False)
        if MASKED:
            gates = exp(gl.where(r[:, None] > c[None, :], gc_r[:, None] - gc_c[None, :], float("-inf")))
        else:
            gates = exp(gc_r[:, None] - gc_c[None, :])
        return A * gates * beta_r[:, None]

    @gluon.jit
    def _solve(A, d_s, l_s, m_s, band_s, BT: gl.constexpr, mma: gl.constexpr):
        """(I + A)^-1 (fp32, mma layout) of the strictly lower part of the tile A (nothing on or above the diagonal
        is read: L is masked, the block inverses read below it only); Ai is it times diag(beta), which the callers
        apply (beta's columns need not stay in registers through the solve). With D = blockdiag(Y_b)
        (``_block_inverses`` through ``band_s``) and L = A below the diagonal blocks, (I + A)^-1 = (I - M + M^2 -
        M^3) D with M = D L, in four wgmma products whose operands are rounded to d_s's dtype. d_s, l_s and m_s:
        [BT, BT] operand tiles for D, L and -M."""
        dt: gl.constexpr = d_s.dtype
        r = gl.arange(0, BT, layout=gl.SliceLayout(1, mma))
        c = gl.arange(0, BT, layout=gl.SliceLayout(0, mma))
        blk_r = r // 16
        blk_c = c // 16
        l_s.store(gl.where(blk_r[:, None] > blk_c[None, :], A, 0.0).to(dt))
        d_s.store(_block_inverses(A, band_s, BT, mma).to(dt))
        fence_async_shared()
        diag = r[:, None] == c[None, :]
        zero = gl.zeros([BT, BT], gl.float32, mma)
        M = warpgroup_mma(d_s, l_s, zero, use_acc=False)
        m_s.store((-M).to(dt))
        fence_async_shared()
        P = gl.where(diag, 1.0 - M, -M)
        a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        for _ in gl.static_range(BT // 16 - 2):  # P = I - P M; P M's diagonal is 0 (M is strictly block-lower)
            P = warpgroup_mma(gl.convert_layout(P.to(dt), a_op), m_s, zero, use_acc=False)
            P = gl.where(diag, P + 1.0, P)
        return warpgroup_mma(gl.convert_layout(P.to(dt), a_op), d_s, zero, use_acc=False)

    @gluon.jit
    def _chunk_prep_kernel(k_desc, ai_desc, Ai, g, beta, gc, seq_bounds, chunk_indices,
                           H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, BT: gl.constexpr):
        pid = gl.program_id(0)
        i_c = pid // HV  # value heads fastest, as chunk._chunk_program: GVA heads share the key tile in L2
        i_h = pid % HV
        i_n = gl.load(chunk_indices + 2 * i_c)
        bos = gl.load(seq_bounds + 2 * i_n).to(gl.int32)
        tok = bos + gl.load(chunk_indices + 2 * i_c + 1) * BT
        n_valid = gl.load(seq_bounds + 2 * i_n + 1).to(gl.int32) - tok  # rows of this chunk in its sequence
        dt: gl.constexpr = k_desc.dtype

        k_s = gl.allocate_shared_memory(dt, [BT, K], k_desc.layout)
        tile: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BT], dt)
        d_s = gl.allocate_shared_memory(dt, [BT, BT], tile)
        l_s = gl.allocate_shared_memory(dt, [BT, BT], tile)  # then Ai on its way out
        m_s = gl.allocate_shared_memory(dt, [BT, BT], tile)
        band_s = gl.allocate_shared_memory(gl.float32, [BT, 16], BAND)
        bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        mbarrier.init(bar.index(0), count=1)
        mbarrier.expect(bar.index(0), k_desc.block_type.nbytes)
        tma_load(k_desc, [tok, (i_h // (HV // H)) * K], bar.index(0), k_s)

        # the gates while the keys land: gc = cumsum(g) as a masked row sum, 0 past the sequence's end
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
        r = gl.arange(0, BT, layout=gl.SliceLayout(1, mma))
        c = gl.arange(0, BT, layout=gl.SliceLayout(0, mma))
        g_c = gl.load(g + (tok + c) * HV + i_h, mask=c < n_valid, other=0.0).to(gl.float32)
        beta_r = gl.load(beta + (tok + r) * HV + i_h, mask=r < n_valid, other=0.0).to(gl.float32)
        beta_c = gl.load(beta + (tok + c) * HV + i_h, mask=c < n_valid, other=0.0).to(gl.float32)
        gc_r, gc_c = _chunk_cumsum(g_c, BT, mma)
        gl.store(gc + (tok + r) * HV + i_h, gc_r, mask=r < n_valid)

        mbarrier.wait(bar.index(0), 0)
        mbarrier.invalidate(bar.index(0))
        A = _gated_kkt(k_s, gc_r, gc_c, beta_r, BT, mma, True)
        Ai_t = _solve(A, d_s, l_s, m_s, band_s, BT, mma) * beta_c[None, :]
        if n_valid >= BT:
            l_s.store(Ai_t.to(dt))
            fence_async_shared()
            tma_store(ai_desc, [tok, i_h * BT], l_s)
            tma.store_wait(pendings=0)
        else:  # a short last chunk: TMA would write its rows past the end, into the next sequence's
            gl.store(Ai + (tok + r).to(gl.int64)[:, None] * (HV * BT) + i_h * BT + c[None, :], Ai_t.to(dt),
                     mask=(r < n_valid)[:, None])


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
               HV: int) -> None:
    """gc [tokens, HV] (fp32) and Ai [tokens, HV, 64] of the chunks in chunk_indices ([NT, 2]: sequence, chunk
    within it) of the sequences in seq_bounds ([N, 2] token ranges), as ``chunk_fused._chunk_prep_fn`` computes
    them. k [B, T, H, K], g, beta [B, T, HV], all contiguous (see ``unsupported``)."""
    H, K = k.shape[2], k.shape[3]
    tokens = k.shape[0] * k.shape[1]
    NT = chunk_indices.shape[0]
    descs = descriptor(k.view(tokens, H * K), [BT, K]), descriptor(Ai.view(tokens, HV * BT), [BT, BT])
    _chunk_prep_kernel[(NT * HV,)](*descs, Ai, g, beta, gc, seq_bounds, chunk_indices, H=H, HV=HV, K=K, BT=BT,
                                   num_warps=WARPS)


def describe() -> str:
    """The kernel's settings, for a result row's path."""
    return f"gluon sm90 prep w{WARPS} (TMA, wgmma)"

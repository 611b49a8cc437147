"""Triton device functions every chunked kernel uses: sequence and chunk bounds, tile loads and stores.

Every token-indexed buffer is flat over tokens ([B * T, heads, dim]) and a kernel finds its sequence
through a layout's ``seq_bounds`` ([N, 2]: first token, end), so padded and varlen batches are one path.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..common.device import EPS, cast, exp


@triton.jit
def sequence_bounds(seq_bounds, i_n):
    """(first token, length) of sequence i_n of a layout's seq_bounds [N, 2]."""
    bos = tl.load(seq_bounds + 2 * i_n)
    return bos, (tl.load(seq_bounds + 2 * i_n + 1) - bos).to(tl.int32)


@triton.jit
def chunk_bounds(seq_bounds, chunk_indices, i_c):
    """(first token of the sequence, chunk index within it, sequence length) of global chunk i_c."""
    i_n = tl.load(chunk_indices + 2 * i_c).to(tl.int64)
    i_t = tl.load(chunk_indices + 2 * i_c + 1)
    bos, n_tok = sequence_bounds(seq_bounds, i_n)
    return bos, i_t, n_tok


@triton.jit
def chunk_program(HV: tl.constexpr, NV: tl.constexpr):
    """(global chunk, value head, V-block) of a chunk-parallel kernel's program in its 1-D grid of
    NT * HV * NV, V-blocks then value heads fastest: the programs that read one q/k tile (a chunk's
    V-blocks, its GVA value heads) run side by side and share it in L2 instead of each fetching it
    from memory (with the chunk fastest, they ran NT programs apart)."""
    pid = tl.program_id(0)
    return pid // (HV * NV), (pid // NV) % HV, pid % NV


@triton.jit
def load_tile(base, rows, n_rows, row_stride, cols, n_cols):
    """base[rows, cols] (rows >= n_rows and cols >= n_cols read as 0; n_rows None: every row is read, for
    rows already clamped inside). Offsets from base are int32 (the launcher checks a sequence's extent
    fits); base itself carries the 64-bit sequence offset."""
    ptrs = base + rows[:, None] * row_stride + cols[None, :]
    if n_rows is None:
        return tl.load(ptrs, mask=cols[None, :] < n_cols, other=0.0)
    else:
        return tl.load(ptrs, mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), other=0.0)


@triton.jit
def store_tile(base, rows, n_rows, row_stride, cols, n_cols, x):
    """base[rows, cols] = x (cast to base's dtype), inside the bounds only."""
    ptrs = base + rows[:, None] * row_stride + cols[None, :]
    if x.dtype != base.dtype.element_ty:  # cast narrows fp32 only
        x = cast(x, base.dtype.element_ty)
    tl.store(ptrs, x, mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols))


@triton.jit
def load_qk(base, rows, n_rows, row_stride, K: tl.constexpr, BK: tl.constexpr, L2NORM: tl.constexpr):
    """A [rows, BK] tile of q or k in its own dtype, L2-normalised per row in fp32 if L2NORM."""
    x = load_tile(base, rows, n_rows, row_stride, tl.arange(0, BK), K)
    if L2NORM:
        xf = x.to(tl.float32)
        x = cast(xf * tl.rsqrt(tl.sum(xf * xf, 1) + EPS)[:, None], x.dtype)
    return x


@triton.jit
def decay_masked(s, gc_r, gc_c, keep):
    """s o Gamma where keep (Gamma_ij = exp(gc_i - gc_j)), 0 elsewhere. A dropped entry's exponent is
    -inf (above the diagonal the difference is positive and could overflow), so its exp is 0 and one
    select per entry does (s is a finite dot product)."""
    return s * exp(tl.where(keep, gc_r[:, None] - gc_c[None, :], float("-inf")))

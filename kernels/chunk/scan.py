"""The chunk-parallel state pass's scan over segments: S_j+1 = M_j S_j + L_j per sequence."""

from __future__ import annotations

import triton
import triton.language as tl

from ..common.device import dot
from .tiles import load_tile, store_tile


SCAN_BV = 32  # V columns per program of the segment scan; 8 warps hold its [K, K] fp32 transition


@triton.jit
def segment_scan_kernel(M, L, h0, seg_init, ht, seg_offsets, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                        BK: tl.constexpr, BV: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr,
                        IEEE: tl.constexpr):
    """Per (sequence, value head, V-block): the state entering each segment, S_j+1 = M_j S_j + L_j from
    the initial state (fp32; stored to seg_init), and the final state."""
    i_nh, i_v = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // HV, i_nh % HV
    cols_k = tl.arange(0, BK)
    cols_v = i_v * BV + tl.arange(0, BV)
    if USE_H0:
        b_s = load_tile(h0 + (i_n * HV + i_h).to(tl.int64) * K * V, cols_k, K, V, cols_v, V)
    else:
        b_s = tl.zeros([BK, BV], dtype=tl.float32)
    first = tl.load(seg_offsets + i_n).to(tl.int64)
    for j in range(0, tl.load(seg_offsets + i_n + 1) - first):
        head = (first + j) * HV + i_h
        store_tile(seg_init + head * K * V, cols_k, K, V, cols_v, V, b_s)
        b_m = load_tile(M + head * K * K, cols_k, K, K, cols_k, K)
        b_s = dot(b_m, b_s, IEEE) + load_tile(L + head * K * V, cols_k, K, V, cols_v, V)
    if STORE_HT:
        store_tile(ht + (i_n * HV + i_h).to(tl.int64) * K * V, cols_k, K, V, cols_v, V, b_s)

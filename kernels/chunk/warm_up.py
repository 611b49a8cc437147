"""Which walks warm-up segments may take (``layout.SegmentLayout``), decided on the device from the gates.

A (sequence, value head) whose decay is too slow for some segment's warm-up to end within one segment's length
is walked whole instead of in segments: the segment walks skip it and the whole walks take it. Deciding here,
in a launch before the walk, keeps the call free of host syncs and its launches the same whatever the gates.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from .gate import log_decay
from .launch import Launch
from .layout import CHUNK, WARM_UP_LOG_DECAY, SegmentLayout

__all__ = ["mark_slow_walks"]

_WARM_UP_LOG_DECAY: tl.constexpr = tl.constexpr(WARM_UP_LOG_DECAY)


@triton.jit
def _slow_walks_kernel(g, a, A_log, dt_bias, seg_bounds, seg_parent, parent_bounds, slow_walks, HV: tl.constexpr,
                       WINDOW: tl.constexpr, BLOCK: tl.constexpr, RAW_GATE: tl.constexpr):
    # one program per (segment, value head): its warm-up would walk the WINDOW tokens before it and more where their
    # summed log decay stays above the bound; one that reaches its sequence's start is exact whatever the decay
    i_s, i_h = tl.program_id(0), tl.program_id(1)
    first = tl.load(seg_bounds + 2 * i_s)
    i_n = tl.load(seg_parent + i_s)
    start = first - WINDOW
    if start > tl.load(parent_bounds + 2 * i_n):
        total = 0.0
        for offset in tl.static_range(0, WINDOW, BLOCK):
            cols = offset + tl.arange(0, BLOCK)
            total += tl.sum(log_decay(g, a, A_log, dt_bias, start + cols, cols < WINDOW, i_h, HV, RAW_GATE), axis=0)
        if total > _WARM_UP_LOG_DECAY:
            tl.atomic_max(slow_walks + i_n * HV + i_h, 1)


def mark_slow_walks(x: Launch, segments: SegmentLayout) -> Tensor:
    """x.ws.slow_walks [N * HV] int32: 1 for each walk (n * HV + h) whose decay is too slow for the warm-up segments
    of ``segments`` (a warm-up longer than ``segments.chunks`` chunks), else 0. Two launches, no host sync."""
    slow = x.ws.slow_walks
    slow.zero_()
    window = segments.chunks * CHUNK
    _slow_walks_kernel[(segments.layout.N, x.HV)](
        x.g, x.a, x.A_log, x.dt_bias, segments.layout.seq_bounds, segments.parent, segments.parent_bounds, slow,
        HV=x.HV, WINDOW=window, BLOCK=min(1024, triton.next_power_of_2(window)), RAW_GATE=x.raw, num_warps=4)
    return slow

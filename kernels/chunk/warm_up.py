"""Which walks warm-up segments may take (``layout.SegmentLayout``), decided on the device from the gates.

A (sequence, value head) whose decay is too slow for some segment's warm-up to end within one segment's length
is walked whole instead of in segments: the segment walks skip it and the whole walks take it. Deciding here,
in a launch before the walk, keeps the call free of host syncs and its launches the same whatever the gates.
Each (segment, value head) writes its own mark, so that no buffer needs clearing first (a launch more on the
call's critical path); a walk reads the marks of its sequence's segments (``walk_is_slow``).
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl
from torch import Tensor

from ..common.ints import next_power_of_2
from .gate import log_decay
from .launch import Launch
from .layout import CHUNK, WARM_UP_LOG_DECAY, SegmentLayout

__all__ = ["SlowWalks", "mark_slow_walks", "slow_args", "walk_is_slow"]

_WARM_UP_LOG_DECAY: tl.constexpr = tl.constexpr(WARM_UP_LOG_DECAY)


@dataclass(frozen=True)
class SlowWalks:
    """The marks of ``mark_slow_walks``: the walk of sequence n, value head h is too slow for warm-up segments
    where any of marks [seg_offsets[n]:seg_offsets[n + 1], h] is 1."""

    marks: Tensor  # [segments, HV] int32
    seg_offsets: Tensor  # [N + 1] int32: each sequence's first segment (SegmentLayout.seg_offsets)


def slow_args(slow: SlowWalks | None) -> tuple[Tensor | None, Tensor | None]:
    """A walk kernel's (slow_marks, seg_offsets) arguments: (None, None) apart from warm-up segments."""
    return (None, None) if slow is None else (slow.marks, slow.seg_offsets)


@triton.jit
def _mark_kernel(g, a, A_log, dt_bias, seg_bounds, seg_parent, parent_bounds, marks, HV: tl.constexpr,
                 WINDOW: tl.constexpr, BLOCK: tl.constexpr, RAW_GATE: tl.constexpr):
    # one program per (segment, value head): its warm-up would walk the WINDOW tokens before it and more where their
    # summed log decay stays above the bound; one that reaches its sequence's start is exact whatever the decay
    i_s, i_h = tl.program_id(0), tl.program_id(1)
    first = tl.load(seg_bounds + 2 * i_s)
    start = first - WINDOW
    total = 2 * _WARM_UP_LOG_DECAY  # below the bound: not slow
    if start > tl.load(parent_bounds + 2 * tl.load(seg_parent + i_s)):
        total = 0.0
        for offset in tl.static_range(0, WINDOW, BLOCK):
            cols = offset + tl.arange(0, BLOCK)
            total += tl.sum(log_decay(g, a, A_log, dt_bias, start + cols, cols < WINDOW, i_h, HV, RAW_GATE), axis=0)
    tl.store(marks + i_s * HV + i_h, (total > _WARM_UP_LOG_DECAY).to(tl.int32))


@triton.jit
def walk_is_slow(marks, seg_offsets, i_n, i_h, HV: tl.constexpr):
    """Whether the walk of sequence i_n, value head i_h is too slow for warm-up segments (``SlowWalks``)."""
    lo = tl.load(seg_offsets + i_n)
    hi = tl.load(seg_offsets + i_n + 1)
    slow = 0
    for s0 in range(lo, hi, 64):
        s = s0 + tl.arange(0, 64)
        slow = tl.maximum(slow, tl.max(tl.load(marks + s * HV + i_h, mask=s < hi, other=0), axis=0))
    return slow != 0


def mark_slow_walks(x: Launch, segments: SegmentLayout) -> SlowWalks:
    """The marks (in x.ws.slow_marks) of the walks whose decay is too slow for the warm-up segments of ``segments``:
    a warm-up longer than ``segments.chunks`` chunks. One launch, no host sync."""
    window = segments.chunks * CHUNK
    _mark_kernel[(segments.layout.N, x.HV)](
        x.g, x.a, x.A_log, x.dt_bias, segments.layout.seq_bounds, segments.parent, segments.parent_bounds,
        x.ws.slow_marks, HV=x.HV, WINDOW=window, BLOCK=min(1024, next_power_of_2(window)), RAW_GATE=x.raw,
        num_warps=4)
    return SlowWalks(marks=x.ws.slow_marks, seg_offsets=segments.seg_offsets)

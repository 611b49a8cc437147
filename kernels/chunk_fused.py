"""Chunked gated delta rule (prefill), Triton: the fused variant of ``chunk`` (same math, fewer trips).

Two or three launches instead of five, and W and U never stored:

  1. ``_chunk_prep_kernel``, per (chunk, value head): the gate (raw gating's -exp(A_log) *
     softplus(a + dt_bias) and sigmoid(b) included) and its chunk-local cumsum (``chunk._gate_chunk``),
     A = strictLower(diag(beta)(Gamma o K K^T)) and (I + A)^-1 (``chunk._kkt_inverse``: one 64 x 64
     dot, the diagonal 16 x 16 blocks by a 15-step substitution reading A's diagonal blocks back from
     a small scratch, four 64 x 64 dots for the rest). Stores gc (fp32) and Ai = (I + A)^-1 diag(beta)
     (input dtype, [64, 64] per chunk and head). This is ``chunk``'s stages (a) and (b) in one program.
  2. ``chunk``'s state pass with ``FROM_AI``: each chunk's writes come from Ai and the inputs as
     v_new = Ai (V - exp(gc) o (K S)) (= U - W S, since W = Ai diag(exp(gc)) K and U = Ai V), instead of
     ``chunk``'s stage (c) storing W and U for the pass to read. Same tuned kernel and candidates
     (a list of its own, BV 16 and 8 warps among them, made this pass 450 us at B=1 T=16384 HV=32 on an
     H100 against ``chunk``'s 314 us).
  3. ``chunk``'s output pass, over pairs of chunks for large problems at K >= 128 (``output_span``,
     default: see OUTPUT_SPAN2_CANDIDATES; the state pass then stores every other chunk's state); or,
     for sequences of one chunk and many sequences of about equal length or short ones
     (``fuse_output``, default: see FUSE_OUTPUT_MIN_HEADS), the outputs are computed inside the state
     pass, which then has its own candidate list: one launch less and no h / v_new round trip, paid for
     with Q K^T recomputed once per V-block and no parallelism over chunks.

For long sequences with the output pass on its own (``pipeline``, default: see PIPELINE_MIN_CHUNKS) the
three run group by group on three streams (``PipelineLayout``: chunks [g * G, (g + 1) * G) of every
sequence in group g): the walk (the state pass, 128 latency-bound programs for one sequence at
qwen3-next's heads, leaving most of the GPU idle) goes on through group g while group g + 1's prep
kernel and group g - 1's output pass fill the rest; 1.05-1.08x at B=1 T >= 8192 on an H100. With the
output fused into the walk (many walks, which fill the GPU) it was slower, so it is not the default there.

On Hopper (sm_90), where a walk's programs make one wave, the walk with the output fused in is a Gluon
kernel instead (``chunk_walk_sm90``, ``walk="sm90"``; default: see SM90_WALK_MIN_CHUNKS): it issues the
chunk's independent products together, where Triton waits for each. 1.13-1.25x on qwen3-next B=1. Where
programs twice as wide fill the GPU, the Gluon walk with the state transposed (``chunk_walk_transposed_sm90``,
``walk="sm90_transposed"``): 1.15x at qwen3-next B=4 T=8192, 1.09x at parity B=16 T=256; it also walks
warm-up segments (below), 1.12-1.26x over the Triton walk where they are the default.

On Hopper, on 128+ walks that keep one program a SM busy (see SPECIALIZED_MIN_WALKS) with the gates given, the
prep and the walk run in one warp-specialized Gluon kernel instead (``chunk_specialized_sm90``,
``walk=SPECIALIZED``): a loader warpgroup and a prep warpgroup one chunk ahead of two walker warpgroups, so that
one pair's prep overlaps another's walk. 1.02-1.27x there (1.05x at qwen3-next B=4 T=8192, H100); it walks whole
sequences, dealt to its programs longest first, so fewer walks, or walks that leave SMs idle, lose. It also walks
warm-up segments of 16 chunks or more (see SPECIALIZED_MIN_SEGMENT_CHUNKS; ``SegmentLayout.walks``), sized so that
its programs take them evenly (``plan_segments``): 1.06-1.20x over the transposed walk there on qwen3-next B=1 and
1.13-1.29x on long-prefill's rows (H100); and, on 128+ sequence walks, shorter segments where they cut the makespan
that the longest sequences set (1.17-1.57x on unequal varlen batches, 1.43x at B=6 T=4096 HV=32; H200), and short
walks as one segment each (1.00-1.04x; see SPECIALIZED_SHORT_WALK_CHUNKS).

On Hopper, with the gates given and no in-kernel L2 norm, the prep kernel is a Gluon kernel instead
(``chunk_prep_sm90``, ``prep="sm90"``; default: ``plan_prep``): the same math and rounding with a fraction of
the Triton kernel's L1 / shared-memory traffic, which bounds it (its docstring). 1.24-1.27x on the prep kernel
and 1.07x on whole calls at qwen3-next's shapes, 1.02-1.11x on parity's rows it serves (H100).

What each should buy on Hopper: (1) ``chunk``'s (a) and (b) less a launch and the gc re-read. (2) Against
storing W and U (the prep kernel then took V and two more dots, and held 212 registers at K = V = 128,
two programs per SM): the prep kernel writes 64 values per token and head instead of K + V, reads no V,
and fits four programs per SM; the state pass reads Ai ([64, 64]) instead of W ([64, K]) and V instead
of U, and puts one more [64, 64] x [64, BV] dot on its serial chain per chunk. On an H100 (revision_ab,
interleaved) that was 1.12-1.18x on qwen3-next B=1, 1.55x at B=4 T=8192, 1.05-1.21x on parity's D = 128
rows, and 0.79-1.10x on its D = 64 rows (few walks of many chunks, where the longer chain shows).
(3) another launch and the h write + read (2 x K x V bytes per chunk and head, as much as all inputs
together at C = 64, K = V = 128 in bf16) on short sequences. For a few long sequences the state pass
can run chunk-parallel instead (``segments``, ``chunk.SegmentLayout``: per-segment transitions combined
by a scan; the backend triton.chunk_fused_cp), 1.2-1.4x slower than the sequential pass on qwen3-next
on an H100 (measured when W and U were stored); or with warm-up segments (``SegmentLayout.warm_up``: each
segment starts a few decayed chunks early), the default where the walks are few or unequal
(``warm_up_default``, ``plan_segments``): 1.25-1.36x on qwen3-next B=1, up to 4x on parity's few long walks and
1.5-1.7x on long-prefill's unequal varlen rows on an H100.

Registers in bf16 on sm_90 (as the JIT specializes, see ``chunk``; triton 3.6's ptxas), no spills,
4 warps, 1 stage: the prep kernel 127 at K = 128 (128 with raw gating and the in-kernel L2 norm), 125 at
K = 64 (149), so four programs per SM overlap their latency-bound inverses (see PREP_CANDIDATES).
Shared code (device functions, the state and output kernels, validation, the layout and workspace)
lives in ``chunk``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from .chunk import (CHUNK, ChunkLayout, ChunkWorkspace, SegmentLayout, WalkOrder, _Args, _bv_prune, _chunk_bounds,
                    _chunk_output_fn, _chunk_output_kernel, _chunk_program, _chunk_state_fn, _chunk_state_kernel,
                    _config_str, _configs, _diag_scratch, _gate_chunk, _kkt_inverse, _load_qk, _output_pass,
                    _setup, _state_and_output, _state_pass, _state_prune, _store_tile, chunk_tier,
                    deal_longest_first, warm_up_loads)
from . import chunk_prep_sm90, chunk_specialized_sm90, chunk_walk_sm90, chunk_walk_transposed_sm90
from .gluon_hopper import sm_count
from .common.tuning import TunedKernel
from .chunk import describe as _describe

__all__ = ["chunk_fused_gdn", "GLUON_WALKS", "SPECIALIZED", "PipelineLayout", "fuse_output_default",
           "output_span_default", "pipeline_default", "walk_default", "plan_walk", "plan_prep",
           "warm_up_default", "plan_segments", "describe"]

# When the output pass folds into the state pass by default (fuse_output_default). The fused pass
# walks each sequence's chunks one after the other and recomputes Q K^T per V-block, so it pays off only
# with walks enough to fill the GPU (64 (sequence, value head) pairs at K = 128, 128 at narrower K, whose
# output pass is cheaper) and either sequences of about equal length (any length: both the fused walk and
# the passes it replaces grow with it) or short ones (the longest of unequal sequences, which the fused
# walk waits for, at most 512 tokens). Measured on an H100 (bf16, interleaved graph timing, multi-kernel
# output pass vs fused, us):
#   K = 128, padded, N*HV 64..512, T 64..2048: 77.6 vs 71.2, 83.7 vs 77.2, 90.9 vs 85.8, 96.9 vs 90.2,
#       145.9 vs 128.6 (B=8 T=1024), 566 vs 479 (B=16 T=1024 HV=16), 271 vs 240 (B=2 T=2048 HV=32);
#   K = 128, varlen N*HV 128 and 256 (longest sequence 4x the mean): 69.7 vs 83.6, 94.9 vs 96.6;
#   K = 64, padded, N*HV 64..512: 48.0 vs 52.2, 79.6 vs 79.7, 79.3 vs 85.2, 83.6 vs 87.3 (at 3e8a745; at
#       a145fc7, N*HV 64 37.1 vs 39.7, N*HV 128..512 62.2 vs 56.7, 62.0 vs 51.8, 66.9 vs 54.1, and B=16 T=2048
#       H=8 (128) 236.7 vs 184.3);
#   unequal varlen, at a145fc7: longest 408 tokens (K = 128, 256 pairs) 81.0 vs 66.6 and 246 (K = 64, 512
#       pairs) 41.1 vs 38.0; longest 514 (K = 128, 128 pairs) 61.3 vs 71.6, 700 (K = 64, 256) 48.9 vs 60.9,
#       1097 (K = 64, 128) 51.0 vs 74.4;
#   N*HV 6..16 (parity's small cases, any K): fused 10-70% slower, but for sequences of one chunk (at
#       ec7c240+, B=1 T=63 HV=1 K=64: 16.4 vs 14.0);
#   K = 128, long sequences (at 5f7a4e0, qwen3-next's heads unless given): B=4 T=8192 (N*HV 128) 1561.6 vs
#       1202.8, B=2 T=8192 797.0 vs 702.4, B=2 T=32768 3093.9 vs 2702.3, B=3 T=8192 1265.1 vs 1196.4,
#       B=8 T=8192 3115.9 vs 2693.7, B=4 T=16384 HV=16 1550.8 vs 1363.4; B=1 T=4096..65536 (N*HV 32)
#       fused 1.09-1.15x slower (234.8 vs 255.8 ... 3276.4 vs 3725.2).
FUSE_OUTPUT_MIN_HEADS = 64  # (sequence, value head) pairs at K >= FUSE_OUTPUT_WIDE_K
FUSE_OUTPUT_MIN_HEADS_NARROW = 128  # below it
FUSE_OUTPUT_WIDE_K = 128
FUSE_OUTPUT_MAX_IMBALANCE = 1.25  # longest sequence / mean length, or:
FUSE_OUTPUT_MAX_UNEQUAL_LEN = 512  # tokens of the longest sequence

# The state pass with the output fused in (fuse_output; without it, chunk's state pass runs). Each of
# these won somewhere when every config was forced on an H100 (whole call, graph timer, us), when they were
# chosen: B=64 T=64 D=128: 81.3 at (64, 4, 1), 89.6 at (32, 4, 2); B=8 T=512 D=128: 70.0 at (64, 8, 3), 74.8
# at (64, 4, 2). At V = 128, (64, 4, 2) has since won every case, and it is the only one offered there
# (chunk.FUSED_WALK_V128). BV 16 (4 warps) and (32, 8, 2), dropped, were 1.1-1.5x slower everywhere; so
# were 2 warps; and BV 128 (one program a walk, Q K^T once per chunk instead of once per V-block: 8 warps 1.5-2.6x
# slower on qwen3-next B=4 T=8192 and parity's D = 128 rows, 16 warps 4-9x).
STATE_CANDIDATES = [(32, 4, 2), (64, 4, 1), (64, 4, 2), (64, 8, 3)]
STATE_CONFIGS = _configs(STATE_CANDIDATES)
_state_kernel = TunedKernel(_chunk_state_fn, STATE_CONFIGS, ["K", "V", "FUSE_OUTPUT", "state_tier"], _state_prune)


# (warps, stages[, register cap]); the prep kernel has no block width. Its inverse is latency bound, so
# what counts is how many programs overlap on an SM: 4 warps at 128 registers (K = 128, ptxas for sm_90)
# fit 4, a cap at 96 registers 5 (spilling). Forced one by one on an H100 (whole call, graph timer, us),
# qwen3-next B=1 T=16384 / B=4 T=8192, parity B=16 T=512 D=64 / varlen N=32 T=8192 D=64 / N=32 T=4096
# D=128: (4, 1) 712.6 / 816.1 / 56.5 / 50.6 / 52.1, (4, 1, 96) 713.5 / 820.0 / 57.1 / 48.5 / 52.5; dropped:
# 8 warps (2 programs) 810.4 / 1005.0 / 68.4 / 57.5 / 57.4, 2 warps (the dots without wgmma) 728.0 / 841.8 /
# 59.3 / 53.6 / 53.5. With a 128-wide key tile the cap is not offered (_prep_prune).
PREP_CANDIDATES = [(4, 1), (4, 1, 96)]
PREP_CONFIGS = _configs(PREP_CANDIDATES, block=False)


def _prep_prune(configs, named_args):
    """No register cap with a 128-wide key tile. Both forced on every parity D = 128 row (an H100 and an
    H200) and on qwen3-next B=4 T=8192 and B=1 T=16384 (the H200; whole calls, BENCHMARKS.md, twenty-ninth
    session), the cap ran level to 3.5% slower on every row but varlen N=64 T=6656 (0.4% and 1.4% faster);
    picked on the first case of its (Triton) autotune key, it ran the key's other cases up to 1.5 us slower. At
    D = 64 it stays: there it won varlen N=32 T=8192 by 4% (H100)."""
    if named_args["BK"] >= 128:
        return [c for c in configs if c.maxnreg is None]
    return configs

# The output pass over pairs of chunks (output_span 2): the state pass stores every other chunk's entering
# state, halving h's bytes (K x V per chunk and head, as much as q, k, v and o of the chunk together at
# K = V = 128 in bf16), both written and read; each program then takes a pair's three [64, 64] score
# blocks one after the other. Forced against output_span 1 on an H100 (whole call, interleaved, us):
# qwen3-next B=1 T=4096..65536 220.3 vs 225.9, 415.1 vs 423.7, 795.6 vs 815.3, 1542.9 vs 1593.5, 3021.8
# vs 3158.8; slower on every parity case that runs the output pass (up to 2,048 chunk-heads, K <= 128),
# by 1-20%. (A [128, 128] score tile at 8 warps, one program per SM, had been 0.98-1.02x on the former.)
OUTPUT_SPAN2_MIN_CHUNK_HEADS = 2048  # NT * HV
OUTPUT_SPAN2_MIN_K = 128
OUTPUT_SPAN2_CANDIDATES = [(64, 4, 1), (32, 4, 1), (128, 4, 1), (64, 8, 1)]
_output_span2_kernel = TunedKernel(_chunk_output_fn, _configs(OUTPUT_SPAN2_CANDIDATES),
                                   ["K", "V", "SPAN", "chunk_tier"], _bv_prune)


@triton.jit
def _chunk_prep_fn(k, g, beta, a, b, A_log, dt_bias, gc, A_diag, Ai, seq_bounds, chunk_indices, chunk_tier,
                   H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                   RAW_GATE: tl.constexpr, L2NORM: tl.constexpr, IEEE: tl.constexpr):
    i_c, i_h, _ = _chunk_program(HV, 1)
    bos, i_t, n_tok = _chunk_bounds(seq_bounds, chunk_indices, i_c)
    rows = i_t * BT + tl.arange(0, BT)
    b_gc, b_beta = _gate_chunk(g, beta, a, b, A_log, dt_bias, gc, bos, rows, rows < n_tok, i_h, HV, RAW_GATE)
    b_k = _load_qk(k + bos * H * K + (i_h // (HV // H)) * K, rows, n_tok, H * K, K, BK, L2NORM)
    b_ai = _kkt_inverse(b_k, b_gc, b_beta, rows, n_tok, _diag_scratch(A_diag, i_c, i_h, HV, BT), BT, IEEE)
    _store_tile(Ai + bos * HV * BT + i_h * BT, rows, n_tok, HV * BT, tl.arange(0, BT), BT, b_ai * b_beta[None, :])


_chunk_prep_kernel = TunedKernel(_chunk_prep_fn, PREP_CONFIGS, ["K", "chunk_tier"], _prep_prune)


@dataclass(frozen=True)
class PipelineLayout:
    """A batch's chunks in groups, for a pipelined call: group g takes chunks [g * chunks, (g + 1) * chunks)
    of every sequence (an even number, so that no pair of the output pass straddles two groups; empty
    for sequences already done). Group g's walk (the state pass, on a high-priority stream) waits only
    for group g's prep kernel, which ran beside group g - 1's walk, and group g's output pass (unless the
    output is fused into the walk) runs as soon as its walk is done, beside the next walk. A walk hands
    each sequence's state to the next group's through an fp32 buffer, the values it kept in registers,
    so the results are those of one walk. Built on the host once, outside timed calls."""

    spans: tuple[tuple[int, int], ...]  # the batch's sequences, as in its ChunkLayout
    groups: tuple[ChunkLayout, ...]

    @classmethod
    def build(cls, layout: ChunkLayout, chunks: int) -> PipelineLayout:
        if chunks < 2 or chunks % 2:
            raise ValueError(f"a pipeline group takes an even number of chunks, got {chunks}")
        if layout.max_len == 0:
            raise ValueError("nothing to pipeline: every sequence is empty")
        span, device = chunks * CHUNK, layout.seq_bounds.device
        return cls(spans=layout.spans, groups=tuple(
            ChunkLayout.from_spans([(min(s + t, e), min(s + t + span, e)) for s, e in layout.spans], layout.tokens,
                                   device)
            for t in range(0, layout.max_len, span)))

    def firsts(self, span: int) -> list[int]:
        """Each group's first block of ``span`` chunks in the batch's numbering (groups in turn, each
        sequence-major): where its chunks' scratch and entering states sit in the workspace."""
        firsts = [0]
        for group in self.groups[:-1]:
            firsts.append(firsts[-1] + group.blocks(span)[0])
        return firsts


_STREAMS: dict[int, tuple[torch.cuda.Stream, torch.cuda.Stream, torch.cuda.Stream]] = {}


def _pipeline_streams(device: torch.device) -> tuple[torch.cuda.Stream, torch.cuda.Stream, torch.cuda.Stream]:
    """(walk, prep, output) streams of a device, made once: the walk is the critical path, so its stream
    has the higher priority (its programs are scheduled first when an SM frees up)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _STREAMS:
        low, high = torch.cuda.Stream.priority_range()
        _STREAMS[index] = (torch.cuda.Stream(device, priority=high), torch.cuda.Stream(device, priority=low),
                           torch.cuda.Stream(device, priority=low))
    return _STREAMS[index]


def plan_prep(k: Tensor, raw_gate: bool, qk_l2norm: bool, prep: str | None = None, walk: str = "triton") -> str:
    """Which prep kernel a call runs: "sm90" (chunk_prep_sm90, Gluon) where it can, else "triton" (None: the
    default); raises ValueError for "sm90" where it cannot. With walk=SPECIALIZED the walk's own kernel does
    the prep: SPECIALIZED (prep None or SPECIALIZED)."""
    if walk == SPECIALIZED:
        if prep not in (None, SPECIALIZED):
            raise ValueError(f"walk={SPECIALIZED!r} computes the prep in its own kernel, got prep={prep!r}")
        return SPECIALIZED
    why = chunk_prep_sm90.unsupported(k, raw_gate, qk_l2norm)
    if prep is None:
        return "triton" if why else "sm90"
    if prep not in ("triton", "sm90"):
        raise ValueError(f"prep must be 'triton' or 'sm90', got {prep!r}")
    if prep == "sm90" and why:
        raise ValueError(f"prep='sm90' cannot run this call: {why}")
    return prep


def _prep(x: _Args, over: ChunkLayout, prep: str, first_chunk: int = 0) -> None:
    """The prep kernel (``plan_prep``'s) over the chunks of ``over``, the first of which is the batch's
    ``first_chunk``."""
    if not over.NT:
        return
    if prep == "sm90":
        chunk_prep_sm90.chunk_prep(x.k, x.g, x.beta, x.ws.gc, x.ws.Ai, over.seq_bounds, over.chunk_indices, x.HV)
    else:
        _chunk_prep_kernel[(over.NT * x.HV,)](
            x.k, x.g, x.beta, x.a, x.b, x.A_log, x.dt_bias, x.ws.gc, x.ws.A_diag[first_chunk:], x.ws.Ai,
            over.seq_bounds, over.chunk_indices, chunk_tier(over.NT, x.HV), H=x.H, HV=x.HV, K=x.K, BT=CHUNK,
            BK=x.BK, RAW_GATE=x.raw, L2NORM=x.l2norm, IEEE=x.ieee)


# The Gluon walks for Hopper by name (``walk``), each a module with fused_walk, unsupported and describe
GLUON_WALKS = {"sm90": chunk_walk_sm90, "sm90_transposed": chunk_walk_transposed_sm90}
# walk=SPECIALIZED: the prep and the walk in one warp-specialized kernel for Hopper (chunk_specialized_sm90); the
# default on many walks that keep its programs busy (walk_default, SPECIALIZED_MIN_WALKS).
SPECIALIZED = "sm90_specialized"


def _walk_with_output(x: _Args, over: ChunkLayout, h0: Tensor | None, ht: Tensor | None, walk: str,
                      segments: SegmentLayout | None = None) -> None:
    """The state pass with the output fused in, over the sequences of ``over`` from h0 (or zero), final states
    to ht (or not stored): the Triton walk or a Gluon one (``GLUON_WALKS[walk]``), over warm-up segments of
    ``over`` where given (a Gluon walk with TAKES_WARM_UP_SEGMENTS)."""
    if walk in GLUON_WALKS:
        walked, over_segments = (over, {}) if segments is None else (segments.layout, {"segments": segments})
        GLUON_WALKS[walk].fused_walk(x.q, x.k, x.v, x.ws.gc, x.ws.Ai, x.out, h0, ht, over.seq_bounds, over.N, x.scale,
                                     long_walk=walked.max_len >= SM90_LONG_WALK_MIN_CHUNKS * CHUNK, **over_segments)
    else:
        _state_pass(x, _state_kernel, over, h0, ht, fuse=True)


def _pipelined(x: _Args, pipe: PipelineLayout, fuse_output: bool, output_final_state: bool, walk: str,
               prep_kernel: str) -> None:
    """Prep, walk and output pass group by group (see PipelineLayout); on a GPU the three run on their
    own streams, forked from and joined back into the caller's (CUDA-graph capturable)."""
    ws, last = x.ws, len(pipe.groups) - 1
    chunk_firsts, block_firsts = pipe.firsts(1), pipe.firsts(x.span)

    def prep(g: int) -> None:
        _prep(x, pipe.groups[g], prep_kernel, chunk_firsts[g])

    def walk_group(g: int) -> None:
        ht = (ws.final_state if output_final_state else None) if g == last else ws.handoff[g % 2]
        h0 = x.h0 if g == 0 else ws.handoff[(g - 1) % 2]
        if fuse_output:
            _walk_with_output(x, pipe.groups[g], h0, ht, walk)
        else:
            _state_pass(x, _chunk_state_kernel, pipe.groups[g], h0, ht, h=ws.h[block_firsts[g]:])

    def output(g: int) -> None:
        _output_pass(x, _output_kernel(x.span), pipe.groups[g], h=ws.h[block_firsts[g]:])

    if x.q.device.type != "cuda":
        for g in range(last + 1):
            prep(g)
            walk_group(g)
            if not fuse_output:
                output(g)
        return
    main = torch.cuda.current_stream(x.q.device)
    walk_s, prep_s, out_s = _pipeline_streams(x.q.device)
    streams = (walk_s, prep_s) if fuse_output else (walk_s, prep_s, out_s)  # forked and joined: the used ones
    for s in streams:
        s.wait_stream(main)
    prepped = {g: torch.cuda.Event() for g in range(1, last + 1)}  # group 0's prep runs on the walk's stream
    with torch.cuda.stream(walk_s):
        prep(0)
    with torch.cuda.stream(prep_s):
        for g, event in prepped.items():
            prep(g)
            event.record()
    for g in range(last + 1):
        with torch.cuda.stream(walk_s):
            if g:
                walk_s.wait_event(prepped[g])
            walk_group(g)
        if not fuse_output:
            walked = torch.cuda.Event()
            walked.record(walk_s)
            with torch.cuda.stream(out_s):
                out_s.wait_event(walked)
                output(g)
    for s in streams:
        main.wait_stream(s)


# When a call is pipelined by default (pipeline_default), and in groups of how many chunks: its output pass
# runs on its own (the walks with the output fused in lost, below), its longest sequence has at least 128
# chunks (one sequence) or 256 (several), and it has 4,096 chunk-heads; groups of a quarter of the longest
# sequence's chunks, even, 32 to 128. Forced on an H100 (chunk_fused_sweep pipeline, interleaved, graph
# replay, us; one call, then groups of 16 / 32 / 64 / 128 chunks), qwen3-next B=1: T=4096 194.4 vs 196.4 /
# 212.1 / 194.2 / 194.4; T=8192 370.4 vs 363.0 / 351.9 / 380.6 / 370.0; T=16384 717.3 vs 695.0 / 670.9 /
# 661.4 / 720.7; T=32768 1403.6 vs 1342.9 / 1313.6 / 1293.2 / 1281.4; T=65536 2763.1 vs 2656.6 / 2595.2 /
# 2566.3 / 2538.4. Several sequences (groups of 32 / 64 / 128; longest sequence in chunks): varlen N=4
# T=32768 (285) 1312.4 vs 1310.4 / 1249.0 / 1255.0, N=2 T=32768 (483) 1367.2 vs 1383.4 / 1312.1 / 1315.2,
# N=8 T=65536 (393) 2575.7 vs 2567.5 / 2487.9 / 2451.3, B=2 T=16384 HV=16 (256) 732.2 vs 714.0 / 682.9 /
# 734.3; but N=3 T=16384 (136) 650.3 vs 652.0 / 641.5 / 652.3 and B=2 T=8192 HV=16 (128) 379.5 vs 369.6 /
# 387.4 / 379.2, each 0.96-0.97x in a revision_ab at their default groups of 32. With the output fused in
# (a prep kernel beside the walk holds the SMs that its next group's programs wait for; groups of 16 / 32
# / 64), B=4 T=8192 837.8 vs 1084.8 / 1001.2 / 929.2, B=2 T=16384 1164.6 vs 1386.5 / 1326.7 / 1307.5.
# Measured at HV = 16 and 32 only, hence the floor on chunk-heads.
PIPELINE_MIN_CHUNKS = 128  # of the one sequence
PIPELINE_MIN_CHUNKS_SEVERAL = 256  # of the longest of several
PIPELINE_MIN_CHUNK_HEADS = 4096  # NT * HV
PIPELINE_GROUP_CHUNKS = (32, 128)  # the least and the most chunks per group


# The Gluon walk (walk "sm90", the output fused in) pipelined by default from walks of this many chunks, in
# groups of an eighth of them (32 to 128). Forced on an H100 (chunk_fused_sweep walk, us; one call, then groups
# of 32 / 64 / 128), qwen3-next B=1: T=16384 603.0 vs 606.7 / 616.6 / 632.2; T=32768 1175.9 vs 1163.1 / 1133.6 /
# 1184.8; T=65536 2309.0 vs 2282.9 / 2225.0 / 2184.2.
SM90_PIPELINE_MIN_CHUNKS = 512


def pipeline_default(layout: ChunkLayout, HV: int, fuse_output: bool, segments: SegmentLayout | None = None,
                     walk: str = "triton") -> int | None:
    """Chunks per pipeline group by default (see PIPELINE_MIN_CHUNKS and SM90_PIPELINE_MIN_CHUNKS), or None
    for one call: for long sequences whose output pass runs on its own, or whose walk is the Gluon one."""
    chunks = triton.cdiv(layout.max_len, CHUNK)  # the longest walk
    least, most = PIPELINE_GROUP_CHUNKS
    if segments is not None:
        return None
    if walk == "sm90":
        return min(max(chunks // 8 // 2 * 2, least), most) if chunks >= SM90_PIPELINE_MIN_CHUNKS else None
    min_chunks = PIPELINE_MIN_CHUNKS if layout.N == 1 else PIPELINE_MIN_CHUNKS_SEVERAL
    if fuse_output or chunks < min_chunks or layout.NT * HV < PIPELINE_MIN_CHUNK_HEADS:
        return None
    return min(max(chunks // 4 // 2 * 2, least), most)


def fuse_output_default(layout: ChunkLayout, HV: int, K: int, segments: SegmentLayout | None = None) -> bool:
    """Whether the output pass folds into the state pass by default: sequences of one chunk, or many
    sequences of about equal length or short (see FUSE_OUTPUT_MIN_HEADS). With the chunk-parallel pass the walks are the
    segments', so the rule applies to them; warm-up segments always fold it in (they need it)."""
    if segments is not None and segments.warm_up:
        return True
    lay = layout if segments is None else segments.layout
    if lay.max_len <= CHUNK:  # one chunk a walk: nothing sequential to wait for, one launch fewer
        return True
    min_heads = FUSE_OUTPUT_MIN_HEADS if K >= FUSE_OUTPUT_WIDE_K else FUSE_OUTPUT_MIN_HEADS_NARROW
    return lay.N * HV >= min_heads and (lay.max_len * lay.N <= FUSE_OUTPUT_MAX_IMBALANCE * lay.tokens
                                        or lay.max_len <= FUSE_OUTPUT_MAX_UNEQUAL_LEN)


def output_span_default(layout: ChunkLayout, HV: int, K: int, segments: SegmentLayout | None = None) -> int:
    """Chunks per output-pass block by default: 2 for large problems at K >= 128 (where the output pass
    runs at all, see OUTPUT_SPAN2_CANDIDATES), else 1; 1 with the chunk-parallel state pass."""
    large = layout.NT * HV >= OUTPUT_SPAN2_MIN_CHUNK_HEADS and K >= OUTPUT_SPAN2_MIN_K
    return 2 if large and segments is None else 1


# When the walk with the output fused in is chunk_walk_sm90's Gluon kernel by default (walk_default): where it
# runs, when its programs (N * HV * V / BV, two per SM) make one wave that fills at least half the SMs, on walks
# of 8 chunks or more (the shortest measured). With more programs, BV 32 (twice the Triton walk's programs at
# BV 64) loses; with fewer, the Triton path's output pass, parallel over chunks, wins. Whole calls on an H100
# (chunk_fused_sweep walk, us, Triton default -> Gluon; walks of 128 columns, N * HV * V / 128):
#   qwen3-next B=1 T=4096..65536 (32): 192.6 -> 159.5, 350.3 -> 306.3, 651.1 -> 598.2, 1273.1 -> 1174.6,
#       2497.4 -> 2333.1; parity B=8 T=512 H=HV=8 (64): 50.1 -> 42.0;
#   fewer: parity B=4 T=1024 H=HV=4 (16) 40.2 -> 41.9, B=2 T=1500 (8) 46.5 -> 54.3;
#   more: parity B=16 T=256 (128) 41.2 -> 44.6, B=32 T=128 (256) 44.4 -> 50.0, B=64 T=64 (512) 50.9 -> 57.5,
#       qwen3-next B=4 T=8192 (128) 792.8 -> 943.0; but unequal varlen N=32 T=4096 HV=4 (128, longest 514)
#       49.0 -> 43.6 and N=64 T=6656 (256, longest 408) 51.8 -> 50.0, left to the Triton walk by this rule.
# Pipelined (prep of the next group beside the walk) it lost everywhere: B=1 T=65536 2333 -> 2983 (groups of 128).
SM90_WALK_MIN_CHUNKS = 8
# chunk_walk_transposed_sm90's Gluon walk (BV 64) instead where its programs (N * HV * V / 64, twice as wide)
# outnumber the SMs, on walks of 4 chunks or more. Whole calls on an H100 (us; the default, then the Triton walk
# / chunk_walk_sm90 / the transposed walk, interleaved; programs of 64 columns):
#   qwen3-next B=4 T=8192 (256): 736.9, 736.2 / 842.5 / 642.0; parity B=16 T=256 H=HV=8 (256, walks of 4
#       chunks): 40.4, 40.0 / 42.5 / 36.6;
#   fewer: parity B=8 T=512 H=HV=8 (128) 39.9, 48.3 / 39.9 / 38.9 (see short walks below); B=4 T=1024 H=HV=4 (32)
#       33.2, 39.6 / 40.1 / 47.4; qwen3-next B=1 (64): 0.50-0.60x of the default (one long chain per SM);
#   more than two per SM, on walks of 1 and 2 chunks: parity B=32 T=128 (512) 43.3, 42.1 / 48.2 / 44.1; B=64 T=64
#       (1024) 50.7, 49.9 / 56.9 / 53.5; on walks of 4 chunks or more (thirty-third session; the Triton walk, then
#       with the output fused in / chunk_walk_sm90 / the transposed walk): parity varlen N=64 T=6656 H=HV=4 (512,
#       longest 7) 49.4, 50.0 / 47.3 / 46.5; B=8 T=4096 H=16 HV=32 (512) 737.3, 737.6 / 838.5 / 639.0; B=16
#       T=1024 (1024) 386.1, 386.1 / 439.6 / 345.9; B=32 T=512 (2048) 395.6, 394.9 / 448.0 / 366.5; B=64 T=256
#       H=HV=8 (1024) 121.3, 121.1 / 135.9 / 118.0; B=32 T=1024 H=4 HV=8 (512) 198.0, 197.2 / 219.8 / 176.3;
#       varlen N=128 T=16384 H=HV=4 (1024, longest 779 tokens) 132.8, 93.6 / 98.6 / 88.4.
SM90_TRANSPOSED_WALK_MIN_CHUNKS = 4
# And at one program per SM or fewer, down to half the SMs, on walks too short for three warm-up segments of 4
# chunks (longer ones are cut into segments by default); whole calls on an H100 (us; the default (chunk_walk_sm90
# from 8 chunks, else the Triton walk) -> the transposed walk; thirty-third session): parity B=8 T=512 H=HV=8
# (128 programs, 8 chunks) 40.0 -> 39.1 and 39.6 -> 38.9; B=8 T=256 H=HV=8 (128, 4) 29.8 -> 26.4; B=6 T=512
# H=HV=8 (96, 8) 36.9 -> 35.6; B=4 T=640 H=8 HV=16 (128, 10) 47.7 -> 46.3; B=2 T=640 H=16 HV=32 (128, 10) 47.9
# -> 46.0. (walk_default: "short" is fewer than WARM_UP_MIN_SEGMENTS * WARM_UP_SEGMENT_CHUNKS[0] chunks.)
# Over warm-up segments (where warm_up_default cuts the walks) the transposed walk runs by default too, over the
# same segments (since the forty-third session, those under SPECIALIZED_MIN_SEGMENT_CHUNKS, or with raw gates): their
# sizes put its programs at about two per SM. Whole calls on an H100 (us; the default then
# (the Triton walk over warm-up segments) -> the transposed walk over warm-up segments of 16 / 32 / 64 / 128
# chunks; * the default's size), interleaved:
#   qwen3-next B=1 T=4096 114.0 -> 99.3* / 127.4 / 189.8 / 191.6; T=8192 204.1 -> 186.0 / 180.0* / 232.9 / 358.2;
#       T=16384 371.8 -> 347.7 / 336.6 / 331.3* / 438.1; T=32768 741.8 -> 680.0 / 661.0 / 643.0* / 648.8;
#       T=65536 1470.9 -> 1348.5 / 1301.9 / 1268.1* / 1268.1;
#   long-prefill varlen N=2 T=32768 740.9 -> 682.5 / 664.4 / 646.0* / 640.8, N=4 T=32768 766.0 -> 674.4 / 678.6
#       / 665.9* / 709.7, N=3 T=16384 390.9 -> 354.4 / 341.3 / 338.4* / 476.9, B=2 T=16384 HV=16 404.6 -> 368.9 /
#       356.7 / 348.0* / 439.2, B=2 T=8192 HV=16 210.9 -> 193.5 / 184.9* / 227.9 / 340.4;
#   parity, segments of 4*: B=4 T=1024 H=HV=4 32.4 -> 28.5, B=2 T=1500 H=HV=4 gate_norm 10 46.8 -> 37.2, varlen
#       N=32 T=4096 36.8 -> 34.1.
# The Gluon walk runs as a long walk (long_walk: each chunk's gates loaded one chunk ahead, its q, v and Ai tiles
# two) on walks of this many chunks or more. Walk alone on an H100 (us, one chunk ahead -> gates ahead -> both):
# B=1 T=4096 / 8192 / 32768 HV=32 116.6 -> 108.5 -> 105.0 / 225.7 -> 208.4 -> 200.6 / 890.1 -> 815.1 -> 786.7;
# shorter walks lose by a little: B=8 T=512 H=HV=8 24.5 -> 24.3 -> 25.1, B=4 T=1024 H=HV=4 26.2 -> 26.3 -> 27.0.
SM90_LONG_WALK_MIN_CHUNKS = 64
# The prep and the walk in one warp-specialized kernel (walk=SPECIALIZED) runs by default on SPECIALIZED_MIN_WALKS
# or more walks that keep its programs busy: its programs take whole walks in turn, dealt longest first
# (chunk.WalkOrder), and the fill is the share of the SMs' time over the most loaded program's walks that walks
# take (one program a SM). Walks of about equal length (their chunks SPECIALIZED_MIN_FILL or more of N walks as long
# as the longest) of one or two chunks run on it at any fill, longer ones from SPECIALIZED_MIN_ROUND_FILL (for them,
# walks over the rounds' slots); unequal walks from SPECIALIZED_MIN_UNEQUAL_FILL, where the two-kernel path's
# programs meet the same unequal walks in order. Whole calls on an H100, thirty-sixth session (us, the two-kernel
# path / the specialized kernel with S^T through shared memory, one run side by side, exp/rule3.yaml in
# BENCHMARKS.md), D = 128, H = HV = 8 unless given. Rounds 0.97 filled (128 or 256 walks): one chunk B=16 19.7 /
# 17.6; two B=16 T=128 25.8 / 25.4; three B=16 T=192 32.7 / 29.9; four B=16 T=256 35.6 / 34.8; eight B=16 58.3 /
# 55.3, B=8 H=16 HV=32 102.4 / 91.4; sixteen B=16 100.2 / 92.7, B=32 187.8 / 165.7; 32 B=8 T=2048 HV=16 170.2 /
# 164.9; 64 B=8 T=4096 H=16 HV=32 631.6 / 609.3; 128 B=4 T=8192 H=16 HV=32 635.7 / 607.3. Rounds 0.73 filled (96
# or 192 walks): two chunks B=24 T=128 36.8 / 35.8 still win (and one, B=12 19.1 / 16.5, under
# SPECIALIZED_MIN_WALKS: not taken, with 64 walks unmeasured); four B=12 T=256 32.0 / 33.2, eight B=12 52.1 / 53.6,
# sixteen B=12 87.5 / 91.7, 64 B=6 T=4096 HV=32 554.5 / 619.0, 128 B=3 T=8192 558.7 / 597.3 lose. Unequal walks,
# thirty-eighth session, with the walks dealt longest first (varlen, the suites' seeded split, exp/varlen.yaml in
# BENCHMARKS.md; N sequences, T tokens, fill): win N=128 T=8192 HV=4 (0.87) 63.4 / 50.2, N=64 T=4096 HV=8 (0.90)
# 66.4 / 52.1, N=32 T=8192 HV=8 (0.62) 90.6 / 74.9, N=16 T=16384 HV=32 (0.94) 376.9 / 330.0, N=8 T=32768 HV=32
# (0.84) 757.6 / 707.0, parity's N=64 T=6656 HV=4 (0.60) 46.0 / 44.5; lose N=32 T=4096 HV=4 (0.27) 32.9 / 51.6,
# N=64 T=16384 HV=4 (0.32) 80.4 / 133.5, N=48 T=12288 HV=4 (0.33) 63.1 / 100.8, N=32 T=16384 HV=8 (0.33) 130.6 /
# 240.2, N=16 T=8192 HV=8 (0.33) 72.6 / 122.7, N=4 T=32768 HV=32 (0.44) 653.7 / 1319.1, where one long walk
# sets the makespan and the two-kernel path cuts it into warm-up segments.
SPECIALIZED_MIN_WALKS = 128
SPECIALIZED_MIN_ROUND_FILL = 0.9  # measured: 0.97 and 0.73; between them, not
SPECIALIZED_MIN_FILL = 0.75  # measured: 1 (padded) and 0.31; between them, not
SPECIALIZED_MIN_UNEQUAL_FILL = 0.5  # measured: 0.60 and 0.44; between them, not
# Over warm-up segments (SegmentLayout.walks: the segments dealt on the host, their warm-ups found on the device) the
# warp-specialized kernel runs by default where the segments are this long or longer; the transposed walk on
# shorter ones. H100, forty-third session (revision A/B, the transposed walk over the same segments -> the
# specialized kernel, us): qwen3-next B=1 T=32768 (segments of 64 chunks) 619.8 -> 534.0, T=65536 (64) 1210.1 ->
# 1045.2; parity B=4 T=1024 H=HV=4 (4) 27.1 -> 34.3, B=2 T=1500 gate_norm 10 (4, warm-ups back to the sequences'
# starts) 36.2 -> 58.1.
SPECIALIZED_MIN_SEGMENT_CHUNKS = 16
# and there its segments are cut to the size, up to this, whose segments (each but a sequence's first with a chunk of
# warm-up) deal to its programs with the least makespan (``plan_segments``): qwen3-next B=1 T=65536 HV=32 on 132 SMs,
# segments of 64 chunks make the most loaded program walk 260 chunks, of 125 chunks 252, of 249 chunks 250 (one walk
# a program, 128 of them; the even share: 248.2). Up to 128 until the forty-fourth session; of qwen3-next's and
# long-prefill's rows only T=65536 takes a size over 128 now.
SPECIALIZED_MAX_SEGMENT_CHUNKS = 256
# On SPECIALIZED_MIN_WALKS sequence walks or more, its programs also take warm-up segments of from 2 chunks (the
# largest size of the least makespan, for the fewest warm-ups), so that the longest sequences no longer set the
# makespan, where that cuts it to SPECIALIZED_MAX_SPLIT_MAKESPAN or less (qwen3-next B=4 T=8192: 126 against 128,
# kept whole); and walks shorter than SPECIALIZED_SHORT_WALK_CHUNKS, which it would walk whole, run as warm-up
# segments of one sequence each, whose first chunk skips (K S)^T and (Q S)^T without h0 (on whole walks that skip
# cost qwen3-next B=4 T=8192 3%). H200, forty-seventh session, revision A/B (us, the rule before -> now; size):
#   cut: parity varlen N=64 T=6656 HV=4 (the specialized kernel on whole walks of up to 7 chunks) 35.5 -> 30.4 (5),
#       varlen N=32 T=4096 HV=4 (the transposed walk over segments of 4) 33.2 -> 25.1 (3); varlen N=32 T=8192 HV=8
#       60.2 -> 45.4 (9), N=64 T=16384 HV=4 72.5 -> 46.3 (9), one sequence of 7 chunks and 63 of one (HV=4) 33.0 ->
#       23.6 (2); B=6 T=4096 H=16 HV=32 (192 walks of 64 chunks, the transposed walk) 498.3 -> 349.1 (31);
#   one segment a sequence: parity B=16 T=256 26.1 -> 25.7, B=32 T=128 27.7 -> 26.8, B=64 T=64 31.3 -> 30.0;
#       B=64 T=256 H=8 72.6 -> 70.3, B=16 T=192 22.3 -> 22.1, B=16 T=64 15.4 -> 15.4; varlen N=128 T=8192 HV=4
#       40.8 -> 39.1, N=64 T=4096 HV=8 42.4 -> 41.0;
#   measured beforehand: N=16 T=16384 H=16 HV=32 (whole walks of up to 36 chunks, makespan 68) 254.2 -> 256.7 on
#       segments of 8 (makespan 71), slower on shorter ones (now kept whole: 31 chunks would make it 66).
SPECIALIZED_SHORT_WALK_CHUNKS = 16
SPECIALIZED_MAX_SPLIT_MAKESPAN = 0.9


def _specialized_order(layout: ChunkLayout, HV: int, device: torch.device,
                       segments: SegmentLayout | None = None) -> WalkOrder:
    """The walks of walk=SPECIALIZED dealt to its programs, one per SM at most: whole sequences, or the warm-up
    segments of ``segments`` (whose warm-up starts the kernel finds)."""
    if segments is None:
        return layout.walk_order(HV, _specialized_programs(layout, HV, device))
    return segments.walks(HV, _specialized_programs(segments.layout, HV, device))


def _specialized_segments(layout: ChunkLayout, HV: int, chunks: int, q: Tensor, V: int, raw_gate: bool,
                          qk_l2norm: bool) -> bool:
    """Whether warm-up segments of ``chunks`` chunks, of the sequences of ``layout``, go to walk=SPECIALIZED by
    default: where they are SPECIALIZED_MIN_SEGMENT_CHUNKS long, or the sequences' walks SPECIALIZED_MIN_WALKS."""
    return (chunks >= SPECIALIZED_MIN_SEGMENT_CHUNKS or layout.N * HV >= SPECIALIZED_MIN_WALKS) and \
        chunk_specialized_sm90.unsupported(q, V, raw_gate, qk_l2norm) is None


def _specialized_programs(layout: ChunkLayout, HV: int, device: torch.device) -> int:
    """walk=SPECIALIZED's programs for the walks of ``layout``: one per SM at most."""
    return max(min(layout.N * HV, sm_count(device)), 1)


# Warm-up segments (``chunk.SegmentLayout`` with ``warm_up``) by default where the sequential walks (N * HV
# walks of about V / 64 programs each) leave SMs idle for most of the longest walk: the walks are cut into
# segments that, with each one's few warm-up chunks, all run at once, about two programs per SM in all, of 4 to
# 64 chunks, when the longest walk makes 3 segments or more. Forced on an H100 (chunk_fused_sweep segments, us;
# the default then (the Gluon walk at qwen3-next B=1) -> warm-up segments of 4 / 8 / 16 / 32 / 64 / 128 chunks):
#   qwen3-next B=1 (N*HV 32): T=4096 147.2 -> - / 124.5 / 117.8 / 155.6 / 218.6; T=8192 283.5 -> - / 232.1 /
#       220.3 / 215.5 / 288.8; T=16384 553.6 -> - / 446.7 / 423.0 / 411.3 / 406.0; T=32768 1069.3 -> 804.5 (32)
#       / 796.7 (64) / 791.5 (128); T=65536 2098.4 -> 1582.5 (32) / 1566.8 (64) / 1561.8 (128) / 1564.3 (256);
#   parity, few long walks (4 / 8 / 16): N=1 T=8192 HV=4 K=60 144.7 -> 36.3 / 43.0 / 61.3; B=4 T=2048 HV=8 K=64
#       68.9 -> 50.3 / 57.5 / 72.3; B=4 T=1024 HV=4 K=128 40.4 -> 33.7 / 40.8 / 56.9; B=3 T=1024 K=100 41.6 ->
#       35.2; varlen N=8 T=4096 34.0 -> 29.4, N=16 T=8192 45.6 -> 37.2, N=32 T=8192 (128 walks, K=64) 48.0 ->
#       37.5; but B=2 T=1500 HV=4 at gate_norm 10 (weak decay, warm-ups of about 7 chunks) 46.5 -> 48.1;
#   walks of 8 chunks (2 segments of 4, left sequential): B=2 T=500 HV=3 24.7 -> 25.6, varlen N=3 T=1000
#       23.1 -> 24.4 and 21.9 -> 24.0, B=8 T=512 HV=8 K=128 (the Gluon walk) 41.7 -> 46.4;
#   long-prefill (the sequential walk, the Gluon one here -> the default's segments): B=2 T=8192 HV=16 285.0 ->
#       221.7, B=2 T=16384 HV=16 556.6 -> 430.9, varlen N=2 T=32768 1070.9 -> 801.5;
#   many walks: qwen3-next B=4 T=8192 (N*HV 128 at K=128) 800.2 -> 799.0 (64), varlen N=128 (512) 34.6 -> 35.1;
#       parity B=16 T=256 HV=8 K=128 (walks of 4 chunks) 41.0 -> 50.8 (2) / 42.2 (4);
#   many unequal walks, the longest over twice the even share (2 / 4 / 32 / 64 / 128 chunks): long-prefill varlen
#       N=3 T=16384 (N*HV 96, longest 136 chunks, share 63) 710.9 -> - / - / 414.3 / 411.4 / 611.2; N=4 T=32768
#       (128, 285, share 125) 1246.5 -> - / - / 825.2 / 824.0 / 906.0; parity varlen N=32 T=4096 K=128 (128,
#       9, share 2.4) 50.7 -> 38.1 / 38.4; N=64 T=8192 K=64 (256, 11, share 2.4) 45.5 -> 38.3 / 38.4; under
#       twice: N=64 T=6656 K=128 (256, 7, share 4.2) 51.7 -> 51.7 / 50.6.
# Where decay is weak, every warm-up reaches back to its sequence's start: no faster than the sequential walk.
WARM_UP_SEGMENT_CHUNKS = (4, 64)  # the least and the most chunks per segment
WARM_UP_MIN_SEGMENTS = 3  # of the longest walk
WARM_UP_PROGRAMS_PER_SM = 2


def warm_up_default(layout: ChunkLayout, HV: int, V: int, device: torch.device) -> int | None:
    """Chunks per warm-up segment by default (see WARM_UP_SEGMENT_CHUNKS), or None for the sequential walk:
    on a GPU, where the longest walk is more than twice as long as each of the walks' programs would walk with
    the chunks shared out evenly, two programs per SM (for equal walks: where the programs are fewer than the
    SMs), and makes WARM_UP_MIN_SEGMENTS segments or more. Within exp(chunk.WARM_UP_LOG_DECAY) of exact for keys
    of norm 1 or less (SegmentLayout)."""
    if device.type != "cuda":
        return None
    sms, longest = sm_count(device), triton.cdiv(layout.max_len, CHUNK)
    walked = layout.NT * HV * triton.cdiv(V, 64)  # chunks walked by all the programs (BV 64)
    if longest * sms <= walked:
        return None
    least, most = WARM_UP_SEGMENT_CHUNKS
    chunks = min(max(triton.cdiv(walked, WARM_UP_PROGRAMS_PER_SM * sms), least), most)
    return chunks if triton.cdiv(longest, chunks) >= WARM_UP_MIN_SEGMENTS else None


def plan_segments(layout: ChunkLayout, q: Tensor, V: int, HV: int, qk_l2norm: bool = False,
                  raw_gate: bool = False) -> int | None:
    """Chunks per warm-up segment by default, or None for the sequential walk: ``warm_up_default``'s, except where
    the warp-specialized kernel would walk them (``_specialized_segments``, the gates given). There the size whose
    segments, each but a sequence's first with one chunk of warm-up (strong decay), its programs (one a SM) take
    with the least makespan: from SPECIALIZED_MIN_SEGMENT_CHUNKS to SPECIALIZED_MAX_SEGMENT_CHUNKS (the smallest on
    a tie) where ``warm_up_default``'s are that long; else, on SPECIALIZED_MIN_WALKS sequence walks or more, from 2
    chunks (the largest on a tie), also where ``warm_up_default`` keeps whole sequences if that size cuts their
    makespan to SPECIALIZED_MAX_SPLIT_MAKESPAN of theirs, and one segment a sequence where they are shorter than
    SPECIALIZED_SHORT_WALK_CHUNKS and the kernel would walk them whole."""
    chunks = warm_up_default(layout, HV, V, q.device)
    if not _specialized_segments(layout, HV, chunks or 0, q, V, raw_gate, qk_l2norm):
        return chunks
    lengths = [triton.cdiv(end - start, CHUNK) for start, end in layout.spans]
    programs = sm_count(q.device)

    @functools.cache  # the chosen size's and the whole walks' are asked again below
    def makespan(size: int) -> int:
        return max(deal_longest_first(warm_up_loads(lengths, size) * HV, programs)[1])

    if chunks is not None and chunks >= SPECIALIZED_MIN_SEGMENT_CHUNKS:
        return min(range(SPECIALIZED_MIN_SEGMENT_CHUNKS, SPECIALIZED_MAX_SEGMENT_CHUNKS + 1), key=makespan)
    longest = max(lengths)  # many sequence walks (_specialized_segments) from here on
    size = min(range(2, max(min(longest, SPECIALIZED_MAX_SEGMENT_CHUNKS), 2) + 1), key=lambda s: (makespan(s), -s))
    if chunks is not None or makespan(size) <= SPECIALIZED_MAX_SPLIT_MAKESPAN * makespan(longest):
        return size
    short = longest < SPECIALIZED_SHORT_WALK_CHUNKS
    return longest if short and walk_default(layout, q, V, HV, qk_l2norm, raw_gate=raw_gate) == SPECIALIZED else None


def walk_default(layout: ChunkLayout, q: Tensor, V: int, HV: int, qk_l2norm: bool,
                 segments: SegmentLayout | None = None, raw_gate: bool = False) -> str:
    """Which walk runs by default, where the Gluon walks run (the output always fused in): over warm-up segments,
    SPECIALIZED where ``_specialized_segments`` says so (segments of SPECIALIZED_MIN_SEGMENT_CHUNKS or more, or
    SPECIALIZED_MIN_WALKS sequence walks or more, with the gates given), else "sm90_transposed"
    (chunk_walk_transposed_sm90); on whole sequences, "sm90_transposed" where its programs
    outnumber the SMs (or, on walks too short for warm-up segments, fill more than half of them)
    and the longest walk has SM90_TRANSPOSED_WALK_MIN_CHUNKS chunks, or "sm90" (chunk_walk_sm90) where its
    programs make one wave of two per SM that fills half the SMs or more and the longest walk has
    SM90_WALK_MIN_CHUNKS chunks; SPECIALIZED (the prep in the same kernel), before those two, on
    SPECIALIZED_MIN_WALKS or more walks that, dealt to one program a SM, fill them (SPECIALIZED_MIN_*), with the
    gates given (raw_gate False); else "triton"."""
    if chunk_walk_sm90.unsupported(q, V, qk_l2norm) is not None:
        return "triton"
    if segments is not None:
        if not segments.warm_up:
            return "triton"
        return SPECIALIZED if _specialized_segments(layout, HV, segments.chunks, q, V, raw_gate,
                                                     qk_l2norm) else "sm90_transposed"
    walks, sms, chunks = layout.N * HV, sm_count(q.device), triton.cdiv(layout.max_len, CHUNK)
    programs = walks * triton.cdiv(V, chunk_walk_transposed_sm90.BV)
    short = chunks < WARM_UP_MIN_SEGMENTS * WARM_UP_SEGMENT_CHUNKS[0]  # too short to cut into warm-up segments
    if walks >= SPECIALIZED_MIN_WALKS and chunks > 0 and chunk_specialized_sm90.unsupported(q, V, raw_gate,
                                                                                         qk_l2norm) is None:
        fill = _specialized_order(layout, HV, q.device).fill(sms)
        if layout.NT >= SPECIALIZED_MIN_FILL * layout.N * chunks:  # about equal walks
            if chunks <= 2 or fill >= SPECIALIZED_MIN_ROUND_FILL:
                return SPECIALIZED
        elif fill >= SPECIALIZED_MIN_UNEQUAL_FILL:
            return SPECIALIZED
    if chunks >= SM90_TRANSPOSED_WALK_MIN_CHUNKS and (programs > sms or (short and programs > sms // 2)):
        return "sm90_transposed"
    if sms // 2 < walks * triton.cdiv(V, chunk_walk_sm90.BV) <= 2 * sms and chunks >= SM90_WALK_MIN_CHUNKS:
        return "sm90"
    return "triton"


def plan_walk(layout: ChunkLayout, q: Tensor, V: int, HV: int, qk_l2norm: bool,
              segments: SegmentLayout | None = None, walk: str | None = None,
              fuse_output: bool | None = None, raw_gate: bool = False, prep: str | None = None) -> tuple[str, bool]:
    """(walk, fuse_output) of a call, the defaults filled in where None: the Gluon walk always computes the
    output in the walk, so an explicit fuse_output=False means the Triton walk by default and is an error
    with walk="sm90"; an explicit prep kernel keeps the default walk one apart from it (not SPECIALIZED: the
    Triton walk where that would run). Raises ValueError for a walk that cannot run the call."""
    if walk is None:
        walk = "triton" if fuse_output is False else walk_default(layout, q, V, HV, qk_l2norm, segments, raw_gate)
        if walk == SPECIALIZED and prep is not None:
            walk = "triton"
    if walk == SPECIALIZED:
        why = chunk_specialized_sm90.unsupported(q, V, raw_gate, qk_l2norm) or (
            "it walks whole sequences or warm-up segments" if segments is not None and not segments.warm_up else
            "it always computes the output in the walk" if fuse_output is False else None)
        if why:
            raise ValueError(f"walk={walk!r} cannot run this call: {why}")
        return walk, True
    if walk in GLUON_WALKS:
        module = GLUON_WALKS[walk]
        why = module.unsupported(q, V, qk_l2norm) or (
            ("it walks whole sequences or warm-up segments" if module.TAKES_WARM_UP_SEGMENTS else
             "it walks whole sequences (no segments)")
            if segments is not None and not (segments.warm_up and module.TAKES_WARM_UP_SEGMENTS) else
            "it always computes the output in the walk" if fuse_output is False else None)
        if why:
            raise ValueError(f"walk={walk!r} cannot run this call: {why}")
        return walk, True
    if walk != "triton":
        raise ValueError(f"walk must be one of {['triton', *GLUON_WALKS, SPECIALIZED]}, got {walk!r}")
    K = q.shape[-1]
    return walk, fuse_output_default(layout, HV, K, segments) if fuse_output is None else fuse_output


def chunk_fused_gdn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None = None,
    beta: Tensor | None = None,
    *,
    a: Tensor | None = None,
    b: Tensor | None = None,
    A_log: Tensor | None = None,
    dt_bias: Tensor | None = None,
    scale: float,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    layout: ChunkLayout | None = None,
    qk_l2norm: bool = False,
    out: Tensor | None = None,
    workspace: ChunkWorkspace | None = None,
    fuse_output: bool | None = None,
    segments: SegmentLayout | None = None,
    output_span: int | None = None,
    pipeline: PipelineLayout | None = None,
    walk: str | None = None,
    prep: str | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Chunked gated delta rule prefill in two or three launches; arguments and result as
    ``chunk.chunk_gdn``'s (a prebuilt workspace: ``ChunkWorkspace.allocate(..., stages=False,
    fuse_output=..., segments=...)``). fuse_output: compute the outputs in the state pass (no h, v_new);
    None: ``fuse_output_default(layout, HV, K, segments)``. segments (``SegmentLayout.build``):
    the chunk-parallel state pass instead of one walk over each sequence's chunks. output_span: chunks
    per output-pass block, 1 or 2 (the state is stored once per block; a workspace allocated with the
    same ``output_span``); None: ``output_span_default(layout, HV, K, segments)``; 1 with fuse_output.
    pipeline (``PipelineLayout.build`` of this layout): prep, walk and output pass (or the walk with the
    output fused in) group by group, overlapped on their own streams (a workspace allocated with
    ``pipeline=True``); never with segments. walk: "triton", or a Gluon walk for Hopper (the output fused in):
    "sm90" (chunk_walk_sm90, no segments) or "sm90_transposed" (chunk_walk_transposed_sm90, also over warm-up
    segments); or SPECIALIZED, the prep and the walk in one kernel (chunk_specialized_sm90: also over warm-up
    segments, no pipeline, prep None); None: the default (``plan_walk``). prep: "triton", or "sm90"
    for the Gluon prep kernel of chunk_prep_sm90 (Hopper; gates given, no in-kernel L2 norm); None: the default
    (``plan_prep``).
    """
    lay = ChunkLayout.build(q.shape[0], q.shape[1], cu_seqlens, q.device) if layout is None else layout
    HV, K, V = v.shape[2], q.shape[3], v.shape[3]
    walk, fuse = plan_walk(lay, q, V, HV, qk_l2norm, segments, walk, fuse_output, raw_gate=a is not None, prep=prep)
    prep = plan_prep(k, a is not None, qk_l2norm, prep, walk)
    span = 1 if fuse else output_span_default(lay, HV, K, segments) if output_span is None else output_span
    if pipeline is not None and (segments is not None or pipeline.spans != lay.spans):
        raise ValueError("a pipeline cuts this call's sequences into groups, without segments")
    if pipeline is not None and walk == SPECIALIZED:
        raise ValueError(f"a pipeline overlaps separate prep and walk kernels, which walk={SPECIALIZED!r} has not")
    x = _setup(q, k, v, g, beta, a, b, A_log, dt_bias, scale=scale, initial_state=initial_state,
               output_final_state=output_final_state, cu_seqlens=cu_seqlens, layout=lay, qk_l2norm=qk_l2norm,
               out=out, workspace=workspace, stages=False, fuse_output=fuse, segments=segments, output_span=span,
               pipeline=pipeline is not None)
    if pipeline is not None:
        _pipelined(x, pipeline, fuse, output_final_state, walk, prep)
    elif walk == SPECIALIZED:
        chunk_specialized_sm90.chunk_specialized(x.q, x.k, x.v, x.g, x.beta, x.out, x.h0,
                                                 x.ws.final_state if output_final_state else None,
                                                 _specialized_order(lay, HV, q.device, segments), x.scale,
                                                 warm_up=segments is not None)
    else:
        _prep(x, lay, prep)
        if walk in GLUON_WALKS:
            _walk_with_output(x, lay, x.h0, x.ws.final_state if output_final_state else None, walk, segments)
        else:
            _state_and_output(x, _state_kernel if fuse else _chunk_state_kernel, fuse_output=fuse,
                              output_final_state=output_final_state, segments=segments,
                              output_kernel=_output_kernel(span))
    return x.out, x.ws.final_state if output_final_state else None


def _output_kernel(span: int):
    """The tuned output pass for blocks of ``span`` chunks."""
    return _output_span2_kernel if span == 2 else _chunk_output_kernel


def describe(*, fuse_output: bool, output_span: int = 1, walk: str = "triton", prep: str = "triton") -> str:
    """The prep, state (and output) pass configs of the latest launch, for a result row's path."""
    if walk == SPECIALIZED:
        return chunk_specialized_sm90.describe()
    prep_str = chunk_prep_sm90.describe() if prep == "sm90" else f"prep[{_config_str(_chunk_prep_kernel)}]"
    if walk in GLUON_WALKS:
        return f"{prep_str}, {GLUON_WALKS[walk].describe()}"
    return f"{prep_str}, " + _describe(
        _state_kernel if fuse_output else None, fuse_output=fuse_output, output_kernel=_output_kernel(output_span),
        output_span=output_span)

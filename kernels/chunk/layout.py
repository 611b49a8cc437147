"""Where a batch's chunks sit, in what order the walks run, and the buffers of one problem size.

Built on the host once, outside any timed call: ``ChunkLayout`` (chunks of every sequence, padded or
varlen, as token ranges), ``WalkOrder`` (walks dealt to persistent programs), ``SegmentLayout`` (sequences
cut into warm-up segments), ``PipelineLayout`` (chunks in groups), ``ChunkWorkspace`` (every intermediate
buffer) and the tuner's size tiers.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from ..common.ints import cdiv

__all__ = ["CHUNK", "WARM_UP_LOG_DECAY", "WALK_ROW", "WALK_TAKES_H0", "WALK_STORES_HT", "WALK_WHOLE", "ChunkLayout",
           "WalkOrder",
           "SegmentLayout", "PipelineLayout", "ChunkWorkspace", "deal_longest_first", "warm_up_loads", "chunk_tier",
           "state_tier"]


CHUNK = 64  # tokens per chunk; the block inverse below is written for 4 x 16


# A warm-up segment (SegmentLayout) starts as many chunks back as their summed log decay needs to reach this.
# With unit-norm keys and beta in [0, 1] each token's transition exp(g) (I - beta k k^T) has norm <= exp(g),
# so the state it drops is scaled by at most exp(-20) ~ 2e-9 before it reaches the segment.
WARM_UP_LOG_DECAY = -20.0


# a WalkOrder row: walk, first token, first token output, end, flags
WALK_ROW = 5
WALK_TAKES_H0 = 1
WALK_STORES_HT = 2
WALK_WHOLE = 4  # beside warm-up segments: the whole sequence, walked where its head's decay is too slow for them


@dataclass(frozen=True)
class ChunkLayout:
    """Where every chunk of a padded or varlen batch sits; built on the host once, outside timed calls.

    A padded [B, T] batch is described like a varlen one (bounds b * T), so kernels have one path. A
    sequence is a token range [start, end) of the token-indexed buffers; ranges need not be adjacent
    and may be empty (a pipeline group takes a sub-range of each sequence of a batch).
    """

    N: int  # sequences
    NT: int  # chunks over all sequences
    max_len: int  # the longest sequence, in tokens
    tokens: int  # B * T: the token-indexed buffers' length, which every sequence bound stays within
    spans: tuple[tuple[int, int], ...]  # each sequence's [start, end) tokens, on the host
    seq_bounds: Tensor  # [N, 2] int64: the same on the device, which the kernels read
    chunk_indices: Tensor  # [NT, 2] int32: (sequence, chunk within it), sequence-major
    chunk_offsets: Tensor  # [N + 1] int32: global index of each sequence's first chunk
    # the same for pairs of chunks (a sequence's last pair may hold one), the output pass's blocks at SPAN 2
    NP: int
    pair_indices: Tensor  # [NP, 2] int32
    pair_offsets: Tensor  # [N + 1] int32
    _walk_orders: dict[tuple[int, int], WalkOrder] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(cls, B: int, T: int, cu_seqlens: Tensor | None, device: torch.device | str) -> ChunkLayout:
        if cu_seqlens is None:
            bounds = [b * T for b in range(B + 1)]
        else:
            if B != 1 or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
                raise ValueError("varlen needs B == 1 and cu_seqlens [N + 1]")
            bounds = cu_seqlens.tolist()  # the one host sync: layouts are built before timing
        if bounds[0] != 0 or bounds[-1] != B * T or any(e < s for s, e in zip(bounds, bounds[1:])):
            raise ValueError(f"cu_seqlens must start at 0, be non-decreasing and end at T={T}, got {bounds}")
        return cls.from_spans(list(zip(bounds, bounds[1:])), B * T, device)

    @classmethod
    def from_spans(cls, spans: list[tuple[int, int]], tokens: int, device: torch.device | str) -> ChunkLayout:
        """The layout of the sequences [start, end) of token-indexed buffers of ``tokens`` rows (``build``
        checks that they cover a batch; a pipeline group covers part of one)."""
        if any(not 0 <= s <= e <= tokens for s, e in spans):
            raise ValueError(f"sequence spans must lie within the {tokens} tokens, got {spans}")
        lens = [e - s for s, e in spans]

        def blocks(size: int) -> tuple[int, Tensor, Tensor]:
            counts = [cdiv(n, size) for n in lens]
            offsets = [0]
            for c in counts:
                offsets.append(offsets[-1] + c)
            indices = [(n, c) for n, count in enumerate(counts) for c in range(count)]
            return (offsets[-1], torch.tensor(indices, dtype=torch.int32, device=device).reshape(-1, 2),
                    torch.tensor(offsets, dtype=torch.int32, device=device))

        (NT, chunk_indices, chunk_offsets), (NP, pair_indices, pair_offsets) = blocks(CHUNK), blocks(2 * CHUNK)
        spans = tuple((int(s), int(e)) for s, e in spans)
        return cls(N=len(lens), NT=NT, max_len=max(lens), tokens=tokens, spans=spans,
                   seq_bounds=torch.tensor(spans, dtype=torch.int64, device=device).reshape(-1, 2),
                   chunk_indices=chunk_indices, chunk_offsets=chunk_offsets,
                   NP=NP, pair_indices=pair_indices, pair_offsets=pair_offsets)

    def walk_order(self, heads: int, programs: int) -> WalkOrder:
        """The N * heads walks (sequence n, head h: walk n * heads + h) dealt to ``programs`` persistent programs
        (``WalkOrder.deal``); built on the host on first use and kept, so that timed calls only read it."""
        key = heads, programs
        if key not in self._walk_orders:
            rows = [(n * heads + h, start, start, end, WALK_TAKES_H0 | WALK_STORES_HT)
                    for n, (start, end) in enumerate(self.spans) for h in range(heads)]
            loads = [cdiv(end - start, CHUNK) for _, start, _, end, _ in rows]
            self._walk_orders[key] = WalkOrder.deal(rows, loads, programs, self.seq_bounds.device)
        return self._walk_orders[key]

    def blocks(self, span: int) -> tuple[int, Tensor, Tensor]:
        """(count, [count, 2] indices, [N + 1] offsets) of the blocks of ``span`` chunks (1 or 2)."""
        if span not in (1, 2):
            raise ValueError(f"output blocks span 1 or 2 chunks, got {span}")
        return (self.NT, self.chunk_indices, self.chunk_offsets) if span == 1 else \
            (self.NP, self.pair_indices, self.pair_offsets)


def deal_longest_first(chunks: list[int], programs: int) -> tuple[list[list[int]], list[int]]:
    """Walks of these many chunks dealt longest first, each to the program with the fewest chunks so far (the
    lowest-numbered on a tie): each program's walks in its order, and its chunks in all."""
    if programs < 1:
        raise ValueError(f"walks need at least one program, got {programs}")
    dealt: list[list[int]] = [[] for _ in range(programs)]
    loads = [(0, p) for p in range(programs)]  # a heap of (chunks, program)
    for walk in sorted(range(len(chunks)), key=lambda w: -chunks[w]):
        load, p = heapq.heappop(loads)
        dealt[p].append(walk)
        heapq.heappush(loads, (load + chunks[walk], p))
    program_chunks = [0] * programs
    for load, p in loads:
        program_chunks[p] = load
    return dealt, program_chunks


def warm_up_loads(lengths: list[int], chunks: int) -> list[int]:
    """The chunks each warm-up segment of ``chunks`` chunks, of sequences of ``lengths`` chunks, is expected to
    walk: its own, and one of warm-up (strong decay) but on its sequence's first; in ``SegmentLayout.build``'s
    order (an empty sequence keeps one empty segment)."""
    return [min(chunks, n - first) + (first > 0) for n in lengths for first in range(0, n, chunks) or [0]]


@dataclass(frozen=True)
class WalkOrder:
    """Walks dealt to persistent programs that each take theirs in turn: program p walks counts[p] walks, its
    i-th in row i * programs + p of ``walks``, program_chunks[p] chunks in all (as dealt). A row holds its walk's
    bounds, so that a program reads them in one round trip at the walk's start (a walk index, then its sequence's
    bounds, took two, which cost 3-4% on walks of one to four chunks, H200). Rows go round the programs so that a
    program finds its first walk's without reading its count first.

    A row (WALK_ROW int32): the walk's index (n * heads + h: sequence n, head h), its first token, the first token it
    outputs, its end, and flags (WALK_TAKES_H0: it starts from its sequence's h0; WALK_STORES_HT: it ends with its
    final state). A whole sequence outputs from its first token and has both flags. A warm-up segment
    (``SegmentLayout.walks``) holds its sequence's start as its first token and WALK_STORES_HT only where it ends its
    sequence: its warm-up starts in between, where the gates' decay runs out, which the kernel that walks it finds
    (``sm90_specialized``), and it starts from h0 where that is the sequence's start."""

    programs: int
    makespan: int  # chunks of the most loaded program
    chunks: int  # over all walks, the outputs' (no warm-ups)
    counts: Tensor  # [programs] int32: walks a program
    walks: Tensor  # [rounds * programs, WALK_ROW] int32 ((-1, 0, 0, 0, 0): none)
    program_chunks: Tensor  # [programs] int32
    empty: Tensor  # [E] int64: the walks of no chunk left out (``deal``'s drop_empty), whose final state is their h0
    first_rows: tuple[tuple[int, int, int, int, int], ...]  # each program's first row, on the host
    _regular: dict[int, tuple[int, int]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def deal(cls, rows: list[tuple[int, int, int, int, int]], loads: list[int], programs: int,
             device: torch.device | str, drop_empty: bool = False,
             lead: list[tuple[int, int, int, int, int]] = ()) -> WalkOrder:
        """The walks of ``rows`` (a row each) longest first by ``loads`` (the chunks each is expected to walk), each
        to the program with the fewest chunks so far, the lowest-numbered on a tie: equal walks go round the programs
        in order, and the longest of unequal ones no longer meet on one program, as in order they may (parity's
        varlen N=64 T=6656: 9 chunks on one program where 7 suffice). drop_empty: the walks of no token are dealt to
        no program but listed in ``empty``, for a kernel whose programs learn a walk's bounds with its first chunk
        (``sm90_specialized`` over warm-up segments), which such a walk never has. lead: walks each program takes
        first, in turn round the programs, outside the balance (``SegmentLayout.walks``' whole sequences, which run
        only where the segments do not)."""
        empty = [row[0] for row in rows if drop_empty and row[1] == row[3]]
        if empty:
            loads = [load for row, load in zip(rows, loads) if row[1] != row[3]]
            rows = [row for row in rows if row[1] != row[3]]
        dealt, program_chunks = deal_longest_first(loads, programs)
        for i in range(len(lead)):
            dealt[i % programs].insert(i // programs, len(rows) + i)
        rows = [*rows, *lead]
        rounds = max(1, *(len(mine) for mine in dealt))  # a row at least: a program reads its first before its count
        table = [rows[mine[i]] if i < len(mine) else (-1, 0, 0, 0, 0) for i in range(rounds) for mine in dealt]
        return cls(programs=programs, makespan=max(program_chunks),
                   chunks=sum(cdiv(end - first, CHUNK) for _, _, first, end, flags in rows
                              if not flags & WALK_WHOLE),
                   counts=torch.tensor([len(mine) for mine in dealt], dtype=torch.int32, device=device),
                   walks=torch.tensor(table, dtype=torch.int32, device=device).reshape(-1, WALK_ROW),
                   program_chunks=torch.tensor(program_chunks, dtype=torch.int32, device=device),
                   empty=torch.tensor(empty, dtype=torch.int64, device=device), first_rows=tuple(table[:programs]))

    def regular(self, heads: int) -> tuple[int, int]:
        """(T, flags) where every program p's first row is walk p over T tokens from T (p // heads), with the flags
        of program 0's (a padded batch's whole sequences, or one segment each, dealt in order: a kernel can compute
        that row where it would read it, a round trip sooner at the launch); (0, 0) where not. Kept per heads."""
        if heads not in self._regular:
            _, start, _, end, flags = self.first_rows[0]
            period = end - start
            regular = period > 0 and all(row == (p, period * (p // heads), period * (p // heads),
                                                 period * (p // heads + 1), flags)
                                         for p, row in enumerate(self.first_rows))
            self._regular[heads] = (period, flags) if regular else (0, 0)
        return self._regular[heads]

    def fill(self, slots: int) -> float:
        """The share of ``slots`` programs' time over the makespan that walks take (1: none idle)."""
        return self.chunks / (slots * self.makespan) if self.makespan else 1.0


@dataclass(frozen=True)
class SegmentLayout:
    """The sequences of a ChunkLayout cut into warm-up segments of at most ``chunks`` chunks, walked all at once.

    Each segment walks, state only, the chunks before it back to where their decay reaches
    exp(WARM_UP_LOG_DECAY) (or its sequence's start, from h0), then its own chunks with the outputs. The state
    this leaves out is scaled by at most exp(WARM_UP_LOG_DECAY) (unit-norm keys); where decay is strong one
    chunk suffices (docs/decisions/0018-warm-up-segments.md). With ``whole_walks``, where a (sequence, value head)'s
    decay is too slow for some segment's warm-up to end within ``chunks`` chunks, its segments are skipped and its
    whole sequence is walked instead: the kernels decide on the device, from the gates (``warm_up.mark_slow_walks``),
    so a warm-up costs at most one segment's length and the call no host sync; without, a warm-up reaches back as far
    as the decay needs, to the sequence's start where there is none (docs/decisions/0022-slow-decay-walks.md).
    Built on the host once, outside any timed call.
    """

    chunks: int  # chunks per segment
    layout: ChunkLayout  # the segments as sequences: same tokens, same global chunk numbering
    seg_offsets: Tensor  # [N + 1] int32: each sequence's first segment
    parent: Tensor  # [segments] int32: each segment's sequence
    parent_bounds: Tensor  # the sequences' ChunkLayout.seq_bounds
    sequences: tuple[int, ...]  # parent's, on the host
    sequence_spans: tuple[tuple[int, int], ...]  # parent_bounds', on the host
    whole_walks: bool = False  # the walks too slow for the segments walked whole beside them
    _walks: dict[tuple[int, int, bool], WalkOrder] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(cls, layout: ChunkLayout, chunks: int, whole_walks: bool = False) -> SegmentLayout:
        if chunks < 1:
            raise ValueError(f"a segment needs at least one chunk, got {chunks}")
        span, device = chunks * CHUNK, layout.seq_bounds.device
        seg_spans, offsets = [], [0]
        for start, end in layout.spans:
            # an empty sequence keeps one empty segment: the program that stores its final state
            seg_spans += [(t, min(t + span, end)) for t in range(start, end, span)] or [(start, end)]
            offsets.append(len(seg_spans))
        sequences = [n for n in range(layout.N) for _ in range(offsets[n + 1] - offsets[n])]
        return cls(chunks=chunks, layout=ChunkLayout.from_spans(seg_spans, layout.tokens, device),
                   seg_offsets=torch.tensor(offsets, dtype=torch.int32, device=device),
                   parent=torch.tensor(sequences, dtype=torch.int32, device=device), parent_bounds=layout.seq_bounds,
                   sequences=tuple(sequences), sequence_spans=layout.spans, whole_walks=whole_walks)

    def with_whole_walks(self) -> SegmentLayout:
        """These segments beside whole walks (``whole_walks``), their walk orders made afresh."""
        return replace(self, whole_walks=True, _walks={})

    def walks(self, heads: int, programs: int, whole: bool = True) -> WalkOrder:
        """These warm-up segments as walks (``WalkOrder``'s rows of warm-up segments; segment s, head h: its sequence
        n's walk n * heads + h) dealt to ``programs`` persistent programs, each as the chunks it is expected to walk
        (``warm_up_loads``: dealt as they stand, the segments of 3 chunks of parity's varlen N=64 T=6656 met on
        programs of 7 chunks, where 5 suffice), and with ``whole_walks`` the whole walks (WALK_WHOLE) of each sequence
        cut in two or more, one a program, first, unless ``whole`` is False (another kernel walks them); built on
        first use and kept."""
        key = heads, programs, whole
        if key not in self._walks:
            rows = []
            for (first, end), n in zip(self.layout.spans, self.sequences):
                start, last = self.sequence_spans[n]
                rows += [(n * heads + h, start, first, end, WALK_STORES_HT if end == last else 0) for h in range(heads)]
            loads = warm_up_loads([cdiv(end - start, CHUNK) for start, end in self.sequence_spans], self.chunks)
            whole = [(n * heads + h, start, start, end, WALK_STORES_HT | WALK_WHOLE)
                     for n, (start, end) in enumerate(self.sequence_spans)
                     if whole and self.whole_walks and end - start > self.chunks * CHUNK
                     for h in range(heads)]  # a sequence of one segment needs no warm-up
            self._walks[key] = WalkOrder.deal(rows, [load for load in loads for _ in range(heads)], programs,
                                              self.parent.device, drop_empty=True, lead=whole)
        return self._walks[key]


@dataclass(frozen=True)
class PipelineLayout:
    """A batch's chunks in groups, for a pipelined call: group g takes chunks [g * chunks, (g + 1) * chunks)
    of every sequence (an even number, so that no pair of the output pass straddles two groups; empty
    for sequences already done). Group g's walk (the state pass, on a high-priority stream) waits only
    for group g's prep kernel, which ran beside group g - 1's walk, and group g's output pass (unless the
    output is fused into the walk) runs as soon as its walk is done, beside the next walk. A walk hands
    each sequence's state to the next group's through an fp32 buffer, the values it kept in registers,
    so the results are those of one walk. Built on the host once, outside timed calls."""

    chunks: int  # chunks per group
    spans: tuple[tuple[int, int], ...]  # the batch's sequences, as in its ChunkLayout
    groups: tuple[ChunkLayout, ...]

    @classmethod
    def build(cls, layout: ChunkLayout, chunks: int) -> PipelineLayout:
        if chunks < 2 or chunks % 2:
            raise ValueError(f"a pipeline group takes an even number of chunks, got {chunks}")
        if layout.max_len == 0:
            raise ValueError("nothing to pipeline: every sequence is empty")
        span, device = chunks * CHUNK, layout.seq_bounds.device
        return cls(chunks=chunks, spans=layout.spans, groups=tuple(
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


@dataclass
class ChunkWorkspace:
    """Every intermediate of one problem size, allocated once so that a timed call allocates nothing.

    Token-indexed buffers are flat over the B * T tokens. Tests read the intermediates from here.
    """

    gc: Tensor  # [B*T, HV] fp32, chunk-local cumulative log decay
    A_diag: Tensor  # [NT, HV, C, 16] fp32 scratch of the solve: A's 16 x 16 diagonal blocks, transposed
    # [B*T, HV, C] input dtype, each chunk's rows of (I + A)^-1 (multi-kernel) or of (I + A)^-1 diag(beta)
    # (the fused pipeline, whose state pass takes v_new from it and never stores W or U)
    Ai: Tensor
    W: Tensor | None  # [B*T, HV, K] input dtype (multi-kernel)
    U: Tensor | None  # [B*T, HV, V] input dtype (multi-kernel)
    beta: Tensor | None  # [B*T, HV] fp32 sigmoid(b): raw gating in the multi-kernel pipeline
    v_new: Tensor | None  # [B*T, HV, V] input dtype (None: output fused into the state pass)
    h: Tensor | None  # [NT or NP, HV, K, V] input dtype, the state entering each output block (None likewise)
    final_state: Tensor | None  # [N, HV, K, V] fp32
    # the fused pipeline's groups (PipelineLayout): the state one group hands the next, two in turn, fp32
    handoff: Tensor | None = None  # [2, N, HV, K, V]
    # beside warm-up segments: 1 for each segment and value head whose warm-up would be too long (SegmentLayout)
    slow_marks: Tensor | None = None  # [segments, HV] int32

    @classmethod
    def allocate(cls, layout: ChunkLayout, q: Tensor, v: Tensor, *, stages: bool, raw_gate: bool,
                 fuse_output: bool, final_state: bool, segments: SegmentLayout | None = None,
                 output_span: int = 1, pipeline: bool = False) -> ChunkWorkspace:
        """stages: the multi-kernel pipeline's W and U (and beta for raw gating) buffers too; segments: the
        warm-up segments the walk takes, if any; output_span: chunks per output block (h holds one state per block);
        pipeline: the pipeline groups' hand-off states."""
        B, T, _, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        BT, dt, dev = B * T, q.dtype, q.device

        def empty(*shape, dtype=dt):
            return torch.empty(*shape, dtype=dtype, device=dev)

        return cls(
            gc=empty(BT, HV, dtype=torch.float32), A_diag=empty(layout.NT, HV, CHUNK, 16, dtype=torch.float32),
            Ai=empty(BT, HV, CHUNK), W=empty(BT, HV, K) if stages else None, U=empty(BT, HV, V) if stages else None,
            beta=empty(BT, HV, dtype=torch.float32) if stages and raw_gate else None,
            v_new=None if fuse_output else empty(BT, HV, V),
            h=None if fuse_output else empty(layout.blocks(output_span)[0], HV, K, V),
            final_state=empty(layout.N, HV, K, V, dtype=torch.float32) if final_state else None,
            handoff=empty(2, layout.N, HV, K, V, dtype=torch.float32) if pipeline else None,
            slow_marks=empty(segments.layout.N, HV, dtype=torch.int32) if segments and segments.whole_walks else None,
        )


def chunk_tier(NT: int, HV: int) -> int:
    """Autotuner key of the chunk-parallel kernels (prep, output): 0 below 128 (chunk, value head)
    pairs, 1 below 2048, 2 above. Without it a kernel was tuned once per head dim, on whichever case
    came first: parity's one-chunk case (timings a config cannot be told apart by) picked 8 warps for
    the output pass, which then made parity's larger K = 64 cases 1.2-1.3x slower (H100)."""
    pairs = NT * HV
    return 0 if pairs < 128 else 1 if pairs < 2048 else 2


def state_tier(N: int, HV: int, V: int, max_len: int) -> int:
    """Autotuner key of the state pass: its parallelism in walks of 128 value columns (N * HV * V /
    128), 0 below 64 (a long single sequence: too few programs to fill the GPU, narrow V-blocks win),
    1 below 512, 2 above; plus 3 for walks of 8 chunks or more. Without the walk length, parity's
    one-chunk case (1 pair) tuned the pass for its B=4 T=2048 HV=8 case (32 pairs, 32 chunks each):
    110 us instead of 84 of kernels on an H100. Counted in (sequence, head) pairs instead of columns,
    V = 64 cases got half the programs of V = 128 ones at the same tier: parity's varlen N=16 T=8192
    HV=4 D=64 (64 pairs) lost BV 16, whole call 57.7 us at BV 32 forced vs 53.9 at BV 16 (H100)."""
    walks = N * HV * V / 128
    return (0 if walks < 64 else 1 if walks < 512 else 2) + 3 * (max_len >= 8 * CHUNK)

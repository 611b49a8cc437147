"""The dispatch decisions of a chunked call, made on the host from the problem's layout.

Which prep kernel and which walk run, whether the output folds into the walk, how many chunks an output
block spans, whether the walks are cut into warm-up segments, and whether the call is pipelined. Each
threshold has one line of why and a decision record under docs/decisions/ with the measurements.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from ..common.ints import cdiv
from .layout import (CHUNK, ChunkLayout, ChunkWorkspace, PipelineLayout, SegmentLayout, WalkOrder, deal_longest_first,
                     warm_up_loads)
from .sm90 import GLUON_WALKS, SPECIALIZED
from .sm90 import prep as sm90_prep
from .sm90 import specialized as sm90_specialized
from .sm90 import walk as sm90_walk
from .sm90 import walk_transposed as sm90_walk_transposed
from .sm90.gluon_hopper import sm_count


# The output folds into the walk with walks enough to fill the GPU and sequences of about equal length or
# short: the fused walk recomputes Q K^T per V-block and has no parallelism over chunks
# (docs/decisions/0011-fuse-output.md).
FUSE_OUTPUT_MIN_HEADS = 64  # (sequence, value head) pairs at K >= FUSE_OUTPUT_WIDE_K
FUSE_OUTPUT_MIN_HEADS_NARROW = 128  # below it
FUSE_OUTPUT_WIDE_K = 128
FUSE_OUTPUT_MAX_IMBALANCE = 1.25  # longest sequence / mean length, or:
FUSE_OUTPUT_MAX_UNEQUAL_LEN = 512  # tokens of the longest sequence


# Output blocks of two chunks halve h's bytes on large problems and cost 1-20% on small ones
# (docs/decisions/0012-output-span.md).
OUTPUT_SPAN2_MIN_CHUNK_HEADS = 2048  # NT * HV
OUTPUT_SPAN2_MIN_K = 128


# Pipelined calls keep the GPU busy beside a long walk whose output pass runs on its own; groups of a quarter
# of the longest walk, 32 to 128 chunks (docs/decisions/0015-pipeline.md).
PIPELINE_MIN_CHUNKS = 128  # of the one sequence
PIPELINE_MIN_CHUNKS_SEVERAL = 256  # of the longest of several
PIPELINE_MIN_CHUNK_HEADS = 4096  # NT * HV
PIPELINE_GROUP_CHUNKS = (32, 128)  # the least and the most chunks per group


# The Gluon walk "sm90" pipelined from walks this long, in groups of an eighth of them (0015).
SM90_PIPELINE_MIN_CHUNKS = 512


# The Gluon walks issue a chunk's independent products together, where Triton waits for each: "sm90" where
# its programs make one wave of two per SM filling half the SMs or more, "sm90_transposed" where its programs
# outnumber the SMs; long walks load their tiles further ahead (docs/decisions/0016-gluon-walks.md).
SM90_WALK_MIN_CHUNKS = 8
SM90_TRANSPOSED_WALK_MIN_CHUNKS = 4
SM90_LONG_WALK_MIN_CHUNKS = 64


# The warp-specialized kernel overlaps one walk's prep with another's walk, so it wins where its walks,
# dealt longest first to one program a SM, keep the SMs busy, and on walks of one chunk, one launch where the
# others take two (docs/decisions/0017-specialized-kernel.md).
SPECIALIZED_MIN_WALKS = 128
SPECIALIZED_MIN_ROUND_FILL = 0.9  # measured: 0.97 and 0.73; between them, not
SPECIALIZED_MIN_FILL = 0.75  # measured: 1 (padded) and 0.31; between them, not
SPECIALIZED_MIN_UNEQUAL_FILL = 0.5  # measured: 0.60 and 0.44; between them, not


# It walks warm-up segments this long or longer, cut to the size of the least makespan up to the maximum;
# on many sequence walks, shorter segments where they cut the makespan, and short walks as one segment each.
SPECIALIZED_MIN_SEGMENT_CHUNKS = 16
SPECIALIZED_MAX_SEGMENT_CHUNKS = 256
SPECIALIZED_SHORT_WALK_CHUNKS = 16
SPECIALIZED_MAX_SPLIT_MAKESPAN = 0.9


# Warm-up segments where the walks leave SMs idle for most of the longest walk: about two programs per SM
# in all, where the longest walk makes WARM_UP_MIN_SEGMENTS or more (docs/decisions/0018-warm-up-segments.md).
WARM_UP_SEGMENT_CHUNKS = (4, 64)  # the least and the most chunks per segment
WARM_UP_MIN_SEGMENTS = 3  # of the longest walk
WARM_UP_PROGRAMS_PER_SM = 2


# Beside warm-up segments, the walks whose decay is too slow for them walked whole (SegmentLayout.whole_walks) where
# the longest walk is this long: there a weak decay made warm-ups cost 6-33x, short walks paid the marks' launches
# instead; beside the Triton and transposed walks, only where the segments' programs are more than the GPU runs at
# once (docs/decisions/0022-slow-decay-walks.md).
WHOLE_WALKS_MIN_CHUNKS = 64


# Sequences this short run token by token (the recurrent kernel, ``RECURRENT``): its time grows with the tokens
# of the longest sequence from a smaller fixed cost than a chunk's prep and walk, and with the (sequence, value
# head) pairs once they outnumber what the GPU runs at once (docs/decisions/0024-tiny-prefill.md).
RECURRENT_MAX_TOKENS = 8
# ... and only where sequences x value heads x the longest sequence's tokens stay within this many steps, unless
# every sequence has one token: one step then costs less than a chunk's prep and walk at any batch (0024)
RECURRENT_MAX_STEPS = 512

# walk=RECURRENT: no chunks; the whole call is one launch of the recurrent kernel (gdnbench_kernels.recurrent)
RECURRENT = "recurrent"

# the walks a plan's whole_walk may name: "sm90" walks a chunk in about 1.9 us where the warp-specialized kernel,
# its prep beside it on the SM, takes 3.0 (docs/decisions/0022-slow-decay-walks.md)
WHOLE_WALKS = ("sm90",)


def recurrent_pays(layout: ChunkLayout, HV: int) -> bool:
    """Whether the recurrent kernel beats the chunks on this call: every sequence has one token, or the longest
    has RECURRENT_MAX_TOKENS tokens or fewer and its sequences x value heads x that length is RECURRENT_MAX_STEPS
    or fewer."""
    if layout.max_len == 1:
        return True
    return 0 < layout.max_len <= RECURRENT_MAX_TOKENS and layout.N * HV * layout.max_len <= RECURRENT_MAX_STEPS


def whole_walks_pay(layout: ChunkLayout, segment_chunks: int, HV: int, V: int, specialized: bool,
                    device: torch.device) -> bool:
    """Whether the walks too slow for warm-up segments of ``segment_chunks`` chunks are walked whole beside them
    (``SegmentLayout.whole_walks``): where the longest walk has WHOLE_WALKS_MIN_CHUNKS chunks or more and, for the
    walks other than SPECIALIZED (``specialized``) on a GPU, the segments' programs (WARM_UP_PROGRAMS_PER_SM a SM of
    64 value columns each) are more than it runs at once: where it runs them all at once, the longest warm-up ends
    about when the whole walk that would replace it would, and the marks and the whole walks' launch cost more
    (0022). The warp-specialized kernel walks whole walks faster than as long warm-ups even then (0022)."""
    if cdiv(layout.max_len, CHUNK) < WHOLE_WALKS_MIN_CHUNKS:
        return False
    if specialized or device.type != "cuda":  # on a CPU, the interpreter: no GPU to fill
        return True
    programs = sum(max(cdiv(end - start, segment_chunks * CHUNK), 1) for start, end in layout.spans) * HV * cdiv(V, 64)
    return programs > WARM_UP_PROGRAMS_PER_SM * sm_count(device)


def plan_prep(k: Tensor, raw_gate: bool, qk_l2norm: bool, prep: str | None = None, walk: str = "triton") -> str:
    """Which prep kernel a call runs: "sm90" (sm90_prep, Gluon) where it can, else "triton" (None: the
    default); raises ValueError for "sm90" where it cannot. With walk=SPECIALIZED or RECURRENT the walk's own
    kernel does the prep: the walk's name (prep None or that name)."""
    if walk in (SPECIALIZED, RECURRENT):
        if prep not in (None, walk):
            raise ValueError(f"walk={walk!r} computes the prep in its own kernel, got prep={prep!r}")
        return walk
    why = sm90_prep.unsupported(k, raw_gate, qk_l2norm)
    if prep is None:
        return "triton" if why else "sm90"
    if prep not in ("triton", "sm90"):
        raise ValueError(f"prep must be 'triton' or 'sm90', got {prep!r}")
    if prep == "sm90" and why:
        raise ValueError(f"prep='sm90' cannot run this call: {why}")
    return prep


def pipeline_default(layout: ChunkLayout, HV: int, fuse_output: bool, segments: SegmentLayout | None = None,
                     walk: str = "triton") -> int | None:
    """Chunks per pipeline group by default (see PIPELINE_MIN_CHUNKS and SM90_PIPELINE_MIN_CHUNKS), or None
    for one call: for long sequences whose output pass runs on its own, or whose walk is the Gluon one."""
    chunks = cdiv(layout.max_len, CHUNK)  # the longest walk
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
    sequences of about equal length or short (see FUSE_OUTPUT_MIN_HEADS); warm-up segments always fold it in
    (their warm-up chunks belong to the segment before, whose entering states are never stored)."""
    if segments is not None:
        return True
    lay = layout
    if lay.max_len <= CHUNK:  # one chunk a walk: nothing sequential to wait for, one launch fewer
        return True
    min_heads = FUSE_OUTPUT_MIN_HEADS if K >= FUSE_OUTPUT_WIDE_K else FUSE_OUTPUT_MIN_HEADS_NARROW
    return lay.N * HV >= min_heads and (lay.max_len * lay.N <= FUSE_OUTPUT_MAX_IMBALANCE * lay.tokens
                                        or lay.max_len <= FUSE_OUTPUT_MAX_UNEQUAL_LEN)


def output_span_default(layout: ChunkLayout, HV: int, K: int, segments: SegmentLayout | None = None) -> int:
    """Chunks per output-pass block by default: 2 for large problems at K >= 128 (where the output pass
    runs at all, see OUTPUT_SPAN2_CANDIDATES), else 1; 1 over warm-up segments."""
    large = layout.NT * HV >= OUTPUT_SPAN2_MIN_CHUNK_HEADS and K >= OUTPUT_SPAN2_MIN_K
    return 2 if large and segments is None else 1


def specialized_order(layout: ChunkLayout, HV: int, device: torch.device,
                      segments: SegmentLayout | None = None, whole: bool = True) -> WalkOrder:
    """The walks of walk=SPECIALIZED dealt to its programs, one per SM at most: whole sequences, or the warm-up
    segments of ``segments`` (whose warm-up starts the kernel finds) and, unless ``whole`` is False (a plan's
    ``whole_walk`` walks them), the whole walks beside them."""
    if segments is None:
        return layout.walk_order(HV, _specialized_programs(layout, HV, device))
    return segments.walks(HV, _specialized_programs(segments.layout, HV, device), whole)


def _specialized_segments(layout: ChunkLayout, HV: int, chunks: int, q: Tensor, V: int, raw_gate: bool,
                          qk_l2norm: bool) -> bool:
    """Whether warm-up segments of ``chunks`` chunks, of the sequences of ``layout``, go to walk=SPECIALIZED by
    default: where they are SPECIALIZED_MIN_SEGMENT_CHUNKS long, or the sequences' walks SPECIALIZED_MIN_WALKS."""
    return (chunks >= SPECIALIZED_MIN_SEGMENT_CHUNKS or layout.N * HV >= SPECIALIZED_MIN_WALKS) and \
        sm90_specialized.unsupported(q, V, raw_gate, qk_l2norm) is None


def _specialized_programs(layout: ChunkLayout, HV: int, device: torch.device) -> int:
    """walk=SPECIALIZED's programs for the walks of ``layout``: one per SM at most."""
    return max(min(layout.N * HV, sm_count(device)), 1)


def warm_up_default(layout: ChunkLayout, HV: int, V: int, device: torch.device) -> int | None:
    """Chunks per warm-up segment by default (see WARM_UP_SEGMENT_CHUNKS), or None for the sequential walk:
    on a GPU, where the longest walk is more than twice as long as each of the walks' programs would walk with
    the chunks shared out evenly, two programs per SM (for equal walks: where the programs are fewer than the
    SMs), and makes WARM_UP_MIN_SEGMENTS segments or more. Within exp(chunk.WARM_UP_LOG_DECAY) of exact for keys
    of norm 1 or less (SegmentLayout)."""
    if device.type != "cuda":
        return None
    sms, longest = sm_count(device), cdiv(layout.max_len, CHUNK)
    walked = layout.NT * HV * cdiv(V, 64)  # chunks walked by all the programs (BV 64)
    if longest * sms <= walked:
        return None
    least, most = WARM_UP_SEGMENT_CHUNKS
    chunks = min(max(cdiv(walked, WARM_UP_PROGRAMS_PER_SM * sms), least), most)
    return chunks if cdiv(longest, chunks) >= WARM_UP_MIN_SEGMENTS else None


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
    lengths = [cdiv(end - start, CHUNK) for start, end in layout.spans]
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
    (sm90_walk_transposed); on whole sequences, "sm90_transposed" where its programs
    outnumber the SMs (or, on walks too short for warm-up segments, fill more than half of them)
    and the longest walk has SM90_TRANSPOSED_WALK_MIN_CHUNKS chunks, or "sm90" (sm90_walk) where its
    programs make one wave of two per SM that fills half the SMs or more and the longest walk has
    SM90_WALK_MIN_CHUNKS chunks; SPECIALIZED (the prep in the same kernel), before those two, on
    SPECIALIZED_MIN_WALKS or more walks that, dealt to one program a SM, fill them (SPECIALIZED_MIN_*), or on walks
    of one chunk however few, with the gates given (raw_gate False); else "triton"."""
    if sm90_walk.unsupported(q, V, qk_l2norm) is not None:
        return "triton"
    if segments is not None:
        return SPECIALIZED if _specialized_segments(layout, HV, segments.chunks, q, V, raw_gate,
                                                     qk_l2norm) else "sm90_transposed"
    walks, sms, chunks = layout.N * HV, sm_count(q.device), cdiv(layout.max_len, CHUNK)
    programs = walks * cdiv(V, sm90_walk_transposed.BV)
    short = chunks < WARM_UP_MIN_SEGMENTS * WARM_UP_SEGMENT_CHUNKS[0]  # too short to cut into warm-up segments
    if (walks >= SPECIALIZED_MIN_WALKS or chunks == 1) and chunks > 0 and sm90_specialized.unsupported(
            q, V, raw_gate, qk_l2norm) is None:
        fill = specialized_order(layout, HV, q.device).fill(sms)
        if layout.NT >= SPECIALIZED_MIN_FILL * layout.N * chunks:  # about equal walks
            if chunks <= 2 or fill >= SPECIALIZED_MIN_ROUND_FILL:
                return SPECIALIZED
        elif fill >= SPECIALIZED_MIN_UNEQUAL_FILL:
            return SPECIALIZED
    if chunks >= SM90_TRANSPOSED_WALK_MIN_CHUNKS and (programs > sms or (short and programs > sms // 2)):
        return "sm90_transposed"
    if sms // 2 < walks * cdiv(V, sm90_walk.BV) <= 2 * sms and chunks >= SM90_WALK_MIN_CHUNKS:
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
    if walk == RECURRENT:
        if fuse_output is False or segments is not None:
            raise ValueError(f"walk={walk!r} runs token by token: no output pass, no segments")
        return walk, True
    if walk == SPECIALIZED:
        why = sm90_specialized.unsupported(q, V, raw_gate, qk_l2norm) or (
            "it always computes the output in the walk" if fuse_output is False else None)
        if why:
            raise ValueError(f"walk={walk!r} cannot run this call: {why}")
        return walk, True
    if walk in GLUON_WALKS:
        module = GLUON_WALKS[walk]
        why = module.unsupported(q, V, qk_l2norm) or (
            "it walks whole sequences (no segments)" if segments is not None and not module.TAKES_WARM_UP_SEGMENTS else
            "it always computes the output in the walk" if fuse_output is False else None)
        if why:
            raise ValueError(f"walk={walk!r} cannot run this call: {why}")
        return walk, True
    if walk != "triton":
        raise ValueError(f"walk must be one of {['triton', *GLUON_WALKS, SPECIALIZED, RECURRENT]}, got {walk!r}")
    K = q.shape[-1]
    return walk, fuse_output_default(layout, HV, K, segments) if fuse_output is None else fuse_output


@dataclass(frozen=True)
class ChunkPlan:
    """How one chunked call runs, decided once on the host from its layout (``make_plan``, ``default_plan``):
    ``forward.chunk_fused_gdn`` executes it without deciding again, and ``forward.describe`` names it."""

    fused: bool  # the fused pipeline (forward.chunk_fused_gdn); else one kernel per stage (forward.chunk_gdn)
    walk: str  # "triton", a Gluon walk (sm90.GLUON_WALKS), SPECIALIZED or RECURRENT
    prep: str  # "triton", "sm90" (sm90.prep), or SPECIALIZED or RECURRENT (done in the walk's kernel)
    fuse_output: bool  # the outputs computed in the walk, no output pass
    output_span: int  # chunks per output-pass block, 1 or 2
    segments: SegmentLayout | None  # warm-up segments, or whole sequences
    pipeline: PipelineLayout | None  # groups overlapped on three streams, or one call
    # after walk=SPECIALIZED's warm-up segments, the Gluon walk that takes the whole walks, after the Gluon prep of
    # their chunks alone (WHOLE_WALKS); None: the segments' kernel walks them beside the segments
    whole_walk: str | None = None

    def workspace(self, layout: ChunkLayout, q: Tensor, v: Tensor, *, raw_gate: bool,
                  final_state: bool) -> ChunkWorkspace:
        """The buffers this plan's launches use, allocated once outside timed calls."""
        return ChunkWorkspace.allocate(layout, q, v, stages=not self.fused, raw_gate=raw_gate,
                                       fuse_output=self.fuse_output, final_state=final_state, segments=self.segments,
                                       output_span=self.output_span, pipeline=self.pipeline is not None)


# the multi-kernel pipeline decides nothing: every stage is its own launch
STAGES_PLAN = ChunkPlan(fused=False, walk="triton", prep="triton", fuse_output=False, output_span=1, segments=None,
                        pipeline=None)


def make_plan(layout: ChunkLayout, q: Tensor, k: Tensor, V: int, HV: int, *, raw_gate: bool, qk_l2norm: bool,
              walk: str | None = None, prep: str | None = None, fuse_output: bool | None = None,
              output_span: int | None = None, segments: SegmentLayout | None = None,
              pipeline: PipelineLayout | None = None, whole_walk: str | None = None) -> ChunkPlan:
    """The fused pipeline's plan with these fields forced and the others (None) by the default rules
    (``plan_walk``, ``plan_prep``, ``output_span_default``); segments, pipeline and whole_walk as given (None:
    none). Raises ValueError for fields that cannot go together."""
    walk, fuse = plan_walk(layout, q, V, HV, qk_l2norm, segments, walk, fuse_output, raw_gate=raw_gate, prep=prep)
    prep = plan_prep(k, raw_gate, qk_l2norm, prep, walk)
    K = q.shape[-1]
    span = 1 if fuse else output_span_default(layout, HV, K, segments) if output_span is None else output_span
    if whole_walk is not None:
        whole = segments is not None and segments.whole_walks
        why = (f"whole_walk must be one of {list(WHOLE_WALKS)}" if whole_walk not in WHOLE_WALKS else
               f"it walks after walk={SPECIALIZED!r}'s segments, not walk={walk!r}'s" if walk != SPECIALIZED else
               "there are no whole walks beside warm-up segments" if not whole else
               GLUON_WALKS[whole_walk].unsupported(q, V, qk_l2norm) or sm90_prep.unsupported(k, raw_gate, qk_l2norm))
        if why:
            raise ValueError(f"whole_walk={whole_walk!r} cannot run this call: {why}")
    return _checked(ChunkPlan(fused=True, walk=walk, prep=prep, fuse_output=fuse, output_span=span, segments=segments,
                              pipeline=pipeline, whole_walk=whole_walk), layout)


def _checked(plan: ChunkPlan, layout: ChunkLayout) -> ChunkPlan:
    """plan, where its pipeline can run; raises ValueError where not."""
    if plan.pipeline is not None and (plan.segments is not None or plan.pipeline.spans != layout.spans):
        raise ValueError("a pipeline cuts this call's sequences into groups, without segments")
    if plan.pipeline is not None and plan.walk in (SPECIALIZED, RECURRENT):
        raise ValueError(f"a pipeline overlaps separate prep and walk kernels, which walk={plan.walk!r} has not")
    return plan


def default_plan(layout: ChunkLayout, q: Tensor, k: Tensor, V: int, HV: int, *, raw_gate: bool, qk_l2norm: bool,
                 fused: bool = True, walk: str | None = None, prep: str | None = None,
                 fuse_output: bool | None = None, output_span: int | None = None, segment_chunks: int | None = None,
                 pipeline_chunks: int | None = None, whole_walk: str | None = None,
                 whole_walks: bool | None = None) -> ChunkPlan:
    """A call's plan by the default rules, any field forced (sweeps force one at a time). segment_chunks: warm-up
    segments of that many chunks (``plan_segments`` where None, unless fuse_output, walk or pipeline_chunks is
    forced; 0: whole sequences); whole_walks: whole walks beside them or not (``whole_walks_pay`` where None; a
    plan without segments raises ValueError for it); pipeline_chunks: groups of that many chunks
    (``pipeline_default`` where None; 0: one call); whole_walk: ``ChunkPlan.whole_walk`` (None by default).
    Nothing forced, where ``recurrent_pays``: walk=RECURRENT. fused False: the multi-kernel pipeline, which has
    nothing to decide."""
    if not fused:
        return STAGES_PLAN
    forced = (walk, prep, fuse_output, output_span, segment_chunks, pipeline_chunks, whole_walk, whole_walks)
    if all(field is None for field in forced) and recurrent_pays(layout, HV):
        return make_plan(layout, q, k, V, HV, raw_gate=raw_gate, qk_l2norm=qk_l2norm, walk=RECURRENT)
    if segment_chunks is None and fuse_output is None and walk is None and pipeline_chunks is None:
        segment_chunks = plan_segments(layout, q, V, HV, qk_l2norm, raw_gate)
    segments = SegmentLayout.build(layout, segment_chunks) if segment_chunks else None
    fields = dict(raw_gate=raw_gate, qk_l2norm=qk_l2norm, walk=walk, prep=prep, fuse_output=fuse_output,
                  output_span=output_span)
    plan = make_plan(layout, q, k, V, HV, **fields, segments=segments)
    if segments is None and whole_walks is not None:
        raise ValueError("whole_walks goes with warm-up segments, and this plan has none")
    if whole_walks is None and segments is not None:
        whole_walks = whole_walks_pay(layout, segment_chunks, HV, V, plan.walk == SPECIALIZED, q.device)
    if whole_walks:
        segments = segments.with_whole_walks()
    if whole_walk is not None or segments is not plan.segments:
        plan = make_plan(layout, q, k, V, HV, **fields, segments=segments, whole_walk=whole_walk)
    if pipeline_chunks is None:
        pipeline_chunks = pipeline_default(layout, HV, plan.fuse_output, segments, plan.walk)
    if not pipeline_chunks:
        return plan
    return _checked(dataclasses.replace(plan, pipeline=PipelineLayout.build(layout, pipeline_chunks)), layout)

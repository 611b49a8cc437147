"""The chunked prefill's host side, without running a kernel: its layouts, walk order, segments, pipeline,
the plan's dispatch rules (each where its decision record measured it faster), the kernels' candidate configs
and the launcher's checks. The kernels themselves run in tests/test_kernel_chunk.py."""

from __future__ import annotations

import itertools
import re

import pytest
import torch

from tests.kernel_inputs import BY_NAME

CPU = torch.device("cpu")


@pytest.mark.parametrize("B,T,seqs,HV,K,fused", [
    (8, 512, None, 8, 128, True),  # 64 sequence-heads of 8 chunks, K = 128
    (8, 512, None, 8, 64, False),  # K = 64: the output pass is cheap enough at 64 pairs
    (16, 512, None, 8, 64, True),  # but not at 128
    (4, 512, None, 8, 128, False),  # 32 pairs: too few programs for a sequential walk
    (4, 8192, None, 32, 128, True),  # long sequences too (qwen3-next B=4)
    (1, 65536, None, 32, 128, False),  # 32 pairs
    (1, 0, [100] * 15 + [600], 8, 128, False),  # the longest sequence would hold up the pass
    (1, 0, [100] * 15 + [500], 8, 128, True),  # unless it is short
    (1, 0, [100] * 16, 8, 128, True),
    (1, 63, None, 1, 64, True),  # one chunk a sequence: no walk to wait for
    (1, 0, [15, 64, 3], 1, 64, True),
    (1, 65, None, 1, 64, False),
])
def test_output_fused_by_default_only_where_measured_faster(B, T, seqs, HV, K, fused):
    from gdnbench_kernels import chunk

    cu = None if seqs is None else torch.tensor([0, *torch.tensor(seqs).cumsum(0).tolist()])
    layout = chunk.ChunkLayout.build(B, T if seqs is None else sum(seqs), cu, CPU)
    assert chunk.plan.fuse_output_default(layout, HV, K) is fused


@pytest.mark.parametrize("B,T,HV,K,span", [
    (1, 4096, 32, 128, 2),  # qwen3-next B=1: 2,048 chunk-heads
    (1, 4032, 32, 128, 1),  # 2,016
    (1, 8192, 32, 64, 1),  # K = 64: h is a smaller share of the bytes (measured at K = 128 only)
])
def test_output_over_pairs_of_chunks_only_for_large_problems(B, T, HV, K, span):
    from gdnbench_kernels import chunk

    layout = chunk.ChunkLayout.build(B, T, None, CPU)
    assert chunk.plan.output_span_default(layout, HV, K) == span
    assert chunk.plan.output_span_default(layout, HV, K, chunk.SegmentLayout.build(layout, 8)) == 1


def test_warm_up_segments_fold_the_output_into_the_walk():
    """B=1 T=65536 HV=32: one walk is too few to fuse the outputs into; warm-up segments always take them."""
    from gdnbench_kernels import chunk

    layout = chunk.ChunkLayout.build(1, 65536, None, CPU)
    assert not chunk.plan.fuse_output_default(layout, 32, 128)
    assert chunk.plan.fuse_output_default(layout, 32, 128, chunk.SegmentLayout.build(layout, 32))
    assert chunk.plan.fuse_output_default(layout, 32, 128, chunk.SegmentLayout.build(layout, 64))


# ---- host side, without running a kernel --------------------------------------------------------------

def test_layout_lists_chunks_per_sequence():
    from gdnbench_kernels.chunk import ChunkLayout

    lay = ChunkLayout.build(1, 200, torch.tensor([0, 64, 64, 65, 200]), CPU)
    assert (lay.N, lay.NT, lay.max_len) == (4, 5, 135)
    assert lay.chunk_indices.tolist() == [[0, 0], [2, 0], [3, 0], [3, 1], [3, 2]]
    assert lay.chunk_offsets.tolist() == [0, 1, 1, 2, 5]
    # pairs of chunks: sequence 3's three chunks make a pair and a single
    assert lay.NP == 4 and lay.pair_indices.tolist() == [[0, 0], [2, 0], [3, 0], [3, 1]]
    assert lay.blocks(2)[2].tolist() == [0, 1, 1, 2, 4] and lay.blocks(1)[0] == 5
    padded = ChunkLayout.build(3, 65, None, CPU)
    assert padded.seq_bounds.tolist() == [[0, 65], [65, 130], [130, 195]] and padded.NT == 6
    with pytest.raises(ValueError, match="end at T=200"):
        ChunkLayout.build(1, 200, torch.tensor([0, 70, 190]), CPU)


def test_walks_are_dealt_longest_first_to_the_least_loaded_program():
    """ChunkLayout.walk_order: each walk (sequence n, head h: n * heads + h) once; equal walks in their order round
    the programs (the stride a persistent kernel would take); unequal ones so that the longest do not meet on one
    program, as they do in order; kept for the next call."""
    from gdnbench_kernels.chunk import ChunkLayout, WalkOrder
    from gdnbench_kernels.chunk.layout import warm_up_loads

    def mine(order: WalkOrder, p: int) -> list[int]:  # program p's walks, in its order
        return order.walks[:, 0].tolist()[p::order.programs][:order.counts[p]]

    def loads(order: WalkOrder, chunks: list[int]) -> list[int]:
        return [sum(chunks[x] for x in mine(order, p)) for p in range(order.programs)]

    padded = ChunkLayout.build(5, 130, None, CPU)  # 10 walks of 3 chunks on 4 programs
    order = padded.walk_order(2, 4)
    # rows go round the programs: program p's i-th walk in row 4 i + p, rows past a program's count unused
    assert order.counts.tolist() == [3, 3, 2, 2]
    assert [mine(order, p) for p in range(4)] == [[0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]
    # whole sequences: output from their first token, from h0 and to ht
    assert order.walks[4].tolist() == [4, 260, 260, 390, 3] and order.walks[10:].tolist() == [[-1, 0, 0, 0, 0]] * 2
    assert order.program_chunks.tolist() == [9, 9, 6, 6]
    assert (order.makespan, order.chunks) == (9, 30) and order.fill(4) == pytest.approx(30 / 36)
    assert padded.walk_order(2, 4) is order and padded.walk_order(2, 3) is not order
    lengths = [448, 64, 64, 448, 384, 128, 0, 320]  # chunks 7 1 1 7 6 2 0 5
    lay = ChunkLayout.build(1, sum(lengths), torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()]), CPU)
    chunks = [-(-n // 64) for n in lengths]
    order = lay.walk_order(1, 3)
    assert sorted(w for p in range(3) for w in mine(order, p)) == list(range(8))
    assert loads(order, chunks) == order.program_chunks.tolist() == [9, 9, 11]  # in order: 7 + 7 + 0, 1 + 6 + 5, 1 + 2
    bounds = lay.seq_bounds.tolist()
    assert all([s, e] == bounds[w] for w, s, _, e, _ in order.walks.tolist() if w >= 0)
    assert order.makespan == 11 and order.fill(3) == pytest.approx(29 / 33)
    with pytest.raises(ValueError, match="at least one program"):
        lay.walk_order(1, 0)
    # dealt by given loads (warm-up segments: their own chunks and one of warm-up but on a sequence's first)
    assert warm_up_loads([3, 0, 5], 2) == [2, 2, 0, 2, 3, 2]
    order = WalkOrder.deal([(w, 0, 0, 64, 3) for w in range(4)], [1, 3, 2, 1], 2, CPU)
    assert [mine(order, p) for p in range(2)] == [[1, 3], [2, 0]] and order.program_chunks.tolist() == [4, 3]
    assert (order.makespan, order.chunks) == (4, 4)
    # drop_empty: walks of no token go to no program; with none left, every program still finds a (padding) row
    order = WalkOrder.deal([(0, 64, 64, 64, 2), (1, 0, 0, 64, 3)], [0, 1], 2, CPU, drop_empty=True)
    assert order.empty.tolist() == [0] and [mine(order, p) for p in range(2)] == [[1], []]
    order = WalkOrder.deal([(0, 0, 0, 0, 2)], [0], 2, CPU, drop_empty=True)
    assert order.counts.tolist() == [0, 0] and order.walks.tolist() == [[-1, 0, 0, 0, 0]] * 2


def test_a_regular_first_round_is_told_apart():
    """WalkOrder.regular: (T, flags) only where every program's first row is the one a kernel would compute, walk p
    over T tokens from T (p // heads): padded sequences, whole or as one segment each, dealt in order."""
    from gdnbench_kernels.chunk import ChunkLayout, SegmentLayout, WalkOrder
    from gdnbench_kernels.chunk.layout import WALK_STORES_HT, WALK_WHOLE

    padded = ChunkLayout.build(5, 130, None, CPU)  # 10 walks of 3 chunks
    assert padded.walk_order(2, 4).regular(2) == (130, 3)
    assert padded.walk_order(2, 4).regular(1) == (0, 0)  # walk p's sequence is p // 2, not p
    assert padded.walk_order(2, 12).regular(2) == (0, 0)  # programs 10 and 11 have no walk
    one_each = SegmentLayout.build(padded, 3).walks(2, 4)
    assert one_each.regular(2) == (130, 2)  # a segment that ends its sequence stores ht; the kernel finds h0
    assert SegmentLayout.build(padded, 2).walks(2, 4).regular(2) == (0, 0)  # a sequence's second
    # beside whole walks, sequences of two segments: their whole walks lead, regular too
    assert SegmentLayout.build(padded, 2, True).walks(2, 4).regular(2) == (130, WALK_STORES_HT | WALK_WHOLE)
    assert SegmentLayout.build(padded, 2, True).walks(2, 12).regular(2) == (0, 0)  # programs 10, 11: a segment
    varlen = ChunkLayout.build(1, 390, torch.tensor([0, 130, 260, 390]), CPU)  # equal, but longest first: in order
    assert varlen.walk_order(1, 3).regular(1) == (130, 3)
    varlen = ChunkLayout.build(1, 390, torch.tensor([0, 100, 260, 390]), CPU)
    assert varlen.walk_order(1, 3).regular(1) == (0, 0)
    assert WalkOrder.deal([(0, 0, 0, 0, 3)], [0], 1, CPU).regular(1) == (0, 0)  # an empty walk


def test_segments_cut_each_sequence_at_chunk_boundaries():
    from gdnbench_kernels import chunk

    lay = chunk.ChunkLayout.build(1, 400, torch.tensor([0, 130, 130, 194, 400]), CPU)
    # 128 tokens a segment; the empty sequence gets one empty segment, whose program stores its final state
    seg = chunk.SegmentLayout.build(lay, 2)
    assert seg.layout.spans == ((0, 128), (128, 130), (130, 130), (130, 194), (194, 322), (322, 400))
    assert seg.seg_offsets.tolist() == [0, 2, 3, 4, 6] and seg.parent.tolist() == [0, 0, 1, 2, 3, 3]
    # a segment's chunks keep their global numbers, where the output pass finds their states
    assert seg.layout.chunk_offsets.tolist() == [0, 2, 3, 3, 4, 6, 8]
    assert lay.chunk_offsets.tolist() == [0, 3, 3, 4, 8]
    with pytest.raises(ValueError, match="at least one chunk"):
        chunk.SegmentLayout.build(lay, 0)
    kw = BY_NAME["weak-decay-varlen-K16-h0"]["kw"]
    lay = chunk.ChunkLayout.build(1, 464, kw["cu_seqlens"], CPU)
    other = chunk.ChunkLayout.build(1, 464, torch.tensor([0, 464]), CPU)
    with pytest.raises(ValueError, match="must cut this batch's layout"):
        chunk.chunk_fused_gdn(**kw, layout=lay, segments=chunk.SegmentLayout.build(other, 2))


@pytest.mark.parametrize("whole_walks", [True, False])
@pytest.mark.parametrize("chunks", [1, 2, 3])
def test_warm_up_segments_walk_from_their_sequences_start(chunks, whole_walks):
    """SegmentLayout.walks: each segment and head once, as its sequence's walk (n * heads + h) from the sequence's
    start, where the kernel finds its warm-up start, outputting from the segment's first token, with ht only where it
    ends its sequence and h0 left to the kernel; dealt as its chunks and one of warm-up but on a sequence's first;
    an empty sequence's walks dealt to no program but listed apart; with whole_walks, the whole walks of each sequence
    of two segments or more (WALK_WHOLE), one a program, each its program's first and outside the balance."""
    from gdnbench_kernels import chunk

    lengths = [200, 0, 64, 300]  # chunks 4, 0, 1, 5
    layout = chunk.ChunkLayout.build(1, sum(lengths), torch.tensor([0, *itertools.accumulate(lengths)]), CPU)
    segments = chunk.SegmentLayout.build(layout, chunks, whole_walks)
    heads, programs = 2, 3
    order = segments.walks(heads, programs)
    assert segments.walks(heads, programs) is order
    mine = [[tuple(order.walks[i * programs + p].tolist()) for i in range(order.counts[p])] for p in range(programs)]
    whole_flags = chunk.layout.WALK_STORES_HT | chunk.layout.WALK_WHOLE
    whole = [(n * heads + h, start, start, end, whole_flags) for n, (start, end) in enumerate(layout.spans)
             if whole_walks and end - start > chunks * chunk.CHUNK for h in range(heads)]
    assert [walks[0] for walks in mine if walks[0][4] == whole_flags] == whole[:programs]  # first, in turn
    assert sum(walk[4] == whole_flags for walks in mine for walk in walks[1:]) == max(len(whole) - programs, 0)
    expected = list(whole)
    for n, (start, end) in enumerate(layout.spans):
        for first in range(start, end, chunks * chunk.CHUNK):
            last = min(first + chunks * chunk.CHUNK, end)
            expected += [(n * heads + h, start, first, last, chunk.layout.WALK_STORES_HT if last == end else 0)
                         for h in range(heads)]
    assert sorted(walk for walks in mine for walk in walks) == sorted(expected)
    assert order.empty.tolist() == [1 * heads + h for h in range(heads)]  # the empty sequence's, dealt to none
    loads = [[-(-(end - first) // chunk.CHUNK) + (first > start) for _, start, first, end, flags in walks
              if flags != whole_flags] for walks in mine]
    assert order.program_chunks.tolist() == [sum(mine) for mine in loads]
    assert order.makespan == max(map(sum, loads)) and order.chunks == sum(-(-n // 64) for n in lengths) * heads


def test_a_layout_of_another_batch_is_rejected():
    """A padded layout only says B sequences: one built for a longer T must not reach the kernels, whose
    bounds would then run past the ends of every token-indexed buffer."""
    from gdnbench_kernels import chunk

    kw = BY_NAME["padded-T100-gva2-K64-h0"]["kw"]
    for lay in (chunk.ChunkLayout.build(2, 1000, None, CPU), chunk.ChunkLayout.build(2, 64, None, CPU)):
        with pytest.raises(ValueError, match="layout does not describe this batch"):
            chunk.chunk_gdn(**kw, layout=lay)


@pytest.mark.parametrize("bad, needle", [
    ({"g": None}, "g and beta"),
    ({"k": torch.zeros(2, 70, 1, 32)}, "bad shapes"),
    ({"initial_state": torch.zeros(3, 2, 64, 64)}, "initial_state must be"),
    ({"out": torch.empty(2, 100, 2, 64, dtype=torch.float16)}, "out must be"),
    ({"q": torch.zeros(2, 100, 1, 320), "k": torch.zeros(2, 100, 1, 320)}, "head dims up to 256"),
])
def test_launcher_rejects_bad_arguments(bad, needle):
    from gdnbench_kernels import chunk

    with pytest.raises(ValueError, match=re.escape(needle)):
        chunk.chunk_gdn(**{**BY_NAME["padded-T100-gva2-K64-h0"]["kw"], **bad})


def test_state_candidates_follow_the_parallelism_tier():
    """A few long sequences (tier 0) also get BV 16 (more programs), the other tiers 32 and 64 only
    (this process does not interpret: the GPU's candidates)."""
    from gdnbench_kernels import chunk

    if chunk.INTERPRETED:
        pytest.skip("one config under the interpreter")
    args = {"BK": 128, "V": 128, "FUSE_OUTPUT": False}
    picked = {tier: chunk.state._state_prune_by_tier(chunk.state.STATE_CONFIGS, {**args, "state_tier": tier})
              for tier in (0, 1, 2)}
    assert {c.kwargs["BV"] for c in picked[0]} == {16, 32, 64} and len(picked[0]) == 5
    assert {c.kwargs["BV"] for c in picked[1]} == {c.kwargs["BV"] for c in picked[2]} == {32, 64}
    assert len(picked[1]) == 4
    assert [chunk.layout.state_tier(1, 32, 128, 4096), chunk.layout.state_tier(16, 8, 128, 512),
            chunk.layout.state_tier(64, 32, 128, 64)] == [3, 4, 2]
    assert chunk.layout.state_tier(1, 1, 64, 63) == 0  # one short walk: tuned apart from the long ones
    # parallelism counts value columns: 16 sequences of 4 heads at V = 64 are as few programs as 32 at 128
    assert chunk.layout.state_tier(16, 4, 64, 1024) == chunk.layout.state_tier(8, 4, 128, 1024) == 3
    few = chunk.state._state_prune_by_tier(chunk.state.STATE_CONFIGS, {**args, "state_tier": 3})
    assert [str(c) for c in few] == [str(c) for c in picked[0]]
    # parity's one-chunk case tunes apart from its B=16 T=512 HV=8 one, and that from B=1 T=4096 HV=32
    tier = chunk.layout.chunk_tier
    assert [tier(1, 1), tier(128, 8), tier(64, 32)] == [0, 1, 2]


def test_pruning_keeps_the_register_caps():
    """The prune functions rebuild each config for the head dim's block width: a register cap (maxnreg)
    must survive it, and a capped config must not be dropped as a duplicate of the uncapped one."""
    from gdnbench_kernels import chunk

    if chunk.INTERPRETED:
        pytest.skip("one config under the interpreter")

    def settings(configs):
        return sorted((c.kwargs["BV"], c.num_warps, c.num_stages, c.maxnreg or 0) for c in configs)

    # the output pass at V = 64: BV 128 configs mask down to BV 64, beside the capped (64, 4, 2)
    assert settings(chunk.configs.bv_prune(chunk.output.OUTPUT_CONFIGS, {"V": 64})) == [
        (64, 4, 2, 0), (64, 4, 2, 128), (64, 4, 3, 0), (64, 8, 3, 0)]


@pytest.mark.parametrize("V", [16, 32, 60, 64])
def test_the_fused_walk_is_never_offered_a_miscompiled_config(V):
    """At D = 16 and 32 the prune caps the (64, 4, 1) candidate of the walk with the output fused in to a
    single-stage BV 16 / 32 config, which Triton 3.6 compiles wrongly (chunk.state._miscompiled): dropped there,
    kept at BV 64; the walk without the output keeps it."""
    from gdnbench_kernels import chunk

    if chunk.INTERPRETED:
        pytest.skip("one config under the interpreter")
    args = {"BK": chunk.configs.tile_width(V), "V": V}
    fused = chunk.state._state_prune(chunk.state.FUSED_STATE_CONFIGS, {**args, "FUSE_OUTPUT": True})
    plain = chunk.state._state_prune(chunk.state.FUSED_STATE_CONFIGS, {**args, "FUSE_OUTPUT": False})
    single_stage = [c.kwargs["BV"] for c in fused if c.num_stages == 1]
    assert single_stage == ([] if V <= 32 else [64])
    assert len(plain) == len(fused) + (V <= 32) and fused


def test_the_fused_walk_at_v128_has_one_config():
    """With the output fused in at V = 128, (64, 4, 2) won every case forced on an H100 and an H200, and the
    others, picked now and then on the first case of an autotune key, ran the key's other cases up to 1.4x
    slower: only it is offered there. At V = 64 the candidates stay, and so do they without the output."""
    from gdnbench_kernels import chunk

    if chunk.INTERPRETED:
        pytest.skip("one config under the interpreter")
    def offered(V: int, fused: bool = True) -> list[tuple]:
        args = {"BK": chunk.configs.tile_width(V), "V": V, "FUSE_OUTPUT": fused}
        kept = chunk.state._state_prune(chunk.state.FUSED_STATE_CONFIGS, args)
        return [chunk.configs.config_settings(c)[:3] for c in kept]

    assert offered(128) == [chunk.state.FUSED_WALK_V128] == [(64, 4, 2)]
    assert sorted(offered(64)) == [(32, 4, 2), (64, 4, 1), (64, 4, 2), (64, 8, 3)]
    assert sorted(offered(128, fused=False)) == sorted(chunk.state.FUSED_STATE_CANDIDATES)


def test_the_prep_kernel_has_no_register_cap_with_a_wide_key_tile():
    """The cap at 96 registers lost nearly every D = 128 case it was forced on (H100 and H200): offered only
    with key tiles under 128 wide, where it won a D = 64 case."""
    from gdnbench_kernels import chunk

    if chunk.INTERPRETED:
        pytest.skip("one config under the interpreter")
    def caps(BK: int) -> list:
        return [c.maxnreg for c in chunk.prep._prep_prune(chunk.prep.PREP_CONFIGS, {"BK": BK})]

    assert caps(128) == [None] and caps(256) == [None]
    assert caps(64) == [None, 96]


def test_every_tuned_chunk_kernel_keys_on_a_size_tier():
    """Keyed on head dims alone, a kernel is tuned by whichever case of a dim runs first: parity's
    one-chunk case chose the output pass's and the state pass's configs for its larger cases (1.2-1.3x
    slower on an H100). Every tuned chunk kernel keys on a size tier, whose bounds split one chunk
    from many and a short walk from a long one."""
    from gdnbench_kernels import chunk

    for kernel in (chunk.state.state_kernel, chunk.output.output_kernel, chunk.prep.fused_prep_kernel,
                   chunk.state.fused_state_kernel, chunk.output.output_span2_kernel):
        assert {"state_tier", "chunk_tier"} & set(kernel.keys), kernel.keys
    assert chunk.layout.chunk_tier(1, 1) != chunk.layout.chunk_tier(128, 8)
    assert chunk.layout.state_tier(1, 1, 64, 63) != chunk.layout.state_tier(4, 8, 64, 2048)


@pytest.mark.parametrize("B,T,HV,fuse,chunks", [
    (1, 4096, 32, False, None),  # 64 chunks: measured no faster
    (1, 8192, 32, False, 32),  # a quarter of the chunks
    (1, 16384, 32, False, 64),
    (1, 65536, 32, False, 128),  # at most 128
    (1, 8192, 4, False, None),  # few heads: not measured
    (1, 8192, 32, True, None),  # the output folded into the walk
    (2, 8192, 32, False, None),  # several sequences: from 256 chunks
    (2, 16384, 16, False, 64),  # a quarter of the longest one's chunks
    (4, 8192, 32, True, None),  # the output folded into the walks: measured slower
])
def test_pipelined_by_default_only_where_measured_faster(B, T, HV, fuse, chunks):
    from gdnbench_kernels import chunk

    assert chunk.plan.pipeline_default(chunk.ChunkLayout.build(B, T, None, CPU), HV, fuse) == chunks


@pytest.mark.parametrize("lengths,HV,V,chunks", [
    ([4096], 32, 128, 16),  # 64 walk programs on 132 SMs: segments of about 2 programs per SM in all
    ([8192], 32, 128, 32),
    ([65536], 32, 128, 64),  # at most 64
    ([8192] * 4, 32, 128, None),  # 256 walk programs of equal walks: the SMs are busy already
    ([2048] * 4, 8, 64, 4),  # at least 4
    ([8192], 4, 60, 4),
    ([512] * 8, 8, 128, None),  # walks of 8 chunks: 2 segments of 4
    ([576] * 8, 4, 128, 4),  # walks of 9 chunks: 3 segments
    ([8662, 112, 7610], 32, 128, 63),  # 192 walk programs, but the longest walk is 2.2 times the even share
    ([8192, 8192, 8192, 8000], 32, 128, None),  # the longest walk is about the even share
])
def test_warm_up_segments_by_default_only_where_the_walks_are_few_or_unequal(lengths, HV, V, chunks, monkeypatch):
    """warm_up_default on an H100's 132 SMs (faked on a CPU); never on a CPU."""
    from gdnbench_kernels import chunk

    cu_seqlens = torch.tensor([0, *itertools.accumulate(lengths)])
    layout = chunk.ChunkLayout.build(1, sum(lengths), cu_seqlens, CPU)
    assert chunk.plan.warm_up_default(layout, HV, V, torch.device(CPU)) is None
    monkeypatch.setattr(chunk.plan, "sm_count", lambda device: 132)
    assert chunk.plan.warm_up_default(layout, HV, V, torch.device("cuda")) == chunks


@pytest.mark.parametrize("lengths,HV,raw,chunks", [
    ([65536], 32, False, 249),  # 5 segments of a sequence's 1024 chunks: the most loaded program walks 250 of them
    ([65536], 32, True, 64),  # raw gates: the transposed walk, warm_up_default's size
    ([32768], 32, False, 125),
    ([16384], 32, False, 63),  # warm_up_default's size is the best already
    ([2048] * 4, 8, False, 8),  # under SPECIALIZED_MIN_SEGMENT_CHUNKS: the transposed walk's
    ([8192] * 4, 32, False, None),  # no segments: 126 chunks would cut the makespan only from 128 to 126
    ([4096] * 6, 32, False, 31),  # 192 walks of 64 chunks: makespan 128 -> 97
    ([448] + [64] * 63, 4, False, 2),  # 256 walks, the longest of 7 chunks, the others of one: 7 -> 3
    ([256] * 16, 8, False, 4),  # 128 walks of 4 chunks: one segment a sequence, for its first chunk's skip
    ([64] * 128, 4, False, 1),  # and 512 of one chunk
])
def test_segments_for_the_specialized_kernel_deal_evenly(lengths, HV, raw, chunks, monkeypatch):
    """plan_segments on a faked H100 (132 SMs, every kernel's envelope open): where the warp-specialized kernel walks
    the segments, the size whose walks (a chunk of warm-up each but a sequence's first) its 132 programs take with the
    least makespan, as WalkOrder deals them: of 16 chunks or more on few walks, from 2 on many (128 or more)."""
    from gdnbench_kernels import chunk

    monkeypatch.setattr(chunk.plan, "sm_count", lambda device: 132)
    monkeypatch.setattr(chunk.sm90.specialized, "unsupported", lambda q, V, raw, l2: "raw" if raw else None)
    for module in chunk.sm90.GLUON_WALKS.values():
        monkeypatch.setattr(module, "unsupported", lambda *a: None)
    warm_up_default = chunk.plan.warm_up_default
    monkeypatch.setattr(chunk.plan, "warm_up_default", lambda *a: warm_up_default(*a[:3], torch.device("cuda")))
    layout = chunk.ChunkLayout.build(1, sum(lengths), torch.tensor([0, *itertools.accumulate(lengths)]), CPU)
    q = torch.empty(1, sum(lengths), 16, 128)
    assert chunk.plan.plan_segments(layout, q, 128, HV, raw_gate=raw) == chunks
    many = len(lengths) * HV >= chunk.plan.SPECIALIZED_MIN_WALKS
    if chunks and not raw and (many or chunks >= chunk.plan.SPECIALIZED_MIN_SEGMENT_CHUNKS):
        def makespan(size: int) -> int:  # the segments' walks dealt as the kernel's, a chunk of warm-up each but
            dealt = chunk.SegmentLayout.build(layout, size).walks(HV, 132)  # a sequence's first
            loads = [sum(-(-(end - first) // 64) + (first > start)
                         for _, start, first, end, flags in dealt.walks.tolist()[p::132][:dealt.counts[p]]
                         if not flags & chunk.layout.WALK_WHOLE)  # outside the balance
                     for p in range(132)]
            assert loads == dealt.program_chunks.tolist()
            return dealt.makespan

        least = 2 if many else chunk.plan.SPECIALIZED_MIN_SEGMENT_CHUNKS
        sizes = range(least, chunk.plan.SPECIALIZED_MAX_SEGMENT_CHUNKS + 1, 1 if many else 7)
        assert all(makespan(chunks) <= makespan(size) for size in sizes)


def test_a_pipeline_cuts_every_sequence_into_groups():
    from gdnbench_kernels import chunk

    pipe = chunk.PipelineLayout.build(chunk.ChunkLayout.build(1, 300, None, CPU), 2)
    assert [(over.spans, over.NT, over.NP) for over in pipe.groups] == [
        (((0, 128),), 2, 1), (((128, 256),), 2, 1), (((256, 300),), 1, 1)]
    assert pipe.firsts(1) == [0, 2, 4] and pipe.firsts(2) == [0, 1, 2]
    assert all(over.tokens == 300 for over in pipe.groups)
    # several sequences: group g takes chunks 2g, 2g + 1 of each, empty once a sequence is done; the
    # groups' blocks follow one another (a sequence's last pair may hold one chunk)
    lay = chunk.ChunkLayout.build(1, 400, torch.tensor([0, 130, 130, 194, 400]), CPU)
    pipe = chunk.PipelineLayout.build(lay, 2)
    assert [over.spans for over in pipe.groups] == [((0, 128), (130, 130), (130, 194), (194, 322)),
                                                    ((128, 130), (130, 130), (194, 194), (322, 400))]
    assert [over.NT for over in pipe.groups] == [5, 3] and pipe.firsts(1) == [0, 5] and pipe.firsts(2) == [0, 3]
    assert sum(over.NT for over in pipe.groups) == lay.NT and sum(over.NP for over in pipe.groups) == lay.NP
    with pytest.raises(ValueError, match="even number of chunks"):
        chunk.PipelineLayout.build(chunk.ChunkLayout.build(1, 300, None, CPU), 3)
    with pytest.raises(ValueError, match="every sequence is empty"):
        chunk.PipelineLayout.build(chunk.ChunkLayout.from_spans([(0, 0), (5, 5)], 10, CPU), 2)
    kw = BY_NAME["weak-decay-varlen-K16-h0"]["kw"]
    lay = chunk.ChunkLayout.build(1, 464, kw["cu_seqlens"], CPU)
    other = chunk.ChunkLayout.build(1, 464, torch.tensor([0, 464]), CPU)
    with pytest.raises(ValueError, match="cuts this call's sequences"):
        chunk.chunk_fused_gdn(**kw, layout=lay, pipeline=chunk.PipelineLayout.build(other, 2))


def test_a_plan_is_made_once_and_executed_as_it_stands():
    """default_plan decides every field on the host, any one forced; chunk_fused_gdn executes a plan, or makes
    one from the fields it is given, not both; describe names what the plan runs."""
    from gdnbench_kernels import chunk

    kw = BY_NAME["padded-T100-gva2-K64-h0"]["kw"]
    lay = chunk.ChunkLayout.build(2, 100, None, CPU)
    shape = dict(raw_gate=False, qk_l2norm=False)
    plan = chunk.default_plan(lay, kw["q"], kw["k"], 64, 2, **shape)
    assert plan.fused and plan.walk == "triton" and plan.prep == "triton"  # no Gluon kernel on a CPU
    assert plan.segments is None and plan.pipeline is None  # warm-up segments only on a GPU; 2 chunks a walk
    assert chunk.default_plan(lay, kw["q"], kw["k"], 64, 2, fused=False, **shape) == chunk.plan.STAGES_PLAN
    forced = chunk.default_plan(lay, kw["q"], kw["k"], 64, 2, fuse_output=False, output_span=2, **shape)
    assert not forced.fuse_output and forced.output_span == 2
    assert chunk.describe(forced).startswith("gate+kkt+solve in one, W/U in the state pass, prep[")
    assert "output per 2 chunks[" in chunk.describe(forced)
    with pytest.raises(ValueError, match="a plan is given"):
        chunk.chunk_fused_gdn(**kw, layout=lay, plan=plan, walk="triton")
    with pytest.raises(ValueError, match="runs through chunk_gdn"):
        chunk.chunk_fused_gdn(**kw, layout=lay, plan=chunk.plan.STAGES_PLAN)


def test_a_workspace_must_fit_the_variant():
    from gdnbench_kernels import chunk

    kw = BY_NAME["padded-T100-gva2-K64-h0"]["kw"]
    lay = chunk.ChunkLayout.build(2, 100, None, CPU)
    fused_ws = chunk.ChunkWorkspace.allocate(lay, kw["q"], kw["v"], stages=False, raw_gate=False, fuse_output=True,
                                             final_state=True)
    assert fused_ws.W is None and fused_ws.h is None and fused_ws.final_state.shape == (2, 2, 64, 64)
    with pytest.raises(ValueError, match=r"missing \['W', 'U', 'h', 'v_new'\]"):
        chunk.chunk_gdn(**kw, layout=lay, workspace=fused_ws)


@pytest.mark.parametrize("T,HV,whole_walks", [
    (16384, 32, True),  # 5 segments of 63 chunks a walk: 320 programs of 64 columns, over the 264 that run at once
    (16384, 8, False),  # 16 of 16 chunks: 256 programs, all at once
    (2048, 32, False),  # walks of 32 chunks: warm-ups as long as the decay needs
])
def test_whole_walks_beside_warm_up_segments_only_where_too_many_to_run_at_once(T, HV, whole_walks, monkeypatch):
    """default_plan on a faked H100 (132 SMs): warm-up segments beside whole walks (SegmentLayout.whole_walks) where
    the longest walk has WHOLE_WALKS_MIN_CHUNKS chunks or more and the segments' walks are more than the GPU runs at
    once; elsewhere, warm-ups as long as the decay needs."""
    from gdnbench_kernels import chunk

    monkeypatch.setattr(chunk.plan, "sm_count", lambda device: 132)
    warm_up_default = chunk.plan.warm_up_default
    monkeypatch.setattr(chunk.plan, "warm_up_default", lambda *a: warm_up_default(*a[:3], torch.device("cuda")))
    whole_walks_pay = chunk.plan.whole_walks_pay
    monkeypatch.setattr(chunk.plan, "whole_walks_pay", lambda *a: whole_walks_pay(*a[:5], torch.device("cuda")))
    layout = chunk.ChunkLayout.build(1, T, None, CPU)
    q = torch.empty(1, T, 4, 128)
    plan = chunk.plan.default_plan(layout, q, q, 128, HV, raw_gate=False, qk_l2norm=False)
    assert plan.walk == "triton" and plan.segments is not None and plan.segments.whole_walks == whole_walks
    for forced in (True, False):  # a sweep forces them on or off
        plan = chunk.plan.default_plan(layout, q, q, 128, HV, raw_gate=False, qk_l2norm=False, whole_walks=forced)
        assert plan.segments is not None and plan.segments.whole_walks == forced
    with pytest.raises(ValueError, match="whole_walks goes with warm-up segments"):
        chunk.plan.default_plan(layout, q, q, 128, HV, raw_gate=False, qk_l2norm=False, segment_chunks=0,
                                whole_walks=True)


@pytest.mark.parametrize("T,segment_chunks,specialized,whole_walks", [
    (8192, 32, True, True),  # 128 segment walks on 132 programs: the warp-specialized kernel takes whole walks anyway
    (4032, 16, True, False),  # 63 chunks: under WHOLE_WALKS_MIN_CHUNKS
    (8192, 32, False, False),  # 256 programs of 64 columns, two a SM: all at once
    (16384, 32, False, True),  # 512
])
def test_whole_walks_pay_where_the_gpu_cannot_run_every_segment_at_once(T, segment_chunks, specialized, whole_walks,
                                                                        monkeypatch):
    from gdnbench_kernels import chunk

    monkeypatch.setattr(chunk.plan, "sm_count", lambda device: 132)
    layout = chunk.ChunkLayout.build(1, T, None, CPU)
    pays = chunk.plan.whole_walks_pay(layout, segment_chunks, 32, 128, specialized, torch.device("cuda"))
    assert pays == whole_walks
    assert chunk.plan.whole_walks_pay(layout, segment_chunks, 32, 128, specialized, CPU) == (T >= 4096)  # interpreter


@pytest.mark.parametrize("B,T,seqs,recurrent", [
    (1, 1, None, True), (4, 8, None, True), (1, 9, None, False),  # RECURRENT_MAX_TOKENS is 8
    (1, 0, [3, 8, 1], True), (1, 0, [3, 9, 1], False),  # the longest sequence decides
    (16, 8, None, True), (17, 8, None, False), (1, 0, [8] + [1] * 16, False),  # 4 heads: RECURRENT_MAX_STEPS 512
    (512, 1, None, True), (1, 0, [1] * 300, True),  # one token a sequence: any batch
])
def test_tiny_prefills_run_token_by_token(B, T, seqs, recurrent):
    """default_plan sends calls whose longest sequence has RECURRENT_MAX_TOKENS tokens or fewer, and whose
    sequences x value heads x longest length is RECURRENT_MAX_STEPS or fewer (any number where every sequence has
    one token), to the recurrent kernel, unless a field is forced; the plan's walk and prep say so, and describe
    names it."""
    from gdnbench_kernels import chunk

    cu = None if seqs is None else torch.tensor([0, *itertools.accumulate(seqs)])
    lay = chunk.ChunkLayout.build(B, T or sum(seqs), cu, CPU)
    q = torch.empty(B, T or sum(seqs), 2, 64)
    plan = chunk.default_plan(lay, q, q, 64, 4, raw_gate=False, qk_l2norm=False)
    assert (plan.walk == chunk.plan.RECURRENT) == recurrent
    assert (plan.prep == chunk.plan.RECURRENT) == recurrent
    assert ("recurrent kernel" in chunk.describe(plan)) == recurrent
    assert chunk.default_plan(lay, q, q, 64, 4, raw_gate=False, qk_l2norm=False, walk="triton").walk == "triton"
    with pytest.raises(ValueError, match="token by token"):
        chunk.plan.make_plan(lay, q, q, 64, 4, raw_gate=False, qk_l2norm=False, walk="recurrent",
                             fuse_output=False)

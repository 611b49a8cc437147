"""chunk_fused's Gluon walks for Hopper: gdnbench_kernels.chunk_walk_sm90, chunk_walk_transposed_sm90 and
chunk_specialized_sm90 (the prep and the walk in one warp-specialized kernel, walk="sm90_specialized").

Gluon has no interpreter: on a CPU the kernels are compiled for sm_90 and chunk_fused's choice of walk is
checked; on an sm_90 GPU their outputs and final states are compared with the fp64 recurrence and with the
Triton walk, replayed from a CUDA graph as the harness times it, on NaN-poisoned outputs.
"""

from __future__ import annotations

import pytest
import torch

from gdnbench.reference import gdn_recurrent
from gdnbench.timing import TimingConfig, default_timer, measure
from tests.kernel_inputs import kernel_inputs
from tests.sm90 import compile_sm90


def _sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
@pytest.mark.parametrize("dtype,long_walk", [("bf16", False), ("bf16", True), ("fp16", False)])
@pytest.mark.parametrize("name,warm_up", [("sm90", False), ("sm90_transposed", False), ("sm90_transposed", True)])
def test_walk_compiles_for_sm90_in_two_programs_per_sm(name, warm_up, dtype, long_walk):
    from gdnbench_kernels.chunk.sm90 import GLUON_WALKS
    from gdnbench_kernels.chunk.sm90.gluon_hopper import GLUON_MISSING

    if GLUON_MISSING:
        pytest.skip(GLUON_MISSING)
    walk = GLUON_WALKS[name]
    from triton.experimental.gluon import language as gl

    dt = {"bf16": gl.bfloat16, "fp16": gl.float16}[dtype]
    desc = lambda block: f"tensordesc<{dtype}{block},{gl.NVMMASharedLayout.get_default_for(block, dt)!r}>"  # noqa: E731
    const = dict(H=2, HV=4, K=128, V=128, BV=walk.BV, BT=walk.BT, USE_H0=True, STORE_HT=True, LONG_WALK=long_walk)
    segments = {}
    if walk.TAKES_WARM_UP_SEGMENTS:  # over warm-up segments, or whole sequences (no segment tensors)
        const["WARM_UP"] = warm_up
        if warm_up:
            segments = dict(seg_parent="*i32", parent_bounds="*i64")
        else:
            const.update(seg_parent=None, parent_bounds=None)
    # beside warm-up segments (and the whole walks beside them, here the long ones) the walks marked slow
    if warm_up or long_walk:
        segments.update(slow_marks="*i32", seg_offsets="*i32")
    else:
        const.update(slow_marks=None, seg_offsets=None)
    sig = dict(q_desc=desc([64, 128]), k_desc=desc([64, 128]), v_desc=desc([64, walk.BV]), ai_desc=desc([64, 64]),
               o_desc=desc([64, walk.BV]), o=f"*{dtype}", gc="*fp32", h0="*fp32", ht="*fp32", seq_bounds="*i64",
               scale="fp32", **segments, **{name: "constexpr" for name in const})
    compiled = compile_sm90(walk._fused_walk_kernel, sig, const, interpreted=False, num_warps=walk.WARPS)
    # the walk is latency bound: a second program per SM is what hides it (228 KB of shared memory per SM,
    # 1 KB of it reserved per program; registers, at most 255 for one warpgroup, always leave room for two)
    assert compiled.metadata.shared <= 113 * 1024


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
@pytest.mark.parametrize("dtype,h0,warm_up,whole_walks", [("bf16", True, True, True), ("bf16", True, True, False),
                                                           ("fp16", False, False, False)])
def test_specialized_kernel_compiles_for_sm90_in_one_program_per_sm(dtype, h0, warm_up, whole_walks):
    """Four warpgroups (two walkers, the prep, the loader) whose registers setmaxnreg splits, and shared memory for
    one program per SM (227 KB on sm_90); over whole sequences and over warm-up segments, beside whole walks or not."""
    from gdnbench_kernels.chunk.sm90 import specialized as spec
    from gdnbench_kernels.chunk.sm90.gluon_hopper import GLUON_MISSING

    if GLUON_MISSING:
        pytest.skip(GLUON_MISSING)
    from triton.experimental.gluon import language as gl

    dt = {"bf16": gl.bfloat16, "fp16": gl.float16}[dtype]
    desc = lambda block: f"tensordesc<{dtype}{block},{gl.NVMMASharedLayout.get_default_for(block, dt)!r}>"  # noqa: E731
    const = dict(H=2, HV=4, K=128, V=128, BT=spec.BT, BV=spec.BV, NA=spec.NA, NC=spec.NC, USE_H0=h0,
                 STORE_HT=h0, WARM_UP=warm_up, WALK_REGS=spec.WALK_REGS, PREP_REGS=spec.PREP_REGS,
                 LOAD_REGS=spec.LOAD_REGS)
    slow = {"slow_marks": "*i32", "seg_offsets": "*i32"} if whole_walks else {}  # beside whole walks: the marks
    if not whole_walks:
        const.update(slow_marks=None, seg_offsets=None)
    sig = dict(q_desc=desc([64, 128]), k_desc=desc([64, 128]), v_desc=desc([64, spec.BV]), o_desc=desc([64, spec.BV]),
               o=f"*{dtype}", g="*fp32", beta=f"*{dtype}", h0="*fp32", ht="*fp32", scale="fp32", order_counts="*i32",
               order_walks="*i32", order_chunks="*i32", order_period="i32", order_flags="i32", **slow,
               **{name: "constexpr" for name in const})
    compiled = compile_sm90(spec._specialized_kernel, sig, const, interpreted=False, num_warps=spec.WARPS,
                            maxnreg=spec.MAX_REGS)
    assert compiled.metadata.shared <= 227 * 1024
    ptx = compiled.asm["ptx"]
    for regs in (spec.WALK_REGS, spec.PREP_REGS):
        assert f"setmaxnreg.inc.sync.aligned.u32 \t{regs};" in ptx
    assert f"setmaxnreg.dec.sync.aligned.u32 \t{spec.LOAD_REGS};" in ptx


def test_specialized_walk_choice_and_its_errors(monkeypatch):
    """walk="sm90_specialized" where asked for and over warm-up segments (the transposed walk there with raw gates),
    never with an output pass on its own, raw gates, a prep of its own or
    a pipeline; on a CPU, the kernel's own reason."""
    from gdnbench_kernels import chunk
    from gdnbench_kernels.chunk.sm90 import specialized as chunk_specialized_sm90

    gen = torch.Generator().manual_seed(2)
    kw, _ = kernel_inputs(gen, B=1, T=64, H=1, HV=2, K=128, V=128, dtype="bf16", seqs=None, raw=False, l2=False)
    with pytest.raises(ValueError, match="walk='sm90_specialized' cannot run this call"):
        chunk.chunk_fused_gdn(**kw, walk="sm90_specialized")
    monkeypatch.setattr(chunk_specialized_sm90, "unsupported", lambda q, V, raw, l2: "raw gates" if raw else None)
    for module in chunk.sm90.GLUON_WALKS.values():
        monkeypatch.setattr(module, "unsupported", lambda *a: None)
    monkeypatch.setattr(chunk.plan, "sm_count", lambda device: 132)
    layout = chunk.ChunkLayout.build(3, 8192, None, "cpu")
    q = torch.empty(3, 8192, 16, 128)
    assert chunk.plan.walk_default(layout, q, 128, 32, False) != chunk.sm90.SPECIALIZED  # 96 walks
    assert chunk.plan.plan_walk(layout, q, 128, 32, False, walk="sm90_specialized") == ("sm90_specialized", True)
    short = chunk.ChunkLayout.build(64, 64, None, "cpu")  # 512 walks of one chunk: its default, but for...
    assert chunk.plan.plan_walk(short, q, 128, 8, False) == ("sm90_specialized", True)
    assert chunk.plan.plan_walk(short, q, 128, 8, False, prep="triton")[0] == "triton"  # ...a prep asked for
    assert chunk.plan.plan_walk(short, q, 128, 8, False, raw_gate=True)[0] == "triton"  # ...and raw gates
    warm_up = chunk.SegmentLayout.build(layout, chunk.plan.SPECIALIZED_MIN_SEGMENT_CHUNKS)
    assert chunk.plan.plan_walk(layout, q, 128, 32, False, warm_up) == ("sm90_specialized", True)
    assert chunk.plan.plan_walk(layout, q, 128, 32, False, warm_up, raw_gate=True)[0] == "sm90_transposed"
    with pytest.raises(ValueError, match="always computes the output"):
        chunk.plan.plan_walk(layout, q, 128, 32, False, walk="sm90_specialized", fuse_output=False)
    assert chunk.plan.plan_prep(q, False, False, None, "sm90_specialized") == "sm90_specialized"
    with pytest.raises(ValueError, match="computes the prep in its own kernel"):
        chunk.plan.plan_prep(q, False, False, "sm90", "sm90_specialized")
    layout = chunk.ChunkLayout.build(1, 64, None, "cpu")
    with pytest.raises(ValueError, match="pipeline"):
        chunk.chunk_fused_gdn(**kw, layout=layout, walk="sm90_specialized",
                              pipeline=chunk.PipelineLayout.build(layout, 1))
    monkeypatch.undo()
    # the envelope: both kernels', any GPU faked
    from gdnbench_kernels.chunk.sm90 import prep as chunk_prep_sm90, walk as chunk_walk_sm90

    for module in (chunk_prep_sm90, chunk_walk_sm90):
        monkeypatch.setattr(module, "unsupported_inputs", lambda q: None)
    q = torch.empty(1, 64, 1, 128, dtype=torch.bfloat16)
    assert chunk_specialized_sm90.unsupported(q, 128, False, False) is None
    assert "gates computed beforehand" in chunk_specialized_sm90.unsupported(q, 128, True, False)
    assert "normalised beforehand" in chunk_specialized_sm90.unsupported(q, 128, False, True)
    assert "K = V = 128" in chunk_specialized_sm90.unsupported(q, 64, False, False)


def test_whole_walk_only_after_the_specialized_kernels_segments(monkeypatch):
    """A plan's whole_walk="sm90" after walk="sm90_specialized" over warm-up segments with whole walks, and nowhere
    else: not over segments without whole walks, not after another walk, not a walk it does not know, not where the
    Gluon prep cannot prep their chunks; the specialized kernel's order then leaves the whole walks out."""
    from gdnbench_kernels import chunk
    from gdnbench_kernels.chunk.sm90 import prep as chunk_prep_sm90
    from gdnbench_kernels.chunk.sm90 import specialized as chunk_specialized_sm90

    monkeypatch.setattr(chunk_specialized_sm90, "unsupported", lambda *a: None)
    monkeypatch.setattr(chunk_prep_sm90, "unsupported", lambda *a: None)
    for module in chunk.sm90.GLUON_WALKS.values():
        monkeypatch.setattr(module, "unsupported", lambda *a: None)
    monkeypatch.setattr(chunk.plan, "sm_count", lambda device: 132)
    layout = chunk.ChunkLayout.build(1, 16384, None, "cpu")
    q = torch.empty(1, 16384, 16, 128)
    segments = chunk.SegmentLayout.build(layout, 16, whole_walks=True)
    plan = chunk.plan.make_plan(layout, q, q, 128, 32, raw_gate=False, qk_l2norm=False, segments=segments,
                           whole_walk="sm90")
    assert (plan.walk, plan.whole_walk) == ("sm90_specialized", "sm90")
    whole = chunk.layout.WALK_WHOLE
    with_whole = chunk.plan.specialized_order(layout, 32, q.device, segments)
    without = chunk.plan.specialized_order(layout, 32, q.device, segments, whole=False)
    assert ((with_whole.walks[:, 4] & whole) != 0).sum() == 32 and ((without.walks[:, 4] & whole) != 0).sum() == 0
    for kwargs, why in ((dict(segments=chunk.SegmentLayout.build(layout, 16)), "no whole walks"),
                        (dict(segments=segments, walk="sm90_transposed"), "after walk='sm90_specialized'"),
                        (dict(segments=segments, whole_walk="triton"), "must be one of")):
        with pytest.raises(ValueError, match=why):
            chunk.plan.make_plan(layout, q, q, 128, 32, raw_gate=False, qk_l2norm=False,
                            **{"whole_walk": "sm90", **kwargs})
    monkeypatch.setattr(chunk_prep_sm90, "unsupported", lambda *a: "no Gluon prep")
    with pytest.raises(ValueError, match="no Gluon prep"):
        chunk.plan.make_plan(layout, q, q, 128, 32, raw_gate=False, qk_l2norm=False, segments=segments,
                             whole_walk="sm90")


def test_specialized_backend_says_why_it_skips(monkeypatch):
    """triton.chunk_specialized's check asks the kernel's own ``unsupported`` about each case (head dims, dtype,
    gating, where q and k are normalised) and returns its reason, which the harness puts on the skipped row."""
    from gdnbench.backends.triton_chunk import specialized_unsupported
    from gdnbench.suite import Case
    from gdnbench_kernels.chunk.sm90 import specialized as chunk_specialized_sm90

    seen = []
    monkeypatch.setattr(chunk_specialized_sm90, "unsupported",
                        lambda q, V, raw, l2: seen.append((q.shape[-1], q.dtype, q.device.type, V, raw, l2)) or "why")
    case = Case(op="prefill", B=1, T=64, H=2, HV=4, D=64, dtype="fp16", gating="raw", qk_l2norm="kernel")
    assert specialized_unsupported(case, torch.device("meta")) == "why"
    assert seen == [(64, torch.float16, "meta", 64, True, True)]


def test_walk_choice_and_its_errors():
    from gdnbench_kernels import chunk
    from gdnbench_kernels.chunk.sm90 import walk as chunk_walk_sm90

    gen = torch.Generator().manual_seed(0)
    kw, _ = kernel_inputs(gen, B=1, T=64, H=1, HV=2, K=128, V=128, dtype="bf16", seqs=None, raw=False, l2=False)
    layout = chunk.ChunkLayout.build(1, 64, None, "cpu")
    assert chunk.plan.walk_default(layout, kw["q"], 128, 2, False) == "triton"  # not on an sm_90 GPU
    assert "sm_90" in chunk_walk_sm90.unsupported(kw["q"], 128, False) or chunk_walk_sm90.GLUON_MISSING
    with pytest.raises(ValueError, match="walk='sm90' cannot run this call"):
        chunk.chunk_fused_gdn(**kw, walk="sm90")
    with pytest.raises(ValueError, match="walk must be"):
        chunk.chunk_fused_gdn(**kw, walk="cuda")


@pytest.mark.parametrize("B,T,HV,walk,pipeline", [
    (1, 4096, 32, "sm90", None),  # qwen3-next B=1: 128 programs
    (1, 16384, 32, "sm90", None),
    (1, 32768, 32, "sm90", 64),  # long enough to pipeline, in groups of an eighth
    (1, 65536, 32, "sm90", 128),
    (8, 512, 8, "sm90_transposed", None),  # 128 programs at BV 64, on a short walk (8 chunks)
    (8, 256, 8, "sm90_transposed", None),
    (4, 768, 8, "sm90", None),  # 64 programs at BV 64 (half the SMs), 128 at BV 32: one wave
    (4, 448, 8, "triton", None),  # walks of 7 chunks: shorter than measured
    (4, 1024, 4, "triton", 64),  # 64 programs: under half the SMs (the Triton path's output pass wins)
    (16, 256, 8, "sm90_specialized", None),  # 128 walks of 4 chunks, where the transposed walk ran
    (4, 8192, 32, "sm90_specialized", None),  # 128 walks of 128 chunks: one round of one walk a program
    (3, 8192, 32, "sm90_transposed", None),  # 96 walks: a quarter of the SMs idle
    (6, 4096, 32, "sm90_transposed", None),  # 192 walks: two rounds of one a SM, 0.73 filled
    (16, 192, 8, "sm90_specialized", None),  # 128 walks of 3 chunks
    (32, 128, 8, "sm90_specialized", None),  # 256 walks of 2 chunks: the prep in the walk's kernel
    (64, 128, 8, "sm90_specialized", None),
    (24, 128, 8, "sm90_specialized", None),  # 192 walks of 2 chunks: short enough for rounds 0.73 filled
    (64, 64, 8, "sm90_specialized", None),  # 512 walks of one chunk
    (16, 64, 8, "sm90_specialized", None),  # 128 walks of one chunk
    (8, 64, 8, "sm90_specialized", None),  # 64 walks of one chunk: one launch, however few
    (1, 64, 2, "sm90_specialized", None),  # 2
    (16, 128, 8, "sm90_specialized", None),  # 128 walks of 2 chunks
    (64, 256, 8, "sm90_specialized", None),  # 512 walks of 4 chunks, where the transposed walk ran
    (24, 256, 8, "sm90_transposed", None),  # 192 walks of 4 chunks: 384 programs at BV 64
    (32, 512, 8, "sm90_specialized", None),  # 256 walks of 8 chunks
    (32, 576, 8, "sm90_specialized", None),  # 256 walks of 9 chunks
    (16, 1024, 32, "sm90_specialized", None),  # 512 walks of 16 chunks
    (12, 1024, 8, "sm90_transposed", None),  # 96 walks of 16 chunks
    (2, 8192, 32, "sm90", None),  # 128 at BV 64: one per SM, where two of BV 32 do better
])
def test_sm90_walk_by_default_only_where_measured_faster(B, T, HV, walk, pipeline, monkeypatch):
    """walk_default, plan_walk and pipeline_default on an H100's 132 SMs, with the device's answers faked on a
    CPU: over warm-up segments the warp-specialized kernel where they are long enough or the sequences' walks 128 or
    more, else the transposed walk; over plain ones the Triton walk."""
    from gdnbench_kernels import chunk
    from gdnbench_kernels.chunk.sm90 import specialized as chunk_specialized_sm90

    for module in [*chunk.sm90.GLUON_WALKS.values(), chunk_specialized_sm90]:
        monkeypatch.setattr(module, "unsupported", lambda *a: None)
    monkeypatch.setattr(chunk.plan, "sm_count", lambda device: 132)
    layout = chunk.ChunkLayout.build(B, T, None, "cpu")
    q = torch.empty(B, T, 16, 128)
    assert chunk.plan.walk_default(layout, q, 128, HV, False) == walk
    warm_up = chunk.SegmentLayout.build(layout, 4)  # short segments: on many walks, the specialized
    over_short = "sm90_specialized" if B * HV >= chunk.plan.SPECIALIZED_MIN_WALKS else "sm90_transposed"  # kernel
    assert chunk.plan.walk_default(layout, q, 128, HV, False, warm_up) == over_short
    assert chunk.plan.plan_walk(layout, q, 128, HV, False, warm_up) == (over_short, True)
    longer = chunk.SegmentLayout.build(layout, chunk.plan.SPECIALIZED_MIN_SEGMENT_CHUNKS)
    assert chunk.plan.walk_default(layout, q, 128, HV, False, longer) == "sm90_specialized"
    with pytest.raises(ValueError, match="whole sequences"):
        chunk.plan.plan_walk(layout, q, 128, HV, False, warm_up, walk="sm90")
    if walk == "sm90":
        assert chunk.plan.pipeline_default(layout, HV, True, walk=walk) == pipeline


@pytest.mark.parametrize("lengths,walk", [
    ([448] * 64, "sm90_specialized"),  # 256 equal walks of 7 chunks
    ([448] + [64] * 63, "sm90_transposed"),  # 256 walks, the longest 7 chunks, the others one: fill 0.30
    ([448, 192] * 32, "sm90_specialized"),  # 128 walks of 7 chunks and 128 of 3, dealt to fill 0.97
    ([448] * 48, "sm90_transposed"),  # 192 equal walks of 7 chunks: rounds 0.73 filled
])
def test_specialized_kernel_only_where_its_programs_stay_busy(lengths, walk, monkeypatch):
    """walk_default on varlen sequences (HV = 4, a faked H100): the warp-specialized kernel's programs take whole
    walks, dealt longest first, and it runs only where they fill the SMs' time: about equal walks as padded ones
    (SPECIALIZED_MIN_ROUND_FILL), unequal ones from SPECIALIZED_MIN_UNEQUAL_FILL."""
    from gdnbench_kernels import chunk
    from gdnbench_kernels.chunk.sm90 import specialized as chunk_specialized_sm90

    for module in [*chunk.sm90.GLUON_WALKS.values(), chunk_specialized_sm90]:
        monkeypatch.setattr(module, "unsupported", lambda *a: None)
    monkeypatch.setattr(chunk.plan, "sm_count", lambda device: 132)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    layout = chunk.ChunkLayout.build(1, sum(lengths), cu, "cpu")
    assert chunk.plan.walk_default(layout, torch.empty(1, sum(lengths), 4, 128), 128, 4, False) == walk


def test_plan_walk_keeps_an_explicit_output_pass_on_the_triton_walk(monkeypatch):
    """plan_walk where the Gluon walk is the default (qwen3-next B=1 on a faked H100): asking for the output
    pass on its own (the sweeps that force the Triton kernels' configs do) gets the Triton walk, not the Gluon
    one with the output silently fused back in; the Gluon walk with the output pass is refused."""
    from gdnbench_kernels import chunk
    from gdnbench_kernels.chunk.sm90 import walk as chunk_walk_sm90

    monkeypatch.setattr(chunk_walk_sm90, "unsupported", lambda *a: None)
    monkeypatch.setattr(chunk.plan, "sm_count", lambda device: 132)
    layout = chunk.ChunkLayout.build(1, 4096, None, "cpu")
    q = torch.empty(1, 4096, 16, 128)
    assert chunk.plan.plan_walk(layout, q, 128, 32, False) == ("sm90", True)
    assert chunk.plan.plan_walk(layout, q, 128, 32, False, fuse_output=False) == ("triton", False)
    assert chunk.plan.plan_walk(layout, q, 128, 32, False, fuse_output=True) == ("sm90", True)
    assert chunk.plan.plan_walk(layout, q, 128, 32, False, walk="triton") == \
        ("triton", chunk.plan.fuse_output_default(layout, 32, 128))
    with pytest.raises(ValueError, match="always computes the output in the walk"):
        chunk.plan.plan_walk(layout, q, 128, 32, False, walk="sm90", fuse_output=False)
    with pytest.raises(ValueError, match="walk must be"):
        chunk.plan.plan_walk(layout, q, 128, 32, False, walk="gluon")


def test_pipelined_groups_each_run_the_sm90_walk(monkeypatch):
    """chunk_fused's dispatch with walk="sm90", on a CPU with the kernels replaced by recorders: one Gluon walk
    per pipeline group, each over its group's token ranges, the state handed from group to group through
    the two hand-off buffers and the last group's into the final state."""
    from gdnbench_kernels import chunk
    from gdnbench_kernels.chunk.sm90 import walk as chunk_walk_sm90

    gen = torch.Generator().manual_seed(1)
    kw, _ = kernel_inputs(gen, B=1, T=1000, H=2, HV=4, K=128, V=128, dtype="bf16", seqs=[620, 64, 316], raw=False,
                          l2=False)
    h0 = torch.randn(3, 4, 128, 128, generator=gen)
    layout = chunk.ChunkLayout.build(1, 1000, kw["cu_seqlens"], "cpu")
    pipe = chunk.PipelineLayout.build(layout, 2)
    ws = chunk.ChunkWorkspace.allocate(layout, kw["q"], kw["v"], stages=False, raw_gate=False, fuse_output=True,
                                       final_state=True, pipeline=True)
    walks = []
    monkeypatch.setattr(chunk_walk_sm90, "unsupported", lambda *a: None)
    monkeypatch.setattr(chunk_walk_sm90, "fused_walk", lambda *a, **k: walks.append(a))
    monkeypatch.setattr(chunk.pipeline, "run_prep", lambda *a: None)
    monkeypatch.setattr(chunk.state, "state_pass", lambda *a, **k: pytest.fail("the Triton walk ran"))
    chunk.chunk_fused_gdn(**kw, initial_state=h0, output_final_state=True, layout=layout, workspace=ws,
                          pipeline=pipe, walk="sm90")
    assert len(walks) == len(pipe.groups) == 5
    for g, (group, (*_, h_in, h_out, seq_bounds, N, _scale)) in enumerate(zip(pipe.groups, walks)):
        assert torch.equal(seq_bounds, group.seq_bounds) and N == group.N == 3
        assert h_in.data_ptr() == (ws.handoff[(g - 1) % 2] if g else h0).data_ptr()
        assert h_out.data_ptr() == (ws.final_state if g == 4 else ws.handoff[g % 2]).data_ptr()


# ---- on an sm_90 GPU ----------------------------------------------------------------------------------

GPU_CASES = [
    # dtype, varlen lengths or (B, T), H, HV, initial state, final state
    ("bf16", [620, 0, 64, 316, 1], 2, 4, True, True),  # short last chunks, an empty sequence, GVA 2
    ("fp16", (2, 300), 4, 4, False, False),
    ("bf16", (3, 128), 1, 4, True, True),  # whole chunks only, GVA 4
    ("bf16", [4200, 0, 70, 1], 2, 4, True, True),  # a long walk (tiles two chunks ahead) beside walks of 2 and 1
    ("bf16", (40, 100), 2, 4, True, True),  # 160 walks: more than the SMs (the specialized kernel's take two)
    # 200 unequal walks: the specialized kernel's programs take theirs longest first, not in order
    ("bf16", [(97 * i) % 450 + 1 for i in range(50)], 2, 4, True, True),
]


@pytest.mark.skipif(not _sm90(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("dtype,seqs,H,HV,h0,final", GPU_CASES)
@pytest.mark.parametrize("gluon_walk", ["sm90", "sm90_transposed", "sm90_specialized"])
def test_sm90_walk_under_graph_replay(gluon_walk, dtype, seqs, H, HV, h0, final):
    from gdnbench_kernels import chunk

    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(len(str(seqs)))
    varlen = isinstance(seqs, list)
    B, T = (1, sum(seqs)) if varlen else seqs
    kw, N = kernel_inputs(gen, B=B, T=T, H=H, HV=HV, K=128, V=128, dtype=dtype, seqs=seqs if varlen else None,
                          raw=False, l2=False, gate_norm=10.0)
    if h0:
        kw["initial_state"] = torch.randn(N, HV, 128, 128, generator=gen)
    kw = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    layout = chunk.ChunkLayout.build(B, T, kw.get("cu_seqlens"), dev)
    results = {}
    for walk in (gluon_walk, "triton"):
        ws = chunk.ChunkWorkspace.allocate(layout, kw["q"], kw["v"], stages=False, raw_gate=False, fuse_output=True,
                                           final_state=final)
        if final:
            ws.final_state.fill_(float("nan"))
        out = torch.full_like(kw["v"], float("nan"))

        def call() -> None:
            chunk.chunk_fused_gdn(**kw, output_final_state=final, layout=layout, workspace=ws, out=out,
                                  fuse_output=True, walk=walk)

        measure(call, device=dev, config=TimingConfig(timer=default_timer(dev), l2="cold", warmup=2, min_samples=5,
                                                      max_samples=10, min_time_s=0.0, max_time_s=0.2))
        torch.cuda.synchronize()
        results[walk] = (out.double().cpu(), ws.final_state.double().cpu() if final else None)
    cpu = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    o_ref, final_ref = gdn_recurrent(cpu["q"], cpu["k"], cpu["v"], cpu["g"], cpu["beta"], scale=cpu["scale"],
                                     initial_state=cpu.get("initial_state"), cu_seqlens=cpu.get("cu_seqlens"),
                                     compute_dtype=torch.float64)
    (o, f), (o_tri, f_tri) = results[gluon_walk], results["triton"]
    # the Triton walk takes the prep kernel's Ai, which the specialized kernel computes in its own form, rounded
    # elsewhere: 3.4e-3 apart where h0 dominates the states (each 3.7e-3 from fp64; H100)
    near = 5e-3 if gluon_walk == "sm90_specialized" else 1e-3
    pairs = [(o, o_ref, 1e-2), (o, o_tri, near)] + ([(f, final_ref, 1e-2), (f, f_tri, near)] if final else [])
    for got, ref, tol in pairs:
        assert torch.isfinite(got).all()
        assert ((got - ref).norm() / ref.norm()).item() < tol
    if varlen and h0 and final:  # empty sequences keep their initial states
        for n in (n for n, length in enumerate(seqs) if length == 0):
            assert torch.equal(f[n], cpu["initial_state"][n].double())


@pytest.mark.skipif(not _sm90(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("scale", [2.0, -0.3, 0.0])
def test_specialized_kernel_takes_any_scale(scale):
    """The warp-specialized kernel folds log2(scale) into P's gates, so a scale of 0 or below runs as a positive one
    with the output scaled after: outputs and final states against the fp64 recurrence, on NaN-poisoned outputs."""
    from gdnbench_kernels import chunk

    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(7)
    seqs = [300, 64, 200]
    kw, N = kernel_inputs(gen, B=1, T=sum(seqs), H=2, HV=4, K=128, V=128, dtype="bf16", seqs=seqs, raw=False,
                          l2=False, gate_norm=1.0)
    kw["scale"] = scale
    kw["initial_state"] = torch.randn(N, 4, 128, 128, generator=gen)
    gpu = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    out = torch.full_like(gpu["v"], float("nan"))
    o, final = chunk.chunk_fused_gdn(**gpu, output_final_state=True, out=out, walk="sm90_specialized")
    o_ref, final_ref = gdn_recurrent(kw["q"], kw["k"], kw["v"], kw["g"], kw["beta"], scale=scale,
                                     initial_state=kw["initial_state"], cu_seqlens=kw["cu_seqlens"],
                                     compute_dtype=torch.float64)
    o, final = o.double().cpu(), final.double().cpu()
    if scale == 0.0:
        assert torch.equal(o, torch.zeros_like(o))
    else:
        assert ((o - o_ref).norm() / o_ref.norm()).item() < 1e-2
    assert ((final - final_ref).norm() / final_ref.norm()).item() < 1e-2


@pytest.mark.skipif(not _sm90(), reason="needs an sm_90 GPU")
# strong decay: warm-ups of a chunk; weak: too slow for warm-ups of 4 chunks, the whole walks take every head;
# mixed: odd heads weak, even ones strong, in one call (warm_up.mark_slow_walks)
@pytest.mark.parametrize("gate_norm", [1.0, 10.0, "mixed"])
# "sm90_specialized/sm90": the whole walks on the sm90 walk (a plan's whole_walk) beside the specialized kernel
@pytest.mark.parametrize("gluon_walk", ["sm90_transposed", "sm90_specialized", "sm90_specialized/sm90"])
@pytest.mark.parametrize("h0", [True, False])  # without: every segment starts from S = 0
@pytest.mark.parametrize("programs", [None, 7])  # 7: the specialized kernel's programs take 5 or 6 walks each
@pytest.mark.parametrize("whole_walks", [True, False])  # beside whole walks, or warm-ups as long as the decay needs
def test_walk_over_warm_up_segments_under_graph_replay(gluon_walk, gate_norm, h0, programs, whole_walks,
                                                       monkeypatch):
    """The transposed Gluon walk and the warp-specialized kernel over warm-up segments of 4 chunks, with or without
    whole walks beside them (outputs and final states; h0, if given, only where a warm-up reaches its sequence's
    start) against the Triton walk over the same segments and against the fp64 recurrence, replayed from a CUDA graph
    on NaN-poisoned outputs. Unequal sequences, one empty. programs: that many SMs, so that each of the specialized
    kernel's programs finds the warm-up starts of many walks in turn."""
    from gdnbench_kernels import chunk

    if "/" in gluon_walk and not whole_walks:
        pytest.skip("a whole walk of its own walks beside whole walks")
    if programs:
        monkeypatch.setattr(chunk.plan, "sm_count", lambda device: programs)

    dev = torch.device("cuda")
    seqs, H, HV = [1000, 0, 64, 700, 1], 2, 4
    gen = torch.Generator().manual_seed(3 if gate_norm == "mixed" else int(gate_norm))
    kw, N = kernel_inputs(gen, B=1, T=sum(seqs), H=H, HV=HV, K=128, V=128, dtype="bf16", seqs=seqs, raw=False,
                          l2=False, gate_norm=1.0 if gate_norm == "mixed" else gate_norm)
    if gate_norm == "mixed":
        kw["g"][..., 1::2] /= 100
    kw["initial_state"] = torch.randn(N, HV, 128, 128, generator=gen) if h0 else None
    kw = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    layout = chunk.ChunkLayout.build(1, sum(seqs), kw["cu_seqlens"], dev)
    segments = chunk.SegmentLayout.build(layout, 4, whole_walks)
    results = {}
    for name in (gluon_walk, "triton"):
        walk, _, whole_walk = name.partition("/")
        ws = chunk.ChunkWorkspace.allocate(layout, kw["q"], kw["v"], stages=False, raw_gate=False, fuse_output=True,
                                           final_state=True, segments=segments)
        ws.final_state.fill_(float("nan"))
        out = torch.full_like(kw["v"], float("nan"))

        def call() -> None:
            chunk.chunk_fused_gdn(**kw, output_final_state=True, layout=layout, workspace=ws, out=out,
                                  fuse_output=True, segments=segments, walk=walk, whole_walk=whole_walk or None)

        measure(call, device=dev, config=TimingConfig(timer=default_timer(dev), l2="cold", warmup=2, min_samples=5,
                                                      max_samples=10, min_time_s=0.0, max_time_s=0.2))
        torch.cuda.synchronize()
        results[name] = (out.double().cpu(), ws.final_state.double().cpu())
    cpu = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    o_ref, final_ref = gdn_recurrent(cpu["q"], cpu["k"], cpu["v"], cpu["g"], cpu["beta"], scale=cpu["scale"],
                                     initial_state=cpu["initial_state"], cu_seqlens=cpu["cu_seqlens"],
                                     compute_dtype=torch.float64)
    (o, f), (o_tri, f_tri) = results[gluon_walk], results["triton"]
    near = 5e-3 if gluon_walk.startswith("sm90_specialized") else 1e-3  # its own Ai (test_sm90_walk_under_graph_replay)
    for got, ref, tol in ((o, o_ref, 1e-2), (o, o_tri, near), (f, final_ref, 1e-2), (f, f_tri, near)):
        assert torch.isfinite(got).all()
        assert ((got - ref).norm() / ref.norm()).item() < tol
    empty = cpu["initial_state"][1].double() if h0 else torch.zeros_like(f[1])
    assert torch.equal(f[1], empty)  # the empty sequence keeps its initial state
    slow = {1.0: [0] * HV, 10.0: [1] * HV, "mixed": [0, 1] * (HV // 2)}[gate_norm]  # the long sequences' walks
    if whole_walks:
        marks, offsets = ws.slow_marks.cpu(), segments.seg_offsets.tolist()
        assert [marks[offsets[n]:offsets[n + 1]].amax(0).tolist() for n in (0, 3)] == [slow, slow]

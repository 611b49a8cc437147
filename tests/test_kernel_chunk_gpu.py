"""Every GPU candidate config of the chunked kernels, compiled and replayed from a CUDA graph (GPU only).

The interpreter tests (test_kernel_chunk.py) check the kernels' own logic; code generation can still
go wrong for one config. Triton 3.6 built chunk_fused's prep kernel at (BV 32, 4 warps, 1 stage) with a
dot that read past its shared memory: correct on a few eager calls, NaN or an illegal address under
graph replay with the L2 flushed, exactly how the harness times it. So each candidate is forced alone,
as the kernel's prune reshapes it for the launch (at D = 16 and 32 the walk with the output fused in had
a miscompiled one that only the prune produces), timed the harness's way, and its outputs are compared
with the fp64 recurrence afterwards.
"""

from __future__ import annotations

import pytest
import torch

from gdnbench.reference import gdn_recurrent
from gdnbench.timing import TimingConfig, default_timer, measure
from tests.kernel_inputs import kernel_inputs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # cpu: a dry run in the interpreter
SHORT = TimingConfig(timer=default_timer(DEVICE), l2="cold", warmup=2, min_samples=5, max_samples=20,
                     min_time_s=0.0, max_time_s=0.2)


def _candidates():
    from gdnbench_kernels import chunk

    # (module, kernel, its configs, the launcher that runs it: chunk_gdn, or chunk_fused_gdn with the
    # output pass, with the output folded into the state pass, with warm-up segments, or with the output pass
    # over pairs of chunks)
    kernels = [(chunk.prep, "fused_prep_kernel", chunk.prep.PREP_CONFIGS, "fused"),
               (chunk.state, "fused_state_kernel", chunk.state.FUSED_STATE_CONFIGS, "fused-output"),
               (chunk.state, "state_kernel", chunk.state.STATE_CONFIGS, "chunk"),
               (chunk.state, "fused_state_kernel", chunk.state.FUSED_STATE_CONFIGS, "warm-up-output"),
               (chunk.output, "output_kernel", chunk.output.OUTPUT_CONFIGS, "chunk"),
               (chunk.output, "output_span2_kernel", chunk.output.output_span2_kernel.configs, "span2")]
    return [(module, name, i, run) for module, name, configs, run in kernels for i in range(len(configs))]


def _force_config(kernel, index: int, monkeypatch) -> None:
    """Make the tuner run its index-th config the way a launch would: through the kernel's own prune,
    which reshapes configs for the launch (BV capped at V: at D = 16 every candidate becomes a BV 16 one)
    and drops some. Forcing ``configs = [c]`` alone would skip the prune and test c as written, never the
    configs a tuned call runs. Skips once the prune leaves fewer configs than index + 1."""
    configs, prune = kernel.configs, kernel.early_config_prune

    def pick(_configs, named_args):
        pruned = prune(configs, named_args) if prune else configs
        if index >= len(pruned):
            pytest.skip(f"the prune leaves {len(pruned)} configs for this launch")
        return [pruned[index]]

    assert len(configs) > 1  # else the tuner skips the prune
    monkeypatch.setattr(kernel, "early_config_prune", pick)
    monkeypatch.setattr(kernel, "cache", {})


@pytest.mark.parametrize("D", [16, 32, 60, 100, 128])
@pytest.mark.parametrize("module,name,index,run", _candidates() if torch.cuda.is_available() else [])
def test_every_candidate_under_graph_replay(module, name, index, run, D, monkeypatch):
    _force_config(getattr(module, name), index, monkeypatch)
    gen = torch.Generator().manual_seed(index)
    # gate_norm 10: decays weak enough that the warm-up walks reach back to the sequences' starts
    kw, N = kernel_inputs(gen, B=2, T=300, H=2, HV=4, K=D, V=D, dtype="bf16", seqs=None, raw=False, l2=False,
                          gate_norm=10.0)
    kw = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    from gdnbench_kernels import chunk

    layout = chunk.ChunkLayout.build(2, 300, None, DEVICE)
    segments = chunk.SegmentLayout.build(layout, 2) if run.startswith("warm-up") else None  # 3 segments a sequence
    span = 2 if run == "span2" else 1
    ws = chunk.ChunkWorkspace.allocate(layout, kw["q"], kw["v"], stages=run == "chunk", raw_gate=False,
                                       fuse_output=run.endswith("-output"), final_state=True, segments=segments,
                                       output_span=span)
    out = torch.full_like(kw["v"], float("nan"))
    if run == "chunk":
        def call() -> None:
            chunk.chunk_gdn(**kw, output_final_state=True, layout=layout, workspace=ws, out=out)
    else:
        # the Triton prep kernel, also where the Gluon one would run by default (D = 128 on an sm_90 GPU)
        prep = "triton" if name == "_chunk_prep_kernel" else None

        def call() -> None:
            chunk.chunk_fused_gdn(**kw, output_final_state=True, layout=layout, workspace=ws, out=out,
                                  fuse_output=run.endswith("-output"), segments=segments, output_span=span,
                                  prep=prep)

    measure(call, device=DEVICE, config=SHORT)
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
    o_ref, final_ref = gdn_recurrent(kw["q"].cpu(), kw["k"].cpu(), kw["v"].cpu(), kw["g"].cpu(), kw["beta"].cpu(),
                                     scale=kw["scale"], compute_dtype=torch.float64)
    for got, ref in ((out, o_ref), (ws.final_state, final_ref)):
        got = got.double().cpu()
        assert torch.isfinite(got).all()
        assert ((got - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.parametrize("fuse_output,walk", [(False, "triton"), (True, "triton"), (True, "sm90"),
                                               (True, "sm90_transposed")])
def test_a_pipelined_call_under_graph_replay_is_one_call(fuse_output, walk, monkeypatch):
    """chunk_fused's pipeline (groups of chunks of every sequence on their own streams, forked from and
    joined into the timed stream) captured and replayed as the harness times it: bitwise one call's
    results. Unequal sequences, so that later groups hold empty ranges; 5 groups, both hand-off buffers.
    With the Gluon walks for Hopper too, whose groups end mid-chunk at a sequence's end.
    One config per kernel, as written (at D = 128 no prune would reshape it): a group's tuning keys (its
    walk length, its chunks) differ from the call's, and so could its pruned configs."""
    from gdnbench_kernels import chunk

    for kernel in (chunk.prep.fused_prep_kernel, chunk.state.fused_state_kernel, chunk.state.state_kernel,
                   chunk.output.output_kernel, chunk.output.output_span2_kernel):
        monkeypatch.setattr(kernel, "configs", kernel.configs[:1])
        monkeypatch.setattr(kernel, "cache", {})

    gen = torch.Generator().manual_seed(7)
    kw, _ = kernel_inputs(gen, B=1, T=1000, H=2, HV=4, K=128, V=128, dtype="bf16", seqs=[620, 64, 316],
                          raw=False, l2=False, gate_norm=10.0)
    kw = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    gluon = chunk.sm90.GLUON_WALKS.get(walk)
    if gluon and gluon.unsupported(kw["q"], 128, False):
        pytest.skip(gluon.unsupported(kw["q"], 128, False))
    layout = chunk.ChunkLayout.build(1, 1000, kw["cu_seqlens"], DEVICE)
    span = 1 if fuse_output else 2
    results, launches = [], []
    if gluon:
        monkeypatch.setattr(gluon, "fused_walk",
                            lambda *a, real=gluon.fused_walk, **k: launches.append(a) or real(*a, **k))
    for pipe in (None, chunk.PipelineLayout.build(layout, 2)):
        ws = chunk.ChunkWorkspace.allocate(layout, kw["q"], kw["v"], stages=False, raw_gate=False,
                                           fuse_output=fuse_output, final_state=True, output_span=span,
                                           pipeline=pipe is not None)
        out = torch.full_like(kw["v"], float("nan"))

        def call() -> None:
            chunk.chunk_fused_gdn(**kw, output_final_state=True, layout=layout, workspace=ws, out=out,
                                  fuse_output=fuse_output, output_span=span, pipeline=pipe, walk=walk)

        launches.clear()
        call()  # the Gluon walk runs once per group, or not at all
        assert len(launches) == (0 if walk == "triton" else 1 if pipe is None else 5)
        measure(call, device=DEVICE, config=SHORT)
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()
        results.append((out.clone(), ws.final_state.clone()))
    assert len(chunk.PipelineLayout.build(layout, 2).groups) == 5
    (o1, f1), (o2, f2) = results
    assert torch.isfinite(o1).all() and torch.equal(o1, o2) and torch.equal(f1, f2)

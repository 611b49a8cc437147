"""triton.chunk, triton.chunk_fused and triton.chunk_specialized: the bundled chunked-prefill kernels.

``triton.chunk`` (gdnbench_kernels.chunk.chunk_gdn) is the standard chunkwise pipeline in five kernels (K K^T
and the solve in one); ``triton.chunk_fused`` (gdnbench_kernels.chunk.chunk_fused_gdn) fuses the gate, K K^T
and the triangular solve into one kernel, takes W and U's products inside the state pass instead of
storing them and, for many sequences, folds the outputs into the state pass too (and for few or
unequal long walks on a GPU, cuts them into warm-up segments);
``triton.chunk_specialized`` is chunk_fused with its prep and walk in one warp-specialized Gluon kernel
(Hopper only, gates given, q and k normalised beforehand). The others take raw gating, q/k L2 normalisation
and GVA inside the kernels, and run on a CPU in Triton's interpreter. The chunk layout (from cu_seqlens, read on
the host) and every intermediate buffer are built here, outside the timed call, which then neither allocates nor
syncs.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from gdnbench.backends.base import Outputs, Prepared, backend
from gdnbench.problem import DTYPES, Problem
from gdnbench.suite import Case

CHUNK_KERNEL = "gdnbench_kernels.chunk"


def _check(case: Case, device: torch.device) -> str | None:
    # Triton decides between compiling and interpreting when a kernel module is imported (every stage
    # module is imported with the chunk package): if that happened before
    # TRITON_INTERPRET=1 was set, the kernels were compiled for a GPU that is not there.
    loaded = sys.modules.get(CHUNK_KERNEL)
    if device.type == "cpu" and loaded is not None and not loaded.INTERPRETED:
        return f"{CHUNK_KERNEL} was imported before TRITON_INTERPRET=1 was set"
    return None


def _prepare(p: Problem, *, fused: bool, fuse_output: bool | None = None,
             segment_chunks: int | None = None, output_span: int | None = None,
             pipeline_chunks: int | None = None, walk: str | None = None, prep: str | None = None) -> Prepared:
    """fuse_output (fused variant only): fold the output pass into the state pass; None: the kernel's
    default rule (``chunk.plan.fuse_output_default``). The backends take the defaults; sweeps set them.
    segment_chunks (fused only): the state walk over warm-up segments of that many chunks (``chunk.SegmentLayout``);
    None: warm-up segments where the kernel's default rule says so (``chunk.plan.plan_segments``) unless
    fuse_output, walk or pipeline_chunks is given; 0: the sequential walk.
    output_span (fused only): chunks per output-pass block, 1 or 2; None: ``chunk.plan.output_span_default``.
    pipeline_chunks (fused only, no segments): prep, walk and output pass (or the walk with the output fused
    in) in groups of that many chunks of every sequence, overlapped on their own streams
    (``chunk.PipelineLayout``); None: the kernel's default rule (``chunk.plan.pipeline_default``),
    0: one call. walk (fused only): "triton", or a Gluon walk on Hopper, "sm90" or "sm90_transposed"
    (``chunk.sm90.GLUON_WALKS``; the output fused in) or "sm90_specialized" (prep and walk in one kernel);
    None: the kernel's default rule (``chunk.plan.plan_walk``: the Triton walk when fuse_output is False).
    prep (fused only): "triton", or "sm90" for the Gluon prep kernel on Hopper; None: ``chunk.plan.plan_prep``."""
    from gdnbench_kernels import chunk

    case = p.case
    raw = case.gating == "raw"
    gating: dict[str, Any] = (dict(a=p.a, b=p.b, A_log=p.A_log, dt_bias=p.dt_bias) if raw
                              else dict(g=p.g, beta=p.beta))
    layout = chunk.ChunkLayout.build(p.q.shape[0], p.q.shape[1], p.cu_seqlens, p.device)
    if segment_chunks is None and fused and fuse_output is None and walk is None and pipeline_chunks is None:
        segment_chunks = chunk.plan.plan_segments(layout, p.q, case.V, case.HV, p.qk_l2norm_in_kernel, raw)
    segments = chunk.SegmentLayout.build(layout, segment_chunks) if segment_chunks else None
    walk, fuse_output = (chunk.plan.plan_walk(layout, p.q, case.V, case.HV, p.qk_l2norm_in_kernel, segments, walk,
                                              fuse_output, raw_gate=raw, prep=prep) if fused else ("triton", False))
    prep = chunk.plan.plan_prep(p.k, raw, p.qk_l2norm_in_kernel, prep, walk) if fused else "triton"
    if output_span is None:
        output_span = chunk.plan.output_span_default(layout, case.HV, case.K, segments)
    span = output_span if fused and not fuse_output else 1
    if pipeline_chunks is None:
        pipeline_chunks = chunk.plan.pipeline_default(layout, case.HV, fuse_output, segments, walk) if fused else None
    pipeline = chunk.PipelineLayout.build(layout, pipeline_chunks) if pipeline_chunks else None
    ws = chunk.ChunkWorkspace.allocate(layout, p.q, p.v, stages=not fused, raw_gate=raw, fuse_output=fuse_output,
                                       final_state=case.output_final_state, segments=segments, output_span=span,
                                       pipeline=pipeline is not None)
    o = torch.empty(*p.v.shape[:3], case.V, dtype=p.q.dtype, device=p.device)  # written by every call
    kw: dict[str, Any] = dict(gating, scale=p.scale, initial_state=p.initial_state,
                              output_final_state=case.output_final_state, cu_seqlens=p.cu_seqlens, layout=layout,
                              qk_l2norm=p.qk_l2norm_in_kernel, out=o, workspace=ws)
    if fused:
        def call() -> None:
            chunk.chunk_fused_gdn(p.q, p.k, p.v, **kw, fuse_output=fuse_output, segments=segments,
                                        output_span=span, pipeline=pipeline, walk=walk, prep=prep)

        kernels = "gate+kkt+solve in one, W/U in the state pass" + (
            f", state pass over warm-up segments of {segment_chunks} chunks" if segments
            else "") + (
            f", pipelined in groups of {pipeline_chunks} chunks" if pipeline else "")
        configs = chunk.state.FUSED_STATE_CONFIGS
    else:
        def call() -> None:
            chunk.chunk_gdn(p.q, p.k, p.v, **kw)

        kernels = "gate, kkt+solve, wu"
        configs = chunk.state.STATE_CONFIGS

    if len(configs) > 1:  # autotune (or hit its cache) now, untimed, so the row says which config runs
        call()
    describe = (chunk.describe_fused(fuse_output=fuse_output, output_span=span, walk=walk, prep=prep) if fused
                else chunk.describe(fuse_output=False))
    notes = [f"gdnbench triton chunk{'_fused' if fused else ''}: {kernels}, {describe}"]
    if raw:
        notes.append("raw gating fused")
    if p.qk_l2norm_in_kernel:
        notes.append("q/k l2norm in kernel")
    if chunk.INTERPRETED:
        notes.append("triton interpreter")
    outputs = lambda: Outputs(o=o, final_state=ws.final_state if case.output_final_state else None)  # noqa: E731
    return Prepared(call=call, outputs=outputs, path="; ".join(notes))


_ENVELOPE: dict[str, Any] = dict(ops={"prefill"}, devices={"cpu", "cuda"}, gating={"pre", "raw"}, max_head_dim=256,
                                 package="triton", check=_check, triton=True)


@backend("triton.chunk", requires=(CHUNK_KERNEL,), **_ENVELOPE)
def triton_chunk(p: Problem) -> Prepared:
    """Bundled Triton chunked prefill, one kernel per stage (C=64, as FLA's pipeline)."""
    return _prepare(p, fused=False)


@backend("triton.chunk_fused", requires=(CHUNK_KERNEL,), **_ENVELOPE)
def triton_chunk_fused(p: Problem) -> Prepared:
    """Bundled Triton chunked prefill, gate+K K^T+solve fused, W/U in the state pass (and the output pass for
    many sequences; warm-up segments, the output in their walk, for few or unequal long walks on a GPU)."""
    return _prepare(p, fused=True)


def _check_specialized(case: Case, device: torch.device) -> str | None:
    from gdnbench_kernels import chunk

    why = _check(case, device)
    if why:
        return why
    probe = torch.empty(0, case.K, dtype=DTYPES[case.dtype], device=device)  # the kernel's own envelope
    return chunk.sm90.specialized.unsupported(probe, case.V, case.gating == "raw", case.qk_l2norm == "kernel")


@backend("triton.chunk_specialized", requires=(CHUNK_KERNEL,), **dict(_ENVELOPE, devices={"cuda"}, gating={"pre"},
                                                                       check=_check_specialized))
def triton_chunk_specialized(p: Problem) -> Prepared:
    """triton.chunk_fused with the prep and the walk in one warp-specialized Gluon kernel (an H100/H200, K = V =
    128, gates given, q and k normalised beforehand) on every case, where triton.chunk_fused takes it on 128+ walks
    that keep one program a SM busy only (chunk.plan.walk_default): slower on fewer walks or where one long walk
    sets the pace."""
    return _prepare(p, fused=True, walk="sm90_specialized")

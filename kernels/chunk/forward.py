"""The chunked gated delta rule prefill: the multi-kernel pipeline (``chunk_gdn``) and the fused one
(``chunk_fused_gdn``), each a sequence of stage launches over a prepared layout and workspace."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..common.tuning import TunedKernel
from ..recurrent import recurrent_gdn
from .configs import config_str, tile_width
from .gate import chunk_gate_kernel
from .launch import Launch, prepare_launch
from .layout import CHUNK, ChunkLayout, ChunkWorkspace, PipelineLayout, SegmentLayout
from .output import output_kernel_for, output_pass
from .pipeline import pipeline_streams, run_pipelined
from .plan import RECURRENT, ChunkPlan, make_plan, specialized_order
from .prep import fused_prep_kernel, kkt_solve_kernel, run_prep
from .sm90 import GLUON_WALKS, SPECIALIZED
from .sm90 import prep as sm90_prep
from .sm90 import specialized as sm90_specialized
from .state import fused_state_kernel, state_kernel, state_pass, walk_with_output
from .warm_up import SlowWalks, mark_slow_walks
from .wu import wu_kernel


def _state_and_output(x: Launch, kernel: TunedKernel, *, fuse_output: bool, output_final_state: bool) -> None:
    """(d), and (e) over blocks of x.span chunks unless the output is fused into (d). kernel: a TunedKernel of
    the state pass."""
    lay, ws = x.lay, x.ws
    final = ws.final_state if output_final_state else None
    state_pass(x, kernel, lay, x.h0, final, fuse=fuse_output)
    if not fuse_output:
        output_pass(x, output_kernel_for(x.span), lay)


def _walk_segments(x: Launch, prep: str, segments: SegmentLayout,
                   walk: Callable[[SlowWalks, SegmentLayout | None], None]) -> None:
    """The prep, then the walk with the output fused in over warm-up segments beside the whole sequences of the walks
    whose decay is too slow for them (``warm_up.mark_slow_walks``): walk(slow, segments or None for the whole
    sequences). On a GPU the marks are made beside the prep, and the whole walks run beside the segments, on a stream
    of their own at a higher priority (so that they start first), forked from and joined back into the caller's: the
    call's critical path keeps its two launches."""
    if x.q.device.type != "cuda":
        run_prep(x, x.lay, prep)
        slow = mark_slow_walks(x, segments)
        walk(slow, None)
        walk(slow, segments)
        return
    main, side = torch.cuda.current_stream(x.q.device), pipeline_streams(x.q.device)[0]
    side.wait_stream(main)
    with torch.cuda.stream(side):
        slow = mark_slow_walks(x, segments)
    run_prep(x, x.lay, prep)
    main.wait_stream(side)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        walk(slow, None)
    walk(slow, segments)
    main.wait_stream(side)


def _segments_then_whole_walks(x: Launch, slow: SlowWalks, whole_walk: str, final: Tensor | None,
                                segments_walk: Callable[[], None]) -> None:
    """``segments_walk``, the warm-up segments of the walks that ``slow`` does not mark, then the walks it marks,
    whole: the Gluon prep of their chunks alone and the Gluon walk ``whole_walk``. One after the other on the
    caller's stream: each kernel's persistent programs take the SMs, so that side by side on two streams the later
    kernel's programs queue behind the earlier's (docs/decisions/0022-slow-decay-walks.md)."""
    segments_walk()
    run_prep(x, x.lay, "sm90", slow=slow)
    walk_with_output(x, x.lay, x.h0, final, whole_walk, None, slow)


def chunk_gdn(
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
) -> tuple[Tensor, Tensor | None]:
    """Chunked gated delta rule prefill, one kernel per stage (five launches).

    q, k [B, T, H, K]; v [B, T, HV, V]; HV a multiple of H; K, V <= 256. Gating: g (log decay, fp32) and
    beta (post-sigmoid) [B, T, HV], or raw a, b [B, T, HV] with A_log, dt_bias [HV]. Varlen: B = 1 and
    cu_seqlens [N + 1] int64. initial_state [N, HV, K, V] fp32 (K-first). ``layout`` (from
    ``ChunkLayout.build``), ``workspace`` (``ChunkWorkspace.allocate(..., stages=True)``) and ``out``
    prebuilt make the call free of host syncs and allocations (CUDA-graph capturable); without them
    they are built here (cu_seqlens is then read on the host). Returns (o [B, T, HV, V] in q's dtype,
    final_state [N, HV, K, V] fp32 or None).
    """
    x = prepare_launch(q, k, v, g, beta, a, b, A_log, dt_bias, scale=scale, initial_state=initial_state,
                       output_final_state=output_final_state, cu_seqlens=cu_seqlens, layout=layout, qk_l2norm=qk_l2norm,
                       out=out, workspace=workspace, stages=True, fuse_output=False)
    lay, ws = x.lay, x.ws
    if lay.NT:
        grid = (lay.NT * x.HV,)
        beta_f = ws.beta if x.raw else x.beta
        chunk_gate_kernel[grid](x.g, x.beta, x.a, x.b, x.A_log, x.dt_bias, ws.gc, ws.beta, lay.seq_bounds,
                                lay.chunk_indices, HV=x.HV, BT=CHUNK, RAW_GATE=x.raw, num_warps=1)
        kkt_solve_kernel[grid](x.k, beta_f, ws.gc, ws.A_diag, ws.Ai, lay.seq_bounds, lay.chunk_indices,
                               H=x.H, HV=x.HV, K=x.K, BT=CHUNK, BK=x.BK, L2NORM=x.l2norm, FP32=x.fp32,
                               num_warps=4, num_stages=1)
        wu_kernel[grid](x.k, x.v, beta_f, ws.gc, ws.Ai, ws.W, ws.U, lay.seq_bounds, lay.chunk_indices,
                        H=x.H, HV=x.HV, K=x.K, V=x.V, BT=CHUNK, BK=x.BK, BV=min(64, tile_width(x.V)),
                        L2NORM=x.l2norm, FP32=x.fp32, num_warps=8, num_stages=2)
    _state_and_output(x, state_kernel, fuse_output=False, output_final_state=output_final_state)
    return x.out, ws.final_state if output_final_state else None


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
    plan: ChunkPlan | None = None,
    walk: str | None = None,
    prep: str | None = None,
    fuse_output: bool | None = None,
    output_span: int | None = None,
    segments: SegmentLayout | None = None,
    pipeline: PipelineLayout | None = None,
    whole_walk: str | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Chunked gated delta rule prefill in two or three launches; arguments and result as ``chunk_gdn``'s.
    plan: how the call runs (``plan.default_plan`` or ``plan.make_plan``, made once on the host; a prebuilt
    workspace from ``plan.workspace``); None: ``plan.make_plan`` of this call with the fields given here
    forced (walk, prep, fuse_output, output_span, segments, pipeline, whole_walk: see ``plan.ChunkPlan``). The
    plan is executed as it stands.
    """
    lay = ChunkLayout.build(q.shape[0], q.shape[1], cu_seqlens, q.device) if layout is None else layout
    fields = dict(walk=walk, prep=prep, fuse_output=fuse_output, output_span=output_span, segments=segments,
                  pipeline=pipeline, whole_walk=whole_walk)
    if plan is None:
        plan = make_plan(lay, q, k, v.shape[3], v.shape[2], raw_gate=a is not None, qk_l2norm=qk_l2norm, **fields)
    elif any(value is not None for value in fields.values()):
        raise ValueError("a plan is given: its fields come from the plan, not from the call")
    if not plan.fused:
        raise ValueError("the multi-kernel pipeline's plan runs through chunk_gdn")
    if plan.walk == RECURRENT:  # no chunks: of the workspace only the final state is used
        final = workspace.final_state if workspace is not None and output_final_state else None
        return recurrent_gdn(q, k, v, g, beta, a=a, b=b, A_log=A_log, dt_bias=dt_bias, scale=scale,
                             initial_state=initial_state, output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                             qk_l2norm=qk_l2norm, out=out, final_state=final)
    x = prepare_launch(q, k, v, g, beta, a, b, A_log, dt_bias, scale=scale, initial_state=initial_state,
                       output_final_state=output_final_state, cu_seqlens=cu_seqlens, layout=lay, qk_l2norm=qk_l2norm,
                       out=out, workspace=workspace, stages=False, fuse_output=plan.fuse_output,
                       segments=plan.segments, output_span=plan.output_span, pipeline=plan.pipeline is not None)
    final = x.ws.final_state if output_final_state else None
    whole_walks = plan.segments is not None and plan.segments.whole_walks
    if plan.pipeline is not None:
        run_pipelined(x, plan.pipeline, plan.fuse_output, output_final_state, plan.walk, plan.prep)
    elif plan.walk == SPECIALIZED:  # whole walks in the same launch (SegmentLayout.walks) unless plan.whole_walk
        slow = mark_slow_walks(x, plan.segments) if whole_walks else None
        order = specialized_order(lay, x.HV, q.device, plan.segments, whole=plan.whole_walk is None)

        def segments_walk() -> None:
            sm90_specialized.chunk_specialized(x.q, x.k, x.v, x.g, x.beta, x.out, x.h0, final, order, x.scale,
                                               warm_up=plan.segments is not None, slow=slow)

        if plan.whole_walk is None:
            segments_walk()
        else:
            _segments_then_whole_walks(x, slow, plan.whole_walk, final, segments_walk)
    elif whole_walks:
        _walk_segments(x, plan.prep, plan.segments,
                       lambda slow, segments: walk_with_output(x, lay, x.h0, final, plan.walk, segments, slow))
    else:
        run_prep(x, lay, plan.prep)
        if plan.walk in GLUON_WALKS or plan.segments is not None:
            walk_with_output(x, lay, x.h0, final, plan.walk, plan.segments)
        else:
            _state_and_output(x, fused_state_kernel if plan.fuse_output else state_kernel,
                              fuse_output=plan.fuse_output, output_final_state=output_final_state)
    return x.out, x.ws.final_state if output_final_state else None


def describe(plan: ChunkPlan) -> str:
    """What a plan runs and the configs its tuned kernels ran last, for a result row's path."""
    if not plan.fused:
        return "gate, kkt+solve, wu, " + _passes(state_kernel, fuse_output=False, output_span=1)
    if plan.walk == RECURRENT:
        return "token by token in the recurrent kernel (sequences too short for chunks to pay)"
    kernels = "gate+kkt+solve in one, W/U in the state pass" + (
        f", state pass over warm-up segments of {plan.segments.chunks} chunks" if plan.segments else "") + (
        " beside whole walks of the heads too slow for them" if plan.segments and plan.segments.whole_walks else "") + (
        f", pipelined in groups of {plan.pipeline.chunks} chunks" if plan.pipeline else "")
    if plan.walk == SPECIALIZED:
        then = "" if plan.whole_walk is None else (
            f", then the whole walks: {sm90_prep.describe()} of their chunks, "
            f"{GLUON_WALKS[plan.whole_walk].describe()}")
        return f"{kernels}, {sm90_specialized.describe()}{then}"
    prep = sm90_prep.describe() if plan.prep == "sm90" else f"prep[{config_str(fused_prep_kernel)}]"
    if plan.walk in GLUON_WALKS:
        return f"{kernels}, {prep}, {GLUON_WALKS[plan.walk].describe()}"
    walk_kernel = fused_state_kernel if plan.fuse_output else state_kernel
    return f"{kernels}, {prep}, " + _passes(walk_kernel, fuse_output=plan.fuse_output, output_span=plan.output_span)


def _passes(kernel: TunedKernel, *, fuse_output: bool, output_span: int) -> str:
    """The state (and output) pass configs of the latest launch."""
    state = f"state[{config_str(kernel)}]"
    if fuse_output:
        return state + "+output fused"
    per = "" if output_span == 1 else f" per {output_span} chunks"
    return state + f", output{per}[{config_str(output_kernel_for(output_span))}]"

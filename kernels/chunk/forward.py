"""The chunked gated delta rule prefill: the multi-kernel pipeline (``chunk_gdn``) and the fused one
(``chunk_fused_gdn``), each a sequence of stage launches over a prepared layout and workspace."""

from __future__ import annotations

from torch import Tensor

from ..common.tuning import TunedKernel
from .configs import config_str, tile_width
from .gate import chunk_gate_kernel
from .launch import Launch, prepare_launch
from .layout import CHUNK, ChunkLayout, ChunkWorkspace, SegmentLayout
from .output import output_kernel_for, output_pass
from .pipeline import PipelineLayout, run_pipelined
from .plan import output_span_default, plan_prep, plan_walk, specialized_order
from .prep import fused_prep_kernel, kkt_solve_kernel, run_prep
from .sm90 import GLUON_WALKS, SPECIALIZED
from .sm90 import prep as sm90_prep
from .sm90 import specialized as sm90_specialized
from .state import fused_state_kernel, state_kernel, state_pass, walk_with_output
from .wu import wu_kernel


def _state_and_output(x: Launch, kernel: TunedKernel, *, fuse_output: bool, output_final_state: bool,
                      segments: SegmentLayout | None = None) -> None:
    """(d), and (e) over blocks of x.span chunks unless the output is fused into (d); with ``segments``, (d)
    over warm-up segments. kernel: a TunedKernel of the state pass."""
    lay, ws = x.lay, x.ws
    final = ws.final_state if output_final_state else None
    if segments is None:
        state_pass(x, kernel, lay, x.h0, final, fuse=fuse_output)
    else:
        state_pass(x, kernel, segments.layout, x.h0, final, fuse=fuse_output, seg_parent=segments.parent)
    if not fuse_output:
        output_pass(x, output_kernel_for(x.span), lay)


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
                               H=x.H, HV=x.HV, K=x.K, BT=CHUNK, BK=x.BK, L2NORM=x.l2norm, IEEE=x.ieee,
                               num_warps=4, num_stages=1)
        wu_kernel[grid](x.k, x.v, beta_f, ws.gc, ws.Ai, ws.W, ws.U, lay.seq_bounds, lay.chunk_indices,
                        H=x.H, HV=x.HV, K=x.K, V=x.V, BT=CHUNK, BK=x.BK, BV=min(64, tile_width(x.V)),
                        L2NORM=x.l2norm, IEEE=x.ieee, num_warps=8, num_stages=2)
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
    the walk over warm-up segments, all at once, instead of one walk over each sequence's chunks. output_span: chunks
    per output-pass block, 1 or 2 (the state is stored once per block; a workspace allocated with the
    same ``output_span``); None: ``output_span_default(layout, HV, K, segments)``; 1 with fuse_output.
    pipeline (``PipelineLayout.build`` of this layout): prep, walk and output pass (or the walk with the
    output fused in) group by group, overlapped on their own streams (a workspace allocated with
    ``pipeline=True``); never with segments. walk: "triton", or a Gluon walk for Hopper (the output fused in):
    "sm90" (sm90_walk, no segments) or "sm90_transposed" (sm90_walk_transposed, also over warm-up
    segments); or SPECIALIZED, the prep and the walk in one kernel (sm90_specialized: also over warm-up
    segments, no pipeline, prep None); None: the default (``plan_walk``). prep: "triton", or "sm90"
    for the Gluon prep kernel of sm90_prep (Hopper; gates given, no in-kernel L2 norm); None: the default
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
    x = prepare_launch(q, k, v, g, beta, a, b, A_log, dt_bias, scale=scale, initial_state=initial_state,
                       output_final_state=output_final_state, cu_seqlens=cu_seqlens, layout=lay, qk_l2norm=qk_l2norm,
                       out=out, workspace=workspace, stages=False, fuse_output=fuse, segments=segments, output_span=span,
                       pipeline=pipeline is not None)
    if pipeline is not None:
        run_pipelined(x, pipeline, fuse, output_final_state, walk, prep)
    elif walk == SPECIALIZED:
        sm90_specialized.chunk_specialized(x.q, x.k, x.v, x.g, x.beta, x.out, x.h0,
                                           x.ws.final_state if output_final_state else None,
                                           specialized_order(lay, HV, q.device, segments), x.scale,
                                           warm_up=segments is not None)
    else:
        run_prep(x, lay, prep)
        if walk in GLUON_WALKS:
            walk_with_output(x, lay, x.h0, x.ws.final_state if output_final_state else None, walk, segments)
        else:
            _state_and_output(x, fused_state_kernel if fuse else state_kernel, fuse_output=fuse,
                              output_final_state=output_final_state, segments=segments)
    return x.out, x.ws.final_state if output_final_state else None


def describe(kernel: TunedKernel | None = None, *, fuse_output: bool = False, output_span: int = 1) -> str:
    """The state (and output) pass configs of the latest launch, for a result row's path."""
    state = f"state[{config_str(kernel or state_kernel)}]"
    if fuse_output:
        return state + "+output fused"
    per = "" if output_span == 1 else f" per {output_span} chunks"
    return state + f", output{per}[{config_str(output_kernel_for(output_span))}]"


def describe_fused(*, fuse_output: bool, output_span: int = 1, walk: str = "triton", prep: str = "triton") -> str:
    """The prep, state (and output) pass configs of the latest fused launch, for a result row's path."""
    if walk == SPECIALIZED:
        return sm90_specialized.describe()
    prep_str = sm90_prep.describe() if prep == "sm90" else f"prep[{config_str(fused_prep_kernel)}]"
    if walk in GLUON_WALKS:
        return f"{prep_str}, {GLUON_WALKS[walk].describe()}"
    return f"{prep_str}, " + describe(fused_state_kernel if fuse_output else None, fuse_output=fuse_output,
                                      output_span=output_span)

"""A launch's validated arguments, its layout, workspace and output filled in (``prepare_launch``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..common.inputs import check_inputs, output_buffer
from .configs import tile_width
from .layout import CHUNK, ChunkLayout, ChunkWorkspace, SegmentLayout


@dataclass
class Launch:
    """A launch's validated arguments (tensors contiguous, flat over tokens where kernels index them)."""

    q: Tensor
    k: Tensor
    v: Tensor
    g: Tensor | None
    beta: Tensor | None
    a: Tensor | None
    b: Tensor | None
    A_log: Tensor | None
    dt_bias: Tensor | None
    h0: Tensor | None
    out: Tensor
    ws: ChunkWorkspace
    lay: ChunkLayout
    scale: float
    H: int
    HV: int
    K: int
    V: int
    BK: int
    l2norm: bool
    fp32: bool  # fp32 operands: dots as three tensor-core products of split operands (device.dot)
    span: int  # chunks per output block
    stages: bool  # the multi-kernel pipeline (W and U stored), else the fused pipeline's (Ai diag(beta) stored)

    @property
    def raw(self) -> bool:
        return self.a is not None


def prepare_launch(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor | None, a: Tensor | None,
                   b: Tensor | None, A_log: Tensor | None, dt_bias: Tensor | None, *, scale: float,
                   initial_state: Tensor | None, output_final_state: bool, cu_seqlens: Tensor | None,
                   layout: ChunkLayout | None, qk_l2norm: bool, out: Tensor | None, workspace: ChunkWorkspace | None,
                   stages: bool, fuse_output: bool, segments: SegmentLayout | None = None, output_span: int = 1,
                   pipeline: bool = False) -> Launch:
    """Validate a launch of either variant and fill in its layout, workspace and output."""
    B, T, H, K, HV, V = check_inputs(q, k, v, g, beta, a, b, A_log, dt_bias,
                                     head_dim_limit="one key tile per chunk")
    lay = ChunkLayout.build(B, T, cu_seqlens, q.device) if layout is None else layout
    if layout is not None and (tuple(layout.seq_bounds.shape) != (lay.N, 2) or lay.tokens != B * T or
                               tuple(lay.chunk_indices.shape) != (lay.NT, 2) or
                               lay.chunk_offsets.numel() != lay.N + 1 or
                               (cu_seqlens is None and lay.N != B) or (cu_seqlens is not None and B != 1)):
        # a layout of a longer batch would send every kernel past the ends of this one's buffers
        raise ValueError("layout does not describe this batch")
    if lay.max_len * HV * max(K, V, CHUNK) >= 2**31:
        # tiles index rows inside a sequence in int32 (64-bit pointer math per element costs registers)
        raise ValueError(f"a sequence of {lay.max_len} tokens x {HV} heads x {max(K, V)} overflows int32 offsets")
    if initial_state is not None and initial_state.shape != (lay.N, HV, K, V):
        raise ValueError(f"initial_state must be [N, HV, K, V] = {(lay.N, HV, K, V)}")
    if segments is not None and (segments.layout.tokens != lay.tokens or segments.seg_offsets.numel() != lay.N + 1):
        raise ValueError("segments must cut this batch's layout")
    if segments is not None and output_span != 1:  # a segment may end inside a pair of the batch's chunks
        raise ValueError("warm-up segments store the state of no chunk (output_span 1)")
    if segments is not None and not fuse_output:
        # its warm-up chunks belong to the segment before, whose entering states are never stored
        raise ValueError("warm-up segments compute the outputs in the state pass (fuse_output=True)")
    ws = workspace or ChunkWorkspace.allocate(lay, q, v, stages=stages, raw_gate=a is not None,
                                              fuse_output=fuse_output, final_state=output_final_state,
                                              segments=segments, output_span=output_span, pipeline=pipeline)
    missing = [name for name, need in (("W", stages), ("U", stages), ("beta", stages and a is not None),
                                       ("h", not fuse_output), ("v_new", not fuse_output),
                                       ("final_state", output_final_state), ("handoff", pipeline),
                                       ("slow_marks", segments is not None and segments.whole_walks))
               if need and getattr(ws, name) is None]
    if missing or ws.Ai.shape != (B * T, HV, CHUNK) or ws.Ai.dtype != q.dtype or \
            (stages and (ws.W.shape != (B * T, HV, K) or ws.U.shape != (B * T, HV, V))) or \
            (not fuse_output and ws.h.shape[0] != lay.blocks(output_span)[0]) or \
            (segments is not None and segments.whole_walks and ws.slow_marks.shape != (segments.layout.N, HV)):
        raise ValueError(f"workspace does not fit this call (missing {missing})" if missing
                         else "workspace was allocated for another problem size or dtype")
    out = output_buffer(out, q, B, T, HV, V)

    def flat(x: Tensor | None) -> Tensor | None:
        return None if x is None else x.contiguous()

    return Launch(q=q.contiguous(), k=k.contiguous(), v=v.contiguous(), g=flat(g), beta=flat(beta), a=flat(a),
                  b=flat(b), A_log=flat(A_log), dt_bias=flat(dt_bias),
                  h0=None if initial_state is None else initial_state.contiguous().float(),
                  out=out, ws=ws, lay=lay, scale=scale, H=H, HV=HV, K=K, V=V,
                  BK=tile_width(K), l2norm=qk_l2norm, fp32=q.dtype == torch.float32, span=output_span,
                  stages=stages)


def shape_constexprs(x: Launch) -> dict:
    """The constexpr shape arguments every state and output pass launch takes."""
    return dict(H=x.H, HV=x.HV, K=x.K, V=x.V, BT=CHUNK, BK=x.BK, L2NORM=x.l2norm, FP32=x.fp32)

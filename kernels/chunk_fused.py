"""Chunked gated delta rule (prefill), Triton: the fused variant of ``chunk`` (same math, fewer trips).

Two or three launches instead of six:

  1. ``_chunk_prep_kernel``, per (chunk, value head): the gate (raw gating's -exp(A_log) *
     softplus(a + dt_bias) and sigmoid(b) included), its chunk-local cumsum, the ten 16 x 16 lower
     blocks of A = strictLower(diag(beta)(Gamma o K K^T)), their block inverse and W, U: A, its
     inverse and beta never leave registers. Stores gc (fp32), W and U (input dtype). This removes
     four launches and the A (fp32), Ai and beta round trips of ``chunk``'s stages (a)-(d).
  2. ``chunk``'s state pass, with its own candidate list: BV 16 joins 32 and 64, which doubles the
     programs a long single sequence gets (B=1, HV=32, V=128: 256 instead of 128 on 132 SMs), the
     pass that bounds that case.
  3. ``chunk``'s output pass; or, for short sequences (``fuse_output``, default: every sequence at
     most FUSE_OUTPUT_MAX_LEN tokens), the outputs are computed inside the state pass: one launch
     less and no h / v_new round trip, paid for with Q K^T recomputed once per V-block and no
     parallelism over chunks, which only long sequences need.

What each should buy on Hopper (to be measured): (1) the parity table's small cases are launch and
latency bound (27-118 us for six launches of FLA): 4 fewer launches and ~(4 + 2 x 2) bytes less
traffic per token and head; (3) another launch and the h write + read (2 x K x V bytes per chunk and
head, as much as all inputs together at C = 64, K = V = 128 in bf16) on short sequences; (2) up to 2x
on the state pass of B=1 T=65536. The chunk-parallel state pass (per-chunk transitions combined by a
scan) would attack that case further and is not implemented.

The prep kernel runs with 8 warps (at 4 it spills ~300 bytes per thread at K = 128 on sm_90).
The K K^T of the fused kernel is ten 16-row dots rather than one 64 x 64 (m16n8k16 MMAs instead of
a wgmma): the same FLOPs in pieces that the block inverse can use straight from registers.
Shared code (device functions, the state and output kernels, validation, the layout and workspace)
lives in ``chunk``.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from .chunk import (CHUNK, ChunkLayout, ChunkWorkspace, _cast, _chunk_bounds, _chunk_state_fn, _configs, _dot,
                    _gate_rows, _invert_blocks, _kkt_block, _load_qk, _load_tile, _setup, _state_and_output,
                    _state_prune, _store_tile, _tile_width)
from .chunk import describe as _describe

__all__ = ["chunk_fused_gdn", "FUSE_OUTPUT_MAX_LEN", "describe"]

# Output fused into the state pass when no sequence is longer than this (16 chunks): a guess to be
# tuned on a GPU; past it the parallel output pass's extra launch is cheap next to the sequential walk.
FUSE_OUTPUT_MAX_LEN = 1024

# 8 warps: the state pass with the output fused in holds q, k, Q K^T and the state at once
STATE_CONFIGS = _configs([(16, 4, 2), (32, 4, 2), (32, 8, 2), (64, 8, 3)])
_state_kernel = triton.autotune(configs=STATE_CONFIGS, key=["K", "V", "FUSE_OUTPUT", "state_tier"],
                                prune_configs_by={"early_config_prune": _state_prune})(_chunk_state_fn)


@triton.jit
def _gate_block16(g, beta, a, b, A_log, dt_bias, bos, rows, n_tok, carry, i_h, HV: tl.constexpr,
                  RAW_GATE: tl.constexpr):
    """(gc, beta, carry out) of 16 rows: gc continues the chunk's cumulative decay from carry."""
    b_g, b_beta = _gate_rows(g, beta, a, b, A_log, dt_bias, bos + rows, rows < n_tok, i_h, HV, RAW_GATE)
    return tl.cumsum(b_g, 0) + carry, b_beta, carry + tl.sum(b_g, 0)


@triton.jit
def _tril_apply(X00, X10, X11, X20, X21, X22, X30, X31, X32, X33, R0, R1, R2, R3, IEEE: tl.constexpr):
    """The four 16-row blocks of X R for a block lower triangular X (fp32 blocks, cast to R's dtype)."""
    dt = R0.dtype
    Y0 = _dot(_cast(X00, dt), R0, IEEE)
    Y1 = _dot(_cast(X10, dt), R0, IEEE) + _dot(_cast(X11, dt), R1, IEEE)
    Y2 = _dot(_cast(X20, dt), R0, IEEE) + _dot(_cast(X21, dt), R1, IEEE) + _dot(_cast(X22, dt), R2, IEEE)
    Y3 = (_dot(_cast(X30, dt), R0, IEEE) + _dot(_cast(X31, dt), R1, IEEE) + _dot(_cast(X32, dt), R2, IEEE)
          + _dot(_cast(X33, dt), R3, IEEE))
    return Y0, Y1, Y2, Y3


@triton.jit
def _chunk_prep_kernel(k, v, g, beta, a, b, A_log, dt_bias, gc, W, U, cu_seqlens, chunk_indices,
                       H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                       BK: tl.constexpr, BV: tl.constexpr, RAW_GATE: tl.constexpr, L2NORM: tl.constexpr,
                       IEEE: tl.constexpr):
    # The chunk is four blocks of 16 rows throughout, so the block inverse needs no slicing.
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    bos, i_t, n_tok = _chunk_bounds(cu_seqlens, chunk_indices, i_c)
    r = tl.arange(0, 16)
    r0, r1, r2, r3 = i_t * BT + r, i_t * BT + 16 + r, i_t * BT + 32 + r, i_t * BT + 48 + r

    gc0, be0, carry = _gate_block16(g, beta, a, b, A_log, dt_bias, bos, r0, n_tok, 0.0, i_h, HV, RAW_GATE)
    gc1, be1, carry = _gate_block16(g, beta, a, b, A_log, dt_bias, bos, r1, n_tok, carry, i_h, HV, RAW_GATE)
    gc2, be2, carry = _gate_block16(g, beta, a, b, A_log, dt_bias, bos, r2, n_tok, carry, i_h, HV, RAW_GATE)
    gc3, be3, carry = _gate_block16(g, beta, a, b, A_log, dt_bias, bos, r3, n_tok, carry, i_h, HV, RAW_GATE)
    tl.store(gc + (bos + r0) * HV + i_h, gc0, mask=r0 < n_tok)
    tl.store(gc + (bos + r1) * HV + i_h, gc1, mask=r1 < n_tok)
    tl.store(gc + (bos + r2) * HV + i_h, gc2, mask=r2 < n_tok)
    tl.store(gc + (bos + r3) * HV + i_h, gc3, mask=r3 < n_tok)

    base_k = k + bos * H * K + (i_h // (HV // H)) * K
    k0 = _load_qk(base_k, r0, n_tok, H * K, K, BK, L2NORM)
    k1 = _load_qk(base_k, r1, n_tok, H * K, K, BK, L2NORM)
    k2 = _load_qk(base_k, r2, n_tok, H * K, K, BK, L2NORM)
    k3 = _load_qk(base_k, r3, n_tok, H * K, K, BK, L2NORM)
    X00, X10, X11, X20, X21, X22, X30, X31, X32, X33 = _invert_blocks(
        _kkt_block(k0, k0, gc0, gc0, be0, r0, r0, n_tok, IEEE),
        _kkt_block(k1, k0, gc1, gc0, be1, r1, r0, n_tok, IEEE), _kkt_block(k1, k1, gc1, gc1, be1, r1, r1, n_tok, IEEE),
        _kkt_block(k2, k0, gc2, gc0, be2, r2, r0, n_tok, IEEE), _kkt_block(k2, k1, gc2, gc1, be2, r2, r1, n_tok, IEEE),
        _kkt_block(k2, k2, gc2, gc2, be2, r2, r2, n_tok, IEEE),
        _kkt_block(k3, k0, gc3, gc0, be3, r3, r0, n_tok, IEEE), _kkt_block(k3, k1, gc3, gc1, be3, r3, r1, n_tok, IEEE),
        _kkt_block(k3, k2, gc3, gc2, be3, r3, r2, n_tok, IEEE), _kkt_block(k3, k3, gc3, gc3, be3, r3, r3, n_tok, IEEE),
        IEEE)

    dt = k0.dtype
    cols_k = tl.arange(0, BK)
    base_w = W + bos * HV * K + i_h * K
    w0, w1, w2, w3 = _tril_apply(X00, X10, X11, X20, X21, X22, X30, X31, X32, X33,
                                 _cast(k0 * (be0 * tl.exp(gc0))[:, None], dt), _cast(k1 * (be1 * tl.exp(gc1))[:, None], dt),
                                 _cast(k2 * (be2 * tl.exp(gc2))[:, None], dt), _cast(k3 * (be3 * tl.exp(gc3))[:, None], dt),
                                 IEEE)
    _store_tile(base_w, r0, n_tok, HV * K, cols_k, K, w0)
    _store_tile(base_w, r1, n_tok, HV * K, cols_k, K, w1)
    _store_tile(base_w, r2, n_tok, HV * K, cols_k, K, w2)
    _store_tile(base_w, r3, n_tok, HV * K, cols_k, K, w3)

    base_v = v + bos * HV * V + i_h * V
    base_u = U + bos * HV * V + i_h * V
    for i_v in range(0, tl.cdiv(V, BV)):
        cols = i_v * BV + tl.arange(0, BV)
        u0, u1, u2, u3 = _tril_apply(
            X00, X10, X11, X20, X21, X22, X30, X31, X32, X33,
            _cast(_load_tile(base_v, r0, n_tok, HV * V, cols, V) * be0[:, None], dt),
            _cast(_load_tile(base_v, r1, n_tok, HV * V, cols, V) * be1[:, None], dt),
            _cast(_load_tile(base_v, r2, n_tok, HV * V, cols, V) * be2[:, None], dt),
            _cast(_load_tile(base_v, r3, n_tok, HV * V, cols, V) * be3[:, None], dt),
            IEEE)
        _store_tile(base_u, r0, n_tok, HV * V, cols, V, u0)
        _store_tile(base_u, r1, n_tok, HV * V, cols, V, u1)
        _store_tile(base_u, r2, n_tok, HV * V, cols, V, u2)
        _store_tile(base_u, r3, n_tok, HV * V, cols, V, u3)


def fuse_output_default(layout: ChunkLayout) -> bool:
    """Whether the output pass folds into the state pass by default: short sequences only."""
    return layout.max_len <= FUSE_OUTPUT_MAX_LEN


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
) -> tuple[Tensor, Tensor | None]:
    """Chunked gated delta rule prefill in two or three launches; arguments and result as
    ``chunk.chunk_gdn``'s (a prebuilt workspace: ``ChunkWorkspace.allocate(..., stages=False,
    fuse_output=...)``). fuse_output: compute the outputs in the state pass (no h, v_new);
    None: ``fuse_output_default(layout)``.
    """
    lay = ChunkLayout.build(q.shape[0], q.shape[1], cu_seqlens, q.device) if layout is None else layout
    fuse = fuse_output_default(lay) if fuse_output is None else fuse_output
    x = _setup(q, k, v, g, beta, a, b, A_log, dt_bias, scale=scale, initial_state=initial_state,
               output_final_state=output_final_state, cu_seqlens=cu_seqlens, layout=lay, qk_l2norm=qk_l2norm,
               out=out, workspace=workspace, stages=False, fuse_output=fuse)
    ws = x.ws
    if lay.NT:
        _chunk_prep_kernel[(lay.NT, x.HV)](
            x.k, x.v, x.g, x.beta, x.a, x.b, x.A_log, x.dt_bias, ws.gc, ws.W, ws.U, lay.cu_seqlens, lay.chunk_indices,
            H=x.H, HV=x.HV, K=x.K, V=x.V, BT=CHUNK, BK=x.BK, BV=min(64, _tile_width(x.V)), RAW_GATE=x.raw,
            L2NORM=x.l2norm, IEEE=x.ieee, num_warps=8, num_stages=2)
    _state_and_output(x, _state_kernel, fuse_output=fuse, output_final_state=output_final_state)
    return x.out, ws.final_state if output_final_state else None


def describe(*, fuse_output: bool) -> str:
    """The state (and output) pass configs of the latest launch, for a result row's path."""
    return _describe(_state_kernel, fuse_output=fuse_output)

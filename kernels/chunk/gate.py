"""Stage (a): each chunk's cumulative log decay gc (and beta from raw gates), per (chunk, value head)."""

from __future__ import annotations

import triton
import triton.language as tl

from ..common.device import softplus
from .tiles import chunk_bounds, chunk_program


@triton.jit
def log_decay(g, a, A_log, dt_bias, tok, valid, i_h, HV: tl.constexpr, RAW_GATE: tl.constexpr):
    """The log decay of value head i_h at flat token indices tok, fp32, 0 where not valid: g as given, or
    -exp(A_log) softplus(a + dt_bias) from raw gates."""
    if RAW_GATE:
        x = tl.load(a + tok * HV + i_h, mask=valid, other=0.0).to(tl.float32) + tl.load(dt_bias + i_h).to(tl.float32)
        b_g = -tl.exp(tl.load(A_log + i_h).to(tl.float32)) * softplus(x)
    else:
        b_g = tl.load(g + tok * HV + i_h, mask=valid, other=0.0).to(tl.float32)
    return tl.where(valid, b_g, 0.0)


@triton.jit
def _gate_rows(g, beta, a, b, A_log, dt_bias, tok, valid, i_h, HV: tl.constexpr, RAW_GATE: tl.constexpr):
    """(log decay, beta) of value head i_h at flat token indices tok, fp32, 0 where not valid.

    Zero on invalid rows (past the sequence's end) keeps their cumulative decay equal to the last
    valid one, so no exp() of a decay difference that involves them can overflow.
    """
    if RAW_GATE:
        b_beta = tl.sigmoid(tl.load(b + tok * HV + i_h, mask=valid, other=0.0).to(tl.float32))
    else:
        b_beta = tl.load(beta + tok * HV + i_h, mask=valid, other=0.0).to(tl.float32)
    return log_decay(g, a, A_log, dt_bias, tok, valid, i_h, HV, RAW_GATE), tl.where(valid, b_beta, 0.0)


@triton.jit
def gate_chunk(g, beta, a, b, A_log, dt_bias, gc, bos, rows, valid, i_h, HV: tl.constexpr, RAW_GATE: tl.constexpr):
    """Stores a chunk's cumulative log decay gc (fp32) and returns (gc, beta), fp32, 0 past n_tok."""
    tok = bos + rows
    b_g, b_beta = _gate_rows(g, beta, a, b, A_log, dt_bias, tok, valid, i_h, HV, RAW_GATE)
    b_gc = tl.cumsum(b_g, 0)
    tl.store(gc + tok * HV + i_h, b_gc, mask=valid)
    return b_gc, b_beta


@triton.jit
def chunk_gate_kernel(g, beta, a, b, A_log, dt_bias, gc, beta_out, seq_bounds, chunk_indices,
                      HV: tl.constexpr, BT: tl.constexpr, RAW_GATE: tl.constexpr):
    i_c, i_h, _ = chunk_program(HV, 1)
    bos, i_t, n_tok = chunk_bounds(seq_bounds, chunk_indices, i_c)
    rows = i_t * BT + tl.arange(0, BT)
    valid = rows < n_tok
    _, b_beta = gate_chunk(g, beta, a, b, A_log, dt_bias, gc, bos, rows, valid, i_h, HV, RAW_GATE)
    if RAW_GATE:
        tl.store(beta_out + (bos + rows) * HV + i_h, b_beta, mask=valid)

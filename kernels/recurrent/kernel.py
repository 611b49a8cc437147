"""The fused recurrent gated delta rule kernel (decode and short prefill), Triton.

One work item per (sequence, value head, V-block), ITEMS of them per program one after the other (a
1-D grid, the V-blocks of a head next to each other). An item keeps its BK x BV slice of the state (fp32;
held as [BV, BK / KS, KS], see "State layout") in registers across all tokens of its sequence and, per
token, does the whole recurrent step (docs/design.md, "Conventions") without leaving registers:

    S = exp(g) * S ;  u = beta * (v - S^T k) ;  S = S + k u^T ;  o = S^T (scale * q)

Every V-block needs the full key dimension (S^T k reduces over K), so K is one tile (BK =
next_pow2(K), masked) and V is split into blocks of BV columns: the blocks of one head never talk to
each other, which is what makes the split free. Non-power-of-two head dims (60, 100) are masked; the
masked rows/columns of the tile load as 0 and stay 0.
Options (all compile-time switches of one kernel):
  * q/k L2 normalisation in the kernel (x * rsqrt(sum(x^2) + 1e-6), in fp32), or none (pre-normalised);
  * GVA: value head h reads q/k head h // (HV // H);
  * ragged batches (B = 1 and cu_seqlens [N+1], int64; the kernel loads its own bounds, so the launcher
    never reads them on the host) or a padded [B, T] batch;
  * state from/to initial_state / final_state [N, HV, K, V] fp32, or a state pool [S, HV, K, V] (fp32 or
    bf16) read and written in place at slot_idx[N] (int32); a negative slot is a padding sequence: its
    output is written as zeros and no slot is touched;
  * speculative verify on a pool (per-token slots, vLLM's semantics): slot_idx [N, T] and
    num_accepted_tokens [N]; the program starts from slot_idx[n, num_accepted_tokens[n] - 1] and stores
    the state after token t to slot_idx[n, t] (a negative entry skips that store; a negative start slot
    makes the sequence padding);
  * fused gating (``gating: raw``): g = -exp(A_log[h]) * softplus(a + dt_bias[h]) (softplus linear above
    20, as torch) and beta = sigmoid(b), from a, b [B, T, HV] and A_log, dt_bias [HV]. Compiled, these
    use the hardware's approximate log and division (log1p's series for tiny arguments), relative error
    about 1e-5 on g; the interpreter, which has no libdevice, computes them exactly (why: ``common.device``).


State layout: K-first or V-first (``v_first``). V-first keeps the per-token reductions over K inside a warp
(docs/decisions/0013-recurrent-state-layout.md). The tile is held as [BV, BK / KS, KS] (``forward.key_runs``):
a thread gets 16 contiguous bytes of keys and the lanes spread along them; with several tokens per sequence
a thread holds KS runs of 16 bytes instead, so each reduction shuffles across fewer lanes.

Inputs are prefetched: token t + 1's are loaded before token t's math and stores, so a sequence waits
for one load latency instead of one per token (a load after the store of o cannot be moved above it by
the compiler), and token 0's before the pool slot is read, so that a decode step's input loads overlap
the slot's and the state's instead of waiting for them. With one token per sequence (``GATES_AHEAD``)
its gates are computed before the pool slot is read too, so the decay is ready when the state arrives;
with several tokens the gates stay in the token loop, where that placement is slower.

The state tile's pointers and masks are rebuilt for the final store rather than kept live across the
token loop (ptxas, sm_90, K = V = 128, BV 32, 4 warps: 96 registers instead of 168).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..common.device import EPS, cast, sigmoid, softplus
from ..common.interpreter import runs_interpreted

__all__ = ["recurrent_gdn_kernel", "INTERPRETED"]


@triton.jit
def _tile_keys(BK: tl.constexpr, KS: tl.constexpr):
    """Key index of each place of a [., BK / KS, KS] state tile: key s * (BK / KS) + r sits at [., r, s]."""
    return tl.arange(0, KS)[None, None, :] * (BK // KS) + tl.arange(0, BK // KS)[None, :, None]


@triton.jit
def _as_keys(x, BK: tl.constexpr, KS: tl.constexpr):
    """A [BK] vector over the keys, laid out as the state tile's key dims: [1, BK / KS, KS]."""
    return tl.permute(tl.reshape(x, [KS, BK // KS]), (1, 0))[None, :, :]


@triton.jit
def _state_offsets(keys, offs_v, K: tl.constexpr, V: tl.constexpr, V_FIRST: tl.constexpr):
    """Offsets of a [BV, BK / KS, KS] state tile (``_tile_keys``) inside one head's K x V state: K-first
    ([K, V], V contiguous) or V-first ([V, K], K contiguous). Triton lays the tile out along the
    contiguous dim, so V-first puts the K reductions of every token inside a warp (shuffles) instead of
    across warps (shared memory); KS > 1 then keeps KS runs of keys in each thread, fewer lanes to
    shuffle across."""
    if V_FIRST:
        return keys + offs_v[:, None, None] * K
    else:
        return keys * V + offs_v[:, None, None]


@triton.jit
def _kdot(b_h, x):
    """sum over the keys of b_h [BV, BK / KS, KS] times x [1, BK / KS, KS]: [BV]."""
    return tl.sum(tl.sum(b_h * x, 2), 1)


@triton.jit
def _gates(x, y, neg_A, dt, RAW_GATE: tl.constexpr):
    """A token's decay exp(g) and beta from its two gate inputs: raw a, b (g = -exp(A_log) * softplus(a +
    dt_bias), beta = sigmoid(b); neg_A = -exp(A_log) and dt = dt_bias of the head) or g and beta."""
    if RAW_GATE:
        return tl.exp(neg_A * softplus(x + dt)), sigmoid(y)
    else:
        return tl.exp(x), y


@triton.jit
def _token_inputs(p_q, p_k, p_v, p_x, p_y, offs_k, offs_v, n_k, n_v, has):
    """One token's q, k [BK], v [BV] and two gate inputs, fp32; only the first n_k / n_v entries of
    q, k / v and, if ``has``, the gate inputs are read (the rest are 0)."""
    return (tl.load(p_q, mask=offs_k < n_k, other=0.0).to(tl.float32),
            tl.load(p_k, mask=offs_k < n_k, other=0.0).to(tl.float32),
            tl.load(p_v, mask=offs_v < n_v, other=0.0).to(tl.float32),
            tl.load(p_x, mask=has, other=0.0).to(tl.float32),
            tl.load(p_y, mask=has, other=0.0).to(tl.float32))


@triton.jit
def recurrent_gdn_kernel(
    q, k, v, g, beta, a, b, A_log, dt_bias,   # inputs (g/beta or a/b/A_log/dt_bias: the others are None)
    o,                                        # [B, T, HV, V] output
    h0, ht,                                   # [N, HV, K, V] fp32 initial / final state (or None)
    pool, slot_idx, accepted,                 # [S, HV, K, V] pool, [N] or [N, T] int32 slots, [N] (or None)
    cu_seqlens,                               # [N + 1] int64 (or None: padded batch)
    scale, T, NH,                             # NH: N * HV
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
    IS_VARLEN: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr, IS_POOL: tl.constexpr,
    PER_TOKEN: tl.constexpr, V_FIRST: tl.constexpr, RAW_GATE: tl.constexpr, L2NORM: tl.constexpr,
    GATES_AHEAD: tl.constexpr, BV: tl.constexpr, ITEMS: tl.constexpr, KS: tl.constexpr,
):
    # ITEMS work items (sequence and value head, V-block) per program, one after the other, V-blocks of
    # a head next to each other: a program's stores drain while its next item loads and computes
    NV: tl.constexpr = (V + BV - 1) // BV
    for it in range(ITEMS):
        item = tl.program_id(0) * ITEMS + it  # 1-D grid: N * HV can pass 65535 (the limit of axes 1, 2)
        if item < NH * NV:
            _recurrent_item(item // NV, item % NV, q, k, v, g, beta, a, b, A_log, dt_bias, o, h0, ht, pool, slot_idx,
                            accepted, cu_seqlens, scale, T, H, HV, K, V, BK, IS_VARLEN, USE_H0, STORE_HT, IS_POOL,
                            PER_TOKEN, V_FIRST, RAW_GATE, L2NORM, GATES_AHEAD, BV, KS)


@triton.jit
def _first_token(q, k, v, g, beta, a, b, A_log, dt_bias, o, bos, n_tok, i_h, i_hk, offs_k, offs_v,
                 H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, RAW_GATE: tl.constexpr):
    """A work item's pointers to its first token's q, k, v, output and two gate inputs (raw a, b, gated in
    the kernel, or g, beta), the head's gate constants -exp(A_log) and dt_bias, and the first token's
    inputs, loaded whether or not its slot is live (so that the loads need not wait for the slot's); none
    for an empty sequence, whose bos may be the end of the buffers."""
    p_q = q + (bos * H + i_hk) * K + offs_k
    p_k = k + (bos * H + i_hk) * K + offs_k
    p_v = v + (bos * HV + i_h) * V + offs_v
    p_o = o + (bos * HV + i_h) * V + offs_v
    if RAW_GATE:
        p_x = a + bos * HV + i_h
        p_y = b + bos * HV + i_h
        neg_A = -tl.exp(tl.load(A_log + i_h).to(tl.float32))
        dt = tl.load(dt_bias + i_h).to(tl.float32)
    else:
        p_x = g + bos * HV + i_h
        p_y = beta + bos * HV + i_h
        neg_A = 0.0  # (unused by _gates)
        dt = 0.0
    has = n_tok > 0
    x_q, x_k, x_v, x_x, x_y = _token_inputs(p_q, p_k, p_v, p_x, p_y, offs_k, offs_v, tl.where(has, K, 0),
                                            tl.where(has, V, 0), has)
    return p_q, p_k, p_v, p_o, p_x, p_y, neg_A, dt, x_q, x_k, x_v, x_x, x_y


@triton.jit
def _recurrent_item(
    i_nh, i_v, q, k, v, g, beta, a, b, A_log, dt_bias, o, h0, ht, pool, slot_idx, accepted, cu_seqlens, scale, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
    IS_VARLEN: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr, IS_POOL: tl.constexpr,
    PER_TOKEN: tl.constexpr, V_FIRST: tl.constexpr, RAW_GATE: tl.constexpr, L2NORM: tl.constexpr,
    GATES_AHEAD: tl.constexpr, BV: tl.constexpr, KS: tl.constexpr,
):
    """One work item: sequence and value head i_nh, V-block i_v, all of the sequence's tokens."""
    i_n = i_nh // HV
    i_h = i_nh % HV
    i_hk = i_h // (HV // H)

    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    else:
        bos = i_n.to(tl.int64) * T
        eos = bos + T
    n_tok = (eos - bos).to(tl.int32)

    offs_k = tl.arange(0, BK)
    offs_v = i_v * BV + tl.arange(0, BV)
    mask_v = offs_v < V
    keys = _tile_keys(BK, KS)
    mask_kv = (keys < K) & mask_v[:, None, None]
    offs_kv = _state_offsets(keys, offs_v, K, V, V_FIRST)

    if GATES_AHEAD:  # one token per sequence: its inputs and gates ahead of the slot's load (see GATES_AHEAD)
        p_q, p_k, p_v, p_o, p_x, p_y, b_neg_A, b_dt, n_q, n_k, n_v, n_x, n_y = _first_token(
            q, k, v, g, beta, a, b, A_log, dt_bias, o, bos, n_tok, i_h, i_hk, offs_k, offs_v, H, HV, K, V, RAW_GATE)
        b_decay, b_beta = _gates(n_x, n_y, b_neg_A, b_dt, RAW_GATE)
    b_h = tl.zeros([BV, BK // KS, KS], dtype=tl.float32)
    n_live = n_tok
    if IS_POOL:
        if PER_TOKEN:  # start from the slot of the last accepted token (T slots per sequence)
            p_slot = slot_idx + i_n.to(tl.int64) * T
            slot = tl.load(p_slot + tl.load(accepted + i_n) - 1).to(tl.int64)
        else:
            slot = tl.load(slot_idx + i_n).to(tl.int64)
        live = slot >= 0
        n_live = tl.where(live, n_tok, 0)
        # the slot's mask, empty for a padding sequence (written as a comparison: the interpreter
        # rejects a tensor mask and-ed with a scalar bool)
        k_live = tl.where(live, K, 0)
        # scalar: the tile's pointers are rebuilt at the store
        pool_h = pool + (tl.maximum(slot, 0) * HV + i_h) * (K * V)
        # plain loads and stores of the pool: evict_first on them (to keep q/k/v in L2 while the pool streams
        # through) makes one-token decode slower (docs/decisions/0014-recurrent-tuning.md)
        b_h = tl.load(pool_h + offs_kv, mask=(keys < k_live) & mask_v[:, None, None], other=0.0).to(tl.float32)
    elif USE_H0:
        b_h = tl.load(h0 + (i_n.to(tl.int64) * HV + i_h) * (K * V) + offs_kv, mask=mask_kv, other=0.0).to(tl.float32)

    if not GATES_AHEAD:
        p_q, p_k, p_v, p_o, p_x, p_y, b_neg_A, b_dt, n_q, n_k, n_v, n_x, n_y = _first_token(
            q, k, v, g, beta, a, b, A_log, dt_bias, o, bos, n_tok, i_h, i_hk, offs_k, offs_v, H, HV, K, V, RAW_GATE)
    for i in range(0, n_live):
        # token i + 1's loads are issued before token i's math and stores (a load after a store to o
        # cannot be moved above it): one load latency per sequence instead of one per token.
        # The last token re-reads its own inputs rather than reading past the sequence.
        b_q, b_k, b_v, b_x, b_y = n_q, n_k, n_v, n_x, n_y
        s = tl.where(i + 1 < n_live, 1, 0)
        n_q, n_k, n_v, n_x, n_y = _token_inputs(p_q + s * H * K, p_k + s * H * K, p_v + s * HV * V, p_x + s * HV,
                                                p_y + s * HV, offs_k, offs_v, K, V, True)
        if L2NORM:
            b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q) + EPS)
            b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k) + EPS)
        b_q = b_q * scale
        if GATES_AHEAD:
            if i > 0:
                b_decay, b_beta = _gates(b_x, b_y, b_neg_A, b_dt, RAW_GATE)
        else:
            b_decay, b_beta = _gates(b_x, b_y, b_neg_A, b_dt, RAW_GATE)
        b_k = _as_keys(b_k, BK, KS)
        b_h = b_h * b_decay                                       # decay
        b_u = b_beta * (b_v - _kdot(b_h, b_k))                    # delta: what the memory misses for k
        b_h = b_h + b_k * b_u[:, None, None]                      # rank-1 write
        b_o = _kdot(b_h, _as_keys(b_q, BK, KS))                   # read-out
        tl.store(p_o, cast(b_o, p_o.dtype.element_ty), mask=mask_v)
        if PER_TOKEN:  # this token's state to its own slot (skipped for a negative one)
            w_slot = tl.load(p_slot).to(tl.int64)
            p_slot += 1
            w_k = tl.where(w_slot >= 0, K, 0)
            tl.store(pool + (tl.maximum(w_slot, 0) * HV + i_h) * (K * V) + offs_kv,
                     cast(b_h, pool.dtype.element_ty), mask=(keys < w_k) & mask_v[:, None, None])
        p_q += H * K
        p_k += H * K
        p_v += HV * V
        p_o += HV * V
        p_x += HV
        p_y += HV

    if IS_POOL:
        # a padding sequence (n_live = 0) writes zeros over its output and leaves the pool alone
        for _ in range(n_live, n_tok):
            tl.store(p_o, tl.zeros([BV], dtype=tl.float32).to(p_o.dtype.element_ty), mask=mask_v)
            p_o += HV * V
        if not PER_TOKEN:  # (per-token slots were written in the loop)
            keys2 = _tile_keys(BK, KS)
            offs_v2 = i_v * BV + tl.arange(0, BV)
            tl.store(pool_h + _state_offsets(keys2, offs_v2, K, V, V_FIRST), cast(b_h, pool.dtype.element_ty),
                     mask=(keys2 < k_live) & (offs_v2[:, None, None] < V))
    elif STORE_HT:
        keys2 = _tile_keys(BK, KS)
        offs_v2 = i_v * BV + tl.arange(0, BV)
        tl.store(ht + (i_n.to(tl.int64) * HV + i_h) * (K * V) + _state_offsets(keys2, offs_v2, K, V, V_FIRST), b_h,
                 mask=(keys2 < K) & (offs_v2[:, None, None] < V))


INTERPRETED: bool = runs_interpreted(recurrent_gdn_kernel)

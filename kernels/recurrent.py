"""Fused recurrent gated delta rule (decode and short prefill), Triton.

One work item per (sequence, value head, V-block), ITEMS of them per program one after the other (a
1-D grid, the V-blocks of a head next to each other). An item keeps its BK x BV slice of the state (fp32;
held as [BV, BK / KS, KS], see "State layout") in registers across all tokens of its sequence and, per
token, does the whole step of DESIGN.md section 2 without leaving registers:

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
    about 1e-5 on g; the interpreter, which has no libdevice, computes them exactly. That took 7-9% of
    the raw-gating token loop's instructions out (sm_90 SASS, T > 1) and made bf16-pool rows at T = 4
    3-7% faster on an H100.

State layout: K-first or V-first (``v_first``). On an H100 (decode on a pool, HV=32, K=V=128, CUDA
graphs, triton 3.6) V-first was faster in every case measured: bf16 pool B=256 T=1 202 us vs 265 us
K-first, T=4 344 vs 527 us, fp32 pool B=256 T=1 368 vs 374 us, because the per-token reductions over K
stay inside a warp. The tile is held as [BV, BK / KS, KS] (``key_runs``): a thread gets 16 contiguous
bytes of keys and the lanes spread along them, so an fp32 tile at K = 128 would put the keys on all 32
lanes and each reduction would shuffle 5 rounds. With several tokens per sequence a thread holds KS runs
of 16 bytes instead: fp32 tiles two (16 lanes; four, on 8 lanes, from 4 tokens on), bf16 tiles four (32
keys per thread on 4 lanes: 2 shuffle rounds, and fewer instructions per state element). On an H100
(revision_ab, B = 64 and 256) two runs made fp32 pools 1.5-4% faster at T = 2 and 4 and four 1-3% more
at T = 4; four made bf16 pools 3.5-6% faster at T = 2 and 6-15% at T = 4 (with the (16, 1) candidate,
which most of those rows then picked). One token keeps one run; per-token slots, whose state store per
token outweighs the reductions, keep 16 lanes.

Tunables are BV, num_warps and ITEMS: (BV, num_warps) in (8, 1), (8, 2), (16, 1), (16, 2), (16, 4),
(16, 8), (32, 4), (32, 8), (32, 16), (64, 4), (64, 8), (64, 16), each with 1, 2 or 4 items per program,
num_stages 2, pruned per shape to BV <= next_pow2(V) and 4..64 state elements per thread (more spills on
sm_90). Several items per program let a program's stores drain while its next item loads and computes: ncu
put "drain" (warps waiting at exit for their stores) first among the stalls of the 1-item kernel at
B=256 T=4 (H100), and 4 items made bf16 B=256 T=2 and T=4 13% and 5% faster; one token prefers 1 on an
H100. On an H200 (faster memory, the same SMs) one token with a bf16 pool and raw gating ran fastest at
16 / 2 warps with 2 items, 1.5-3.7% ahead of the best 1- or 4-item config at B = 128-512 and on scattered
slots (forced configs, BENCHMARKS.md, twenty-fifth session).

The first launch of each key (``tune_key``: K, V, pool, per-token slots, layout, GVA ratio, a tier of
parallelism and of tokens per sequence; plus the argument dtypes) times the candidates side by side
(``tuning.fastest``: CUDA graphs, interleaved rounds, L2 flushed) and keeps the fastest. On an H100 it
picked, for one token, BV 32 / 16 warps (fp32 pools) and 32 / 4 (bf16) at most batch sizes, 8 / 1 or 8 / 2
at a few small ones, and 4 items for bf16 pools at T > 1 (every row's pick is in BENCHMARKS.md). A pool
launch is tuned on a scratch copy of its slots, never on the live pool. Under the Triton interpreter there is one config (BV 32, 4 warps, 1 item)
and no tuning. The config that ran is recorded: ``best_config(tune_key(...))``.

Inputs are prefetched: token t + 1's are loaded before token t's math and stores, so a sequence waits
for one load latency instead of one per token (a load after the store of o cannot be moved above it by
the compiler), and token 0's before the pool slot is read, so that a decode step's input loads overlap
the slot's and the state's instead of waiting for them. On an H100 (decode suite, one-token rows, A/B
against the plain loop that one token used to keep) that made decode 1-10% faster, most with bf16
pools, and left T = 4 unchanged.

With one token per sequence (``GATES_AHEAD``, set by the launcher), that token's inputs are loaded and its
gates computed before the pool slot is read, so the decay is ready when the state tile arrives. On an H200
(revision_ab against f847c21, each side tuned on its own, one-token rows) that made bf16 pools with raw gating
at B=64 2.0% (HV=32) and 4.3% (HV=16, same config) faster and left the other one-token rows within 1%; the
same placement with several tokens per sequence ran 2.7-4.8% slower (T=2, B=256, bf16 pool), so there the
gates stay in the token loop.

Register pressure note: the state tile's pointers and masks are rebuilt for the final store rather
than kept live across the token loop (ptxas, sm_90, K = V = 128, BV 32, 4 warps: 96 registers instead
of 168).
"""

from __future__ import annotations

import bisect
import os

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra import libdevice

from .inputs import check_inputs, output_buffer
from .tuning import fastest

__all__ = ["recurrent_gdn", "tune_key", "key_runs", "tuning_candidates", "best_config", "config_str", "CONFIGS",
           "INTERPRETED"]

# Triton decides between compiling and interpreting when a kernel is decorated, i.e. at this module's
# import, from TRITON_INTERPRET (INTERPRETED, below the kernel, records what actually happened).
_INTERPRET_ENV = os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on", "yes")

_EPS: tl.constexpr = tl.constexpr(1e-6)  # q/k L2 norm: x * rsqrt(sum(x^2) + eps), as gdnbench.reference.l2norm
# Raw gating's softplus and sigmoid with the hardware's approximate log and division when compiled (the
# interpreter has no libdevice: exact ones there): 31-33 fewer instructions per token in the token loop,
# of the 59-74 that raw gating adds to it (sm_90 SASS, T > 1).
_FAST_GATE: tl.constexpr = tl.constexpr(not _INTERPRET_ENV)

# (BV, num_warps) candidates for a GPU, each with every ITEMS count. The state tile is BK x BV fp32 spread
# over 32 * num_warps threads; configs that would leave threads idle or spill are pruned per shape (_prune).
_GPU_CANDIDATES = [(8, 1), (8, 2), (16, 1), (16, 2), (16, 4), (16, 8), (32, 4), (32, 8), (32, 16), (64, 4),
                   (64, 8), (64, 16)]
_ITEMS = (1, 2, 4)
_NUM_STAGES = 2  # lets the token loop prefetch the next token's q/k/v in a prefill
if _INTERPRET_ENV:
    # The interpreter runs every program in numpy: one config, no tuning (``fastest`` returns a single
    # candidate as it is). BV = 32 still splits V = 60 / 64 into two blocks, the second masked for 60.
    CONFIGS = [triton.Config({"BV": 32, "ITEMS": 1}, num_warps=4, num_stages=1)]
else:
    CONFIGS = [triton.Config({"BV": bv, "ITEMS": items}, num_warps=w, num_stages=_NUM_STAGES)
               for bv, w in _GPU_CANDIDATES for items in _ITEMS]


def _prune(configs: list[triton.Config], BK: int, V: int) -> list[triton.Config]:
    """configs for a BK-wide key tile and V value columns: BV capped at V, duplicates dropped, and no
    tile with under 4 or over 64 fp32 state elements per thread (idle threads, or spills on sm_90)."""
    keep, seen = [], set()
    for c in configs:
        bv = min(c.kwargs["BV"], triton.next_power_of_2(V))  # BV beyond V only masks more columns
        per_thread = BK * bv / (32 * c.num_warps)
        key = (bv, c.kwargs["ITEMS"], c.num_warps)
        if per_thread < 4 or per_thread > 64 or key in seen:
            continue
        seen.add(key)
        keep.append(triton.Config({**c.kwargs, "BV": bv}, num_warps=c.num_warps, num_stages=c.num_stages))
    return keep or [triton.Config({"BV": min(32, triton.next_power_of_2(V)), "ITEMS": 1}, num_warps=4,
                                  num_stages=_NUM_STAGES)]


# The interpreter's fp32 -> bf16 cast truncates (a GPU rounds to nearest even), which would put a bf16
# pool a whole rounding step off the reference: under the interpreter the kernel rounds itself.
_SOFT_BF16_RNE: tl.constexpr = tl.constexpr(_INTERPRET_ENV)


@triton.jit
def _cast(x, dtype: tl.constexpr):
    """x.to(dtype), fp32 -> bf16 rounded to nearest even everywhere."""
    if _SOFT_BF16_RNE and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + (0x7FFF + ((bits >> 16) & 1))
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(dtype)


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
def _softplus(x):
    # torch.nn.functional.softplus (beta 1, threshold 20): log1p(exp(x)), x itself above 20. log1p(y) is
    # its series where log(1 + y) would lose y's digits (y < 2^-7; the series' error is below y^4 / 4).
    y = tl.exp(tl.minimum(x, 20.0))
    lp = tl.where(y < 0.0078125, y * (1.0 - y * (0.5 - y * 0.33333334)), _log(1.0 + y))
    return tl.where(x > 20.0, x, lp)


@triton.jit
def _sigmoid(x):
    return _reciprocal(1.0 + tl.exp(-x))


@triton.jit
def _log(x):
    if _FAST_GATE:
        return libdevice.fast_logf(x)
    else:
        return tl.log(x)


@triton.jit
def _reciprocal(x):
    if _FAST_GATE:
        return libdevice.fast_dividef(1.0, x)
    else:
        return 1.0 / x


@triton.jit
def _gates(x, y, neg_A, dt, RAW_GATE: tl.constexpr):
    """A token's decay exp(g) and beta from its two gate inputs: raw a, b (g = -exp(A_log) * softplus(a +
    dt_bias), beta = sigmoid(b); neg_A = -exp(A_log) and dt = dt_bias of the head) or g and beta."""
    if RAW_GATE:
        return tl.exp(neg_A * _softplus(x + dt)), _sigmoid(y)
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
def _recurrent_gdn_kernel(
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
        pool_h = pool + (tl.maximum(slot, 0) * HV + i_h) * (K * V)  # scalar: the tile's pointers are rebuilt at the store
        # plain loads and stores of the pool: with eviction_policy="evict_first" on them (meant to keep q/k/v
        # in L2 while the pool streams through) one-token decode ran 2.6-4.8% slower on an H200
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
            b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q) + _EPS)
            b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k) + _EPS)
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
        tl.store(p_o, _cast(b_o, p_o.dtype.element_ty), mask=mask_v)
        if PER_TOKEN:  # this token's state to its own slot (skipped for a negative one)
            w_slot = tl.load(p_slot).to(tl.int64)
            p_slot += 1
            w_k = tl.where(w_slot >= 0, K, 0)
            tl.store(pool + (tl.maximum(w_slot, 0) * HV + i_h) * (K * V) + offs_kv,
                     _cast(b_h, pool.dtype.element_ty), mask=(keys < w_k) & mask_v[:, None, None])
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
            tl.store(pool_h + _state_offsets(keys2, offs_v2, K, V, V_FIRST), _cast(b_h, pool.dtype.element_ty),
                     mask=(keys2 < k_live) & (offs_v2[:, None, None] < V))
    elif STORE_HT:
        keys2 = _tile_keys(BK, KS)
        offs_v2 = i_v * BV + tl.arange(0, BV)
        tl.store(ht + (i_n.to(tl.int64) * HV + i_h) * (K * V) + _state_offsets(keys2, offs_v2, K, V, V_FIRST), b_h,
                 mask=(keys2 < K) & (offs_v2[:, None, None] < V))


try:
    from triton.runtime.interpreter import InterpretedFunction as _Interpreted

    INTERPRETED: bool = isinstance(_recurrent_gdn_kernel, _Interpreted)
except ImportError:  # pragma: no cover - older layouts of triton
    INTERPRETED = _INTERPRET_ENV

# ---- launcher -----------------------------------------------------------------------------------------

_CHOSEN: dict[tuple, dict] = {}  # tune_key -> config of the latest launch with that key
_TUNED: dict[tuple, triton.Config] = {}  # (tune_key, argument dtypes) -> the fastest candidate


TuneKey = tuple[int, int, bool, bool, bool, int, int]


def _per_sequence(tokens: int, N: int) -> int:
    """Tokens per sequence of a launch of N sequences and ``tokens`` tokens in all (a varlen batch's mean)."""
    return tokens // max(N, 1)


_HEADS_TIER_BOUNDS = (64, 512, 1024, 4096)  # tune_key's heads tiers: below 64, below 512, ..., 4096 and more


def tune_key(K: int, V: int, *, pool: bool, N: int, H: int, HV: int, tokens: int, per_token: bool = False,
             v_first: bool = False) -> TuneKey:
    """The tuning key of a launch of N sequences and ``tokens`` tokens in all: (K, V, pool, per-token
    slots, V-first state, GVA ratio HV // H, tier).

    The tier folds the parallelism of N * HV heads (< 64, < 512, < 1024, < 4096, more: small decode
    batches want many narrow programs, large ones wide blocks) with the tokens per sequence (1, 2, more:
    a token loop's serial reductions favour fewer warps), one number for each pair of tiers. A key's
    first launch picks the config for every launch with that key, so one key must not span shapes whose
    best configs differ: on an H100, T=2 and T=4 at B=256 (HV=32) ran fastest at (64, 4) and (8, 1), 9%
    and 16% apart, and the old tier (T > 1) kept whichever came first. Likewise the GVA ratio: at T=2
    with fp32 pools, B=64 and B=256 with HV=16 = H ran 17% and 15% slower with the (16, 4) that B=64 and
    B=256 with HV=32 = 2H had picked (each in the same heads tier) than with their own picks. And
    512-1023 heads apart from 1024-4095: with a bf16 pool at T=1 and HV=16 = H, (16, 4) was the fastest
    at B=32 but 1.5% / 2.9% behind (32, 4) at B=64 / 128, and the tuner's picks at B=32 (16/4, 32/4 and
    64/4 in three tunings, within 1% of each other there) ran B=64 up to 1.9% slower (forced configs,
    interleaved); keyed apart, B=64 and 128 ran 1.2% and 0.7% faster in one A/B (revision_ab), though
    B=64's own tuning still picks 64/4 in some runs (BENCHMARKS.md, eighteenth session).
    """
    heads_tier = bisect.bisect_right(_HEADS_TIER_BOUNDS, N * HV)
    T = _per_sequence(tokens, N)
    tokens_tier = 0 if T <= 1 else 1 if T == 2 else 2
    tier = heads_tier + (len(_HEADS_TIER_BOUNDS) + 1) * tokens_tier
    return (K, V, bool(pool), bool(per_token), bool(v_first), HV // H, tier)


# Lanes along the keys of a V-first state tile with several tokens per sequence (key_runs). Measured on an
# H100 at K = 128 (revision_ab, raw gating, B = 64 and 256, T = 2 and 4):
#   fp32: 16 lanes (2 runs) 1.5-4% faster than 32 (1 run); 8 lanes (4 runs) 1-3% faster than 16 at T = 4,
#       0.5-1.3% slower at T = 2: 8 lanes from 4 tokens per sequence on;
#   bf16: 4 lanes (4 runs) 1.035-1.151x faster than 16 (1 run), 8 lanes (2 runs) 1.027-1.132x, 2 lanes
#       (8 runs, 201 registers at BV 16 / 1 warp) 0.96-1.06x;
#   per-token slots (a state store per token): 16 lanes for both; 4 bf16 lanes were 0.97-0.99x at B = 8 and
#       256, 8 fp32 lanes 0.98x at T = 4.
def _key_lanes(state_bytes: int, tokens_per_seq: int, per_token: bool) -> int:
    if per_token:
        return 16
    if state_bytes == 2:
        return 4
    return 8 if tokens_per_seq >= 4 else 16


def key_runs(BK: int, state_bytes: int, v_first: bool, tokens_per_seq: int, per_token: bool = False) -> int:
    """KS, the runs of keys each thread holds in the state tile. Triton gives a thread 16 contiguous bytes
    of a V-first tile and spreads its keys over the lanes: BK * state_bytes / 16 of them, across which
    every token's two K-reductions shuffle. KS runs per thread cut that to ``_key_lanes`` (fp32: 16, 8
    from 4 tokens on; 2-byte states: 4; 16 with per-token slots), with more keys summed inside a thread.
    At K = 128 (sm_90 SASS, 4 items): fp32 32 -> 16 lanes, BV 16 / 2 warps, token loop 444 -> 353
    instructions, 80 -> 32 shuffles; bf16 16 -> 4 lanes, BV 16 / 2 warps 332 -> 279 instructions, 32 -> 4
    shuffles, and BV 16 / 1 warp (64 state elements per thread) 436 for twice the elements. One token per
    sequence keeps 1: its loop is short, and with two runs the fp32 one-token rows were tuned to other
    configs and ran 0.9-1.6% slower (H100, B >= 64). K-first tiles reduce across warps: 1."""
    if not v_first or tokens_per_seq <= 1:
        return 1
    return max(1, BK * state_bytes // (16 * _key_lanes(state_bytes, tokens_per_seq, per_token)))


def best_config(key: TuneKey) -> dict | None:
    """The config the most recent launch with this ``tune_key`` ran with ({"BV", "num_warps",
    "num_stages"}), or None before any. Under the interpreter (one config) it is known without a run."""
    if key in _CHOSEN:
        return _CHOSEN[key]
    if len(CONFIGS) == 1:  # the autotuner runs a single config as it is, without pruning
        return _config_dict(CONFIGS[0])
    return None


def config_str(cfg: dict | None) -> str:
    if not cfg:
        return "config not tuned yet"
    return f"BV={cfg['BV']} num_warps={cfg['num_warps']} items={cfg['ITEMS']} num_stages={cfg['num_stages']}"


def tuning_candidates(K: int, V: int) -> list[triton.Config]:
    """The configs a launch with head dims K, V is tuned over (CONFIGS pruned; the interpreter's one as is)."""
    return CONFIGS if len(CONFIGS) == 1 else _prune(CONFIGS, triton.next_power_of_2(K), V)


def _config_dict(c: triton.Config) -> dict:
    return {"BV": c.kwargs["BV"], "ITEMS": c.kwargs["ITEMS"], "num_warps": c.num_warps, "num_stages": c.num_stages}


def recurrent_gdn(
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
    state_pool: Tensor | None = None,
    slot_idx: Tensor | None = None,
    num_accepted_tokens: Tensor | None = None,
    cu_seqlens: Tensor | None = None,
    v_first: bool = False,
    qk_l2norm: bool = False,
    out: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """The gated delta rule, token by token, in one fused kernel launch.

    q, k [B, T, H, K]; v [B, T, HV, V]; HV a multiple of H. Gating: g (log decay) and beta
    (post-sigmoid) [B, T, HV], or raw a, b [B, T, HV] with A_log, dt_bias [HV] (fused in the kernel).
    Varlen: B = 1 and cu_seqlens [N + 1] int64 (never read on the host). State: initial_state [N, HV, K,
    V] fp32 and/or output_final_state, or state_pool [S, HV, K, V] (fp32/bf16, contiguous) updated in
    place at slot_idx [N] int32 (negative: padding, zero output), or per token at slot_idx [N, T] starting
    from slot_idx[n, num_accepted_tokens[n] - 1] (speculative verify; padded batch only). ``v_first``:
    every state (pool, initial and final) is [.., V, K] instead, the layout of serving engines' pools.
    ``out``: an optional preallocated o.
    Returns (o [B, T, HV, V] in q's dtype, final_state [N, HV, K, V] (or V, K) fp32, or None).
    """
    B, T, H, K, HV, V = check_inputs(q, k, v, g, beta, a, b, A_log, dt_bias,
                                     head_dim_limit="the state tile lives in registers")
    raw = a is not None
    if cu_seqlens is not None:
        if B != 1:
            raise ValueError(f"varlen (cu_seqlens) needs B == 1, got B={B}")
        N = cu_seqlens.shape[0] - 1
    else:
        N = B
    kv = (V, K) if v_first else (K, V)  # the state's last two dims
    is_pool = state_pool is not None
    per_token = num_accepted_tokens is not None
    if is_pool:
        want = (N, T) if per_token else (N,)
        if slot_idx is None or slot_idx.shape != want or slot_idx.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"a state pool needs slot_idx {list(want)}, int32 (or int64)"
                             + (" with num_accepted_tokens" if per_token else ""))
        if per_token and (cu_seqlens is not None or num_accepted_tokens.shape != (N,)):
            raise ValueError(f"per-token slots take a padded batch and num_accepted_tokens [N] = [{N}]")
        if initial_state is not None or output_final_state:
            raise ValueError("the state lives in state_pool: no initial_state / output_final_state with it")
        if state_pool.shape[1:] != (HV, *kv) or not state_pool.is_contiguous():
            raise ValueError(f"state_pool must be a contiguous [S, {HV}, {kv[0]}, {kv[1]}] tensor")
        if state_pool.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"state_pool dtype {state_pool.dtype} not supported")
    elif per_token:
        raise ValueError("num_accepted_tokens goes with a state pool and slot_idx [N, T]")
    if initial_state is not None and initial_state.shape != (N, HV, *kv):
        raise ValueError(f"initial_state must be [N, HV, {'V, K' if v_first else 'K, V'}] = {(N, HV, *kv)}")

    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if raw:
        a, b, A_log, dt_bias = a.contiguous(), b.contiguous(), A_log.contiguous(), dt_bias.contiguous()
    else:
        g, beta = g.contiguous(), beta.contiguous()
    out = output_buffer(out, q, B, T, HV, V)
    h0 = initial_state.contiguous().float() if initial_state is not None and not is_pool else None
    ht = torch.empty(N, HV, *kv, dtype=torch.float32, device=q.device) if output_final_state else None

    BK = triton.next_power_of_2(K)
    per_seq = _per_sequence(B * T, N)
    KS = key_runs(BK, state_pool.element_size() if is_pool else 4, v_first, per_seq, per_token)
    key = tune_key(K, V, pool=is_pool, N=N, H=H, HV=HV, tokens=B * T, per_token=per_token, v_first=v_first)
    if per_token:
        slot_idx, num_accepted_tokens = slot_idx.contiguous(), num_accepted_tokens.contiguous()

    def launch(cfg: triton.Config, o_: Tensor, pool_: Tensor | None, slots_: Tensor | None) -> None:
        items = N * HV * triton.cdiv(V, cfg.kwargs["BV"])
        _recurrent_gdn_kernel[(triton.cdiv(items, cfg.kwargs["ITEMS"]),)](
            q, k, v, g, beta, a, b, A_log, dt_bias, o_, h0, ht, pool_, slots_, num_accepted_tokens, cu_seqlens,
            scale, T, N * HV,
            H=H, HV=HV, K=K, V=V, BK=BK, IS_VARLEN=cu_seqlens is not None, USE_H0=h0 is not None,
            STORE_HT=ht is not None, IS_POOL=is_pool, PER_TOKEN=per_token, V_FIRST=v_first, RAW_GATE=raw,
            L2NORM=qk_l2norm, GATES_AHEAD=per_seq <= 1, KS=KS, **cfg.kwargs, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages, maxnreg=cfg.maxnreg,
        )

    # the argument dtypes select another compiled kernel, so they belong to the key
    tensors = (q, k, v, g, beta, a, b, A_log, dt_bias, out, h0, ht, state_pool, slot_idx, num_accepted_tokens,
               cu_seqlens)
    full_key = (key, tuple(None if t is None else str(t.dtype) for t in tensors))
    if full_key not in _TUNED:
        candidates = tuning_candidates(K, V)
        if is_pool and len(candidates) > 1:
            # Tuning runs every candidate many times: on the live pool that would advance the state
            # many steps. Tune on a scratch copy of the slots this launch touches instead.
            flat = slot_idx.reshape(-1)
            scratch_slots = torch.where(flat >= 0, torch.arange(flat.numel(), dtype=flat.dtype, device=flat.device),
                                        flat).view_as(slot_idx)
            scratch, scratch_out = state_pool.index_select(0, flat.clamp(min=0).long()), torch.empty_like(out)
            _TUNED[full_key] = fastest(lambda c: launch(c, scratch_out, scratch, scratch_slots), candidates, q.device)
        else:  # nothing is updated in place
            _TUNED[full_key] = fastest(lambda c: launch(c, out, state_pool, slot_idx), candidates, q.device)
    cfg = _TUNED[full_key]
    launch(cfg, out, state_pool, slot_idx)
    _CHOSEN[key] = _config_dict(cfg)
    return out, ht

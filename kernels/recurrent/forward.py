"""The launcher of the fused recurrent kernel (``kernel.py``): argument checks, launch config, tuning.

Tunables are BV, num_warps and ITEMS: (BV, num_warps) candidates each with 1, 2 or 4 items per program,
num_stages 2, pruned per shape to BV <= next_pow2(V) and 4..64 state elements per thread (more spills on
sm_90). Several items per program let a program's stores drain while its next item loads and computes
(docs/decisions/0014-recurrent-tuning.md).

The first launch of each key (``tune_key``: K, V, pool, per-token slots, layout, GVA ratio, a tier of
parallelism and of tokens per sequence; plus the argument dtypes) times the candidates side by side
(``common.tuning.fastest``: CUDA graphs, interleaved rounds, L2 flushed) and keeps the fastest. A pool
launch is tuned on a scratch copy of its slots, never on the live pool. Under the Triton interpreter there
is one config (BV 32, 4 warps, 1 item) and no tuning. The config that ran is recorded:
``best_config(tune_key(...))``.
"""

from __future__ import annotations

import bisect

import torch
import triton
from torch import Tensor

from ..common.inputs import check_inputs, output_buffer
from ..common.interpreter import triton_interpreter_on
from ..common.ints import cdiv, next_power_of_2
from ..common.tuning import fastest
from .kernel import INTERPRETED, recurrent_gdn_kernel

__all__ = ["recurrent_gdn", "tune_key", "key_runs", "tuning_candidates", "best_config", "config_str", "CONFIGS",
           "INTERPRETED"]

# (BV, num_warps) candidates for a GPU, each with every ITEMS count. The state tile is BK x BV fp32 spread
# over 32 * num_warps threads; configs that would leave threads idle or spill are pruned per shape (_prune).
_GPU_CANDIDATES = [(8, 1), (8, 2), (16, 1), (16, 2), (16, 4), (16, 8), (32, 4), (32, 8), (32, 16), (64, 4),
                   (64, 8), (64, 16)]
_ITEMS = (1, 2, 4)
_NUM_STAGES = 2  # lets the token loop prefetch the next token's q/k/v in a prefill
if triton_interpreter_on():
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
        bv = min(c.kwargs["BV"], next_power_of_2(V))  # BV beyond V only masks more columns
        per_thread = BK * bv / (32 * c.num_warps)
        key = (bv, c.kwargs["ITEMS"], c.num_warps)
        if per_thread < 4 or per_thread > 64 or key in seen:
            continue
        seen.add(key)
        keep.append(triton.Config({**c.kwargs, "BV": bv}, num_warps=c.num_warps, num_stages=c.num_stages))
    return keep or [triton.Config({"BV": min(32, next_power_of_2(V)), "ITEMS": 1}, num_warps=4,
                                  num_stages=_NUM_STAGES)]


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
    first launch picks the config for every launch with that key, so one key never spans shapes whose
    best configs differ (docs/decisions/0014-recurrent-tuning.md).
    """
    heads_tier = bisect.bisect_right(_HEADS_TIER_BOUNDS, N * HV)
    T = _per_sequence(tokens, N)
    tokens_tier = 0 if T <= 1 else 1 if T == 2 else 2
    tier = heads_tier + (len(_HEADS_TIER_BOUNDS) + 1) * tokens_tier
    return (K, V, bool(pool), bool(per_token), bool(v_first), HV // H, tier)


# Lanes along the keys of a V-first state tile with several tokens per sequence (key_runs); the
# comparison is in docs/decisions/0013-recurrent-state-layout.md.
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
    return CONFIGS if len(CONFIGS) == 1 else _prune(CONFIGS, next_power_of_2(K), V)


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
    final_state: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """The gated delta rule, token by token, in one fused kernel launch.

    q, k [B, T, H, K]; v [B, T, HV, V]; HV a multiple of H. Gating: g (log decay) and beta
    (post-sigmoid) [B, T, HV], or raw a, b [B, T, HV] with A_log, dt_bias [HV] (fused in the kernel).
    Varlen: B = 1 and cu_seqlens [N + 1] int64 (never read on the host). State: initial_state [N, HV, K,
    V] fp32 and/or output_final_state, or state_pool [S, HV, K, V] (fp32/bf16, contiguous) updated in
    place at slot_idx [N] int32 (negative: padding, zero output), or per token at slot_idx [N, T] starting
    from slot_idx[n, num_accepted_tokens[n] - 1] (speculative verify; padded batch only). ``v_first``:
    every state (pool, initial and final) is [.., V, K] instead, the layout of serving engines' pools.
    ``out``, ``final_state``: an optional preallocated o, and final state (fp32, contiguous) with
    output_final_state.
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
    ht = None
    if output_final_state:
        ht = torch.empty(N, HV, *kv, dtype=torch.float32, device=q.device) if final_state is None else final_state
        if ht.shape != (N, HV, *kv) or ht.dtype != torch.float32 or not ht.is_contiguous():
            raise ValueError(f"final_state must be a contiguous fp32 {[N, HV, *kv]} tensor")

    BK = next_power_of_2(K)
    per_seq = _per_sequence(B * T, N)
    KS = key_runs(BK, state_pool.element_size() if is_pool else 4, v_first, per_seq, per_token)
    key = tune_key(K, V, pool=is_pool, N=N, H=H, HV=HV, tokens=B * T, per_token=per_token, v_first=v_first)
    if per_token:
        slot_idx, num_accepted_tokens = slot_idx.contiguous(), num_accepted_tokens.contiguous()

    def launch(cfg: triton.Config, o_: Tensor, pool_: Tensor | None, slots_: Tensor | None) -> None:
        items = N * HV * cdiv(V, cfg.kwargs["BV"])
        recurrent_gdn_kernel[(cdiv(items, cfg.kwargs["ITEMS"]),)](
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
    full_key = (key, tuple(None if t is None else t.dtype for t in tensors))
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

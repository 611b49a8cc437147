"""The canonical problem: deterministic inputs for one case, in the conventions of docs/design.md
("Conventions", "Inputs").

Inputs are drawn on the CPU from a generator seeded by (suite seed, case id) and then moved to the
device, so the same seed gives the same inputs on every device. Every backend adapter converts from
these tensors (outside the timed region) and its outputs are converted back to them.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from gdnbench.reference import decay_from_raw, gate_from_raw, l2norm
from gdnbench.suite import Case

DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class Problem:
    """Canonical tensors of one case. Shapes as in docs/design.md, "Conventions"; varlen is B = 1 with cu_seqlens."""

    case: Case
    q: torch.Tensor  # [B, T, H, K]
    k: torch.Tensor  # [B, T, H, K]
    v: torch.Tensor  # [B, T, HV, V]
    g: torch.Tensor  # [B, T, HV] fp32, log decay
    beta: torch.Tensor  # [B, T, HV] post-sigmoid; input dtype (fp32 with gating: raw, as derived)
    scale: float
    cu_seqlens: torch.Tensor | None = None  # [N + 1] int64 (varlen)
    initial_state: torch.Tensor | None = None  # [N, HV, K, V] fp32 (prefill)
    state_pool: torch.Tensor | None = None  # [S, HV, K, V] state dtype (decode); never mutated
    slot_idx: torch.Tensor | None = None  # [B] int32 (decode); [B, T] with per_token_slots
    num_accepted_tokens: torch.Tensor | None = None  # [B] int32 in 1..T (per_token_slots)
    # raw gating inputs (gating: raw): g and beta above are derived from these
    a: torch.Tensor | None = None  # [B, T, HV] input dtype
    b: torch.Tensor | None = None  # [B, T, HV] input dtype
    A_log: torch.Tensor | None = None  # [HV] fp32
    dt_bias: torch.Tensor | None = None  # [HV] fp32

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def qk_l2norm_in_kernel(self) -> bool:
        return self.case.qk_l2norm == "kernel"

    def tensors(self) -> dict[str, Any]:
        """The canonical inputs by their names in docs/design.md (None where the case has none)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "case"}
        out["qk_l2norm"] = self.case.qk_l2norm
        return out

    def fresh_pool(self) -> torch.Tensor:
        """A private copy of the decode state pool, for kernels that update it in place."""
        assert self.state_pool is not None, "not a decode problem"
        return self.state_pool.clone()

    def copy(self) -> Problem:
        """The same problem in tensors of its own: what a backend is given, so that what it writes in memory
        it does not own reaches no other backend (``changed_inputs`` finds it)."""
        return replace(self, **{name: t.clone() for name, t in self._tensor_fields().items()})

    def changed_inputs(self, copy: Problem) -> list[str]:
        """The inputs that ``copy`` (made by ``copy()``) no longer holds bit for bit, each with what changed."""
        changed = []
        for name, mine in self._tensor_fields().items():
            theirs = getattr(copy, name)
            if theirs.shape != mine.shape or theirs.dtype != mine.dtype:
                changed.append(f"{name} (now {theirs.dtype} {tuple(theirs.shape)})")
                continue
            differs = _bits(theirs) != _bits(mine)
            if not differs.any():
                continue
            if name == "state_pool":
                slots = differs.flatten(1).any(1)
                owned = torch.zeros_like(slots)
                owned[self.slot_idx.long().flatten()] = True
                changed.append(f"state_pool ({int((slots & owned).sum())} slot(s) in slot_idx, "
                               f"{int((slots & ~owned).sum())} outside)")
            else:
                changed.append(f"{name} ({int(differs.sum())} of {differs.numel()} elements)")
        return changed

    def _tensor_fields(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), torch.Tensor)}


def _bits(x: torch.Tensor) -> torch.Tensor:
    """x's raw bits as integers (NaN equals itself, -0.0 differs from 0.0)."""
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return x.contiguous().view(ints[x.element_size()]) if x.is_floating_point() else x


def case_seed(seed: int, case_id: str) -> int:
    """A 63-bit seed derived from the suite seed and the case id (stable across runs and machines)."""
    digest = hashlib.sha256(f"{seed}:{case_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def seq_lens(case: Case, seed: int) -> list[int]:
    """Sequence lengths of a varlen case: explicit, or a seeded random split of total_tokens."""
    if case.seq_lens is not None:
        return list(case.seq_lens)
    n, total = case.num_seqs, case.total_tokens
    gen = torch.Generator().manual_seed(case_seed(seed, case.id + "#split"))
    cuts = (torch.randperm(total - 1, generator=gen)[: n - 1] + 1).sort().values.tolist()
    bounds = [0, *cuts, total]
    return [bounds[i + 1] - bounds[i] for i in range(n)]


def half_life_gating(half_life: tuple[float, float], HV: int,
                     gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(A_log, dt_bias) [HV] that put raw gating in a half-life regime (docs/design.md, "Gate regimes").

    With a ~ N(0, 1) per token, g = -exp(A_log) * softplus(a + dt_bias). Each value head draws its mean
    half-life h log-uniformly from ``half_life`` and dt_bias ~ U(0, 1); A_log = log(ln 2 / (h m)), with m
    the mean of softplus(a + dt_bias) over a, makes the mean log decay -ln 2 / h, around which each token's
    varies by the positive factor softplus(a + dt_bias) / m. h = inf gives A_log = -inf: no decay.
    """
    lo, hi = half_life
    h = lo * (hi / lo) ** torch.rand(HV, generator=gen, dtype=torch.float64) if lo < hi else torch.full(
        (HV,), lo, dtype=torch.float64)
    dt_bias = torch.rand(HV, generator=gen, dtype=torch.float64)
    A_log = torch.log(math.log(2) / (h * _mean_softplus_of_normal(dt_bias)))
    return A_log.float(), dt_bias.float()


def _mean_softplus_of_normal(shift: torch.Tensor) -> torch.Tensor:
    """E[softplus(z + shift)] for z ~ N(0, 1), by Gauss-Hermite quadrature (64 nodes, fp64)."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(64)
    z = torch.from_numpy(nodes)[:, None] + shift[None, :]
    return (torch.from_numpy(weights)[:, None] * F.softplus(z)).sum(0) / math.sqrt(2 * math.pi)


def make_problem(case: Case, seed: int, device: str | torch.device = "cpu") -> Problem:
    """Build the inputs of ``case`` following FLA's own test recipe (docs/design.md, "Inputs")."""
    gen = torch.Generator().manual_seed(case_seed(seed, case.id))
    dtype = DTYPES[case.dtype]
    H, HV, K, V = case.H, case.HV, case.K, case.V
    if case.mode == "varlen":
        lens = seq_lens(case, seed)
        B, T = 1, sum(lens)
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int64)
    else:
        B, T, cu = case.B, case.T, None

    q = torch.rand(B, T, H, K, generator=gen)
    k = torch.rand(B, T, H, K, generator=gen)
    v = torch.rand(B, T, HV, V, generator=gen)
    if case.qk_l2norm == "pre":
        q, k = l2norm(q), l2norm(k)
    raw: dict[str, torch.Tensor] = {}
    if case.gating == "raw":
        raw["a"] = torch.randn(B, T, HV, generator=gen).to(dtype)
        raw["b"] = torch.randn(B, T, HV, generator=gen).to(dtype)
        if case.half_life is None:
            raw["A_log"] = torch.log(torch.empty(HV).uniform_(1, 16, generator=gen))
            raw["dt_bias"] = torch.rand(HV, generator=gen)
        else:
            raw["A_log"], raw["dt_bias"] = half_life_gating(case.half_life, HV, gen)
        g, beta = gate_from_raw(raw["a"], raw["b"], raw["A_log"], raw["dt_bias"])
    else:
        beta = torch.sigmoid(torch.rand(B, T, HV, generator=gen))
        if case.half_life is None:
            g = F.logsigmoid(torch.rand(B, T, HV, generator=gen)) / case.gate_norm
        else:
            g = decay_from_raw(torch.randn(B, T, HV, generator=gen), *half_life_gating(case.half_life, HV, gen))
        if case.mask_p > 0:
            g = g.masked_fill(torch.rand(B, T, HV, generator=gen) < case.mask_p, 0.0)

    N = case.N
    state = pool = slots = accepted = None
    if case.op == "prefill" and case.initial_state == "random":
        state = torch.randn(N, HV, K, V, generator=gen)
    elif case.op == "prefill" and case.initial_state == "zeros":
        state = torch.zeros(N, HV, K, V)
    if case.op == "decode":
        n_slots = N * case.state_writes
        if case.slots == "scattered":
            slots = torch.randperm(case.pool_size, generator=gen)[:n_slots].to(torch.int32)
        else:
            slots = torch.arange(n_slots, dtype=torch.int32)
        if case.per_token_slots:
            slots = slots.view(N, case.T)
            # how many draft tokens the previous verify step accepted: where each sequence starts from
            accepted = torch.randint(1, case.T + 1, (N,), generator=gen, dtype=torch.int32)
        pool = _state_pool(case, slots, gen, torch.device(device))

    def dev(x: torch.Tensor | None, dt: torch.dtype | None = None) -> torch.Tensor | None:
        return None if x is None else x.to(device=device, dtype=dt or x.dtype)

    return Problem(
        case=case,
        q=dev(q, dtype), k=dev(k, dtype), v=dev(v, dtype),
        # raw gating derives beta in fp32 (docs/design.md, "Conventions"); rounding it would move the reference
        g=dev(g, torch.float32), beta=dev(beta, torch.float32 if case.gating == "raw" else dtype),
        scale=case.scale if case.scale is not None else K**-0.5,
        cu_seqlens=dev(cu), initial_state=dev(state),
        state_pool=pool, slot_idx=dev(slots), num_accepted_tokens=dev(accepted),
        **{name: dev(t) for name, t in raw.items()},
    )


def _state_pool(case: Case, slots: torch.Tensor, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """The decode pool [pool_size, HV, K, V], filled on ``device``: the slots in ``slots`` hold states drawn
    from ``gen`` (or zeros), as every other input is; the other slots hold values drawn on the device from a
    seed taken from ``gen``, so that a kernel that writes a slot it should not is caught, without drawing a
    pool of thousands of slots on the host (seconds, and gigabytes of host memory, a case)."""
    HV, K, V, dtype = case.HV, case.K, case.V, DTYPES[case.state_dtype]
    used = torch.unique(slots.flatten())
    states = (torch.randn(len(used), HV, K, V, generator=gen) if case.initial_state == "random"
              else torch.zeros(len(used), HV, K, V))
    filler = torch.Generator(device).manual_seed(int(torch.randint(2**62, (1,), generator=gen)))
    pool = torch.randn(case.pool_size, HV, K, V, generator=filler, device=device, dtype=dtype)
    pool[used.to(device)] = states.to(device=device, dtype=dtype)
    return pool

"""Conversions between the canonical tensors and the conventions of third-party libraries.

Every adapter converts in one place, here, outside the timed region (docs/design.md,
"Conventions"): 3-D token-major layouts, cu_seqlens dtypes and chunk tables, log g vs
linear alpha, K-first vs V-first states, GVA head expansion, in-place state pools, raw gating.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from gdnbench.problem import Problem
from gdnbench.reference import gate_from_raw


def flat_tokens(x: Tensor) -> Tensor:
    """[B, T, ...] -> [B*T, ...]: the 3-D, token-major layout of FlashInfer / cuDNN / MAX."""
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:]).contiguous()


def unflat_tokens(x: Tensor, B: int, T: int) -> Tensor:
    """[B*T, ...] -> [B, T, ...]."""
    return x.reshape(B, T, *x.shape[1:])


def cu_seqlens(p: Problem, dtype: torch.dtype = torch.int64) -> Tensor:
    """Sequence boundaries of the packed tokens; a padded batch is B sequences of T tokens."""
    if p.cu_seqlens is not None:
        return p.cu_seqlens.to(dtype)
    B, T = p.q.shape[:2]
    return torch.arange(0, (B + 1) * T, T, dtype=dtype, device=p.device)


def chunk_tables(cu_seqlens: Tensor, chunk: int) -> tuple[Tensor, Tensor, int]:
    """Where the chunks of packed sequences sit, as int32 tables built once on the device.

    Returns (chunk_indices [2 * NT]: the (sequence, chunk within it) pair of every chunk, flat and
    sequence-major, [n0, c0, n1, c1, ...]; cu_chunks [N + 1]: the index of each sequence's first chunk;
    NT, the number of chunks, read on the host).
    """
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    counts = (lens + chunk - 1) // chunk
    cu_chunks = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    total = int(cu_chunks[-1])  # a host sync, which is why the tables are built before timing
    seq = torch.arange(counts.numel(), device=counts.device).repeat_interleave(counts)
    within = torch.arange(total, device=counts.device) - cu_chunks[:-1].repeat_interleave(counts)
    return torch.stack([seq, within], dim=1).flatten().to(torch.int32), cu_chunks.to(torch.int32), total


def swap_kv(state: Tensor) -> Tensor:
    """K-first [..., K, V] <-> V-first [..., V, K] (the transpose is its own inverse)."""
    return state.transpose(-1, -2).contiguous()


def repeat_heads(x: Tensor, HV: int) -> Tensor:
    """q/k [B, T, H, K] -> [B, T, HV, K] for libraries without GVA (value head h reads h // (HV // H))."""
    H = x.shape[2]
    return x if H == HV else x.repeat_interleave(HV // H, dim=2)


def alpha(g: Tensor) -> Tensor:
    """Linear decay alpha = exp(g) (FlashInfer prefill, MAX), fp32."""
    return g.float().exp()


GateFn = Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


def gating(p: Problem, library_gate: GateFn | None = None) -> Callable[[], tuple[Tensor, Tensor]]:
    """What an unfused backend runs to get (g, beta), to be called inside its timed region.

    ``gating: pre`` cases hand over the canonical g and beta (no work). ``gating: raw`` cases compute
    them from a, b, A_log, dt_bias, with the library's own gating function when it has one
    (``library_gate(a, b, A_log, dt_bias) -> (g, beta)``), else in PyTorch: either way the step is
    timed, so fused and unfused kernels are compared on the same work.
    """
    if p.case.gating == "pre":
        return lambda: (p.g, p.beta)
    gate = library_gate or gate_from_raw
    return lambda: gate(p.a, p.b, p.A_log, p.dt_bias)


class StatePool:
    """A library-layout copy of canonical K-first states that a kernel updates in place.

    ``states`` [S, HV, K, V] becomes ``pool`` [null_slots + S, HV, ...] (V-first if asked), with
    ``null_slots`` zeroed slots in FRONT (vLLM reserves slot 0): canonical slot s lives at
    ``pool[null_slots + s]``. ``reset()`` copies the pristine states back into the same buffer (CUDA graphs
    replay on fixed addresses), so every sample starts from the same state; ``canonical()`` converts
    the live pool back to [S, HV, K, V] in the states' dtype, as a new tensor.

    ``slots``: the canonical slots the call reads and writes (a decode's ``slot_idx``; negative entries are
    padding). ``reset()`` then restores only those and the null slots: on a pool of thousands of slots, copying
    it whole before every sample costs seconds a case. None: the whole pool.
    """

    def __init__(self, states: Tensor, *, v_first: bool = False, dtype: torch.dtype | None = None,
                 null_slots: int = 0, slots: Tensor | None = None) -> None:
        pool = (swap_kv(states) if v_first else states).to(dtype or states.dtype)
        if null_slots:
            pool = torch.cat([pool.new_zeros(null_slots, *pool.shape[1:]), pool])
        self.v_first, self.null_slots, self.dtype = v_first, null_slots, states.dtype
        self.pool = pool.contiguous().clone()
        self._rows: Tensor | None = None
        if slots is not None:
            used = slots.flatten().long()
            used = used[used >= 0] + null_slots  # host sync, in prepare: the rows never change
            self._rows = torch.cat([torch.arange(null_slots, device=used.device), used]).unique()
        self._saved = self.pool.clone() if self._rows is None else self.pool.index_select(0, self._rows)

    def reset(self) -> None:
        if self._rows is None:
            self.pool.copy_(self._saved)
        else:
            self.pool.index_copy_(0, self._rows, self._saved)

    def canonical(self) -> Tensor:
        pool = self.pool[self.null_slots:]
        states = (swap_kv(pool) if self.v_first else pool).to(self.dtype)
        # a snapshot, never a view: the harness poisons outputs, and reset() restores only the used slots
        return states.clone() if states.data_ptr() == pool.data_ptr() else states


class GatheredPool(StatePool):
    """Decode on a state pool through a library that has no pool API, the way a user does it.

    Inside the timed call: ``gather()`` reads pool[slot_idx] as the initial states, the library runs
    with output_final_state=True, and ``scatter(final)`` writes the final states back into the same
    slots, cast to the pool dtype. With ``v_first`` the pool is kept V-first [S, HV, V, K] (converted
    here, once), so that what is gathered and scattered is already in the library's layout.
    """

    def __init__(self, p: Problem, *, v_first: bool = False) -> None:
        assert p.state_pool is not None and p.slot_idx is not None, "not a decode problem"
        slots = p.slot_idx.long()
        if bool((slots < 0).any()):  # host sync, but in prepare: a -1 would silently address the last slot
            raise ValueError("slot_idx has padding entries (< 0); a gathered pool has no padding sentinel")
        super().__init__(p.state_pool, v_first=v_first, slots=slots)
        self.slots = slots

    def gather(self) -> Tensor:
        return self.pool.index_select(0, self.slots)

    def scatter(self, final_state: Tensor) -> None:
        self.pool.index_copy_(0, self.slots, final_state.to(self.pool.dtype))


GATHER_NOTE = "decode: pool[slot_idx] gathered to initial_state, final state scattered back (pool dtype), in the call"


def initial_states(p: Problem) -> Tensor:
    """The prefill initial states [N, HV, K, V] fp32: the case's, or zeros for a pool-only API."""
    if p.initial_state is not None:
        return p.initial_state
    N, HV, K, V = p.case.N, p.case.HV, p.case.K, p.case.V
    return torch.zeros(N, HV, K, V, dtype=torch.float32, device=p.device)

"""Shared by the serving-engine adapters (vLLM's vendored FLA ops, SGLang's GDN ops, Modular MAX).

Serving engines keep recurrent states in a slot pool that their kernels read and write in place,
and each has its own conventions around it:

* vLLM: V-first pool ``[slots, HV, V, K]``; an index <= 0 is NULL_BLOCK_ID, so slot 0 is reserved
  and real slots start at 1; multi-token decode takes per-token indices ``[N, T]``.
* SGLang: V-first pool; -1 marks padding; prefill also goes through a pool (``initial_state_indices``).
* MAX: K-first pool; ``uint32`` slot indices with no padding sentinel.

Everything here runs outside the timed region and needs none of those libraries.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Sequence
from types import ModuleType

import torch
from torch import Tensor

from gdnbench.backends.convert import GateFn


def vllm_state_indices(slot_idx: Tensor, T: int) -> Tensor:
    """Canonical slots -> vLLM ``ssm_state_indices`` for a pool with one reserved slot in front.

    Slot s becomes s + 1; padding (s < 0) becomes 0, vLLM's NULL_BLOCK_ID (the sequence is skipped).
    T == 1 gives [N]. T > 1 gives per-token indices [N, T]: vLLM's kernels read the initial state at
    column 0 and write the state after token t to column t, so repeating the slot leaves the state
    after the last token in it (a 1-D index would be read as other sequences' slots for t > 0).
    """
    idx = torch.where(slot_idx >= 0, slot_idx + 1, torch.zeros_like(slot_idx)).to(torch.int32)
    return idx if T == 1 else idx[:, None].expand(-1, T).contiguous()


def zero_padding_rows(o: Tensor, slot_idx: Tensor) -> Tensor:
    """Canonical output of padding sequences (slot < 0) is zero; the kernels leave it unspecified."""
    return torch.where((slot_idx >= 0)[:, None, None, None], o, torch.zeros_like(o))


def token_gate(gate: Callable[..., tuple[Tensor, Tensor]]) -> GateFn:
    """Adapt a serving engine's ``fused_gdn_gating(A_log, a, b, dt_bias)``, which takes [tokens, HV]
    and returns g and beta as [1, tokens, HV], to convert.gating's [B, T, HV] contract."""

    def run(a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor) -> tuple[Tensor, Tensor]:
        g, beta = gate(A_log=A_log, a=a.reshape(-1, a.shape[-1]), b=b.reshape(-1, b.shape[-1]),
                       dt_bias=dt_bias)
        return g.view(a.shape), beta.view(b.shape)

    return run


def first_importable(modules: Sequence[str]) -> tuple[ModuleType | None, str]:
    """The first of ``modules`` that imports, or (None, why each one failed)."""
    errors = []
    for name in modules:
        try:
            return importlib.import_module(name), ""
        except Exception as e:  # any import failure: try the next location
            errors.append(f"{name} ({type(e).__name__}: {e})")
    return None, "; ".join(errors)


# vLLM moved its vendored FLA ops: try the current location first, then the pre-0.33 one.
VLLM_OPS = ("vllm.third_party.flash_linear_attention.ops", "vllm.model_executor.layers.fla.ops")


def vllm_ops() -> ModuleType:
    ops, why = first_importable(VLLM_OPS)
    if ops is None:
        raise ImportError(f"no vLLM FLA ops package imports: {why}")
    return ops


def vllm_unavailable(name: str) -> str | None:
    """A SKIP reason when vllm imports but neither location of its FLA ops does."""
    ops, why = first_importable(VLLM_OPS)
    return None if ops is not None else f"{name}: cannot import {why}"


def require_v_first(fn: Callable[..., object]) -> None:
    """Refuse an old vendored copy whose state is K-first (vLLM before its V-first pool layout):
    the adapters transpose for the V-first API, so a K-first kernel would read transposed states."""
    if re.search(r"initial state of shape `\[N, HV?, K, V\]`", fn.__doc__ or "", re.IGNORECASE):
        raise RuntimeError(f"{fn.__module__}.{fn.__name__} takes a K-first [N, HV, K, V] state (an older "
                           "vLLM); this adapter targets the V-first [N, HV, V, K] API")

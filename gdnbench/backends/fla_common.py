"""Shared by the FLA, FlashQLA and transformers adapters (fla.*, flashqla.chunk, hf.*).

FLA's per-call dispatch switches, FLA's argument mapping (raw gating fused into the kernel) and FLA's
own gating kernels for unfused libraries.
Nothing here imports a third-party library at module import time.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import Tensor

from gdnbench.backends.convert import GateFn
from gdnbench.problem import Problem

# fla.backends reads these two on every call of a dispatched function (BaseBackend.is_enabled reads
# os.environ each time), so setting them around the call is enough and leaks nothing into other
# backends. FLA_FLASH_QLA=0 stops FLA routing K=V=128 fp16/bf16 cases to FlashQLA; FLA_INTRACARD_CP
# is off by default, pinned so that a user's environment cannot switch on FLA's intra-card CP path.
# FLA_DISABLE_BACKEND_DISPATCH is different: it is read once, when fla.backends is first imported.
NO_REDIRECT = {"FLA_FLASH_QLA": "0", "FLA_INTRACARD_CP": "0"}


@contextmanager
def pinned_env(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the duration of a call, touching only those that differ."""
    saved = {name: os.environ.get(name) for name, value in values.items() if os.environ.get(name) != value}
    for name in saved:
        os.environ[name] = values[name]
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def dispatch_note() -> str:
    """How FLA's backend dispatch is kept off, for ``Prepared.path``."""
    import fla.backends

    if getattr(fla.backends, "_DISPATCH_DISABLED", False):
        return "FLA_DISABLE_BACKEND_DISPATCH=1 (set before import: no dispatch at all)"
    return "FLA_FLASH_QLA=0 FLA_INTRACARD_CP=0 set around each call (read per call)"


def fla_kwargs(p: Problem) -> dict[str, Any]:
    """Keyword arguments shared by FLA's chunk and fused_recurrent calls (K-first state).

    ``gating: raw`` cases hand over the raw inputs and let FLA do the gating in the same call:
    g = a with use_gate_in_kernel (g = -exp(A_log) * softplus(a + dt_bias)), beta = b logits with
    use_beta_sigmoid_in_kernel.
    """
    kw: dict[str, Any] = dict(q=p.q, k=p.k, v=p.v, scale=p.scale, use_qk_l2norm_in_kernel=p.qk_l2norm_in_kernel,
                              state_v_first=False)
    if p.case.gating == "raw":
        kw.update(g=p.a, beta=p.b, use_gate_in_kernel=True, A_log=p.A_log, dt_bias=p.dt_bias,
                  use_beta_sigmoid_in_kernel=True)
    else:
        kw.update(g=p.g, beta=p.beta)
    return kw


def gating_note(p: Problem) -> str:
    return "; raw gating in the call (use_gate_in_kernel, use_beta_sigmoid_in_kernel)" if p.case.gating == "raw" else ""


def fla_gate() -> GateFn | None:
    """FLA's gating kernels as ``(a, b, A_log, dt_bias) -> (g, beta)``, or None when FLA is not usable."""
    try:
        from fla.ops.common.gate import fused_beta_sigmoid
        from fla.ops.gated_delta_rule.gate import fused_gdn_gate
    except Exception:  # FLA absent or broken (e.g. no triton): the caller falls back to PyTorch gating
        return None

    def gate(a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor) -> tuple[Tensor, Tensor]:
        return fused_gdn_gate(g=a, A_log=A_log, dt_bias=dt_bias), fused_beta_sigmoid(x=b)

    return gate



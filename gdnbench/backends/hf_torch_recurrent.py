"""hf.torch_recurrent: transformers' pure-PyTorch recurrence (modeling_qwen3_next.torch_recurrent_gated_delta_rule).

Also holds what hf.torch_chunk shares with it. Both public names are wrapped so that they call FLA (or a
Hub kernel) when one is importable; the adapters take the PyTorch function under the wrapper with
``inspect.unwrap``, so they always measure transformers' own code. The functions have no ``scale``
argument (it is fixed at K**-0.5) and no varlen; FLA-style GVA is inside them in recent transformers
releases only, so older ones get q/k heads repeated in prepare.
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable
from functools import cache
from typing import Any

import torch

from gdnbench.backends import convert
from gdnbench.backends.base import Outputs, Prepared, backend
from gdnbench.backends.convert import GATHER_NOTE, GatheredPool
from gdnbench.problem import Problem
from gdnbench.suite import Case

MODULE = "transformers.models.qwen3_next.modeling_qwen3_next"
# The availability check imports the model package only: it is lazy (about 1 s), where the modeling
# module pulls in the rest of transformers and FLA (about 7 s); prepare imports that.
REQUIRES = ("transformers.models.qwen3_next",)


def scale_check(name: str) -> Callable[[Case, torch.device], str | None]:
    """A ``check=`` that skips cases whose q scale is not the hard-wired K**-0.5."""

    def check(case: Case, device: torch.device) -> str | None:
        if case.scale is not None and not math.isclose(case.scale, case.K**-0.5, rel_tol=1e-9):
            return (f"{name}: scale is fixed at K**-0.5 = {case.K**-0.5:.6g} (no scale argument), "
                    f"case has scale={case.scale:g}")
        return None

    return check


def torch_function(name: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor | None]]:
    """transformers' PyTorch implementation of ``name``, without the FLA / Hub-kernel dispatch wrapper."""
    fn = inspect.unwrap(getattr(importlib.import_module(MODULE), name))
    if fn.__module__ != MODULE:
        raise RuntimeError(f"inspect.unwrap({name}) reached {fn.__module__}.{fn.__qualname__}, not transformers' code")
    return fn


@cache
def handles_gva(fn: Callable[..., tuple[torch.Tensor, torch.Tensor | None]]) -> bool:
    """Whether ``fn`` serves HV > H itself (later transformers releases do; 5.17 did not).

    Probed once on tiny CPU inputs: H = 2 q/k heads against 4 value heads must equal the same call
    with q/k heads repeated (a version without GVA raises a shape error, or would broadcast wrongly).
    """
    gen = torch.Generator().manual_seed(0)
    q, k = torch.rand(1, 3, 2, 4, generator=gen), torch.rand(1, 3, 2, 4, generator=gen)
    v = torch.rand(1, 3, 4, 4, generator=gen)
    g, beta = -torch.rand(1, 3, 4, generator=gen), torch.rand(1, 3, 4, generator=gen)
    want, _ = fn(query=convert.repeat_heads(q, 4), key=convert.repeat_heads(k, 4), value=v, g=g, beta=beta)
    try:
        got, _ = fn(query=q, key=k, value=v, g=g, beta=beta)
    except RuntimeError:
        return False
    return got.shape == want.shape and torch.allclose(got, want)


def prepare(p: Problem, name: str) -> Prepared:
    """Bind transformers' ``name`` to a problem: prefill, or decode on a gathered pool."""
    fn = torch_function(name)
    HV = p.v.shape[2]
    notes = [f"transformers {name}, inspect.unwrap (no FLA/hub dispatch)"]
    q, k = p.q, p.k
    if HV != q.shape[2]:
        if handles_gva(fn):
            notes.append("GVA inside the function")
        else:
            q, k = convert.repeat_heads(q, HV), convert.repeat_heads(k, HV)
            notes.append("q/k heads repeated in prepare (no GVA in this version)")
    gating = convert.gating(p)  # the model layer gates in PyTorch before the call: timed the same way
    if p.case.gating == "raw":
        notes.append("raw gating in torch, in the call")
    common: dict[str, Any] = dict(query=q, key=k, value=p.v, use_qk_l2norm_in_kernel=p.qk_l2norm_in_kernel)
    out: dict[str, Any] = {}

    if p.case.op == "decode":
        pool = GatheredPool(p)

        def call() -> None:
            g, beta = gating()
            o, final = fn(**common, g=g, beta=beta, initial_state=pool.gather(), output_final_state=True)
            pool.scatter(final)
            out["o"] = o

        return Prepared(call=call, outputs=lambda: Outputs(o=out["o"], state_pool=pool.canonical()),
                        reset=pool.reset, path="; ".join([*notes, GATHER_NOTE]))

    def prefill() -> None:
        g, beta = gating()
        out["o"], out["state"] = fn(**common, g=g, beta=beta, initial_state=p.initial_state,
                                    output_final_state=p.case.output_final_state)

    return Prepared(call=prefill, outputs=lambda: Outputs(o=out["o"], final_state=out["state"]),
                    path="; ".join(notes))


@backend("hf.torch_recurrent", ops={"prefill", "decode"}, devices={"cpu", "cuda"}, varlen=False,
         gating={"pre", "raw"}, requires=REQUIRES, package="transformers",
         check=scale_check("hf.torch_recurrent"))
def hf_torch_recurrent(p: Problem) -> Prepared:
    """transformers torch_recurrent_gated_delta_rule (pure PyTorch, unwrapped from its FLA dispatch)."""
    return prepare(p, "torch_recurrent_gated_delta_rule")

"""The backend interface: one decorated ``prepare`` function per backend.

A backend declares what it serves (ops, devices, dtypes, head dims, varlen, GVA, gating, GPU
architectures) and which modules it needs. ``prepare(problem)`` does everything that must stay out
of the timed region (layout conversions, allocations, copies of in-place state) and returns a
:class:`Prepared`, whose ``call`` is the timed region: the library's public call as a user makes it.

    @backend("mylib.chunk", ops={"prefill"}, requires=("mylib",), package="mylib")
    def mylib_chunk(p: Problem) -> Prepared:
        import mylib
        out = {}
        def call():
            out["o"], out["s"] = mylib.chunk(q=p.q, k=p.k, ...)
        return Prepared(call, lambda: Outputs(o=out["o"], final_state=out["s"]))
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from functools import cache

import torch

from gdnbench.problem import Problem
from gdnbench.suite import Case
from gdnbench_kernels.common.interpreter import triton_interpreter_on

ALL_DTYPES = frozenset({"bf16", "fp16", "fp32"})


@dataclass
class Outputs:
    """A backend's results in the canonical layout (converted outside the timed region)."""

    o: torch.Tensor  # [B, T, HV, V]
    final_state: torch.Tensor | None = None  # [N, HV, K, V] (prefill)
    state_pool: torch.Tensor | None = None  # [S, HV, K, V] after the call (decode)


@dataclass
class Prepared:
    """A backend bound to one problem.

    call:    the timed region; returns nothing the harness needs.
    outputs: canonical outputs of the most recent call.
    reset:   restores in-place state (e.g. a decode pool) into the same buffers ``call`` uses; the
             timer runs it before every call, outside the timed region.
    path:    which code path ran, recorded on the row (e.g. "fla triton, flashqla dispatch off").
    """

    call: Callable[[], object]
    outputs: Callable[[], Outputs]
    reset: Callable[[], None] | None = None
    path: str = ""


PrepareFn = Callable[[Problem], Prepared]


@dataclass(frozen=True)
class Backend:
    name: str
    prepare: PrepareFn
    ops: frozenset[str]
    devices: frozenset[str] = frozenset({"cuda"})
    dtypes: frozenset[str] = ALL_DTYPES
    state_dtypes: frozenset[str] = frozenset({"fp32", "bf16"})
    head_dims: frozenset[int] | None = None  # None: any head dim up to max_head_dim
    max_head_dim: int | None = None
    equal_kv: bool = False  # K must equal V
    varlen: bool = True
    gva: bool = True
    gating: frozenset[str] = frozenset({"pre"})
    qk_l2norm: frozenset[str] = frozenset({"pre", "kernel"})
    per_token_slots: bool = False  # speculative verify: a state slot per token, start at the accepted one
    archs: frozenset[tuple[int, int]] | None = None  # CUDA compute capabilities; None: any
    requires: tuple[str, ...] = ()  # modules that must import for the backend to be available
    package: str | None = None  # distribution whose version is recorded on every row
    description: str = ""
    check: Callable[[Case, torch.device], str | None] | None = field(default=None, compare=False)
    load_error: str | None = None  # set for a plugin whose entry point failed to load
    triton: bool = False  # runs Triton kernels: on a CPU that means the interpreter (correctness only)

    def unavailable(self) -> str | None:
        """Why this backend cannot run on this machine at all, or None if it can."""
        if self.load_error:
            return f"{self.name}: {self.load_error}"
        for module in self.requires:
            reason = _import_error(module)
            if reason:
                return f"{self.name}: cannot import {module} ({reason})"
        return None

    def unusable_on(self, device: torch.device) -> str | None:
        """Why this backend can run no case on ``device`` (a device type), or None if some case may run."""
        n = self.name
        if device.type not in self.devices:
            return f"{n}: runs on {', '.join(sorted(self.devices))}, not {device.type}"
        if self.triton and device.type == "cpu" and not triton_interpreter_on():
            # Triton picks the interpreter when it is imported: the variable must be set before that
            return f"{n} on cpu needs TRITON_INTERPRET=1 (set before triton is imported)"
        return None

    def unsupported(self, case: Case, device: torch.device) -> str | None:
        """Why this backend cannot run ``case`` on ``device``, or None if it can."""
        n = self.name
        if case.op not in self.ops:
            return f"{n}: no {case.op} op (serves {', '.join(sorted(self.ops))})"
        reason = self.unusable_on(device)
        if reason:
            return reason
        if case.dtype not in self.dtypes:
            return f"{n}: dtype {case.dtype} not supported ({', '.join(sorted(self.dtypes))})"
        if case.op == "decode" and case.state_dtype not in self.state_dtypes:
            return f"{n}: {case.state_dtype} state pool not supported"
        dims = {case.K, case.V}
        if self.head_dims is not None and not dims <= self.head_dims:
            return f"{n}: head dims {sorted(self.head_dims)} only, case has K={case.K}, V={case.V}"
        if self.max_head_dim is not None and max(dims) > self.max_head_dim:
            return f"{n}: head dims up to {self.max_head_dim}, case has K={case.K}, V={case.V}"
        if self.equal_kv and case.K != case.V:
            return f"{n}: needs K == V, case has K={case.K}, V={case.V}"
        if case.mode == "varlen" and not self.varlen:
            return f"{n}: no varlen support"
        if case.HV != case.H and not self.gva:
            return f"{n}: no GVA support (HV={case.HV} != H={case.H})"
        if case.gating not in self.gating:
            return f"{n}: gating: {case.gating} not supported (serves {', '.join(sorted(self.gating))})"
        if case.qk_l2norm not in self.qk_l2norm:
            return f"{n}: qk_l2norm: {case.qk_l2norm} not supported (serves {', '.join(sorted(self.qk_l2norm))})"
        if case.per_token_slots and not self.per_token_slots:
            return f"{n}: no per-token state slots (speculative verify from num_accepted_tokens)"
        if self.archs is not None and device.type == "cuda":
            cc = torch.cuda.get_device_capability(device)
            if cc not in self.archs:
                want = ", ".join(f"SM{a}{b}" for a, b in sorted(self.archs))
                return f"{n}: {want} only, this GPU is SM{cc[0]}{cc[1]}"
        return self.check(case, device) if self.check else None

    def version(self) -> str | None:
        if self.package is None:
            return None
        try:
            return importlib.metadata.version(self.package)
        except importlib.metadata.PackageNotFoundError:
            return None


def backend(
    name: str,
    *,
    ops: Collection[str],
    devices: Collection[str] = ("cuda",),
    dtypes: Collection[str] = ALL_DTYPES,
    state_dtypes: Collection[str] = ("fp32", "bf16"),
    head_dims: Collection[int] | None = None,
    max_head_dim: int | None = None,
    equal_kv: bool = False,
    varlen: bool = True,
    gva: bool = True,
    gating: Collection[str] = ("pre",),
    qk_l2norm: Collection[str] = ("pre", "kernel"),
    per_token_slots: bool = False,
    archs: Collection[tuple[int, int]] | None = None,
    requires: Collection[str] = (),
    package: str | None = None,
    description: str = "",
    check: Callable[[Case, torch.device], str | None] | None = None,
    triton: bool = False,
) -> Callable[[PrepareFn], Backend]:
    """Turn a ``prepare(problem) -> Prepared`` function into a registered-able :class:`Backend`."""

    def wrap(prepare: PrepareFn) -> Backend:
        return Backend(
            name=name, prepare=prepare, ops=frozenset(ops), devices=frozenset(devices),
            dtypes=frozenset(dtypes), state_dtypes=frozenset(state_dtypes),
            head_dims=frozenset(head_dims) if head_dims is not None else None,
            max_head_dim=max_head_dim, equal_kv=equal_kv, varlen=varlen, gva=gva,
            gating=frozenset(gating), qk_l2norm=frozenset(qk_l2norm), per_token_slots=per_token_slots,
            archs=frozenset(archs) if archs is not None else None,
            requires=tuple(requires), package=package,
            description=description or (prepare.__doc__ or "").strip().split("\n")[0],
            check=check, triton=triton,
        )

    return wrap


@cache
def _import_error(module: str) -> str | None:
    try:
        importlib.import_module(module)
    except Exception as e:  # any failure to import makes the backend unavailable, with the reason
        return f"{type(e).__name__}: {e}"
    return None

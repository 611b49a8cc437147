"""Correctness gate: every backend's outputs against the reference, before its time counts.

Relative RMS error ||out - ref|| / ||ref|| and max abs error, on the output and on the final state
(decode: on the pool slots the case touches, and every other slot must be bit-identical).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from gdnbench.backends.base import Outputs
from gdnbench.backends.torch_common import solve
from gdnbench.problem import Problem
from gdnbench.suite import ReferenceSettings, Tolerances

PRECISIONS = {"fp32": torch.float32, "fp64": torch.float64}


@dataclass
class CheckResult:
    status: str  # PASS | FAIL | NAN
    rel_err_o: float | None = None
    max_err_o: float | None = None
    rel_err_state: float | None = None
    max_err_state: float | None = None
    tol_o: float | None = None
    tol_state: float | None = None
    message: str = ""

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k not in ("status", "message")}


def reference_outputs(p: Problem, settings: ReferenceSettings) -> Outputs:
    """The reference answer for a problem, from the algorithm and precision the suite names."""
    algorithm = settings.backend.removeprefix("torch.")
    return solve(p, algorithm, PRECISIONS[settings.precision])


def rel_rms(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(relative RMS error, max abs error), computed in fp64. A zero reference gives absolute RMS."""
    d = out.double() - ref.double()
    ref_norm = ref.double().norm().item()
    err = d.norm().item()
    return (err / ref_norm if ref_norm > 0 else err), d.abs().max().item() if d.numel() else 0.0


def check(out: Outputs, ref: Outputs, p: Problem, tolerances: Tolerances) -> CheckResult:
    case = p.case
    # The state can be no more exact than the inputs that built it, nor than the pool that stores it.
    tol_o = tolerances.for_dtype(case.dtype)
    tol_state = max(tol_o, tolerances.for_dtype(case.state_dtype)) if case.op == "decode" else tol_o
    res = CheckResult(status="PASS", tol_o=tol_o, tol_state=tol_state)
    problems: list[str] = []

    def compare(name: str, got: torch.Tensor | None, want: torch.Tensor) -> tuple[float | None, float | None]:
        if got is None:
            problems.append(f"no {name} returned")
            return None, None
        if tuple(got.shape) != tuple(want.shape):
            problems.append(f"{name} has shape {tuple(got.shape)}, expected {tuple(want.shape)}")
            return None, None
        if not torch.isfinite(got).all():
            res.status = "NAN"
            problems.append(f"{name} holds NaN/Inf")
            return None, None
        return rel_rms(got, want)

    res.rel_err_o, res.max_err_o = compare("output o", out.o, ref.o)
    if case.op == "decode":
        slots = p.slot_idx.long()
        pool = out.state_pool
        if pool is not None and pool.shape == p.state_pool.shape:
            untouched = torch.ones(pool.shape[0], dtype=torch.bool, device=pool.device)
            untouched[slots[slots >= 0]] = False
            if not torch.equal(pool[untouched], p.state_pool[untouched]):
                problems.append("pool slots outside slot_idx were modified")
        got = pool[slots] if pool is not None and pool.shape == p.state_pool.shape else pool
        res.rel_err_state, res.max_err_state = compare("state pool slots", got, ref.state_pool[slots])
    elif case.output_final_state:
        res.rel_err_state, res.max_err_state = compare("final state", out.final_state, ref.final_state)

    for err, tol, name in ((res.rel_err_o, res.tol_o, "o"), (res.rel_err_state, res.tol_state, "state")):
        if err is not None and not err <= tol:  # NaN compares False: never passes
            problems.append(f"{name} rel err {err:.2e} > tol {tol:.1e}")
    if problems and res.status == "PASS":
        res.status = "FAIL"
    res.message = "; ".join(problems)
    return res

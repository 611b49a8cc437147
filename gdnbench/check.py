"""Correctness gate: every backend's outputs against the reference, before its time counts.

Each output (o, and the final state or the decode pool's written slots) is measured three ways:

  rel    ||out - ref|| / ||ref|| over the whole tensor;
  local  the worst of the same over each sequence and over each value head, so that one wrong sequence or
         head cannot hide in a long pack;
  peak   max |out - ref| / max |ref|, so that one wrong token cannot hide in a long sequence.

A correct kernel's error depends on the case (without decay the state never forgets and rounding
accumulates), so each measure is held to a tolerance derived from the case: ``max(base, MARGIN x floor)``,
where ``floor`` is the same measure of an independent chunked implementation that rounds its intermediates
at the case's precision as kernels do (``reference.chunk_intermediates(storage_dtype=...)``), and ``base``
the suite's per-dtype tolerance (``PEAK_BASE`` times it for peak). docs/design.md states the rule;
docs/decisions/0001-error-floor-margin.md holds the measurements behind the constants.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from gdnbench.backends.base import Outputs
from gdnbench.backends.torch_common import layouts, solve
from gdnbench.problem import DTYPES, Problem
from gdnbench.reference import chunk_intermediates
from gdnbench.results import Status
from gdnbench.suite import ReferenceSettings, Tolerances

PRECISIONS = {"fp32": torch.float32, "fp64": torch.float64}
MEASURES = ("rel", "local", "peak")
# A correct kernel rounds at other points than the floor's implementation: its error may exceed the floor by
# this factor (docs/decisions/0001-error-floor-margin.md).
MARGIN = 2.5
# The peak error of correctly rounded outputs is a few times their relative RMS error: the peak's base
# tolerance is this multiple of the suite's (docs/decisions/0001-error-floor-margin.md).
PEAK_BASE = 3.0


@dataclass(frozen=True)
class Errors:
    """The three measures of one output against the reference; ``worst`` names the group of ``local``."""

    rel: float
    local: float
    peak: float
    max_abs: float
    worst: str

    def get(self, measure: str) -> float:
        return getattr(self, measure)


@dataclass
class CheckResult:
    status: Status  # PASS, FAIL or NAN
    rel_err_o: float | None = None
    local_err_o: float | None = None
    peak_err_o: float | None = None
    max_err_o: float | None = None
    floor_o: float | None = None
    local_floor_o: float | None = None
    peak_floor_o: float | None = None
    tol_o: float | None = None
    local_tol_o: float | None = None
    peak_tol_o: float | None = None
    rel_err_state: float | None = None
    local_err_state: float | None = None
    peak_err_state: float | None = None
    max_err_state: float | None = None
    floor_state: float | None = None
    local_floor_state: float | None = None
    peak_floor_state: float | None = None
    tol_state: float | None = None
    local_tol_state: float | None = None
    peak_tol_state: float | None = None
    message: str = ""

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k not in ("status", "message")}


def reference_outputs(p: Problem, settings: ReferenceSettings) -> Outputs:
    """The reference answer for a problem, from the algorithm and precision the suite names."""
    algorithm = settings.backend.removeprefix("torch.")
    return solve(p, algorithm, PRECISIONS[settings.precision])


def floor_outputs(p: Problem) -> Outputs:
    """What a correct kernel at the case's precision computes: prefill by the chunked algorithm with its
    intermediates rounded as kernels round them; decode by the recurrence in fp32 (each state rounded to the
    pool's dtype, as the reference does), its output rounded to the input dtype."""
    dtype = DTYPES[p.case.dtype]
    if p.case.op == "decode":
        out = solve(p, "recurrent", torch.float32)
        return Outputs(o=out.o.to(dtype), state_pool=out.state_pool)
    r = chunk_intermediates(p.q, p.k, p.v, p.g, p.beta, scale=p.scale, initial_state=p.initial_state,
                            cu_seqlens=layouts(p).get("cu_seqlens"), qk_l2norm=p.qk_l2norm_in_kernel,
                            storage_dtype=dtype)
    return Outputs(o=r.o.to(dtype), final_state=r.final_state)


class Gate:
    """The correctness gate of one case: its reference, the error floor and the tolerances, built once.

    ``p`` must be the pristine problem: untouched decode slots are compared with its pool.
    """

    def __init__(self, p: Problem, ref: Outputs, tolerances: Tolerances) -> None:
        case = p.case
        self.p, self.ref = p, ref
        self.tensors = ("o", "state") if case.op == "decode" or case.output_final_state else ("o",)
        self._token_seq = _token_sequences(p)
        self._slots = p.slot_idx.long().flatten() if case.op == "decode" else None
        # The state can be no more exact than the inputs that built it, nor than the pool that stores it.
        tol_o = tolerances.for_dtype(case.dtype)
        base = {"o": tol_o,
                "state": max(tol_o, tolerances.for_dtype(case.state_dtype)) if case.op == "decode" else tol_o}
        floor_out = floor_outputs(p)
        self.floor = {name: self._errors(name, self._tensor(name, floor_out)) for name in self.tensors}
        self.tol = {name: {m: max(base[name] * (PEAK_BASE if m == "peak" else 1.0),
                                  MARGIN * self.floor[name].get(m)) for m in MEASURES}
                    for name in self.tensors}

    def check(self, out: Outputs) -> CheckResult:
        """PASS, FAIL (with every reason) or NAN for one backend's outputs."""
        res = CheckResult(status=Status.PASS)
        problems: list[str] = []
        if self.p.case.op == "decode":
            problems += self._untouched_slots(out.state_pool)
        for name in self.tensors:
            got = self._tensor(name, out)
            want = self._tensor(name, self.ref)
            label = {"o": "output o", "state": "final state" if self._slots is None else "state pool slots"}[name]
            if got is None:
                problems.append(f"no {label} returned")
                continue
            if tuple(got.shape) != tuple(want.shape):
                problems.append(f"{label} has shape {tuple(got.shape)}, expected {tuple(want.shape)}")
                continue
            if not torch.isfinite(got).all():
                res.status = Status.NAN
                problems.append(f"{label} holds NaN/Inf")
                continue
            errors, floor, tol = self._errors(name, got), self.floor[name], self.tol[name]
            setattr(res, f"max_err_{name}", errors.max_abs)
            for m in MEASURES:
                prefix = "" if m == "rel" else f"{m}_"  # floor_o, local_floor_o, peak_floor_o
                setattr(res, f"{m}_err_{name}", errors.get(m))
                setattr(res, f"{prefix}floor_{name}", floor.get(m))
                setattr(res, f"{prefix}tol_{name}", tol[m])
                if not errors.get(m) <= tol[m]:  # NaN compares False: never passes
                    problems.append(f"{name} {_describe(m, errors)} {errors.get(m):.2e} > tol {tol[m]:.1e}")
        if problems and res.status == Status.PASS:
            res.status = Status.FAIL
        res.message = "; ".join(problems)
        return res

    def _tensor(self, name: str, out: Outputs) -> torch.Tensor | None:
        if name == "o":
            return out.o
        if self._slots is None:
            return out.final_state
        pool = out.state_pool
        return pool[self._slots] if pool is not None and pool.shape == self.p.state_pool.shape else pool

    def _errors(self, name: str, got: torch.Tensor) -> Errors:
        return _measure(got, self._tensor(name, self.ref), self._row_sequences(name), tokens=name == "o")

    def _row_sequences(self, name: str) -> torch.Tensor:
        """The sequence of each row: of each token of o, of each state written."""
        if name == "o":
            return self._token_seq
        if self._slots is None:
            return torch.arange(self.p.case.N, device=self.p.device)
        return torch.arange(self._slots.numel(), device=self.p.device) // self.p.case.state_writes

    def _untouched_slots(self, pool: torch.Tensor | None) -> list[str]:
        pristine = self.p.state_pool
        if pool is None or pool.shape != pristine.shape:
            return []
        untouched = torch.ones(pool.shape[0], dtype=torch.bool, device=pool.device)
        untouched[self._slots[self._slots >= 0]] = False
        changed = (pool[untouched] != pristine[untouched]).flatten(1).any(1)
        n = int(changed.sum())
        return [f"{n} pool slot(s) outside slot_idx were modified"] if n else []


def _token_sequences(p: Problem) -> torch.Tensor:
    """The sequence of every token of o, in o's [B * T] row order."""
    B, T = p.q.shape[:2]
    if p.cu_seqlens is not None:
        lens = p.cu_seqlens[1:] - p.cu_seqlens[:-1]
        return torch.repeat_interleave(torch.arange(len(lens), device=p.device), lens, output_size=T)
    return torch.arange(B, device=p.device).repeat_interleave(T)


def _measure(got: torch.Tensor, want: torch.Tensor, row_seq: torch.Tensor, tokens: bool) -> Errors:
    """rel, local and peak errors of ``got`` against ``want``, in fp64: o [B, T, HV, V] (rows: tokens) or
    states [rows, HV, K, V]; ``row_seq`` gives each row's sequence."""
    as_rows = (lambda x: x.flatten(0, 1).flatten(2)) if tokens else (lambda x: x.flatten(2))
    r = as_rows(want).double()  # [rows, HV, elements]
    d = as_rows(got).double() - r
    if d.numel() == 0:
        return Errors(0.0, 0.0, 0.0, 0.0, "")
    d2, r2 = d.pow(2).sum(-1), r.pow(2).sum(-1)  # [rows, HV]
    n_seq = int(row_seq.max()) + 1
    seq_rel = _ratio(d2.new_zeros(n_seq).index_add_(0, row_seq, d2.sum(1)),
                     r2.new_zeros(n_seq).index_add_(0, row_seq, r2.sum(1)))
    head_rel = _ratio(d2.sum(0), r2.sum(0))
    seq, head = int(seq_rel.argmax()), int(head_rel.argmax())
    if seq_rel[seq] >= head_rel[head]:
        size = int((row_seq == seq).sum()) if tokens else 0
        worst = f"sequence {seq}" + (f" ({size} token{'s' if size > 1 else ''})" if tokens else "")
        local = seq_rel[seq]
    else:
        worst, local = f"value head {head}", head_rel[head]
    max_abs, ref_max = d.abs().max(), r.abs().max()
    return Errors(rel=float(_ratio(d2.sum(), r2.sum())), local=float(local),
                  peak=float(max_abs / ref_max if ref_max > 0 else max_abs), max_abs=float(max_abs), worst=worst)


def _ratio(err2: torch.Tensor, ref2: torch.Tensor) -> torch.Tensor:
    """sqrt(err2 / ref2) where the reference is non-zero, else the absolute sqrt(err2)."""
    return torch.where(ref2 > 0, err2 / ref2.clamp_min(torch.finfo(ref2.dtype).tiny), err2).sqrt()


def _describe(measure: str, errors: Errors) -> str:
    return {"rel": "rel err", "local": f"rel err in {errors.worst}",
            "peak": "peak err (max abs / max |ref|)"}[measure]

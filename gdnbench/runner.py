"""The run loop: suite -> cases -> problem -> backends -> check -> timing -> stats -> rows.

Per case: build the inputs, compute the reference once, then for every backend: SKIP if it is
unavailable or does not support the case; otherwise prepare, call once (compile/autotune), check
against the reference, and only then time it. Exceptions, OOM and timeouts become rows; the run goes
on. Rows are handed to the RunDir as each case finishes.
"""

from __future__ import annotations

import contextlib
import re
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from gdnbench import roofline, stats, telemetry
from gdnbench.backends import Backend, Prepared
from gdnbench.check import Gate, reference_outputs
from gdnbench.interrupts import reraise_interrupt
from gdnbench.problem import Problem, make_problem
from gdnbench.results import NOT_RUN, Row, Status
from gdnbench.suite import Case, Suite
from gdnbench.timing import Measurement, TimingConfig, copy_moving, measure_interleaved


@dataclass
class RunOptions:
    device: torch.device
    timing: TimingConfig
    baseline: dict[str, str]  # op -> backend name
    seed: int
    dump_dir: Path | None = None
    interleave: bool = False  # time a case's backends in alternation (A B A B ...)
    ceilings: dict[str, float] | None = None  # measured copy GB/s and matmul TFLOP/s
    copy_reference: bool = False  # time a copy moving each case's bytes beside every backend


class BackendTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise BackendTimeout in the main thread after ``seconds`` (Python-level code only)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield
        return

    def expire(_sig: int, _frame: Any) -> None:
        raise BackendTimeout(f"exceeded the {seconds:g} s limit per (case, backend)")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def select_cases(suite: Suite, pattern: str | None) -> list[Case]:
    """Cases whose id contains ``pattern`` (a plain substring; several may be given comma-free)."""
    if not pattern:
        return list(suite.cases)
    return [c for c in suite.cases if pattern in c.id]


@dataclass(frozen=True)
class Step:
    """What a case is doing now: building its inputs and reference, running one backend (its first call,
    check and, unless interleaved, timing), or timing several together. The worker reports each to the parent,
    which limits its time and blames a crash on its backends."""

    stage: str  # "inputs", "backend" or "timing"
    backends: tuple[str, ...]
    case_id: str

    def __str__(self) -> str:
        what = {"inputs": "inputs + reference", "timing": "timing " + " vs ".join(self.backends)}
        return f"{what.get(self.stage, ', '.join(self.backends))}  {self.case_id}"


def run_case(case: Case, backends: Sequence[Backend], suite: Suite, opts: RunOptions,
             on_step: Callable[[Step], None] = lambda _s: None) -> tuple[list[Row], list[dict]]:
    """Rows and raw samples for one case, one row per backend; each row's ``case_s`` is the case's wall time
    (inputs, reference, error floor, every backend's calls, checks and timing)."""
    start = time.perf_counter()
    rows, samples = _run_case(case, backends, suite, opts, on_step)
    for row in rows:
        row.case_s = round(time.perf_counter() - start, 3)
    return rows, samples


def _run_case(case: Case, backends: Sequence[Backend], suite: Suite, opts: RunOptions,
              on_step: Callable[[Step], None]) -> tuple[list[Row], list[dict]]:
    rows: list[Row] = []
    samples: list[dict] = []
    on_step(Step("inputs", tuple(b.name for b in backends), case.id))
    try:
        problem = make_problem(case, opts.seed, opts.device)
        gate = Gate(problem, reference_outputs(problem, suite.reference), suite.tolerances)
    except Exception as e:  # e.g. OOM building a huge case: every backend row says so
        reraise_interrupt(e)
        status = Status.OOM if isinstance(e, torch.OutOfMemoryError) else Status.ERROR
        msg = f"building inputs/reference failed: {type(e).__name__}: {e}"
        _free(opts.device)
        return status_rows(case, [b.name for b in backends], suite, opts.device, status, msg), []

    dumped: dict[str, dict[str, torch.Tensor | None]] = {}
    waiting: list[Checked] = []  # to be timed together (interleaved)
    for b in backends:
        on_step(Step("backend", (b.name,), case.id))
        row = _row(case, suite, opts.device, b.name, version=b.version())
        if b.triton and opts.device.type == "cpu":
            # Triton on a CPU runs in its interpreter: the check means something, the time does not
            row.update(interpreted=True, note="Triton interpreter: correctness only, no speedup")
        rows.append(row)
        reason = b.unavailable() or b.unsupported(case, opts.device)
        if reason:
            row.update(status=Status.SKIP, error=reason)
            continue
        with _errors_become_rows([row], opts.device, free=not opts.interleave):
            with time_limit(suite.timing.timeout_s):
                own = problem.copy()  # what the backend writes stays its own
                prepared = b.prepare(own)
                item = Checked(row, prepared, own)
                row.update(**_first_call_and_check(prepared, gate, opts.device))
                if opts.dump_dir is not None:
                    dumped[b.name] = _dumpable(prepared.outputs(), problem)
                if row.status == Status.NAN:  # nothing worth timing
                    _inputs_intact(item, gate)
                elif opts.interleave:
                    waiting.append(item)
                else:
                    _time([item], case, opts, samples, gate)

    if waiting:
        on_step(Step("timing", tuple(item.row.backend for item in waiting), case.id))
        with _errors_become_rows([item.row for item in waiting], opts.device, free=True):
            with time_limit(suite.timing.timeout_s * len(waiting)):
                _time(waiting, case, opts, samples, gate)
    _add_speedups(rows, opts.baseline.get(case.op), samples, paired=opts.interleave)
    if opts.dump_dir is not None:
        _dump(opts.dump_dir, problem, {"reference": _dumpable(gate.ref, problem), **dumped})
    return rows, samples


@dataclass
class Checked:
    """A backend's row, its prepared call and the copy of the problem it was given."""

    row: Row
    prepared: Prepared
    problem: Problem


@contextlib.contextmanager
def _errors_become_rows(rows: list[Row], device: torch.device, free: bool) -> Iterator[None]:
    """A timeout, OOM or exception marks ``rows`` (not the run) as failed; the run goes on."""
    try:
        yield
    except BackendTimeout as e:
        _mark(rows, status=Status.TIMEOUT, error=str(e))
    except torch.OutOfMemoryError as e:
        _mark(rows, status=Status.OOM, error=_first_line(e))
    except Exception as e:
        reraise_interrupt(e)
        _mark(rows, status=Status.ERROR, error=f"{type(e).__name__}: {_first_line(e)}", note=_where(e))
    finally:
        if free:
            _free(device)


def _mark(rows: list[Row], **cols: Any) -> None:
    for r in rows:
        r.update(**cols)


def _first_call_and_check(prepared: Prepared, gate: Gate, device: torch.device) -> dict[str, Any]:
    """Call once (JIT compile / autotune happen here, untimed) and check the result."""
    out: dict[str, Any] = {"path": prepared.path}
    if prepared.reset:
        prepared.reset()
    t0 = time.perf_counter()
    prepared.call()
    _sync(device)
    out["warmup_s"] = round(time.perf_counter() - t0, 4)
    verdict = gate.check(prepared.outputs())
    out.update(status=verdict.status, error=verdict.message, **verdict.as_dict())
    return out


def _recheck_timed_call(item: Checked, replay: Callable[[], object], gate: Gate, device: torch.device) -> None:
    """Check what the timed call computes, not only the first call: every output the backend returned is
    poisoned with NaN, its state reset, and what the timer ran (the graph's replay) runs once more."""
    outputs = item.prepared.outputs()
    with torch.inference_mode():  # outputs allocated under inference mode can only be written there
        for f in fields(outputs):
            t = getattr(outputs, f.name)
            if t is not None and t.is_floating_point():
                t.fill_(float("nan"))
    if item.prepared.reset:
        item.prepared.reset()
    replay()
    _sync(device)
    verdict = gate.check(item.prepared.outputs())
    if verdict.status != Status.PASS:
        item.row.update(status=Status.FAIL, error="the timed call, run again on poisoned outputs: " + verdict.message)


def _inputs_intact(item: Checked, gate: Gate) -> None:
    """FAIL a backend that wrote into inputs it does not own (its copy of the problem's tensors)."""
    changed = gate.p.changed_inputs(item.problem)
    if changed:
        why = "wrote into inputs it does not own: " + ", ".join(changed)
        item.row.update(status=Status.FAIL, error="; ".join(filter(None, [why, item.row.error])))


def _time(items: list[Checked], case: Case, opts: RunOptions, samples: list[dict], gate: Gate) -> None:
    """Time the prepared backends (several: in alternation), fill in their rows and raw samples, then check
    the timed calls' outputs and each backend's inputs.

    With ``opts.copy_reference`` a copy moving the case's bytes (roofline model) is timed as one more
    series in the same alternation, so each row's ``pct_copy`` compares it with what a copy achieves at
    that size under the same timer (launch and ramp included), not only with the 1 GiB copy's rate."""
    timed = [(item.prepared.call, item.prepared.reset) for item in items]
    notes = [f"interleaved with {len(items) - 1} other(s)"] if len(items) > 1 else []
    if opts.copy_reference:
        try:
            timed.append((copy_moving(int(roofline.traffic(case)[0]), opts.device), None))
            notes.append("timed beside a copy of its bytes")
        except torch.OutOfMemoryError:
            notes.append("no copy reference: its buffers did not fit")
    measurements = measure_interleaved(timed, device=opts.device, config=opts.timing)
    gpu = telemetry.read(opts.device)
    copy = measurements[len(items)] if len(measurements) > len(items) else None
    for item, m in zip(items, measurements):
        row = item.row
        row.update(**_timing_columns(m, case, opts, copy), **gpu)
        if notes:
            row.note = "; ".join(filter(None, [row.note, *notes]))
        samples.append({"case_id": case.id, "backend": row.backend, "timer": m.timer, "l2": m.l2,
                        "samples_us": m.samples_us})
        if row.status == Status.PASS:
            _recheck_timed_call(item, m.replay, gate, opts.device)
        _inputs_intact(item, gate)


def _timing_columns(m: Measurement, case: Case, opts: RunOptions, copy: Measurement | None) -> dict[str, Any]:
    s = stats.summarize(m.samples_us)
    lo, hi = stats.median_ci(m.samples_us)
    nbytes, flops = roofline.traffic(case)
    sec = s.median * 1e-6
    cols: dict[str, Any] = {"timer": m.timer, "l2": m.l2, **s.as_dict(), "ci_lo_us": lo, "ci_hi_us": hi,
                            "converged": m.converged, "gbytes": nbytes / 1e9, "gflop": flops / 1e9,
                            "gbps": nbytes / sec / 1e9, "tflops": flops / sec / 1e12}
    if m.note:
        cols["note"] = m.note
    ceil = opts.ceilings or {}
    if ceil.get("copy_gbps"):
        cols["pct_bw"] = 100 * cols["gbps"] / ceil["copy_gbps"]
    if ceil.get("matmul_tflops"):
        cols["pct_flops"] = 100 * cols["tflops"] / ceil["matmul_tflops"]
    if copy is not None:
        cols["copy_us"] = stats.summarize(copy.samples_us).median
        cols["pct_copy"] = 100 * cols["copy_us"] / s.median
    return cols


def _add_speedups(rows: list[Row], baseline: str | None, samples: list[dict], paired: bool) -> None:
    """speedup = baseline over backend, with a 95% bootstrap CI from the raw samples, for timed PASS rows when
    the baseline passed: the median per-round ratio when ``paired`` (timed interleaved, round by round), else the
    ratio of medians (docs/decisions/0025-paired-intervals.md)."""
    if baseline is None:
        return
    ref = next((r for r in rows if r.backend == baseline), None)
    if ref is None or ref.status != Status.PASS or not ref.median_us or ref.interpreted:
        return
    raw = {s["backend"]: s["samples_us"] for s in samples}
    for r in rows:
        r.baseline = baseline
        if r.status == Status.PASS and r.median_us and not r.interpreted:
            pair = paired and len(raw[baseline]) == len(raw[r.backend])
            r.speedup, r.speedup_lo, r.speedup_hi = stats.median_ratio_ci(raw[baseline], raw[r.backend], paired=pair)


def _dumpable(result: Any, p: Problem) -> dict[str, torch.Tensor | None]:
    """o and the final state on the CPU; for decode the final state is the pool at slot_idx."""
    state = result.final_state
    if p.case.op == "decode" and result.state_pool is not None:
        state = result.state_pool[p.slot_idx.long()]
    return {"o": result.o.detach().cpu(), "final_state": None if state is None else state.detach().cpu()}


def _dump(dump_dir: Path, p: Problem, outputs: dict) -> None:
    """One torch.save file per case: its fields, canonical inputs and each backend's outputs (CPU)."""
    dump_dir.mkdir(parents=True, exist_ok=True)
    inputs = {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in p.tensors().items()}
    name = re.sub(r"[^A-Za-z0-9=.,_-]+", "_", p.case.id) + ".pt"
    torch.save({"case": p.case.fields(), "inputs": inputs, "outputs": outputs}, dump_dir / name)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        # after a sticky error (an illegal memory access) both raise again: device_lost reports that
        with contextlib.suppress(Exception):
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()


def device_lost(device: torch.device) -> str | None:
    """Why the device can no longer run anything, or None. CUDA errors such as an illegal memory
    access are sticky: every later call in this process fails, so later rows would measure nothing."""
    if device.type != "cuda":
        return None
    try:
        torch.ones(1, device=device).add_(1)
        torch.cuda.synchronize(device)
    except Exception as e:
        return f"{type(e).__name__}: {_first_line(e)}"
    return None


def not_run_rows(case: Case, backends: Sequence[Backend], suite: Suite, device: torch.device,
                 reason: str) -> list[Row]:
    """ERROR rows for a case that was never started."""
    return status_rows(case, [b.name for b in backends], suite, device, Status.ERROR, NOT_RUN + reason)


def status_rows(case: Case, names: Sequence[str], suite: Suite, device: torch.device, status: Status,
                error: str) -> list[Row]:
    """One row per backend name, each with ``status`` and ``error`` and nothing measured."""
    return [_row(case, suite, device, name, status=status, error=error) for name in names]


def _row(case: Case, suite: Suite, device: torch.device, backend: str, **cols: Any) -> Row:
    return Row(suite=suite.name, case_id=case.id, backend=backend, device=_device_name(device),
               case=case.fields(), **cols)


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:500] if text else type(e).__name__


def _where(e: BaseException) -> str:
    """The innermost frame of the traceback, so an ERROR row points at the failing line."""
    tb = traceback.extract_tb(e.__traceback__)
    return f"at {tb[-1].filename}:{tb[-1].lineno}" if tb else ""

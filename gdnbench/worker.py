"""Cases run in a worker process, so that a crash, an exit or a native hang becomes a row, not the run's end.

``gdnbench run`` keeps one worker for the run (a spawned process: a CUDA context of its own) and sends it one
case at a time; the worker builds the inputs and the reference and runs every backend (``runner.run_case``),
reporting each step (``runner.Step``). One worker runs all of a case's backends because interleaved timing
(A B A B ...) needs them in one process, and the reference is built once per case.

The parent watches it. A worker that dies (a signal such as SIGSEGV, ``os._exit``, an abort in a library) or
that reports nothing for longer than its step may take (a hang in native code, which the worker's own
Python-level limit cannot interrupt) is killed; the backends of the step it was in get a CRASH or TIMEOUT row
with the cause and the worker's last stderr lines, and a fresh worker runs the case's other backends again.
Building the inputs and the reference is a step too, limited by the suite's ``timeout_s``. A worker whose
CUDA context is lost (a sticky error such as an illegal memory access) is replaced before the next case.

The worker's stderr (library warnings, compiler messages) goes to ``worker.log`` in the run directory.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from gdnbench.backends import Backend, get_backend
from gdnbench.results import Row, Status
from gdnbench.runner import RunOptions, Step, device_lost, run_case, status_rows
from gdnbench.shards import estimated_s
from gdnbench.suite import Case, Suite

WORKER_LOG = "worker.log"
START_S = 300.0  # a fresh worker imports torch and the backends' libraries before its first step
GRACE_S = 10.0  # past a step's own limit: the worker's Python-level limit gets to make a TIMEOUT row first
TAIL_LINES = 6  # of the worker's stderr, on a CRASH row
FAULT_FRAMES = 3  # innermost Python frames of a fatal signal's trace, on a CRASH row


class HarnessError(RuntimeError):
    """An exception in the harness's own code inside the worker (not a backend's): a bug to report."""


class CaseWorker:
    """A worker process that runs cases for the parent; started on first use, replaced when it dies.

    ``specs`` maps each backend's name to what the worker loads it by (``get_backend``): its registered
    name, or the ``module:attribute`` it was given as."""

    def __init__(self, log: Path, specs: dict[str, str]) -> None:
        self.log = log
        self.specs = specs
        self._proc: multiprocessing.process.BaseProcess | None = None
        self._conn: multiprocessing.connection.Connection | None = None
        self._log_offset = 0  # where the current worker's stderr starts in the log

    def run_case(self, case: Case, backends: Sequence[Backend], suite: Suite, opts: RunOptions,
                 on_step: Callable[[str], None] = lambda _s: None) -> tuple[list[Row], list[dict], str | None]:
        """Rows (in ``backends``' order) and samples of ``case``, and why the worker's CUDA context was lost
        after it (None if it was not)."""
        start = time.perf_counter()
        failed: dict[str, Row] = {}
        while True:
            todo = [b.name for b in backends if b.name not in failed]
            if not todo:
                rows, samples, lost = [], [], None
                break
            outcome = self._attempt(case, todo, suite, opts, on_step)
            if outcome[0] == "done":
                _, rows, samples, lost = outcome
                if lost:
                    self.close()  # its context is gone: the next case gets a fresh process
                break
            _, step, status, error = outcome
            self.close()
            names = todo if step is None or step.stage == "inputs" else list(step.backends)
            failed.update((r.backend, r) for r in status_rows(case, names, suite, opts.device, status, error))
        by_name = {r.backend: r for r in [*rows, *failed.values()]}
        ordered = [by_name[b.name] for b in backends]
        for r in failed.values():
            r.case_s = round(time.perf_counter() - start, 3)
        return ordered, samples, lost

    def close(self) -> None:
        """Stop the worker (killed if it does not leave at once)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._proc is not None:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join(timeout=10)
            self._proc = None

    def _attempt(self, case: Case, names: list[str], suite: Suite, opts: RunOptions,
                 on_step: Callable[[str], None]) -> tuple[Any, ...]:
        """("done", rows, samples, lost) or ("died", step, status, error)."""
        self._start()
        assert self._conn is not None and self._proc is not None
        self._conn.send((case, [self.specs.get(n, n) for n in names], suite, opts))
        step: Step | None = None
        deadline = time.monotonic() + START_S
        while True:
            if self._conn.poll(0.2):
                try:
                    kind, *payload = self._conn.recv()
                except EOFError:
                    return ("died", step, Status.CRASH, self._death())
                if kind == "step":
                    step = payload[0]
                    on_step(str(step))
                    deadline = time.monotonic() + _step_limit(step, suite)
                elif kind == "done":
                    return ("done", *payload)
                else:
                    raise HarnessError(f"the harness failed in its worker:\n{payload[0]}")
            elif not self._proc.is_alive():
                return ("died", step, Status.CRASH, self._death())
            elif time.monotonic() > deadline:
                limit = _step_limit(step, suite) if step else START_S
                what = "building the inputs and the reference" if step and step.stage == "inputs" else "it"
                return ("died", step, Status.TIMEOUT,
                        f"no answer in {limit:g} s: {what} hung outside Python, so the worker was killed")

    def _start(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            return
        self.close()
        self._log_offset = self.log.stat().st_size if self.log.is_file() else 0
        parent, child = multiprocessing.Pipe()
        self._proc = multiprocessing.get_context("spawn").Process(
            target=_serve, args=(child, str(self.log)), name="gdnbench-worker", daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent

    def _death(self) -> str:
        assert self._proc is not None
        self._proc.join(timeout=10)
        code = self._proc.exitcode
        if code is not None and code < 0:
            cause = f"the worker was killed by {signal.Signals(-code).name}"
        else:
            cause = f"the worker exited with code {code}"
        lines = _log_lines(self.log, self._log_offset)
        fault = fatal_signal_frames(lines, FAULT_FRAMES)
        if fault:
            return f"{cause}; where it was (innermost Python frames first): {' | '.join(fault)}"
        tail = lines[-TAIL_LINES:]
        return cause + (f"; its last stderr lines: {' | '.join(tail)}" if tail else "")


def run_in_process(case: Case, backends: Sequence[Backend], suite: Suite, opts: RunOptions,
                   on_step: Callable[[str], None] = lambda _s: None) -> tuple[list[Row], list[dict], str | None]:
    """``CaseWorker.run_case`` without a worker (``--no-isolate``): a crash or a native hang ends the run."""
    rows, samples = run_case(case, backends, suite, opts, on_step=lambda s: on_step(str(s)))
    return rows, samples, device_lost(opts.device)


def _step_limit(step: Step, suite: Suite) -> float:
    if step.stage == "inputs":
        return suite.timing.timeout_s
    return suite.timing.timeout_s * max(1, len(step.backends)) + GRACE_S


def _log_lines(path: Path, offset: int) -> list[str]:
    """The log's non-blank lines from byte ``offset`` on, stripped and cut to 300 characters."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return [line.strip()[:300] for line in text.splitlines() if line.strip()]


def fatal_signal_frames(lines: Sequence[str], n: int) -> list[str]:
    """From stderr lines holding a ``faulthandler`` trace (the worker enables it): the fatal error and the
    ``n`` innermost frames of the thread it hit, e.g. ``["Fatal Python error: Segmentation fault", 'File
    "lib.py", line 9 in init']``; [] when there is no trace. A native crash prints nothing else, so these
    frames are what names the call that crashed."""
    starts = [i for i, line in enumerate(lines) if line.startswith("Fatal Python error:")]
    if not starts:
        return []
    trace = lines[starts[-1] + 1:]
    # every thread's stack is dumped, in no set order; the one that crashed is the "Current thread"
    current = next((i for i, line in enumerate(trace) if line.startswith(("Current thread", "Stack ("))), 0)
    frames = []
    for line in trace[current:]:
        if line.startswith("File "):
            frames.append(line)
        elif frames:  # its frames end where the next block begins
            break
    return [lines[starts[-1]], *frames[:n]]


def _serve(conn: multiprocessing.connection.Connection, log: str) -> None:
    """The worker: run each case it is sent, report each step, answer with the rows."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops the worker
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    faulthandler.enable()  # a fatal signal leaves the Python stack in the log: the CRASH row names the call
    while True:
        try:
            case, specs, suite, opts = conn.recv()
        except EOFError:
            return
        try:
            if opts.device.type == "cuda" and opts.device.index is not None:
                torch.cuda.set_device(opts.device)  # the worker's kernels launch on its GPU (--gpus)
            backends = [get_backend(spec) for spec in specs]
            rows, samples = run_case(case, backends, suite, opts, on_step=lambda s: conn.send(("step", s)))
            conn.send(("done", rows, samples, device_lost(opts.device)))
        except BaseException:
            conn.send(("failed", traceback.format_exc()))
            return


class WorkerPool:
    """One CaseWorker per device (``--gpus``), each taking the next case as it finishes one: cases are dealt
    largest first (``shards.estimated_s``), so the devices finish about together. A worker that crashes is
    replaced as a single worker is; the others go on."""

    def __init__(self, devices: Sequence[torch.device], log_dir: Path, specs: dict[str, str]) -> None:
        self.devices = list(devices)
        self.workers = [CaseWorker(log_dir / f"worker-{i}.log", specs) for i in range(len(self.devices))]
        self._stop = threading.Event()

    def run(self, cases: Sequence[Case], backends: Sequence[Backend], suite: Suite, opts: RunOptions,
            on_done: Callable[[Case, list[Row], list[dict], str | None, str], None]) -> None:
        """Run every case; ``on_done(case, rows, samples, lost, where)`` is called under a lock as each
        finishes (``where``: the worker and its device). Ctrl-C stops every worker and returns without the
        cases in flight."""
        todo = deque(sorted(cases, key=lambda c: (-estimated_s(c), c.id)))
        lock = threading.Lock()
        errors: list[BaseException] = []

        def drive(index: int) -> None:
            worker, own = self.workers[index], replace(opts, device=self.devices[index])
            while not self._stop.is_set():
                with lock:
                    if not todo:
                        return
                    case = todo.popleft()
                try:
                    rows, samples, lost = worker.run_case(case, backends, suite, own)
                except BaseException as e:  # a harness bug: stop the run, report it from the main thread
                    errors.append(e)
                    self._stop.set()
                    return
                if self._stop.is_set():
                    return  # interrupted: the case's rows may come from a killed worker
                with lock:
                    on_done(case, rows, samples, lost, f"worker {index} on {self.devices[index]}")

        threads = [threading.Thread(target=drive, args=(i,), daemon=True) for i in range(len(self.workers))]
        for t in threads:
            t.start()
        try:
            while any(t.is_alive() for t in threads):
                for t in threads:
                    t.join(timeout=0.2)
        finally:
            self._stop.set()
            self.close()
            for t in threads:
                t.join(timeout=30)
        if errors:
            raise errors[0]

    def close(self) -> None:
        for worker in self.workers:
            worker.close()

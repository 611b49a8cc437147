"""Where a backend's time goes: the GPU kernels one timed call launches, from torch.profiler (CUPTI).

The timers give one number per call; this splits it into kernels (count per call, mean duration,
share of the call's kernel time), so a kernel variant can be compared stage by stage with its peers.
Kernel time is device busy time: the gaps between kernels (launch latency) are not in it. For
counters (occupancy, stall reasons, DRAM throughput), ``mark_one_call`` brackets one warmed call for
Nsight Compute instead.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from gdnbench.backends.base import Backend, Prepared
from gdnbench.problem import Problem


@dataclass
class KernelStat:
    name: str
    per_call: float  # launches per timed call
    mean_us: float  # mean duration of one launch
    total_us: float  # per timed call


def _kernels(prof: profile) -> dict[str, list[float]]:
    found: dict[str, list[float]] = defaultdict(list)
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            found[e.name].append(e.time_range.elapsed_us())
    return found


def _warmed(backend: Backend, problem: Problem, warmup: int) -> tuple[Prepared, Callable[[], None]]:
    """The backend prepared for ``problem`` and one timed-region call (reset first, as the timers do),
    after ``warmup`` calls (which include any autotuning)."""
    prepared = backend.prepare(problem)

    def once() -> None:
        if prepared.reset is not None:
            prepared.reset()
        prepared.call()

    for _ in range(warmup):
        once()
    torch.cuda.synchronize()
    return prepared, once


def profile_backend(backend: Backend, problem: Problem, calls: int = 10, warmup: int = 3) -> list[KernelStat]:
    """The kernels of ``calls`` calls of the backend's timed region (after ``warmup`` calls, which
    include any autotuning), slowest first. Kernels of ``reset`` (e.g. a pool restore), run before each
    call as the timers do, are profiled separately and taken out."""
    prepared, once = _warmed(backend, problem, warmup)
    reset: dict[str, list[float]] = {}
    if prepared.reset is not None:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                prepared.reset()
            torch.cuda.synchronize()
        reset = _kernels(prof)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            once()
        torch.cuda.synchronize()
    stats = []
    for name, durations in _kernels(prof).items():
        # take out what reset launched of this kernel on its own (count and time)
        n = len(durations) - len(reset.get(name, ()))
        total = sum(durations) - sum(reset.get(name, ()))
        if n > 0:
            stats.append(KernelStat(name, n / calls, total / n, total / calls))
    return sorted(stats, key=lambda s: -s.total_us)


def mark_one_call(backend: Backend, problem: Problem, warmup: int = 3) -> None:
    """One call of the backend's timed region (after ``warmup`` calls) between cudaProfilerStart and
    cudaProfilerStop, for an external profiler started with ``--profile-from-start off`` (ncu, nsys):
    it then sees each kernel of one call, and none of the autotuning before it."""
    _, once = _warmed(backend, problem, warmup)
    torch.cuda.cudart().cudaProfilerStart()
    try:
        once()
        torch.cuda.synchronize()
    finally:
        torch.cuda.cudart().cudaProfilerStop()

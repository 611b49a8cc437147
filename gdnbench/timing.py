"""Timers: CUDA-graph replay, CUDA events and wall clock, with L2 flush and adaptive sampling.

docs/design.md ("Measurement") states the rules. Every sample is one call of the timed function, in microseconds.
``l2_flush_buffer`` and ``event_rounds`` are the sampling core that the bundled kernels' tuner
(``gdnbench_kernels.tuning``) shares.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from gdnbench.interrupts import reraise_interrupt
from gdnbench.stats import median_ci

Timer = Literal["graph", "events", "wall"]

# Samples recorded between two host synchronisations: enough to keep the GPU queue busy,
# few enough that the stopping rule is checked often.
ROUNDS_PER_SYNC = 10
# A measurement stopped by max_time_s still gets this many samples (fewer only if
# min_samples asks for fewer), so a very slow function yields a median and a spread.
_MIN_SAMPLES_AT_TIME_CAP = 3
# Used when torch does not report the L2 size; larger than any current GPU's L2.
_FALLBACK_L2_BYTES = 256 * 2**20


@dataclass(frozen=True)
class TimingConfig:
    timer: Timer = "graph"
    l2: Literal["cold", "warm"] = "cold"
    warmup: int = 3
    min_samples: int = 10
    max_samples: int = 500
    min_time_s: float = 0.2  # at least this much measured time in total (while caps allow)
    max_time_s: float = 5.0  # cap on wall time spent sampling one measurement (warm-up excluded)
    rel_ci: float = 0.01  # converged when the median's 95% CI half-width / median <= rel_ci

    def __post_init__(self) -> None:
        if self.timer not in ("graph", "events", "wall"):
            raise ValueError(f"unknown timer {self.timer!r}")
        if self.l2 not in ("cold", "warm"):
            raise ValueError(f"l2 must be 'cold' or 'warm', got {self.l2!r}")
        if self.warmup < 0:
            raise ValueError("warmup must be >= 0")
        if not 1 <= self.min_samples <= self.max_samples:
            raise ValueError("need 1 <= min_samples <= max_samples")
        if self.min_time_s < 0 or self.max_time_s < 0 or self.rel_ci < 0:
            raise ValueError("min_time_s, max_time_s and rel_ci must be >= 0")


@dataclass
class Measurement:
    samples_us: list[float]
    timer: str  # the timer actually used
    l2: str  # "cold" (flushed before every sample) or "warm"
    converged: bool
    note: str = ""  # e.g. why a graph timer fell back to events
    # what each sample ran (the captured graph's replay, or the function): run once more, the timed call's
    # outputs can be checked
    replay: Callable[[], object] | None = field(default=None, repr=False, compare=False)


def default_timer(device: torch.device) -> Timer:
    """Graph replay on CUDA (device time without launch overhead), wall clock elsewhere."""
    return "graph" if torch.device(device).type == "cuda" else "wall"


def _is_converged(samples_us: list[float], config: TimingConfig) -> bool:
    if len(samples_us) < config.min_samples:
        return False
    median = float(np.median(samples_us))
    lo, hi = median_ci(samples_us, 0.95)
    if median <= 0.0:
        return hi <= lo
    return (hi - lo) / 2.0 / median <= config.rel_ci


def _sample(run_round: Callable[[int], list[list[float]]], n_series: int,
            config: TimingConfig) -> tuple[list[list[float]], list[bool]]:
    """Adaptive sampling loop shared by all timers; returns (samples_us per series, converged per series).

    ``run_round(k)`` takes k samples of every series, interleaved (A B A B ...), and returns them per
    series. After each batch:
      1. every series converged (n >= min_samples and CI half-width / median <= rel_ci) and
         each has sum(samples) >= min_time_s: stop, converged.
      2. n >= max_samples: stop; converged is the CI criterion alone, so a fast kernel whose
         min_time_s would need more than max_samples samples can still converge.
      3. wall time since sampling began > max_time_s and n >= min(min_samples, 3): stop,
         converged as in 2.
    The first batch is a single probe round; later batches are sized from the observed wall
    time per round so the time cap is overshot by at most about one round.
    """
    series: list[list[float]] = [[] for _ in range(n_series)]
    start = time.perf_counter()
    batch = 1
    while True:
        t0 = time.perf_counter()
        for mine, new in zip(series, run_round(batch)):
            mine.extend(new)
        now = time.perf_counter()
        per_round_s = max((now - t0) / batch, 1e-9)
        elapsed = now - start
        n = len(series[0])
        converged = [_is_converged(s, config) for s in series]
        if all(converged) and min(sum(s) for s in series) * 1e-6 >= config.min_time_s:
            return series, converged
        if n >= config.max_samples:
            return series, converged
        if elapsed > config.max_time_s and n >= min(config.min_samples, _MIN_SAMPLES_AT_TIME_CAP):
            return series, converged
        fits = int((config.max_time_s - elapsed) / per_round_s)
        batch = max(1, min(ROUNDS_PER_SYNC, config.max_samples - n, fits))


def l2_flush_buffer(device: torch.device) -> torch.Tensor:
    """A byte buffer twice the L2 size; zeroing it evicts the timed kernel's data from L2."""
    props = torch.cuda.get_device_properties(device)
    l2_bytes = getattr(props, "L2_cache_size", 0) or _FALLBACK_L2_BYTES
    return torch.empty(2 * l2_bytes, dtype=torch.uint8, device=device)


def _warm_up(fn: Callable[[], object], reset: Callable[[], None] | None, warmup: int) -> None:
    for _ in range(warmup):
        if reset is not None:
            reset()
        fn()


def _recover_from_failed_capture(caller_stream: torch.cuda.Stream) -> None:
    """Undo what a failed ``torch.cuda.graph`` capture leaves behind (seen with torch 2.11).

    When ``capture_end`` raises (the capture was invalidated), ``torch.cuda.graph`` never
    exits its stream context, so the capture stream stays current; and the default CUDA
    generator stays in capture mode, so the next random op raises "Offset increment outside
    graph capture encountered unexpectedly". A capture that succeeds and draws random numbers
    runs the generator's capture prologue and epilogue, which clears that mode.
    """
    torch.cuda.set_stream(caller_stream)
    torch.cuda.synchronize()
    probe = torch.empty(1, device=caller_stream.device)
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        probe.uniform_()
    torch.cuda.synchronize()


def _warm_up_and_capture(
    fn: Callable[[], object], reset: Callable[[], None] | None, warmup: int
) -> tuple[torch.cuda.CUDAGraph | None, str]:
    """Warm up on a side stream, then capture one call of ``fn`` there, as PyTorch's CUDA graph
    docs do; returns (graph, "") or (None, why the capture failed).

    Lazy initialisation (cuBLAS handles and workspaces, Triton autotuning, allocator growth)
    must happen before capture, and on the stream that captures. Errors raised by warm-up or
    reset propagate: only the capture itself may fail over to the events timer.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _warm_up(fn, reset, warmup)
    torch.cuda.current_stream().wait_stream(side)
    if reset is not None:
        reset()  # capturing does not execute fn, so replays start from this state
    caller_stream = torch.cuda.current_stream()
    graph = torch.cuda.CUDAGraph()
    try:
        # torch.cuda.graph synchronises the device before capturing, so reset's work is done.
        with torch.cuda.graph(graph, stream=side):
            fn()
    except Exception as exc:  # e.g. a kernel that synchronises or copies to the host
        _recover_from_failed_capture(caller_stream)
        reraise_interrupt(exc)
        reason = (str(exc).strip().splitlines() or [""])[0]
        return None, f"graph capture failed, fell back to events: {type(exc).__name__}: {reason}"
    return graph, ""


Timed = tuple[Callable[[], object], Callable[[], None] | None]  # (fn, reset)


def measure(
    fn: Callable[[], object],
    *,
    device: torch.device,
    config: TimingConfig,
    reset: Callable[[], None] | None = None,
) -> Measurement:
    """Time ``fn`` (one kernel call as a user makes it) with ``config.timer``.

    ``reset``, when given, restores in-place state and runs before every call of ``fn``
    (warm-ups and graph capture included), always outside the timed region. With the graph
    timer ``reset`` runs eagerly between replays, and replays reuse the buffers of the captured
    call, so ``reset`` must write into those same tensors in place.

    A graph capture that raises falls back to the events timer; ``Measurement.timer`` and
    ``Measurement.note`` say so.
    """
    return measure_interleaved([(fn, reset)], device=device, config=config)[0]


def measure_interleaved(fns: Sequence[Timed], *, device: torch.device, config: TimingConfig) -> list[Measurement]:
    """Time several (fn, reset) pairs in alternation, one sample of each per round (A B, B A, ...).

    Clock, thermal and neighbour drift then hit every series alike, so their ratio is steadier than
    that of back-to-back measurements. Sampling goes on until every series has converged (or a cap
    is hit). Each sample is taken as ``measure`` describes; if one graph capture fails, every series
    falls back to the events timer, so that the series stay comparable.
    """
    device = torch.device(device)
    if device.type == "cpu":
        if config.timer != "wall":
            raise ValueError(f"timer {config.timer!r} needs a CUDA device; use 'wall' on CPU")
        return _measure_wall(fns, config, cuda=False, flush=None, l2="warm")
    if device.type != "cuda":
        raise ValueError(f"unsupported device type {device.type!r} (cpu or cuda)")

    with torch.cuda.device(device):
        flush = l2_flush_buffer(device) if config.l2 == "cold" else None
        if config.timer == "wall":
            return _measure_wall(fns, config, cuda=True, flush=flush, l2=config.l2)

        timer: Timer = config.timer
        note = ""
        runs: list[Callable[[], object]] = [fn for fn, _ in fns]
        if timer == "graph":
            graphs = []
            for fn, reset in fns:
                graph, note = _warm_up_and_capture(fn, reset, config.warmup)
                if graph is None:
                    break
                graphs.append(graph)
            if len(graphs) == len(fns):
                runs = [g.replay for g in graphs]
            else:
                timer = "events"
        else:
            for fn, reset in fns:
                _warm_up(fn, reset, config.warmup)

        run_rounds = event_rounds(runs, [reset for _, reset in fns], flush)
        torch.cuda.synchronize()
        series, converged = _sample(run_rounds, len(fns), config)
        return [Measurement(s, timer=timer, l2=config.l2, converged=c, note=note, replay=run)
                for s, c, run in zip(series, converged, runs)]


def round_order(n: int, round_index: int) -> range:
    """The order of n series in a round: forwards in even rounds, backwards in odd ones, so that what the
    position in a round does to a sample (docs/decisions/0025-paired-intervals.md) falls on every series alike."""
    return range(n) if round_index % 2 == 0 else range(n - 1, -1, -1)


def event_rounds(runs: Sequence[Callable[[], object]], resets: Sequence[Callable[[], None] | None],
                 flush: torch.Tensor | None) -> Callable[[int], list[list[float]]]:
    """``run_rounds(k)``: k rounds (k <= ROUNDS_PER_SYNC) of one sample of each of ``runs`` in turn, in ``round_order``
    (A B, B A, A B, ...), returned per run in microseconds. Each sample is one call between two CUDA events on the
    current stream; before it, outside the events, its ``resets`` entry (if any) runs and ``flush`` (if given) is
    zeroed. No synchronisation per sample: the host queues the k rounds ahead of the GPU and waits once, so with
    eager calls launch overhead shows where the GPU waits on the host, as a caller sees it."""
    # events are reused across calls: each call ends with a synchronisation
    starts = [[torch.cuda.Event(enable_timing=True) for _ in range(ROUNDS_PER_SYNC)] for _ in runs]
    ends = [[torch.cuda.Event(enable_timing=True) for _ in range(ROUNDS_PER_SYNC)] for _ in runs]

    rounds_done = 0

    def run_rounds(k: int) -> list[list[float]]:
        nonlocal rounds_done
        for i in range(k):
            for j in round_order(len(runs), rounds_done + i):
                if resets[j] is not None:
                    resets[j]()
                if flush is not None:
                    flush.zero_()
                starts[j][i].record()
                runs[j]()
                ends[j][i].record()
        ends[j][k - 1].synchronize()  # the last sample queued
        rounds_done += k
        return [[starts[j][i].elapsed_time(ends[j][i]) * 1e3 for i in range(k)] for j in range(len(runs))]

    return run_rounds


def _measure_wall(
    fns: Sequence[Timed],
    config: TimingConfig,
    *,
    cuda: bool,
    flush: torch.Tensor | None,
    l2: str,
) -> list[Measurement]:
    for fn, reset in fns:
        _warm_up(fn, reset, config.warmup)

    rounds_done = 0

    def run_round(k: int) -> list[list[float]]:
        nonlocal rounds_done
        out: list[list[float]] = [[] for _ in fns]
        for i in range(k):
            for j in round_order(len(fns), rounds_done + i):
                (fn, reset), mine = fns[j], out[j]
                if reset is not None:
                    reset()
                if flush is not None:
                    flush.zero_()
                if cuda:  # keep reset, flush and earlier work out of the timed region
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn()
                if cuda:
                    torch.cuda.synchronize()
                mine.append((time.perf_counter() - t0) * 1e6)
        rounds_done += k
        return out

    series, converged = _sample(run_round, len(fns), config)
    return [Measurement(s, timer="wall", l2=l2, converged=c, replay=fn)
            for s, c, (fn, _) in zip(series, converged, fns)]


def _median_event_us(fn: Callable[[], object], device: torch.device) -> float:
    config = TimingConfig(timer="events", l2="warm", warmup=3, min_samples=10, max_samples=10, min_time_s=0.0)
    return float(np.median(measure(fn, device=device, config=config).samples_us))


def copy_moving(nbytes: int, device: torch.device) -> Callable[[], object]:
    """A copy kernel that moves ``nbytes`` in all (reads half, writes half): the memory-bound reference a
    kernel moving that many bytes is held to. Its buffers live as long as the returned callable.

    An elementwise kernel on the SMs (int32 bitwise NOT: one 4-byte read and write per element), not
    ``copy_``: CUDA graphs run a captured device-to-device memcpy on the copy engines, which on an H100
    moved 2.4 TB/s where SM kernels (and an eager memcpy) moved 3.0 (docs/decisions/0002-copy-reference-kernel.md).
    """
    src = torch.empty(max(nbytes // 8, 1), dtype=torch.int32, device=device)
    dst = torch.empty_like(src)
    return lambda: torch.bitwise_not(src, out=dst)


def measure_ceilings(device: torch.device) -> dict[str, float]:
    """Roofline ceilings measured on ``device`` (docs/design.md, "Roofline"); {} on CPU.

    ``copy_gbps``: a 1 GiB device-to-device copy (``copy_moving``), bytes read + written over the median
    time.
    ``matmul_tflops``: an 8192^3 bf16 matmul on random data (zeros run faster than real data).
    """
    device = torch.device(device)
    if device.type != "cuda":
        return {}
    with torch.cuda.device(device):
        nbytes = 2**30
        copy_us = _median_event_us(copy_moving(2 * nbytes, device), device)

        n = 8192
        a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        c = torch.empty(n, n, device=device, dtype=torch.bfloat16)
        mm_us = _median_event_us(lambda: torch.matmul(a, b, out=c), device)
    return {
        "copy_gbps": 2 * nbytes / (copy_us * 1e-6) / 1e9,
        "matmul_tflops": 2 * n**3 / (mm_us * 1e-6) / 1e12,
    }

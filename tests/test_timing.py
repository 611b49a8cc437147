import time

import numpy as np
import pytest
import torch

from gdnbench.timing import (
    Measurement,
    TimingConfig,
    copy_moving,
    default_timer,
    event_rounds,
    measure,
    measure_ceilings,
    measure_interleaved,
)

CPU = torch.device("cpu")
cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _spin(seconds: float) -> None:
    # Busy-wait: steadier than time.sleep, so convergence tests don't depend on the scheduler.
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _wall(**kw: object) -> TimingConfig:
    return TimingConfig(timer="wall", **{"warmup": 1, "min_time_s": 0.0, "max_time_s": 2.0, **kw})


def test_default_timer() -> None:
    assert default_timer(CPU) == "wall"
    assert default_timer(torch.device("cuda")) == "graph"


def test_wall_timer_sleep() -> None:
    cfg = _wall(min_samples=10, max_samples=200, min_time_s=0.02, rel_ci=0.05)
    m = measure(lambda: time.sleep(1e-3), device=CPU, config=cfg)
    assert isinstance(m, Measurement)
    assert m.timer == "wall" and m.l2 == "warm" and m.note == ""
    assert 10 <= len(m.samples_us) <= 200
    med = sorted(m.samples_us)[len(m.samples_us) // 2]
    assert 1_000 <= med <= 20_000  # microseconds; sleep overshoots, never undershoots
    assert sum(m.samples_us) >= 0.02e6 or not m.converged


def test_cpu_records_warm_l2_even_if_cold_requested() -> None:
    m = measure(lambda: None, device=CPU, config=_wall(l2="cold", min_samples=3, max_samples=3))
    assert m.l2 == "warm"


def test_converges_on_steady_function() -> None:
    cfg = _wall(min_samples=10, max_samples=200, rel_ci=0.2)
    m = measure(lambda: _spin(200e-6), device=CPU, config=cfg)
    assert m.converged
    assert len(m.samples_us) >= 10
    assert all(s >= 200 for s in m.samples_us)


def test_noisy_function_does_not_converge() -> None:
    durations = iter([(i * 7919 % 97 + 1) * 10e-6 for i in range(1000)])  # 10 us .. 970 us, scattered
    cfg = _wall(warmup=0, min_samples=5, max_samples=20, rel_ci=1e-6)
    m = measure(lambda: _spin(next(durations)), device=CPU, config=cfg)
    assert not m.converged
    assert len(m.samples_us) == 20


def test_max_samples_with_tight_ci_counts_as_converged() -> None:
    # min_time_s is a floor on effort, not on convergence: hitting max_samples first is fine.
    cfg = _wall(min_samples=10, max_samples=30, min_time_s=10.0, rel_ci=0.5)
    m = measure(lambda: _spin(50e-6), device=CPU, config=cfg)
    assert len(m.samples_us) == 30
    assert m.converged


def test_min_time_keeps_sampling_after_convergence() -> None:
    cfg = _wall(min_samples=10, max_samples=10_000, min_time_s=0.05, rel_ci=0.5)
    m = measure(lambda: _spin(100e-6), device=CPU, config=cfg)
    assert m.converged
    assert sum(m.samples_us) >= 0.05e6


def test_reset_runs_before_every_call_and_outside_timing() -> None:
    log: list[str] = []

    def reset() -> None:
        log.append("r")
        time.sleep(2e-3)  # must not show up in the samples

    cfg = _wall(warmup=3, min_samples=12, max_samples=12)
    m = measure(lambda: log.append("f"), device=CPU, reset=reset, config=cfg)
    assert len(m.samples_us) == 12
    assert log == ["r", "f"] * (3 + 12)
    assert max(m.samples_us) < 1_000


def test_max_time_cap() -> None:
    cfg = _wall(warmup=0, min_samples=100, max_samples=1000, max_time_s=0.1)
    t0 = time.perf_counter()
    m = measure(lambda: time.sleep(0.02), device=CPU, config=cfg)
    elapsed = time.perf_counter() - t0
    assert not m.converged  # fewer than min_samples
    assert 3 <= len(m.samples_us) < 100
    assert elapsed < 0.1 + 0.15  # the cap is overshot by about one sample at most


def test_time_cap_still_takes_three_samples() -> None:
    m = measure(lambda: time.sleep(0.03), device=CPU, config=_wall(warmup=0, min_samples=10, max_time_s=0.01))
    assert len(m.samples_us) == 3
    assert not m.converged


@pytest.mark.parametrize("timer", ["graph", "events"])
def test_gpu_timers_on_cpu_raise(timer: str) -> None:
    with pytest.raises(ValueError):
        measure(lambda: None, device=CPU, config=TimingConfig(timer=timer))  # type: ignore[arg-type]


def test_unsupported_device_raises() -> None:
    with pytest.raises(ValueError):
        measure(lambda: None, device=torch.device("meta"), config=_wall())


@pytest.mark.parametrize(
    "kw",
    [
        {"timer": "cuda"},
        {"l2": "hot"},
        {"warmup": -1},
        {"min_samples": 0},
        {"min_samples": 5, "max_samples": 4},
        {"rel_ci": -0.1},
    ],
)
def test_config_validation(kw: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        TimingConfig(**kw)  # type: ignore[arg-type]


def test_ceilings_empty_on_cpu() -> None:
    assert measure_ceilings(CPU) == {}


@pytest.mark.parametrize("nbytes", [8, 40, 4104])
def test_copy_moving_reads_and_writes_half_the_bytes_each(nbytes: int) -> None:
    dst = copy_moving(nbytes, CPU)()
    assert dst.element_size() * dst.numel() == nbytes // 2


# --- CUDA only (run on a GPU machine; skipped in CPU CI) ---------------------------------


def _fast(timer: str, **kw: object) -> TimingConfig:
    defaults: dict[str, object] = {"min_time_s": 0.01, "max_time_s": 2.0, "rel_ci": 0.05}
    return TimingConfig(timer=timer, **{**defaults, **kw})  # type: ignore[arg-type]


@cuda_only
@pytest.mark.parametrize("timer", ["graph", "events", "wall"])
@pytest.mark.parametrize("l2", ["cold", "warm"])
def test_cuda_timers_with_reset(timer: str, l2: str) -> None:
    dev = torch.device("cuda")
    pristine = torch.randn(1 << 20, device=dev)
    state = pristine.clone()
    calls = {"fn": 0, "reset": 0}

    def fn() -> None:
        calls["fn"] += 1
        state.mul_(2.0)  # in place, like a decode kernel updating its state pool

    def reset() -> None:
        calls["reset"] += 1
        state.copy_(pristine)

    m = measure(fn, device=dev, config=_fast(timer, l2=l2, warmup=2), reset=reset)
    torch.cuda.synchronize()
    assert m.timer == timer and m.l2 == l2 and m.note == ""
    assert len(m.samples_us) >= 10 and all(s > 0 for s in m.samples_us)
    # Replays run on the captured buffers, each after a reset: the state is one step from pristine.
    torch.testing.assert_close(state, pristine * 2.0)
    n = len(m.samples_us)
    if timer == "graph":
        assert calls == {"fn": 2 + 1, "reset": 2 + 1 + n}  # warm-ups, capture; replays skip Python
    else:
        assert calls == {"fn": 2 + n, "reset": 2 + n}


@cuda_only
def test_graph_capture_failure_falls_back_to_events() -> None:
    dev = torch.device("cuda")
    x = torch.ones(1024, device=dev)
    stream = torch.cuda.current_stream()
    m = measure(lambda: x.sum().item(), device=dev, config=_fast("graph"))  # .item() syncs: uncapturable
    assert m.timer == "events"
    assert "capture failed" in m.note
    assert len(m.samples_us) >= 10
    # A failed capture must leave the process usable: caller's stream current, RNG and graphs working.
    assert torch.cuda.current_stream() == stream
    torch.randn(16, device=dev)
    assert measure(lambda: x.mul_(1.0), device=dev, config=_fast("graph")).timer == "graph"


@cuda_only
def test_graph_hides_launch_overhead() -> None:
    xs = [torch.zeros(256, device="cuda") for _ in range(50)]

    def many_tiny_kernels() -> None:
        for x in xs:
            x.add_(1.0)

    dev = torch.device("cuda")
    graph = measure(many_tiny_kernels, device=dev, config=_fast("graph", l2="warm"))
    events = measure(many_tiny_kernels, device=dev, config=_fast("events", l2="warm"))
    g = sorted(graph.samples_us)[len(graph.samples_us) // 2]
    e = sorted(events.samples_us)[len(events.samples_us) // 2]
    assert g < e


@cuda_only
def test_cuda_ceilings() -> None:
    c = measure_ceilings(torch.device("cuda"))
    assert set(c) == {"copy_gbps", "matmul_tflops"}
    assert c["copy_gbps"] > 100 and c["matmul_tflops"] > 10


def test_interleaved_series_alternate_and_keep_their_own_times():
    log = []

    def timed(name, seconds):
        def fn():
            log.append(name)
            _spin(seconds)
        return fn

    cfg = _wall(warmup=1, min_samples=6, max_samples=6)
    a, b = measure_interleaved([(timed("a", 300e-6), lambda: log.append("ra")),
                                (timed("b", 100e-6), None)], device=CPU, config=cfg)
    assert len(a.samples_us) == len(b.samples_us) == 6
    calls = [x for x in log if x in ("a", "b")]
    assert calls == ["a", "b"] * 2 + ["b", "a", "a", "b"] * 2 + ["b", "a"]  # warm-ups, then rounds A B, B A, ...
    assert all(log[i - 1] == "ra" for i, x in enumerate(log) if x == "a")  # a's reset before every a
    assert 2 < np.median(a.samples_us) / np.median(b.samples_us) < 4


def test_event_rounds_order_reset_flush_and_events_around_each_call(monkeypatch):
    """The GPU sampling core, on a CPU with CUDA events stood in for: per round one sample of each run in
    turn, forwards then backwards (across calls too), its reset and the flush before its start event, one
    synchronisation per call."""
    log = []

    class Event:
        count = 0

        def __init__(self, enable_timing: bool) -> None:
            assert enable_timing
            Event.count += 1
            self.t = None

        def record(self) -> None:
            log.append("event")
            self.t = len(log)  # "milliseconds": the position in the log

        def synchronize(self) -> None:
            log.append("sync")

        def elapsed_time(self, end: "Event") -> float:
            return float(end.t - self.t)

    class Flush:
        def zero_(self) -> None:
            log.append("flush")

    monkeypatch.setattr(torch.cuda, "Event", Event)
    run_rounds = event_rounds([lambda: log.append("a"), lambda: log.append("b")], [lambda: log.append("ra"), None],
                              Flush())
    a, b = run_rounds(2)
    one = ["ra", "flush", "event", "a", "event", "flush", "event", "b", "event"]
    backwards = ["flush", "event", "b", "event", "ra", "flush", "event", "a", "event"]
    assert log == one + backwards + ["sync"]
    assert a == b == [2000.0, 2000.0]  # microseconds: each call sits between its own two events
    log.clear()
    run_rounds(1)
    assert log == one + ["sync"] and Event.count == 2 * 2 * 10  # events made once, reused

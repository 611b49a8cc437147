"""Picking a kernel's launch config by timing its candidates side by side (every bundled kernel's tuner).

Triton's autotuner times the candidates one after another, with a separately launched kernel per sample, and its
picks change from one process to the next with the clock and thermal drift of the moment
(docs/decisions/0014-recurrent-tuning.md, 0019-chunk-kernel-configs.md). Here each candidate's launch is captured
once in a CUDA graph (no host launch cost inside a sample), and samples are taken in rounds, one per candidate in
turn, with L2 flushed before each (as gdnbench's default timer does): clock and thermal drift then touch every
candidate alike. The pick is the lowest median. ``TunedKernel`` puts a Triton kernel behind ``fastest`` as
``triton.autotune`` would.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
import triton
from triton.runtime import errors as _triton_errors

from gdnbench.timing import event_rounds, l2_flush_buffer

__all__ = ["TunedKernel", "fastest"]

# A candidate that fails to build for this shape (too much shared memory or too many registers) drops
# out, as in triton's autotuner; any other error is the caller's. (PTXASError is not in every triton.)
UNBUILDABLE = tuple(getattr(_triton_errors, name) for name in ("OutOfResources", "PTXASError")
                    if hasattr(_triton_errors, name))

C = TypeVar("C")

MIN_ROUNDS = 10
MAX_ROUNDS = 200
BUDGET_S = 0.3  # wall time for the rounds after MIN_ROUNDS (a 750 us launch x 22 candidates: ~17 rounds)


def fastest(run: Callable[[C], object], candidates: Sequence[C], device: torch.device) -> C:
    """The candidate whose ``run(candidate)`` (one kernel launch, CUDA-graph capturable, no host syncs)
    has the lowest median time; a single candidate is returned without running it, and candidates that
    fail to build (``UNBUILDABLE``) drop out. Not to be called during a CUDA graph capture (it captures
    graphs of its own)."""
    if len(candidates) == 1:
        return candidates[0]
    built = []
    for c in candidates:
        try:
            run(c)  # compiles; a capture must not
        except UNBUILDABLE:
            continue
        built.append(c)
    if not built:
        raise RuntimeError(f"none of the {len(candidates)} candidate configs builds for this launch")
    if len(built) == 1:
        return built[0]
    candidates = built
    device = torch.device(device)
    graphs = []
    with torch.cuda.device(device):
        for c in candidates:
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run(c)
            graphs.append(graph)
        # the flush buffer is allocated per tuning, not kept
        run_rounds = event_rounds([g.replay for g in graphs], [None] * len(graphs), l2_flush_buffer(device))
        samples: list[list[float]] = [[] for _ in candidates]
        t0, rounds = time.perf_counter(), 0
        while rounds < MIN_ROUNDS or (rounds < MAX_ROUNDS and time.perf_counter() - t0 < BUDGET_S):
            for times, new in zip(samples, run_rounds(1)):
                times.extend(new)
            rounds += 1
    medians = [statistics.median(times) for times in samples]
    return candidates[medians.index(min(medians))]


Prune = Callable[..., list[triton.Config]]


class TunedKernel:
    """A Triton kernel launched as ``kernel[grid](*args, **kwargs)`` with the fastest of its candidate
    ``configs`` for the launch's tuning key: the values of the arguments named in ``keys``, and the dtype
    (or None) of every tensor argument. A key's first launch tunes it with ``fastest`` over the configs
    that ``early_config_prune(configs, named_args)`` keeps for that launch; a single config in
    ``configs`` runs as written, unpruned and untimed (as ``triton.autotune`` does). Every candidate runs
    many times on the launch's own arguments, so no argument may be both read and written. The
    attributes are ``triton.autotune``'s: ``fn``, ``arg_names``, ``configs``, ``keys``, ``cache`` (key
    -> config), ``early_config_prune`` and ``best_config`` (what the latest launch ran), so that tests
    and sweeps can force a config."""

    def __init__(self, fn, configs: list[triton.Config], keys: list[str], prune: Prune | None = None) -> None:
        self.fn, self.configs, self.keys, self.early_config_prune = fn, configs, keys, prune
        self.arg_names: list[str] = fn.arg_names
        self.cache: dict[tuple, triton.Config] = {}
        self.best_config: triton.Config | None = None

    def __getitem__(self, grid) -> Callable[..., None]:
        return lambda *args, **kwargs: self._run(grid, args, kwargs)

    def _run(self, grid, args: tuple, kwargs: dict) -> None:
        named = {**dict(zip(self.arg_names, args)), **kwargs}

        def launch(c: triton.Config) -> None:
            g = grid({**named, **c.kwargs}) if callable(grid) else grid
            self.fn[g](*args, **kwargs, **c.kwargs, num_warps=c.num_warps, num_stages=c.num_stages,
                       maxnreg=c.maxnreg)

        if len(self.configs) == 1:
            cfg = self.configs[0]
        else:
            key = tuple(named[k] for k in self.keys) + tuple(
                str(x.dtype) if isinstance(x, torch.Tensor) else None for x in named.values()
                if x is None or isinstance(x, torch.Tensor))
            if key not in self.cache:
                if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                    raise RuntimeError(f"{self.fn.__name__} has not been tuned for this launch ({key}): "
                                       "call it once before capturing it in a CUDA graph")
                pruned = self.early_config_prune(self.configs, named) if self.early_config_prune else self.configs
                device = next(x.device for x in named.values() if isinstance(x, torch.Tensor))
                self.cache[key] = fastest(launch, pruned, device)
            cfg = self.cache[key]
        launch(cfg)
        self.best_config = cfg

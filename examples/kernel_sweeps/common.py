"""What the kernel sweeps share: their timing settings and the output comparison."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator

import torch

from gdnbench.timing import TimingConfig, default_timer


def sweep_timing(device: torch.device) -> TimingConfig:
    """gdnbench run's timer (graph replay, L2 flushed) with a short cap per row; on a CPU (the
    interpreter) one call per row, whose time means nothing."""
    if device.type == "cpu":
        return TimingConfig(timer="wall", warmup=0, min_samples=1, max_samples=1, min_time_s=0.0)
    return TimingConfig(timer=default_timer(device), max_time_s=0.3, min_time_s=0.0)


def rel_diff(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative difference of x from ref (Frobenius norms, fp64)."""
    return float((x.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


def int_tuple(form: str, example: str, lengths: tuple[int, ...] = (3,)) -> Callable[[str], tuple[int, ...]]:
    """An argparse type for a config written "A,B,C" (``form`` names them, e.g. "BV,WARPS,STAGES"),
    of any of ``lengths`` numbers."""
    def parse(text: str) -> tuple[int, ...]:
        try:
            values = tuple(int(x) for x in text.split(","))
        except ValueError:
            values = ()
        if len(values) not in lengths:
            raise argparse.ArgumentTypeError(f"expected {form} (e.g. {example}), got {text!r}")
        return values
    return parse


@contextlib.contextmanager
def swapped(obj: object, **attrs: object) -> Iterator[None]:
    """obj's attributes set to ``attrs`` inside the block, restored after (a kernel's candidate configs
    and tuning cache, to force one config)."""
    saved = {name: getattr(obj, name) for name in attrs}
    for name, value in attrs.items():
        setattr(obj, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(obj, name, value)

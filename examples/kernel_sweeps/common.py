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


def tool_parser(doc: str) -> argparse.ArgumentParser:
    """A sweep's command-line parser, described by its module docstring's first paragraph."""
    return argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def add_case_arguments(parser: argparse.ArgumentParser) -> None:
    """SUITE, -k and --device: which cases a sweep runs, and where."""
    parser.add_argument("suite", help="a suite YAML file or a shipped suite's name")
    parser.add_argument("-k", "--filter", help="only cases whose id contains TEXT")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cuda (the default where there is one) or cpu (with TRITON_INTERPRET=1: Triton's "
                             "interpreter, a correctness check whose times mean nothing)")


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

"""Helpers shared by the backend adapter and plugin tests: an adapter run as the runner does it, the check
that a decode adapter's reset restores its pool, and a fake ``pip install`` of entry points."""

from __future__ import annotations

from pathlib import Path

import torch

from gdnbench.backends.base import Backend, Outputs, Prepared
from gdnbench.check import CheckResult, Gate, reference_outputs
from gdnbench.problem import Problem, make_problem
from gdnbench.suite import Case, ReferenceSettings, Tolerances


def run_adapter(b: Backend, case: Case) -> tuple[Problem, Prepared, Outputs, CheckResult]:
    """prepare -> reset -> call -> outputs, checked against the reference like the runner does."""
    p = make_problem(case, 0)
    prepared = b.prepare(p)
    if prepared.reset:
        prepared.reset()
    prepared.call()
    out = prepared.outputs()
    verdict = Gate(p, reference_outputs(p, ReferenceSettings()), Tolerances()).check(out)
    return p, prepared, out, verdict


def check_reset_restores_the_pool(p: Problem, prepared: Prepared, out: Outputs) -> None:
    """The call changed the pool; ``reset()`` restores it, and a call from it gives the same output again."""
    first = out.o.clone()
    assert not torch.equal(out.state_pool, p.state_pool)
    prepared.reset()
    assert torch.equal(prepared.outputs().state_pool, p.state_pool)
    prepared.call()
    assert torch.equal(prepared.outputs().o, first)


def fake_install(root: Path, name: str, entry_points: dict[str, str]) -> None:
    """What pip leaves behind for a package: a dist-info with METADATA and entry_points.txt."""
    info = root / f"{name}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
    lines = ["[gdnbench.backends]", *(f"{k} = {v}" for k, v in entry_points.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")

"""A deliberately slowed copy of fla.chunk, to show that ``gdnbench compare`` catches a regression.

``demo.fla_chunk`` is ``fla.chunk`` (same envelope, same call) plus GDNBENCH_DEMO_EXTRA_PASSES extra
copies of q, k and v inside the timed call (default 0: the same work as fla.chunk). Run a suite with it
twice, once without and once with the variable set, and compare the two runs: the rows of fla.chunk
in the same runs are the A/A control (docs/decisions/0003-compare-gates.md has such a run).

    gdnbench run parity --backends fla.chunk,examples.regression_demo.slowed_fla:demo_fla_chunk --out a
    GDNBENCH_DEMO_EXTRA_PASSES=1 gdnbench run parity --backends ... --out b
    gdnbench compare a b   # exit 1: demo.fla_chunk rows SLOWER, fla.chunk rows SAME
"""

from __future__ import annotations

import os
from dataclasses import replace

import torch

from gdnbench.backends import Prepared, get_backend
from gdnbench.problem import Problem

FLA = get_backend("fla.chunk")


def _slowed(p: Problem) -> Prepared:
    prepared = FLA.prepare(p)
    passes = int(os.environ.get("GDNBENCH_DEMO_EXTRA_PASSES", "0"))
    inputs = (p.q, p.k, p.v)
    scratch = [torch.empty_like(x) for x in inputs]

    def call() -> None:
        for _ in range(passes):  # the injected regression: one read and one write of every input
            for x, s in zip(inputs, scratch):
                s.copy_(x)
        prepared.call()

    return replace(prepared, call=call, path=f"{prepared.path}; +{passes} extra pass(es) over q, k, v")


demo_fla_chunk = replace(FLA, name="demo.fla_chunk", prepare=_slowed,
                         description="fla.chunk plus GDNBENCH_DEMO_EXTRA_PASSES copies of q, k, v (a regression demo)")

"""gdnbench profile: kernel accounting (with a stand-in profiler on the CPU) and the command's errors."""

import contextlib

import torch
from typer.testing import CliRunner

from gdnbench import profile as prof_mod
from gdnbench.backends import Prepared, backend
from gdnbench.cli import app
from gdnbench.problem import make_problem
from gdnbench.suite import Case


def test_reset_kernels_are_taken_out(monkeypatch):
    """A pool restore's copy kernel, profiled on its own, is subtracted from the call's profile."""
    calls = {"reset": 0, "call": 0}

    @backend("fake.pool", ops={"decode"}, devices={"cpu"})
    def fake(p):
        return Prepared(call=lambda: calls.__setitem__("call", calls["call"] + 1), outputs=lambda: None,
                        reset=lambda: calls.__setitem__("reset", calls["reset"] + 1))

    # what CUPTI would report: the reset-only session first, then the session of reset + call
    sessions = iter([{"copy": [2.0] * 4},
                     {"copy": [2.0] * 4 + [5.0] * 4, "decode_kernel": [10.0] * 4, "gather": [1.0] * 8}])
    monkeypatch.setattr(prof_mod, "profile", lambda **_: contextlib.nullcontext())
    monkeypatch.setattr(prof_mod, "_kernels", lambda _p: next(sessions))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    p = make_problem(Case(op="decode", B=1, H=1, D=8), 0)
    stats = prof_mod.profile_backend(fake, p, calls=4, warmup=2)
    got = {s.name: (s.per_call, s.mean_us, s.total_us) for s in stats}
    # copy: 8 launches, 4 of them reset's (2 us each): 4 left, 20 us, i.e. 5 us per call
    assert got == {"decode_kernel": (1.0, 10.0, 10.0), "copy": (1.0, 5.0, 5.0), "gather": (2.0, 1.0, 2.0)}
    assert [s.name for s in stats] == ["decode_kernel", "copy", "gather"]  # slowest first
    assert calls == {"reset": 2 + 4 + 4, "call": 2 + 4}


def test_profile_needs_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    res = CliRunner().invoke(app, ["profile", "smoke"])
    assert res.exit_code == 2 and "needs a CUDA device" in res.output


def test_external_mode_brackets_one_warmed_call(monkeypatch):
    """--external: the warm-up calls (autotuning) run before cudaProfilerStart, exactly one call inside."""
    events = []

    @backend("fake.marked", ops={"prefill"}, devices={"cpu"})
    def fake(p):
        return Prepared(call=lambda: events.append("call"), outputs=lambda: None)

    class Cudart:
        def cudaProfilerStart(self):
            events.append("start")

        def cudaProfilerStop(self):
            events.append("stop")

    monkeypatch.setattr(torch.cuda, "cudart", lambda: Cudart())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    prof_mod.mark_one_call(fake, make_problem(Case(op="prefill", B=1, T=8, H=1, D=8), 0), warmup=2)
    assert events == ["call", "call", "start", "call", "stop"]

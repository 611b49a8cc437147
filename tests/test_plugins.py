"""Third-party backends arrive through the gdnbench.backends entry-point group, like the built-ins."""

import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from gdnbench.backends import registry
from gdnbench.cli import app
from gdnbench.results import Status
from tests.backend_helpers import fake_install

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "my_variant"


@pytest.fixture
def installed(tmp_path, monkeypatch):
    fake_install(tmp_path, "gdnbench_my_variant", {"my_variant.chunk32": "my_variant:chunk32",
                                                   "broken.thing": "no_such_plugin_module:thing"})
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.cache_clear()
    yield
    registry.cache_clear()
    sys.modules.pop("my_variant", None)


def test_plugin_is_listed_and_runs(installed, tmp_path):
    assert "my_variant.chunk32" in registry() and "torch.chunk" in registry()
    runner = CliRunner()
    res = runner.invoke(app, ["list"])
    assert res.exit_code == 0 and "my_variant.chunk32" in res.output
    res = runner.invoke(app, ["run", "smoke", "--device", "cpu", "--backends", "torch.chunk,my_variant.chunk32",
                              "--baseline", "torch.chunk", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    df = pd.read_csv(tmp_path / "out" / "results.csv")
    mine = df[df.backend == "my_variant.chunk32"]
    assert set(mine[(mine.op == "prefill") & (mine.gating == "pre")].status) == {Status.PASS}
    skipped = mine[(mine.op == "decode") | (mine.gating == "raw")]
    assert set(skipped.status) == {Status.SKIP} and skipped.error.str.startswith("my_variant.chunk32: ").all()
    assert (mine[mine.status == Status.PASS].rel_err_o < 1e-5).all()


def test_broken_plugin_is_unavailable_not_fatal(installed):
    broken = registry()["broken.thing"]
    reason = broken.unavailable()
    assert reason and "no_such_plugin_module" in reason
    res = CliRunner().invoke(app, ["list"])
    assert res.exit_code == 0 and "broken.thing" in res.output


def test_regression_demo_backend_adds_the_requested_passes(monkeypatch):
    """examples/regression_demo: fla.chunk's envelope under its own name, plus N copies of q, k, v per call."""
    import torch

    from gdnbench.backends import get_backend
    from gdnbench.problem import make_problem
    from gdnbench.suite import Case

    monkeypatch.syspath_prepend(str(EXAMPLE.parent.parent))
    demo = get_backend("examples.regression_demo.slowed_fla:demo_fla_chunk")
    fla = registry()["fla.chunk"]
    assert demo.name == "demo.fla_chunk" and (demo.ops, demo.devices, demo.archs) == (fla.ops, fla.devices, fla.archs)

    # its FLA call swapped for the CPU reference, to count the extra copies on this machine
    slowed = sys.modules["examples.regression_demo.slowed_fla"]
    monkeypatch.setattr(slowed, "FLA", registry()["torch.chunk"])
    monkeypatch.setenv("GDNBENCH_DEMO_EXTRA_PASSES", "2")
    copies = []
    real_copy = torch.Tensor.copy_
    monkeypatch.setattr(torch.Tensor, "copy_", lambda self, src, *a, **k: copies.append(1) or real_copy(self, src))
    prepared = demo.prepare(make_problem(Case(B=1, T=8, H=1, D=8, dtype="fp32"), 0))
    prepared.call()
    assert len(copies) == 6 and prepared.path.endswith("+2 extra pass(es) over q, k, v")
    assert prepared.outputs().o.shape == (1, 8, 1, 8)

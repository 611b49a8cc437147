"""Third-party backends arrive through the gdnbench.backends entry-point group, like the built-ins."""

import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from gdnbench.backends import registry
from gdnbench.cli import app

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "my_variant"


def fake_install(root: Path, name: str, entry_points: dict[str, str]) -> None:
    """What pip leaves behind for a package: a dist-info with METADATA and entry_points.txt."""
    info = root / f"{name}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
    lines = ["[gdnbench.backends]", *(f"{k} = {v}" for k, v in entry_points.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


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
    assert set(mine[(mine.op == "prefill") & (mine.gating == "pre")].status) == {"PASS"}
    skipped = mine[(mine.op == "decode") | (mine.gating == "raw")]
    assert set(skipped.status) == {"SKIP"} and skipped.error.str.startswith("my_variant.chunk32: ").all()
    assert (mine[mine.status == "PASS"].rel_err_o < 1e-5).all()


def test_broken_plugin_is_unavailable_not_fatal(installed):
    broken = registry()["broken.thing"]
    reason = broken.unavailable()
    assert reason and "no_such_plugin_module" in reason
    res = CliRunner().invoke(app, ["list"])
    assert res.exit_code == 0 and "broken.thing" in res.output

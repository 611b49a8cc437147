"""--ray: the smoke suite's cases as tasks on a local Ray instance (CPUs only), written as one run."""

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from gdnbench.cli import app
from gdnbench.suite import load_suite

pytest.importorskip("ray")


def test_the_smoke_suite_runs_as_ray_tasks(tmp_path):
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", "smoke", "--device", "cpu", "--ray", "local", "--out", str(out),
                                   "--no-history"])
    assert res.exit_code == 0, res.output
    df = pd.read_csv(out / "results.csv")
    suite = load_suite("smoke")
    assert set(df.case_id) == {c.id for c in suite.cases} and len(df) == len(suite.cases) * len(suite.backends)
    assert set(df.status) == {"PASS"} and df.note.str.contains("ran by Ray node").all()
    assert json.loads((out / "run.json").read_text())["status"] == "complete"


def test_ray_and_gpus_are_one_or_the_other(tmp_path):
    res = CliRunner().invoke(app, ["run", "smoke", "--device", "cpu", "--ray", "local", "--gpus", "0,1",
                                   "--out", str(tmp_path / "x")])
    assert res.exit_code == 2 and "--ray and --gpus" in res.output

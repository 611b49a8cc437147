"""The results history: runs appended and imported once, series over time, steps found by compare's rule."""

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from gdnbench import history
from gdnbench.cli import app
from gdnbench.results import Row, RunDir, Status
from gdnbench.stats import summarize

runner = CliRunner()


def write_run(path, sha, day, median):
    rd = RunDir(path)
    rd.write_meta({"created_utc": f"2026-11-{day:02d}T10:00:00+00:00", "host": "h", "command": f"run {sha}",
                   "suite": {"name": "s", "sha256": "x"}, "device": {"name": "NVIDIA H200"},
                   "git": {"sha": sha * 8}, "status": "complete"})
    samples = (median * (1 + 0.01 * np.random.default_rng().standard_normal(80))).tolist()
    row = Row(suite="s", case_id="prefill/padded/B=1,T=64", backend="triton.x", status=Status.PASS,
              timer="graph", l2="cold", **summarize(samples).as_dict())
    rd.add_case([row], [{"case_id": row.case_id, "backend": "triton.x", "timer": "graph", "l2": "cold",
                         "samples_us": samples}])
    rd.close()


@pytest.fixture
def runs(tmp_path):
    base = np.random.default_rng().uniform(20, 2000)
    for i, (sha, factor) in enumerate([("a", 1.0), ("b", 1.0), ("c", 1.2), ("d", 1.2)]):  # a planted 20% step
        write_run(tmp_path / "runs" / sha, sha, i + 1, base * factor)
    return tmp_path / "runs"


def test_a_series_steps_where_its_level_changes(runs, tmp_path):
    conn = history.connect(tmp_path / "h.sqlite")
    assert sum(history.record(conn, d) for d in history.run_dirs([runs])) == 4
    assert sum(history.record(conn, d) for d in history.run_dirs([runs])) == 0  # imported once
    (points,) = history.series(conn, suite="s").values()
    assert [p.git_sha[0] for p in points] == ["a", "b", "c", "d"]
    assert [p.verdict for p in points] == ["", "SAME", "SLOWER", "SAME"]
    assert [p.git_sha[0] for p in history.steps(points)] == ["c"]
    assert history.series(conn, backend="fla.chunk") == {}


def test_history_command_imports_and_shows_the_steps(runs, tmp_path):
    db = tmp_path / "h.sqlite"
    res = runner.invoke(app, ["history", "--db", str(db), "--import", str(runs)])
    assert res.exit_code == 0 and "imported 4 run(s)" in res.output
    res = runner.invoke(app, ["history", "--db", str(db), "-s", "s", "--gpu", "H200"], env={"COLUMNS": "120"})
    assert res.exit_code == 0, res.output
    assert "SLOWER" in res.output and "1 series, 1 step(s)" in res.output and "cccccc" in res.output
    assert runner.invoke(app, ["history", "--db", str(db), "-b", "nope"]).exit_code == 2


def test_every_run_is_appended_unless_told_not_to(tmp_path, monkeypatch):
    db = tmp_path / "h.sqlite"
    monkeypatch.setenv("GDNBENCH_HISTORY", str(db))
    suite = tmp_path / "tiny.yaml"
    suite.write_text(yaml.safe_dump({"name": "tiny", "backends": ["torch.recurrent"],
                                     "timing": {"warmup": 1, "min_samples": 2, "max_samples": 3, "max_time_s": 0.3},
                                     "cases": [{"B": 1, "T": 5, "H": 1, "D": 8, "dtype": "fp32"}]}))
    for out, flags in (("a", []), ("b", ["--no-history"])):
        res = runner.invoke(app, ["run", str(suite), "--device", "cpu", "--out", str(tmp_path / out),
                                  "--no-isolate", *flags])
        assert res.exit_code == 0, res.output
    runs = history.connect(db).execute("SELECT path FROM runs").fetchall()
    assert runs == [(str(tmp_path / "a"),)]


def test_sparkline_scales_between_min_and_max():
    assert history.sparkline([1.0, None, 2.0, 1.5]) == "▁·█▅"
    assert history.sparkline([]) == ""


def test_a_run_of_another_schema_is_refused(runs, tmp_path):
    import json

    meta_path = runs / "b" / "run.json"
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "schema": 99}))
    res = runner.invoke(app, ["history", "--db", str(tmp_path / "h.sqlite"), "--import", str(runs)])
    assert res.exit_code == 2 and "schema 99, this gdnbench reads schema 1" in " ".join(res.output.split())


def test_schema_command_prints_every_column_and_the_version():
    import json

    from gdnbench.results import COLUMNS, SCHEMA_VERSION

    res = runner.invoke(app, ["schema"])
    assert res.exit_code == 0
    doc = json.loads(res.output)
    assert doc["schema_version"] == SCHEMA_VERSION
    assert set(doc["results.csv row"]["properties"]) == set(COLUMNS)
    assert {"schema", "device", "timing", "shard", "gpus"} <= set(doc["run.json"]["properties"])

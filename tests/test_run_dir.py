"""Run directories: one run writes a directory at a time, an existing run is never replaced silently,
default names never collide, and every bad --out exits 2 with one line."""

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gdnbench.cli import app
from gdnbench.results import RunDir, RunDirError, load_samples

FAST = {"warmup": 1, "min_samples": 2, "max_samples": 3, "min_time_s": 0.0, "max_time_s": 0.5}


def tiny_suite(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({"name": "tiny", "backends": ["torch.recurrent"], "timing": FAST,
                                    "cases": [{"B": 1, "T": 5, "H": 1, "HV": 1, "D": 8, "dtype": "fp32"}]}))
    return path


def run(*args):
    return CliRunner().invoke(app, ["run", *map(str, args), "--device", "cpu"])


def test_an_existing_run_is_kept_unless_forced(tmp_path):
    suite, out = tiny_suite(tmp_path), tmp_path / "out"
    assert run(suite, "--out", out).exit_code == 0
    before = (out / "results.csv").read_bytes()
    (out / "plot.png").write_bytes(b"stale")
    res = run(suite, "--out", out)
    assert res.exit_code == 2 and "holds a run" in res.output and "--force" in res.output
    assert (out / "results.csv").read_bytes() == before and (out / "plot.png").exists()
    res = run(suite, "--out", out, "--force")
    assert res.exit_code == 0, res.output
    assert not (out / "plot.png").exists()  # derived from the replaced run
    assert json.loads((out / "run.json").read_text())["status"] == "complete"
    assert run(suite, "--out", out, "--force", "--resume").exit_code == 2


def test_a_second_run_on_a_locked_directory_exits_2(tmp_path):
    suite, out = tiny_suite(tmp_path), tmp_path / "out"
    holder = RunDir(out)
    try:
        res = run(suite, "--out", out, "--force")
        assert res.exit_code == 2 and "another gdnbench run is writing there (pid" in res.output
        assert not (out / "results.csv").exists()
    finally:
        holder.close()
    assert run(suite, "--out", out, "--force").exit_code == 0


def test_default_directories_never_collide(tmp_path):
    default = tmp_path / "results" / "tiny-20261202-120000"
    runs = [RunDir.create(None, default) for _ in range(3)]
    assert [r.path.name for r in runs] == [default.name, f"{default.name}-2", f"{default.name}-3"]
    for r in runs:
        r.close()


@pytest.mark.parametrize("make_out, needle", [
    (lambda p: p / "file.txt", "a file, not a directory"),
    (lambda p: Path("/proc/gdnbench-cannot-be-here"), "cannot use it as a run directory"),
])
def test_an_unusable_out_exits_2(tmp_path, make_out, needle):
    out = make_out(tmp_path)
    if out.name == "file.txt":
        out.write_text("not a run")
    elif not Path("/proc").is_dir():
        pytest.skip("no /proc here")
    res = run(tiny_suite(tmp_path), "--out", out)
    assert res.exit_code == 2 and needle in res.output and "Traceback" not in res.output


def test_resume_drops_a_cut_last_sample_line(tmp_path):
    suite, out = tiny_suite(tmp_path), tmp_path / "out"
    assert run(suite, "--out", out).exit_code == 0
    meta = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**meta, "status": "interrupted"}))
    whole = load_samples(out)
    with open(out / "samples.jsonl", "a") as f:
        f.write('{"case_id": "cut mid-wri')
    with pytest.warns(UserWarning, match="last line is cut"):
        assert load_samples(out) == whole
    res = run(suite, "--out", out, "--resume")
    assert res.exit_code == 0, res.output
    assert load_samples(out) == whole  # the kept case's samples, the cut line gone


def test_a_bad_line_inside_samples_is_an_error(tmp_path):
    (tmp_path / "samples.jsonl").write_text('{"a": 1}\nnot json\n{"b": 2}\n')
    with pytest.raises(Exception, match="line 2 is not JSON"):
        load_samples(tmp_path)


def test_run_dir_error_is_raised_for_a_held_run(tmp_path):
    (tmp_path / "run.json").write_text("{}")
    with pytest.raises(RunDirError, match="holds a run"):
        RunDir.create(tmp_path, tmp_path / "unused")

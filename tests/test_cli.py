"""The CLI end to end through Typer's CliRunner: exit codes, files, failure rows, dumps, show, list."""

import json
import signal

import pandas as pd
import pytest
import torch
import yaml
from typer.testing import CliRunner

from gdnbench.cli import app
from gdnbench.report import short_labels
from gdnbench.results import COLUMNS, Status
from tests.fake_backends import Interrupt

runner = CliRunner()
FAST = {"min_samples": 3, "min_time_s": 0.0, "max_time_s": 0.2, "warmup": 1}
CASES = [{"B": 1, "T": 9, "H": 1, "HV": 2, "D": 8},
         {"mode": "varlen", "seq_lens": [3, 6], "H": 1, "D": 8},
         {"op": "decode", "B": 2, "H": 1, "D": 8, "pool_size": 5, "slots": "scattered"}]


def write_suite(tmp_path, backends, cases=CASES, **extra):
    path = tmp_path / "suite.yaml"
    raw = {"name": "t", "backends": backends, "timing": FAST, "defaults": {"dtype": "fp32"}, "cases": cases,
           **extra}
    path.write_text(yaml.safe_dump(raw))
    return path


def run(*args):
    # CPU unless a test says otherwise, so the suite means the same on a GPU machine; in this process, so
    # that the tests' monkeypatches reach the backends (tests/test_isolation.py runs the worker)
    device = [] if "--device" in args else ["--device", "cpu"]
    return runner.invoke(app, ["run", *map(str, args), *device, "--no-isolate"])


def test_smoke_suite_runs_and_writes_everything(tmp_path):
    out = tmp_path / "out"
    res = run("smoke", "--out", out)
    assert res.exit_code == 0, res.output
    df = pd.read_csv(out / "results.csv")
    assert list(df.columns) == COLUMNS
    assert (df["status"] == Status.PASS).all() and len(df) == 12
    assert set(df["timer"]) == {"wall"} and set(df["l2"]) == {"warm"}
    assert (df["rel_err_o"] < 1e-5).all()
    # at least min_samples (5), or 3 when the 0.5 s cap cuts a slow case short on a busy CPU
    assert df["n"].min() >= 3 and (df["median_us"] > 0).all() and (df["gbps"] > 0).all()
    base = df[df["backend"] == "torch.recurrent"]
    assert (base["speedup"] == 1).all()
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "complete" and meta["seed"] == 0 and len(meta["suite"]["sha256"]) == 64
    assert {"torch", "triton", "gdnbench"} <= set(meta["versions"]) and "sha" in meta["git"]
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == len(df)
    first = df.iloc[0]
    match = next(s for s in samples if s["case_id"] == first["case_id"] and s["backend"] == first["backend"])
    assert len(match["samples_us"]) == first["n"]
    _, shared = short_labels(list(df["case_id"].unique()))
    assert f"every case: {shared}" in res.output  # said once above the table, not on every row


def test_check_only_checks_everything_and_times_one_call(tmp_path):
    """--check-only: the same rows and verdicts, one timed call each, and run.json says so."""
    out = tmp_path / "out"
    res = run("smoke", "--out", out, "--check-only")
    assert res.exit_code == 0, res.output
    df = pd.read_csv(out / "results.csv")
    assert len(df) == 12 and (df["status"] == Status.PASS).all() and (df["n"] == 1).all()
    assert (df["rel_err_o"] < 1e-5).all()
    timing = json.loads((out / "run.json").read_text())["timing"]
    assert timing["min_samples"] == timing["max_samples"] == 1 and timing["max_time_s"] == 0


def test_misbehaving_backends_become_rows_and_the_run_goes_on(tmp_path):
    names = ["fake.ok", "raises", "nan", "wrong", "oom", "missing"]
    backends = ["tests.fake_backends:" + ("ok" if n == "fake.ok" else n) for n in names]
    suite = write_suite(tmp_path, backends, baseline="tests.fake_backends:ok")
    res = run(suite, "--out", tmp_path / "out")
    assert res.exit_code == 1, res.output  # a FAIL row: CI can gate on correctness
    df = pd.read_csv(tmp_path / "out" / "results.csv")
    status = df.groupby("backend")["status"].agg(set).to_dict()
    assert status == {"fake.ok": {Status.PASS}, "fake.raises": {Status.ERROR}, "fake.nan": {Status.NAN},
                      "fake.wrong": {Status.FAIL}, "fake.oom": {Status.OOM}, "fake.missing": {Status.SKIP}}
    assert df[df.backend == "fake.raises"]["error"].str.contains("boom").all()
    assert df[df.backend == "fake.missing"]["error"].str.contains("no_such_module_for_gdnbench").all()
    wrong = df[df.backend == "fake.wrong"]
    assert wrong["speedup"].isna().all() and (wrong["rel_err_o"] > 0.05).all() and wrong["median_us"].notna().all()
    assert df[df.backend == "fake.nan"]["median_us"].isna().all()
    assert (df[df.backend == "fake.ok"]["speedup"] == 1).all()
    assert "boom" in res.output and "Not passing" in res.output


def test_errors_alone_exit_zero_unless_strict(tmp_path):
    suite = write_suite(tmp_path, ["torch.recurrent", "tests.fake_backends:raises"], cases=CASES[:1])
    assert run(suite, "--out", tmp_path / "a").exit_code == 0
    assert run(suite, "--out", tmp_path / "b", "--strict").exit_code == 1


def test_a_lost_gpu_context_stops_the_run_and_says_why(tmp_path, monkeypatch):
    """In the gdnbench process (--no-isolate), after a sticky CUDA error every later call fails: the remaining
    cases become 'not run' rows that name the case and backend where the context was lost, what was measured
    is kept, and the exit is 1. (With the worker, a fresh worker goes on.)"""
    from gdnbench import worker as worker_mod

    probes = iter([None, "AcceleratorError: CUDA error: an illegal memory access was encountered"])
    monkeypatch.setattr(worker_mod, "device_lost", lambda _dev: next(probes))
    suite = write_suite(tmp_path, ["torch.recurrent", "tests.fake_backends:raises"])
    res = run(suite, "--out", tmp_path / "out")
    assert res.exit_code == 1, res.output
    df = pd.read_csv(tmp_path / "out" / "results.csv")
    assert len(df) == 2 * len(CASES)
    done, lost, rest = (df[df.case_id == c] for c in df.case_id.unique())
    assert (done[done.backend == "torch.recurrent"].status == Status.PASS).all()
    assert (lost[lost.backend == "torch.recurrent"].status == Status.PASS).all()  # measured before the loss
    assert (rest.status == Status.ERROR).all()
    reason = rest.error.iloc[0]
    assert reason.startswith("not run: the GPU context was lost during case " + lost.case_id.iloc[0])
    assert "fake.raises: RuntimeError: boom" in reason
    meta = json.loads((tmp_path / "out" / "run.json").read_text())
    assert meta["status"] == "device lost" and meta["device_lost"] in reason
    # --resume (in a fresh process, the device fine again) runs the cases that were never started
    monkeypatch.setattr(worker_mod, "device_lost", lambda _dev: None)
    res = run(suite, "--out", tmp_path / "out", "--resume")
    df = pd.read_csv(tmp_path / "out" / "results.csv")
    assert len(df) == 2 * len(CASES) and not df.error.str.startswith("not run").any(), res.output
    again = df[df.case_id == rest.case_id.iloc[0]].set_index("backend")
    assert again.status.to_dict() == {"torch.recurrent": Status.PASS, "fake.raises": Status.ERROR}


def test_timeout_becomes_a_row(tmp_path):
    # a limit far above what torch.chunk needs on this case even on a loaded machine, far below fake.slow's 30 s
    suite = write_suite(tmp_path, ["tests.fake_backends:slow", "torch.chunk"], cases=CASES[:1],
                        timing={**FAST, "timeout_s": 8.0})
    res = run(suite, "--out", tmp_path / "out")
    assert res.exit_code == 0, res.output  # a timeout is not a correctness failure (see --strict)
    df = pd.read_csv(tmp_path / "out" / "results.csv")
    assert df.set_index("backend")["status"].to_dict() == {"fake.slow": Status.TIMEOUT, "torch.chunk": Status.PASS}


def test_decode_pool_outside_slots_is_caught(tmp_path):
    suite = write_suite(tmp_path, ["tests.fake_backends:clobber"], cases=CASES[2:])
    assert run(suite, "--out", tmp_path / "out").exit_code == 1
    df = pd.read_csv(tmp_path / "out" / "results.csv")
    assert df["error"].str.contains("outside slot_idx").all()


@pytest.mark.parametrize("chained", [False, True])
def test_interrupt_keeps_finished_cases(tmp_path, monkeypatch, chained):
    """Ctrl-C ends the run (exit 130, run.json "interrupted") with the finished cases saved, also when it
    comes back as another error raised while handling it, which must not become an ERROR row."""
    Interrupt.calls = 0
    monkeypatch.setattr(Interrupt, "chained", chained)
    suite = write_suite(tmp_path, ["tests.fake_backends:interrupt"])
    res = run(suite, "--out", tmp_path / "out")
    assert res.exit_code == 130
    df = pd.read_csv(tmp_path / "out" / "results.csv")
    assert len(df) == 1 and df["status"].iloc[0] == Status.PASS
    assert json.loads((tmp_path / "out" / "run.json").read_text())["status"] == "interrupted"


def test_sigterm_stops_the_run_as_ctrl_c_does(tmp_path, monkeypatch):
    """SIGTERM (``timeout``'s, a CI runner's) mid-run: exit 130, run.json "interrupted", the finished case
    saved; and the handler before the run is back afterwards."""
    Interrupt.calls = 0
    monkeypatch.setattr(Interrupt, "terminate", True)

    def unhandled(signum, frame):  # without the run's own handler, the test fails here instead of dying
        pytest.fail("SIGTERM reached the handler outside the run")

    before = signal.signal(signal.SIGTERM, unhandled)
    try:
        res = run(write_suite(tmp_path, ["tests.fake_backends:interrupt"]), "--out", tmp_path / "out")
        assert signal.getsignal(signal.SIGTERM) is unhandled
    finally:
        signal.signal(signal.SIGTERM, before)
    assert res.exit_code == 130
    assert len(pd.read_csv(tmp_path / "out" / "results.csv")) == 1
    assert json.loads((tmp_path / "out" / "run.json").read_text())["status"] == "interrupted"


def test_resume_goes_on_with_an_interrupted_run(tmp_path, monkeypatch):
    """--resume keeps the finished case as it was written, runs the others, and records both sessions."""
    Interrupt.calls = 0
    suite = write_suite(tmp_path, ["tests.fake_backends:interrupt", "torch.recurrent"])
    out = tmp_path / "out"
    assert run(suite, "--out", out).exit_code == 130
    first = pd.read_csv(out / "results.csv")
    assert len(first) == 2 and first.case_id.nunique() == 1  # the interrupted case left no rows
    written = (out / "results.csv").read_text().splitlines()
    monkeypatch.setattr(Interrupt, "calls", -100)  # the user's Ctrl-C does not come again
    res = run(suite, "--out", out, "--resume")
    assert res.exit_code == 0, res.output
    df = pd.read_csv(out / "results.csv")
    assert len(df) == 2 * len(CASES) and (df.status == Status.PASS).all()
    assert (out / "results.csv").read_text().splitlines()[:3] == written  # the header and the kept rows
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "complete" and meta["cases_from_earlier_sessions"] == [first.case_id[0]]
    assert [m["status"] for m in meta["earlier_sessions"]] == ["interrupted"]
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert sorted((s["case_id"], s["backend"]) for s in samples) == sorted(zip(df.case_id, df.backend))
    assert "2 cases (1 kept from the earlier session(s))" in res.output
    assert "resumed: 1 case(s) measured in 1 earlier session(s)" in " ".join(res.output.split())
    res = run(suite, "--out", out, "--resume")
    assert res.exit_code == 2 and "is complete; nothing to go on with" in " ".join(res.output.split())


@pytest.mark.parametrize("args,message", [
    (["--backends", "torch.recurrent"], "backends is ['tests.fake_backends:interrupt', 'torch.recurrent'], "
                                        "this command's is ['torch.recurrent']"),
    (["--seed", "7"], "seed is 0, this command's is 7"),
    (["--filter", "decode"], "suite.filter is None, this command's is 'decode'"),
])
def test_resume_refuses_another_selection(tmp_path, args, message):
    Interrupt.calls = 0
    suite = write_suite(tmp_path, ["tests.fake_backends:interrupt", "torch.recurrent"])
    out = tmp_path / "out"
    assert run(suite, "--out", out).exit_code == 130
    res = run(suite, "--out", out, "--resume", *args)
    assert res.exit_code == 2 and message in " ".join(res.output.split()), res.output
    assert len(pd.read_csv(out / "results.csv")) == 2  # untouched


def test_resume_needs_an_earlier_run(tmp_path):
    suite = write_suite(tmp_path, ["torch.recurrent"])
    res = run(suite, "--resume")
    assert res.exit_code == 2 and "--resume needs --out DIR" in res.output
    res = run(suite, "--resume", "--out", tmp_path / "nothing")
    assert res.exit_code == 2 and "has no run.json" in " ".join(res.output.split())


def test_filter_backends_baseline_and_dump(tmp_path):
    suite = write_suite(tmp_path, ["torch.recurrent"])
    res = run(suite, "--out", tmp_path / "out", "--filter", "decode", "--backends", "torch.chunk,torch.recurrent",
              "--baseline", "torch.chunk", "--dump", tmp_path / "dump", "--seed", 5)
    assert res.exit_code == 0, res.output
    df = pd.read_csv(tmp_path / "out" / "results.csv")
    assert set(df["case_id"]) == {c for c in df["case_id"] if c.startswith("decode/")} and len(df) == 2
    assert set(df["baseline"]) == {"torch.chunk"}
    files = list((tmp_path / "dump").glob("*.pt"))
    assert len(files) == 1
    d = torch.load(files[0], weights_only=False)
    assert d["case"]["op"] == "decode" and d["inputs"]["qk_l2norm"] == "pre"
    assert {"q", "k", "v", "g", "beta", "state_pool", "slot_idx", "scale"} <= set(d["inputs"])
    assert set(d["outputs"]) == {"reference", "torch.chunk", "torch.recurrent"}
    assert d["outputs"]["torch.chunk"]["final_state"].shape == (2, 1, 8, 8)
    assert torch.allclose(d["outputs"]["torch.chunk"]["o"], d["outputs"]["reference"]["o"], atol=1e-5)
    assert json.loads((tmp_path / "out" / "run.json").read_text())["seed"] == 5


def test_copy_reference_times_a_copy_of_each_cases_bytes_beside_every_backend(tmp_path):
    suite = write_suite(tmp_path, ["torch.recurrent", "torch.chunk"], cases=[CASES[0], CASES[2]])
    assert run(suite, "--out", tmp_path / "out", "--copy-reference").exit_code == 0
    df = pd.read_csv(tmp_path / "out" / "results.csv")
    assert len(df) == 4 and (df["copy_us"] > 0).all()
    assert (df["pct_copy"] - 100 * df["copy_us"] / df["median_us"]).abs().max() < 1e-9
    assert df["note"].str.contains("timed beside a copy of its bytes").all()
    assert json.loads((tmp_path / "out" / "run.json").read_text())["copy_reference"] is True
    assert run(suite, "--out", tmp_path / "plain").exit_code == 0
    assert pd.read_csv(tmp_path / "plain" / "results.csv")["copy_us"].isna().all()


@pytest.mark.parametrize("args, needle", [
    (["nope.yaml"], "no shipped suite"),
    (["smoke", "--backends", "torch.nope"], "--backends: no backend named 'torch.nope'"),
    (["smoke", "--backends", "torch.chunk", "--baseline", "torch.recurrent"], "--baseline"),
    (["smoke", "--timer", "graph", "--device", "cpu"], "needs a CUDA device"),
    (["smoke", "--filter", "no-such-case"], "matches none"),
    (["smoke", "--backends", "tests.fake_backends:nothing_here"], "cannot load backend"),
])
def test_bad_input_exits_2(args, needle, tmp_path):
    res = run(*args, "--out", tmp_path / "out")
    assert res.exit_code == 2
    assert needle in res.output


def test_bad_suite_exits_2_naming_file_case_and_field(tmp_path):
    suite = write_suite(tmp_path, ["torch.chunk"], cases=[CASES[0], {**CASES[0], "HV": 3, "H": 2}])
    res = run(suite)
    assert res.exit_code == 2
    assert "suite.yaml" in res.output and "cases[1]" in res.output and "HV=3" in res.output


def test_show_rerenders_and_list(tmp_path):
    suite = write_suite(tmp_path, ["torch.recurrent", "tests.fake_backends:wrong"], cases=CASES[:1])
    run(suite, "--out", tmp_path / "out")
    res = runner.invoke(app, ["show", str(tmp_path / "out")])
    assert res.exit_code == 0 and "prefill/padded/B=1,T=9" in res.output and "FAIL" in res.output
    res = runner.invoke(app, ["show", str(tmp_path / "out"), "--markdown", str(tmp_path / "t.md")])
    md = (tmp_path / "t.md").read_text().splitlines()
    assert res.exit_code == 0 and md[2] == "| case | torch.recurrent | fake.wrong |"
    assert md[4].startswith("| prefill/padded/B=1,T=9,") and md[4].endswith("| FAIL " + md[4].split("FAIL ")[-1])
    assert runner.invoke(app, ["show", str(tmp_path / "missing")]).exit_code == 2
    (tmp_path / "junk.csv").write_text("a,b\n1,2\n")
    assert runner.invoke(app, ["show", str(tmp_path / "junk.csv")]).exit_code == 2
    res = runner.invoke(app, ["list"])
    assert res.exit_code == 0 and "torch.recurrent" in res.output and "parity" in res.output


def test_speedups_use_the_baseline_of_each_op(tmp_path):
    suite = write_suite(tmp_path, ["torch.chunk", "torch.recurrent"], cases=[CASES[0], CASES[2]],
                        baseline={"prefill": "torch.chunk", "decode": "torch.recurrent"})
    assert run(suite, "--out", tmp_path / "out").exit_code == 0
    df = pd.read_csv(tmp_path / "out" / "results.csv").set_index(["op", "backend"])
    assert df.loc[("prefill", "torch.chunk"), "speedup"] == 1 and df.loc[("decode", "torch.recurrent"), "speedup"] == 1
    assert df.loc[("prefill", "torch.recurrent"), "baseline"] == "torch.chunk"
    assert df.loc[("decode", "torch.chunk"), "baseline"] == "torch.recurrent"


def test_triton_rows_on_cpu_are_marked_interpreted_and_get_no_speedup(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the fake runs no Triton, so setting it late is harmless
    suite = write_suite(tmp_path, ["torch.recurrent", "tests.fake_backends:triton_ok"], cases=CASES[:1],
                        baseline="torch.recurrent")
    assert run(suite, "--out", tmp_path / "out").exit_code == 0
    df = pd.read_csv(tmp_path / "out" / "results.csv").set_index("backend")
    assert df.loc["fake.triton", "status"] == Status.PASS and df.loc["fake.triton", "interpreted"]
    assert pd.isna(df.loc["fake.triton", "speedup"]) and df.loc["torch.recurrent", "speedup"] == 1
    assert "interpreter" in df.loc["fake.triton", "note"]

"""Fault injection through the worker process: every way a backend can go wrong becomes its row, the run
completes, and --resume keeps the rows (or, with --retry-failed, runs those cases again)."""

import csv
import json
import re

import pandas as pd
import pytest
import torch
import yaml
from typer.testing import CliRunner

from gdnbench.cli import app
from gdnbench.results import UNFINISHED, RunDir

FAULTS = {  # backend -> (status, what its error must say)
    "torch.recurrent": ("PASS", ""),
    "tests.fake_backends:raises": ("ERROR", "boom: the kernel exploded"),
    "tests.fake_backends:nan": ("NAN", ""),
    "tests.fake_backends:wrong": ("FAIL", ""),
    "tests.fake_backends:slow": ("TIMEOUT", "exceeded the 2 s limit"),
    "tests.fake_backends:native_hang": ("TIMEOUT", "hung outside Python, so the worker was killed"),
    "tests.fake_backends:exits": ("CRASH", "exited with code 3; its last stderr lines: fake.exits: leaving"),
    # faulthandler's trace names the Python call that crashed: the backend's own frame
    "tests.fake_backends:segfault": ("CRASH", "killed by SIGSEGV; where it was (innermost Python frames first): "
                                              "Fatal Python error: Segmentation fault"),
}


def test_every_fault_becomes_its_row_and_the_run_completes(tmp_path):
    suite = tmp_path / "faults.yaml"
    suite.write_text(yaml.safe_dump({
        "name": "faults", "backends": list(FAULTS), "baseline": "torch.recurrent",
        "timing": {"warmup": 1, "min_samples": 2, "max_samples": 3, "min_time_s": 0.0, "max_time_s": 0.3,
                   "timeout_s": 2},
        "cases": [
            {"B": 1, "T": 6, "H": 1, "HV": 2, "D": 8, "dtype": "fp32"},
            # inputs and a reference that take longer than timeout_s: the parent stops the worker
            {"B": 1, "T": 2_000_000, "H": 1, "HV": 1, "D": 8, "dtype": "fp32"},
        ]}))
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", str(suite), "--device", "cpu", "--out", str(out)])
    assert res.exit_code == 1, res.output  # FAIL and NAN rows; the run itself went through
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "complete"
    df = pd.read_csv(out / "results.csv")
    first = df[df["T"] == 6].set_index("backend")
    for name, (status, needle) in FAULTS.items():
        row = first.loc[_registered_name(name)]
        assert row.status == status, (name, row.status, row.error)
        assert needle in str(row.error), (name, row.error)
    assert re.search(r'fake_backends\.py", line \d+ in segfault', first.loc["fake.segfault"].error)
    huge = df[df["T"] == 2_000_000]
    assert set(huge.status) == {"TIMEOUT"} and len(huge) == len(FAULTS)
    assert huge.error.str.contains("building the inputs and the reference").all()

    # --resume keeps the crashed rows as they are: nothing runs again
    (out / "run.json").write_text(json.dumps({**meta, "status": "interrupted"}))
    before = (out / "results.csv").read_text()
    res = CliRunner().invoke(app, ["run", str(suite), "--device", "cpu", "--out", str(out), "--resume"])
    assert res.exit_code == 1, res.output
    assert (out / "results.csv").read_text() == before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_an_illegal_memory_access_is_a_row_and_the_next_case_gets_a_fresh_worker(tmp_path):
    """On a GPU: a backend whose kernel hits an illegal address gets an ERROR row naming it, the worker with the
    lost context is replaced, and the next case's rows PASS; the run completes (exit 0: errors alone)."""
    suite = tmp_path / "illegal.yaml"
    suite.write_text(yaml.safe_dump({
        "name": "illegal", "backends": ["torch.recurrent", "tests.fake_backends:illegal_address"],
        "timing": {"warmup": 1, "min_samples": 2, "max_samples": 3, "min_time_s": 0.0, "max_time_s": 0.3},
        "cases": [{"B": 1, "T": T, "H": 1, "HV": 2, "D": 8, "dtype": "fp32"} for T in (6, 7)]}))
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", str(suite), "--device", "cuda", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "run.json").read_text())["status"] == "complete"
    df = pd.read_csv(out / "results.csv")
    assert len(df) == 4
    assert (df[df.backend == "torch.recurrent"].status == "PASS").all()
    bad = df[df.backend == "fake.illegal_address"]
    assert (bad.status == "ERROR").all() and bad.error.str.contains("illegal memory access").all(), bad.error


def _registered_name(spec: str) -> str:
    """The row name of a backend given as module:attribute (its Backend's own name, e.g. fake.raises)."""
    from gdnbench.backends import get_backend

    return get_backend(spec).name


def test_retry_failed_runs_unfinished_cases_again(tmp_path):
    rows = [{"case_id": "a", "backend": "x", "status": "PASS"}, {"case_id": "a", "backend": "y", "status": "CRASH"},
            {"case_id": "b", "backend": "x", "status": "PASS"}, {"case_id": "b", "backend": "y", "status": "FAIL"}]
    with open(tmp_path / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["case_id", "backend", "status"])
        w.writeheader()
        w.writerows(rows)
    run, kept = RunDir.resume(tmp_path, ["x", "y"])
    run.close()
    assert kept == {"a", "b"}
    run, kept = RunDir.resume(tmp_path, ["x", "y"], UNFINISHED)
    run.close()
    assert kept == {"b"}  # a FAIL is a result; a CRASH is not


def test_a_worker_per_device_runs_every_case_and_survives_a_crash(tmp_path):
    """--gpus (here as CPU workers, the test hook): the cases are shared, a worker killed by SIGSEGV on every
    case is replaced each time, and the run completes with every row."""
    suite = tmp_path / "pool.yaml"
    cases = [{"B": 1, "T": t, "H": 1, "HV": 1, "D": 8, "dtype": "fp32"} for t in (5, 6, 7, 8)]
    suite.write_text(yaml.safe_dump({
        "name": "pool", "backends": ["torch.recurrent", "tests.fake_backends:segfault"],
        "timing": {"warmup": 1, "min_samples": 2, "max_samples": 3, "min_time_s": 0.0, "max_time_s": 0.3},
        "cases": cases}))
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", str(suite), "--device", "cpu", "--gpus", "0,1", "--out", str(out),
                                   "--no-history"])
    assert res.exit_code == 0, res.output
    df = pd.read_csv(out / "results.csv")
    assert len(df) == 2 * len(cases) and json.loads((out / "run.json").read_text())["status"] == "complete"
    status = df.groupby("backend")["status"].agg(set).to_dict()
    assert status == {"torch.recurrent": {"PASS"}, "fake.segfault": {"CRASH"}}
    assert df.note.str.contains(r"ran by worker [01] on cpu").all()
    bad = CliRunner().invoke(app, ["run", str(suite), "--device", "cpu", "--gpus", "0,1", "--no-isolate",
                                   "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "--no-isolate" in bad.output


def test_sigterm_stops_the_worker_and_resume_finishes_the_run(tmp_path):
    """The default path (a worker process): SIGTERM mid-run exits 130 with the finished cases saved and the
    worker gone; --resume runs the rest."""
    import os
    import signal
    import subprocess
    import sys
    import time

    suite = tmp_path / "slow.yaml"
    suite.write_text(yaml.safe_dump({
        "name": "slow", "backends": ["torch.recurrent", "tests.fake_backends:slow"],
        "timing": {"warmup": 1, "min_samples": 2, "max_samples": 3, "min_time_s": 0.0, "max_time_s": 0.3,
                   "timeout_s": 20},
        "cases": [{"B": 1, "T": t, "H": 1, "HV": 1, "D": 8, "dtype": "fp32"} for t in (5, 6)]}))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "gdnbench", "run", str(suite), "--device", "cpu", "--out", str(out),
           "--no-history"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (out / "worker.log").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(3)  # the worker is in fake.slow's 30 s call of the first case
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130, proc.stdout.read().decode()
    assert json.loads((out / "run.json").read_text())["status"] == "interrupted"
    left = subprocess.run(["ps", "-o", "pid=,args=", "-g", str(proc.pid)], capture_output=True, text=True).stdout
    assert "spawn_main" not in left, f"the worker outlived the run: {left}"
    res = CliRunner().invoke(app, ["run", str(suite), "--device", "cpu", "--out", str(out), "--resume",
                                   "--no-history"])
    df = pd.read_csv(out / "results.csv")
    assert len(df) == 4 and set(df[df.backend == "fake.slow"].status) == {"TIMEOUT"}, res.output


def test_fatal_signal_frames_reads_the_innermost_frames_of_the_last_trace():
    """A faulthandler trace after other output: the fatal error and the innermost frames of the thread it hit
    (not another thread's, not an earlier trace's); no trace gives nothing."""
    from gdnbench.worker import fatal_signal_frames

    lines = ["a warning", "Fatal Python error: Aborted", 'File "old.py", line 1 in gone',
             "Fatal Python error: Segmentation fault", "Thread 0x2 (most recent call first):",
             'File "threading.py", line 3 in wait', "Current thread 0x1 (most recent call first):",
             'File "lib.py", line 9 in init', 'File "adapter.py", line 40 in prepare',
             'File "runner.py", line 5 in run',
             "Extension modules: torch._C (total: 1)"]
    assert fatal_signal_frames(lines, 2) == ["Fatal Python error: Segmentation fault", 'File "lib.py", line 9 in init',
                                             'File "adapter.py", line 40 in prepare']
    assert fatal_signal_frames(lines, 5)[-1] == 'File "runner.py", line 5 in run'
    assert fatal_signal_frames(["only", "warnings"], 3) == []

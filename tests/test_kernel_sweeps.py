"""examples/kernel_sweeps: the chunk_fused and recurrent sweep tools, run in Triton's interpreter on tiny cases.

Every forced config and every output-pass variant must give the same outputs (the tools print each
row's relative difference from the first), which is what makes their GPU tables trustworthy.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gdnbench.results import Status
from gdnbench_kernels.chunk.configs import config_from, config_label
from gdnbench_kernels.chunk.prep import PREP_CANDIDATES
from tests import SUBPROCESS_TIMEOUT_S

ROOT = Path(__file__).resolve().parent.parent
CASE = "B=2,T=40"  # smoke's fp32 padded prefill case


def _sweep(*args: str, tool: str = "chunk_fused_sweep", rows: str = "prefill/") -> list[str]:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-m", f"examples.kernel_sweeps.{tool}", *args, "--device", "cpu"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert run.returncode == 0, run.stderr[-2000:]
    return [line for line in run.stdout.splitlines() if line.startswith(rows)]


@pytest.mark.parametrize("kernel,configs,expect", [
    ("prep", [], len(PREP_CANDIDATES)),  # the shipped candidates, each forced as it is
    ("state", ["-c", "16,4,2", "-c", "64,8,3"], 2),
    ("walk", ["-c", "16,4,3", "-c", "64,4,2"], 2),
])
def test_every_forced_config_gives_the_same_outputs(kernel, configs, expect):
    rows = _sweep("configs", "smoke", "-k", CASE, "--kernel", kernel, *configs)
    assert len(rows) == expect
    forced = [tuple(map(int, c.split(","))) for c in configs[1::2]] or PREP_CANDIDATES
    labels = [f"{kernel}[{config_label(config_from(c, block=kernel != 'prep'))}]" for c in forced]
    assert [re.search(rf"{kernel}\[[^\]]*\]", r).group(0) for r in rows] == labels, rows
    assert all(float(re.search(r"diff (\S+)", r).group(1)) < 1e-6 for r in rows), rows


def test_output_pass_variants_agree():
    (row,) = _sweep("fuse-output", "smoke", "-k", CASE)
    assert float(row.split()[-1]) < 1e-6 and len(row.split()) == 8, row


def test_segment_sizes_agree():
    """Warm-up segments of 1 and 2 chunks give the default's and the sequential walk's outputs (T=40 is one
    chunk: one segment a sequence either way, which still runs the segment path)."""
    (row,) = _sweep("segments", "smoke", "-k", CASE, "-s", "1", "-s", "2")
    assert float(row.split()[-1]) < 1e-6 and len(row.split()) == 8, row


def test_every_plan_that_runs_a_case_agrees_and_the_fastest_is_named():
    """The plans sweep on a CPU: the Triton paths and the recurrence run and agree, the Gluon ones (sm90 only) and
    those that force whole walks on or off (the default has no warm-up segments on a CPU) are "-", and a line
    names the fastest."""
    lines = _sweep("plans", "smoke", "-k", CASE, rows="")
    (row,) = [line for line in lines if line.startswith("prefill/")]
    from examples.kernel_sweeps.chunk_fused_sweep import PLANS

    cells = row.split()[3:-1]
    gluon = {"sm90", "sm90_transposed", "specialized", "whole-on-sm90"}
    not_here = gluon | {"no-whole-walks", "whole-walks"}
    assert [c == "-" for c in cells] == [name in not_here for name, _ in PLANS], row
    assert float(row.split()[-1]) < 1e-5, row
    fastest = lines[lines.index(row) + 1]
    assert re.fullmatch(r"  fastest: (\S+); the first column at \d+\.\d\dx its time", fastest), fastest
    assert fastest.split()[1].rstrip(";") in {name for name, _ in PLANS} - not_here


@pytest.mark.parametrize("args,message", [
    (["-c", "64,4,1,1,1"], "expected [BV,]WARPS,STAGES"),
    (["--kernel", "state", "-c", "4,1"], "--kernel state takes BV,WARPS,STAGES[,MAXNREG] configs, got 4,1"),
])
def test_a_malformed_config_is_a_usage_error(args, message):
    run = subprocess.run([sys.executable, "-m", "examples.kernel_sweeps.chunk_fused_sweep", "configs", "smoke", *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert run.returncode == 2 and message in run.stderr, run.stderr


def test_every_forced_decode_config_gives_the_same_outputs():
    """smoke's two decode cases (a scattered fp32 pool; T=2 on a bf16 pool with raw gating), four configs
    each: one item per program, three (the grid's last program short), two with V-blocks of 8, and one with
    a register cap (which the interpreter ignores)."""
    rows = _sweep("smoke", "-k", "decode", "-c", "16,4,1", "-c", "16,4,3", "-c", "8,2,2", "-c", "16,4,1,64",
                  tool="recurrent_sweep", rows="decode/")
    assert len(rows) == 8
    assert [r.split()[1] for r in rows] == ["16/4x1", "16/4x3", "8/2x2", "16/4x1r64"] * 2
    assert all(float(x) < 1e-6 for r in rows for x in r.split()[-2:]), rows


def test_a_malformed_decode_config_is_a_usage_error():
    run = subprocess.run([sys.executable, "-m", "examples.kernel_sweeps.recurrent_sweep", "smoke", "-c", "8,1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert run.returncode == 2 and "expected BV,WARPS,ITEMS[,MAXNREG]" in run.stderr

IN_GIT = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode == 0
needs_git = pytest.mark.skipif(not IN_GIT, reason="revision_ab reads kernels/ from the repository's git history")


@needs_git
def test_revision_ab_runs_both_sides_and_checks_them():
    """HEAD against the working tree (the same kernels in CI): one row, both sides PASS with equal errors."""
    (row,) = _sweep("smoke", "-k", CASE, "--rev", "HEAD", tool="revision_ab")
    fields = row.split()
    assert fields[1] == "triton.chunk_fused" and len(fields) == 7, row
    err_o, err_state = (f.split("/") for f in fields[5:7])
    assert err_o[0] == err_o[1] and err_state[0] == err_state[1] and float(err_o[0]) < 1e-5, row


SIDES = """
import importlib, torch
from examples.kernel_sweeps import revision_ab as ab
from gdnbench.backends import get_backend
from gdnbench.problem import make_problem
from gdnbench.suite import load_suite
s = load_suite("smoke")
p = make_problem(s.cases[0], s.seed, torch.device("cpu"))
b = get_backend("triton.chunk_fused")
with ab.kernels_at("HEAD") as (sha, old):
    calls = []
    real = old.chunk.chunk_fused_gdn
    old.chunk.chunk_fused_gdn = lambda *a, **k: calls.append(1) or real(*a, **k)
    old_b = ab.backend_at(sha, old, b)
    ab._prepare_with(old, old_b, p).call()
    seen_old = len(calls)
    ab._prepare_with(importlib.import_module("gdnbench_kernels"), b, p).call()
    print(old.__name__, sha, seen_old, len(calls), old_b.prepare.__module__, old_b is not b)
"""


@needs_git
def test_revision_ab_prepares_each_side_on_its_own_package_and_adapter():
    run = subprocess.run([sys.executable, "-c", SIDES], cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "1"},
                         capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert run.returncode == 0, run.stderr[-2000:]
    name, sha, seen_old, seen_after, adapter, own = run.stdout.split()
    assert name == f"gdnbench_kernels_at_{sha}" and seen_old == seen_after == "1"
    assert adapter == f"{name}.adapter_triton_chunk" and own == "True"  # REV's adapter, not the tree's


def test_revision_ab_names_a_bad_revision():
    run = subprocess.run([sys.executable, "-m", "examples.kernel_sweeps.revision_ab", "smoke", "--rev", "no-such-rev",
                          "--device", "cpu"], cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "1"},
                         capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert run.returncode != 0 and "no-such-rev" in run.stderr


def test_revision_ab_row_names_each_sides_path_where_they_differ():
    from types import SimpleNamespace

    from examples.kernel_sweeps.revision_ab import row

    ok = SimpleNamespace(status=Status.PASS, message="", rel_err_o=1e-3, rel_err_state=None)
    same = row("c", "b", 30.0, 20.0, [ok, ok], ["BV=16 num_warps=2", "BV=16 num_warps=2"])
    assert same.split() == ["c", "b", "30.0", "20.0", "1.500", "1.0e-03/1.0e-03", "-/-"]
    bad = SimpleNamespace(status=Status.FAIL, message="o off by 1e-1", rel_err_o=1e-1, rel_err_state=None)
    differ = row("c", "b", 30.0, 20.0, [ok, bad], ["raw gating; BV=16 num_warps=2", "raw gating; BV=8 num_warps=1"])
    assert differ.endswith("PASS/FAIL (o off by 1e-1)  paths: BV=16 num_warps=2 | BV=8 num_warps=1"), differ
    assert row("c", "b", 1.0, 1.0, [ok, ok], ["a; b", "a"]).endswith("paths: b | -")


def test_decode_sweep_times_the_copies_beside_the_configs():
    rows = _sweep("smoke", "-k", "slots=scattered", "-c", "16,4,1", "--copies", tool="recurrent_sweep", rows="decode/")
    assert [r.split()[1] for r in rows] == ["16/4x1", "copy", "slot-copy"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_slot_copy_flips_the_touched_slots_only(dtype):
    """The slot copy must move the touched slots' bytes, all of them and no others: after one call each
    touched slot is its bitwise NOT and every other slot is untouched (a head dim of 60: a slot is not a
    whole number of blocks)."""
    code = f"""
import torch
from examples.kernel_sweeps.recurrent_sweep import slot_copy
pool = torch.randn(7, 2, 60, 60).to(torch.{dtype})
before = pool.clone()
slots = torch.tensor([5, 0, 3], dtype=torch.int32)
slot_copy(pool, slots)()
ints = {{2: torch.int16, 4: torch.int32}}[pool.element_size()]
flipped = (pool.view(ints) == ~before.view(ints)).flatten(1).all(1)
same = (pool.view(ints) == before.view(ints)).flatten(1).all(1)
print(flipped.tolist(), same.tolist())
"""
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "1"},
                         capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert run.returncode == 0, run.stderr[-2000:]
    touched = [i in (5, 0, 3) for i in range(7)]
    assert run.stdout.split("\n")[-2] == f"{touched} {[not t for t in touched]}"


def test_the_whole_sequences_backend_runs_chunks_where_the_default_runs_the_recurrence(tmp_path):
    """examples.kernel_sweeps.whole_sequences beside triton.chunk_fused on a 4-token prefill: the default plan takes
    the recurrent kernel (0024), the forced one the chunk pipeline, and both PASS."""
    import pandas as pd

    suite = tmp_path / "tiny.yaml"
    suite.write_text("name: tiny\nseed: 0\nreference: {backend: torch.chunk, precision: fp64}\n"
                     "defaults: {dtype: fp32, H: 1, HV: 2, D: 16}\ncases:\n  - {B: 1, T: 4}\n")
    plugin = "examples.kernel_sweeps.whole_sequences:chunk_fused_whole_sequences"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-m", "gdnbench", "run", str(suite), "-b", f"triton.chunk_fused,{plugin}",
                          "--out", str(tmp_path / "run"), "--no-history"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    rows = pd.read_csv(tmp_path / "run" / "results.csv").set_index("backend")
    assert (rows.status == Status.PASS.value).all(), rows[["status", "error"]]
    assert "recurrent kernel" in rows.loc["triton.chunk_fused", "path"]
    assert "recurrent kernel" not in rows.loc["sweep.chunk_fused_whole_sequences", "path"]

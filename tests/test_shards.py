"""Shards: disjoint, covering, stable and balanced splits; merge joins them into one run, or refuses."""

import json
import shutil

import pandas as pd
import pytest
from typer.testing import CliRunner

from gdnbench.cli import app
from gdnbench.shards import ShardError, estimated_s, parse_shard, shard_cases
from gdnbench.suite import load_suite

runner = CliRunner()


@pytest.mark.parametrize("suite", ["qwen3-next", "parity", "decay", "smoke"])
@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_shards_are_disjoint_cover_the_suite_and_keep_its_order(suite, count):
    cases = list(load_suite(suite).cases)
    shards = [shard_cases(cases, i, count) for i in range(1, count + 1)]
    ids = [c.id for s in shards for c in s]
    assert sorted(ids) == sorted(c.id for c in cases) and len(ids) == len(set(ids))
    order = {c.id: n for n, c in enumerate(cases)}
    for s in shards:
        assert [order[c.id] for c in s] == sorted(order[c.id] for c in s)
    assert shards == [shard_cases(cases, i, count) for i in range(1, count + 1)]  # stable
    # balanced: no shard carries more than the largest case beyond an equal share
    loads = [sum(map(estimated_s, s)) for s in shards]
    assert max(loads) <= sum(loads) / count + max(map(estimated_s, cases)) * 1.0001


@pytest.mark.parametrize("spec", ["0/2", "3/2", "a/b", "2", "1/0"])
def test_a_bad_shard_is_refused(spec):
    with pytest.raises(ShardError, match="expected I/N"):
        parse_shard(spec)
    assert parse_shard(" 2 / 4 ") == (2, 4)


def run(*args):
    return runner.invoke(app, ["run", "smoke", "--device", "cpu", "--no-isolate", "--no-history", *map(str, args)])


def test_merged_shards_are_the_whole_suite_and_mismatches_exit_2(tmp_path):
    for i in (1, 2):
        res = run("--shard", f"{i}/2", "--out", tmp_path / f"s{i}")
        assert res.exit_code == 0, res.output
        meta = json.loads((tmp_path / f"s{i}" / "run.json").read_text())
        assert meta["shard"]["index"] == i and meta["shard"]["count"] == 2
    res = runner.invoke(app, ["merge", str(tmp_path / "all"), str(tmp_path / "s1"), str(tmp_path / "s2")])
    assert res.exit_code == 0, res.output
    merged = pd.read_csv(tmp_path / "all" / "results.csv")
    assert set(merged.case_id) == {c.id for c in load_suite("smoke").cases}
    meta = json.loads((tmp_path / "all" / "run.json").read_text())
    assert meta["status"] == "complete" and [m["shard"]["index"] for m in meta["merged_from"]] == [1, 2]
    assert runner.invoke(app, ["show", str(tmp_path / "all")]).exit_code == 0

    shutil.copytree(tmp_path / "s1", tmp_path / "s1again")
    res = runner.invoke(app, ["merge", str(tmp_path / "bad"), str(tmp_path / "s1"), str(tmp_path / "s1again")])
    assert res.exit_code == 2 and "shards overlap" in res.output
    assert run("--shard", "2/2", "--seed", "7", "--out", tmp_path / "s2seed").exit_code == 0
    res = runner.invoke(app, ["merge", str(tmp_path / "bad"), str(tmp_path / "s1"), str(tmp_path / "s2seed")])
    assert res.exit_code == 2 and "seed is 7" in res.output

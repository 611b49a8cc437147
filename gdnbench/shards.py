"""Splitting a suite's cases into shards that run apart (CI jobs, cluster tasks), and joining their runs.

A shard holds whole cases (all backends of a case run together, so interleaved speedups and per-case
baselines stay valid). The split is a function of the selected cases alone: cases are dealt largest first
(by the roofline model's estimate of a call's time) to the shard with the least estimated work so far, ties
broken by case id, so every machine computes the same split and the shards take about equal time.

``merge`` joins shard runs into one run directory: they must be the same suite file, seed, timing and backends,
and hold no case twice; each shard's provenance (device, host, start) is kept in the merged run.json.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

from gdnbench import roofline
from gdnbench.results import RunDir, load_samples, run_field
from gdnbench.suite import Case

# what a shard's run.json must share with the others to be merged (dotted keys)
SAME_IN_EVERY_SHARD = ("suite.sha256", "suite.filter", "seed", "timing", "backends", "baseline", "reference",
                       "tolerances", "interleave", "copy_reference", "shard.count")
# a call's time, roughly, on a current data-center GPU: only the shards' balance depends on these
BYTES_PER_S, FLOPS_PER_S = 3e12, 4e14


class ShardError(ValueError):
    """A --shard that cannot be parsed, or shard runs that cannot be merged."""


def parse_shard(spec: str) -> tuple[int, int]:
    """'I/N' (1 <= I <= N) -> (I, N)."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", spec)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ShardError(f"--shard {spec!r}: expected I/N with 1 <= I <= N, e.g. 2/4")
    return int(m.group(1)), int(m.group(2))


def estimated_s(case: Case) -> float:
    """A case's estimated time per call (roofline bytes and FLOPs at nominal rates): for balancing only."""
    nbytes, flops = roofline.traffic(case)
    return nbytes / BYTES_PER_S + flops / FLOPS_PER_S


def shard_cases(cases: list[Case], index: int, count: int) -> list[Case]:
    """The cases of shard ``index`` (1-based) of ``count``, in their suite order."""
    loads = [0.0] * count
    owner: dict[str, int] = {}
    for case in sorted(cases, key=lambda c: (-estimated_s(c), c.id)):
        shard = min(range(count), key=lambda s: (loads[s], s))
        loads[shard] += estimated_s(case)
        owner[case.id] = shard
    return [c for c in cases if owner[c.id] == index - 1]


def merge(out: Path, dirs: list[Path], force: bool = False) -> dict[str, Any]:
    """Write the shard runs in ``dirs`` as one run in ``out``; returns its run.json. Raises ShardError."""
    if len(dirs) < 2:
        raise ShardError("merge needs two or more shard runs")
    shards = [_read(d) for d in dirs]
    first_dir, first = dirs[0], shards[0][0]
    for d, (meta, _, _) in zip(dirs[1:], shards[1:]):
        for key in SAME_IN_EVERY_SHARD:
            if run_field(meta, key) != run_field(first, key):
                raise ShardError(f"{d}: {key} is {run_field(meta, key)!r}, {first_dir}'s is {run_field(first, key)!r}: "
                                 "shards of one run share the suite, seed, timing and backends")
    seen: dict[str, Path] = {}
    for d, (_, rows, _) in zip(dirs, shards):
        for case_id in dict.fromkeys(r["case_id"] for r in rows):
            if case_id in seen:
                raise ShardError(f"{d} and {seen[case_id]} both hold case {case_id}: shards overlap")
            seen[case_id] = d
    run = RunDir.create(out, out, force=force)
    try:
        for _, rows, samples in shards:
            run.add_rows(rows, samples)
        meta = {k: v for k, v in first.items() if k not in ("shard", "created_utc", "finished_utc", "status")}
        meta.update(
            created_utc=min(m.get("created_utc", "") for m, _, _ in shards),
            finished_utc=max(m.get("finished_utc", "") for m, _, _ in shards),
            status="complete" if all(m.get("status") == "complete" for m, _, _ in shards) else "incomplete",
            merged_from=[{"path": str(d), "shard": m.get("shard"), "host": m.get("host"),
                          "device": m.get("device"), "created_utc": m.get("created_utc"),
                          "status": m.get("status")} for d, (m, _, _) in zip(dirs, shards)])
        run.write_meta(meta)
    finally:
        run.close()
    return meta


def _read(d: Path) -> tuple[dict[str, Any], list[dict[str, str]], list[dict[str, Any]]]:
    if not (d / "run.json").is_file() or not (d / "results.csv").is_file():
        raise ShardError(f"{d}: not a run directory (no run.json and results.csv)")
    meta = json.loads((d / "run.json").read_text())
    with open(d / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return meta, rows, load_samples(d)


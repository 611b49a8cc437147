"""docs/results-schema.md names every results.csv column, in order, and every run.json key a run writes."""

import json
import re
from pathlib import Path

from gdnbench.results import COLUMNS

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs/results-schema.md").read_text()


def _section(title: str) -> str:
    return DOC.split(f"## {title}")[1].split("\n## ")[0]


def test_every_column_is_documented_in_order():
    named = []
    for line in _section("results.csv").splitlines():
        if line.startswith("| `"):
            named += re.findall(r"`([A-Za-z_0-9]+)`", line.split(" | ")[0])
    assert named == COLUMNS


def test_every_run_json_key_of_a_baseline_is_documented():
    documented = set()
    for line in _section("run.json").splitlines():
        if line.startswith("| `"):
            documented.update(re.findall(r"`([a-z_]+)`", line.split(" | ")[0]))
    for meta_path in (ROOT / "results/baselines").glob("*/*/run.json"):
        meta = json.loads(meta_path.read_text())
        assert set(meta) <= documented, (meta_path, set(meta) - documented)

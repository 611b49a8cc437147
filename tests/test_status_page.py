"""docs/status.md is what the tracked baselines give, and its tables read the runs right."""

import json
import random
from pathlib import Path

import pandas as pd

from gdnbench import status_page
from gdnbench.results import Status

ROOT = Path(__file__).resolve().parent.parent


def test_committed_page_matches_the_baselines():
    assert status_page.main([str(ROOT / "docs/status.md"), "--baselines", str(ROOT / "results/baselines"),
                             "--check"]) == 0, "docs/status.md is stale: run `make status`"


def test_lead_is_fastest_peer_over_fastest_bundled():
    rng = random.Random()
    bundled = {f"triton.k{i}": rng.uniform(1, 100) for i in range(3)}
    peers = {f"lib{i}.op": rng.uniform(1, 100) for i in range(3)}
    reference = {"torch.chunk": 1e-3}  # the harness's own reference never counts as a peer
    got = status_page.lead({**bundled, **peers, **reference})
    assert got == min(peers.values()) / min(bundled.values())
    assert status_page.lead({**bundled, **reference}) is None
    assert status_page.lead(peers) is None


def test_a_row_without_a_time_shows_its_status(tmp_path):
    run = tmp_path / "h200" / "smoke"
    run.mkdir(parents=True)
    rows = [
        {"case_id": "prefill/a", "backend": "triton.chunk_fused", "status": Status.PASS, "median_us": 10.0},
        {"case_id": "prefill/a", "backend": "fla.chunk", "status": Status.PASS, "median_us": 25.0},
        {"case_id": "prefill/b", "backend": "triton.chunk_fused", "status": Status.FAIL, "median_us": 1.0},
        {"case_id": "prefill/b", "backend": "fla.chunk", "status": Status.PASS, "median_us": 30.0},
    ]
    pd.DataFrame(rows).to_csv(run / "results.csv", index=False)
    (run / "run.json").write_text(json.dumps({"status": "complete", "command": "gdnbench run smoke"}))
    page = status_page.render(tmp_path)
    assert "## h200" in page and "### `h200/smoke`" in page
    assert "| `prefill/a` | 10.0 | 25.0 | 2.50 |" in page
    # a FAIL row's time is not a result: no time and no lead
    assert "| `prefill/b` | FAIL | 30.0 |  |" in page


def test_steps_between_baselines_of_the_same_case(tmp_path):
    """Two baselines of one case and backend: the later one's planted 30% step is listed, judged by compare's rule;
    a case only one baseline holds, and a run of another schema, list nothing."""
    from tests.test_history import write_run

    median = random.uniform(20, 2000)
    write_run(tmp_path / "h200" / "before", "a", 1, median)
    write_run(tmp_path / "h200" / "after", "b", 2, median * 1.3)
    other = tmp_path / "h200" / "old-schema"
    other.mkdir()
    pd.DataFrame([{"case_id": "prefill/x", "backend": "fla.chunk", "status": Status.PASS,
                   "median_us": 1.0}]).to_csv(other / "results.csv", index=False)
    (other / "run.json").write_text(json.dumps({"status": "complete"}))
    steps = status_page.render(tmp_path).split("## Steps between baselines")[1]
    rows = [line for line in steps.splitlines() if line.startswith("| NVIDIA")]
    assert len(rows) == 1 and "`aaaaaaa` -> `bbbbbbb`" in rows[0] and rows[0].endswith("| SLOWER |")

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


def test_every_parity_case_has_its_published_figure():
    """gdnbench.published covers the shipped parity suite exactly: one figure per case, none left over."""
    from gdnbench import published
    from gdnbench.suite import load_suite

    cases = load_suite(ROOT / "suites" / "parity.yaml").cases
    figures = [published.published_speedup(c.model_dump()) for c in cases]
    assert None not in figures
    assert len(cases) == len(published.PADDED) + len(published.VARLEN)
    assert published.published_speedup({"mode": "padded", "B": 5, "T": 63, "H": 1, "K": 64, "gate_norm": 1,
                                        "mask_p": 0}) is None


def test_published_comparison_sets_measured_ratios_beside_the_figure(tmp_path):
    """A parity baseline with FLA, the write-up's kernel and two bundled kernels: the section gives the published
    figure, FLA over gdn_cuda and FLA over the faster bundled kernel of that run; a later run of the case
    replaces an earlier one; a baseline of another suite adds nothing."""
    fla, theirs, ours, slower = (random.uniform(50, 100) for _ in range(4))
    case = {"case_id": "prefill/padded/p", "mode": "padded", "B": 4, "T": 1024, "H": 4, "K": 128,
            "gate_norm": 1.0, "mask_p": 0.0}

    def write(name: str, created: str, suite: str, medians: dict[str, float]) -> None:
        run = tmp_path / "h200" / name
        run.mkdir(parents=True)
        pd.DataFrame([{**case, "backend": b, "status": Status.PASS, "median_us": t} for b, t in medians.items()]
                     ).to_csv(run / "results.csv", index=False)
        (run / "run.json").write_text(json.dumps({"status": "complete", "created_utc": created,
                                                  "suite": {"name": suite}}))

    write("a-old", "2026-01-01", "parity", {"fla.chunk": 1.0, "triton.chunk_fused": 1.0})
    write("b-new", "2026-02-01", "parity", {"fla.chunk": fla, "gdn_cuda.chunk": theirs,
                                            "triton.chunk_fused": ours, "triton.chunk": ours + slower})
    write("c-other", "2026-03-01", "qwen3-next", {"fla.chunk": 1.0, "triton.chunk_fused": 1.0})
    section = status_page.render(tmp_path).split("## The published comparison")[1].split("## Steps")[0]
    assert f"| `prefill/padded/p` | 1.23 | {fla / theirs:.2f} | {fla / ours:.2f} | b-new |" in section
    assert section.count("`prefill/padded/p`") == 1

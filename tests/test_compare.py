"""gdnbench compare on synthetic runs written by the real RunDir, and the two statistics it rests on."""

import json

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from gdnbench.cli.compare import compare
from gdnbench.results import Row, RunDir, Status
from gdnbench.stats import mann_whitney_u, median_ratio_ci, summarize


# registered here as under `gdnbench`: a group (the callback) whose subcommand is named on the command line
app = typer.Typer()
app.callback()(lambda: None)
app.command("compare")(compare)
runner = CliRunner()

GPU = "NVIDIA H100 80GB HBM3"
META = {"device": {"type": "cuda", "name": GPU, "driver_version": "580.65"},
        "versions": {"torch": "2.13.0", "triton": "3.6.0", "backend:fla.chunk": "0.6.0"},
        "suite": {"name": "t"}, "timing": {"timer": "graph", "l2": "cold"}, "status": "complete"}


def draw(median: float, cv: float, n: int = 50, seed: int = 0) -> list[float]:
    """n samples around ``median`` with coefficient of variation ``cv``."""
    return (median * (1 + cv * np.random.default_rng(seed).standard_normal(n))).tolist()


def write_run(path, rows, **meta):
    """A run directory; rows maps (case_id, backend) to (status, raw samples or None if untimed)."""
    rd = RunDir(path)
    rd.write_meta({**META, **meta})
    for (case_id, backend), (status, samples) in rows.items():
        row = Row(suite="t", case_id=case_id, backend=backend, status=status, device=GPU)
        raw = []
        if samples is not None:
            row.update(timer="graph", l2="cold", **summarize(samples).as_dict())
            raw = [{"case_id": case_id, "backend": backend, "timer": "graph", "l2": "cold", "samples_us": samples}]
        rd.add_case([row], raw)
    return path


def compare_rows(tmp_path, base_rows, new_rows, *args, base_meta=None, new_meta=None):
    """(result, {(case_id, backend): row of the JSON output}, JSON document) of `compare BASE NEW`."""
    base = write_run(tmp_path / "base", base_rows, **(base_meta or {}))
    new = write_run(tmp_path / "new", new_rows, **(new_meta or {}))
    out = tmp_path / "cmp.json"
    out.unlink(missing_ok=True)
    res = runner.invoke(app, ["compare", str(base), str(new), "--json", str(out), *map(str, args)])
    if not out.exists():
        return res, {}, None
    doc = json.loads(out.read_text())
    return res, {(r["case_id"], r["backend"]): r for r in doc["rows"]}, doc


def output(res):
    """The command's output with Rich's line wrapping undone."""
    return res.output.replace("\n", "")


def verdicts(rows):
    return {k: r["verdict"] for k, r in rows.items()}


def test_identical_distributions_are_same(tmp_path):
    keys = [(f"case{i}", b) for i in range(4) for b in ("x.chunk", "y.chunk")]
    base = {k: (Status.PASS, draw(50 + 10 * i, 0.03, seed=i)) for i, k in enumerate(keys)}
    new = {k: (Status.PASS, draw(50 + 10 * i, 0.03, seed=100 + i)) for i, k in enumerate(keys)}
    res, rows, doc = compare_rows(tmp_path, base, new)
    assert res.exit_code == 0, res.output
    assert set(verdicts(rows).values()) == {"SAME"} and doc["counts"] == {"SAME": 8}
    assert all(r["ratio_lo"] <= r["ratio"] <= r["ratio_hi"] and r["base_n"] == 50 for r in rows.values())
    assert "SAME: 8" in output(res) and "warning" not in output(res)


def test_ten_percent_shift_with_low_noise_is_slower_and_exits_1(tmp_path):
    base = {("a", "k"): (Status.PASS, draw(100, 0.01, seed=1)), ("b", "k"): (Status.PASS, draw(100, 0.01, seed=2)),
            ("c", "k"): (Status.PASS, draw(100, 0.01, seed=3))}
    new = {("a", "k"): (Status.PASS, draw(110, 0.01, seed=4)), ("b", "k"): (Status.PASS, draw(90, 0.01, seed=5)),
           ("c", "k"): (Status.PASS, draw(100, 0.01, seed=6))}
    res, rows, doc = compare_rows(tmp_path, base, new)
    assert res.exit_code == 1, res.output
    assert verdicts(rows) == {("a", "k"): "SLOWER", ("b", "k"): "FASTER", ("c", "k"): "SAME"}
    a = rows[("a", "k")]
    assert a["ratio"] == pytest.approx(1.1, abs=0.01) and a["ratio_lo"] < 1.1 < a["ratio_hi"] and a["p_value"] < 1e-6
    assert [r["verdict"] for r in doc["rows"]] == ["SLOWER", "SAME", "FASTER"]  # largest slowdown first
    assert "SLOWER" in output(res) and "regression" in output(res)
    # only FASTER (and SAME) rows: no regression
    res, _, _ = compare_rows(tmp_path, base, {**new, ("a", "k"): base[("a", "k")]})
    assert res.exit_code == 0, res.output


def test_ten_percent_shift_buried_in_noise_is_ambiguous(tmp_path):
    noisy = draw(100, 0.3, n=10, seed=7)
    res, rows, _ = compare_rows(tmp_path, {("a", "k"): (Status.PASS, noisy)},
                                {("a", "k"): (Status.PASS, [1.1 * x for x in noisy])})
    r = rows[("a", "k")]
    assert r["verdict"] == "AMBIGUOUS" and r["ratio"] == pytest.approx(1.1) and r["p_value"] > 0.01
    assert r["ratio_lo"] < 1 < r["ratio_hi"]
    assert res.exit_code == 0, res.output  # not a regression by default ...
    res, _, _ = compare_rows(tmp_path, {("a", "k"): (Status.PASS, noisy)},
                             {("a", "k"): (Status.PASS, [1.1 * x for x in noisy])}, "--fail-on", "slower,ambiguous")
    assert res.exit_code == 1  # ... unless asked


def test_two_percent_shift_is_same_at_five_percent_even_when_significant(tmp_path):
    res, rows, _ = compare_rows(tmp_path, {("a", "k"): (Status.PASS, draw(100, 0.01, seed=1))},
                                {("a", "k"): (Status.PASS, draw(102, 0.01, seed=2))})
    r = rows[("a", "k")]
    assert r["verdict"] == "SAME" and r["p_value"] < 1e-6 and r["ratio"] == pytest.approx(1.02, abs=0.005)
    assert res.exit_code == 0
    res, rows, _ = compare_rows(tmp_path, {("a", "k"): (Status.PASS, draw(100, 0.01, seed=1))},
                                {("a", "k"): (Status.PASS, draw(102, 0.01, seed=2))}, "--threshold", 0.01)
    assert rows[("a", "k")]["verdict"] == "SLOWER" and res.exit_code == 1


def test_threshold_per_suite(tmp_path):
    base = {("a", "k"): (Status.PASS, draw(100, 0.01, seed=1))}
    new = {("a", "k"): (Status.PASS, draw(110, 0.01, seed=2))}
    res, rows, doc = compare_rows(tmp_path, base, new, "--threshold-for", "t=0.15", "--threshold-for", "other=0")
    assert res.exit_code == 0 and rows[("a", "k")]["verdict"] == "SAME" and rows[("a", "k")]["threshold"] == 0.15
    assert doc["settings"]["thresholds"] == {"t": 0.15, "other": 0.0}
    for bad in ("t", "=0.1", "t=fast", "t=-1"):
        res, _, _ = compare_rows(tmp_path, base, new, "--threshold-for", bad)
        assert res.exit_code == 2 and "--threshold-for" in output(res)
    res, _, _ = compare_rows(tmp_path, base, new, "--fail-on", "slower,worse")
    assert res.exit_code == 2 and "WORSE" in output(res)


def test_missing_and_new_rows(tmp_path):
    s = draw(100, 0.01)
    res, rows, _ = compare_rows(tmp_path, {("a", "k"): (Status.PASS, s), ("b", "k"): (Status.PASS, s)},
                                {("a", "k"): (Status.PASS, s), ("c", "k"): (Status.PASS, s)})
    assert verdicts(rows) == {("a", "k"): "SAME", ("b", "k"): "MISSING", ("c", "k"): "NEW"}
    assert rows[("b", "k")]["new_status"] is None and rows[("c", "k")]["new_median_us"] == pytest.approx(100, 0.01)
    assert res.exit_code == 0
    res, _, _ = compare_rows(tmp_path, {("a", "k"): (Status.PASS, s), ("b", "k"): (Status.PASS, s)},
                             {("a", "k"): (Status.PASS, s)}, "--fail-on", "missing")
    assert res.exit_code == 1


def test_status_changes(tmp_path):
    s = draw(100, 0.01)
    base = {("a", "k"): (Status.PASS, s), ("b", "k"): (Status.PASS, s), ("c", "k"): (Status.FAIL, s),
            ("d", "k"): (Status.PASS, s), ("e", "k"): (Status.SKIP, None), ("f", "k"): (Status.FAIL, s)}
    new = {("a", "k"): (Status.FAIL, s), ("b", "k"): (Status.ERROR, None), ("c", "k"): (Status.PASS, s),
           ("d", "k"): (Status.SKIP, None), ("e", "k"): (Status.SKIP, None), ("f", "k"): (Status.FAIL, draw(120, 0.01))}
    res, rows, doc = compare_rows(tmp_path, base, new)
    # an untimed ERROR row still matches its timed PASS row: it takes the run's timer and L2 mode
    assert verdicts(rows) == {("a", "k"): "BROKEN", ("b", "k"): "BROKEN", ("c", "k"): "FIXED",
                              ("d", "k"): "CHANGED", ("e", "k"): "SAME", ("f", "k"): "SLOWER"}
    assert rows[("b", "k")]["timer"] == "graph" and rows[("e", "k")]["l2"] == "cold"
    assert [r["verdict"] for r in doc["rows"]][:2] == ["BROKEN", "BROKEN"]
    assert res.exit_code == 1
    res, _, _ = compare_rows(tmp_path, base, {**new, ("f", "k"): (Status.FAIL, s)}, "--fail-on", "slower")
    assert res.exit_code == 0, res.output


def test_bad_input_exits_2_naming_the_file(tmp_path):
    s = {("a", "k"): (Status.PASS, draw(100, 0.01))}
    good = write_run(tmp_path / "good", s)
    base = write_run(tmp_path / "base", s)
    meta = json.loads((base / "run.json").read_text())
    (base / "run.json").write_text(json.dumps({**meta, "schema": 99}))
    res = runner.invoke(app, ["compare", str(base), str(good)])
    assert res.exit_code == 2 and "run.json" in output(res) and "schema 99" in output(res)

    res = runner.invoke(app, ["compare", str(good), str(tmp_path / "nowhere")])
    assert res.exit_code == 2 and "nowhere" in output(res)
    (tmp_path / "junk.csv").write_text("a,b\n1,2\n")
    res = runner.invoke(app, ["compare", str(tmp_path / "junk.csv"), str(good)])
    assert res.exit_code == 2 and "junk.csv" in output(res)
    (base / "run.json").write_text("{not json")
    res = runner.invoke(app, ["compare", str(base), str(good)])
    assert res.exit_code == 2 and "base" in output(res)

    nosamples = write_run(tmp_path / "nosamples", s)
    (nosamples / "samples.jsonl").unlink()
    res = runner.invoke(app, ["compare", str(good), str(nosamples)])
    assert res.exit_code == 2 and "samples.jsonl" in output(res)
    # a results.csv path works as well as its directory
    res = runner.invoke(app, ["compare", str(good / "results.csv"), str(good)])
    assert res.exit_code == 0, res.output


def test_different_gpu_warns_and_strict_exits_2(tmp_path):
    s = {("a", "k"): (Status.PASS, draw(100, 0.01))}
    other = {"device": {**META["device"], "name": "NVIDIA H200"}, "versions": {**META["versions"], "torch": "2.14.0"}}
    res, rows, doc = compare_rows(tmp_path, s, s, new_meta=other)
    assert res.exit_code == 0 and "warning" in output(res) and "NVIDIA H200" in output(res)
    assert any("torch" in w for w in doc["warnings"]) and any("GPU" in w for w in doc["warnings"])
    res, _, _ = compare_rows(tmp_path, s, s, "--strict", new_meta=other)
    assert res.exit_code == 2 and "--strict" in output(res)
    res, _, _ = compare_rows(tmp_path, s, s, "--strict")
    assert res.exit_code == 0, res.output


def test_markdown_and_json_outputs_parse(tmp_path):
    base = {("a", "k"): (Status.PASS, draw(100, 0.01, seed=1)), ("b", "k"): (Status.PASS, draw(100, 0.01, seed=2)),
            ("c", "k"): (Status.SKIP, None)}
    new = {("a", "k"): (Status.PASS, draw(120, 0.01, seed=3)), ("b", "k"): (Status.PASS, draw(100, 0.01, seed=4)),
           ("d", "k"): (Status.PASS, draw(50, 0.01, seed=5))}
    md = tmp_path / "cmp.md"
    res, rows, doc = compare_rows(tmp_path, base, new, "--markdown", md)
    assert res.exit_code == 1, res.output
    assert doc["base"]["run"]["device"]["name"] == GPU and doc["new"]["path"].endswith("new")
    assert doc["counts"] == {"SLOWER": 1, "MISSING": 1, "NEW": 1, "SAME": 1} and len(doc["rows"]) == 4
    text = md.read_text()
    assert text.startswith("**gdnbench compare**") and "1 SLOWER" in text
    header = "| case | backend | base (us) | new (us) | ratio new/base [95% CI] | p | verdict |"
    changed, everything = text.split("<details>")
    assert header in changed and header in everything
    rows_of = lambda part: [ln for ln in part.splitlines() if ln.startswith("| ") and ln != header]
    assert len(rows_of(changed)) == 3 and len(rows_of(everything)) == 4
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in rows_of(everything)]
    assert all(len(c) == 7 for c in cells)
    case, backend, b, n, ratio, p, verdict = cells[0]  # the slowdown comes first
    assert (case, backend, verdict) == ("a", "k", "SLOWER") and float(n) / float(b) == pytest.approx(1.2, abs=0.01)
    assert ratio.startswith(f"{rows[('a', 'k')]['ratio']:.3f} [") and float(p) < 1e-6


@pytest.mark.parametrize("seed", range(6))
def test_mann_whitney_u_matches_scipy(seed):
    rng = np.random.default_rng(seed)
    n1, n2 = rng.integers(5, 200, size=2)
    a = np.round(rng.lognormal(3, 0.1, n1), 1)  # rounded: many ties
    b = np.round(rng.lognormal(3 + 0.02 * seed, 0.1, n2), 1)
    scipy_stats = pytest.importorskip("scipy.stats")  # only this check needs scipy
    want = scipy_stats.mannwhitneyu(a, b, alternative="two-sided", method="asymptotic").pvalue
    assert mann_whitney_u(a, b) == pytest.approx(want, rel=1e-9, abs=1e-300)
    assert mann_whitney_u(b, a) == pytest.approx(want, rel=1e-9, abs=1e-300)


def test_mann_whitney_u_edges():
    assert mann_whitney_u([5.0] * 4, [5.0] * 6) == 1.0
    assert mann_whitney_u([1.0, 2, 3], [1.0, 2, 3]) == 1.0
    assert mann_whitney_u(np.arange(30.0), np.arange(30.0) + 100) < 1e-9
    with pytest.raises(ValueError):
        mann_whitney_u([], [1.0])


def test_median_ratio_ci_covers_the_true_ratio():
    covered = 0
    for seed in range(100):
        rng = np.random.default_rng(seed)
        a, b = rng.lognormal(np.log(120), 0.2, 40), rng.lognormal(np.log(100), 0.2, 60)
        ratio, lo, hi = median_ratio_ci(a, b, seed=seed)
        assert lo <= ratio <= hi and ratio == pytest.approx(np.median(a) / np.median(b))
        covered += lo <= 1.2 <= hi
    assert covered >= 88  # nominal 95%


def test_median_ratio_ci_is_seeded_and_narrows_with_confidence():
    rng = np.random.default_rng(0)
    a, b = rng.lognormal(0, 0.3, 30), rng.lognormal(0, 0.3, 30)
    assert median_ratio_ci(a, b) == median_ratio_ci(a, b)
    _, lo95, hi95 = median_ratio_ci(a, b)
    _, lo50, hi50 = median_ratio_ci(a, b, confidence=0.5)
    assert lo95 < lo50 < hi50 < hi95
    with pytest.raises(ValueError):
        median_ratio_ci(a, [], 0.95)
    with pytest.raises(ValueError):
        median_ratio_ci(a, b, confidence=1.0)

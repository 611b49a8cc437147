"""gdnbench plot and gdnbench report --html on a run directory written by the real writer."""

import base64
import html
import re
import sys

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from gdnbench.cli.html import report
from gdnbench.cli.plot import plot
from gdnbench.report import fmt_us, results_table, short_labels, table_unit
from gdnbench.results import Row, RunDir, Status, load_run

runner = CliRunner()
app = typer.Typer()
app.command("plot")(plot)
app.command("report")(report)

DEVICE = "NVIDIA H100 80GB HBM3"
BACKENDS = ("fla.chunk", "flashinfer.prefill", "torch.chunk")
CASES = [  # (case id, case fields, baseline median in us)
    ("prefill/padded/B=1,T=4096,H=16,HV=32,K=128,V=128,bf16,gn=1,mp=0", {"B": 1, "T": 4096}, 180.0),
    ("prefill/padded/B=4,T=8192,H=16,HV=32,K=128,V=128,bf16,gn=1,mp=0", {"B": 4, "T": 8192}, 1450.0),
    ("prefill/varlen/N=8,T=4096,H=16,HV=32,K=128,V=128,bf16,gn=1,mp=0",
     {"mode": "varlen", "num_seqs": 8, "total_tokens": 4096}, 210.0),
    ("prefill/padded/B=1,T=32768,H=16,HV=32,K=128,V=128,bf16,gn=1,mp=0", {"B": 1, "T": 32768}, 2900.0),
]
FAIL_REASON = "rel err o 3.1e-02 > tol 5.0e-03"
SKIP_REASON = "flashinfer.prefill: varlen <unsupported> here"


def _flat(output: str) -> str:
    return " ".join(output.split())  # Rich wraps error messages at the terminal width


def _row(case_id, fields, backend, status, median, base_median, error=None):
    passed = status == Status.PASS
    return Row(
        suite="qwen3-next", case_id=case_id, backend=backend, status=status, error=error,
        path="chunk", version="0.6.0", device=DEVICE, timer="graph" if median else None,
        l2="cold" if median else None, n=200 if median else None, median_us=median,
        p95_us=median * 1.04 if median else None, converged=True if median else None,
        baseline="fla.chunk", speedup=base_median / median if passed else None,
        rel_err_o=2e-4 if passed else (3.1e-2 if status == Status.FAIL else None),
        case={"op": "prefill", "mode": "padded", "H": 16, "HV": 32, "K": 128, "V": 128, "dtype": "bf16", **fields},
    )


@pytest.fixture
def run_dir(tmp_path):
    """Four cases x three backends, with one FAIL (timed) and one SKIP row."""
    out = RunDir(tmp_path / "run")
    out.write_meta({
        "created_utc": "2025-01-01T00:00:00+00:00", "command": "gdnbench run qwen3-next --backends ...",
        "suite": {"name": "qwen3-next", "path": "suites/qwen3-next.yaml", "sha256": "ab" * 32, "cases": 4,
                  "filter": None},
        "host": "gpu-box", "python": "3.11.7",
        "versions": {"gdnbench": "0.1.0", "torch": "2.13.0", "triton": "3.6.0", "backend:fla.chunk": "0.6.0"},
        "git": {"sha": "0123456789abcdef0123456789abcdef01234567", "dirty": False, "source": "git"},
        "device": {"type": "cuda", "name": DEVICE, "sm_count": 132, "driver_version": "575.57.08",
                   "clocks.sm": "1980 MHz", "clocks.mem": "2619 MHz"},
        "seed": 0, "backends": list(BACKENDS), "baseline": "fla.chunk",
        "timing": {"timer": "graph", "l2": "cold", "warmup": 3, "min_samples": 10, "max_samples": 500,
                   "min_time_s": 0.2, "max_time_s": 5.0, "rel_ci": 0.01},
        "ceilings": {"copy_gbps": 2987.4, "matmul_tflops": 701.2}, "status": "complete",
    })
    for i, (case_id, fields, base) in enumerate(CASES):
        rows = [_row(case_id, fields, "fla.chunk", Status.PASS, base, base)]
        if fields.get("mode") == "varlen":
            rows.append(_row(case_id, fields, "flashinfer.prefill", Status.SKIP, None, base, SKIP_REASON))
        else:
            rows.append(_row(case_id, fields, "flashinfer.prefill", Status.PASS, base * 0.62, base))
        if i == 1:
            rows.append(_row(case_id, fields, "torch.chunk", Status.FAIL, base * 9.0, base, FAIL_REASON))
        else:
            rows.append(_row(case_id, fields, "torch.chunk", Status.PASS, base * 11.5, base))
        out.add_case(rows, [])
    return out.path


def test_one_unit_per_table():
    assert table_unit([999.0, "9999.9", None, float("nan")]) == "us" and table_unit([10_000.0, 5.0]) == "ms"
    assert fmt_us(12_345.0, "ms") == "12.3" and fmt_us(12_345.0, "us") == "12345" and fmt_us(5.25) == "5.2"


def test_the_terminal_table_labels_a_case_by_what_sets_it_apart(run_dir):
    df, meta = load_run(run_dir)
    console = Console(width=200, record=True)
    console.print(results_table(df, meta))
    text = console.export_text()
    assert "every case: prefill H=16,HV=32,K=128,V=128,bf16,gn=1,mp=0" in text
    assert "padded B=4,T=8192" in text and "varlen N=8,T=4096" in text
    assert CASES[1][0] not in text  # the whole id is not repeated on every row


def test_short_labels_drop_what_every_case_shares():
    labels, shared = short_labels([c for c, _, _ in CASES])
    assert shared == "prefill H=16,HV=32,K=128,V=128,bf16,gn=1,mp=0"
    assert labels == ["padded B=1,T=4096", "padded B=4,T=8192", "varlen N=8,T=4096", "padded B=1,T=32768"]
    # a lone case: its path parts label the row, its fields go above the table
    assert short_labels([CASES[0][0]]) == (["prefill padded"], CASES[0][0].split("/")[-1])
    assert short_labels(["B=1,T=4"]) == (["B=1,T=4"], "") and short_labels([]) == ([], "")


def test_plot_writes_a_png_that_opens(run_dir, tmp_path):
    imread = pytest.importorskip("matplotlib.image").imread
    res = runner.invoke(app, ["plot", str(run_dir)])
    assert res.exit_code == 0, res.output
    png = run_dir / "plot.png"
    assert png.stat().st_size > 10_000
    img = imread(png)
    assert img.shape[0] > 500 and img.shape[1] > 800 and img.shape[2] in (3, 4)

    out = tmp_path / "figs" / "run.png"  # --out, from the results.csv path, into a new folder
    res = runner.invoke(app, ["plot", str(run_dir / "results.csv"), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_html_holds_tables_provenance_and_plot(run_dir, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "report.html"
    res = runner.invoke(app, ["report", str(run_dir), "--html", str(out)])
    assert res.exit_code == 0, res.output
    text = out.read_text(encoding="utf-8")
    for case_id, _, _ in CASES:
        assert html.escape(case_id) in text
    assert DEVICE in text and "qwen3-next" in text
    assert "0123456789abcdef0123456789abcdef01234567" in text and "575.57.08" in text and "2987" in text
    assert "0.09x" in text and "1.61x" in text and "FAIL 13.1" in text  # cells from report.table_grid
    assert "median / p95 in ms" in text  # one unit for the whole table, named once
    assert html.escape(FAIL_REASON) in text and html.escape(SKIP_REASON) in text
    assert "<unsupported>" not in text  # escaped, not markup
    img = re.search(r'<img [^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    assert img and base64.b64decode(img.group(1))[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<link" not in text and "<script" not in text  # self-contained


@pytest.mark.parametrize("args", [["plot", "{tmp}/missing"], ["report", "{tmp}/missing", "--html", "{tmp}/r.html"]])
def test_missing_run_dir_exits_2(args, tmp_path):
    res = runner.invoke(app, [a.format(tmp=tmp_path) for a in args])
    assert res.exit_code == 2 and "no results.csv" in _flat(res.output)
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("command", ["plot", "report"])
def test_without_matplotlib_exits_2_naming_the_extra(command, run_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    extra = ["--html", str(tmp_path / "r.html")] if command == "report" else []
    res = runner.invoke(app, [command, str(run_dir), *extra])
    assert res.exit_code == 2 and "pip install gdnbench[plot]" in _flat(res.output)


def test_figure_marks_fails_omits_skips_and_draws_speedup_intervals(run_dir):
    pytest.importorskip("matplotlib")
    from matplotlib.colors import to_rgba
    from matplotlib.container import ErrorbarContainer

    from gdnbench.plot import FAIL_COLOR, build_figure
    from gdnbench.results import load_run

    df, meta = load_run(run_dir)
    df["speedup_lo"], df["speedup_hi"] = df["speedup"] * 0.95, df["speedup"] * 1.05  # as interleaved A/B runs
    lat, spd = build_figure(df, meta).axes
    assert len(lat.lines) == 3  # one line per backend
    flashinfer = next(line for line in lat.lines if line.get_marker() == "s")
    assert sum(y == y for y in flashinfer.get_ydata()) == 3  # its SKIP row is not drawn
    fails = [c for c in lat.collections if c.get_offsets().shape[0]]  # the red x, at the FAIL's latency
    assert len(fails) == 1 and tuple(fails[0].get_facecolor()[0]) == pytest.approx(to_rgba(FAIL_COLOR))
    assert fails[0].get_offsets()[0][1] == pytest.approx(CASES[1][2] * 9.0)
    bars = [p for c in spd.containers if not isinstance(c, ErrorbarContainer) for p in c]
    assert len(bars) == 6  # flashinfer 3 + torch.chunk 3 (its FAIL has none; the baseline has none)
    assert sum(isinstance(c, ErrorbarContainer) for c in spd.containers) == 6


def test_git_sha_from_the_environment_wins(monkeypatch):
    """A tree copied to a GPU box may carry a stale .git: the commit the sender names is recorded."""
    from gdnbench.provenance import git_state

    monkeypatch.delenv("GDNBENCH_GIT_SHA", raising=False)
    assert git_state()["source"] == "git"
    monkeypatch.setenv("GDNBENCH_GIT_SHA", "abc1234")
    assert git_state() == {"sha": "abc1234", "dirty": None, "source": "GDNBENCH_GIT_SHA"}

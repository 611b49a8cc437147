"""gdnbench history: each series' median over time, every point judged against the one before it."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table
from rich.text import Text

from gdnbench import history as hist
from gdnbench.cli.common import console, die, err_console
from gdnbench.report import fmt_us, table_unit
from gdnbench.results import RunFilesError

VERDICT_STYLE = {"SLOWER": "bold red", "FASTER": "bold green", "AMBIGUOUS": "yellow", "SAME": "dim"}


def history(
    suite: Optional[str] = typer.Option(None, "--suite", "-s", help="Only this suite's series."),
    case: Optional[str] = typer.Option(None, "--case", "-k", help="Only cases whose id contains TEXT."),
    backend: Optional[str] = typer.Option(None, "--backend", "-b", help="Only this backend's series."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="Only GPUs whose name contains TEXT (e.g. H200)."),
    import_: Optional[list[Path]] = typer.Option(
        None, "--import", help="Add the run directories at or under DIR (repeatable); a run already in the "
                               "history is skipped."),
    db: Optional[Path] = typer.Option(None, "--db", help="The history file (default: $GDNBENCH_HISTORY, else "
                                                         "results/history.sqlite)."),
    threshold: float = typer.Option(0.05, help="Practical threshold of a step, as in compare."),
    alpha: float = typer.Option(0.01, help="Mann-Whitney U significance of a step, as in compare."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Also draw the series' medians over time (PNG)."),
) -> None:
    """Show each series (suite, case, backend, timer, GPU) over time: commit, date, median, and the verdict
    against the point before it. SLOWER and FASTER points are steps: the series changed level there."""
    path = db or hist.default_db()
    conn = hist.connect(path)
    if import_:
        added = skipped = 0
        refused = []
        for run_dir in hist.run_dirs(import_):
            try:
                if hist.record(conn, run_dir):
                    added += 1
                else:
                    skipped += 1
            except RunFilesError as e:
                refused.append(str(e))
        err_console.print(f"imported {added} run(s) into {path}; {skipped} already there", highlight=False)
        if refused:
            die(f"refused {len(refused)} run(s): " + "; ".join(refused))
        if not any((suite, case, backend, gpu, plot)):
            return
    found = hist.series(conn, suite=suite, case=case, backend=backend, gpu=gpu, alpha=alpha, threshold=threshold)
    if not found:
        die(f"{path}: no series match" + ("" if conn.execute("SELECT 1 FROM runs").fetchone()
                                          else " (the history is empty: `gdnbench history --import results`)"))
    for key, points in found.items():
        console.print(_table(key, points))
    n_steps = sum(len(hist.steps(points)) for points in found.values())
    console.print(f"{len(found)} series, {n_steps} step(s)", highlight=False)
    if plot is not None:
        _plot(found, plot)
        console.print(f"wrote {plot}", markup=False, highlight=False)


def _table(key: tuple[str, ...], points: list[hist.Point]) -> Table:
    suite, case_id, backend, timer, l2, gpu = key
    unit = table_unit(p.median_us for p in points)
    trend = hist.sparkline([p.median_us for p in points])
    table = Table(title=f"{suite} {case_id}\n{backend} on {gpu} ({timer}/L2 {l2})  {trend}",
                  header_style="bold", title_justify="left")
    for name, justify in (("commit", "left"), ("date", "left"), (f"median {unit}", "right"), ("vs before", "left")):
        table.add_column(name, justify=justify)
    for p in points:
        median = fmt_us(p.median_us, unit) if p.median_us is not None else p.status
        table.add_row(p.git_sha[:7], p.created_utc[:16].replace("T", " "), median,
                      Text(p.verdict, style=VERDICT_STYLE.get(p.verdict, "")))
    return table


def _plot(found: dict[tuple[str, ...], list[hist.Point]], path: Path) -> None:
    from gdnbench.plot import PlotUnavailable, require_matplotlib

    try:
        require_matplotlib()
    except PlotUnavailable as e:
        die(str(e))
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 5))
    ax = fig.add_subplot()
    for (suite, case_id, backend, *_), points in found.items():
        xs = [p.created_utc[:16] for p in points]
        ax.plot(xs, [p.median_us for p in points], marker="o", label=f"{backend} {case_id}"[:80])
        for x, p in zip(xs, points):
            if p.verdict in ("SLOWER", "FASTER"):
                ax.annotate(p.verdict, (x, p.median_us), textcoords="offset points", xytext=(0, 6), fontsize=7)
    ax.set_ylabel("median (us)")
    ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    ax.legend(fontsize=6)
    fig.tight_layout()
    FigureCanvasAgg(fig).print_png(str(path))

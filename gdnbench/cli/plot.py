"""gdnbench plot: a PNG of a saved run (latency per case for each backend, speedups vs the baseline)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import pandas as pd
import typer

from gdnbench.cli.common import console, die
from gdnbench.plot import PlotUnavailable, png_bytes
from gdnbench.results import RunFilesError, load_run


def load_rows(run_dir: Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The run's rows and run.json, or exit 2 saying why there is nothing to draw."""
    try:
        df, meta = load_run(run_dir)
    except RunFilesError as e:
        die(str(e))
    if df.empty:
        die(f"{run_dir}: results.csv has no rows")
    return df, meta


def render_png(df: pd.DataFrame, meta: dict[str, Any]) -> bytes:
    try:
        return png_bytes(df, meta)
    except PlotUnavailable as e:
        die(str(e))


def write_file(path: Path, data: bytes | str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data, encoding="utf-8")
    except OSError as e:
        die(f"{path}: cannot write ({e.strerror or e})")


def plot(
    run_dir: Path = typer.Argument(..., help="A run directory (or its results.csv)."),
    out: Optional[Path] = typer.Option(None, "--out", help="PNG file to write (default: RUN/plot.png)."),
) -> None:
    """Plot a saved run: median latency per case for each backend (log scale) and speedups vs the baseline."""
    df, meta = load_rows(run_dir)
    target = out or (run_dir if run_dir.is_dir() else run_dir.parent) / "plot.png"
    write_file(target, render_png(df, meta))
    console.print(f"wrote {target}", markup=False, highlight=False)

"""gdnbench report: a saved run as one self-contained HTML file (tables, provenance, plots)."""

from __future__ import annotations

from pathlib import Path

import typer

from gdnbench.cli.common import console
from gdnbench.cli.plot import load_rows, render_png, write_file
from gdnbench.html_report import build_html


def report(
    run_dir: Path = typer.Argument(..., help="A run directory (or its results.csv)."),
    html: Path = typer.Option(..., "--html", help="HTML file to write: tables, provenance and plots, inline."),
) -> None:
    """Write a saved run as one self-contained HTML file: results, rows not passing, plots, provenance."""
    df, meta = load_rows(run_dir)
    write_file(html, build_html(df, meta, render_png(df, meta)))
    console.print(f"wrote {html}", markup=False, highlight=False)

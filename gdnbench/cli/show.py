"""gdnbench show: re-render the tables of a saved run."""

from __future__ import annotations

from pathlib import Path

import typer

from gdnbench.cli.common import console, die
from gdnbench.report import render
from gdnbench.results import RunFilesError, load_run


def show(run_dir: Path = typer.Argument(..., help="A run directory (or its results.csv).")) -> None:
    """Re-render the tables of a saved run from its results.csv and run.json."""
    try:
        df, meta = load_run(run_dir)
    except RunFilesError as e:
        die(str(e))
    render(df, meta, console)

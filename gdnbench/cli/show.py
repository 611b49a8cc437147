"""gdnbench show: re-render the tables of a saved run."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from gdnbench.cli.common import console, die
from gdnbench.report import markdown_table, render
from gdnbench.results import RunFilesError, load_run


def show(
    run_dir: Path = typer.Argument(..., help="A run directory (or its results.csv)."),
    markdown: Optional[Path] = typer.Option(None, help="Also write the table as markdown to FILE ('-': stdout)."),
) -> None:
    """Re-render the tables of a saved run from its results.csv and run.json."""
    try:
        df, meta = load_run(run_dir)
    except RunFilesError as e:
        die(str(e))
    if markdown is not None and str(markdown) == "-":
        console.print(markdown_table(df, meta), markup=False, highlight=False, soft_wrap=True)
        return
    render(df, meta, console)
    if markdown is not None:
        markdown.write_text(markdown_table(df, meta))

"""gdnbench merge: shard runs joined into one run directory."""

from __future__ import annotations

from pathlib import Path

import typer

from gdnbench.cli.common import console, die
from gdnbench.results import RunDirError, RunFilesError
from gdnbench.shards import ShardError, merge as merge_runs


def merge(
    out: Path = typer.Argument(..., help="The run directory to write."),
    shard_dirs: list[Path] = typer.Argument(..., help="The shards' run directories (`gdnbench run --shard`)."),
    force: bool = typer.Option(False, "--force", help="Replace a run already in OUT."),
) -> None:
    """Join the runs of a suite's shards into one run that show, compare, plot, report and history accept.

    Exit 2 when the shards differ in suite, seed, timing or backends, or hold a case twice."""
    try:
        meta = merge_runs(out, shard_dirs, force=force)
    except (ShardError, RunDirError, RunFilesError) as e:
        die(str(e))
    console.print(f"merged {len(shard_dirs)} shard runs into {out} ({meta['status']})", markup=False,
                  highlight=False)

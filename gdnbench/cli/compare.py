"""gdnbench compare: a verdict per row between two saved runs, and an exit code for CI."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.text import Text

from gdnbench.cli.common import EXIT_FAIL, EXIT_OK, console, die, err_console
from gdnbench.compare import (DEFAULT_FAIL_ON, VERDICTS, CompareError, compare_runs, comparison_table, counts,
                              load, markdown, provenance_diffs, summary_line, telemetry_notes, to_json)


def compare(
    base_path: Path = typer.Argument(..., metavar="BASE", help="The baseline run directory (or its results.csv)."),
    new_path: Path = typer.Argument(..., metavar="NEW", help="The run to judge (a directory or its results.csv)."),
    alpha: float = typer.Option(0.01, min=0.0, max=1.0,
                                help="Statistical gate: a shift counts when the Mann-Whitney U p-value < ALPHA."),
    threshold: float = typer.Option(0.05, min=0.0,
                                    help="Practical gate: |median ratio new/base - 1| below it is SAME."),
    threshold_for: Optional[list[str]] = typer.Option(
        None, "--threshold-for", metavar="SUITE=X", help="Threshold for one suite's rows (repeatable)."),
    fail_on: str = typer.Option(",".join(DEFAULT_FAIL_ON).lower(),
                                help=f"Verdicts that exit 1, comma-separated, from {', '.join(VERDICTS).lower()}."),
    strict: bool = typer.Option(False, help="Exit 2 when BASE and NEW differ in GPU, driver or library versions "
                                            "(default: a warning)."),
    markdown_path: Optional[Path] = typer.Option(None, "--markdown", metavar="FILE",
                                                 help="Write a pull-request comment (markdown) to FILE."),
    json_path: Optional[Path] = typer.Option(None, "--json", metavar="FILE",
                                             help="Write every row's numbers and verdict, and both runs' "
                                                  "provenance, to FILE."),
) -> None:
    """Compare NEW with BASE: FASTER / SLOWER / SAME / AMBIGUOUS per row, BROKEN on a lost PASS.

    A row is SLOWER (FASTER) only when its median moved by at least the threshold AND the raw samples
    say so (Mann-Whitney U p < alpha); a large shift that the samples cannot confirm is AMBIGUOUS.
    Exit code: 0 no regression, 1 a row with a --fail-on verdict, 2 bad input.
    """
    gates = {v.strip().upper() for v in fail_on.split(",") if v.strip()}
    if gates - set(VERDICTS):
        die(f"--fail-on: unknown verdict(s) {sorted(gates - set(VERDICTS))}; choose from {', '.join(VERDICTS)}")
    try:
        thresholds = dict(_suite_threshold(spec) for spec in threshold_for or [])
    except ValueError as e:
        die(f"--threshold-for {e}: expected SUITE=FRACTION, e.g. parity=0.1")
    try:
        base, new = load(base_path), load(new_path)
        diffs = provenance_diffs(base, new)
        if diffs and strict:
            die("BASE and NEW were measured in different environments (--strict): " + "; ".join(diffs))
        for d in diffs:
            err_console.print(Text(f"warning: BASE and NEW differ: {d}", style="yellow"))
        df = compare_runs(base, new, alpha=alpha, threshold=threshold, thresholds=thresholds)
    except CompareError as e:
        die(str(e))
    notes = [f"telemetry: {note}" for note in telemetry_notes(base, new, df)]
    for note in notes:
        err_console.print(Text(note, style="yellow"))

    console.print(comparison_table(df, base, new, alpha))
    console.print(summary_line(df), highlight=False)
    if markdown_path is not None:
        markdown_path.write_text(markdown(df, base, new, alpha))
    if json_path is not None:
        settings = {"alpha": alpha, "threshold": threshold, "thresholds": thresholds, "fail_on": sorted(gates)}
        json_path.write_text(to_json(df, base, new, settings, diffs + notes))
    regressions = {v: n for v, n in counts(df).items() if v in gates}
    if regressions:
        err_console.print("[bold red]regression:[/bold red] "
                          + ", ".join(f"{n} {v}" for v, n in regressions.items()))
        raise typer.Exit(EXIT_FAIL)
    raise typer.Exit(EXIT_OK)


def _suite_threshold(spec: str) -> tuple[str, float]:
    """'parity=0.1' -> ('parity', 0.1); ValueError naming ``spec`` otherwise."""
    name, _, value = spec.partition("=")
    try:
        thr = float(value)
    except ValueError:
        raise ValueError(repr(spec)) from None
    if not name.strip() or thr < 0:
        raise ValueError(repr(spec))
    return name.strip(), thr

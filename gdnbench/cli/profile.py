"""gdnbench profile: the GPU kernels behind each backend's time, case by case (torch.profiler)."""

from __future__ import annotations

from typing import Optional

import torch
import typer
from rich.table import Table

from gdnbench.cli.common import console, die, select
from gdnbench.interrupts import reraise_interrupt
from gdnbench.problem import make_problem
from gdnbench.profile import mark_one_call, profile_backend


def profile(
    suite_spec: str = typer.Argument(..., metavar="SUITE", help="A suite YAML file or a shipped suite's name."),
    backends: Optional[str] = typer.Option(None, "--backends", "-b", help="Comma-separated backends "
                                           "(default: the suite's)."),
    filter_: Optional[str] = typer.Option(None, "--filter", "-k", help="Only cases whose id contains TEXT."),
    calls: int = typer.Option(10, min=1, help="Profiled calls per (case, backend), after 3 warm-up calls."),
    top: int = typer.Option(12, min=1, help="Kernels shown per (case, backend), slowest first."),
    external: bool = typer.Option(False, "--external", help="No torch.profiler: bracket one warmed call per "
                                  "(case, backend) with cudaProfilerStart/Stop, for a profiler started with "
                                  "--profile-from-start off (ncu, nsys)."),
) -> None:
    """Split each backend's call into its GPU kernels: launches per call, mean and total microseconds.

    Needs a CUDA device. Kernel time is device busy time (launch gaps excluded), so its total can be
    below the graph timer's median. Outputs are not checked here: `gdnbench run` does that.

    With --external, Nsight Compute sees each kernel of one call and none of the warm-up (autotuning):
    ncu --profile-from-start off --section SpeedOfLight --section Occupancy \
        gdnbench profile SUITE -k CASE -b BACKEND --external
    """
    if not torch.cuda.is_available():
        die("gdnbench profile needs a CUDA device (it reads GPU kernel times)")
    sel = select(suite_spec, backends, filter_)
    dev = torch.device("cuda")
    for case in sel.cases:
        problem = make_problem(case, sel.suite.seed, dev)
        for b in sel.backends:
            why = b.unavailable() or b.unsupported(case, dev)
            if why:
                console.print(f"[dim]{case.id} / {b.name}: skipped ({why})[/dim]")
                continue
            try:
                if external:
                    mark_one_call(b, problem)
                    console.print(f"{case.id} / {b.name}: one call marked for the external profiler")
                    continue
                stats = profile_backend(b, problem, calls=calls)
            except Exception as e:  # one backend's failure must not end the others' profiles
                reraise_interrupt(e)
                console.print(f"[red]{case.id} / {b.name}: {type(e).__name__}: {e}[/red]")
                continue
            total = sum(s.total_us for s in stats)
            table = Table(title=f"{case.id} / {b.name}: {total:.1f} us of kernels per call", title_justify="left")
            for col in ("kernel", "per call", "mean us", "us per call", "share"):
                table.add_column(col, justify="left" if col == "kernel" else "right")
            for s in stats[:top]:
                table.add_row(s.name[:70], f"{s.per_call:g}", f"{s.mean_us:.1f}", f"{s.total_us:.1f}",
                              f"{s.total_us / total:.0%}" if total else "-")
            console.print(table)

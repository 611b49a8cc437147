"""The gdnbench command line: one module per command, composed into one Typer app."""

from __future__ import annotations

import typer

from gdnbench.cli import compare as compare_cmd
from gdnbench.cli import history as history_cmd
from gdnbench.cli import html as html_cmd
from gdnbench.cli import list as list_cmd
from gdnbench.cli import merge as merge_cmd
from gdnbench.cli import plot as plot_cmd
from gdnbench.cli import profile as profile_cmd
from gdnbench.cli import run as run_cmd
from gdnbench.cli import schema as schema_cmd
from gdnbench.cli import show as show_cmd

app = typer.Typer(
    name="gdnbench",
    help="Benchmark Gated DeltaNet (GDN) kernels: YAML suites, reference checks, CUDA-graph timing, "
         "Rich/CSV/JSON reports.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("run")(run_cmd.run)
app.command("show")(show_cmd.show)
app.command("list")(list_cmd.list_)
app.command("compare")(compare_cmd.compare)
app.command("plot")(plot_cmd.plot)
app.command("report")(html_cmd.report)
app.command("profile")(profile_cmd.profile)
app.command("history")(history_cmd.history)
app.command("merge")(merge_cmd.merge)
app.command("schema")(schema_cmd.schema)


def main() -> None:
    app()

"""Helpers shared by the commands: consoles and the exit codes every command uses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

import typer
from rich.console import Console

from gdnbench.backends import Backend, UnknownBackend, get_backend
from gdnbench.runner import select_cases
from gdnbench.suite import Case, Suite, SuiteError, load_suite

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

console = Console()
err_console = Console(stderr=True)


def die(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print an error and exit. No markup (messages quote user input) and no hard wrap: a message holds
    paths of any length, and the terminal wraps it, so it reads (and greps) the same at any width."""
    err_console.print("[bold red]error:[/bold red] ", end="")
    err_console.print(message, markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@dataclass
class Selection:
    """What a command runs: the suite, the backends by the names given, and the cases."""

    suite: Suite
    names: list[str]
    backends: list[Backend]
    cases: list[Case]


def select(suite_spec: str, backends: str | None, filter_: str | None) -> Selection:
    """Load SUITE, resolve --backends (default: the suite's) and apply --filter; exit 2 on bad input."""
    try:
        suite = load_suite(suite_spec)
    except SuiteError as e:
        die(str(e))
    names = [b.strip() for b in backends.split(",") if b.strip()] if backends else list(suite.backends)
    try:
        chosen = [get_backend(n) for n in names]
    except UnknownBackend as e:
        die(f"--backends: {e}" if backends else f"{suite.path}: backends: {e}")
    cases = select_cases(suite, filter_)
    if not cases:
        die(f"--filter {filter_!r} matches none of the {len(suite.cases)} cases of {suite.path}")
    return Selection(suite, names, chosen, cases)

"""Helpers shared by the commands: consoles and the exit codes every command uses."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

console = Console()
err_console = Console(stderr=True)


def die(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print an error (no markup interpretation: messages quote user input) and exit."""
    err_console.print("[bold red]error:[/bold red] ", end="")
    err_console.print(message, markup=False, highlight=False)
    raise typer.Exit(code)

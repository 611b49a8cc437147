"""gdnbench list: the registered backends, whether each can run here and why not; shipped suites."""

from __future__ import annotations

import torch
import yaml
from rich.table import Table
from rich.text import Text

from gdnbench.backends import Backend, registry
from gdnbench.cli.common import console
from gdnbench.suite import SUITES_DIR, shipped_suites


def list_() -> None:
    """List backends (whether each runs on this machine, and why not; ops, devices, version) and shipped suites."""
    here = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # two narrow columns and one that wraps at word boundaries, folding a word (a module path) wider than it
    # rather than cutting it: readable at 80 columns
    table = Table(title=f"Backends (here: {here.type})", header_style="bold")
    table.add_column("backend", no_wrap=True)
    table.add_column("runs here", no_wrap=True)
    table.add_column("what it is", overflow="fold")
    for name, b in registry().items():
        reason = b.unavailable() or b.unusable_on(here)
        runs = Text("yes", style="green") if reason is None else Text("no", style="red")
        table.add_row(name, runs, _about(b, reason))
    console.print(table)
    suites = Table(title=f"Shipped suites ({SUITES_DIR})", header_style="bold")
    suites.add_column("suite", no_wrap=True)
    suites.add_column("description")
    for name in shipped_suites():
        raw = yaml.safe_load((SUITES_DIR / f"{name}.yaml").read_text()) or {}
        suites.add_row(name, str(raw.get("description", "")))
    console.print(suites)


def _about(b: Backend, reason: str | None) -> Text:
    text = Text(b.description or "")
    facts = f"ops: {', '.join(sorted(b.ops)) or '-'}; devices: {', '.join(sorted(b.devices)) or '-'}"
    version = b.version()
    text.append(f"\n{facts}" + (f"; version {version}" if version else ""), style="dim")
    if reason:
        text.append(f"\nwhy not here: {reason.removeprefix(f'{b.name}: ')}", style="red")
    return text

"""gdnbench list: the registered backends, whether each is usable here and why not; shipped suites."""

from __future__ import annotations

import yaml
from rich.table import Table
from rich.text import Text

from gdnbench.backends import registry
from gdnbench.cli.common import console
from gdnbench.suite import SUITES_DIR, shipped_suites


def list_() -> None:
    """List backends (availability, version, ops, reason when unavailable) and shipped suites."""
    table = Table(title="Backends", header_style="bold")
    table.add_column("backend", no_wrap=True)
    for col in ("available", "version", "ops", "devices", "description / why not"):
        table.add_column(col, overflow="fold")
    for name, b in registry().items():
        reason = b.unavailable()
        table.add_row(name, Text("yes", style="green") if reason is None else Text("no", style="red"),
                      b.version() or "-", ",".join(sorted(b.ops)) or "-", ",".join(sorted(b.devices)) or "-",
                      reason or b.description)
    console.print(table)
    suites = Table(title=f"Shipped suites ({SUITES_DIR})", header_style="bold")
    suites.add_column("suite")
    suites.add_column("description", overflow="fold")
    for name in shipped_suites():
        raw = yaml.safe_load((SUITES_DIR / f"{name}.yaml").read_text()) or {}
        suites.add_row(name, str(raw.get("description", "")))
    console.print(suites)

"""A saved run as one self-contained HTML file: results table, rows not passing, plot, provenance.

The table cells come from gdnbench.report.table_grid, the same cells as the terminal and markdown tables;
their Rich styles become CSS classes. Everything quoted from the run is escaped; the plot is an inline
PNG, and the CSS is inline, so the file can be mailed or attached to a CI job as it is.
"""

from __future__ import annotations

import base64
import math
from html import escape
from typing import Any

import pandas as pd
from rich.style import Style
from rich.text import Text

from gdnbench.report import table_grid, problem_rows, status_line
from gdnbench.results import Status

# Rich styles used by gdnbench.report -> CSS classes below
STYLE_CLASS = {"bold green": "good", "green": "good", "yellow": "warn", "bold red": "bad", "red": "bad",
               "dim": "dim"}
CEILING_NAMES = {"copy_gbps": "copy bandwidth (GB/s)", "matmul_tflops": "bf16 matmul (TFLOP/s)"}

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1800px;
       padding: 0 16px; color: #222; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; }
.summary { color: #555; margin-top: 0; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { padding: 3px 10px; border-bottom: 1px solid #e4e4e4; text-align: left; vertical-align: top; }
th { background: #f5f5f5; }
table.results td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
table.results td.case, td.mono { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12px; }
caption { caption-side: bottom; text-align: left; color: #666; font-size: 12px; padding-top: 4px; }
.good { color: #1a7f37; font-weight: 600; } .warn { color: #9a6700; } .bad { color: #cf222e; font-weight: 600; }
.dim { color: #8c959f; }
.prov { display: flex; flex-wrap: wrap; gap: 8px 32px; }
.prov table { min-width: 320px; } .prov th { width: 40%; font-weight: 500; }
img.plot { max-width: 100%; border: 1px solid #e4e4e4; }
"""


def build_html(df: pd.DataFrame, meta: dict[str, Any], png: bytes) -> str:
    """The whole report; ``png`` is the run's figure (gdnbench.plot.png_bytes)."""
    title, caption, headers, rows = table_grid(df, meta)
    state = meta.get("status")
    summary = status_line(df) + (f"   run {state}" if state and state != "complete" else "")
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>gdnbench: {escape(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{escape(title)}</h1>", f'<p class="summary">{escape(summary)}</p>',
        "<h2>Results</h2>", _results_table(caption, headers, rows),
    ]
    problems = _problems_table(df)
    if problems:
        parts += ["<h2>Not passing</h2>", problems]
    image = base64.b64encode(png).decode("ascii")
    parts += ["<h2>Plots</h2>",
              f'<img class="plot" src="data:image/png;base64,{image}" alt="{escape(title)}: latency and speedup">',
              "<h2>Provenance</h2>", _provenance(meta), "</body></html>"]
    return "\n".join(parts) + "\n"


def _results_table(caption: str, headers: list[str], rows: list[tuple[str, list[Text]]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in ["case", *headers])
    body = "\n".join(
        f'<tr><td class="case">{escape(case_id)}</td>'
        + "".join(f'<td class="num">{_text_html(c)}</td>' for c in cells) + "</tr>"
        for case_id, cells in rows)
    return (f'<table class="results"><caption>{escape(caption)}</caption>'
            f"<thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table>")


def _text_html(t: Text) -> str:
    """A Rich cell as escaped HTML, its styled spans as <span class=...>."""
    plain, pos, out = t.plain, 0, []
    for span in sorted(t.spans, key=lambda s: s.start):
        out.append(escape(plain[pos:span.start]))
        out.append(_wrap(escape(plain[span.start:span.end]), span.style))
        pos = span.end
    out.append(escape(plain[pos:]))
    return _wrap("".join(out), t.style)


def _wrap(inner: str, style: str | Style) -> str:
    cls = STYLE_CLASS.get(str(style))
    return f'<span class="{cls}">{inner}</span>' if cls else inner


def _problems_table(df: pd.DataFrame) -> str:
    """gdnbench.report.problem_rows as HTML, naming every skipped case."""
    lines = [_problem_row(status, "dim" if status == Status.SKIP else "bad", backend, cases, reason)
             for status, backend, cases, reason in problem_rows(df)]
    if not lines:
        return ""
    return ('<table class="problems"><thead><tr><th>status</th><th>backend</th><th>case</th><th>reason</th>'
            "</tr></thead><tbody>\n" + "\n".join(lines) + "\n</tbody></table>")


def _problem_row(status: str, cls: str, backend: str, cases: list[str], reason: str) -> str:
    case_cell = "<br>".join(escape(c) for c in cases)
    return (f'<tr><td class="{cls}">{escape(status)}</td><td>{escape(backend)}</td>'
            f'<td class="mono">{case_cell}</td><td>{escape(reason)}</td></tr>')


def _provenance(meta: dict[str, Any]) -> str:
    if not meta:
        return "<p>No run.json next to results.csv: where and how this run was measured is unknown.</p>"
    suite, git = meta.get("suite") or {}, meta.get("git") or {}
    dirty = {True: "dirty (uncommitted changes)", False: "clean"}.get(git.get("dirty"), "unknown")
    ceilings = meta.get("ceilings") or {}
    sections: list[tuple[str, list[tuple[str, Any]]]] = [
        ("Run", [("command", meta.get("command")), ("created (UTC)", meta.get("created_utc")),
                 ("finished (UTC)", meta.get("finished_utc")), ("status", meta.get("status")),
                 ("host", meta.get("host")), ("platform", meta.get("platform")), ("python", meta.get("python"))]),
        ("Device", list((meta.get("device") or {}).items())),
        ("Versions", list((meta.get("versions") or {}).items())),
        ("Source and inputs", [
            ("git sha", git.get("sha")), ("git tree", dirty), ("suite", suite.get("name")),
            ("suite file", suite.get("path")), ("suite sha256", suite.get("sha256")),
            ("cases", suite.get("cases")), ("filter", suite.get("filter")), ("seed", meta.get("seed")),
            ("backends", meta.get("backends")), ("baseline", meta.get("baseline")),
            ("reference", meta.get("reference")), ("tolerances", meta.get("tolerances"))]),
        ("Timer", list((meta.get("timing") or {}).items())),
        ("Measured ceilings", [(CEILING_NAMES.get(k, k), v) for k, v in ceilings.items()]
         or [("", "none (measured on a GPU only)")]),
    ]
    tables = []
    for name, items in sections:
        body = "".join(f'<tr><th>{escape(str(k))}</th><td class="mono">{escape(_text(v))}</td></tr>'
                       for k, v in items)
        tables.append(f"<table><thead><tr><th colspan=2>{escape(name)}</th></tr></thead><tbody>{body}</tbody></table>")
    return '<div class="prov">' + "".join(tables) + "</div>"


def _text(v: Any) -> str:
    """A provenance or reason value as plain text: '-' for nothing, dicts and lists inline."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, dict):
        return ", ".join(f"{k}={_text(x)}" for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return ", ".join(_text(x) for x in v)
    if isinstance(v, float):
        return f"{v:.1f}" if abs(v) >= 100 else f"{v:g}"
    return str(v)

"""Rich tables of a run: one row per case, a column per backend (median / p95, speedup vs baseline)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gdnbench.results import Status

STATUS_STYLE = {Status.PASS: "green", Status.FAIL: "bold red", Status.NAN: "bold red", Status.ERROR: "red",
                Status.OOM: "red", Status.TIMEOUT: "red", Status.CRASH: "bold red", Status.SKIP: "dim"}


def cell_float(v: Any) -> float | None:
    """A results.csv cell as a number; None when it is empty, NaN or not a number."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def table_unit(values_us: Iterable[Any]) -> str:
    """The one unit of a table's times: ms once any reaches 10 ms, else us."""
    times = [f for f in map(cell_float, values_us) if f is not None]
    return "ms" if times and max(times) >= 10_000 else "us"


def fmt_us(us: float | None, unit: str = "us") -> str:
    """A time given in us, written in ``unit`` (no suffix: the table's header or caption names the unit)."""
    if us is None:
        return "-"
    value = us / 1000 if unit == "ms" else us
    return f"{value:.1f}" if value < 1000 else f"{value:.0f}"


def short_labels(case_ids: Sequence[str]) -> tuple[list[str], str]:
    """(one label per case id, the parts every case shares).

    An id is split into its path parts (``prefill/padded``) and its comma parts (``B=4,T=2048,...``);
    the parts found in every id are dropped from the labels, as they say nothing about the difference
    between cases, and returned once, for a table's or figure's title. A lone case is labelled by its path
    parts, its comma parts said once.
    """
    if not case_ids:
        return [], ""
    if len(case_ids) == 1:
        tokens = _tokens(case_ids[0])
        path = [t for t in tokens if t[0] == "path"]
        return [_join(path) or case_ids[0]], _join([t for t in tokens if t[0] == "field"]) if path else ""
    tokens = [_tokens(c) for c in case_ids]
    shared = set.intersection(*(set(t) for t in tokens))
    return [_join([t for t in ts if t not in shared]) or c for c, ts in zip(case_ids, tokens)], \
        _join([t for t in tokens[0] if t in shared])


def _tokens(case_id: str) -> list[tuple[str, str]]:
    *path, fields = case_id.split("/")
    return [("path", p) for p in path] + [("field", f) for f in fields.split(",") if f]


def _join(tokens: list[tuple[str, str]]) -> str:
    path = " ".join(v for kind, v in tokens if kind == "path")
    fields = ",".join(v for kind, v in tokens if kind == "field")
    return f"{path} {fields}".strip()


def _cell(r: pd.Series, unit: str) -> Text:
    status = str(r["status"])
    med, p95 = cell_float(r.get("median_us")), cell_float(r.get("p95_us"))
    if status == Status.PASS and med is not None:
        t = Text(f"{fmt_us(med, unit)} / {fmt_us(p95, unit)}")
        sp = cell_float(r.get("speedup"))
        if sp is not None and r["backend"] != r.get("baseline"):
            t.append(f"  {sp:.2f}x", style="bold green" if sp >= 1 else "yellow")
        if str(r.get("converged")) == "False":
            t.append(" ~", style="yellow")  # not converged: the spread did not settle within the cap
        if str(r.get("interpreted")) == "True":
            t.append(" interp", style="dim")  # Triton interpreter on a CPU: the time means nothing
        if isinstance(r.get("throttle"), str) and r["throttle"]:
            t.append(" thr", style="bold red")  # the GPU throttled (power, thermal) while this was timed
        return t
    if status == Status.FAIL and med is not None:
        return Text(f"FAIL {fmt_us(med, unit)}", style=STATUS_STYLE[Status.FAIL])
    return Text(status if status != Status.SKIP else "skip", style=STATUS_STYLE.get(status, ""))


def table_grid(df: pd.DataFrame, meta: dict[str, Any]) -> tuple[str, str, list[str], list[tuple[str, list[Text]]]]:
    """(title, caption, column headers, rows of cells): one row per case, a column per backend."""
    backends = list(dict.fromkeys(df["backend"]))
    baselines = list(df["baseline"].dropna().unique()) if "baseline" in df else []
    dev = (meta.get("device") or {}).get("name") or (df["device"].iloc[0] if "device" in df and len(df) else "?")
    timed = df[df["timer"].notna()] if "timer" in df else df.iloc[0:0]
    timers = ", ".join(sorted({f"{t}/L2 {l2}" for t, l2 in zip(timed.get("timer", []), timed.get("l2", []))}))
    suite = df["suite"].iloc[0] if len(df) else "?"
    title = f"{suite} on {dev}" + (f"  ({timers})" if timers else "")
    unit = table_unit([*df.get("median_us", []), *df.get("p95_us", [])])
    caption = (f"median / p95 in {unit}"
               + (f"; speedup vs {' / '.join(baselines)} = baseline time / time (interleaved: the rounds' median)"
                  if baselines else "")
               + "; ~ = did not converge; interp = Triton interpreter; thr = timed while the GPU throttled")
    headers = [b + (" (base)" if b in baselines else "") for b in backends]
    rows = []
    for case_id, group in df.groupby("case_id", sort=False):
        by_backend = {r["backend"]: r for _, r in group.iterrows()}
        rows.append((str(case_id), [_cell(by_backend[b], unit) if b in by_backend else Text("") for b in backends]))
    return title, caption, headers, rows


def results_table(df: pd.DataFrame, meta: dict[str, Any]) -> Table:
    """The run's table for a terminal: a case is labelled by what sets it apart, the rest said once above."""
    title, caption, headers, rows = table_grid(df, meta)
    labels, shared = short_labels([case_id for case_id, _ in rows])
    table = Table(title=title + (f"\nevery case: {shared}" if shared else ""), caption=caption, header_style="bold")
    table.add_column("case", overflow="fold")
    for h in headers:
        table.add_column(h, justify="right")
    for label, (_, cells) in zip(labels, rows):
        table.add_row(label, *cells)
    return table


def markdown_table(df: pd.DataFrame, meta: dict[str, Any]) -> str:
    """The same table as markdown, for a decision record or a pull-request comment."""
    title, caption, headers, rows = table_grid(df, meta)
    lines = [f"**{title}**: {caption}", "", "| case | " + " | ".join(headers) + " |",
             "|---|" + "---:|" * len(headers)]
    lines += ["| " + " | ".join([case_id, *(c.plain.replace("  ", " ") for c in cells)]) + " |"
              for case_id, cells in rows]
    return "\n".join(lines) + "\n"


def problem_rows(df: pd.DataFrame) -> list[tuple[str, str, list[str], str]]:
    """(status, backend, case ids, reason) for every non-PASS row: SKIPs once per (backend, reason)."""
    bad = df[df["status"] != Status.PASS]
    out = []
    skips = bad[bad["status"] == Status.SKIP]
    for (backend, reason), group in skips.groupby(["backend", "error"], sort=False, dropna=False):
        why = "" if pd.isna(reason) else str(reason)
        out.append((Status.SKIP, str(backend), [str(c) for c in group["case_id"]], why))
    for _, r in bad[bad["status"] != Status.SKIP].iterrows():
        reason = "" if pd.isna(r.get("error")) else str(r.get("error"))
        if isinstance(r.get("note"), str) and r["note"].startswith("at "):
            reason += f" ({r['note']})"  # where an exception was raised
        out.append((str(r["status"]), str(r["backend"]), [str(r["case_id"])], reason))
    return out


def problems_table(df: pd.DataFrame) -> Table | None:
    """Every non-PASS row with its reason; SKIP reasons once per (backend, reason)."""
    rows = problem_rows(df)
    if not rows:
        return None
    table = Table(title="Not passing", header_style="bold", show_lines=False)
    for col in ("status", "backend", "case", "reason"):
        table.add_column(col, overflow="fold")
    for status, backend, cases, reason in rows:
        table.add_row(Text(status, style=STATUS_STYLE.get(status, "")), backend,
                      f"{len(cases)} case(s)" if status == Status.SKIP else cases[0], reason)
    return table


def status_line(df: pd.DataFrame) -> str:
    counts = df["status"].value_counts()
    return "  ".join(f"{s}: {counts[s]}" for s in Status if s in counts)


def render(df: pd.DataFrame, meta: dict[str, Any], console: Console) -> None:
    """Print the results table, the reasons for every non-PASS row, and the status counts."""
    if df.empty:
        console.print("[yellow]no rows[/yellow]")
        return
    console.print(results_table(df, meta))
    extra = problems_table(df)
    if extra is not None:
        console.print(extra)
    state = meta.get("status")
    console.print(status_line(df) + (f"   run {state}" if state and state != "complete" else ""))
    earlier = meta.get("earlier_sessions")
    if earlier:
        sessions = "; ".join(f"{m.get('created_utc', '?')} on {m.get('device', {}).get('name', '?')}, "
                             f"git {str(m.get('git', {}).get('sha'))[:7]}" for m in earlier)
        console.print(f"resumed: {len(meta.get('cases_from_earlier_sessions', []))} case(s) measured in "
                      f"{len(earlier)} earlier session(s) ({sessions})", markup=False, highlight=False)

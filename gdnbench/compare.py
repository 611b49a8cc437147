"""Compare two saved runs row by row: a verdict per (suite, case, backend, timer, L2), for CI gates.

Verdicts (docs/design.md, "Measurement": a slowdown needs a statistical and a practical gate):

- MISSING / NEW: the row is only in BASE / only in NEW.
- BROKEN: PASS in BASE, FAIL / NAN / ERROR / OOM / TIMEOUT in NEW (a correctness or robustness regression).
- FIXED: not PASS in BASE, PASS in NEW.  CHANGED: any other change of status (e.g. PASS -> SKIP).
- Same status and timed on both sides, from the raw samples (ratio = median NEW / median BASE):
  SAME when |ratio - 1| < threshold (the practical gate; whatever the p-value), else SLOWER or
  FASTER when the Mann-Whitney U p-value < alpha, else AMBIGUOUS (a shift the samples cannot confirm).
- Same status and not timed (SKIP, ERROR, ...): SAME.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rich.table import Table
from rich.text import Text

from gdnbench.report import STATUS_STYLE, cell_float, fmt_us, table_unit
from gdnbench.results import FAILED, SCHEMA_VERSION, RunFilesError, Status, load_run, load_samples
from gdnbench.stats import mann_whitney_u, median_ratio_ci

KEY = ["suite", "case_id", "backend", "timer", "l2"]
VERDICTS = ("BROKEN", "SLOWER", "AMBIGUOUS", "MISSING", "CHANGED", "NEW", "FIXED", "FASTER", "SAME")
VERDICT_STYLE = {"BROKEN": "bold red", "SLOWER": "bold red", "AMBIGUOUS": "yellow", "MISSING": "yellow",
                 "CHANGED": "yellow", "NEW": "cyan", "FIXED": "green", "FASTER": "bold green", "SAME": "dim"}
DEFAULT_FAIL_ON = ("SLOWER", "BROKEN")
HEADERS = ["case", "backend", "base (us)", "new (us)", "ratio new/base [95% CI]", "p", "verdict"]
NUMERIC = range(2, 6)  # right-aligned columns


class CompareError(Exception):
    """An input that cannot be compared (unreadable, wrong schema, samples missing): exit 2."""


@dataclass
class Run:
    path: Path
    rows: pd.DataFrame
    meta: dict[str, Any]
    samples_path: Path
    samples: dict[tuple[str, str, str, str], np.ndarray]  # (case_id, backend, timer, l2) -> us

    @property
    def device(self) -> str | None:
        name = (self.meta.get("device") or {}).get("name")
        if name is None and "device" in self.rows:
            seen = self.rows["device"].dropna().unique()
            name = str(seen[0]) if len(seen) else None
        return name


def load(path: str | Path) -> Run:
    """A run directory (or its results.csv) checked for everything a comparison needs."""
    path = Path(path)
    try:
        df, meta = load_run(path)
        samples = load_samples(path)
    except RunFilesError as e:
        raise CompareError(str(e)) from None
    except (OSError, ValueError) as e:  # unreadable file, or corrupt JSON in run.json / samples.jsonl
        raise CompareError(f"{path}: cannot read the run ({e})") from None
    folder = path if path.is_dir() else path.parent
    if meta and meta.get("schema") != SCHEMA_VERSION:
        raise CompareError(f"{folder / 'run.json'}: schema {meta.get('schema')!r}, this gdnbench reads "
                           f"schema {SCHEMA_VERSION}")
    missing = [c for c in KEY if c not in df.columns]
    if missing:
        raise CompareError(f"{path}: results.csv lacks the columns {missing}")
    df = _fill_untimed(df, meta)
    dup = df[df.duplicated(KEY, keep=False)]
    if not dup.empty:
        raise CompareError(f"{path}: {len(dup)} rows share a (suite, case_id, backend, timer, l2) key, "
                           f"e.g. {tuple(dup.iloc[0][KEY])}")
    raw = {(s["case_id"], s["backend"], s["timer"], s["l2"]): np.asarray(s["samples_us"], dtype=np.float64)
           for s in samples}
    return Run(path, df, meta, folder / "samples.jsonl", raw)


def _fill_untimed(df: pd.DataFrame, meta: dict[str, Any]) -> pd.DataFrame:
    """Give rows that were never timed (SKIP, ERROR, ...) the run's timer and L2 mode.

    Otherwise a row PASS in BASE and ERROR in NEW would not match (the ERROR row has no timer).
    The run's mode is run.json's timing section, else the one mode all timed rows share.
    """
    df = df.copy()
    timing = meta.get("timing") or {}
    for col in ("timer", "l2"):
        seen = df[col].dropna().unique()
        value = timing.get(col) or (seen[0] if len(seen) == 1 else None)
        if value is not None:
            df[col] = df[col].fillna(value)
    for col in [*KEY, "status"]:  # one dtype on both sides, so the merge can match
        df[col] = df[col].fillna("").astype(str)
    return df


def provenance_diffs(base: Run, new: Run) -> list[str]:
    """What differs between where BASE and NEW were measured: GPU name, driver, library versions."""
    diffs = []
    for what, b, n in (("GPU", base.device, new.device),
                       ("driver", (base.meta.get("device") or {}).get("driver_version"),
                        (new.meta.get("device") or {}).get("driver_version"))):
        if b is not None and n is not None and b != n:
            diffs.append(f"{what}: {b} (base) vs {n} (new)")
    bv, nv = base.meta.get("versions") or {}, new.meta.get("versions") or {}
    # a library on one side only (a backend run in one of the two) is no difference
    diffs += [f"{k}: {bv[k]} (base) vs {nv[k]} (new)" for k in sorted(bv.keys() & nv.keys()) if bv[k] != nv[k]]
    return diffs


CLOCK_GAP = 0.03  # SM clocks this far apart make a row's ratio partly the clock's (docs/design.md, "Telemetry")


def telemetry_notes(base: Run, new: Run, df: pd.DataFrame) -> list[str]:
    """For each SLOWER or FASTER row: the GPU's SM clocks on both sides where they differ by CLOCK_GAP or
    more, and any throttle reason NEW's row was timed under, so a verdict the GPU explains says so."""
    notes = []
    sides = {name: run.rows.set_index(KEY) for name, run in (("base", base), ("new", new))}
    for r in df[df["verdict"].isin(["SLOWER", "FASTER"])].to_dict("records"):
        key = tuple(r[k] for k in KEY)
        tele = {name: rows.loc[key] if key in rows.index else None for name, rows in sides.items()}
        if any(t is None or isinstance(t, pd.DataFrame) for t in tele.values()):
            continue
        clocks = {name: cell_float(t.get("sm_mhz")) for name, t in tele.items()}
        said = []
        if None not in clocks.values() and abs(clocks["new"] / clocks["base"] - 1) >= CLOCK_GAP:
            said.append(f"SM clock {clocks['base']:.0f} (base) vs {clocks['new']:.0f} MHz (new)")
        throttle = tele["new"].get("throttle")
        if isinstance(throttle, str) and throttle:
            said.append(f"NEW timed under {throttle}")
        if said:
            notes.append(f"{r['case_id']} / {r['backend']} ({r['verdict']}): " + "; ".join(said))
    return notes


def compare_runs(base: Run, new: Run, alpha: float = 0.01, threshold: float = 0.05,
                 thresholds: dict[str, float] | None = None) -> pd.DataFrame:
    """One row per key in either run with both sides' status and median, the ratio, its CI, p and the verdict.

    ``thresholds`` overrides ``threshold`` per suite name. Sorted BROKEN first, then timed rows by
    ratio (largest slowdown first), then the rest.
    """
    cols = KEY + ["status", "median_us"]
    merged = pd.merge(base.rows[cols], new.rows[cols], on=KEY, how="outer", suffixes=("_base", "_new"),
                      indicator=True, sort=False)
    out = []
    for r in merged.to_dict("records"):
        thr = (thresholds or {}).get(r["suite"], threshold)
        row = {**{k: r[k] for k in KEY}, "base_status": r["status_base"], "new_status": r["status_new"],
               "base_n": None, "new_n": None, "base_median_us": cell_float(r["median_us_base"]),
               "new_median_us": cell_float(r["median_us_new"]), "ratio": None, "ratio_lo": None, "ratio_hi": None,
               "p_value": None, "threshold": thr}
        bs, ns = r["status_base"], r["status_new"]
        if r["_merge"] == "left_only":
            row["verdict"] = "MISSING"
        elif r["_merge"] == "right_only":
            row["verdict"] = "NEW"
        elif bs == Status.PASS and ns in FAILED:
            row["verdict"] = "BROKEN"
        elif bs != ns:
            row["verdict"] = "FIXED" if ns == Status.PASS else "CHANGED"
        elif row["base_median_us"] is None or row["new_median_us"] is None:
            row["verdict"] = "SAME"  # untimed on a side: the unchanged status is all there is to compare
        else:
            row.update(timing_verdict(_samples(base, r), _samples(new, r), alpha, thr))
        out.append(row)
    df = pd.DataFrame(out, columns=[*KEY, "base_status", "new_status", "base_n", "new_n", "base_median_us",
                                    "new_median_us", "ratio", "ratio_lo", "ratio_hi", "p_value", "threshold",
                                    "verdict"])
    group = np.where(df["verdict"] == "BROKEN", 0, np.where(df["ratio"].notna(), 1, 2))
    order = np.lexsort((-df["ratio"].astype(float).fillna(0).to_numpy(), group))
    return df.iloc[order].reset_index(drop=True)


def _samples(run: Run, r: dict[str, Any]) -> np.ndarray:
    x = run.samples.get((r["case_id"], r["backend"], r["timer"], r["l2"]))
    if x is None or x.size == 0:
        raise CompareError(f"{run.samples_path}: no raw samples for {r['case_id']} / {r['backend']} "
                           f"({r['timer']}, L2 {r['l2']}), needed to compare its timings")
    return x


def timing_verdict(base: np.ndarray, new: np.ndarray, alpha: float, threshold: float) -> dict[str, Any]:
    """SAME, SLOWER, FASTER or AMBIGUOUS for NEW's samples against BASE's, with the ratio of medians, its
    interval and the Mann-Whitney p (docs/design.md, "Measurement")."""
    ratio, lo, hi = median_ratio_ci(new, base)
    p = mann_whitney_u(new, base)
    if abs(ratio - 1) < threshold:
        verdict = "SAME"
    elif p < alpha:
        verdict = "SLOWER" if ratio > 1 else "FASTER"
    else:
        verdict = "AMBIGUOUS"
    return {"base_n": int(base.size), "new_n": int(new.size), "base_median_us": float(np.median(base)),
            "new_median_us": float(np.median(new)), "ratio": ratio, "ratio_lo": lo, "ratio_hi": hi,
            "p_value": p, "verdict": verdict}


def counts(df: pd.DataFrame) -> dict[str, int]:
    """Rows per verdict, in VERDICTS order, zero counts left out."""
    c = df["verdict"].value_counts()
    return {v: int(c[v]) for v in VERDICTS if v in c}


def summary_line(df: pd.DataFrame) -> str:
    return "  ".join(f"{v}: {n}" for v, n in counts(df).items()) or "no rows"


def _side(status: Any, median: Any, unit: str) -> str:
    """A side's cell: the median when it passed, else its status (and median, if it was timed)."""
    if not isinstance(status, str):
        return "-"
    med = cell_float(median)
    if status == Status.PASS and med is not None:
        return fmt_us(med, unit)
    return status if med is None else f"{status} {fmt_us(med, unit)}"


def _ratio(r: pd.Series) -> str:
    if pd.isna(r["ratio"]):
        return "-"
    return f"{r['ratio']:.3f} [{r['ratio_lo']:.3f}, {r['ratio_hi']:.3f}]"


def _p(r: pd.Series) -> str:
    return "-" if pd.isna(r["p_value"]) else f"{r['p_value']:.2g}"


def _cells(r: pd.Series, unit: str) -> list[str]:
    return [str(r["case_id"]), str(r["backend"]), _side(r["base_status"], r["base_median_us"], unit),
            _side(r["new_status"], r["new_median_us"], unit), _ratio(r), _p(r), str(r["verdict"])]


def _unit(df: pd.DataFrame) -> str:
    return table_unit([*df["base_median_us"], *df["new_median_us"]])


def _caption(df: pd.DataFrame, alpha: float) -> str:
    modes = ", ".join(sorted({f"{t}/L2 {l2}" for t, l2 in zip(df["timer"], df["l2"]) if t}))
    thr = ", ".join(sorted({f"{100 * t:g}%" for t in df["threshold"]}))
    return (f"median {_unit(df)} ({modes}); ratio > 1 is slower; SLOWER/FASTER need |ratio - 1| >= {thr} "
            f"and Mann-Whitney p < {alpha:g}")


def comparison_table(df: pd.DataFrame, base: Run, new: Run, alpha: float) -> Table:
    table = Table(title=f"{base.path} -> {new.path}", caption=_caption(df, alpha), header_style="bold")
    for i, h in enumerate(HEADERS):
        table.add_column(h, justify="right" if i in NUMERIC else "left", overflow="fold")
    for _, r in df.iterrows():
        cells = _cells(r, _unit(df))
        table.add_row(*cells[:2],
                      Text(cells[2], style=STATUS_STYLE.get(str(r["base_status"]), "")),
                      Text(cells[3], style=STATUS_STYLE.get(str(r["new_status"]), "")),
                      *cells[4:6], Text(cells[6], style=VERDICT_STYLE[cells[6]]))
    return table


def markdown(df: pd.DataFrame, base: Run, new: Run, alpha: float) -> str:
    """A pull-request comment: the verdict counts, the rows that are not SAME, then every row."""
    rule = "|" + "".join("---:|" if i in NUMERIC else "---|" for i in range(len(HEADERS)))

    def table(rows: pd.DataFrame) -> list[str]:
        return ["| " + " | ".join(HEADERS) + " |", rule,
                *("| " + " | ".join(_cells(r, _unit(df))) + " |" for _, r in rows.iterrows())]

    changed = df[df["verdict"] != "SAME"]
    lines = [f"**gdnbench compare** `{base.path}` -> `{new.path}`: "
             + ", ".join(f"{n} {v}" for v, n in counts(df).items()), "", _caption(df, alpha), ""]
    if not changed.empty:
        lines += [f"**Not SAME ({len(changed)})**", "", *table(changed), ""]
    lines += [f"<details><summary>All rows ({len(df)})</summary>", "", *table(df), "", "</details>"]
    return "\n".join(lines) + "\n"


def to_json(df: pd.DataFrame, base: Run, new: Run, settings: dict[str, Any], warnings: list[str]) -> str:
    """Verdicts and numbers per row, the settings, and both runs' provenance (run.json) as JSON."""
    doc = {"settings": settings, "counts": counts(df), "warnings": warnings,
           "base": {"path": str(base.path), "run": base.meta},
           "new": {"path": str(new.path), "run": new.meta},
           "rows": json.loads(df.to_json(orient="records"))}  # pandas writes NaN as null
    return json.dumps(doc, indent=2, default=str)

"""The results history: every run's rows in one SQLite file, and each series' level changes over time.

A series is one (suite, case, backend, timer, L2 mode, GPU). ``gdnbench run`` appends each run it writes;
``gdnbench history --import DIR...`` ingests existing run directories (the tracked baselines too). A run is
keyed by its run.json (start time, host, command, suite hash), so importing it twice adds nothing. Rows keep
their raw samples, so that each point of a series is judged against the point before it by the rule
``compare`` uses (``compare.timing_verdict``: a practical threshold on the ratio of medians and Mann-Whitney
U); a point judged SLOWER or FASTER is a step, a change of level at that commit.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gdnbench.compare import timing_verdict
from gdnbench.report import cell_float
from gdnbench.results import SCHEMA_VERSION, RunFilesError, Status, load_run, load_samples

DEFAULT_DB = Path("results/history.sqlite")
ENV_DB = "GDNBENCH_HISTORY"  # where the history lives, when not the default
SPARK = "▁▂▃▄▅▆▇█"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_key TEXT PRIMARY KEY, path TEXT, suite TEXT, gpu TEXT, git_sha TEXT, created_utc TEXT,
    versions TEXT, command TEXT);
CREATE TABLE IF NOT EXISTS rows (
    run_key TEXT REFERENCES runs(run_key), suite TEXT, case_id TEXT, backend TEXT, timer TEXT, l2 TEXT,
    status TEXT, n INTEGER, median_us REAL, p95_us REAL, ci_lo_us REAL, ci_hi_us REAL, samples TEXT,
    PRIMARY KEY (run_key, case_id, backend, timer, l2));
"""


def default_db() -> Path:
    """The history's file: $GDNBENCH_HISTORY, else results/history.sqlite."""
    return Path(os.environ.get(ENV_DB) or DEFAULT_DB)


@dataclass
class Point:
    """One run's row in a series."""

    git_sha: str
    created_utc: str
    status: str
    median_us: float | None
    samples: np.ndarray
    verdict: str = ""  # against the point before it: SAME, SLOWER, FASTER, AMBIGUOUS, or a status change


def connect(db: Path) -> sqlite3.Connection:
    db.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(db)
    conn.executescript(_SCHEMA)
    return conn


def record(conn: sqlite3.Connection, run_dir: Path) -> bool:
    """Add the run in ``run_dir``; False when the history already has it (or it has no run.json)."""
    df, meta = load_run(run_dir)
    if not meta:
        return False
    if meta.get("schema") != SCHEMA_VERSION:
        raise RunFilesError(f"{run_dir}/run.json: schema {meta.get('schema')!r}, this gdnbench reads schema "
                            f"{SCHEMA_VERSION}")
    identity = json.dumps([meta.get("created_utc"), meta.get("host"), meta.get("command"),
                           (meta.get("suite") or {}).get("sha256")])
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    if conn.execute("SELECT 1 FROM runs WHERE run_key = ?", (key,)).fetchone():
        return False
    samples = {(s["case_id"], s["backend"], s["timer"], s["l2"]): s["samples_us"] for s in load_samples(run_dir)}
    conn.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (
        key, str(run_dir), (meta.get("suite") or {}).get("name"), (meta.get("device") or {}).get("name"),
        (meta.get("git") or {}).get("sha"), meta.get("created_utc"), json.dumps(meta.get("versions") or {}),
        meta.get("command")))
    for r in df.to_dict("records"):
        raw = samples.get((r["case_id"], r["backend"], r["timer"], r["l2"]))
        conn.execute("INSERT OR IGNORE INTO rows VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", (
            key, r["suite"], r["case_id"], r["backend"], _text(r["timer"]), _text(r["l2"]), str(r["status"]),
            cell_float(r["n"]), cell_float(r["median_us"]), cell_float(r["p95_us"]), cell_float(r["ci_lo_us"]),
            cell_float(r["ci_hi_us"]),
            json.dumps(raw) if raw else None))
    conn.commit()
    return True


def run_dirs(paths: list[Path]) -> Iterator[Path]:
    """Every run directory (a folder with results.csv and run.json) at or under ``paths``, in path order."""
    for path in paths:
        for csv in sorted([path / "results.csv"] if (path / "results.csv").is_file() else path.rglob("results.csv")):
            if (csv.parent / "run.json").is_file():
                yield csv.parent


def series(conn: sqlite3.Connection, suite: str | None = None, case: str | None = None,
           backend: str | None = None, gpu: str | None = None, alpha: float = 0.01,
           threshold: float = 0.05) -> dict[tuple[str, ...], list[Point]]:
    """(suite, case_id, backend, timer, l2, gpu) -> its points, oldest first, each judged against the one
    before it. ``case`` and ``gpu`` match substrings; ``suite`` and ``backend`` whole names."""
    query = ("SELECT r.suite, r.case_id, r.backend, r.timer, r.l2, u.gpu, u.git_sha, u.created_utc, r.status, "
             "r.median_us, r.samples FROM rows r JOIN runs u USING (run_key) WHERE 1 = 1")
    args: list[Any] = []
    for clause, value in (("r.suite = ?", suite), ("r.case_id LIKE ?", case and f"%{case}%"),
                          ("r.backend = ?", backend), ("u.gpu LIKE ?", gpu and f"%{gpu}%")):
        if value:
            query += f" AND {clause}"
            args.append(value)
    out: dict[tuple[str, ...], list[Point]] = {}
    for *key, sha, created, status, median, raw in conn.execute(query + " ORDER BY u.created_utc", args):
        out.setdefault(tuple(key), []).append(
            Point(sha or "?", created or "?", status, median, np.asarray(json.loads(raw) if raw else [], float)))
    for points in out.values():
        for before, point in zip(points, points[1:]):
            point.verdict = judge(before, point, alpha, threshold)
    return out


def judge(before: Point, point: Point, alpha: float, threshold: float) -> str:
    """A point against the one before it, by compare's rule; a change of status is named as such."""
    if before.status != point.status:
        return f"{before.status} -> {point.status}"
    if point.status != Status.PASS or before.samples.size == 0 or point.samples.size == 0:
        return ""
    return timing_verdict(before.samples, point.samples, alpha, threshold)["verdict"]


def steps(points: list[Point]) -> list[Point]:
    """The points where the series changed level (SLOWER or FASTER than the point before)."""
    return [p for p in points if p.verdict in ("SLOWER", "FASTER")]


def sparkline(values: list[float | None]) -> str:
    """One character per value, its height scaled between the series' min and max ('·' for no value)."""
    known = [v for v in values if v is not None]
    if not known:
        return ""
    lo, hi = min(known), max(known)
    span = (hi - lo) or 1.0
    return "".join("·" if v is None else SPARK[min(len(SPARK) - 1, int((v - lo) / span * len(SPARK)))]
                   for v in values)


def _text(v: Any) -> str:
    return "" if v is None or (isinstance(v, float) and v != v) else str(v)


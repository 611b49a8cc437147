"""A run directory on disk: results.csv (tidy rows), samples.jsonl (raw samples), run.json (provenance).

Rows are written as each case finishes, atomically, so an interrupt or a crash loses nothing that
was already measured; run.json says whether the run completed, and an unfinished run can be reopened
to go on (``RunDir.resume``).
"""

from __future__ import annotations

import csv
import datetime as dt
import fcntl
import json
import os
import socket
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

import pandas as pd

SCHEMA_VERSION = 1

# Column order of results.csv; case fields follow these.
ROW_COLUMNS = [
    "suite", "case_id", "backend", "status", "error", "path", "version", "device",
    "timer", "l2", "n", "median_us", "p95_us", "min_us", "max_us", "mean_us", "stdev_us", "iqr_us",
    "ci_lo_us", "ci_hi_us", "converged", "baseline", "speedup", "speedup_lo", "speedup_hi",
    # the correctness gate (gdnbench.check): each measure, its floor and its tolerance, for o and the state
    "rel_err_o", "floor_o", "tol_o", "local_err_o", "local_floor_o", "local_tol_o",
    "peak_err_o", "peak_floor_o", "peak_tol_o", "max_err_o",
    "rel_err_state", "floor_state", "tol_state", "local_err_state", "local_floor_state", "local_tol_state",
    "peak_err_state", "peak_floor_state", "peak_tol_state", "max_err_state",
    "gbytes", "gflop", "gbps", "tflops", "pct_bw", "pct_flops", "copy_us", "pct_copy", "warmup_s", "case_s",
    "interpreted",
    "note",
]
CASE_COLUMNS = [
    "op", "mode", "B", "T", "seq_lens", "num_seqs", "total_tokens", "H", "HV", "K", "V", "dtype",
    "state_dtype", "gate_norm", "mask_p", "half_life", "scale", "qk_l2norm", "gating", "initial_state",
    "output_final_state", "pool_size", "slots", "per_token_slots",
]
COLUMNS = ROW_COLUMNS + CASE_COLUMNS
STATUSES = ("PASS", "FAIL", "NAN", "ERROR", "OOM", "TIMEOUT", "SKIP")
NOT_RUN = "not run: "  # how the error of an ERROR row for a case that was never started begins


RUN_FILES = ("results.csv", "samples.jsonl", "run.json")
# what the other commands write beside a run (plot, report): stale once the run is replaced
DERIVED_FILES = ("plot.png", "report.html")
LOCK_FILE = ".gdnbench.lock"


class RunDirError(Exception):
    """A run directory that cannot be used: taken by another run, holding a run, or not creatable."""


class RunDir:
    """Writes one run's files into ``path`` as the run goes, holding the directory's lock meanwhile.

    The lock (an advisory ``flock`` on ``.gdnbench.lock``, released when the run ends or its process dies)
    keeps a second run from writing into the same directory: it raises RunDirError naming the holder.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.mkdir(parents=True, exist_ok=True)
            self._lock = _lock(path)
        except OSError as e:
            raise RunDirError(f"{path}: cannot use it as a run directory ({e.strerror or e})") from None
        self.rows: list[dict[str, Any]] = []
        for name in ("results.csv", "samples.jsonl"):
            (path / name).unlink(missing_ok=True)

    @classmethod
    def create(cls, path: Path | None, default: Path, force: bool = False) -> RunDir:
        """A new run in ``path``, or, without one, in ``default`` made unique (``-2``, ``-3``, ... when
        another run took that name first). A ``path`` that holds a run raises RunDirError unless
        ``force``, which deletes the run's files and every file derived from them."""
        if path is None:
            return cls(_unique_dir(default))
        if path.exists() and not path.is_dir():
            raise RunDirError(f"{path}: a file, not a directory")
        held = [n for n in (*RUN_FILES, *DERIVED_FILES) if (path / n).exists()]
        if held and not force:
            raise RunDirError(f"{path} holds a run ({', '.join(held)}): --resume to go on with it, "
                              f"--force to replace it, or another --out")
        run = cls(path)  # takes the lock before anything is deleted
        for name in held:
            (path / name).unlink(missing_ok=True)
        return run

    def close(self) -> None:
        """Release the directory's lock (also released when the process ends)."""
        self._lock.close()

    @classmethod
    def resume(cls, path: Path, backends: list[str]) -> tuple[RunDir, set[str]]:
        """The unfinished run in ``path`` reopened to go on: each case with a row for every one of
        ``backends`` is kept (its rows as written, its samples), any other case's rows are dropped, so
        that a case is run again whole and its rows and speedups always come from one session.
        Returns the run and the ids of the cases kept. A case that was never started (after a lost GPU
        context) has rows but is not kept."""
        with open(path / "results.csv", newline="") as f:
            rows = [r for r in csv.DictReader(f) if not (r.get("error") or "").startswith(NOT_RUN)]
        have: dict[str, set[str]] = {}
        for r in rows:
            have.setdefault(r["case_id"], set()).add(r["backend"])
        done = {case for case, names in have.items() if names >= set(backends)}
        samples = [s for s in load_samples(path) if s["case_id"] in done]
        run = cls(path)
        run.add_case([r for r in rows if r["case_id"] in done], samples)
        return run, done

    def write_meta(self, meta: dict[str, Any]) -> None:
        _atomic_write(self.path / "run.json", json.dumps({"schema": SCHEMA_VERSION, **meta}, indent=2,
                                                           default=str))

    def add_case(self, rows: Iterable[dict[str, Any]], samples: Iterable[dict[str, Any]]) -> None:
        """Append one finished case: its rows (rewritten atomically) and its raw samples."""
        self.rows.extend(rows)
        with open(self.path / "samples.jsonl", "a") as f:
            for s in samples:
                f.write(json.dumps(s) + "\n")
        tmp = self.path / "results.csv.tmp"
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="raise")
            w.writeheader()
            for r in self.rows:
                w.writerow({k: _cell(r.get(k)) for k in COLUMNS})
        os.replace(tmp, self.path / "results.csv")


def _cell(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return " ".join(str(x) for x in v)
    return v


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class RunFilesError(Exception):
    """A run directory or results file that cannot be read."""


def load_run(path: str | Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    """(rows, run.json) of a saved run; ``path`` is the run directory or its results.csv."""
    p = Path(path)
    csv_path = p / "results.csv" if p.is_dir() else p
    if not csv_path.exists():
        raise RunFilesError(f"{path}: no results.csv there")
    try:
        df = pd.read_csv(csv_path, keep_default_na=True)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise RunFilesError(f"{csv_path}: not a gdnbench results.csv ({e})") from None
    missing = [c for c in ("case_id", "backend", "status", "median_us") if c not in df.columns]
    if missing:
        raise RunFilesError(f"{csv_path}: not a gdnbench results.csv (missing columns {missing})")
    # a results.csv from an older or partial writer: the tables and plots read every column
    df = df.reindex(columns=[*df.columns, *(c for c in COLUMNS if c not in df.columns)])
    meta_path = csv_path.parent / "run.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    return df, meta


def load_samples(path: str | Path) -> list[dict[str, Any]]:
    """The raw samples of a run. A cut last line (a run killed while appending) is dropped with a warning;
    a bad line elsewhere raises RunFilesError."""
    p = Path(path)
    f = (p if p.is_dir() else p.parent) / "samples.jsonl"
    if not f.exists():
        return []
    lines = [line for line in f.read_text().splitlines() if line.strip()]
    out = []
    for i, line in enumerate(lines):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i < len(lines) - 1:
                raise RunFilesError(f"{f}: line {i + 1} is not JSON ({e})") from None
            warnings.warn(f"{f}: its last line is cut (the run was killed while writing it); dropped",
                          stacklevel=2)
    return out


def _lock(path: Path) -> IO[str]:
    handle = open(path / LOCK_FILE, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise RunDirError(f"{path}: another gdnbench run is writing there ({holder})") from None
    handle.seek(0)
    handle.truncate()
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since {started}\n")
    handle.flush()
    return handle


def _unique_dir(default: Path) -> Path:
    default.parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        candidate = default if n == 1 else default.with_name(f"{default.name}-{n}")
        try:
            candidate.mkdir()  # atomic: of two runs started in the same second, one gets each name
            return candidate
        except FileExistsError:
            continue
    raise RunDirError(f"{default}: 999 runs of that name already; give --out")

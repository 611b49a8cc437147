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
from dataclasses import dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import IO, Any

import pandas as pd
from typing_extensions import TypedDict  # pydantic needs it for a JSON Schema on Python < 3.12

from gdnbench.suite import Case

SCHEMA_VERSION = 1

class Status(str, Enum):
    """What became of one (case, backend): the row's ``status``. A str, so CSV cells and comparisons with
    the column's text are the plain names."""

    PASS = "PASS"  # within every tolerance, on the first call and on the timed call
    FAIL = "FAIL"  # outside a tolerance, or it wrote into inputs it does not own
    NAN = "NAN"  # NaN or Inf in an output
    ERROR = "ERROR"  # an exception; or never run, after the GPU context was lost (error starts with NOT_RUN)
    OOM = "OOM"  # out of GPU memory
    TIMEOUT = "TIMEOUT"  # past the suite's timeout_s
    CRASH = "CRASH"  # the worker process died in it (a signal, an exit): gdnbench.worker
    SKIP = "SKIP"  # unavailable here, or the case is outside its envelope

    def __str__(self) -> str:
        return self.value


# the statuses of a backend that ran and went wrong (neither PASS nor SKIP)
FAILED = frozenset({Status.FAIL, Status.NAN, Status.ERROR, Status.OOM, Status.TIMEOUT, Status.CRASH})
# the statuses of a run that did not finish its work: --resume --retry-failed runs their cases again
UNFINISHED = frozenset({Status.ERROR, Status.OOM, Status.TIMEOUT, Status.CRASH})


@dataclass
class Row:
    """One row of results.csv: a (case, backend) and everything measured about it. Its fields, in order, are
    the file's first columns (``ROW_COLUMNS``); the case's fields (``CASE_COLUMNS``) follow them."""

    suite: str
    case_id: str
    backend: str
    status: Status | None = None
    error: str | None = None
    path: str | None = None  # the code path that ran (``Prepared.path``)
    version: str | None = None  # the backend's package version
    device: str | None = None
    timer: str | None = None  # the timer used (graph, events, wall)
    l2: str | None = None  # cold or warm
    # timing: docs/design.md, "Measurement"
    n: int | None = None
    median_us: float | None = None
    p95_us: float | None = None
    min_us: float | None = None
    max_us: float | None = None
    mean_us: float | None = None
    stdev_us: float | None = None
    iqr_us: float | None = None
    ci_lo_us: float | None = None
    ci_hi_us: float | None = None
    converged: bool | None = None
    baseline: str | None = None
    speedup: float | None = None
    speedup_lo: float | None = None
    speedup_hi: float | None = None
    # the correctness gate (gdnbench.check): each measure, its floor and its tolerance, for o and the state
    rel_err_o: float | None = None
    floor_o: float | None = None
    tol_o: float | None = None
    local_err_o: float | None = None
    local_floor_o: float | None = None
    local_tol_o: float | None = None
    peak_err_o: float | None = None
    peak_floor_o: float | None = None
    peak_tol_o: float | None = None
    max_err_o: float | None = None
    rel_err_state: float | None = None
    floor_state: float | None = None
    tol_state: float | None = None
    local_err_state: float | None = None
    local_floor_state: float | None = None
    local_tol_state: float | None = None
    peak_err_state: float | None = None
    peak_floor_state: float | None = None
    peak_tol_state: float | None = None
    max_err_state: float | None = None
    # roofline (docs/design.md, "Roofline") and the measured ceilings
    gbytes: float | None = None
    gflop: float | None = None
    gbps: float | None = None
    tflops: float | None = None
    pct_bw: float | None = None
    pct_flops: float | None = None
    copy_us: float | None = None
    pct_copy: float | None = None
    # the GPU right after the samples (gdnbench.telemetry): a row timed while it throttled says so
    sm_mhz: int | None = None
    mem_mhz: int | None = None
    power_w: float | None = None
    temp_c: int | None = None
    throttle: str | None = None  # NVML's throttle reasons, comma-separated; '' for none
    warmup_s: float | None = None  # the first call's wall time (compilation, autotuning)
    case_s: float | None = None  # the whole case's wall time
    interpreted: bool | None = None  # ran in Triton's interpreter: correctness only
    note: str | None = None
    case: dict[str, Any] = field(default_factory=dict, repr=False)  # Case.fields(): CASE_COLUMNS

    def update(self, **cols: Any) -> None:
        """Set columns by name; a name that is not a column raises."""
        for name, value in cols.items():
            if name not in _ROW_FIELDS:
                raise KeyError(f"results.csv has no column {name!r}")
            setattr(self, name, value)

    def as_dict(self) -> dict[str, Any]:
        """The row as results.csv has it: ``ROW_COLUMNS`` then the case's fields."""
        return {**{name: getattr(self, name) for name in ROW_COLUMNS}, **self.case}


ROW_COLUMNS = [f.name for f in fields(Row) if f.name != "case"]
_ROW_FIELDS = frozenset(ROW_COLUMNS)
CASE_COLUMNS = [name for name in Case.model_fields if name != "D"]  # D is stored as K and V
COLUMNS = ROW_COLUMNS + CASE_COLUMNS
NOT_RUN = "not run: "  # how the error of an ERROR row for a case that was never started begins


RUN_FILES = ("results.csv", "samples.jsonl", "run.json", "worker.log")
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
        self.rows: list[dict[str, Any]] = []  # as written: Row.as_dict(), or read back by resume
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
    def resume(cls, path: Path, backends: list[str], retry: frozenset[str] = frozenset()
               ) -> tuple[RunDir, set[str]]:
        """The unfinished run in ``path`` reopened to go on: each case with a row for every one of
        ``backends`` is kept (its rows as written, its samples), any other case's rows are dropped, so
        that a case is run again whole and its rows and speedups always come from one session.
        Returns the run and the ids of the cases kept. A case that was never started (after a lost GPU
        context) has rows but is not kept, nor is a case with a row whose status is in ``retry``."""
        rows = []
        if (path / "results.csv").exists():  # absent when the run was stopped before its first case ended
            with open(path / "results.csv", newline="") as f:
                rows = [r for r in csv.DictReader(f) if not (r.get("error") or "").startswith(NOT_RUN)]
        have: dict[str, set[str]] = {}
        for r in rows:
            have.setdefault(r["case_id"], set()).add(r["backend"])
        retried = {r["case_id"] for r in rows if r["status"] in retry}
        done = {case for case, names in have.items() if names >= set(backends) and case not in retried}
        samples = [s for s in load_samples(path) if s["case_id"] in done]
        run = cls(path)
        run.add_rows([r for r in rows if r["case_id"] in done], samples)
        return run, done

    def write_meta(self, meta: dict[str, Any]) -> None:
        _atomic_write(self.path / "run.json", json.dumps({"schema": SCHEMA_VERSION, **meta}, indent=2,
                                                           default=str))

    def add_case(self, rows: Iterable[Row], samples: Iterable[dict[str, Any]]) -> None:
        """Append one finished case: its rows (results.csv rewritten atomically) and its raw samples."""
        self.add_rows([r.as_dict() for r in rows], samples)

    def add_rows(self, rows: list[dict[str, Any]], samples: Iterable[dict[str, Any]]) -> None:
        """Append rows as results.csv has them (read back from a run, or ``Row.as_dict()``) and their samples."""
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


class RunMeta(TypedDict, total=False):
    """run.json: where, how and from what a run was measured (docs/results-schema.md says what each holds)."""

    schema: int
    created_utc: str
    finished_utc: str
    status: str  # running, complete, interrupted, device lost (incomplete: a merge of shards not all complete)
    command: str
    suite: dict[str, Any]  # name, path, sha256, cases, filter
    host: str
    platform: str
    python: str
    versions: dict[str, str]
    git: dict[str, Any]  # sha, dirty, source
    device: dict[str, Any]
    seed: int
    backends: list[str]
    baseline: dict[str, str]
    timing: dict[str, Any]
    reference: dict[str, Any]
    tolerances: dict[str, float]
    ceilings: dict[str, float]
    interleave: bool
    copy_reference: bool
    shard: dict[str, Any] | None  # index, count, cases
    gpus: list[str] | None
    earlier_sessions: list[dict[str, Any]]
    cases_from_earlier_sessions: list[str]
    device_lost: str
    merged_from: list[dict[str, Any]]


def json_schemas() -> dict[str, Any]:
    """JSON Schemas of a results.csv row (with the case's fields) and of run.json, from their types."""
    from pydantic import TypeAdapter

    from gdnbench.suite import Case

    row = TypeAdapter(Row).json_schema()
    row["properties"].pop("case", None)
    case = TypeAdapter(Case).json_schema()["properties"]
    row["properties"].update({name: case[name] for name in CASE_COLUMNS})  # D is a suite shorthand, no column
    return {"schema_version": SCHEMA_VERSION, "results.csv row": row, "run.json": TypeAdapter(RunMeta).json_schema()}


def run_field(meta: dict[str, Any], dotted: str) -> Any:
    """A run.json value by its dotted key (``suite.sha256``); None where any part is missing."""
    value: Any = meta
    for key in dotted.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


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

"""gdnbench run: run a YAML suite across backends, check every result, time it, report and save."""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
import sys
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Annotated, NoReturn, Optional

import torch
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from gdnbench import provenance, runner
from gdnbench.backends import Backend
from gdnbench.cli.common import EXIT_FAIL, EXIT_INTERRUPTED, EXIT_OK, console, die, err_console, select
from gdnbench.history import connect, record
from gdnbench.history import default_db as default_history
from gdnbench.interrupts import sigterm_as_interrupt
from gdnbench.ray_cluster import RayUnavailable, run_on_ray
from gdnbench.report import render
from gdnbench.results import FAILED, UNFINISHED, Row, RunDir, RunDirError, RunFilesError, Status, load_run, run_field
from gdnbench.runner import RunOptions
from gdnbench.shards import ShardError, parse_shard, shard_cases
from gdnbench.suite import Case, Suite
from gdnbench.timing import TimingConfig, default_timer, measure_ceilings
from gdnbench.worker import WORKER_LOG, CaseWorker, WorkerPool, run_in_process


class DeviceOpt(str, Enum):
    cuda = "cuda"
    cpu = "cpu"


class TimerOpt(str, Enum):
    graph = "graph"
    events = "events"
    wall = "wall"


class L2Opt(str, Enum):
    cold = "cold"
    warm = "warm"


# the options of `gdnbench run`, each with its help
SuiteArg = Annotated[str, typer.Argument(
    metavar="SUITE", help="A suite YAML file, or a shipped suite's name (see `gdnbench list`).")]
BackendsOpt = Annotated[Optional[str], typer.Option(
    "--backends", "-b", help="Comma-separated backends to run instead of the suite's.")]
BaselineOpt = Annotated[Optional[str], typer.Option(
    help="Backend the speedups are relative to (default: the suite's, per op).")]
DeviceArg = Annotated[Optional[DeviceOpt], typer.Option(help="Default: cuda when a GPU is visible, else cpu.")]
TimerArg = Annotated[Optional[TimerOpt], typer.Option(
    help="graph: CUDA-graph replay, device time (GPU default). events: eager calls between CUDA events, launch "
         "overhead included. wall: CPU clock (the only one on CPU).")]
L2Arg = Annotated[Optional[L2Opt], typer.Option(help="cold: flush L2 before every sample (default); warm: don't.")]
FilterOpt = Annotated[Optional[str], typer.Option("--filter", "-k", help="Only cases whose id contains TEXT.")]
SeedOpt = Annotated[Optional[int], typer.Option(help="Input seed (default: the suite's).")]
OutOpt = Annotated[Optional[Path], typer.Option(help="Output directory (default: results/<suite>-<time>).")]
DumpOpt = Annotated[Optional[Path], typer.Option(
    help="Save each case's inputs and every backend's outputs (torch.save, one file per case) into DIR.")]
StrictOpt = Annotated[bool, typer.Option(help="Exit 1 on ERROR/OOM/TIMEOUT/CRASH rows too, not only on FAIL/NAN.")]
InterleaveOpt = Annotated[Optional[bool], typer.Option(
    "--interleave/--no-interleave",
    help="Time each case's backends in alternation (A B A B ...) so clock and thermal drift cancel in their "
         "ratio. Default: on when exactly two backends run with a baseline (an A/B run).")]
CopyReferenceOpt = Annotated[bool, typer.Option(
    "--copy-reference",
    help="Also time, beside every backend and in alternation with it, a device copy moving the case's bytes "
         "(the roofline model's): columns copy_us and pct_copy (copy time / backend time). pct_bw compares with "
         "a 1 GiB copy's rate, which no kernel reaches on a small problem: the timer's launch and the ramp weigh "
         "more there. Needs room for the copy's buffers.")]
ResumeOpt = Annotated[bool, typer.Option(
    help="Go on with the unfinished run in --out: the same command again runs only the cases it has no "
         "complete set of rows for (a case is never split between sessions); run.json lists the earlier "
         "sessions.")]
IsolateOpt = Annotated[bool, typer.Option(
    "--isolate/--no-isolate",
    help="Run the cases in a worker process (default), so that a backend that crashes, exits or hangs in native "
         "code becomes a CRASH or TIMEOUT row and the run goes on; its stderr goes to worker.log. --no-isolate "
         "runs them in this process (a debugger sees them; a crash ends the run).")]
RetryFailedOpt = Annotated[bool, typer.Option(
    "--retry-failed", help="With --resume: run again the cases that have a CRASH, TIMEOUT, ERROR or OOM row "
                           "(otherwise kept as they are).")]
HistoryOpt = Annotated[bool, typer.Option(
    "--history/--no-history", help="Append the run to the results history ($GDNBENCH_HISTORY, else "
                                   "results/history.sqlite; see `gdnbench history`).")]
GpusOpt = Annotated[Optional[str], typer.Option(
    "--gpus", help="Run on several GPUs at once: a worker per GPU, each taking the next case (largest first), "
                   "e.g. 0,1 or all. Rows say which GPU ran them. On a CPU, N numbers start N CPU workers.")]
RayOpt = Annotated[Optional[str], typer.Option(
    "--ray", help="Run the cases as Ray tasks, one GPU each, on the cluster at ADDRESS (auto, ray://host:10001) "
                  "or on a Ray started here for the run (local); needs `pip install gdnbench[ray]` on every node.")]
ShardOpt = Annotated[Optional[str], typer.Option(
    "--shard", help="Run shard I of N (e.g. 2/4): whole cases, dealt by estimated cost so the shards take about "
                    "equal time; `gdnbench merge` joins the shards' runs.")]
CheckOnlyOpt = Annotated[bool, typer.Option(
    "--check-only", help="A correctness sweep: check every backend on every case as always, but time one call of "
                         "each (no minimum time, no convergence), so the run takes about what compiling and "
                         "checking take. Its times say little; make no speedup claim from them.")]
ForceOpt = Annotated[bool, typer.Option(
    "--force", help="Replace the run in --out: delete its results, samples, run.json and the plot and report "
                    "made from them. Without it, an --out that holds a run exits 2.")]


def run(
    suite_spec: SuiteArg, backends: BackendsOpt = None, baseline: BaselineOpt = None, device: DeviceArg = None,
    timer: TimerArg = None, l2: L2Arg = None, filter_: FilterOpt = None, seed: SeedOpt = None,
    out: OutOpt = None, dump: DumpOpt = None, strict: StrictOpt = False, interleave: InterleaveOpt = None,
    copy_reference: CopyReferenceOpt = False, resume: ResumeOpt = False, isolate: IsolateOpt = True,
    retry_failed: RetryFailedOpt = False, history: HistoryOpt = True, gpus: GpusOpt = None, ray: RayOpt = None,
    shard: ShardOpt = None, check_only: CheckOnlyOpt = False, force: ForceOpt = False,
) -> None:
    """Run SUITE: every case on every backend, checked against the reference, then timed.

    Exit code: 0 all checked rows pass, 1 a row FAILs (or with --strict errors), 2 bad input,
    130 interrupted by Ctrl-C or SIGTERM (rows measured so far are saved; --resume goes on from them).
    """
    if retry_failed and not resume:
        die("--retry-failed goes with --resume")
    if resume and force:
        die("--resume goes on with the run in --out, --force replaces it: give one of them")
    sel = select(suite_spec, backends, filter_)
    suite, names, chosen, cases = sel.suite, sel.names, sel.backends, sel.cases
    cases, shard_meta = _shard(shard, cases) if shard is not None else (cases, None)
    if baseline is not None and baseline not in names:
        die(f"--baseline {baseline!r} is not among the backends run ({', '.join(names)})")
    wanted = {"prefill": baseline, "decode": baseline} if baseline is not None else suite.baselines()
    # rows carry each backend's own name; a suite baseline left out by --backends is dropped
    base = {op: chosen[names.index(b)].name for op, b in wanted.items() if b in names}

    dev = torch.device(device.value if device else ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and not torch.cuda.is_available():
        die("--device cuda: no CUDA device is visible to torch")
    if ray is not None and gpus is not None:
        die("--ray and --gpus: give one of them (Ray places the cases on its GPUs itself)")
    devices = _devices(gpus, dev, isolate) if gpus is not None else None
    dev = devices[0] if devices is not None else dev
    config = _timing_config(suite, dev, timer, l2, check_only)

    seed = seed if seed is not None else suite.seed
    if interleave is None:
        interleave = len(chosen) == 2 and bool(base)
    earlier = _earlier_run(out, {"suite.sha256": suite.sha256, "suite.filter": filter_,
                                 "backends": names, "seed": seed, "timing": config.__dict__,
                                 "interleave": interleave, "shard": shard_meta}) if resume else None
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    done: set[str] = set()
    try:
        if earlier is None:
            run_dir = RunDir.create(out, Path("results") / f"{suite.name}-{stamp}", force=force)
        else:
            run_dir, done = RunDir.resume(out, [b.name for b in chosen], UNFINISHED if retry_failed else frozenset())
    except (RunDirError, RunFilesError) as e:
        die(f"--out: {e}")
    ceilings = measure_ceilings(dev)
    meta = provenance.collect(
        dev, argv=["gdnbench", *sys.argv[1:]],
        suite={"name": suite.name, "path": suite.path, "sha256": suite.sha256, "cases": len(cases),
               "filter": filter_},
        backend_versions={b.name: b.version() for b in chosen})
    meta.update(seed=seed, backends=names, baseline=base, timing=config.__dict__,
                reference=suite.reference.model_dump(), tolerances=suite.tolerances.model_dump(),
                ceilings=ceilings, interleave=interleave, copy_reference=copy_reference, shard=shard_meta,
                gpus=[str(d) for d in devices] if devices is not None else None, status="running")
    if earlier is not None:
        # each earlier session's own provenance, and which cases' rows it measured
        meta.update(earlier_sessions=[*earlier.pop("earlier_sessions", []), earlier],
                    cases_from_earlier_sessions=[c.id for c in cases if c.id in done])
    run_dir.write_meta(meta)
    opts = RunOptions(device=dev, timing=config, baseline=base, seed=meta["seed"], dump_dir=dump,
                      ceilings=ceilings, interleave=interleave, copy_reference=copy_reference)

    todo = [c for c in cases if c.id not in done]
    kept = f" ({len(cases) - len(todo)} kept from the earlier session(s))" if earlier is not None else ""
    err_console.print(f"[bold]{suite.name}[/bold]: {len(todo)} cases{kept} x {len(chosen)} backends on "
                      f"{meta['device']['name']} ({config.timer} timer, L2 {config.l2}) -> {run_dir.path}")
    progress = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                        MofNCompleteColumn(), TimeElapsedColumn(), console=err_console, transient=True)
    task = progress.add_task("starting", total=len(todo) * len(chosen))
    specs = {b.name: n for n, b in zip(names, chosen)}
    loop = _Loop(run_dir, progress, task, chosen, suite, opts)
    worker = CaseWorker(run_dir.path / WORKER_LOG, specs) if isolate and devices is None and ray is None else None
    try:
        with sigterm_as_interrupt(), progress:
            if ray is not None:
                progress.update(task, description=f"{len(todo)} cases as Ray tasks")
                run_on_ray(ray, todo, specs, suite, opts, loop.done_on)
                meta["status"] = "complete"
            elif devices is not None:
                progress.update(task, description=f"{len(todo)} cases on {len(devices)} workers")
                WorkerPool(devices, run_dir.path, specs).run(todo, chosen, suite, opts, loop.done_on)
                meta["status"] = "complete"
            else:
                meta.update(loop.in_turn(todo, worker))
    except KeyboardInterrupt:
        meta["status"] = "interrupted"
    except RayUnavailable as e:
        meta["status"] = "interrupted"
        run_dir.write_meta(meta)
        die(str(e))
    finally:
        if worker is not None:
            worker.close()
        meta["finished_utc"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        run_dir.write_meta(meta)
        run_dir.close()

    _report(run_dir, meta, dump=dump, strict=strict, history=history)

def _timing_config(suite: Suite, dev: torch.device, timer: TimerOpt | None, l2: L2Opt | None,
                   check_only: bool = False) -> TimingConfig:
    """The suite's timing settings with --timer, --l2 and --check-only (one warm-up, one sample) applied, for
    ``dev``; exit 2 on a CPU with a GPU timer."""
    timer_name = timer.value if timer else suite.timing.timer
    if timer_name == "auto":
        timer_name = default_timer(dev)
    if dev.type == "cpu" and timer_name != "wall":
        die(f"timer {timer_name!r} needs a CUDA device; on cpu only 'wall' exists")
    t = suite.timing
    l2_mode = "warm" if dev.type == "cpu" else (l2.value if l2 else t.l2)  # no L2 flush on a CPU
    config = TimingConfig(timer=timer_name, l2=l2_mode, warmup=t.warmup, min_samples=t.min_samples,
                          max_samples=t.max_samples, min_time_s=t.min_time_s, max_time_s=t.max_time_s,
                          rel_ci=t.rel_ci)
    if check_only:
        return replace(config, warmup=1, min_samples=1, max_samples=1, min_time_s=0.0, max_time_s=0.0)
    return config


def _report(run_dir: RunDir, meta: dict, *, dump: Path | None, strict: bool, history: bool) -> NoReturn:
    """Add the run to the history, print its tables and exit with the run's code."""
    if history and run_dir.rows:
        _remember(run_dir.path)
    if not run_dir.rows:
        err_console.print("interrupted before any case finished; nothing measured")
        raise typer.Exit(EXIT_INTERRUPTED)
    df, _ = load_run(run_dir.path)
    render(df, meta, console)
    console.print(f"saved: {run_dir.path}/results.csv, run.json, samples.jsonl"
                  + (f"; dumps in {dump}" if dump else ""))
    if meta["status"] == "interrupted":
        raise typer.Exit(EXIT_INTERRUPTED)
    failing = FAILED if strict else {Status.FAIL, Status.NAN}
    broken = meta["status"] == "device lost" or df["status"].isin(failing).any()
    raise typer.Exit(EXIT_FAIL if broken else EXIT_OK)


def _earlier_run(out: Path | None, expect: dict[str, object]) -> dict:
    """run.json of the unfinished run that --resume goes on with; exit 2 unless this command would have
    run the same cases the same way (``expect``: dotted run.json fields and the values they must have)."""
    if out is None:
        die("--resume needs --out DIR: the run to go on with")
    try:
        meta = json.loads((out / "run.json").read_text()) if (out / "run.json").is_file() else {}
    except (OSError, ValueError) as e:
        die(f"--resume: {out}/run.json: {e}")
    if not meta:
        die(f"--resume: {out} has no run.json")
    if meta.get("status") == "complete":
        die(f"--resume: the run in {out} is complete; nothing to go on with")
    for field, want in expect.items():
        have = run_field(meta, field)
        if have != want:
            die(f"--resume: {out}/run.json: {field} is {have!r}, this command's is {want!r}; a run goes on "
                f"with the same suite, filter, backends, seed and timing")
    return meta


def _remember(run_path: Path) -> None:
    """Append the run to the history; a history that cannot be written is a warning, never a failed run."""
    db = default_history()
    try:
        record(connect(db), run_path)
    except (sqlite3.Error, OSError, RunFilesError) as e:
        err_console.print(f"warning: the run was not added to the history {db}: {e}", style="yellow",
                          markup=False, highlight=False)


def _shard(spec: str, cases: list[Case]) -> tuple[list[Case], dict]:
    """--shard I/N: the shard's cases, and what run.json records of it."""
    try:
        index, count = parse_shard(spec)
    except ShardError as e:
        die(str(e))
    mine = shard_cases(cases, index, count)
    if not mine:
        die(f"--shard {index}/{count}: no case falls to this shard ({len(cases)} cases in all)")
    return mine, {"index": index, "count": count, "cases": [c.id for c in mine]}


def _devices(spec: str, dev: torch.device, isolate: bool) -> list[torch.device]:
    """--gpus: 'all' or comma-separated indices; on a CPU, as many CPU workers as indices given."""
    if not isolate:
        die("--gpus runs a worker per GPU: it cannot go with --no-isolate")
    if dev.type == "cpu":
        count = len([x for x in spec.split(",") if x.strip()])
        if spec.strip() == "all" or count < 1:
            die("--gpus on a CPU: give indices (0,1 starts two CPU workers)")
        return [dev] * count
    available = torch.cuda.device_count()
    if spec.strip() == "all":
        return [torch.device("cuda", i) for i in range(available)]
    try:
        indices = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        die(f"--gpus {spec!r}: expected 'all' or GPU indices such as 0,1")
    bad = [i for i in indices if not 0 <= i < available] + [i for i in set(indices) if indices.count(i) > 1]
    if bad or not indices:
        die(f"--gpus {spec!r}: this machine has GPUs 0..{available - 1}, each given once")
    return [torch.device("cuda", i) for i in indices]


@dataclass
class _Loop:
    """The run's cases through a worker (or in this process) one at a time, or through a pool of workers."""

    run_dir: RunDir
    progress: Progress
    task: TaskID
    backends: list[Backend]
    suite: Suite
    opts: RunOptions

    def in_turn(self, todo: list[Case], worker: CaseWorker | None) -> dict[str, str]:
        """Run ``todo`` in order; the run.json fields that say how it ended."""
        execute = worker.run_case if worker is not None else run_in_process
        for case in todo:
            rows, samples, lost = execute(case, self.backends, self.suite, self.opts, on_step=self._step)
            self._add(rows, samples)
            if lost and worker is not None:  # the next case gets a fresh worker, with a context of its own
                self._lost(case, lost, "a new worker goes on")
            elif lost:
                culprit = next((f"{r.backend}: {r.error}" for r in rows if r.status == Status.ERROR), lost)
                reason = f"the GPU context was lost during case {case.id} ({culprit}); rerun without that backend"
                err_console.print(reason, style="bold red", markup=False, highlight=False)
                for rest in todo[todo.index(case) + 1:]:
                    self.run_dir.add_case(runner.not_run_rows(rest, self.backends, self.suite, self.opts.device,
                                                              reason), [])
                return {"status": "device lost", "device_lost": reason}
        return {"status": "complete"}

    def done_on(self, case: Case, rows: list[Row], samples: list[dict], lost: str | None, where: str) -> None:
        """A case finished by a pool's worker: its rows say which worker and device ran them."""
        for row in rows:
            row.note = "; ".join(filter(None, [row.note, f"ran by {where}"]))
        self._add(rows, samples)
        if lost:
            self._lost(case, lost, f"{where} goes on with a new process")

    def _step(self, desc: str) -> None:
        self.progress.update(self.task, description=desc[:90])

    def _add(self, rows: list[Row], samples: list[dict]) -> None:
        self.run_dir.add_case(rows, samples)
        self.progress.advance(self.task, len(self.backends))

    def _lost(self, case: Case, lost: str, then: str) -> None:
        err_console.print(f"the GPU context was lost during case {case.id} ({lost}); {then}", style="red",
                          markup=False, highlight=False)

"""The bundled kernels at a git revision against the working tree's, timed side by side.

For whoever changes a kernel next. ``git show REV:kernels/*.py`` is written to a temporary package and
imported under its own name next to ``gdnbench_kernels``, and so is REV's adapter module of each backend
given with -b (the two change together: an adapter calls its kernels' functions); then, for every case of
SUITE that matches -k and every such backend, the backend is prepared (and autotuned) twice, REV's adapter
on REV's package and the tree's on the tree's, checked against the suite's reference, and the two calls are
timed interleaved (A B A B ...) with ``gdnbench run``'s timer (graph replay, L2 flushed). One row per (case,
backend): both medians, REV's time over the tree's (> 1: the working tree is faster), each side's relative
RMS error of the output and the state and, where the two sides ran different code paths or configs (each
side is autotuned on its own), both paths.

    python -m examples.kernel_sweeps.revision_ab parity --rev HEAD~1
    python -m examples.kernel_sweeps.revision_ab qwen3-next -k "B=1,T=16384" --rev 09b996c -b triton.chunk

Both sides run in one process, so their ratio is free of the drift between machines and runs that
separate ``gdnbench run`` invocations carry. The backends find their kernels by importing
``gdnbench_kernels`` when they prepare a problem, which this swaps for REV's package meanwhile: it reaches
into the harness and is not part of it (REV's adapters run on the tree's harness). On a CPU
(TRITON_INTERPRET=1, ``--device cpu``) it runs in Triton's interpreter: a correctness check of both sides,
with wall-clock times that mean nothing.
"""

from __future__ import annotations

import contextlib
import importlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from gdnbench.backends import Backend, Prepared, UnknownBackend, get_backend
from gdnbench.check import Gate, reference_outputs
from gdnbench.problem import Problem, make_problem
from gdnbench.results import Status
from gdnbench.runner import select_cases
from gdnbench.suite import load_suite
from gdnbench.timing import measure_interleaved

from .common import add_case_arguments, sweep_timing, tool_parser

PACKAGE = "gdnbench_kernels"
ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str:
    run = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"revision_ab: git {' '.join(args)} failed: {run.stderr.strip()}")
    return run.stdout


@contextlib.contextmanager
def kernels_at(rev: str) -> Iterator[tuple[str, ModuleType]]:
    """(REV's short sha, REV's kernels/ imported as a package of its own), for the block's duration."""
    sha = _git("rev-parse", "--short", f"{rev}^{{commit}}").strip()
    files = [f for f in _git("ls-tree", "-r", "--name-only", f"{sha}:kernels").split() if f.endswith(".py")]
    name = f"{PACKAGE}_at_{sha}"
    with tempfile.TemporaryDirectory() as tmp:  # triton reads each kernel's source back: keep it on disk
        pkg_dir = Path(tmp) / name
        for f in files:
            (pkg_dir / f).parent.mkdir(parents=True, exist_ok=True)
            (pkg_dir / f).write_text(_git("show", f"{sha}:kernels/{f}"))
        sys.path.insert(0, tmp)
        try:
            pkg = importlib.import_module(name)
            for f in files:  # the backends reach the kernel modules as the package's attributes
                module = f[:-3].replace("/", ".").removesuffix(".__init__").removesuffix("__init__")
                if module:
                    importlib.import_module(f"{name}.{module}")
            yield sha, pkg
        finally:
            sys.path.remove(tmp)


def backend_at(sha: str, pkg: ModuleType, b: Backend) -> Backend:
    """REV's version of the bundled backend b: its adapter module at sha, imported as a module of pkg,
    REV's kernel package (``kernels_at``; the ``@backend`` decorator registers nothing: the registry
    reads entry points). b itself where that revision has no such module or function."""
    module, attr = b.prepare.__module__, b.prepare.__name__
    path = module.replace(".", "/") + ".py"
    if path not in _git("ls-tree", "-r", "--name-only", sha, path).split():
        return b
    local = f"adapter_{module.rsplit('.', 1)[-1]}"
    (Path(pkg.__path__[0]) / f"{local}.py").write_text(_git("show", f"{sha}:{path}"))
    found = getattr(importlib.import_module(f"{pkg.__name__}.{local}"), attr, None)
    return found if isinstance(found, Backend) else b


def _prepare_with(pkg: ModuleType, b: Backend, p: Problem) -> Prepared:
    """b.prepare(p) with ``gdnbench_kernels`` standing for pkg (the calls keep the modules they bound)."""
    own = importlib.import_module(PACKAGE)
    sys.modules[PACKAGE] = pkg
    try:
        return b.prepare(p)
    finally:
        sys.modules[PACKAGE] = own


def compare(suite: str, pattern: str | None, rev: str, backends: list[str], device: torch.device) -> None:
    try:
        chosen = [get_backend(n) for n in backends]
    except UnknownBackend as e:
        raise SystemExit(f"revision_ab: {e}") from None
    s = load_suite(suite)
    tree = importlib.import_module(PACKAGE)
    with kernels_at(rev) as (sha, old):
        print(f"case  backend  {sha} us  tree us  {sha}/tree  err o {sha}/tree  err state {sha}/tree")
        for case in select_cases(s, pattern):
            for b in chosen:
                reason = b.unavailable() or b.unsupported(case, device)
                if reason:
                    print(f"{case.id}  {b.name}  SKIP: {reason}")
                    continue
                p = make_problem(case, s.seed, device)
                gate = Gate(p, reference_outputs(p, s.reference), s.tolerances)
                sides = [_prepare_with(old, backend_at(sha, old, b), p), _prepare_with(tree, b, p)]
                errs = []
                for prepared in sides:  # one call from the initial state each, checked as gdnbench run checks
                    if prepared.reset is not None:
                        prepared.reset()
                    prepared.call()
                    errs.append(gate.check(prepared.outputs()))
                ms = measure_interleaved([(x.call, x.reset) for x in sides], device=device,  # resets as it samples
                                         config=sweep_timing(device))
                t_old, t_new = (float(np.median(m.samples_us)) for m in ms)
                print(row(case.id, b.name, t_old, t_new, errs, [x.path for x in sides]), flush=True)


def row(case_id: str, backend: str, t_old: float, t_new: float, checks: list, paths: list[str]) -> str:
    """One line of the table: both medians and their ratio, each side's errors (and statuses where one did
    not PASS) and, where they differ, the parts of each side's code path that differ: the autotuner may
    have picked another config on each side, and the ratio then says as much about the picks as about the
    kernels."""

    def err(name: str) -> str:
        return "/".join("-" if getattr(r, name) is None else f"{getattr(r, name):.1e}" for r in checks)

    line = (f"{case_id}  {backend}  {t_old:.1f}  {t_new:.1f}  {t_old / t_new:.3f}  {err('rel_err_o')}"
            f"  {err('rel_err_state')}")
    if not all(r.status == Status.PASS for r in checks):
        line += "  " + "/".join(r.status for r in checks) + f" ({'; '.join(r.message for r in checks if r.message)})"
    if paths[0] != paths[1]:  # the parts ("; "-separated) that differ, e.g. the configs
        parts = [p.split("; ") for p in paths]
        line += "  paths: " + " | ".join("; ".join(x for x in mine if x not in other) or "-"
                                         for mine, other in (parts, parts[::-1]))
    return line


def main(argv: list[str] | None = None) -> None:
    parser = tool_parser(__doc__)
    add_case_arguments(parser)
    parser.add_argument("--rev", required=True, help="the git revision whose kernels/ to compare with (HEAD~1, a sha)")
    parser.add_argument("-b", "--backend", action="append",
                        help="a bundled backend to run on both (repeatable; default: triton.chunk_fused)")
    args = parser.parse_args(argv)
    compare(args.suite, args.filter, args.rev, args.backend or ["triton.chunk_fused"], torch.device(args.device))


if __name__ == "__main__":
    main()

"""Subprocesses that run Triton kernels under TRITON_INTERPRET=1 beside the other tests.

The interpreter runs on one core and is slow: the chunk kernels' cases take minutes on a 2-core CI machine.
So a test module that needs one defines ``start_interpreted(tmp) -> InterpretedRun | None`` and a
module-scoped fixture ``interpreted`` that reads it; conftest.py starts every collected module's
subprocess with the session and runs the tests that use ``interpreted`` last, so the rest of the suite
runs beside them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
import yaml

from tests import SUBPROCESS_TIMEOUT_S

ROOT = Path(__file__).resolve().parent.parent


class InterpretedRun:
    """``python -m ARGS`` under TRITON_INTERPRET=1, started now; ``out`` is where it writes its results."""

    def __init__(self, args: list[str], out: Path) -> None:
        env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONWARNINGS": "ignore"}
        self.proc = subprocess.Popen([sys.executable, "-m", *args], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.out = out
        self._log: str | None = None

    def wait(self) -> Path:
        """Waits for the subprocess and fails with the tail of its output unless it exited 0; returns ``out``."""
        if self._log is None:
            self._log, _ = self.proc.communicate(timeout=SUBPROCESS_TIMEOUT_S)
        assert self.proc.returncode == 0, self._log[-6000:]
        return self.out

    def stop(self) -> None:
        """Kills it if still running (a selection that ran none of its tests, or a failed session)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def start_worker(module: str, tmp: Path, cases: list[dict], suite: dict) -> InterpretedRun:
    """A kernel test module run as a script (its ``_worker``) on the kernel cases and a suite written to tmp:
    ``python -m MODULE in.pt out.pt s.yaml run``."""
    torch.save(cases, tmp / "in.pt")
    (tmp / "s.yaml").write_text(yaml.safe_dump(suite))
    return InterpretedRun([module, *(str(tmp / name) for name in ("in.pt", "out.pt", "s.yaml", "run"))], tmp)


def worker_results(run: InterpretedRun) -> dict:
    """What a ``start_worker`` subprocess saved, with ``run_dir``: its ``gdnbench run`` output folder."""
    tmp = run.wait()
    results = torch.load(tmp / "out.pt", weights_only=False)
    results["run_dir"] = tmp / "run"
    return results

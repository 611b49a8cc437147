"""Where and how a run was measured (docs/design.md, "Measurement"): device, clocks, versions, git, command."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from gdnbench import telemetry

REPO = Path(__file__).resolve().parent.parent
NVSMI_FIELDS = ("driver_version", "clocks.sm", "clocks.mem", "clocks.max.sm", "power.draw", "power.limit",
                "temperature.gpu", "pstate")


def collect(device: torch.device, *, argv: list[str], suite: dict[str, Any],
            backend_versions: dict[str, str | None]) -> dict[str, Any]:
    """Everything needed to tell where, how and with what a run was measured."""
    return {
        "created_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(argv),
        "suite": suite,
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "versions": {
            "gdnbench": _version("gdnbench"), "torch": torch.__version__, "triton": _version("triton"),
            "cuda_runtime": torch.version.cuda, **{f"backend:{k}": v for k, v in backend_versions.items()},
        },
        "git": git_state(),
        "device": device_info(device),
    }


def device_info(device: torch.device) -> dict[str, Any]:
    if device.type != "cuda":
        return {"type": "cpu", "name": platform.processor() or platform.machine(),
                "threads": torch.get_num_threads()}
    props = torch.cuda.get_device_properties(device)
    info: dict[str, Any] = {
        "type": "cuda", "name": props.name, "sm_count": props.multi_processor_count,
        "compute_capability": f"{props.major}.{props.minor}",
        "memory_gib": round(props.total_memory / 2**30, 1),
        "l2_bytes": getattr(props, "L2_cache_size", None),
    }
    info.update(_nvidia_smi(device.index or 0))
    info["telemetry"] = telemetry.unavailable(device) or "nvml"
    return info


def _nvidia_smi(index: int) -> dict[str, str]:
    """Driver, clocks, power and temperature, read through nvidia-smi (NVML) when it is there."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    try:
        out = subprocess.run([exe, f"--id={index}", f"--query-gpu={','.join(NVSMI_FIELDS)}",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    values = [v.strip() for v in out.stdout.strip().split(",")]
    return dict(zip(NVSMI_FIELDS, values)) if out.returncode == 0 and len(values) == len(NVSMI_FIELDS) else {}


def git_state() -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            r = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    if os.environ.get("GDNBENCH_GIT_SHA"):
        # a copy of the tree shipped to a GPU box, whose .git (if any) need not match: the sender says
        # which commit it is, and that wins
        return {"sha": os.environ["GDNBENCH_GIT_SHA"], "dirty": None, "source": "GDNBENCH_GIT_SHA"}
    sha = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"sha": sha, "dirty": bool(status) if status is not None else None, "source": "git"}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None

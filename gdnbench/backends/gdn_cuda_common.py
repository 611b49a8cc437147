"""Shared by the two adapters to kingsleykimm/h100_gdn_cuda (``gdn_cuda.chunk``, ``gdn_cuda.recurrent``).

Read at commit afe3ded (2026-03-06); the library is not on PyPI. Its Python module ``gdn_cuda`` is a
pybind11 extension (``csrc/python_api.cpp``) whose kernels are header-only and compiled at run time,
so ``gdn_cuda.init(library_root, cuda_home)`` must run before the first call:

* ``library_root`` is the folder whose ``include/`` holds the kernels' headers (``gdn_cuda/``) and the
  CUTLASS headers (``cutlass/``, ``cute/``; ``./develop.sh`` links them there): ``<checkout>/gdn_cuda``.
  Found, in order, from ``GDN_CUDA_ROOT``, from the library's own ``LIBRARY_ROOT_PATH`` (``.example_env``),
  or beside the imported module, where ``./develop.sh`` links the built ``gdn_cuda*.so`` (the checkout's
  root). A wheel from ``./install.sh`` ships the module alone, so it needs one of the variables.
* ``cuda_home`` is the toolkit whose ``bin/nvcc`` the JIT runs (the NVRTC compiler too, to read the
  toolkit's version): ``CUDA_HOME_PATH``, else ``CUDA_HOME``, else ``/usr/local/cuda``, as the library's
  own scripts resolve it.

The JIT is nvcc unless ``JIT_USE_NVRTC`` is a non-zero integer (read by the library, ``csrc/jit/compiler.hpp``);
compiled kernels are cached under ``JIT_CACHE_DIR`` (default ``~/.gdn_cuda``).

Common envelope: every host wrapper dispatches on ``if (major == 9)`` with no other branch
(``csrc/apis/gdn.hpp``), so on any other GPU a call returns uninitialised tensors: SM90 only. The
kernels read bf16 through TMA descriptors. Nothing here imports ``gdn_cuda`` at module import time.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

PACKAGE = "gdn-cuda"  # the distribution ./install.sh installs; ./develop.sh installs none (no version then)
DTYPES = ("bf16",)
ARCHS = ((9, 0),)
ROOT_VARS = ("GDN_CUDA_ROOT", "LIBRARY_ROOT_PATH")
CUDA_VARS = ("CUDA_HOME_PATH", "CUDA_HOME")
DEFAULT_CUDA_HOME = "/usr/local/cuda"
HEADERS = ("gdn_cuda", "cutlass", "cute")  # what the JIT includes from library_root/include


def _missing_headers(root: Path) -> list[str]:
    return [name for name in HEADERS if not (root / "include" / name).is_dir()]


def _beside_module() -> Path | None:
    """``<folder of the imported module>/gdn_cuda``: the library root when ./develop.sh linked the module
    into the checkout's root (``__file__`` keeps the link's path)."""
    try:
        import gdn_cuda
    except Exception:  # not importable here: Backend.unavailable() gives that reason
        return None
    file = getattr(gdn_cuda, "__file__", None)
    return Path(file).parent / "gdn_cuda" if file else None


def library_root() -> Path:
    """``gdn_cuda.init``'s library_root; raises LookupError saying what to set."""
    for var in ROOT_VARS:
        if os.environ.get(var):
            root = Path(os.environ[var])
            missing = _missing_headers(root)
            if missing:
                raise LookupError(f"{var}={root}, but {root / 'include'} has no {', '.join(missing)} "
                                  "(the library's gdn_cuda/ folder, where ./develop.sh links CUTLASS's cutlass/ "
                                  "and cute/)")
            return root
    beside = _beside_module()
    if beside is not None and not _missing_headers(beside):
        return beside
    raise LookupError("no gdn_cuda library root: set GDN_CUDA_ROOT to <h100_gdn_cuda checkout>/gdn_cuda, the "
                      "folder whose include/ holds gdn_cuda/, cutlass/ and cute/ (./develop.sh links CUTLASS there)")


def cuda_home() -> Path:
    """``gdn_cuda.init``'s cuda_home; raises LookupError when it has no ``bin/nvcc``."""
    home = Path(next((os.environ[v] for v in CUDA_VARS if os.environ.get(v)), DEFAULT_CUDA_HOME))
    if not (home / "bin" / "nvcc").is_file():
        raise LookupError(f"no nvcc at {home / 'bin' / 'nvcc'}, which gdn_cuda's JIT runs: set CUDA_HOME_PATH "
                          "or CUDA_HOME to the CUDA toolkit")
    return home


def runtime_unavailable(name: str) -> str | None:
    """A SKIP reason when gdn_cuda imports but its JIT could not compile: no library root or no nvcc."""
    try:
        library_root()
        cuda_home()
    except LookupError as e:
        return f"{name}: {e}"
    return None


def init() -> None:
    """Point the library's JIT at its headers and toolkit; in ``prepare``, before the first (compiling) call."""
    import gdn_cuda

    gdn_cuda.init(library_root=str(library_root()), cuda_home=str(cuda_home()))


def jit_note() -> str:
    """Which compiler the JIT builds kernels with, read as the library reads ``JIT_USE_NVRTC`` (C's atoi)."""
    number = re.match(r"\s*[+-]?\d+", os.environ.get("JIT_USE_NVRTC", ""))
    return "NVRTC JIT" if number and int(number.group()) else "nvcc JIT"


def preload_note() -> str:
    """The libraries preloaded into the process (``LD_PRELOAD``), which the row names: on some images ``init``
    runs only with the system's libstdc++ preloaded (docs/offline-gpu.md)."""
    preload = os.environ.get("LD_PRELOAD", "").strip()
    return f", LD_PRELOAD={preload}" if preload else ""


def padding_note(head_dim: int) -> str:
    """Both calls zero-pad q, k, v (and the initial state) to a multiple of 64 with torch::pad inside the
    call, so in the timed region (``csrc/apis/gdn_forward.cpp``); the row says so where it happens."""
    aligned = -(-head_dim // 64) * 64
    return f"; K=V={head_dim} zero-padded to {aligned} inside the call (timed)" if aligned != head_dim else ""

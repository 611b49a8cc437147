"""Whether Triton runs the bundled kernels in its CPU interpreter.

Triton decides between compiling and interpreting when a kernel is decorated, from TRITON_INTERPRET at
that moment; ``triton_interpreter_on`` reads the variable now, ``runs_interpreted`` what a kernel got.
"""

from __future__ import annotations

import os


def triton_interpreter_on() -> bool:
    """Whether TRITON_INTERPRET asks Triton to run kernels in its CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on", "yes")


def runs_interpreted(kernel: object) -> bool:
    """Whether a ``triton.jit`` kernel was built for the interpreter (decided when it was decorated)."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover - older layouts of triton
        return triton_interpreter_on()
    return isinstance(kernel, InterpretedFunction)

"""Ahead-of-time compilation of a Triton kernel for sm_90 on a machine without a GPU.

The Triton interpreter runs Python, not Triton's code generator: compiling to a cubin is how the CPU
tests know a kernel also builds for Hopper. ``compile_sm90`` skips the calling test where that cannot
be done here (the kernel module was imported under TRITON_INTERPRET, or triton lacks the API).
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from unittest import mock

import pytest


def compile_sm90(fn, signature: dict[str, str], constexprs: dict, *, interpreted: bool, num_warps: int = 4,
                 num_stages: int = 2, maxnreg: int | None = None):
    """triton.compile(fn) for GPUTarget("cuda", 90, 32); fn: a jit function (a TunedKernel's is unwrapped) or
    a Gluon one.

    signature: every argument's type ("*bf16", "i32", "constexpr", ...); maxnreg: the launch's register cap (a
    warp-specialized kernel's partitions split it with setmaxnreg); interpreted: the kernel
    module's INTERPRETED flag. Pointer arguments are taken as 16-byte aligned (``tt.divisibility``),
    as the JIT specializes them for torch tensors: without it every tile load compiles to scalar
    loads, no load is pipelined and the register counts nearly double. Fails where ptxas serialized the kernel's
    wgmmas.
    """
    import triton

    if interpreted:
        pytest.skip("this process imported the kernel under TRITON_INTERPRET")
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as e:
        pytest.skip(f"no triton ahead-of-time compile API here: {e}")
    if tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 5):
        pytest.skip("the ASTSource signature format used here is triton >= 3.5's")
    from gdnbench_kernels.common.tuning import TunedKernel

    if isinstance(fn, TunedKernel):
        fn = fn.fn
    source = ASTSource
    if fn.is_gluon():
        from triton.experimental.gluon._runtime import GluonASTSource as source
    aligned = {(i,): [["tt.divisibility", 16]] for i, arg in enumerate(fn.arg_names) if signature[arg].startswith("*")}
    options = {"num_warps": num_warps, "num_stages": num_stages, **({"maxnreg": maxnreg} if maxnreg else {})}
    # compiled afresh, so that ptxas runs and triton prints its log, read here: no kernel may have its wgmmas serialized
    # (C7512: too few registers to keep a wgmma's operands live while it runs), which nothing says at run time and
    # which cost the warp-specialized kernel 3-10% (docs/decisions/0004-gpu-tests-after-kernel-changes.md)
    with tempfile.TemporaryDirectory() as cache, contextlib.redirect_stdout(io.StringIO()) as log, \
            mock.patch.dict(os.environ, {"TRITON_CACHE_DIR": cache, "TRITON_DUMP_PTXAS_LOG": "1"}):
        compiled = triton.compile(source(fn=fn, signature=signature, constexprs=constexprs, attrs=aligned),
                                  target=GPUTarget("cuda", 90, 32), options=options)
    assert "cubin" in compiled.asm and ".reg" in compiled.asm["ptx"]
    assert "registers" in log.getvalue(), f"no ptxas log to read: {log.getvalue()!r}"
    assert "C7512" not in log.getvalue(), log.getvalue()
    return compiled

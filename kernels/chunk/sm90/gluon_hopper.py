"""What the Gluon kernels for Hopper (``walk``, ``prep``, ...) share: Gluon's imports (a
triton without Gluon leaves GLUON_MISSING set and the Triton kernels run instead), the TMA copies and the barrier
under the names of any triton from 3.6 on, exp and 2^x as one instruction each, TMA descriptors over token-major
tensors, and the check every such kernel starts from."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, mma_v2, tma,
                                                                   warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError as e:  # a triton without Gluon
    GLUON_MISSING: str | None = f"triton without Gluon for Hopper ({e})"
else:
    GLUON_MISSING = None

__all__ = ["GLUON_MISSING", "gluon", "gl", "fence_async_shared", "mbarrier", "mma_v2", "tma", "warpgroup_mma",
           "warpgroup_mma_wait", "tma_load", "tma_store", "cta_barrier", "exp", "exp2", "LOG2E", "unhoisted",
           "descriptor", "sm_count", "unsupported_inputs"]

if GLUON_MISSING is None:
    # renamed after triton 3.6: TMA copies (async_copy_global_to_shared -> async_load, ...)
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier  # likewise thread_barrier -> barrier
    LOG2E = gl.constexpr(1.4426950408889634)  # gates kept in log2 units take one bare ex2 each (exp2)

    @gluon.jit
    def exp2(x):
        """2^x of fp32 x as one ex2.approx.ftz."""
        return gl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=gl.float32, is_pure=True,
                                         pack=1)

    @gluon.jit
    def exp(x):
        """exp of fp32 x as one ex2.approx.ftz (common.device.exp's)."""
        return exp2(x * LOG2E)

    @gluon.jit
    def unhoisted(x):
        """int32 x through an asm the compiler may not move, so that a mask built from it stays in the loop that
        uses it: a mask of loop-invariant indices is hoisted out of the loop, and ptxas, short of predicate
        registers, rebuilds it bit by bit every iteration, a chain of about 100 dependent instructions
        (specialized's prep)."""
        return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=gl.int32, is_pure=False, pack=1)


@functools.cache
def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


@functools.cache
def sm_count(device: torch.device) -> int:
    """The GPU's streaming multiprocessors."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def unsupported_inputs(q: Tensor) -> str | None:
    """Why no sm_90 Gluon kernel can take inputs like q (None: one can): Gluon, an sm_90 GPU, bf16 or fp16."""
    if GLUON_MISSING:
        return GLUON_MISSING
    if q.device.type != "cuda" or _capability(q.device) != (9, 0):
        return "needs an sm_90 GPU"
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"needs bf16 or fp16 inputs, got {q.dtype}"
    return None


def descriptor(x: Tensor, block: list[int]) -> TensorDescriptor:
    """A TMA descriptor of block tiles over x [tokens, heads * dim] (contiguous, bf16 or fp16)."""
    return TensorDescriptor(x, list(x.shape), [x.shape[1], 1], block, _tile_layout(tuple(block), x.dtype))


@functools.cache  # two thirds of a descriptor's host time, made every call otherwise
def _tile_layout(block: tuple[int, ...], dtype: torch.dtype) -> gl.NVMMASharedLayout:
    """The shared-memory layout of block tiles of dtype (bf16 or fp16) that TMA and wgmma take."""
    return gl.NVMMASharedLayout.get_default_for(list(block), gl.bfloat16 if dtype == torch.bfloat16 else gl.float16)

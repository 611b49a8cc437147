"""Triton device math shared by the recurrent and the chunked kernels.

Each helper computes what a GPU computes, also under the interpreter: where the interpreter differs (no
libdevice, no inline PTX, a truncating bf16 cast, a wrong bf16 ``tl.dot``) the helper takes an exact path
there, chosen when this module is imported (``common.interpreter``).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.language.extra import libdevice

from .interpreter import triton_interpreter_on

__all__ = ["EPS", "FP32_DOT", "FP32_DOT_PRECISIONS", "cast", "softplus", "sigmoid", "dot", "exp"]

_INTERPRETED = triton_interpreter_on()

EPS: tl.constexpr = tl.constexpr(1e-6)  # q/k L2 norm: x * rsqrt(sum(x^2) + eps), as gdnbench.reference.l2norm
# Raw gating's softplus and sigmoid with the hardware's approximate log and division when compiled (the
# interpreter has no libdevice: exact ones there): 31-33 fewer instructions per token in the recurrent
# kernel's token loop, of the 59-74 that raw gating adds to it (sm_90 SASS, T > 1).
_FAST_GATE: tl.constexpr = tl.constexpr(not _INTERPRETED)
# The interpreter's fp32 -> bf16 cast truncates (a GPU rounds to nearest even), which would put a bf16
# state a whole rounding step off the reference: under the interpreter ``cast`` rounds itself.
_SOFT_BF16_RNE: tl.constexpr = tl.constexpr(_INTERPRETED)
# The interpreter's tl.dot on bf16 operands returns garbage: there, bf16 dots run on fp32 copies
# (exact products, fp32 accumulation: what a GPU's bf16 MMA computes).
_UPCAST_BF16_DOT: tl.constexpr = tl.constexpr(_INTERPRETED)
# The interpreter runs no inline PTX: there, ``exp`` is tl.exp.
_PTX_EXP: tl.constexpr = tl.constexpr(not _INTERPRETED)
# fp32 operands' products: "bf16x3" by default (three bf16 products: at twice TF32's rate, 16 of fp32's 24
# significand bits), "tf32x3" (three TF32 products), "tf32" (one, FLA's choice) or "ieee" (CUDA cores), set with
# GDNBENCH_FP32_DOT before the kernels are imported (docs/decisions/0023-fp32-dots.md).
FP32_DOT_PRECISIONS = ("bf16x3", "tf32x3", "tf32", "ieee")
FP32_DOT = os.environ.get("GDNBENCH_FP32_DOT", "bf16x3")
if FP32_DOT not in FP32_DOT_PRECISIONS:
    raise ValueError(f"GDNBENCH_FP32_DOT must be one of {FP32_DOT_PRECISIONS}, got {FP32_DOT!r}")
# the interpreter takes no "bf16x3" and computes every fp32 product in fp32 whatever the precision asked
_FP32_DOT: tl.constexpr = tl.constexpr("ieee" if _INTERPRETED and FP32_DOT == "bf16x3" else FP32_DOT)


@triton.jit
def cast(x, dtype: tl.constexpr):
    """x.to(dtype), fp32 -> bf16 rounded to nearest even everywhere."""
    if _SOFT_BF16_RNE and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + (0x7FFF + ((bits >> 16) & 1))
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(dtype)


@triton.jit
def softplus(x):
    # torch.nn.functional.softplus (beta 1, threshold 20): log1p(exp(x)), x itself above 20. log1p(y) is
    # its series where log(1 + y) would lose y's digits (y < 2^-7; the series' error is below y^4 / 4).
    y = tl.exp(tl.minimum(x, 20.0))
    lp = tl.where(y < 0.0078125, y * (1.0 - y * (0.5 - y * 0.33333334)), _log(1.0 + y))
    return tl.where(x > 20.0, x, lp)


@triton.jit
def sigmoid(x):
    return _reciprocal(1.0 + tl.exp(-x))


@triton.jit
def _log(x):
    if _FAST_GATE:
        return libdevice.fast_logf(x)
    else:
        return tl.log(x)


@triton.jit
def _reciprocal(x):
    if _FAST_GATE:
        return libdevice.fast_dividef(1.0, x)
    else:
        return 1.0 / x


@triton.jit
def dot(a, b, FP32: tl.constexpr):
    """a @ b with fp32 accumulation. FP32 (fp32 operands): by default three bf16 tensor-core products (each
    operand split into a bf16 high part and the bf16 remainder, the low x low product dropped), 16 of fp32's 24
    significand bits at a fraction of the CUDA-core FMA's time, where one TF32 product keeps 11; or the same split
    into TF32 parts; ``FP32_DOT`` says which (docs/decisions/0023-fp32-dots.md)."""
    if _UPCAST_BF16_DOT and a.dtype == tl.bfloat16:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif FP32:
        return tl.dot(a, b, input_precision=_FP32_DOT)
    else:
        return tl.dot(a, b)


@triton.jit
def exp(x):
    """exp(x) of fp32 x as one MUFU.EX2 (and the log2(e) multiply): ``ex2.approx.ftz`` flushes results
    below 2^-126 to 0, where tl.exp's ``ex2.approx`` spends three more instructions per element keeping them
    subnormal (a compare and two predicated multiplies, in sm_90 SASS). Same accuracy above that; the
    decays that small are 0 for every use here. exp(-inf) is 0."""
    if _PTX_EXP:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x * 1.4426950408889634],
                                         dtype=tl.float32, is_pure=True, pack=1)
    else:
        return tl.exp(x)

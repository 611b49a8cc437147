"""Integer helpers for host code (grids, tile widths, chunk counts).

Triton's own ``triton.cdiv`` and ``triton.next_power_of_2`` are constexpr functions (Triton 3.6 to 3.9), usable
inside kernels, that cost about 3 us a call on the host: a launcher that computes its grid and tiles with them
pays that several times on every call, which an eager caller (the events timer, a serving engine without CUDA
graphs) waits for.
"""

from __future__ import annotations

__all__ = ["cdiv", "next_power_of_2"]


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for integers, b > 0."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The least power of two >= n, for n >= 1 (0 for 0, as triton's)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0

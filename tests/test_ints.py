"""gdnbench_kernels.common.ints: the host's cdiv and next_power_of_2 agree with triton's own (which are constexpr
functions, slow on the host) on every value the launchers meet."""

from __future__ import annotations

import triton

from gdnbench_kernels.common.ints import cdiv, next_power_of_2


def test_cdiv_matches_triton():
    pairs = [(a, b) for a in range(0, 600) for b in (1, 2, 3, 16, 32, 64, 100, 128, 256)]
    pairs += [(2**31 + 5, 64), (65536 * 32, 7)]
    assert [cdiv(a, b) for a, b in pairs] == [triton.cdiv(a, b) for a, b in pairs]


def test_next_power_of_2_matches_triton():
    values = [*range(0, 1100), 2**20 - 1, 2**20, 2**20 + 1]
    assert [next_power_of_2(n) for n in values] == [triton.next_power_of_2(n) for n in values]

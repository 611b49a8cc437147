"""gdnbench_kernels.tuning.fastest: the decode kernel's tuner (timing runs on a GPU only)."""

from __future__ import annotations

import pytest
import torch

from gdnbench_kernels.tuning import fastest


def test_a_single_candidate_is_returned_without_running_it():
    def run(_):
        raise AssertionError("ran")

    assert fastest(run, ["only"], torch.device("cpu")) == "only"


def test_candidates_that_do_not_build_drop_out():
    """As in triton's autotuner: out of shared memory or registers is not an error, unless all fail."""
    from triton.runtime.errors import OutOfResources

    def run(c):
        if c != "fits":
            raise OutOfResources(256 * 1024, 228 * 1024, "shared memory")

    assert fastest(run, ["too big", "fits", "bigger"], torch.device("cpu")) == "fits"
    with pytest.raises(RuntimeError, match="none of the 2 candidate configs builds"):
        fastest(run, ["too big", "bigger"], torch.device("cpu"))


def test_other_errors_are_the_callers():
    def run(c):
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        fastest(run, ["a", "b"], torch.device("cpu"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("order", [(1, 8, 64), (64, 1, 8), (8, 64, 1)])
def test_the_cheapest_candidate_wins_wherever_it_stands(order):
    """Candidates that copy 1, 8 or 64 MiB: the 1 MiB one, in any position."""
    dev = torch.device("cuda")
    bufs = {mib: (torch.ones(mib * 2**18, device=dev), torch.empty(mib * 2**18, device=dev)) for mib in order}
    ran = []

    def run(mib):
        ran.append(mib)
        src, dst = bufs[mib]
        dst.copy_(src)

    assert fastest(run, list(order), dev) == 1
    assert sorted(set(ran)) == [1, 8, 64]

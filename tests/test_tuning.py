"""gdnbench_kernels.common.tuning: ``fastest`` and ``TunedKernel``, every bundled kernel's tuner (timing on a GPU
only)."""

from __future__ import annotations

import pytest
import torch

from gdnbench_kernels.common.tuning import fastest


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


class _Recorder:
    """A stand-in for a Triton JIT function: records each launch's grid and launch arguments."""

    arg_names = ["x", "n", "tier"]
    __name__ = "recorder"

    def __init__(self) -> None:
        self.launches: list[tuple] = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((grid, args, kwargs))


def _tuned_recorder(monkeypatch, configs, prune=None):
    """A TunedKernel over a _Recorder, ``fastest`` replaced by one that runs every candidate once and
    picks the last (the timing itself needs a GPU: test_the_tuned_kernel_runs_its_cheapest_config)."""
    from gdnbench_kernels.common import tuning

    tunings: list[list] = []

    def last(run, candidates, device):
        tunings.append(list(candidates))
        for c in candidates:
            run(c)
        return candidates[-1]

    monkeypatch.setattr(tuning, "fastest", last)
    return tuning.TunedKernel(_Recorder(), configs, ["tier"], prune), tunings


def test_a_tuned_kernel_with_one_config_runs_it_as_written(monkeypatch):
    import triton

    only = triton.Config({"BV": 32}, num_warps=2, num_stages=3, maxnreg=96)
    kernel, tunings = _tuned_recorder(monkeypatch, [only], prune=lambda *a: pytest.fail("pruned"))
    x = torch.zeros(4)
    kernel[lambda meta: (meta["n"] // meta["BV"],)](x, 128, tier=0)
    assert tunings == []
    assert kernel.fn.launches == [((4,), (x, 128), dict(tier=0, BV=32, num_warps=2, num_stages=3, maxnreg=96))]
    assert kernel.best_config is only


def test_a_tuned_kernel_tunes_once_per_key_over_its_pruned_configs(monkeypatch):
    import triton

    configs = [triton.Config({"BV": bv}, num_warps=4, num_stages=2) for bv in (16, 32, 64)]
    seen = []

    def prune(cs, named_args):
        seen.append(dict(named_args))
        return [c for c in cs if c.kwargs["BV"] <= named_args["n"]]

    kernel, tunings = _tuned_recorder(monkeypatch, configs, prune)
    x = torch.zeros(4)
    grid = lambda meta: (meta["n"] // meta["BV"],)  # noqa: E731
    kernel[grid](x, 32, tier=0)
    assert [c.kwargs["BV"] for c in tunings[0]] == [16, 32] and seen[0] == {"x": x, "n": 32, "tier": 0}
    assert kernel.best_config.kwargs["BV"] == 32 and kernel.fn.launches[-1][0] == (1,)
    kernel[grid](x, 64, tier=0)  # n is not a key: the tier's pick runs
    kernel[grid](x.double(), 64, tier=0)  # a tensor's dtype is
    kernel[grid](x, 64, tier=1)  # and so is the tier
    assert len(tunings) == 3 and [c.kwargs["BV"] for c in tunings[2]] == [16, 32, 64]
    assert kernel.fn.launches[-1][2]["BV"] == 64 and kernel.fn.launches[-1][0] == (1,)
    assert set(kernel.cache) == {(0, "torch.float32"), (0, "torch.float64"), (1, "torch.float32")}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")  # the refused launch leaves nothing captured
def test_the_tuned_kernel_runs_its_cheapest_config():
    """A copy that reads REPEAT blocks for each it writes: REPEAT 1 is picked, wherever it stands, and a
    launch while a CUDA graph is being captured must not tune (it would time kernels inside the capture)."""
    import triton
    import triton.language as tl

    from gdnbench_kernels.common.tuning import TunedKernel

    @triton.jit
    def copy(src, dst, n, BLOCK: tl.constexpr, REPEAT: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for i in range(REPEAT):  # other addresses each time, so the compiler cannot fold the loads into one
            acc += tl.load(src + (offs + i * BLOCK) % n, mask=offs < n, other=0.0)
        tl.store(dst + offs, acc / REPEAT, mask=offs < n)

    dev = torch.device("cuda")
    src = torch.randn(1 << 22, device=dev)
    dst = torch.full_like(src, float("nan"))
    configs = [triton.Config({"BLOCK": 1024, "REPEAT": r}, num_warps=4) for r in (64, 1, 16)]
    kernel = TunedKernel(copy, configs, ["n"])
    kernel[lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),)](src, dst, src.numel())
    assert kernel.best_config.kwargs["REPEAT"] == 1
    torch.testing.assert_close(dst, src)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="has not been tuned for this launch"):
        with torch.cuda.graph(graph):
            kernel[(1,)](src, dst, 1024)

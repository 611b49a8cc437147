"""Every GPU candidate config of the recurrent kernel, replayed from a CUDA graph (GPU only).

The interpreter tests (test_kernel_recurrent.py) check the kernel's logic with one config, but code
generation can still go wrong for one config (as it did for chunk_fused's prep kernel, see
test_kernel_chunk_gpu.py). So each candidate (BV, warps, items per program) is forced alone and timed
the harness's way: graph replay, L2 flushed, the pool reset before every call. The pool and the output
sit inside NaN margins. Afterwards the pool (the state after one call) and the output are compared with
fp64, and the margins are checked for writes outside the tensors.
"""

from __future__ import annotations

import pytest
import torch

from gdnbench.timing import TimingConfig, default_timer, measure
from tests.test_kernel_recurrent import make, reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

DEVICE = torch.device("cuda")
SHORT = TimingConfig(timer=default_timer(DEVICE), l2="cold", warmup=2, min_samples=5, max_samples=20,
                     min_time_s=0.0, max_time_s=0.2)
MARGIN = 4096  # NaN elements before and after the pool and the output
# Qwen3-Next's head dims, V-first pools as the backend runs them: one token (scattered slots), two tokens
# with a padding sequence on a bf16 pool, speculative verify with a skipped per-token write, and two and
# four tokens on fp32 pools
CASES = [
    make("T1-fp32-pool-raw", B=6, T=1, H=2, HV=4, K=128, V=128, dtype="bf16", raw=True, pool=16,
         slots=[9, 0, 15, 3, 7, 12], v_first=True),
    make("T2-bf16-pool-padding", B=5, T=2, H=2, HV=4, K=128, V=128, dtype="bf16", raw=True, pool=12,
         slots=[1, -1, 11, 4, 6], pool_dtype="bf16", v_first=True),
    make("T4-per-token-slots", B=3, T=4, H=2, HV=4, K=128, V=128, dtype="bf16", pool=14,
         slots=[[2, -1, 7, 5], [9, 10, 11, 12], [13, 0, 8, 1]], accepted=[4, 2, 1], v_first=True),
    # fp32 pools hold their tiles' keys in two runs per thread at 2-3 tokens and four from 4 on (key_runs)
    make("T2-fp32-pool-raw", B=4, T=2, H=2, HV=4, K=128, V=128, dtype="bf16", raw=True, pool=7,
         slots=[6, 2, 0, 4], v_first=True),
    make("T4-fp32-pool-padding", B=4, T=4, H=2, HV=4, K=128, V=128, dtype="bf16", pool=9,
         slots=[3, 8, -1, 0], v_first=True),
]


def _guarded(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(buffer, view): x's copy inside MARGIN NaNs on either side."""
    buf = torch.full((x.numel() + 2 * MARGIN,), float("nan"), dtype=x.dtype, device=DEVICE)
    view = buf[MARGIN:MARGIN + x.numel()].view(x.shape)
    view.copy_(x)
    return buf, view


def _configs() -> list[int]:
    from gdnbench_kernels.recurrent import forward as kern

    return list(range(len(kern.CONFIGS)))


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
@pytest.mark.parametrize("index", _configs() if torch.cuda.is_available() else [])
def test_every_candidate_under_graph_replay(case, index, monkeypatch):
    from gdnbench_kernels.recurrent import forward as kern

    config = kern.CONFIGS[index]
    monkeypatch.setattr(kern, "CONFIGS", [config])
    monkeypatch.setattr(kern, "_TUNED", {})
    kw = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in case["kw"].items()}
    pool_buf, pool = _guarded(kw["state_pool"])
    out_buf, out = _guarded(torch.full_like(kw["v"], float("nan")))

    def reset() -> None:
        pool.copy_(kw["state_pool"])

    def call() -> None:
        kern.recurrent_gdn(**{**kw, "state_pool": pool}, out=out)

    measure(call, device=DEVICE, config=SHORT, reset=reset)
    torch.cuda.synchronize()
    o_ref, _, pool_ref = reference(case["kw"])
    for buf in (pool_buf, out_buf):
        assert torch.isnan(buf[:MARGIN].float()).all() and torch.isnan(buf[-MARGIN:].float()).all(), config
    for got, ref in ((out, o_ref), (pool, pool_ref)):
        got = got.double().cpu()
        assert torch.isfinite(got).all(), config
        assert ((got - ref).norm() / ref.norm()).item() < 1e-2, config

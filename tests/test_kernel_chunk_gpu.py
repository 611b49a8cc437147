"""Every GPU candidate config of the chunked kernels, compiled and replayed from a CUDA graph (GPU only).

The interpreter tests (test_kernel_chunk.py) check the kernels' own logic; code generation can still
go wrong for one config. Triton 3.6 built chunk_fused's prep kernel at (BV 32, 4 warps, 1 stage) with a
dot that read past its shared memory: correct on a few eager calls, NaN or an illegal address under
graph replay with the L2 flushed, exactly how the harness times it. So each candidate is forced alone
and timed the harness's way, and its outputs are compared with the fp64 recurrence afterwards.
"""

from __future__ import annotations

import pytest
import torch

from gdnbench.reference import gdn_recurrent
from gdnbench.timing import TimingConfig, measure
from tests.kernel_inputs import kernel_inputs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CUDA = torch.device("cuda")
SHORT = TimingConfig(timer="graph", l2="cold", warmup=2, min_samples=5, max_samples=20, min_time_s=0.0,
                     max_time_s=0.2)


def _candidates():
    from gdnbench_kernels import chunk, chunk_fused

    kernels = [(chunk_fused, "_chunk_prep_kernel", chunk_fused.PREP_CONFIGS, False),
               (chunk_fused, "_state_kernel", chunk_fused.STATE_CONFIGS, True),
               (chunk, "_chunk_state_kernel", chunk.STATE_CONFIGS, False),
               (chunk, "_chunk_output_kernel", chunk.OUTPUT_CONFIGS, False)]
    return [(module, name, i, fuse) for module, name, configs, fuse in kernels for i in range(len(configs))]


@pytest.mark.parametrize("D", [16, 32, 60, 100, 128])
@pytest.mark.parametrize("module,name,index,fuse", _candidates() if torch.cuda.is_available() else [])
def test_every_candidate_under_graph_replay(module, name, index, fuse, D, monkeypatch):
    kernel = getattr(module, name)
    monkeypatch.setattr(kernel, "configs", [kernel.configs[index]])
    monkeypatch.setattr(kernel, "cache", {})
    gen = torch.Generator().manual_seed(index)
    kw, N = kernel_inputs(gen, B=2, T=300, H=2, HV=4, K=D, V=D, dtype="bf16", seqs=None, raw=False, l2=False)
    kw = {k: v.to(CUDA) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    from gdnbench_kernels import chunk, chunk_fused

    layout = chunk.ChunkLayout.build(2, 300, None, CUDA)
    ws = chunk.ChunkWorkspace.allocate(layout, kw["q"], kw["v"], stages=module is chunk, raw_gate=False,
                                       fuse_output=fuse, final_state=True)
    out = torch.full_like(kw["v"], float("nan"))
    if module is chunk:
        def call() -> None:
            chunk.chunk_gdn(**kw, output_final_state=True, layout=layout, workspace=ws, out=out)
    else:
        def call() -> None:
            chunk_fused.chunk_fused_gdn(**kw, output_final_state=True, layout=layout, workspace=ws, out=out,
                                        fuse_output=fuse)

    measure(call, device=CUDA, config=SHORT)
    torch.cuda.synchronize()
    o_ref, final_ref = gdn_recurrent(kw["q"].cpu(), kw["k"].cpu(), kw["v"].cpu(), kw["g"].cpu(), kw["beta"].cpu(),
                                     scale=kw["scale"], compute_dtype=torch.float64)
    for got, ref in ((out, o_ref), (ws.final_state, final_ref)):
        got = got.double().cpu()
        assert torch.isfinite(got).all()
        assert ((got - ref).norm() / ref.norm()).item() < 1e-2

"""gdnbench_kernels.chunk_prep_sm90, chunk_fused's Gluon prep kernel for Hopper.

Gluon has no interpreter: on a CPU the kernel is compiled for sm_90 and chunk_fused's choice of prep kernel
is checked; on an sm_90 GPU its gc and Ai are compared with the Triton prep kernel's on NaN-poisoned
buffers (every chunk, and the chunks of the walks that slow marks mark alone), and whole calls with the fp64
recurrence, replayed from a CUDA graph as the harness times them.
"""

from __future__ import annotations

import pytest
import torch

from gdnbench.reference import gdn_recurrent
from gdnbench.timing import TimingConfig, default_timer, measure
from tests.kernel_inputs import kernel_inputs
from tests.sm90 import compile_sm90


def _sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
@pytest.mark.parametrize("dtype,K,slow", [("bf16", 128, False), ("fp16", 128, False), ("bf16", 64, False),
                                          ("bf16", 256, False), ("bf16", 128, True)])
def test_prep_compiles_for_sm90_in_its_programs_per_sm(dtype, K, slow):
    """Every chunk's prep, or with slow marks (a plan's whole_walk) that of the walks they mark alone."""
    from gdnbench_kernels.chunk.sm90 import prep

    if prep.GLUON_MISSING:
        pytest.skip(prep.GLUON_MISSING)
    from triton.experimental.gluon import language as gl

    dt = {"bf16": gl.bfloat16, "fp16": gl.float16}[dtype]
    desc = lambda block: f"tensordesc<{dtype}{block},{gl.NVMMASharedLayout.get_default_for(block, dt)!r}>"  # noqa: E731
    const = dict(H=2, HV=4, K=K, BT=prep.BT)
    marks = {"slow_marks": "*i32", "seg_offsets": "*i32"} if slow else {}
    if not slow:
        const.update(slow_marks=None, seg_offsets=None)
    sig = dict(k_desc=desc([64, K]), ai_desc=desc([64, 64]), Ai=f"*{dtype}", g="*fp32", beta=f"*{dtype}", gc="*fp32",
               seq_bounds="*i64", chunk_indices="*i32", n_items="i32", **marks,
               **{name: "constexpr" for name in const})
    compiled = compile_sm90(prep._chunk_prep_kernel, sig, const, interpreted=False, num_warps=prep.WARPS)
    # the persistent grid's programs all fit on an SM's shared memory at once (registers: PROGRAMS_PER_SM's note)
    assert compiled.metadata.shared * prep.PROGRAMS_PER_SM[K] <= 227 * 1024


def test_prep_choice_and_its_errors():
    from gdnbench_kernels import chunk
    from gdnbench_kernels.chunk.sm90 import prep as chunk_prep_sm90

    gen = torch.Generator().manual_seed(0)
    kw, _ = kernel_inputs(gen, B=1, T=64, H=1, HV=2, K=128, V=128, dtype="bf16", seqs=None, raw=False, l2=False)
    assert chunk.plan.plan_prep(kw["k"], False, False) == "triton"  # not on an sm_90 GPU
    assert chunk_prep_sm90.unsupported(kw["k"], False, False) in ("needs an sm_90 GPU", chunk_prep_sm90.GLUON_MISSING)
    with pytest.raises(ValueError, match="prep='sm90' cannot run this call"):
        chunk.chunk_fused_gdn(**kw, prep="sm90")
    with pytest.raises(ValueError, match="prep must be"):
        chunk.chunk_fused_gdn(**kw, prep="cuda")


@pytest.mark.skipif(not _sm90(), reason="needs an sm_90 GPU")
def test_prep_envelope_on_sm90():
    from gdnbench_kernels.chunk.sm90 import prep as chunk_prep_sm90

    k = torch.zeros(1, 64, 2, 128, device="cuda", dtype=torch.bfloat16)
    assert chunk_prep_sm90.unsupported(k, False, False) is None
    assert "bf16 or fp16" in chunk_prep_sm90.unsupported(k.float(), False, False)
    assert "K in" in chunk_prep_sm90.unsupported(k[..., :100], False, False)
    assert "gating: pre" in chunk_prep_sm90.unsupported(k, True, False)
    assert "normalised" in chunk_prep_sm90.unsupported(k, False, True)


GPU_CASES = [
    # dtype, varlen lengths or (B, T), H, HV, K, gate_norm
    ("bf16", [620, 0, 64, 316, 1], 2, 4, 128, 1.0),  # short last chunks, an empty and a one-token sequence, GVA 2
    ("fp16", (2, 300), 4, 4, 128, 10.0),
    ("bf16", (3, 128), 1, 4, 64, 1.0),  # whole chunks only, GVA 4
    ("bf16", [200, 77, 1000], 2, 2, 256, 0.1),
    # more chunks than the persistent grid's programs (short last chunks among them): each program takes several
    ("bf16", [(37 * i) % 300 + 1 for i in range(120)], 2, 4, 128, 1.0),
]


@pytest.mark.skipif(not _sm90(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("dtype,seqs,H,HV,K,gate_norm", GPU_CASES)
def test_sm90_prep_matches_the_triton_prep_and_the_recurrence(dtype, seqs, H, HV, K, gate_norm):
    from gdnbench_kernels import chunk

    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(len(str(seqs)) + K)
    varlen = isinstance(seqs, list)
    B, T = (1, sum(seqs)) if varlen else seqs
    kw, N = kernel_inputs(gen, B=B, T=T, H=H, HV=HV, K=K, V=K, dtype=dtype, seqs=seqs if varlen else None,
                          raw=False, l2=False, gate_norm=gate_norm)
    kw = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    layout = chunk.ChunkLayout.build(B, T, kw.get("cu_seqlens"), dev)

    def prepped(prep: str, slow=None) -> tuple[torch.Tensor, torch.Tensor]:
        """gc and Ai of the prep kernel alone, into NaN-poisoned buffers."""
        inputs = ("q", "k", "v", "g", "beta", "a", "b", "A_log", "dt_bias")
        x = chunk.launch.prepare_launch(**{n: kw.get(n) for n in inputs},
                                        scale=kw["scale"], initial_state=None, output_final_state=False,
                                        cu_seqlens=kw.get("cu_seqlens"), layout=layout, qk_l2norm=False, out=None,
                                        workspace=None, stages=False, fuse_output=True)
        x.ws.gc.fill_(float("nan"))
        x.ws.Ai.fill_(float("nan"))
        chunk.forward.run_prep(x, layout, prep, slow=slow)
        torch.cuda.synchronize()
        return x.ws.gc.double().cpu(), x.ws.Ai.double().cpu()

    (gc, ai), (gc_tri, ai_tri) = prepped("sm90"), prepped("triton")
    assert torch.isfinite(gc).all() and torch.isfinite(ai).all()
    assert torch.allclose(gc, gc_tri, rtol=1e-5, atol=1e-5)
    assert ((ai - ai_tri).norm() / ai_tri.norm()).item() < 1e-3

    # with slow marks (a plan's whole_walk): the chunks of the marked walks alone, as the Triton kernel preps them
    segments = chunk.SegmentLayout.build(layout, 1, whole_walks=True)
    marks = torch.zeros(segments.layout.N, HV, dtype=torch.int32)
    for n, first in enumerate(segments.seg_offsets.tolist()[:-1]):  # every other head of each sequence, by one mark
        marks[first, n % 2::2] = 1
    marks = marks.to(dev)
    slow = chunk.warm_up.SlowWalks(marks=marks, seg_offsets=segments.seg_offsets)
    (gc, ai), (gc_tri, ai_tri) = prepped("sm90", slow), prepped("triton", slow)
    assert torch.equal(gc.isnan(), gc_tri.isnan()) and torch.equal(ai.isnan(), ai_tri.isnan())
    assert gc.isnan().any() and not gc.isnan().all()  # some walks marked, some not
    done = ~gc_tri.isnan()
    assert torch.allclose(gc[done], gc_tri[done], rtol=1e-5, atol=1e-5)
    done = ~ai_tri.isnan()
    assert ((ai[done] - ai_tri[done]).norm() / ai_tri[done].norm()).item() < 1e-3

    ws = chunk.ChunkWorkspace.allocate(layout, kw["q"], kw["v"], stages=False, raw_gate=False, fuse_output=True,
                                       final_state=True)
    ws.final_state.fill_(float("nan"))
    out = torch.full_like(kw["v"], float("nan"))

    def call() -> None:
        chunk.chunk_fused_gdn(**kw, output_final_state=True, layout=layout, workspace=ws, out=out, fuse_output=True,
                              prep="sm90")

    measure(call, device=dev, config=TimingConfig(timer=default_timer(dev), l2="cold", warmup=2, min_samples=5,
                                                  max_samples=10, min_time_s=0.0, max_time_s=0.2))
    torch.cuda.synchronize()
    cpu = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    o_ref, final_ref = gdn_recurrent(cpu["q"], cpu["k"], cpu["v"], cpu["g"], cpu["beta"], scale=cpu["scale"],
                                     cu_seqlens=cpu.get("cu_seqlens"), compute_dtype=torch.float64)
    for got, ref in ((out.double().cpu(), o_ref), (ws.final_state.double().cpu(), final_ref)):
        assert torch.isfinite(got).all()
        assert ((got - ref).norm() / ref.norm()).item() < 1e-2

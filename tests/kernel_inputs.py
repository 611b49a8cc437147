"""Inputs of the bundled kernels' calls for the interpreter tests, and the chunked kernels' cases, by FLA's
recipe: q/k ~ U(0, 1) (pre-normalised unless the kernel normalises them), v ~ U(0, 1), log-sigmoid decays /
gate_norm zeroed with probability mask_p, or raw gating whose softplus reaches both of its tails."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gdnbench.reference import l2norm

DT = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def kernel_inputs(gen: torch.Generator, *, B: int, T: int, H: int, HV: int, K: int, V: int, dtype: str,
                  seqs: list[int] | None, raw: bool, l2: bool, gate_norm: float = 1.0,
                  mask_p: float = 0.0) -> tuple[dict, int]:
    """(keyword arguments of the launcher: q, k, v, scale, qk_l2norm, the gating and cu_seqlens;
    N, the number of sequences). ``seqs``: varlen lengths (then B = 1, T = their sum)."""
    dt = DT[dtype]
    if seqs is not None:
        B, T = 1, sum(seqs)
    q, k = torch.rand(B, T, H, K, generator=gen), torch.rand(B, T, H, K, generator=gen)
    if not l2:
        q, k = l2norm(q), l2norm(k)
    kw = dict(q=q.to(dt), k=k.to(dt), v=torch.rand(B, T, HV, V, generator=gen).to(dt), scale=K**-0.5,
              qk_l2norm=l2)
    if raw:
        a = torch.randn(B, T, HV, generator=gen) * 4
        a.view(-1)[:3] = torch.tensor([25.0, -30.0, 19.5])  # softplus's linear branch and its tiny tail
        kw.update(a=a.to(dt), b=torch.randn(B, T, HV, generator=gen).to(dt),
                  A_log=torch.log(torch.empty(HV).uniform_(1, 16, generator=gen)),
                  dt_bias=torch.rand(HV, generator=gen))
    else:
        g = F.logsigmoid(torch.rand(B, T, HV, generator=gen)) / gate_norm
        if mask_p > 0:
            g = g.masked_fill(torch.rand(B, T, HV, generator=gen) < mask_p, 0.0)
        kw.update(g=g, beta=torch.sigmoid(torch.rand(B, T, HV, generator=gen)).to(dt))
    if seqs is not None:
        kw["cu_seqlens"] = torch.tensor([0, *torch.tensor(seqs).cumsum(0).tolist()], dtype=torch.int64)
    return kw, (len(seqs) if seqs is not None else B)


# ---- the chunked kernels' cases: run in tests/test_kernel_chunk.py, their layouts read by test_kernel_chunk_plan.py

def make(name: str, *, B=1, T=70, H=1, HV=2, K=64, V=64, dtype="fp32", seqs=None, h0=False, final=True,
         raw=False, l2=False, gate_norm=1.0, mask_p=0.0, weak_heads=(), fuse_output=False, segment_chunks=1,
         seed=0) -> dict:
    """One case's inputs (FLA's recipe: q/k ~ U(0, 1), pre-normalised unless ``l2``; g log-sigmoid /
    gate_norm, zeroed with probability mask_p; the value heads of weak_heads' decays divided by 100 more). Runs
    chunk_gdn, and chunk_fused_gdn with ``fuse_output`` and over warm-up segments of ``segment_chunks``."""
    gen = torch.Generator().manual_seed(seed)
    kw, N = kernel_inputs(gen, B=B, T=T, H=H, HV=HV, K=K, V=V, dtype=dtype, seqs=seqs, raw=raw, l2=l2,
                          gate_norm=gate_norm, mask_p=mask_p)
    for h in weak_heads:
        kw["g"][..., h] /= 100
    kw["output_final_state"] = final
    if h0:
        kw["initial_state"] = torch.randn(N, HV, K, V, generator=gen)
    return {"name": name, "kw": kw, "fuse_output": fuse_output, "segment_chunks": segment_chunks}


KERNEL_CASES = [
    make("padded-T100-gva2-K64-h0", B=2, T=100, h0=True),
    make("varlen-gva2-K60-l2-fp16-h0", seqs=[37, 64, 0, 49], K=60, V=60, dtype="fp16", h0=True, l2=True,
         fuse_output=True),
    make("gn0.1-mask0.5-K16-V64", T=130, HV=1, K=16, V=64, gate_norm=0.1, mask_p=0.5),
    make("gn10-gva1-K64-V60-fp16-nofinal", T=128, H=2, HV=2, V=60, dtype="fp16", gate_norm=10, final=False,
         fuse_output=True),
    make("raw-l2-K16-gva2", T=90, K=16, V=16, raw=True, l2=True, h0=True, fuse_output=True),
    # decays near 1 (gate_norm 100): a state carries across many chunks, so every warm-up walk reaches back
    # to its sequence's start (and 5 chunks: three pipeline groups of 2, both hand-off buffers used)
    make("weak-decay-varlen-K16-h0", seqs=[130, 0, 64, 270], K=16, V=16, gate_norm=100, h0=True),
    # decays of about -6 a chunk under segments of 4: warm-up walks of 4 chunks that stop before the sequence's
    # start, whose last chunks' states enter the segment nearly undecayed (a wrong warm-up shows in the outputs)
    make("gn5-long-K16-h0", T=600, HV=1, K=16, V=16, gate_norm=5, h0=True, segment_chunks=4),
    # one value head of weak decay beside one of strong: warm-up segments for one, the whole walk for the other,
    # in one call (warm_up.mark_slow_walks)
    make("mixed-decay-heads-K16-h0", seqs=[300, 40, 200], K=16, V=16, weak_heads=(1,), h0=True),
]
BY_NAME = {c["name"]: c for c in KERNEL_CASES}

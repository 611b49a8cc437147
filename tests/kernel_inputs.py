"""Inputs of one bundled-kernel call for the interpreter tests, by FLA's recipe: q/k ~ U(0, 1)
(pre-normalised unless the kernel normalises them), v ~ U(0, 1), log-sigmoid decays / gate_norm zeroed
with probability mask_p, or raw gating whose softplus reaches both of its tails."""

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

"""gdn_cuda.chunked_forward against an fp64 recurrence: one chunk, then many (the accuracy finding of
docs/design.md, "The published comparison"). Needs an SM90 GPU and the build of docs/offline-gpu.md.

    python3 repro_accuracy.py     # prints the output's relative error per sequence length and decay
"""
import os

import torch

import gdn_cuda

gdn_cuda.init(library_root=os.environ["GDN_CUDA_ROOT"], cuda_home=os.environ.get("CUDA_HOME", "/usr/local/cuda"))
torch.manual_seed(0)
D = 128


def reference(q, k, v, beta, g, scale):
    """o_t = scale * S_t q_t with S_t = exp(g_t) S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T, in fp64."""
    q, k, v, beta, g = (x.double().cpu() for x in (q, k, v, beta, g))
    S = torch.zeros(D, D, dtype=torch.float64)  # [V, K]
    out = torch.empty(q.shape[1], D, dtype=torch.float64)
    for t in range(q.shape[1]):
        kt, vt, b = k[0, t, 0], v[0, t, 0], beta[0, t, 0]
        S = S * g[0, t, 0].exp()
        S = S + b * torch.outer(vt - S @ kt, kt)
        out[t] = scale * (S @ q[0, t, 0])
    return out


for T in (64, 1024):
    for log_decay in (-0.5, -1e-4):  # a fast decay and a nearly absent one
        q = torch.nn.functional.normalize(torch.randn(1, T, 1, D, device="cuda"), dim=-1).bfloat16()
        k = torch.nn.functional.normalize(torch.randn(1, T, 1, D, device="cuda"), dim=-1).bfloat16()
        v = torch.randn(1, T, 1, D, device="cuda").bfloat16()
        beta = torch.rand(1, T, 1, device="cuda").bfloat16()
        g = torch.full((1, T, 1), log_decay, device="cuda", dtype=torch.float32)
        o, _ = gdn_cuda.chunked_forward(query=q, key=k, value=v, beta=beta, gate=g, scale=D ** -0.5)
        ref = reference(q, k, v, beta, g, D ** -0.5)
        err = ((o[0, :, 0].double().cpu() - ref).norm() / ref.norm()).item()
        print(f"T={T:5d} log decay {log_decay:8.0e}: output rel err {err:.2e}", flush=True)

"""gdn_cuda against an fp64 recurrence, input recipe by input recipe (the accuracy findings of docs/design.md,
"The published comparison"). Needs an SM90 GPU and the build of docs/offline-gpu.md.

    python3 repro_accuracy.py     # prints the relative errors of the output and the final state per row

chunked_forward: one chunk and many; constant and per-token gates; zero-mean inputs (randn) and gdnbench's
recipe (q, k, v, beta uniform in [0, 1), q and k L2-normalised, g = logsigmoid(uniform) / gate_norm).
recurrent_forward: one decode step from a random state, against the gated delta rule (decay, then the delta
from the decayed state) and against the delta taken from the state before its decay.
"""
import os

import torch
import torch.nn.functional as F

import gdn_cuda

gdn_cuda.init(library_root=os.environ["GDN_CUDA_ROOT"], cuda_home=os.environ.get("CUDA_HOME", "/usr/local/cuda"))
torch.manual_seed(0)
D = 128
SCALE = D ** -0.5


def reference(q, k, v, beta, g, S, delta_before_decay=False):
    """o_t = scale * S_t q_t with S_t = exp(g_t) S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T (S [V, K]) in fp64;
    delta_before_decay: S_t = exp(g_t) S_{t-1} - beta_t (S_{t-1} k_t - v_t) k_t^T. Returns (o [T, V], S_T)."""
    q, k, v, beta, g, S = (x.double().cpu() for x in (q, k, v, beta, g, S))
    out = torch.empty(q.shape[0], D, dtype=torch.float64)
    for t in range(q.shape[0]):
        decayed = S * g[t].exp()
        delta = beta[t] * torch.outer(v[t] - (S if delta_before_decay else decayed) @ k[t], k[t])
        S = decayed + delta
        out[t] = SCALE * (S @ q[t])
    return out, S


def rel(x, ref):
    return ((x.double().cpu() - ref).norm() / ref.norm()).item()


def inputs(T, recipe, gate):
    if recipe == "randn":
        q, k, v = (torch.randn(T, D, device="cuda") for _ in range(3))
        beta = torch.rand(T, device="cuda")
    else:  # gdnbench's recipe (gdnbench/problem.py)
        q, k, v = (torch.rand(T, D, device="cuda") for _ in range(3))
        beta = torch.sigmoid(torch.rand(T, device="cuda"))
    q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    g = torch.full((T,), gate, device="cuda") if isinstance(gate, float) else F.logsigmoid(torch.rand(T, device="cuda"))
    return q.bfloat16(), k.bfloat16(), v.bfloat16(), beta.bfloat16(), g


for recipe in ("randn", "gdnbench"):
    for gate in (-0.5, -1e-4, "logsigmoid"):
        for T in (64, 1024):
            q, k, v, beta, g = inputs(T, recipe, gate)
            o, state = gdn_cuda.chunked_forward(query=q[None, :, None], key=k[None, :, None], value=v[None, :, None],
                                                beta=beta[None, :, None], gate=g[None, :, None], scale=SCALE)
            ref_o, ref_s = reference(q, k, v, beta, g, torch.zeros(D, D))
            print(f"chunked    {recipe:8s} g={gate!s:10s} T={T:5d}: o {rel(o[0, :, 0], ref_o):.2e}  "
                  f"state {rel(state.reshape(D, D), ref_s):.2e}", flush=True)

for recipe in ("randn", "gdnbench"):
    q, k, v, beta, g = inputs(1, recipe, "logsigmoid")
    S0 = torch.randn(D, D, device="cuda").bfloat16()  # [V, K]
    o, state = gdn_cuda.recurrent_forward(query=q[None, :, None], key=k[None, :, None], value=v[None, :, None],
                                          beta=beta[None, :, None], gate=g[None, :, None].bfloat16(),
                                          initial_state=S0[None, None],
                                          inference_mode=int(gdn_cuda.InferenceMode.Decode),
                                          is_qk_norm=False, scale=SCALE)
    for before in (False, True):
        ref_o, ref_s = reference(q, k, v, beta, g.bfloat16(), S0, delta_before_decay=before)
        rule = "delta before decay" if before else "gated delta rule"
        print(f"recurrent  {recipe:8s} vs {rule:18s}: o {rel(o.reshape(D), ref_o[0]):.2e}  "
              f"state {rel(state.reshape(D, D), ref_s):.2e}", flush=True)

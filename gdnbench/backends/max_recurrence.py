"""max.recurrence: Modular MAX's Mojo ``gated_delta_recurrence_fwd`` run in a compiled MAX graph.

The op (``max.nn.state_space.gated_delta_recurrence_fwd``, Pass 2 of MAX's Qwen3.5 GDN prefill and its decode step)
is a token-sequential recurrence over a ragged batch, reading and writing a K-first state pool ``[slots, HV, K, V]``
at ``slot_idx`` in place. Its conventions (read in max/nn/state_space/gated_delta.py of the max 26.7.0 wheel, and in
the Mojo kernel and its op registration in modular/modular on GitHub, whose revision may differ from 26.7.0):

* input is the conv output ``[T_total, 2*H*K + HV*V]`` fp32 with q, k, v packed by channel
  (q heads, then k heads, then v heads, each head's dims contiguous);
* decay is linear (alpha = exp(g)); beta is post-sigmoid; both fp32 ``[T_total, HV]``;
* q and k are always L2-normalised in the kernel (rsqrt(sum + 1e-6)) and the q scale is fixed at
  1/sqrt(K); K == V, and only K = V = 128 is compiled;
* ``slot_idx`` and ``input_row_offsets`` are uint32 (no padding sentinel).

``qk_l2norm: pre`` cases are served too: their q, k are already unit-norm (normalised with the same
eps), so the kernel's second normalisation changes them only by the input dtype's rounding of the
norm (measured for K=128: relative 2e-4 RMS, 1e-3 at most, for bf16; 5e-7 for fp32), inside the tolerance.

MAX runs the graph on its own CUDA stream, so the call is host-synchronised on both sides and cannot
be captured in a torch CUDA graph: the graph timer falls back to CUDA events (launch and
synchronisation overhead included), and the row's note says so.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gdnbench.backends.base import Outputs, Prepared, backend
from gdnbench.backends.convert import StatePool, alpha, cu_seqlens, flat_tokens, gating, initial_states, unflat_tokens
from gdnbench.problem import Problem
from gdnbench.suite import Case


def pack_qkv(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """q, k [B, T, H, K] and v [B, T, HV, V] -> MAX's fused conv output [B*T, 2*H*K + HV*V], fp32."""
    return torch.cat([flat_tokens(x).flatten(1).float() for x in (q, k, v)], dim=1).contiguous()


def row_offsets(p: Problem) -> np.ndarray:
    """input_row_offsets [N + 1] uint32: varlen boundaries, or B sequences of T tokens each."""
    return cu_seqlens(p).cpu().numpy().astype(np.uint32)


def slot_indices(p: Problem) -> np.ndarray:
    """slot_idx uint32: the decode slots, or slots 0..N-1 of the prefill pool."""
    if p.case.op == "prefill":
        return np.arange(p.case.N, dtype=np.uint32)
    slots = p.slot_idx.cpu().numpy()
    if (slots < 0).any():
        raise ValueError("max.recurrence: slot_idx has padding (-1), which MAX's uint32 slots cannot express")
    return slots.astype(np.uint32)


def unpack_output(o: Tensor, p: Problem) -> Tensor:
    """MAX's output [B*T, HV*V] fp32 -> canonical [B, T, HV, V] in the input dtype."""
    B, T, HV, V = p.v.shape
    return unflat_tokens(o.reshape(B * T, HV, V), B, T).to(p.v.dtype)


def _check(case: Case, device: torch.device) -> str | None:
    if case.scale is not None and not math.isclose(case.scale, case.K**-0.5, rel_tol=1e-6):
        return f"max.recurrence: q scale is fixed at 1/sqrt(K) = {case.K**-0.5:.4g}, case has scale={case.scale:g}"
    return None


@cache
def _session(device_id: int) -> Any:
    from max.driver import Accelerator
    from max.engine import InferenceSession

    return InferenceSession(devices=[Accelerator(id=device_id)])


@backend("max.recurrence", ops={"prefill", "decode"}, head_dims={128}, equal_kv=True, gating={"pre", "raw"},
         requires=("max.engine", "max.nn.state_space"), package="max", check=_check)
def max_recurrence(p: Problem) -> Prepared:
    """Modular MAX gated_delta_recurrence_fwd (Mojo, token-sequential) in a MAX graph, K-first pool."""
    from max.driver import Accelerator, Buffer
    from max.dtype import DType
    from max.graph import BufferType, DeviceRef, Graph, TensorType
    from max.nn.state_space import gated_delta_recurrence_fwd

    device_id = p.device.index if p.device.index is not None else torch.cuda.current_device()
    accel = Accelerator(id=device_id)
    decode = p.case.op == "decode"
    pool = StatePool(p.state_pool, slots=p.slot_idx) if decode else StatePool(initial_states(p))
    qkv = pack_qkv(p.q, p.k, p.v)
    decay = flat_tokens(alpha(p.g))
    beta = flat_tokens(p.beta.to(torch.float32, copy=True))  # a copy: raw gating writes into it
    slots, offsets = slot_indices(p), row_offsets(p)

    ref = DeviceRef.from_device(accel)
    input_types = [
        TensorType(DType.float32, list(qkv.shape), device=ref),
        TensorType(DType.float32, list(decay.shape), device=ref),
        TensorType(DType.float32, list(beta.shape), device=ref),
        BufferType(getattr(DType, str(pool.pool.dtype).removeprefix("torch.")), list(pool.pool.shape), device=ref),
        TensorType(DType.uint32, [len(slots)], device=ref),
        TensorType(DType.uint32, [len(offsets)], device=ref),
    ]
    with Graph("gdnbench_gated_delta_recurrence", input_types=input_types) as graph:
        x, d, b, state, s, o = graph.inputs
        graph.output(gated_delta_recurrence_fwd(
            qkv_conv_output=x.tensor, decay_per_token=d.tensor, beta_per_token=b.tensor,
            recurrent_state=state.buffer, slot_idx=s.tensor, input_row_offsets=o.tensor,
        ))
    model = _session(device_id).load(graph)
    # Zero-copy views of the torch tensors: reset() and raw gating write into the memory MAX reads.
    inputs = [Buffer.from_dlpack(t) for t in (qkv, decay, beta, pool.pool)]
    inputs += [Buffer.from_numpy(a).to(accel) for a in (slots, offsets)]
    gate = gating(p)  # MAX's op takes no raw gating inputs: raw cases gate in torch, timed
    result: dict[str, Any] = {}

    def call() -> None:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("max.recurrence runs on MAX's own CUDA stream; a torch CUDA graph cannot capture it")
        if p.case.gating == "raw":
            g, beta_raw = gate()
            decay.view(g.shape).copy_(g.exp())
            beta.view(beta_raw.shape).copy_(beta_raw)
        torch.cuda.current_stream(p.device).synchronize()  # torch's writes land before MAX reads
        result["o"] = model.execute(*inputs)[0]
        accel.synchronize()  # and MAX's before torch reads

    def outputs() -> Outputs:
        o = unpack_output(torch.from_dlpack(result["o"]).clone(), p)  # own it: MAX may reuse the buffer
        if decode:
            return Outputs(o=o, state_pool=pool.canonical())
        return Outputs(o=o, final_state=pool.canonical() if p.case.output_final_state else None)

    path = ("max graph gated_delta_recurrence_fwd (fp32 work, in-kernel q/k l2norm, K-first "
            f"{str(pool.pool.dtype).removeprefix('torch.')} pool); host-synchronised around MAX's stream, "
            "not graph-capturable")
    if p.case.gating == "raw":
        path += "; gating in torch (timed)"
    return Prepared(call=call, outputs=outputs, reset=pool.reset, path=path)

"""jla.chunk: jax-linear-attention's Pallas Mosaic GPU Gated DeltaNet forward (H100/H200), run from torch.

The op, as read in the jax-linear-attention 0.1.0 wheel (import name ``jla``):

* ``jla.ops.linear_attention("gated_deltanet", q, k, v, *, impl, g, beta, scale, initial_state,
  output_final_state, segment_ids, use_qk_l2norm)`` returns ``(o, final_state)`` (jla/ops/__init__.py);
* FLA's layout, which is gdnbench's: q, k ``[B, T, Hk, K]``, v ``[B, T, H, V]`` with ``H`` a multiple of
  ``Hk`` (value head h reads key head h // (H / Hk)), g the log decay and beta post-sigmoid, both
  ``[B, T, H]``; states K-first ``[B, H, K, V]``, the final one float32; o in q's dtype
  (jla/ops/reference.py, jla/ops/mosaic_gpu/scalar_gate.py);
* the Mosaic GPU kernels take q, k, v of one dtype, bf16 or fp16, ``K, V`` in {64, 128} each, or
  ``(K, V)`` in ``LARGE_HEADS`` on the K-blocked path (jla/ops/mosaic_gpu/gated_delta_rule.py,
  scalar_gate_kb.py, _common.py), and an sm_90 device;
* packed documents are ``segment_ids [B, T]`` (integers; the state restarts from zero wherever the id
  changes along T), not ``cu_seqlens``, which only the token-by-token reference takes. The initial
  state enters each row's first document only, and the final state is the one after each row's last
  token. A varlen case (one row of N sequences) is served where that is its meaning: N = 1, or no
  initial state but zeros and no final state asked for (``case_reason``);
* one call walks at most 65535 chunks of 64 tokens per sequence piece (the CUDA grid limit): the
  library refuses longer calls with that reason, which makes an ERROR row.

``impl="auto"`` would fall through to plain JAX (``chunked``, then ``reference``) whenever the kernel's
``supports`` predicate says no. The adapter passes ``impl="mosaic_gpu"``: the dispatcher then tries that
registration only and raises where it cannot run (jla/ops/__init__.py, ``linear_attention``), so a row
that passes ran the Mosaic GPU kernels. The op does not report which of its two kernel pipelines ran;
``path`` says which one the head dims select and how many pieces the library's split heuristic cuts
each sequence into.

Tensors cross by DLPack, outside the timed call: ``prepare`` hands torch's buffers to JAX and jits the
op once; ``outputs()`` hands the latest results back. JAX launches on its own CUDA stream, so ``call``
waits for torch's stream before the op and for JAX's results after it (host synchronisation both
ways). A torch CUDA graph cannot capture that: ``call`` raises while torch captures, and the graph
timer falls back to CUDA events (launch, dispatch and synchronisation included), as for max.recurrence.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from gdnbench.backends.base import Outputs, Prepared, backend
from gdnbench.problem import Problem
from gdnbench.suite import Case

KIND = "gated_deltanet"
IMPL = "mosaic_gpu"  # by name: no plain-JAX fallback (see the module docstring)
JAX_SERIES = "0.11."  # jax-linear-attention 0.1.0 pins jax==0.11.2; its kernels use that Pallas API
# K and V each, on the scalar-gate pipeline (jla/ops/mosaic_gpu/_common.py, SUPPORTED_HEAD_DIMS)
SMALL_HEADS = frozenset({64, 128})
# (K, V) pairs of the K-blocked large-head pipeline (jla/ops/mosaic_gpu/scalar_gate_kb.py, HEAD_DIMS)
LARGE_HEADS = frozenset({(256, 128), (256, 256), (256, 512), (128, 256)})


def pipeline(K: int, V: int) -> str | None:
    """The Mosaic GPU pipeline that ``(K, V)`` selects, or None where neither takes them."""
    if (K, V) in LARGE_HEADS:
        return "K-blocked large-head kernels (scalar_gate_kb)"
    if K in SMALL_HEADS and V in SMALL_HEADS:
        return "scalar-gate kernels"
    return None


def case_reason(case: Case) -> str | None:
    """Why the op cannot compute ``case`` as gdnbench defines it, or None (head dims, packed documents)."""
    if pipeline(case.K, case.V) is None:
        pairs = ", ".join(str(pair) for pair in sorted(LARGE_HEADS))
        return (f"jla.chunk: (K, V) must be in {{64, 128}} each or one of {pairs}; "
                f"case has K={case.K}, V={case.V}")
    if case.mode == "varlen" and case.N > 1:
        if case.initial_state == "random":
            return (f"jla.chunk: with segment_ids every document after a row's first starts from zeros; "
                    f"case has {case.N} random initial states")
        if case.output_final_state:
            return (f"jla.chunk: with segment_ids the op returns the state after a row's last token only; "
                    f"case asks for {case.N} final states (output_final_state: false runs it)")
    return None


def jax_version_reason(version: str) -> str | None:
    if version.startswith(JAX_SERIES):
        return None
    return f"jla.chunk: jax-linear-attention 0.1.0 needs jax {JAX_SERIES}x (it pins 0.11.2), found jax {version}"


def _jax() -> ModuleType:
    """jax, imported with its GPU memory preallocation off unless the user chose otherwise.

    By default JAX takes 75% of the GPU's memory when its backend starts (the first JAX operation),
    which would leave torch, in the same process, too little for the inputs, the reference and the
    other backends. The variable is read when the backend starts, so it is set before any JAX use here.
    """
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax

    return jax


def _check(case: Case, device: torch.device) -> str | None:
    reason = case_reason(case)
    if reason:
        return reason
    jax = _jax()
    reason = jax_version_reason(jax.__version__)
    if reason:
        return reason
    import jla.ops

    try:
        impls = jla.ops.available(KIND)  # imports jla.ops.mosaic_gpu, which registers the kernels it can
    except ImportError as e:  # jla lets only a missing Mosaic GPU toolchain pass silently
        return f"jla.chunk: jla's Mosaic GPU kernels fail to import ({type(e).__name__}: {e})"
    if IMPL not in impls:
        return (f"jla.chunk: jla registers no {IMPL} {KIND} kernel with this jax "
                f"(jax.experimental.pallas.mosaic_gpu does not import); it has {', '.join(impls)}")
    try:
        jax.devices("gpu")
    except RuntimeError as e:
        return f"jla.chunk: jax has no GPU backend ({e}); the kernels need jax[cuda13]==0.11.2 and a CUDA 13 driver"
    return None


def segment_ids(p: Problem) -> Tensor | None:
    """Packed documents as the op takes them: [1, T] int32, each token's sequence number; None if padded.

    int32 because JAX without x64 turns an int64 array into int32 with a copy on the way in.
    """
    if p.cu_seqlens is None:
        return None
    lengths = p.cu_seqlens.diff()
    docs = torch.arange(lengths.numel(), dtype=torch.int32, device=p.device)
    return docs.repeat_interleave(lengths)[None]


def row_initial_state(p: Problem) -> Tensor | None:
    """The op's initial state, one per row [B, HV, K, V] fp32: a varlen row's is its first sequence's.

    ``case_reason`` admits varlen cases of several sequences only when they all start from zeros (or
    no state), where restarting each later document from zeros is exact.
    """
    if p.initial_state is None or p.cu_seqlens is None:
        return p.initial_state
    return p.initial_state[:1]


def op_inputs(p: Problem) -> dict[str, Any]:
    """The torch tensors the op reads, in its layout (which is gdnbench's, but for varlen), contiguous.

    ``gates`` is (g, beta), or (a, b, A_log, dt_bias) for ``gating: raw``, whose gating runs in the call.
    """
    gates = (p.g, p.beta) if p.case.gating == "pre" else (p.a, p.b, p.A_log, p.dt_bias)
    tensors = dict(q=p.q, k=p.k, v=p.v, gates=gates, initial_state=row_initial_state(p), segment_ids=segment_ids(p))
    return {name: each(Tensor.contiguous, value) for name, value in tensors.items()}


def each(fn: Callable[[Any], Any], value: Any) -> Any:
    """``fn`` of a tensor, or of each tensor of a tuple; None stays None."""
    if isinstance(value, tuple):
        return tuple(fn(t) for t in value)
    return None if value is None else fn(value)


def _forward(p: Problem, ops: ModuleType, jnp: ModuleType, nn: ModuleType) -> Callable[..., Any]:
    """The op as one traceable function of the inputs; scale and the flags are Python constants (static)."""
    raw = p.case.gating == "raw"

    def forward(q, k, v, gates, initial_state, segments):  # JAX arrays, as op_inputs lays them out
        if raw:  # what jla's GatedDeltaNet layer computes before the op, in XLA inside the same jit
            a, b, A_log, dt_bias = gates
            g = -jnp.exp(A_log) * nn.softplus(jnp.asarray(a, jnp.float32) + dt_bias)
            beta = nn.sigmoid(jnp.asarray(b, jnp.float32))
        else:
            g, beta = gates
        return ops.linear_attention(
            KIND, q, k, v, impl=IMPL, g=g, beta=beta, scale=p.scale, initial_state=initial_state,
            output_final_state=p.case.output_final_state, segment_ids=segments,
            use_qk_l2norm=p.qk_l2norm_in_kernel)

    return forward


def _split_note(p: Problem) -> str:
    """How the scalar-gate pipeline splits each sequence, by the library's own heuristic (recorded, not forced)."""
    try:
        from jla.ops.mosaic_gpu.scalar_gate import pieces
    except ImportError:  # an internal module: other releases may move it
        return "sequence split unknown"
    B, T = p.q.shape[:2]
    n = pieces(B, p.case.HV, p.case.V, T, delta=True)
    return f"each sequence split in {n} pieces" if n > 1 else "no sequence split"


@backend("jla.chunk", ops={"prefill"}, dtypes={"bf16", "fp16"}, head_dims={64, 128, 256, 512},
         gating={"pre", "raw"}, archs={(9, 0)}, requires=("jax", "jla.ops"), package="jax-linear-attention",
         check=_check)
def jla_chunk(p: Problem) -> Prepared:
    """jax-linear-attention Pallas Mosaic GPU gated_deltanet (forced, no plain-JAX fallback), via DLPack."""
    jax = _jax()
    import jax.numpy as jnp
    import jla.ops
    from jax import nn

    run = jax.jit(_forward(p, jla.ops, jnp, nn))
    inputs = {name: each(jnp.from_dlpack, value) for name, value in op_inputs(p).items()}  # zero-copy views
    args = [inputs[name] for name in ("q", "k", "v", "gates", "initial_state", "segment_ids")]
    result: dict[str, Any] = {}

    def call() -> None:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("jla.chunk runs on JAX's own CUDA stream; a torch CUDA graph cannot capture it")
        torch.cuda.current_stream(p.device).synchronize()  # torch's writes (inputs, L2 flush) land before JAX reads
        result["out"] = jax.block_until_ready(run(*args))  # and JAX's work ends before torch's next event

    def outputs() -> Outputs:
        o, final = result["out"]
        return Outputs(o=torch.from_dlpack(o), final_state=None if final is None else torch.from_dlpack(final))

    K, V = p.case.K, p.case.V
    kernels = pipeline(K, V) if (K, V) in LARGE_HEADS else f"{pipeline(K, V)}, {_split_note(p)}"
    path = f"jla.ops.linear_attention(impl={IMPL!r}) under jax.jit: {kernels}"
    if p.cu_seqlens is not None:
        path += "; documents as segment_ids"
    if p.qk_l2norm_in_kernel:
        path += "; q/k l2norm in the op"
    if p.case.gating == "raw":
        path += "; gating in XLA inside the jit (timed)"
    return Prepared(call=call, outputs=outputs,
                    path=path + "; host-synchronised around JAX's stream, not graph-capturable")

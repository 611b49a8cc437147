"""vllm.chunk: the chunked prefill of vLLM's vendored FLA ops (Triton, forward only), V-first state.

This is the op itself, not vLLM's model layer (which picks FlashInfer for prefill on SM90 and
Blackwell): ``chunk_gated_delta_rule`` from ``vllm.third_party.flash_linear_attention.ops`` (vLLM
>= 0.33) or ``vllm.model_executor.layers.fla.ops`` (older releases).

``gating: raw`` computes g and beta in PyTorch inside the timed call: vLLM 0.33 has no standalone
gating op (its prefill fuses gating into ``fused_post_conv_prep``, together with the q/k/v split and
l2norm of the packed projection, which is more work than the other backends are timed on).
"""

from __future__ import annotations

import importlib
import inspect
import os

import torch

from gdnbench.backends.base import Outputs, Prepared, backend
from gdnbench.backends.convert import gating, swap_kv
from gdnbench.backends.serving_common import require_v_first, vllm_ops, vllm_unavailable
from gdnbench.problem import Problem
from gdnbench.suite import Case


def _check(case: Case, device: torch.device) -> str | None:
    if case.K > 256:  # chunk_gated_delta_rule_fwd_h asserts it; V has no such limit
        return f"vllm.chunk: K <= 256 only, case has K={case.K}"
    return vllm_unavailable("vllm.chunk")


@backend("vllm.chunk", triton=True, ops={"prefill"}, dtypes={"bf16", "fp16"}, gating={"pre", "raw"},
         requires=("vllm",), package="vllm", check=_check)
def vllm_chunk(p: Problem) -> Prepared:
    """vLLM's vendored FLA chunk_gated_delta_rule (Triton, forward only), V-first state."""
    ops = vllm_ops()
    fn = ops.chunk_gated_delta_rule
    require_v_first(fn)
    kwargs = dict(
        scale=p.scale,
        initial_state=None if p.initial_state is None else swap_kv(p.initial_state),  # fp32 V-first
        output_final_state=p.case.output_final_state,
        cu_seqlens=p.cu_seqlens,
        use_qk_l2norm_in_kernel=p.qk_l2norm_in_kernel,
    )
    params = inspect.signature(fn).parameters
    notes = [f"vllm vendored FLA triton chunk ({ops.__name__}); FLA_USE_TMA={os.environ.get('FLA_USE_TMA', '0')}"]
    if p.cu_seqlens is not None and "chunk_indices" in params:
        # What vLLM's metadata builder does: chunk tables built once on the host, so the timed
        # call has no host sync (inside the op they would come from a cached .tolist()).
        index = importlib.import_module(ops.__name__ + ".index")
        size = getattr(importlib.import_module(ops.__name__ + ".utils"), "FLA_CHUNK_SIZE", 64)
        kwargs["chunk_indices"] = index.prepare_chunk_indices(p.cu_seqlens, size)
        if "chunk_offsets" in params:
            kwargs["chunk_offsets"] = index.prepare_chunk_offsets(p.cu_seqlens, size)
        notes.append("chunk_indices precomputed")
    if p.case.gating == "raw":
        notes.append("gating in torch (timed)")
    gate = gating(p)
    result: dict[str, tuple] = {}

    def call() -> None:
        g, beta = gate()
        result["r"] = fn(q=p.q, k=p.k, v=p.v, g=g, beta=beta, **kwargs)

    def outputs() -> Outputs:
        o, final = result["r"][:2]  # some older releases also return intermediate states
        return Outputs(o=o, final_state=None if final is None else swap_kv(final))

    return Prepared(call=call, outputs=outputs, path="; ".join(notes))

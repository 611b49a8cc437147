"""flashinfer.prefill: FlashInfer's chunked GDN prefill (``flashinfer.gdn_prefill.chunk_gated_delta_rule``).

Conventions that differ from the canonical ones (converted in ``prepare``, outside the timed call):
3-D token-major q/k/v with cu_seqlens always required (a padded batch is B sequences of T tokens),
``g`` is the LINEAR decay alpha = exp(g) in fp32, beta fp32, states V-first [N, HV, V, K].

Routing is pinned where the installed release allows it: ``backend="flashinfer"`` (``"auto"`` may pick
the opt-in Cake kernels or cuDNN) and ``use_cp="auto"``, FlashInfer's own default: it switches to the
context-parallel kernels when sequences x heads leave SMs idle (1501 us with it, 2843 us
without, at Qwen3-Next T=65536 on an H200 with FlashInfer 0.7.2.post1). That choice depends only on the shape
and the GPU, so it is reproducible on a given GPU; the row's path records which way it went.
"""

from __future__ import annotations

import torch

from gdnbench.backends import convert
from gdnbench.backends.base import Outputs, Prepared, backend
from gdnbench.backends.flashinfer_common import DTYPES, PACKAGE, accepted, capability, describe, sm
from gdnbench.problem import Problem
from gdnbench.suite import Case


def _check(case: Case, device: torch.device) -> str | None:
    cc = capability(device)
    if cc[0] not in (9, 10, 12):
        return f"flashinfer.prefill: SM90, SM10x or SM12x GPUs only, this GPU is {sm(cc)}"
    cuda = torch.version.cuda or "none"
    if cc[0] == 10 and int(cuda.split(".")[0]) < 13:
        return f"flashinfer.prefill: SM10x kernels need CUDA 13+, torch is built for CUDA {cuda}"
    return None


def _cp_route(device: torch.device, parallel_work: int) -> str:
    """Which way ``use_cp="auto"`` goes, by FlashInfer's own host-side heuristic (recorded, not forced)."""
    try:
        from flashinfer.gdn_kernels.delta_rule_dsl.varlen_helper import should_use_cp_host
        from flashinfer.utils import get_compute_capability, get_device_name, get_device_sm_count
    except ImportError:  # a private helper: other releases may move it
        return "route unknown"
    cc = get_compute_capability(device)
    cp = cc[0] in (9, 10, 12) and should_use_cp_host(
        parallel_work, get_device_sm_count(device), get_device_name(device), device_capability=cc)
    return "context-parallel" if cp else "not context-parallel"


@backend("flashinfer.prefill", ops={"prefill"}, dtypes=DTYPES, head_dims={128}, gating={"pre", "raw"},
         requires=("flashinfer.gdn_prefill",), package=PACKAGE, check=_check)
def flashinfer_prefill(p: Problem) -> Prepared:
    """FlashInfer chunked GDN prefill (CuTe-DSL; D=128, fp16/bf16; SM90, SM10x with CUDA 13, SM12x)."""
    from flashinfer.gdn_prefill import chunk_gated_delta_rule

    case = p.case
    B, T = p.q.shape[:2]
    HV, K = p.v.shape[2], p.k.shape[3]  # K == V (head_dims)
    q, k, v = (convert.flat_tokens(x) for x in (p.q, p.k, p.v))
    # int64: FlashInfer's CP dispatcher has passed cu_seqlens through to int64-only kernels (vLLM converts too)
    cu = convert.cu_seqlens(p, torch.int64)
    N = cu.numel() - 1
    max_seqlen = int((cu[1:] - cu[:-1]).max())  # host-side hint for the CP grids, read once here
    initial = convert.swap_kv(p.initial_state) if p.initial_state is not None else None
    output = torch.empty_like(v)  # [T_total, HV, V]: HV = max(H, HV) heads, q's dtype
    final = p.q.new_empty(N, HV, K, K, dtype=torch.float32) if case.output_final_state else None

    if case.gating == "pre":
        g0, beta0 = convert.flat_tokens(convert.alpha(p.g)), convert.flat_tokens(p.beta.float())

        def gates() -> tuple[torch.Tensor, torch.Tensor]:
            return g0, beta0
        gating = "pre-computed alpha"
    else:
        raw = convert.gating(p)  # FlashInfer has no GDN gating op: PyTorch, then exp, both timed

        def gates() -> tuple[torch.Tensor, torch.Tensor]:
            g, beta = raw()
            return convert.flat_tokens(convert.alpha(g)), convert.flat_tokens(beta)
        gating = "gating in PyTorch + exp inside the call"

    pins = accepted(chunk_gated_delta_rule, use_cp="auto", backend="flashinfer", max_seqlen=max_seqlen)
    result: dict[str, torch.Tensor | None] = {}

    def call() -> None:
        g, beta = gates()
        res = chunk_gated_delta_rule(
            q=q, k=k, v=v, g=g, beta=beta, scale=p.scale, initial_state=initial,
            output_final_state=case.output_final_state, cu_seqlens=cu,
            use_qk_l2norm_in_kernel=p.qk_l2norm_in_kernel, output=output, output_state=final, **pins)
        result["o"], result["s"] = res if case.output_final_state else (res, None)

    def outputs() -> Outputs:
        s = result["s"]
        return Outputs(o=convert.unflat_tokens(result["o"], B, T),
                       final_state=convert.swap_kv(s) if s is not None else None)

    route = _cp_route(p.device, N * HV)
    l2 = "; q/k l2norm pre-pass" if p.qk_l2norm_in_kernel else ""
    return Prepared(call, outputs, path=f"flashinfer chunk_gated_delta_rule {describe(pins)} ({route}); "
                                        f"{gating}{l2}")

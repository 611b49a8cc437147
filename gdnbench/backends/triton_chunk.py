"""triton.chunk, triton.chunk_fused and triton.chunk_specialized: the bundled chunked-prefill kernels.

``triton.chunk`` (gdnbench_kernels.chunk.chunk_gdn) is the standard chunkwise pipeline in five kernels (K K^T
and the solve in one); ``triton.chunk_fused`` (gdnbench_kernels.chunk.chunk_fused_gdn) fuses the gate, K K^T
and the triangular solve into one kernel, takes W and U's products inside the state pass instead of
storing them and, for many sequences, folds the outputs into the state pass too (and for few or
unequal long walks on a GPU, cuts them into warm-up segments);
``triton.chunk_specialized`` is chunk_fused with its prep and walk in one warp-specialized Gluon kernel
(Hopper only, gates given, q and k normalised beforehand). The others take raw gating, q/k L2 normalisation
and GVA inside the kernels, and run on a CPU in Triton's interpreter. The chunk layout (from cu_seqlens, read on
the host) and every intermediate buffer are built here, outside the timed call, which then neither allocates nor
syncs.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from gdnbench.backends.base import Outputs, Prepared, backend
from gdnbench.problem import DTYPES, Problem
from gdnbench.suite import Case

CHUNK_KERNEL = "gdnbench_kernels.chunk"


def _check(case: Case, device: torch.device) -> str | None:
    # Triton decides between compiling and interpreting when a kernel module is imported (every stage
    # module is imported with the chunk package): if that happened before
    # TRITON_INTERPRET=1 was set, the kernels were compiled for a GPU that is not there.
    loaded = sys.modules.get(CHUNK_KERNEL)
    if device.type == "cpu" and loaded is not None and not loaded.INTERPRETED:
        return f"{CHUNK_KERNEL} was imported before TRITON_INTERPRET=1 was set"
    return None


def prepare_chunk(p: Problem, *, fused: bool, **forced: Any) -> Prepared:
    """The call's plan made once here (``chunk.default_plan``: the kernel's default rules, with the fields
    in ``forced`` forced; the backends force none, sweeps one at a time), its workspace and output
    allocated, and the call that executes it."""
    from gdnbench_kernels import chunk
    from gdnbench_kernels.common.device import FP32_DOT

    case = p.case
    raw = case.gating == "raw"
    gating: dict[str, Any] = (dict(a=p.a, b=p.b, A_log=p.A_log, dt_bias=p.dt_bias) if raw
                              else dict(g=p.g, beta=p.beta))
    layout = chunk.ChunkLayout.build(p.q.shape[0], p.q.shape[1], p.cu_seqlens, p.device)
    plan = chunk.default_plan(layout, p.q, p.k, case.V, case.HV, raw_gate=raw, qk_l2norm=p.qk_l2norm_in_kernel,
                              fused=fused, **forced)
    ws = plan.workspace(layout, p.q, p.v, raw_gate=raw, final_state=case.output_final_state)
    o = torch.empty(*p.v.shape[:3], case.V, dtype=p.q.dtype, device=p.device)  # written by every call
    kw: dict[str, Any] = dict(gating, scale=p.scale, initial_state=p.initial_state,
                              output_final_state=case.output_final_state, cu_seqlens=p.cu_seqlens, layout=layout,
                              qk_l2norm=p.qk_l2norm_in_kernel, out=o, workspace=ws)
    if fused:
        def call() -> None:
            chunk.chunk_fused_gdn(p.q, p.k, p.v, **kw, plan=plan)

        configs = chunk.state.FUSED_STATE_CONFIGS
    else:
        def call() -> None:
            chunk.chunk_gdn(p.q, p.k, p.v, **kw)

        configs = chunk.state.STATE_CONFIGS

    if len(configs) > 1:  # autotune (or hit its cache) now, untimed, so the row says which config runs
        call()
    notes = [f"gdnbench triton chunk{'_fused' if fused else ''}: {chunk.describe(plan)}"]
    if raw:
        notes.append("raw gating fused")
    if p.qk_l2norm_in_kernel:
        notes.append("q/k l2norm in kernel")
    if case.dtype == "fp32":
        notes.append(f"fp32 products {FP32_DOT}")
    if chunk.INTERPRETED:
        notes.append("triton interpreter")
    outputs = lambda: Outputs(o=o, final_state=ws.final_state if case.output_final_state else None)  # noqa: E731
    return Prepared(call=call, outputs=outputs, path="; ".join(notes))


_ENVELOPE: dict[str, Any] = dict(ops={"prefill"}, devices={"cpu", "cuda"}, gating={"pre", "raw"}, max_head_dim=256,
                                 package="triton", check=_check, triton=True)


@backend("triton.chunk", requires=(CHUNK_KERNEL,), **_ENVELOPE)
def triton_chunk(p: Problem) -> Prepared:
    """Bundled Triton chunked prefill, one kernel per stage (C=64, as FLA's pipeline)."""
    return prepare_chunk(p, fused=False)


@backend("triton.chunk_fused", requires=(CHUNK_KERNEL,), **_ENVELOPE)
def triton_chunk_fused(p: Problem) -> Prepared:
    """Bundled Triton chunked prefill, gate+K K^T+solve fused, W/U in the state pass (and the output pass for
    many sequences; warm-up segments, the output in their walk, for few or unequal long walks on a GPU)."""
    return prepare_chunk(p, fused=True)


def specialized_unsupported(case: Case, device: torch.device) -> str | None:
    """Why ``triton.chunk_specialized`` cannot run ``case`` on ``device`` (the kernel's envelope), or None."""
    from gdnbench_kernels import chunk

    why = _check(case, device)
    if why:
        return why
    probe = torch.empty(0, case.K, dtype=DTYPES[case.dtype], device=device)  # the kernel's own envelope
    return chunk.sm90.specialized.unsupported(probe, case.V, case.gating == "raw", case.qk_l2norm == "kernel")


@backend("triton.chunk_specialized", requires=(CHUNK_KERNEL,), **dict(_ENVELOPE, devices={"cuda"}, gating={"pre"},
                                                                       check=specialized_unsupported))
def triton_chunk_specialized(p: Problem) -> Prepared:
    """triton.chunk_fused with the prep and the walk in one warp-specialized Gluon kernel (an H100/H200, K = V =
    128, gates given, q and k normalised beforehand) on every case, where triton.chunk_fused takes it on 128+ walks
    that keep one program a SM busy only (chunk.plan.walk_default): slower on fewer walks or where one long walk
    sets the pace."""
    return prepare_chunk(p, fused=True, walk="sm90_specialized")

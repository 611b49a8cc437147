"""cudnn.gdn: the cuDNN frontend's GDN prefill (``cudnn.linear_attention.gated_delta_net``).

Conventions that differ from the canonical ones (converted in ``prepare``): THD layout, i.e. 3-D
token-major q/k/v with cu_seqlens always required (a padded batch is B sequences of T tokens); states
V-first [N, HV, V, K]. ``g`` stays log-space (``gate_domain="log"``, the default).

Read in nvidia-cudnn-frontend 1.32.0 (``linear_attention/ops/gdn.py``, ``frost/engine.py``,
``frost/gdn_engine.py``, ``cutile/engine.py``, ``cutile/gdn_engine.py``). Two engines serve the op:
- FROST (CuTe-DSL): SM100/SM103/SM107, head dims K and V in {64, 128}, fp16/bf16, states fp32/bf16;
  fuses raw gating (``safe_gate``: g = -exp(a_log) softplus(g + dt_bias); ``use_beta_sigmoid_in_kernel``).
- cuTile fallback: no arch gate of its own, so it runs wherever the tileiras compiler targets (CUDA Tile
  13.2: SM8x, SM10x, SM11x, SM12x; 13.3 added Hopper SM90) and the engine demands a CUDA 13.3+ runtime;
  K <= 256, int32 cu_seqlens, fp32 states, ``safe_gate`` but no in-kernel beta sigmoid.
The engine is chosen here and pinned with ``plan_name`` so the row names what ran.
``cudnn.fla.accelerate_fla()`` (which monkeypatches FLA) is never imported.
"""

from __future__ import annotations

import importlib.util

import torch

from gdnbench.backends import convert
from gdnbench.backends.base import Outputs, Prepared, backend
from gdnbench.problem import Problem
from gdnbench.suite import Case

FROST, CUTILE = "gdn_frost", "gdn_cutile"  # the engines' plan names
FROST_ARCHS = frozenset({(10, 0), (10, 3), (10, 7)})
FROST_HEAD_DIMS = frozenset({64, 128})
CUTILE_MIN_ARCH = (8, 0)
CUTILE_MAX_K = 256
CUTILE_MIN_CUDART = 13030  # the cuTile engine's own gate (cudaRuntimeGetVersion)


def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def _engine(case: Case, cc: tuple[int, int]) -> str:
    return FROST if cc in FROST_ARCHS and {case.K, case.V} <= FROST_HEAD_DIMS else CUTILE


def _has_cuda_tile() -> bool:
    try:
        return importlib.util.find_spec("cuda.tile") is not None
    except ModuleNotFoundError:  # no `cuda` namespace package at all
        return False


def _cudart_version() -> int | None:
    try:
        from cuda.bindings import runtime
    except ImportError:
        return None
    err, version = runtime.cudaRuntimeGetVersion()
    return int(version) if int(err) == 0 else None


def _check(case: Case, device: torch.device) -> str | None:
    cc = _capability(device)
    if _engine(case, cc) == FROST:
        return None
    where = f"SM{cc[0]}{cc[1]}"
    if cc in FROST_ARCHS:
        lead = f"cudnn.gdn: FROST takes head dims 64/128 (case has K={case.K}, V={case.V}); the cuTile fallback"
    else:
        lead = f"cudnn.gdn: FROST runs on SM100/SM103/SM107 only; on {where} the cuTile fallback"
    if cc < CUTILE_MIN_ARCH:
        return f"{lead} needs SM80 or newer"
    if case.K > CUTILE_MAX_K:
        return f"{lead} takes K <= {CUTILE_MAX_K}, case has K={case.K}"
    if not _has_cuda_tile():
        return f"{lead} needs the cuda-tile package (pip install nvidia-cudnn-frontend[cutile])"
    version = _cudart_version()
    if version is None or version < CUTILE_MIN_CUDART:
        found = "unreadable: no cuda-python" if version is None else f"{version // 1000}.{version % 1000 // 10}"
        return f"{lead} needs a CUDA 13.3+ runtime (found {found})"
    return None


@backend("cudnn.gdn", ops={"prefill"}, dtypes=("bf16", "fp16"), gating={"pre", "raw"},
         requires=("cudnn",), package="nvidia-cudnn-frontend", check=_check)
def cudnn_gdn(p: Problem) -> Prepared:
    """cuDNN frontend GDN prefill: FROST engine (SM100/103/107, D 64/128), cuTile fallback elsewhere."""
    from cudnn.linear_attention import gated_delta_net

    case = p.case
    B, T = p.q.shape[:2]
    engine = _engine(case, _capability(p.device))
    common = dict(
        q=convert.flat_tokens(p.q), k=convert.flat_tokens(p.k), v=convert.flat_tokens(p.v),
        cu_seqlens=convert.cu_seqlens(p, torch.int32),  # the cuTile engine reads int32 only
        scale=p.scale, initial_state=convert.swap_kv(p.initial_state) if p.initial_state is not None else None,
        output_final_state=case.output_final_state, use_qk_l2norm_in_kernel=p.qk_l2norm_in_kernel,
        plan_name=engine)

    gates: dict[str, object]
    beta_logits: torch.Tensor | None = None  # set when beta's sigmoid must run in PyTorch (timed)
    if case.gating == "pre":
        gates = dict(g=convert.flat_tokens(p.g), beta=convert.flat_tokens(p.beta))  # log g fp32; io-dtype beta
        gating = "log g"
    else:
        b = convert.flat_tokens(p.b)
        gates = dict(safe_gate=True, a_log=p.A_log, dt_bias=p.dt_bias, g=convert.flat_tokens(p.a))
        if engine == FROST:
            gates.update(beta=b, use_beta_sigmoid_in_kernel=True)
            gating = "gating fused (safe_gate, use_beta_sigmoid_in_kernel)"
        else:  # cuTile has safe_gate but no in-kernel beta sigmoid
            beta_logits = b
            gating = "g fused (safe_gate), beta = sigmoid(b) in PyTorch"

    result: dict[str, torch.Tensor] = {}

    def call() -> None:
        beta = {} if beta_logits is None else {"beta": torch.sigmoid(beta_logits.float())}
        result["o"], result["s"] = gated_delta_net(**common, **gates, **beta)

    def outputs() -> Outputs:
        final = convert.swap_kv(result["s"]) if case.output_final_state else None
        return Outputs(o=convert.unflat_tokens(result["o"], B, T), final_state=final)

    return Prepared(call, outputs, path=f"cudnn gated_delta_net plan_name={engine!r}; {gating}; "
                                        f"use_qk_l2norm_in_kernel={p.qk_l2norm_in_kernel}")

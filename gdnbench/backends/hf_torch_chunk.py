"""hf.torch_chunk: transformers' pure-PyTorch chunked form (modeling_qwen3_next.torch_chunk_gated_delta_rule).

Unwrapped from its FLA / Hub-kernel dispatch like hf.torch_recurrent (shared code there). Prefill only:
the model layer uses it for prompts and the recurrent function for decode.
"""

from __future__ import annotations

from gdnbench.backends.base import Prepared, backend
from gdnbench.backends.hf_torch_recurrent import REQUIRES, prepare, scale_check
from gdnbench.problem import Problem


@backend("hf.torch_chunk", ops={"prefill"}, devices={"cpu", "cuda"}, varlen=False, gating={"pre", "raw"},
         requires=REQUIRES, package="transformers", check=scale_check("hf.torch_chunk"))
def hf_torch_chunk(p: Problem) -> Prepared:
    """transformers torch_chunk_gated_delta_rule (pure PyTorch, C=64, unwrapped from its FLA dispatch)."""
    return prepare(p, "torch_chunk_gated_delta_rule")

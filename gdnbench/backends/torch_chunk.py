"""torch.chunk: the chunked WY / UT-transform algorithm in plain PyTorch (fp32). Runs anywhere."""

from gdnbench.backends.base import Prepared, backend
from gdnbench.backends.torch_common import prepare
from gdnbench.problem import Problem


@backend("torch.chunk", ops={"prefill", "decode"}, devices={"cpu", "cuda"}, gating={"pre", "raw"},
         per_token_slots=True, package="torch")
def torch_chunk(p: Problem) -> Prepared:
    """Chunked (C=64) WY / UT-transform algorithm in plain PyTorch, fp32."""
    return prepare(p, "chunk")

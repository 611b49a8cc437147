"""torch.recurrent: the exact per-token recurrence in plain PyTorch (fp32). Runs anywhere."""

from gdnbench.backends.base import Prepared, backend
from gdnbench.backends.torch_common import prepare
from gdnbench.problem import Problem


@backend("torch.recurrent", ops={"prefill", "decode"}, devices={"cpu", "cuda"}, gating={"pre", "raw"},
         per_token_slots=True, package="torch")
def torch_recurrent(p: Problem) -> Prepared:
    """Exact per-token recurrence in plain PyTorch, fp32 (the default correctness reference)."""
    return prepare(p, "recurrent")



"""An example gdnbench plugin: the bundled chunked reference with a chunk size of 32 instead of 64.

Swap the body of ``call`` for your own kernel; keep conversions and allocations in the function body
(outside ``call``), because only ``call`` is timed.
"""

import torch

from gdnbench.backends import Outputs, Prepared, backend
from gdnbench.problem import Problem
from gdnbench.reference import VarlenLayout, gdn_chunk


@backend("my_variant.chunk32", ops={"prefill"}, devices={"cpu", "cuda"}, varlen=True, gva=True)
def chunk32(p: Problem) -> Prepared:
    """Chunked WY reference with C=32 (example plugin)."""
    result = {}
    # host-side index work here, once: a timed call without host syncs can be graph-captured
    cu = VarlenLayout.build(p.cu_seqlens, p.q.shape[1]) if p.cu_seqlens is not None else None

    def call() -> None:  # the timed region
        result["o"], result["s"] = gdn_chunk(
            p.q, p.k, p.v, p.g, p.beta, scale=p.scale, initial_state=p.initial_state,
            cu_seqlens=cu, qk_l2norm=p.qk_l2norm_in_kernel,
            output_final_state=p.case.output_final_state, compute_dtype=torch.float32, chunk_size=32)

    return Prepared(call=call, outputs=lambda: Outputs(o=result["o"], final_state=result["s"]),
                    path="torch chunk C=32 fp32")

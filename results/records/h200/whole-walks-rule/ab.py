"""The whole-walk rule: longest walk only (before) against whole_walks_pay (now), interleaved per case.

    python results/records/h200/whole-walks-rule/ab.py    (on a GPU, from the repository root)
"""
import numpy as np, torch
from gdnbench.suite import load_suite
from gdnbench.runner import select_cases
from gdnbench.problem import make_problem
from gdnbench.timing import measure_interleaved
from gdnbench.backends.triton_chunk import prepare_chunk
from gdnbench_kernels import chunk
from gdnbench_kernels.common.ints import cdiv
from examples.kernel_sweeps.common import sweep_timing, rel_diff
dev = torch.device("cuda")
s = load_suite("results/records/h200/whole-walks-rule/ww.yaml")
rule = chunk.plan.whole_walks_pay
before = lambda layout, *a: cdiv(layout.max_len, chunk.CHUNK) >= chunk.plan.WHOLE_WALKS_MIN_CHUNKS
for case in select_cases(s, None):
    p = make_problem(case, s.seed, dev)
    chunk.plan.whole_walks_pay = before
    old = prepare_chunk(p, fused=True)
    chunk.plan.whole_walks_pay = rule
    new = prepare_chunk(p, fused=True)
    for v in (old, new): v.call()
    outs = [v.outputs().o.clone() for v in (old, new)]
    ms = measure_interleaved([(v.call, v.reset) for v in (old, new)], device=dev, config=sweep_timing(dev))
    a, b = (float(np.median(m.samples_us)) for m in ms)
    print(f"{case.id}  before {a:8.1f}  now {b:8.1f}  before/now {a / b:5.3f}  diff {rel_diff(outs[1], outs[0]):.1e}"
          f"  whole walks before/now: {' beside whole walks' in old.path}/{' beside whole walks' in new.path}",
          flush=True)

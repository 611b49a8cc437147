"""The Gluon sm90 walk at 32 and 16 value columns a program (its module's BV), beside the default plan,
interleaved per case: `python columns.py forced` forces the walk over whole sequences in one call (no pipeline,
on bv.yaml), `python columns.py whole` forces the default segments' whole walks onto it (whole_walk="sm90", on
wbv.yaml). Run from the repository root. For bv-state-first.txt, state-first.patch's walk ran as a second module
beside the committed one, at BV 32, 16 and 8."""
import sys
import numpy as np, torch
from gdnbench.suite import load_suite
from gdnbench.runner import select_cases
from gdnbench.problem import make_problem
from gdnbench.timing import measure_interleaved
from gdnbench.backends.triton_chunk import prepare_chunk
from gdnbench_kernels.chunk.sm90 import walk as sm90_walk
from examples.kernel_sweeps.common import sweep_timing, rel_diff
dev = torch.device("cuda")
whole = sys.argv[1] == "whole"
s = load_suite(f"results/records/h200/sm90-walk-columns/{'wbv' if whole else 'bv'}.yaml")
forced = dict(whole_walk="sm90") if whole else dict(walk="sm90", pipeline_chunks=0)
for case in select_cases(s, None):
    p = make_problem(case, s.seed, dev)
    runs, names, outs = [], [], []
    base = prepare_chunk(p, fused=True)
    base.call(); outs.append(base.outputs().o.clone())
    runs.append((base.call, base.reset)); names.append("default")
    for bv in (32, 16):
        name = f"{'whole-sm90' if whole else 'head'} BV={bv}"
        try:
            sm90_walk.BV = bv
            v = prepare_chunk(p, fused=True, **forced)
            v.call(); torch.cuda.synchronize()
            outs.append(v.outputs().o.clone())
            def fn(v=v, bv=bv):
                sm90_walk.BV = bv
                v.call()
            runs.append((fn, v.reset)); names.append(name)
        except Exception as e:
            print(f"  {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
    ms = measure_interleaved(runs, device=dev, config=sweep_timing(dev))
    ts = [float(np.median(m.samples_us)) for m in ms]
    print(case.id, flush=True)
    for n, t, o in zip(names, ts, outs):
        print(f"  {n:12s} {t:9.1f} us  diff vs default {rel_diff(o, outs[0]):.1e}", flush=True)
    sm90_walk.BV = 32

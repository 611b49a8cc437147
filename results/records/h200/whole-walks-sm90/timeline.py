"""Kernel timelines of the default plan, the forced sm90 walk and whole walks on sm90 (eager calls, torch.profiler).

    python results/records/h200/whole-walks-sm90/timeline.py "B=1,T=16384,H=16,HV=32,K=128,V=128,bf16,gn=1,mp=0,hl=inf"
"""
import sys, torch
from torch.profiler import profile, ProfilerActivity
from gdnbench.suite import load_suite
from gdnbench.runner import select_cases
from gdnbench.problem import make_problem
from gdnbench.backends.triton_chunk import prepare_chunk
dev = torch.device("cuda")
s = load_suite("decay")
for pat in sys.argv[1:]:
    case = select_cases(s, pat)[0]
    p = make_problem(case, s.seed, dev)
    for name, forced in [("default", {}), ("sm90", {"walk": "sm90", "pipeline_chunks": 0}),
                         ("whole-on-sm90", {"whole_walk": "sm90"})]:
        v = prepare_chunk(p, fused=True, **forced)
        for _ in range(3): v.call()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(2):
                v.call(); torch.cuda.synchronize()
        evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        evs.sort(key=lambda e: e.time_range.start)
        last = evs[len(evs) // 2:]
        t0 = last[0].time_range.start
        print(f"== {case.id} {name}: {v.path if hasattr(v, 'path') else ''}")
        for e in last:
            print(f"  {e.time_range.start - t0:9.1f} +{e.time_range.elapsed_us():8.1f} us  dev{e.device_index}"
                  f" {e.name[:90]}")
        sys.stdout.flush()

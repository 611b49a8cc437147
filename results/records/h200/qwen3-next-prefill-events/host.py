"""Host time per call of triton.chunk_fused (and FLA), and where it goes (cProfile), on qwen3-next prefill shapes."""
import cProfile, pstats, time, io, sys, torch
from gdnbench.suite import load_suite
from gdnbench.runner import select_cases
from gdnbench.problem import make_problem
from gdnbench.backends import get_backend
from gdnbench.backends.triton_chunk import prepare_chunk
dev = torch.device("cuda")
s = load_suite("suites/qwen3-next.yaml")
for case in select_cases(s, "prefill/padded/B=1,T=4096"):
    p = make_problem(case, s.seed, dev)
    v = prepare_chunk(p, fused=True)
    print(case.id, v.path if hasattr(v, "path") else "", flush=True)
    for _ in range(5): v.call()
    torch.cuda.synchronize()
    for n in (1, 20):
        t0 = time.perf_counter()
        for _ in range(n): v.call()
        t1 = time.perf_counter(); torch.cuda.synchronize(); t2 = time.perf_counter()
        print(f"  {n} calls: host {1e6 * (t1 - t0) / n:.1f} us/call, with the GPU {1e6 * (t2 - t0) / n:.1f} us/call", flush=True)
    pr = cProfile.Profile(); pr.enable()
    for _ in range(20): v.call()
    pr.disable(); torch.cuda.synchronize()
    out = io.StringIO(); pstats.Stats(pr, stream=out).sort_stats("cumulative").print_stats(30); print(out.getvalue()[:6000])
    out = io.StringIO(); pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(15); print(out.getvalue()[:3500])

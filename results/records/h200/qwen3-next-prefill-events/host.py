"""Host time per call of triton.chunk_fused at qwen3-next B=1 T=4096 and where it goes (cProfile); run from the root."""
import cProfile, pstats, time, io, torch
from gdnbench.suite import load_suite
from gdnbench.runner import select_cases
from gdnbench.problem import make_problem
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
        print(f"  {n} calls: host {1e6 * (t1 - t0) / n:.1f} us/call, "
              f"with the GPU {1e6 * (t2 - t0) / n:.1f} us/call", flush=True)
    pr = cProfile.Profile(); pr.enable()
    for _ in range(20): v.call()
    pr.disable(); torch.cuda.synchronize()
    for order, rows, chars in (("cumulative", 30, 6000), ("tottime", 15, 3500)):
        out = io.StringIO()
        pstats.Stats(pr, stream=out).sort_stats(order).print_stats(rows)
        print(out.getvalue()[:chars])

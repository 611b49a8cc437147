"""The bundled chunked-prefill Triton kernels (gdnbench_kernels.chunk, .chunk_fused) and their backends, on a CPU.

Triton picks its interpreter when a kernel is decorated, so the kernels run in one subprocess started
with TRITON_INTERPRET=1 (this module run as a script, ``_worker``): it loads the inputs this process
wrote, runs each launcher on NaN-poisoned outputs and workspaces, saves what the kernels left, then
runs ``gdnbench run`` (CliRunner) on a tiny suite. The subprocess starts with the session and works
while the other tests run (tests/interpreter.py), this module's sm_90 compiles among them; the references
(gdn_recurrent for o and the final state, chunk_intermediates for every stage) run here, in fp64.
"""

from __future__ import annotations

import importlib
import itertools
import re
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from gdnbench.backends import registry
from gdnbench.reference import chunk_intermediates, gate_from_raw, gdn_recurrent
from gdnbench.results import Status
from gdnbench.suite import Case
from tests.interpreter import InterpretedRun, start_worker, worker_results
from tests.kernel_inputs import kernel_inputs
from tests.sm90 import compile_sm90

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
ONCE = {"min_samples": 1, "max_samples": 1, "min_time_s": 0.0, "max_time_s": 0.01, "warmup": 1}
SUITE_CASES = [
    {"B": 1, "T": 70, "H": 1, "HV": 2, "D": 16, "qk_l2norm": "kernel", "initial_state": "random", "dtype": "fp32"},
    # bf16 runs too: the kernels compute bf16 dots from fp32 copies under the interpreter
    {"mode": "varlen", "seq_lens": [5, 66], "H": 1, "HV": 2, "D": 16, "gating": "raw", "dtype": "bf16"},
    {"B": 1, "T": 2, "H": 1, "D": 512, "dtype": "fp32"},  # beyond the envelope: a SKIP row
]
BACKENDS = ["triton.chunk", "triton.chunk_fused"]


# ---- inputs of the kernel cases (built here, run in the subprocess) -----------------------------------

def make(name: str, *, B=1, T=70, H=1, HV=2, K=64, V=64, dtype="fp32", seqs=None, h0=False, final=True,
         raw=False, l2=False, gate_norm=1.0, mask_p=0.0, fuse_output=False, seed=0) -> dict:
    """One case's inputs (FLA's recipe: q/k ~ U(0, 1), pre-normalised unless ``l2``; g log-sigmoid /
    gate_norm, zeroed with probability mask_p). Runs chunk_gdn, and chunk_fused_gdn with ``fuse_output``."""
    gen = torch.Generator().manual_seed(seed)
    kw, N = kernel_inputs(gen, B=B, T=T, H=H, HV=HV, K=K, V=V, dtype=dtype, seqs=seqs, raw=raw, l2=l2,
                          gate_norm=gate_norm, mask_p=mask_p)
    kw["output_final_state"] = final
    if h0:
        kw["initial_state"] = torch.randn(N, HV, K, V, generator=gen)
    return {"name": name, "kw": kw, "fuse_output": fuse_output}


KERNEL_CASES = [
    make("padded-T100-gva2-K64-h0", B=2, T=100, h0=True),
    make("varlen-gva2-K60-l2-fp16-h0", seqs=[37, 64, 0, 49], K=60, V=60, dtype="fp16", h0=True, l2=True,
         fuse_output=True),
    make("gn0.1-mask0.5-K16-V64", T=130, HV=1, K=16, V=64, gate_norm=0.1, mask_p=0.5),
    make("gn10-gva1-K64-V60-fp16-nofinal", T=128, H=2, HV=2, V=60, dtype="fp16", gate_norm=10, final=False,
         fuse_output=True),
    make("raw-l2-K16-gva2", T=90, K=16, V=16, raw=True, l2=True, h0=True, fuse_output=True),
    # decays near 1 (gate_norm 100): a state carries across many chunks, so every warm-up walk reaches back
    # to its sequence's start (and 5 chunks: three pipeline groups of 2, both hand-off buffers used)
    make("weak-decay-varlen-K16-h0", seqs=[130, 0, 64, 270], K=16, V=16, gate_norm=100, h0=True),
    # decays of about -3 a chunk: warm-up walks of 7 chunks that stop before the sequence's start, whose last
    # chunks' states enter the segment nearly undecayed (a wrong warm-up shows in the outputs)
    make("gn10-long-K16-h0", T=600, HV=1, K=16, V=16, gate_norm=10, h0=True),
]
BY_NAME = {c["name"]: c for c in KERNEL_CASES}

# Run with every tensor a kernel touches (inputs, layout, workspace, outputs) inside a larger buffer whose
# margins hold a sentinel (NaN, a huge int), once per block width (BV) among the GPU's candidates of every
# tuned kernel: a write outside a tensor changes a margin, an unmasked read outside one poisons the
# outputs. (An illegal address that chunk_fused's prep kernel hit on an H100 inside a full run was never
# reproduced under compute-sanitizer; these runs rule out the kernels' own index and mask logic.)
GUARD_CASES = [
    make("guard-padded-T70-K64-mask0.5-bf16", B=2, T=70, H=1, HV=2, dtype="bf16", mask_p=0.5),
    make("guard-varlen-K60", seqs=[37, 64, 0, 70, 1], K=60, V=60, dtype="fp16", h0=True),
    make("guard-K100-V128-gva2-raw-l2", seqs=[5, 66], K=100, V=128, raw=True, l2=True),
]
GUARD = 2048  # sentinel elements before and after every tensor

STAGES = ("gc", "Ai", "W", "U", "v_new", "h")  # what a workspace may hold, compared with the reference


# ---- the subprocess -----------------------------------------------------------------------------------

def _worker(inputs: str, outputs: str, suite: str, run_dir: str) -> None:
    """Runs under TRITON_INTERPRET=1: each case through both launchers, then `gdnbench run` on the suite."""
    from typer.testing import CliRunner

    from gdnbench.cli import app
    from gdnbench_kernels import chunk

    def no_host_sync(*_a, **_k):
        raise AssertionError("host sync in the launcher")

    results: dict = {"INTERPRETED": chunk.INTERPRETED,
                     "configs": len(chunk.state.STATE_CONFIGS) + len(chunk.output.OUTPUT_CONFIGS)}
    for case in torch.load(inputs):
        kw = dict(case["kw"])
        q, v = kw["q"], kw["v"]
        layout = chunk.ChunkLayout.build(q.shape[0], q.shape[1], kw.get("cu_seqlens"), q.device)
        # warm-up: segments of one chunk from a warm-up walk (its output always fused in): one chunk back under
        # strong decay, back to the sequence's start (and its h0) under weak decay
        segments = {"warm-up": chunk.SegmentLayout.build(layout, 1)}
        # pairs: the output pass over pairs of chunks (the output never fused in); pipe: that, pipelined in
        # groups of two chunks of every sequence; pipe-out: pipelined with the output fused into the walk
        variants = (("chunk", True), ("fused", False), ("warm-up", False), ("pairs", False),
                    ("pipe", False), ("pipe-out", False))
        for variant, stages in variants:
            span = 2 if variant in ("pairs", "pipe") else 1
            fuse = (variant == "fused" and case["fuse_output"]) or variant in ("pipe-out", "warm-up")
            try:
                pipe = chunk.PipelineLayout.build(layout, 2) if variant.startswith("pipe") else None
                ws = chunk.ChunkWorkspace.allocate(layout, q, v, stages=stages, raw_gate="a" in kw, fuse_output=fuse,
                                                   final_state=kw["output_final_state"],
                                                   segments=segments.get(variant), output_span=span,
                                                   pipeline=pipe is not None)
                for name in ("gc", "W", "U", "A_diag", "beta", "Ai", "v_new", "h", "final_state", "handoff"):
                    if getattr(ws, name) is not None:
                        getattr(ws, name).fill_(float("nan"))
                out = torch.full_like(v, float("nan"))
                saved = torch.Tensor.item, torch.Tensor.tolist
                # no .item() / .tolist() in a call with a prebuilt layout (graph capture)
                torch.Tensor.item = torch.Tensor.tolist = no_host_sync
                try:
                    if variant == "chunk":
                        o, final = chunk.chunk_gdn(**kw, layout=layout, out=out, workspace=ws)
                    else:
                        o, final = chunk.chunk_fused_gdn(
                            **kw, layout=layout, out=out, workspace=ws, fuse_output=fuse, output_span=span,
                            segments=segments.get(variant),
                            pipeline=pipe)
                finally:
                    torch.Tensor.item, torch.Tensor.tolist = saved
                res = {"o": o, "final": final, "out_is_o": o is out, "h_offsets": layout.blocks(span)[2]}
                res.update({name: getattr(ws, name) for name in STAGES})
                if variant == "pipe":  # h holds the groups in turn: back to the batch's sequence-major order
                    res["h"] = ws.h[_sequence_major(pipe, span)]
            except Exception as e:  # reported by the test of that case
                res = {"error": f"{type(e).__name__}: {e}"}
            results[(case["name"], variant)] = res
    results["guards"] = _guarded_runs(chunk)
    cli = CliRunner().invoke(app, ["run", suite, "--out", run_dir, "--device", "cpu"])
    results["cli"] = {"exit_code": cli.exit_code, "output": cli.output[-4000:]}
    torch.save(results, outputs)


def _sequence_major(pipe, span: int) -> list[int]:
    """The workspace's blocks of a pipelined call (PipelineLayout: group by group, each sequence-major) in
    the order of one call's (sequence by sequence, its groups in turn)."""
    order = []
    for n in range(len(pipe.spans)):
        for group, first in zip(pipe.groups, pipe.firsts(span)):
            offsets = group.blocks(span)[2]
            order += range(first + int(offsets[n]), first + int(offsets[n + 1]))
    return order


def guard_rounds(chunk) -> int:
    """How many guarded runs per case and variant: one per block width (BV) of the kernel with the most;
    the interpreter runs no warps or stages, so a candidate's BV is all that changes what it does (the
    prep kernel has no block width: its one config runs in every round)."""
    lists = (chunk.state.FUSED_STATE_CANDIDATES, chunk.state.STATE_CANDIDATES, chunk.output.OUTPUT_CANDIDATES,
             chunk.output.OUTPUT_SPAN2_CANDIDATES)
    return max(len({cand[0] for cand in c}) for c in lists)


def _guarded_runs(chunk) -> dict:
    """Each GUARD_CASES case through chunk_gdn and chunk_fused_gdn (output fused and not), every tensor
    guarded, in ``guard_rounds`` rounds (round i: each tuned kernel forced to its i-th block width):
    the number of runs and what went wrong, by run."""
    import triton

    bufs: list[tuple[torch.Tensor, int, float]] = []

    def guarded(x: torch.Tensor | None = None, *, shape=None, dtype=None) -> torch.Tensor:
        shape, dtype = (x.shape, x.dtype) if x is not None else (shape, dtype)
        sentinel = float("nan") if dtype.is_floating_point else 2**30 + 7
        n = 1
        for s in shape:
            n *= s
        big = torch.full((n + 2 * GUARD,), sentinel, dtype=dtype)
        view = big[GUARD:GUARD + n].view(*shape)
        if x is not None:
            view.copy_(x)
        bufs.append((big, n, sentinel))
        return view

    def intact(big: torch.Tensor, n: int, sentinel: float) -> bool:
        margins = torch.cat([big[:GUARD], big[GUARD + n:]])
        return bool(torch.isnan(margins).all()) if big.dtype.is_floating_point else bool((margins == sentinel).all())

    tuned = {"fused-state": (chunk.state.fused_state_kernel, chunk.state.FUSED_STATE_CANDIDATES),
             "state": (chunk.state.state_kernel, chunk.state.STATE_CANDIDATES),
             "output": (chunk.output.output_kernel, chunk.output.OUTPUT_CANDIDATES),
             "output-pairs": (chunk.output.output_span2_kernel, chunk.output.OUTPUT_SPAN2_CANDIDATES)}
    saved = {name: (kernel.configs, kernel.best_config) for name, (kernel, _) in tuned.items()}
    rounds = guard_rounds(chunk)
    problems: dict[str, str] = {}
    runs = 0
    try:
        for case in GUARD_CASES:
            kw = dict(case["kw"])
            q, v = kw["q"], kw["v"]
            (B, T, _, K), (HV, V) = q.shape, v.shape[2:]
            lay0 = chunk.ChunkLayout.build(B, T, kw.get("cu_seqlens"), q.device)
            seg0 = chunk.SegmentLayout.build(lay0, 1)
            for i in range(rounds):  # round i: every kernel's i-th block width (its last once its list ends)
                for kernel, candidates in tuned.values():
                    widths = sorted({cand[0] for cand in candidates})
                    kernel.configs = [triton.Config({"BV": widths[min(i, len(widths) - 1)]}, num_warps=4, num_stages=1)]
                    kernel.cache.clear()
                # warm-up reruns the state pass's kernel over segments: its block widths are the other
                # variants' rounds, so one round of it covers the warm-up walk, which reads before its segments
                variants = (("chunk", True, False), ("fused", False, False), ("fused-out", False, True),
                            ("fused-pairs", False, False), *([("warm-up", False, True)] if i == 0 else []))
                for variant, stages, fuse in variants:
                    bufs.clear()
                    span = 2 if variant == "fused-pairs" else 1

                    def guarded_layout(x):
                        return chunk.ChunkLayout(N=x.N, NT=x.NT, max_len=x.max_len, tokens=x.tokens,
                                                 spans=x.spans, seq_bounds=guarded(x.seq_bounds),
                                                 chunk_indices=guarded(x.chunk_indices),
                                                 chunk_offsets=guarded(x.chunk_offsets), NP=x.NP,
                                                 pair_indices=guarded(x.pair_indices),
                                                 pair_offsets=guarded(x.pair_offsets))

                    lay = guarded_layout(lay0)
                    segs = None if variant != "warm-up" else chunk.SegmentLayout(
                        chunks=1, layout=guarded_layout(seg0.layout), seg_offsets=guarded(seg0.seg_offsets),
                        parent=guarded(seg0.parent), parent_bounds=guarded(seg0.parent_bounds),
                        sequences=seg0.sequences, sequence_spans=seg0.sequence_spans)
                    args = {name: guarded(x) if isinstance(x, torch.Tensor) and name != "cu_seqlens" else x
                            for name, x in kw.items()}
                    args["cu_seqlens"] = None if kw.get("cu_seqlens") is None else guarded(kw["cu_seqlens"])
                    f32, dt, BT = torch.float32, q.dtype, B * T
                    ws = chunk.ChunkWorkspace(
                        gc=guarded(shape=(BT, HV), dtype=f32),
                        A_diag=guarded(shape=(lay.NT, HV, chunk.CHUNK, 16), dtype=f32),
                        Ai=guarded(shape=(BT, HV, chunk.CHUNK), dtype=dt),
                        W=guarded(shape=(BT, HV, K), dtype=dt) if stages else None,
                        U=guarded(shape=(BT, HV, V), dtype=dt) if stages else None,
                        beta=guarded(shape=(BT, HV), dtype=f32) if stages and "a" in kw else None,
                        v_new=None if fuse else guarded(shape=(BT, HV, V), dtype=dt),
                        h=None if fuse else guarded(shape=(lay.blocks(span)[0], HV, K, V), dtype=dt),
                        final_state=guarded(shape=(lay.N, HV, K, V), dtype=f32))
                    out = guarded(shape=v.shape, dtype=dt)
                    common = dict(layout=lay, out=out, workspace=ws)
                    if variant == "chunk":
                        o, final = chunk.chunk_gdn(**args, **common)
                    else:
                        o, final = chunk.chunk_fused_gdn(**args, **common, fuse_output=fuse, segments=segs,
                                                         output_span=span)
                    run = f"{case['name']} {variant} " + ", ".join(
                        f"{name}={kernel.configs[0].kwargs['BV']}"
                        for name, (kernel, _) in tuned.items())
                    runs += 1
                    if not all(intact(*b) for b in bufs):
                        problems[run] = "a guard margin was written"
                    elif not (torch.isfinite(o).all() and torch.isfinite(final).all()):
                        problems[run] = "non-finite outputs (a read outside a tensor)"
    finally:
        for name, (kernel, _) in tuned.items():  # as they were, for the CLI run (its rows name the configs)
            kernel.configs, kernel.best_config = saved[name]
            kernel.cache.clear()
    return {"runs": runs, "problems": problems}


if __name__ == "__main__":
    _worker(*sys.argv[1:5])


def start_interpreted(tmp: Path) -> InterpretedRun:
    """The kernel cases and the suite's run, in a subprocess (tests/interpreter.py)."""
    return start_worker(__name__, tmp, KERNEL_CASES, {
        "name": "triton-chunk", "backends": [*BACKENDS, "torch.chunk"], "baseline": "torch.chunk", "timing": ONCE,
        "cases": SUITE_CASES, "reference": {"precision": "fp64"}})


@pytest.fixture(scope="module")
def interpreted(interpreted_runs) -> dict:
    return worker_results(interpreted_runs[__name__])


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# ---- the compiled path, without a GPU (runs while the subprocess works) --------------------------------

def _compile_specs(D: int) -> list[tuple[str, str, dict, int]]:
    """(module, kernel, constexprs, num_warps) of every kernel, bf16, K = V = D, as the launchers use them."""
    shape = dict(H=2, HV=4, K=D, V=D, BT=64, BK=D)
    prep_shape = dict(H=2, HV=4, K=D, BT=64, BK=D)
    return [
        ("chunk.gate", "chunk_gate_kernel", dict(HV=4, BT=64, RAW_GATE=True, g=None, beta=None), 1),
        ("chunk.prep", "kkt_solve_kernel", dict(H=2, HV=4, K=D, BT=64, BK=D, L2NORM=True, IEEE=False), 4),
        ("chunk.wu", "wu_kernel", dict(shape, BV=64, L2NORM=False, IEEE=False), 8),
        ("chunk.state", "_state_fn", dict(shape, USE_H0=True, STORE_HT=True, FUSE_OUTPUT=False, WARM_UP=False,
                                          SPAN=1, FROM_AI=False, L2NORM=False, IEEE=False, BV=32, q=None, v=None,
                                          Ai=None), 4),
        ("chunk.state", "_state_fn", dict(shape, USE_H0=True, STORE_HT=True, FUSE_OUTPUT=False, WARM_UP=False,
                                          SPAN=2, FROM_AI=True, L2NORM=False, IEEE=False, BV=32, q=None, W=None,
                                          U=None), 4),
        ("chunk.state", "_state_fn", dict(shape, USE_H0=False, STORE_HT=True, FUSE_OUTPUT=True, WARM_UP=False,
                                          SPAN=1, FROM_AI=True, L2NORM=True, IEEE=False, BV=16, W=None, U=None,
                                          h=None, v_new=None, h0=None), 4),
        ("chunk.state", "_state_fn", dict(shape, USE_H0=True, STORE_HT=True, FUSE_OUTPUT=True, WARM_UP=True,
                                          SPAN=1, FROM_AI=True, L2NORM=False, IEEE=False, BV=32, W=None, U=None,
                                          h=None, v_new=None), 4),
        ("chunk.output", "output_kernel", dict(shape, SPAN=1, L2NORM=True, IEEE=False, BV=64), 4),
        ("chunk.output", "output_span2_kernel", dict(shape, SPAN=2, L2NORM=False, IEEE=False, BV=64), 4),
        ("chunk.prep", "fused_prep_kernel", dict(prep_shape, RAW_GATE=False, L2NORM=False, IEEE=False, a=None,
                                                   b=None, A_log=None, dt_bias=None), 4),
        ("chunk.prep", "fused_prep_kernel", dict(prep_shape, RAW_GATE=True, L2NORM=True, IEEE=False, g=None,
                                                   beta=None), 4),
    ]


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
@pytest.mark.parametrize("D", [128, 64])
@pytest.mark.parametrize("index", range(11))
def test_kernel_compiles_for_sm90(D, index):
    """The interpreter runs Python, not Triton's code generator: compile for sm_90 (to a cubin) on this CPU."""
    from gdnbench_kernels import chunk

    module, name, const, warps = _compile_specs(D)[index]
    fn = getattr(importlib.import_module(f"gdnbench_kernels.{module}"), name)
    ptr = dict(q="bf16", k="bf16", v="bf16", beta="bf16", a="bf16", b="bf16", Ai="bf16", W="bf16", U="bf16", h="bf16",
               v_new="bf16", o="bf16", seq_bounds="i64", chunk_indices="i32", h_offsets="i32", block_indices="i32",
               seg_offsets="i32", seg_parent="i32", parent_bounds="i64")
    scalars = {"scale": "fp32", "state_tier": "i32", "chunk_tier": "i32"}
    sig = {arg: "constexpr" if arg in const else scalars.get(arg) or f"*{ptr.get(arg, 'fp32')}" for arg in fn.arg_names}
    compile_sm90(fn, sig, const, interpreted=chunk.INTERPRETED, num_warps=warps)


# ---- the kernels against the references ---------------------------------------------------------------

O_TOL = {torch.float32: 1e-5, torch.float16: 2e-3}  # vs the fp64 recurrence: rounding to the dtype
STAGE_TOL = {torch.float32: 1e-5, torch.float16: 2e-3}  # intermediates are stored in the input dtype


def references(kw: dict):
    """(o, final_state) from gdn_recurrent and every stage from chunk_intermediates, fp64."""
    if "a" in kw:
        g, beta = gate_from_raw(kw["a"], kw["b"], kw["A_log"], kw["dt_bias"])
    else:
        g, beta = kw["g"], kw["beta"]
    common = dict(scale=kw["scale"], qk_l2norm=kw["qk_l2norm"], compute_dtype=torch.float64,
                  initial_state=kw.get("initial_state"), cu_seqlens=kw.get("cu_seqlens"))
    o, final = gdn_recurrent(kw["q"], kw["k"], kw["v"], g, beta, **common)
    return o, final, chunk_intermediates(kw["q"], kw["k"], kw["v"], g, beta, **common)


@pytest.mark.parametrize("variant", ["chunk", "fused", "warm-up", "pairs", "pipe", "pipe-out"])
@pytest.mark.parametrize("name", list(BY_NAME))
def test_kernel_matches_the_references(interpreted, name, variant):
    case = BY_NAME[name]
    kw = case["kw"]
    got = interpreted[(name, variant)]
    assert "error" not in got, got.get("error")
    # the hand-off between groups keeps the walk's fp32 state: a pipelined call's results are one call's
    if variant == "pipe":
        pairs = interpreted[(name, "pairs")]
        assert torch.equal(got["o"], pairs["o"]) and torch.equal(got["h"], pairs["h"])
        assert got["final"] is None or torch.equal(got["final"], pairs["final"])
    if variant == "pipe-out" and case["fuse_output"]:
        assert torch.equal(got["o"], interpreted[(name, "fused")]["o"])
    o_ref, final_ref, ref = references(kw)
    dt = kw["q"].dtype
    o = got["o"]
    assert got["out_is_o"] and o.dtype == dt and torch.isfinite(o).all(), "outputs left unwritten"
    assert rel(o, o_ref) < O_TOL[dt], rel(o, o_ref)
    if kw["output_final_state"]:
        assert got["final"].dtype == torch.float32 and rel(got["final"], final_ref) < STAGE_TOL[dt]
    else:
        assert got["final"] is None

    B, T, HV = kw["v"].shape[:3]
    # chunk_fused stores (I + A)^-1 diag(beta) and never W or U
    flat = {"gc": ref.gc, "Ai": ref.A_inv if variant == "chunk" else ref.A_inv_beta, "W": ref.W, "U": ref.U,
            "v_new": ref.v_new}
    expect = {"gc", "Ai"} | ({"W", "U"} if variant == "chunk" else set())
    if not (variant == "fused" and case["fuse_output"]) and variant not in ("pipe-out", "warm-up"):
        expect |= {"v_new", "h"}
    assert {s for s in STAGES if got[s] is not None} == expect
    for stage in expect - {"h"}:
        mine = got[stage].reshape(B, T, *got[stage].shape[1:])
        assert torch.isfinite(mine).all(), f"{stage} left unwritten"
        assert rel(mine, flat[stage]) < (1e-6 if stage == "gc" else STAGE_TOL[dt]), (stage, rel(mine, flat[stage]))
    if "h" in expect:
        # sequence n's chunk (pair) c sits at h_offsets[n] + c; a pair's state is its first chunk's
        offsets, span = got["h_offsets"].tolist(), 2 if variant in ("pairs", "pipe") else 1
        h = got["h"]
        assert torch.isfinite(h).all() and h.shape[0] == offsets[-1]
        ref_h = torch.cat([ref.h[n, :, ::span][:, : offsets[n + 1] - offsets[n]].transpose(0, 1)
                           for n in range(len(offsets) - 1)])
        if ref_h.norm() == 0:  # only zero initial states stored (one pair a sequence, no initial state)
            assert (h == 0).all()
        else:
            assert rel(h, ref_h) < STAGE_TOL[dt], rel(h, ref_h)


def test_no_kernel_touches_memory_outside_its_tensors(interpreted):
    """Every GPU candidate config of every tuned kernel, both variants, guarded tensors (_guarded_runs)."""
    from gdnbench_kernels import chunk

    guards = interpreted["guards"]
    assert guards["runs"] == len(GUARD_CASES) * (guard_rounds(chunk) * 4 + 1)
    assert guards["problems"] == {}


def test_cases_cover_the_issue():
    """Tails shorter than a chunk, several sequences (one empty), GVA 2, head dims 60/64/16, strong and
    weak decay with masking, raw gating reaching softplus's tails, in-kernel L2 norm, both output paths."""
    kws = [c["kw"] for c in KERNEL_CASES]
    assert any(kw["q"].shape[1] % 64 for kw in kws) and any(len(kw.get("cu_seqlens", [])) > 3 for kw in kws)
    assert {kw["v"].shape[2] // kw["q"].shape[2] for kw in kws} >= {1, 2}
    assert {kw["q"].shape[3] for kw in kws} >= {16, 60, 64}
    assert (kws[2]["g"] == 0).float().mean() > 0.3 and kws[2]["g"].min() < -5 and kws[3]["g"].min() > -0.2
    a = BY_NAME["raw-l2-K16-gva2"]["kw"]["a"].float()
    assert (a + 1 > 20).any() and (a < -20).any()
    assert {c["fuse_output"] for c in KERNEL_CASES} == {True, False}


def test_gdnbench_run_end_to_end_under_the_interpreter(interpreted):
    assert interpreted["INTERPRETED"] is True and interpreted["configs"] == 2
    cli = interpreted["cli"]
    assert cli["exit_code"] == 0, cli["output"]
    df = pd.read_csv(interpreted["run_dir"] / "results.csv")
    for name in BACKENDS:
        rows = df[df.backend == name]
        ran = rows[rows.status != Status.SKIP]
        assert len(ran) == len(SUITE_CASES) - 1 and (ran.status == Status.PASS).all(), ran[["case_id", "status", "error"]]
        assert ran.path.str.contains("triton interpreter").all() and ran.path.str.contains("BV=32 w4").all()
        assert ran.path.str.contains("raw gating fused").sum() == 1
        assert set(rows[rows.status == Status.SKIP].error) == {f"{name}: head dims up to 256, case has K=512, V=512"}
    # few heads and K < 128: fuse_output_default keeps the parallel output pass
    assert not df[df.backend == "triton.chunk_fused"].path.str.contains("output fused").any()
    fused = df[(df.backend == "triton.chunk_fused") & (df.status != Status.SKIP)]
    assert fused.path.str.contains("prep[w4 s1]", regex=False).all()  # the interpreter's one prep config


@pytest.mark.parametrize("B,T,seqs,HV,K,fused", [
    (8, 512, None, 8, 128, True),  # 64 sequence-heads of 8 chunks, K = 128
    (8, 512, None, 8, 64, False),  # K = 64: the output pass is cheap enough at 64 pairs
    (16, 512, None, 8, 64, True),  # but not at 128
    (4, 512, None, 8, 128, False),  # 32 pairs: too few programs for a sequential walk
    (4, 8192, None, 32, 128, True),  # long sequences too (qwen3-next B=4)
    (1, 65536, None, 32, 128, False),  # 32 pairs
    (1, 0, [100] * 15 + [600], 8, 128, False),  # the longest sequence would hold up the pass
    (1, 0, [100] * 15 + [500], 8, 128, True),  # unless it is short
    (1, 0, [100] * 16, 8, 128, True),
    (1, 63, None, 1, 64, True),  # one chunk a sequence: no walk to wait for
    (1, 0, [15, 64, 3], 1, 64, True),
    (1, 65, None, 1, 64, False),
])
def test_output_fused_by_default_only_where_measured_faster(B, T, seqs, HV, K, fused):
    from gdnbench_kernels import chunk

    cu = None if seqs is None else torch.tensor([0, *torch.tensor(seqs).cumsum(0).tolist()])
    layout = chunk.ChunkLayout.build(B, T if seqs is None else sum(seqs), cu, CPU)
    assert chunk.plan.fuse_output_default(layout, HV, K) is fused


@pytest.mark.parametrize("B,T,HV,K,span", [
    (1, 4096, 32, 128, 2),  # qwen3-next B=1: 2,048 chunk-heads
    (1, 4032, 32, 128, 1),  # 2,016
    (1, 8192, 32, 64, 1),  # K = 64: h is a smaller share of the bytes (measured at K = 128 only)
])
def test_output_over_pairs_of_chunks_only_for_large_problems(B, T, HV, K, span):
    from gdnbench_kernels import chunk

    layout = chunk.ChunkLayout.build(B, T, None, CPU)
    assert chunk.plan.output_span_default(layout, HV, K) == span
    assert chunk.plan.output_span_default(layout, HV, K, chunk.SegmentLayout.build(layout, 8)) == 1


def test_warm_up_segments_fold_the_output_into_the_walk():
    """B=1 T=65536 HV=32: one walk is too few to fuse the outputs into; warm-up segments always take them."""
    from gdnbench_kernels import chunk

    layout = chunk.ChunkLayout.build(1, 65536, None, CPU)
    assert not chunk.plan.fuse_output_default(layout, 32, 128)
    assert chunk.plan.fuse_output_default(layout, 32, 128, chunk.SegmentLayout.build(layout, 32))
    assert chunk.plan.fuse_output_default(layout, 32, 128, chunk.SegmentLayout.build(layout, 64))


# ---- host side, without running a kernel --------------------------------------------------------------

def test_layout_lists_chunks_per_sequence():
    from gdnbench_kernels.chunk import ChunkLayout

    lay = ChunkLayout.build(1, 200, torch.tensor([0, 64, 64, 65, 200]), CPU)
    assert (lay.N, lay.NT, lay.max_len) == (4, 5, 135)
    assert lay.chunk_indices.tolist() == [[0, 0], [2, 0], [3, 0], [3, 1], [3, 2]]
    assert lay.chunk_offsets.tolist() == [0, 1, 1, 2, 5]
    # pairs of chunks: sequence 3's three chunks make a pair and a single
    assert lay.NP == 4 and lay.pair_indices.tolist() == [[0, 0], [2, 0], [3, 0], [3, 1]]
    assert lay.blocks(2)[2].tolist() == [0, 1, 1, 2, 4] and lay.blocks(1)[0] == 5
    padded = ChunkLayout.build(3, 65, None, CPU)
    assert padded.seq_bounds.tolist() == [[0, 65], [65, 130], [130, 195]] and padded.NT == 6
    with pytest.raises(ValueError, match="end at T=200"):
        ChunkLayout.build(1, 200, torch.tensor([0, 70, 190]), CPU)


def test_walks_are_dealt_longest_first_to_the_least_loaded_program():
    """ChunkLayout.walk_order: each walk (sequence n, head h: n * heads + h) once; equal walks in their order round
    the programs (the stride a persistent kernel would take); unequal ones so that the longest do not meet on one
    program, as they do in order; kept for the next call."""
    from gdnbench_kernels.chunk import ChunkLayout, WalkOrder
    from gdnbench_kernels.chunk.layout import warm_up_loads

    def mine(order: WalkOrder, p: int) -> list[int]:  # program p's walks, in its order
        return order.walks[:, 0].tolist()[p::order.programs][:order.counts[p]]

    def loads(order: WalkOrder, chunks: list[int]) -> list[int]:
        return [sum(chunks[x] for x in mine(order, p)) for p in range(order.programs)]

    padded = ChunkLayout.build(5, 130, None, CPU)  # 10 walks of 3 chunks on 4 programs
    order = padded.walk_order(2, 4)
    # rows go round the programs: program p's i-th walk in row 4 i + p, rows past a program's count unused
    assert order.counts.tolist() == [3, 3, 2, 2]
    assert [mine(order, p) for p in range(4)] == [[0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]
    # whole sequences: output from their first token, from h0 and to ht
    assert order.walks[4].tolist() == [4, 260, 260, 390, 3] and order.walks[10:].tolist() == [[-1, 0, 0, 0, 0]] * 2
    assert order.program_chunks.tolist() == [9, 9, 6, 6]
    assert (order.makespan, order.chunks) == (9, 30) and order.fill(4) == pytest.approx(30 / 36)
    assert padded.walk_order(2, 4) is order and padded.walk_order(2, 3) is not order
    lengths = [448, 64, 64, 448, 384, 128, 0, 320]  # chunks 7 1 1 7 6 2 0 5
    lay = ChunkLayout.build(1, sum(lengths), torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()]), CPU)
    chunks = [-(-n // 64) for n in lengths]
    order = lay.walk_order(1, 3)
    assert sorted(w for p in range(3) for w in mine(order, p)) == list(range(8))
    assert loads(order, chunks) == order.program_chunks.tolist() == [9, 9, 11]  # in order: 7 + 7 + 0, 1 + 6 + 5, 1 + 2
    bounds = lay.seq_bounds.tolist()
    assert all([s, e] == bounds[w] for w, s, _, e, _ in order.walks.tolist() if w >= 0)
    assert order.makespan == 11 and order.fill(3) == pytest.approx(29 / 33)
    with pytest.raises(ValueError, match="at least one program"):
        lay.walk_order(1, 0)
    # dealt by given loads (warm-up segments: their own chunks and one of warm-up but on a sequence's first)
    assert warm_up_loads([3, 0, 5], 2) == [2, 2, 0, 2, 3, 2]
    order = WalkOrder.deal([(w, 0, 0, 64, 3) for w in range(4)], [1, 3, 2, 1], 2, CPU)
    assert [mine(order, p) for p in range(2)] == [[1, 3], [2, 0]] and order.program_chunks.tolist() == [4, 3]
    assert (order.makespan, order.chunks) == (4, 4)
    # drop_empty: walks of no token go to no program; with none left, every program still finds a (padding) row
    order = WalkOrder.deal([(0, 64, 64, 64, 2), (1, 0, 0, 64, 3)], [0, 1], 2, CPU, drop_empty=True)
    assert order.empty.tolist() == [0] and [mine(order, p) for p in range(2)] == [[1], []]
    order = WalkOrder.deal([(0, 0, 0, 0, 2)], [0], 2, CPU, drop_empty=True)
    assert order.counts.tolist() == [0, 0] and order.walks.tolist() == [[-1, 0, 0, 0, 0]] * 2


def test_a_regular_first_round_is_told_apart():
    """WalkOrder.regular: (T, flags) only where every program's first row is the one a kernel would compute, walk p
    over T tokens from T (p // heads): padded sequences, whole or as one segment each, dealt in order."""
    from gdnbench_kernels.chunk import ChunkLayout, SegmentLayout, WalkOrder

    padded = ChunkLayout.build(5, 130, None, CPU)  # 10 walks of 3 chunks
    assert padded.walk_order(2, 4).regular(2) == (130, 3)
    assert padded.walk_order(2, 4).regular(1) == (0, 0)  # walk p's sequence is p // 2, not p
    assert padded.walk_order(2, 12).regular(2) == (0, 0)  # programs 10 and 11 have no walk
    one_each = SegmentLayout.build(padded, 3).walks(2, 4)
    assert one_each.regular(2) == (130, 2)  # a segment that ends its sequence stores ht; the kernel finds h0
    assert SegmentLayout.build(padded, 2).walks(2, 4).regular(2) == (0, 0)  # a sequence's second
    varlen = ChunkLayout.build(1, 390, torch.tensor([0, 130, 260, 390]), CPU)  # equal, but longest first: in order
    assert varlen.walk_order(1, 3).regular(1) == (130, 3)
    varlen = ChunkLayout.build(1, 390, torch.tensor([0, 100, 260, 390]), CPU)
    assert varlen.walk_order(1, 3).regular(1) == (0, 0)
    assert WalkOrder.deal([(0, 0, 0, 0, 3)], [0], 1, CPU).regular(1) == (0, 0)  # an empty walk


def test_segments_cut_each_sequence_at_chunk_boundaries():
    from gdnbench_kernels import chunk

    lay = chunk.ChunkLayout.build(1, 400, torch.tensor([0, 130, 130, 194, 400]), CPU)
    # 128 tokens a segment; the empty sequence gets one empty segment, whose program stores its final state
    seg = chunk.SegmentLayout.build(lay, 2)
    assert seg.layout.spans == ((0, 128), (128, 130), (130, 130), (130, 194), (194, 322), (322, 400))
    assert seg.seg_offsets.tolist() == [0, 2, 3, 4, 6] and seg.parent.tolist() == [0, 0, 1, 2, 3, 3]
    # a segment's chunks keep their global numbers, where the output pass finds their states
    assert seg.layout.chunk_offsets.tolist() == [0, 2, 3, 3, 4, 6, 8]
    assert lay.chunk_offsets.tolist() == [0, 3, 3, 4, 8]
    with pytest.raises(ValueError, match="at least one chunk"):
        chunk.SegmentLayout.build(lay, 0)
    kw = BY_NAME["weak-decay-varlen-K16-h0"]["kw"]
    lay = chunk.ChunkLayout.build(1, 464, kw["cu_seqlens"], CPU)
    other = chunk.ChunkLayout.build(1, 464, torch.tensor([0, 464]), CPU)
    with pytest.raises(ValueError, match="must cut this batch's layout"):
        chunk.chunk_fused_gdn(**kw, layout=lay, segments=chunk.SegmentLayout.build(other, 2))


@pytest.mark.parametrize("chunks", [1, 2, 3])
def test_warm_up_segments_walk_from_their_sequences_start(chunks):
    """SegmentLayout.walks: each segment and head once, as its sequence's walk (n * heads + h) from the sequence's
    start, where the kernel finds its warm-up start, outputting from the segment's first token, with ht only where it
    ends its sequence and h0 left to the kernel; dealt as its chunks and one of warm-up but on a sequence's first;
    an empty sequence's walks dealt to no program but listed apart."""
    from gdnbench_kernels import chunk

    lengths = [200, 0, 64, 300]  # chunks 4, 0, 1, 5
    layout = chunk.ChunkLayout.build(1, sum(lengths), torch.tensor([0, *itertools.accumulate(lengths)]), CPU)
    segments = chunk.SegmentLayout.build(layout, chunks)
    heads, programs = 2, 3
    order = segments.walks(heads, programs)
    assert segments.walks(heads, programs) is order
    rows = [tuple(order.walks[i * programs + p].tolist()) for p in range(programs) for i in range(order.counts[p])]
    expected = []
    for n, (start, end) in enumerate(layout.spans):
        for first in range(start, end, chunks * chunk.CHUNK):
            last = min(first + chunks * chunk.CHUNK, end)
            expected += [(n * heads + h, start, first, last, chunk.layout.WALK_STORES_HT if last == end else 0)
                         for h in range(heads)]
    assert sorted(rows) == sorted(expected)
    assert order.empty.tolist() == [1 * heads + h for h in range(heads)]  # the empty sequence's, dealt to none
    loads = [[-(-(end - first) // chunk.CHUNK) + (first > start) for _, start, first, end, _ in
              [tuple(order.walks[i * programs + p].tolist()) for i in range(order.counts[p])]] for p in range(programs)]
    assert order.program_chunks.tolist() == [sum(mine) for mine in loads]
    assert order.makespan == max(map(sum, loads)) and order.chunks == sum(-(-n // 64) for n in lengths) * heads


def test_a_layout_of_another_batch_is_rejected():
    """A padded layout only says B sequences: one built for a longer T must not reach the kernels, whose
    bounds would then run past the ends of every token-indexed buffer."""
    from gdnbench_kernels import chunk

    kw = BY_NAME["padded-T100-gva2-K64-h0"]["kw"]
    for lay in (chunk.ChunkLayout.build(2, 1000, None, CPU), chunk.ChunkLayout.build(2, 64, None, CPU)):
        with pytest.raises(ValueError, match="layout does not describe this batch"):
            chunk.chunk_gdn(**kw, layout=lay)


@pytest.mark.parametrize("bad, needle", [
    ({"g": None}, "g and beta"),
    ({"k": torch.zeros(2, 70, 1, 32)}, "bad shapes"),
    ({"initial_state": torch.zeros(3, 2, 64, 64)}, "initial_state must be"),
    ({"out": torch.empty(2, 100, 2, 64, dtype=torch.float16)}, "out must be"),
    ({"q": torch.zeros(2, 100, 1, 320), "k": torch.zeros(2, 100, 1, 320)}, "head dims up to 256"),
])
def test_launcher_rejects_bad_arguments(bad, needle):
    from gdnbench_kernels import chunk

    with pytest.raises(ValueError, match=re.escape(needle)):
        chunk.chunk_gdn(**{**BY_NAME["padded-T100-gva2-K64-h0"]["kw"], **bad})


def test_state_candidates_follow_the_parallelism_tier():
    """A few long sequences (tier 0) also get BV 16 (more programs), the other tiers 32 and 64 only
    (this process does not interpret: the GPU's candidates)."""
    from gdnbench_kernels import chunk

    if chunk.INTERPRETED:
        pytest.skip("one config under the interpreter")
    args = {"BK": 128, "V": 128, "FUSE_OUTPUT": False}
    picked = {tier: chunk.state._state_prune_by_tier(chunk.state.STATE_CONFIGS, {**args, "state_tier": tier})
              for tier in (0, 1, 2)}
    assert {c.kwargs["BV"] for c in picked[0]} == {16, 32, 64} and len(picked[0]) == 5
    assert {c.kwargs["BV"] for c in picked[1]} == {c.kwargs["BV"] for c in picked[2]} == {32, 64}
    assert len(picked[1]) == 4
    assert [chunk.layout.state_tier(1, 32, 128, 4096), chunk.layout.state_tier(16, 8, 128, 512),
            chunk.layout.state_tier(64, 32, 128, 64)] == [3, 4, 2]
    assert chunk.layout.state_tier(1, 1, 64, 63) == 0  # one short walk: tuned apart from the long ones
    # parallelism counts value columns: 16 sequences of 4 heads at V = 64 are as few programs as 32 at 128
    assert chunk.layout.state_tier(16, 4, 64, 1024) == chunk.layout.state_tier(8, 4, 128, 1024) == 3
    few = chunk.state._state_prune_by_tier(chunk.state.STATE_CONFIGS, {**args, "state_tier": 3})
    assert [str(c) for c in few] == [str(c) for c in picked[0]]
    # parity's one-chunk case tunes apart from its B=16 T=512 HV=8 one, and that from B=1 T=4096 HV=32
    tier = chunk.layout.chunk_tier
    assert [tier(1, 1), tier(128, 8), tier(64, 32)] == [0, 1, 2]


def test_pruning_keeps_the_register_caps():
    """The prune functions rebuild each config for the head dim's block width: a register cap (maxnreg)
    must survive it, and a capped config must not be dropped as a duplicate of the uncapped one."""
    from gdnbench_kernels import chunk

    if chunk.INTERPRETED:
        pytest.skip("one config under the interpreter")

    def settings(configs):
        return sorted((c.kwargs["BV"], c.num_warps, c.num_stages, c.maxnreg or 0) for c in configs)

    # the output pass at V = 64: BV 128 configs mask down to BV 64, beside the capped (64, 4, 2)
    assert settings(chunk.configs.bv_prune(chunk.output.OUTPUT_CONFIGS, {"V": 64})) == [
        (64, 4, 2, 0), (64, 4, 2, 128), (64, 4, 3, 0), (64, 8, 3, 0)]


@pytest.mark.parametrize("V", [16, 32, 60, 64])
def test_the_fused_walk_is_never_offered_a_miscompiled_config(V):
    """At D = 16 and 32 the prune caps the (64, 4, 1) candidate of the walk with the output fused in to a
    single-stage BV 16 / 32 config, which Triton 3.6 compiles wrongly (chunk.state._miscompiled): dropped there,
    kept at BV 64; the walk without the output keeps it."""
    from gdnbench_kernels import chunk

    if chunk.INTERPRETED:
        pytest.skip("one config under the interpreter")
    args = {"BK": chunk.configs.tile_width(V), "V": V}
    fused = chunk.state._state_prune(chunk.state.FUSED_STATE_CONFIGS, {**args, "FUSE_OUTPUT": True})
    plain = chunk.state._state_prune(chunk.state.FUSED_STATE_CONFIGS, {**args, "FUSE_OUTPUT": False})
    single_stage = [c.kwargs["BV"] for c in fused if c.num_stages == 1]
    assert single_stage == ([] if V <= 32 else [64])
    assert len(plain) == len(fused) + (V <= 32) and fused


def test_the_fused_walk_at_v128_has_one_config():
    """With the output fused in at V = 128, (64, 4, 2) won every case forced on an H100 and an H200, and the
    others, picked now and then on the first case of an autotune key, ran the key's other cases up to 1.4x
    slower: only it is offered there. At V = 64 the candidates stay, and so do they without the output."""
    from gdnbench_kernels import chunk

    if chunk.INTERPRETED:
        pytest.skip("one config under the interpreter")
    def offered(V: int, fused: bool = True) -> list[tuple]:
        args = {"BK": chunk.configs.tile_width(V), "V": V, "FUSE_OUTPUT": fused}
        kept = chunk.state._state_prune(chunk.state.FUSED_STATE_CONFIGS, args)
        return [chunk.configs.config_settings(c)[:3] for c in kept]

    assert offered(128) == [chunk.state.FUSED_WALK_V128] == [(64, 4, 2)]
    assert sorted(offered(64)) == [(32, 4, 2), (64, 4, 1), (64, 4, 2), (64, 8, 3)]
    assert sorted(offered(128, fused=False)) == sorted(chunk.state.FUSED_STATE_CANDIDATES)


def test_the_prep_kernel_has_no_register_cap_with_a_wide_key_tile():
    """The cap at 96 registers lost nearly every D = 128 case it was forced on (H100 and H200): offered only
    with key tiles under 128 wide, where it won a D = 64 case."""
    from gdnbench_kernels import chunk

    if chunk.INTERPRETED:
        pytest.skip("one config under the interpreter")
    def caps(BK: int) -> list:
        return [c.maxnreg for c in chunk.prep._prep_prune(chunk.prep.PREP_CONFIGS, {"BK": BK})]

    assert caps(128) == [None] and caps(256) == [None]
    assert caps(64) == [None, 96]


def test_every_tuned_chunk_kernel_keys_on_a_size_tier():
    """Keyed on head dims alone, a kernel is tuned by whichever case of a dim runs first: parity's
    one-chunk case chose the output pass's and the state pass's configs for its larger cases (1.2-1.3x
    slower on an H100). Every tuned chunk kernel keys on a size tier, whose bounds split one chunk
    from many and a short walk from a long one."""
    from gdnbench_kernels import chunk

    for kernel in (chunk.state.state_kernel, chunk.output.output_kernel, chunk.prep.fused_prep_kernel,
                   chunk.state.fused_state_kernel, chunk.output.output_span2_kernel):
        assert {"state_tier", "chunk_tier"} & set(kernel.keys), kernel.keys
    assert chunk.layout.chunk_tier(1, 1) != chunk.layout.chunk_tier(128, 8)
    assert chunk.layout.state_tier(1, 1, 64, 63) != chunk.layout.state_tier(4, 8, 64, 2048)


@pytest.mark.parametrize("B,T,HV,fuse,chunks", [
    (1, 4096, 32, False, None),  # 64 chunks: measured no faster
    (1, 8192, 32, False, 32),  # a quarter of the chunks
    (1, 16384, 32, False, 64),
    (1, 65536, 32, False, 128),  # at most 128
    (1, 8192, 4, False, None),  # few heads: not measured
    (1, 8192, 32, True, None),  # the output folded into the walk
    (2, 8192, 32, False, None),  # several sequences: from 256 chunks
    (2, 16384, 16, False, 64),  # a quarter of the longest one's chunks
    (4, 8192, 32, True, None),  # the output folded into the walks: measured slower
])
def test_pipelined_by_default_only_where_measured_faster(B, T, HV, fuse, chunks):
    from gdnbench_kernels import chunk

    assert chunk.plan.pipeline_default(chunk.ChunkLayout.build(B, T, None, CPU), HV, fuse) == chunks


@pytest.mark.parametrize("lengths,HV,V,chunks", [
    ([4096], 32, 128, 16),  # 64 walk programs on 132 SMs: segments of about 2 programs per SM in all
    ([8192], 32, 128, 32),
    ([65536], 32, 128, 64),  # at most 64
    ([8192] * 4, 32, 128, None),  # 256 walk programs of equal walks: the SMs are busy already
    ([2048] * 4, 8, 64, 4),  # at least 4
    ([8192], 4, 60, 4),
    ([512] * 8, 8, 128, None),  # walks of 8 chunks: 2 segments of 4
    ([576] * 8, 4, 128, 4),  # walks of 9 chunks: 3 segments
    ([8662, 112, 7610], 32, 128, 63),  # 192 walk programs, but the longest walk is 2.2 times the even share
    ([8192, 8192, 8192, 8000], 32, 128, None),  # the longest walk is about the even share
])
def test_warm_up_segments_by_default_only_where_the_walks_are_few_or_unequal(lengths, HV, V, chunks, monkeypatch):
    """warm_up_default on an H100's 132 SMs (faked on a CPU); never on a CPU."""
    from gdnbench_kernels import chunk

    cu_seqlens = torch.tensor([0, *itertools.accumulate(lengths)])
    layout = chunk.ChunkLayout.build(1, sum(lengths), cu_seqlens, CPU)
    assert chunk.plan.warm_up_default(layout, HV, V, torch.device(CPU)) is None
    monkeypatch.setattr(chunk.plan, "sm_count", lambda device: 132)
    assert chunk.plan.warm_up_default(layout, HV, V, torch.device("cuda")) == chunks


@pytest.mark.parametrize("lengths,HV,raw,chunks", [
    ([65536], 32, False, 249),  # 5 segments of a sequence's 1024 chunks: the most loaded program walks 250 of them
    ([65536], 32, True, 64),  # raw gates: the transposed walk, warm_up_default's size
    ([32768], 32, False, 125),
    ([16384], 32, False, 63),  # warm_up_default's size is the best already
    ([2048] * 4, 8, False, 8),  # under SPECIALIZED_MIN_SEGMENT_CHUNKS: the transposed walk's
    ([8192] * 4, 32, False, None),  # no segments: 126 chunks would cut the makespan only from 128 to 126
    ([4096] * 6, 32, False, 31),  # 192 walks of 64 chunks: makespan 128 -> 97
    ([448] + [64] * 63, 4, False, 2),  # 256 walks, the longest of 7 chunks, the others of one: 7 -> 3
    ([256] * 16, 8, False, 4),  # 128 walks of 4 chunks: one segment a sequence, for its first chunk's skip
    ([64] * 128, 4, False, 1),  # and 512 of one chunk
])
def test_segments_for_the_specialized_kernel_deal_evenly(lengths, HV, raw, chunks, monkeypatch):
    """plan_segments on a faked H100 (132 SMs, every kernel's envelope open): where the warp-specialized kernel walks
    the segments, the size whose walks (a chunk of warm-up each but a sequence's first) its 132 programs take with the
    least makespan, as WalkOrder deals them: of 16 chunks or more on few walks, from 2 on many (128 or more)."""
    from gdnbench_kernels import chunk

    monkeypatch.setattr(chunk.plan, "sm_count", lambda device: 132)
    monkeypatch.setattr(chunk.sm90.specialized, "unsupported", lambda q, V, raw, l2: "raw" if raw else None)
    for module in chunk.sm90.GLUON_WALKS.values():
        monkeypatch.setattr(module, "unsupported", lambda *a: None)
    warm_up_default = chunk.plan.warm_up_default
    monkeypatch.setattr(chunk.plan, "warm_up_default", lambda *a: warm_up_default(*a[:3], torch.device("cuda")))
    layout = chunk.ChunkLayout.build(1, sum(lengths), torch.tensor([0, *itertools.accumulate(lengths)]), CPU)
    q = torch.empty(1, sum(lengths), 16, 128)
    assert chunk.plan.plan_segments(layout, q, 128, HV, raw_gate=raw) == chunks
    many = len(lengths) * HV >= chunk.plan.SPECIALIZED_MIN_WALKS
    if chunks and not raw and (many or chunks >= chunk.plan.SPECIALIZED_MIN_SEGMENT_CHUNKS):
        def makespan(size: int) -> int:  # the segments' walks dealt as the kernel's, a chunk of warm-up each but
            dealt = chunk.SegmentLayout.build(layout, size).walks(HV, 132)  # a sequence's first
            loads = [sum(-(-(end - first) // 64) + (first > start)
                         for _, start, first, end, _ in dealt.walks.tolist()[p::132][:dealt.counts[p]])
                     for p in range(132)]
            assert loads == dealt.program_chunks.tolist()
            return dealt.makespan

        least = 2 if many else chunk.plan.SPECIALIZED_MIN_SEGMENT_CHUNKS
        sizes = range(least, chunk.plan.SPECIALIZED_MAX_SEGMENT_CHUNKS + 1, 1 if many else 7)
        assert all(makespan(chunks) <= makespan(size) for size in sizes)


def test_a_pipeline_cuts_every_sequence_into_groups():
    from gdnbench_kernels import chunk

    pipe = chunk.PipelineLayout.build(chunk.ChunkLayout.build(1, 300, None, CPU), 2)
    assert [(over.spans, over.NT, over.NP) for over in pipe.groups] == [
        (((0, 128),), 2, 1), (((128, 256),), 2, 1), (((256, 300),), 1, 1)]
    assert pipe.firsts(1) == [0, 2, 4] and pipe.firsts(2) == [0, 1, 2]
    assert all(over.tokens == 300 for over in pipe.groups)
    # several sequences: group g takes chunks 2g, 2g + 1 of each, empty once a sequence is done; the
    # groups' blocks follow one another (a sequence's last pair may hold one chunk)
    lay = chunk.ChunkLayout.build(1, 400, torch.tensor([0, 130, 130, 194, 400]), CPU)
    pipe = chunk.PipelineLayout.build(lay, 2)
    assert [over.spans for over in pipe.groups] == [((0, 128), (130, 130), (130, 194), (194, 322)),
                                                    ((128, 130), (130, 130), (194, 194), (322, 400))]
    assert [over.NT for over in pipe.groups] == [5, 3] and pipe.firsts(1) == [0, 5] and pipe.firsts(2) == [0, 3]
    assert sum(over.NT for over in pipe.groups) == lay.NT and sum(over.NP for over in pipe.groups) == lay.NP
    with pytest.raises(ValueError, match="even number of chunks"):
        chunk.PipelineLayout.build(chunk.ChunkLayout.build(1, 300, None, CPU), 3)
    with pytest.raises(ValueError, match="every sequence is empty"):
        chunk.PipelineLayout.build(chunk.ChunkLayout.from_spans([(0, 0), (5, 5)], 10, CPU), 2)
    kw = BY_NAME["weak-decay-varlen-K16-h0"]["kw"]
    lay = chunk.ChunkLayout.build(1, 464, kw["cu_seqlens"], CPU)
    other = chunk.ChunkLayout.build(1, 464, torch.tensor([0, 464]), CPU)
    with pytest.raises(ValueError, match="cuts this call's sequences"):
        chunk.chunk_fused_gdn(**kw, layout=lay, pipeline=chunk.PipelineLayout.build(other, 2))


def test_a_plan_is_made_once_and_executed_as_it_stands():
    """default_plan decides every field on the host, any one forced; chunk_fused_gdn executes a plan, or makes
    one from the fields it is given, not both; describe names what the plan runs."""
    from gdnbench_kernels import chunk

    kw = BY_NAME["padded-T100-gva2-K64-h0"]["kw"]
    lay = chunk.ChunkLayout.build(2, 100, None, CPU)
    shape = dict(raw_gate=False, qk_l2norm=False)
    plan = chunk.default_plan(lay, kw["q"], kw["k"], 64, 2, **shape)
    assert plan.fused and plan.walk == "triton" and plan.prep == "triton"  # no Gluon kernel on a CPU
    assert plan.segments is None and plan.pipeline is None  # warm-up segments only on a GPU; 2 chunks a walk
    assert chunk.default_plan(lay, kw["q"], kw["k"], 64, 2, fused=False, **shape) == chunk.plan.STAGES_PLAN
    forced = chunk.default_plan(lay, kw["q"], kw["k"], 64, 2, fuse_output=False, output_span=2, **shape)
    assert not forced.fuse_output and forced.output_span == 2
    assert chunk.describe(forced).startswith("gate+kkt+solve in one, W/U in the state pass, prep[")
    assert "output per 2 chunks[" in chunk.describe(forced)
    with pytest.raises(ValueError, match="a plan is given"):
        chunk.chunk_fused_gdn(**kw, layout=lay, plan=plan, walk="triton")
    with pytest.raises(ValueError, match="runs through chunk_gdn"):
        chunk.chunk_fused_gdn(**kw, layout=lay, plan=chunk.plan.STAGES_PLAN)


def test_a_workspace_must_fit_the_variant():
    from gdnbench_kernels import chunk

    kw = BY_NAME["padded-T100-gva2-K64-h0"]["kw"]
    lay = chunk.ChunkLayout.build(2, 100, None, CPU)
    fused_ws = chunk.ChunkWorkspace.allocate(lay, kw["q"], kw["v"], stages=False, raw_gate=False, fuse_output=True,
                                             final_state=True)
    assert fused_ws.W is None and fused_ws.h is None and fused_ws.final_state.shape == (2, 2, 64, 64)
    with pytest.raises(ValueError, match=r"missing \['W', 'U', 'h', 'v_new'\]"):
        chunk.chunk_gdn(**kw, layout=lay, workspace=fused_ws)


def case(**fields) -> Case:
    return Case(**{"B": 2, "T": 4, "H": 1, "D": 16, **fields})


@pytest.mark.parametrize("name", BACKENDS)
def test_envelope(name, monkeypatch):
    b = registry()[name]
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delitem(sys.modules, "gdnbench_kernels.chunk", raising=False)
    for c in (case(), case(gating="raw", HV=4, qk_l2norm="kernel"), case(K=60, V=100, D=None), case(D=256),
              case(mode="varlen", B=None, T=None, seq_lens=[3, 5]), case(dtype="fp16"), case(dtype="fp32")):
        assert b.unsupported(c, CPU) is None
    assert b.unsupported(case(op="decode", T=None, pool_size=4), CPU) == f"{name}: no decode op (serves prefill)"
    assert b.unsupported(case(D=512), CUDA) == f"{name}: head dims up to 256, case has K=512, V=512"
    monkeypatch.delenv("TRITON_INTERPRET")
    assert "needs TRITON_INTERPRET=1" in b.unsupported(case(), CPU)


def test_kernels_compiled_before_the_variable_was_set_are_caught(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setitem(sys.modules, "gdnbench_kernels.chunk", type(sys)("fake"))
    sys.modules["gdnbench_kernels.chunk"].INTERPRETED = False
    for name in BACKENDS:
        reason = registry()[name].unsupported(case(), CPU)
        assert reason is not None and "imported before TRITON_INTERPRET=1" in reason

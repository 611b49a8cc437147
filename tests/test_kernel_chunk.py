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
import os
import subprocess
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
from tests.kernel_inputs import BY_NAME, KERNEL_CASES, make
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
        # warm-up-whole: the same beside whole walks, which take the walks whose decay is too slow for the segments
        segments = {"warm-up": chunk.SegmentLayout.build(layout, case["segment_chunks"]),
                    "warm-up-whole": chunk.SegmentLayout.build(layout, case["segment_chunks"], whole_walks=True)}
        # pairs: the output pass over pairs of chunks (the output never fused in); pipe: that, pipelined in
        # groups of two chunks of every sequence; pipe-out: pipelined with the output fused into the walk
        variants = (("chunk", True), ("fused", False), ("warm-up", False), ("warm-up-whole", False), ("pairs", False),
                    ("pipe", False), ("pipe-out", False))
        for variant, stages in variants:
            span = 2 if variant in ("pairs", "pipe") else 1
            fuse = (variant == "fused" and case["fuse_output"]) or variant in ("pipe-out", "warm-up", "warm-up-whole")
            try:
                pipe = chunk.PipelineLayout.build(layout, 2) if variant.startswith("pipe") else None
                ws = chunk.ChunkWorkspace.allocate(layout, q, v, stages=stages, raw_gate="a" in kw, fuse_output=fuse,
                                                   final_state=kw["output_final_state"],
                                                   segments=segments.get(variant), output_span=span,
                                                   pipeline=pipe is not None)
                for name in ("gc", "W", "U", "A_diag", "beta", "Ai", "v_new", "h", "final_state", "handoff"):
                    if getattr(ws, name) is not None:
                        getattr(ws, name).fill_(float("nan"))
                if ws.slow_marks is not None:
                    ws.slow_marks.fill_(7)  # neither 0 nor 1: marks that were never written
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
                res = {"o": o, "final": final, "out_is_o": o is out, "h_offsets": layout.blocks(span)[2],
                       "slow_marks": ws.slow_marks}
                if variant == "warm-up-whole":
                    res["slow_prep"] = _slow_prep(chunk, kw, layout, segments[variant], ws.slow_marks)
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


def _slow_prep(chunk, kw: dict, layout, segments, marks: torch.Tensor) -> dict:
    """gc and Ai of the Triton prep over the chunks of the walks ``marks`` marks slow alone (a plan's whole_walk),
    poisoned before it runs."""
    q, v = kw["q"], kw["v"]
    ws = chunk.ChunkWorkspace.allocate(layout, q, v, stages=False, raw_gate="a" in kw, fuse_output=True,
                                       final_state=kw["output_final_state"])
    ws.gc.fill_(float("nan"))
    ws.Ai.fill_(float("nan"))
    gating = {name: kw.get(name) for name in ("g", "beta", "a", "b", "A_log", "dt_bias")}
    x = chunk.launch.prepare_launch(q, kw["k"], v, **gating, scale=kw["scale"], initial_state=kw.get("initial_state"),
                                    output_final_state=kw["output_final_state"], cu_seqlens=kw.get("cu_seqlens"),
                                    layout=layout, qk_l2norm=kw["qk_l2norm"], out=torch.full_like(v, float("nan")),
                                    workspace=ws, stages=False, fuse_output=True)
    slow = chunk.warm_up.SlowWalks(marks=marks, seg_offsets=segments.seg_offsets)
    chunk.prep.run_prep(x, layout, "triton", slow=slow)
    return {"gc": ws.gc, "Ai": ws.Ai, "seg_offsets": segments.seg_offsets}


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
                            ("fused-pairs", False, False),
                            *([("warm-up", False, True), ("warm-up-whole", False, True)] if i == 0 else []))
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
                    segs = None if not variant.startswith("warm-up") else chunk.SegmentLayout(
                        chunks=1, layout=guarded_layout(seg0.layout), seg_offsets=guarded(seg0.seg_offsets),
                        parent=guarded(seg0.parent), parent_bounds=guarded(seg0.parent_bounds),
                        sequences=seg0.sequences, sequence_spans=seg0.sequence_spans,
                        whole_walks=variant == "warm-up-whole")
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
                        final_state=guarded(shape=(lay.N, HV, K, V), dtype=f32),
                        slow_marks=guarded(shape=(seg0.layout.N, HV), dtype=torch.int32)
                        if variant == "warm-up-whole" else None)
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
        ("chunk.prep", "kkt_solve_kernel", dict(H=2, HV=4, K=D, BT=64, BK=D, L2NORM=True, FP32=False), 4),
        ("chunk.wu", "wu_kernel", dict(shape, BV=64, L2NORM=False, FP32=False), 8),
        ("chunk.state", "_state_fn", dict(shape, USE_H0=True, STORE_HT=True, FUSE_OUTPUT=False, WARM_UP=False,
                                          SPAN=1, FROM_AI=False, L2NORM=False, FP32=False, BV=32, q=None, v=None,
                                          Ai=None, slow_marks=None, seg_offsets=None), 4),
        ("chunk.state", "_state_fn", dict(shape, USE_H0=True, STORE_HT=True, FUSE_OUTPUT=False, WARM_UP=False,
                                          SPAN=2, FROM_AI=True, L2NORM=False, FP32=False, BV=32, q=None, W=None,
                                          U=None, slow_marks=None, seg_offsets=None), 4),
        ("chunk.state", "_state_fn", dict(shape, USE_H0=False, STORE_HT=True, FUSE_OUTPUT=True, WARM_UP=False,
                                          SPAN=1, FROM_AI=True, L2NORM=True, FP32=False, BV=16, W=None, U=None,
                                          h=None, v_new=None, h0=None), 4),
        ("chunk.state", "_state_fn", dict(shape, USE_H0=True, STORE_HT=True, FUSE_OUTPUT=True, WARM_UP=True,
                                          SPAN=1, FROM_AI=True, L2NORM=False, FP32=False, BV=32, W=None, U=None,
                                          h=None, v_new=None), 4),
        ("chunk.output", "output_kernel", dict(shape, SPAN=1, L2NORM=True, FP32=False, BV=64), 4),
        ("chunk.output", "output_span2_kernel", dict(shape, SPAN=2, L2NORM=False, FP32=False, BV=64), 4),
        ("chunk.prep", "fused_prep_kernel", dict(prep_shape, RAW_GATE=False, L2NORM=False, FP32=False, a=None,
                                                   b=None, A_log=None, dt_bias=None, slow_marks=None,
                                                   seg_offsets=None), 4),
        # with slow marks: the prep of the walks they mark alone
        ("chunk.prep", "fused_prep_kernel", dict(prep_shape, RAW_GATE=True, L2NORM=True, FP32=False, g=None,
                                                   beta=None), 4),
        ("chunk.warm_up", "_mark_kernel", dict(HV=4, WINDOW=1280, BLOCK=1024, RAW_GATE=False, a=None, A_log=None,
                                               dt_bias=None), 4),
    ]


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
@pytest.mark.parametrize("D", [128, 64])
@pytest.mark.parametrize("index", range(12))
def test_kernel_compiles_for_sm90(D, index):
    """The interpreter runs Python, not Triton's code generator: compile for sm_90 (to a cubin) on this CPU."""
    from gdnbench_kernels import chunk

    module, name, const, warps = _compile_specs(D)[index]
    fn = getattr(importlib.import_module(f"gdnbench_kernels.{module}"), name)
    ptr = dict(q="bf16", k="bf16", v="bf16", beta="bf16", a="bf16", b="bf16", Ai="bf16", W="bf16", U="bf16", h="bf16",
               v_new="bf16", o="bf16", seq_bounds="i64", chunk_indices="i32", h_offsets="i32", block_indices="i32",
               seg_offsets="i32", seg_parent="i32", parent_bounds="i64", seg_bounds="i64", slow_marks="i32",
               marks="i32")
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


@pytest.mark.parametrize("variant", ["chunk", "fused", "warm-up", "warm-up-whole", "pairs", "pipe", "pipe-out"])
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
    if not (variant == "fused" and case["fuse_output"]) and variant not in ("pipe-out", "warm-up", "warm-up-whole"):
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


@pytest.mark.parametrize("name", list(BY_NAME))
def test_walks_too_slow_for_warm_up_segments_are_marked(interpreted, name):
    """warm_up.mark_slow_walks over each case's segments: a (segment, value head) is marked where its warm-up would
    not reach its sequence's start within a segment's length and the log decays over that length before it sum above
    WARM_UP_LOG_DECAY (its warm-up would walk further); every mark written (none cleared first); the cases hold both
    kinds, and "mixed-decay-heads" both in one call."""
    from gdnbench_kernels import chunk

    kw = BY_NAME[name]["kw"]
    g = gate_from_raw(kw["a"], kw["b"], kw["A_log"], kw["dt_bias"])[0] if "a" in kw else kw["g"]
    B, T, HV = kw["v"].shape[:3]
    bounds = kw["cu_seqlens"].tolist() if "cu_seqlens" in kw else [b * T for b in range(B + 1)]
    flat = g.reshape(B * T, HV).double()
    window = BY_NAME[name]["segment_chunks"] * chunk.CHUNK
    expected = [[int(first - window > start and flat[first - window:first, h].sum() > chunk.layout.WARM_UP_LOG_DECAY)
                 for h in range(HV)]
                for start, end in zip(bounds, bounds[1:]) for first in range(start, end, window) or [start]]
    assert interpreted[(name, "warm-up-whole")]["slow_marks"].tolist() == expected
    assert interpreted[(name, "warm-up")]["slow_marks"] is None  # no whole walks, no marks


@pytest.mark.parametrize("name", list(BY_NAME))
def test_the_prep_of_slow_walks_alone_preps_their_chunks_and_no_others(interpreted, name):
    """The Triton prep given slow marks (the whole walks of a plan's whole_walk): the chunks of every walk marked slow
    as the references have them, every other chunk left as poisoned; the cases hold walks of both kinds."""
    kw = BY_NAME[name]["kw"]
    got = interpreted[(name, "warm-up-whole")]
    assert "error" not in got, got.get("error")
    _, _, ref = references(kw)
    B, T, HV = kw["v"].shape[:3]
    bounds = kw["cu_seqlens"].tolist() if "cu_seqlens" in kw else [b * T for b in range(B + 1)]
    marks, prep = got["slow_marks"], got["slow_prep"]
    offsets = prep["seg_offsets"].tolist()  # each sequence's first segment
    gc, Ai = prep["gc"].reshape(B * T, HV), prep["Ai"].reshape(B * T, HV, -1)
    ref_gc, ref_ai = ref.gc.reshape(B * T, HV), ref.A_inv_beta.reshape(B * T, HV, -1)
    for n, (start, end) in enumerate(zip(bounds, bounds[1:])):
        for h in range(HV):
            rows = slice(start, end)
            if marks[offsets[n]:offsets[n + 1], h].amax().item() if end > start else 0:
                assert rel(gc[rows, h], ref_gc[rows, h]) < 1e-6
                assert rel(Ai[rows, h], ref_ai[rows, h]) < STAGE_TOL[kw["q"].dtype]
            else:
                assert torch.isnan(gc[rows, h]).all() and torch.isnan(Ai[rows, h].float()).all()
    slow = [int(marks[offsets[n]:offsets[n + 1], h].amax()) for n in range(len(bounds) - 1)
            if bounds[n + 1] > bounds[n] for h in range(HV)]
    if name.startswith("mixed-decay-heads"):
        assert 0 in slow and 1 in slow


def test_no_kernel_touches_memory_outside_its_tensors(interpreted):
    """Every GPU candidate config of every tuned kernel, both variants, guarded tensors (_guarded_runs)."""
    from gdnbench_kernels import chunk

    guards = interpreted["guards"]
    assert guards["runs"] == len(GUARD_CASES) * (guard_rounds(chunk) * 4 + 2)  # the warm-up variants once
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
        assert len(ran) == len(SUITE_CASES) - 1, ran[["case_id", "status", "error"]]
        assert (ran.status == Status.PASS).all(), ran[["case_id", "status", "error"]]
        assert ran.path.str.contains("triton interpreter").all() and ran.path.str.contains("BV=32 w4").all()
        assert ran.path.str.contains("raw gating fused").sum() == 1
        assert set(rows[rows.status == Status.SKIP].error) == {f"{name}: head dims up to 256, case has K=512, V=512"}
    # few heads and K < 128: fuse_output_default keeps the parallel output pass
    assert not df[df.backend == "triton.chunk_fused"].path.str.contains("output fused").any()
    fused = df[(df.backend == "triton.chunk_fused") & (df.status != Status.SKIP)]
    assert fused.path.str.contains("prep[w4 s1]", regex=False).all()  # the interpreter's one prep config


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


def test_an_unknown_fp32_dot_precision_stops_the_import_naming_the_variable() -> None:
    env = dict(os.environ, GDNBENCH_FP32_DOT="tf64")
    done = subprocess.run([sys.executable, "-c", "import gdnbench_kernels.common.device"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "GDNBENCH_FP32_DOT must be one of ('bf16x3', 'tf32x3', 'tf32', 'ieee'), got 'tf64'" in done.stderr


@pytest.mark.parametrize("precision,kind,other", [("bf16x3", "bf16", "tf32"), ("tf32x3", "tf32", "bf16")])
def test_fp32_products_compile_for_sm90_in_the_precision_asked(precision, kind, other) -> None:
    """GDNBENCH_FP32_DOT set before the import: the fused walk of fp32 inputs compiles for sm_90 to tensor-core
    products of that input type (the split operands' bf16 or TF32 products), and to no other."""
    script = f"""
from tests.sm90 import compile_sm90
from gdnbench_kernels.chunk import state
const = dict(H=2, HV=4, K=64, V=64, BT=64, BK=64, USE_H0=True, STORE_HT=True, FUSE_OUTPUT=True, WARM_UP=False,
             SPAN=1, FROM_AI=True, L2NORM=False, FP32=True, BV=32, W=None, U=None, h=None, v_new=None,
             slow_marks=None, seg_offsets=None, seg_parent=None, parent_bounds=None)
types = dict(scale="fp32", state_tier="i32", seq_bounds="*i64", h_offsets="*i32")
sig = {{a: "constexpr" if a in const else types.get(a, "*fp32") for a in state._state_fn.arg_names}}
print(compile_sm90(state._state_fn, sig, const, interpreted=False, num_warps=4).asm["ptx"])
"""
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env["GDNBENCH_FP32_DOT"] = precision
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).resolve().parent.parent)
    if done.returncode != 0 and "Skipped" in done.stderr:
        pytest.skip(done.stderr[-300:])
    assert done.returncode == 0, done.stderr[-2000:]
    products = [line for line in done.stdout.splitlines() if "mma" in line and (kind in line or other in line)]
    assert products and all(kind in line and other not in line for line in products), products[:3]

"""The bundled recurrent Triton kernel (gdnbench_kernels.recurrent) and its backend triton.recurrent, on a CPU.

Triton picks its interpreter when a kernel is decorated, so the kernel runs in one subprocess started
with TRITON_INTERPRET=1 (this module run as a script, ``_worker``): it loads the inputs this process
wrote, runs the kernel on NaN-poisoned outputs and a copy of each pool, saves what the kernel left,
then runs ``gdnbench run`` (CliRunner) on a tiny suite; it starts with the session and works while the
other tests run (tests/interpreter.py). The references and assertions run here, in fp64.
Tests that need no kernel run (envelope, tuning logic against a fake kernel) or only compile it (for
sm_90, ahead of time, no GPU needed) run in this process.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import triton

from gdnbench.backends import registry
from gdnbench.reference import gate_from_raw, gdn_decode, gdn_recurrent, start_slots
from gdnbench.results import Status
from gdnbench.suite import Case
from tests.interpreter import InterpretedRun, start_worker, worker_results
from tests.kernel_inputs import DT, kernel_inputs
from tests.sm90 import compile_sm90

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
# one timed sample: the interpreter is for correctness, not speed
ONCE = {"min_samples": 1, "max_samples": 1, "min_time_s": 0.0, "max_time_s": 0.01, "warmup": 1}
SUITE_CASES = [
    {"B": 2, "T": 6, "H": 1, "HV": 2, "D": 16, "qk_l2norm": "kernel", "initial_state": "random"},
    {"B": 1, "T": 5, "H": 1, "HV": 1, "K": 60, "V": 64, "dtype": "fp16"},
    {"mode": "varlen", "seq_lens": [3, 1, 5], "H": 1, "HV": 4, "D": 16, "gating": "raw", "dtype": "bf16"},
    {"op": "decode", "B": 3, "H": 1, "HV": 2, "D": 16, "pool_size": 7, "slots": "scattered"},
    {"op": "decode", "B": 2, "T": 2, "H": 1, "HV": 2, "D": 16, "state_dtype": "bf16", "dtype": "bf16",
     "gating": "raw", "qk_l2norm": "kernel", "pool_size": 5, "slots": "scattered"},
    {"op": "decode", "B": 2, "T": 3, "H": 1, "HV": 2, "D": 16, "per_token_slots": True, "pool_size": 9,
     "slots": "scattered", "gating": "raw"},
    {"B": 1, "T": 2, "H": 1, "D": 512, "dtype": "fp32"},  # beyond the envelope: a SKIP row
]


# ---- inputs of the kernel cases (built here, run in the subprocess) -----------------------------------

def make(name: str, *, B=2, T=5, H=1, HV=2, K=16, V=16, dtype="fp32", seqs=None, h0=False, final=True,
         raw=False, l2=False, pool=None, slots=None, accepted=None, pool_dtype="fp32", v_first=False,
         default_out=False, g=None, seed=0) -> dict:
    """One kernel call's inputs: q/k ~ U(0, 1) (pre-normalised unless ``l2``), log-sigmoid decays, or
    the log decays ``g`` [T] of every sequence and head."""
    gen = torch.Generator().manual_seed(seed)
    kw, N = kernel_inputs(gen, B=B, T=T, H=H, HV=HV, K=K, V=V, dtype=dtype, seqs=seqs, raw=raw, l2=l2)
    if g is not None:
        kw["g"] = torch.tensor(g, dtype=kw["g"].dtype)[None, :, None].expand_as(kw["g"]).contiguous()
    if v_first:  # every state [.., V, K]
        kw["v_first"] = True
        K, V = V, K
    if pool is not None:
        kw["state_pool"] = torch.randn(pool, HV, K, V, generator=gen).to(DT[pool_dtype])
        kw["slot_idx"] = torch.tensor(slots, dtype=torch.int32)
        assert len(slots) == N
        if accepted is not None:  # speculative verify: slots [N, T], start at the last accepted token
            kw["num_accepted_tokens"] = torch.tensor(accepted, dtype=torch.int32)
    else:
        if h0:
            kw["initial_state"] = torch.randn(N, HV, K, V, generator=gen)
        kw["output_final_state"] = final
    return {"name": name, "kw": kw, "default_out": default_out}


KERNEL_CASES = [
    make("prefill-gva2-l2kernel-h0", H=1, HV=2, l2=True, h0=True, default_out=True),
    make("prefill-gva4-fp16", H=1, HV=4, T=6, dtype="fp16"),
    make("prefill-gva1-bf16", H=2, HV=2, dtype="bf16", h0=True),
    make("prefill-K60-V64", B=1, T=4, K=60, V=64, h0=True, l2=True),
    make("prefill-K64-V60-nofinal", B=1, T=4, H=1, HV=1, K=64, V=60, final=False),
    make("prefill-varlen", H=2, HV=4, seqs=[3, 0, 7, 2, 0], h0=True),
    make("prefill-raw-fp16", T=6, raw=True, dtype="fp16", h0=True),
    # decays that push the state's scalar scale out of [2^-40, 2^40] (folded back into the tile), one that
    # underflows exp to 0, and growth (g > 0)
    make("prefill-strong-decay", T=6, h0=True, g=[-0.1, -30.0, -30.0, 0.0, -200.0, 5.0]),
    make("spec-T3-growth-bf16-pool", B=2, T=3, H=1, HV=2, pool=6, slots=[[0, 4, 5], [3, 1, 2]], accepted=[3, 1],
         pool_dtype="bf16", g=[20.0, 20.0, -0.5]),
    make("decode-fp32-pool-gva2", B=3, T=1, H=1, HV=2, l2=True, pool=7, slots=[4, 0, 6]),
    make("decode-fp32-pool-gva4-K60", B=2, T=1, H=1, HV=4, K=60, V=60, pool=5, slots=[3, 1]),
    make("decode-bf16-pool", B=3, T=1, H=2, HV=4, pool=6, slots=[5, 2, 0], pool_dtype="bf16"),
    make("decode-padding-T2", B=4, T=2, H=1, HV=2, pool=8, slots=[2, -1, 5, -1]),
    make("decode-raw-bf16-pool-fp16", B=3, T=1, H=1, HV=2, raw=True, dtype="fp16", l2=True, pool=6,
         slots=[1, -1, 4], pool_dtype="bf16"),
    make("decode-varlen-pool", H=1, HV=2, seqs=[2, 1, 3], pool=9, slots=[8, -1, 3]),
    # a token per sequence on average (the launch computes token 0's gates ahead of the loop), yet a sequence
    # of two tokens among them
    make("decode-varlen-pool-gates-ahead", H=1, HV=2, seqs=[2, 0, 1], pool=6, slots=[3, 1, -1], raw=True),
    make("prefill-T1-raw-h0", T=1, raw=True, h0=True),
    make("prefill-vfirst-K60-V64-varlen", H=1, HV=2, K=60, V=64, seqs=[3, 4], h0=True, l2=True, v_first=True),
    make("decode-vfirst-bf16-pool-K64-V60-raw", B=3, T=1, H=1, HV=2, K=64, V=60, raw=True, dtype="fp16", pool=6,
         slots=[5, -1, 1], pool_dtype="bf16", v_first=True),
    make("spec-vfirst-T2", B=2, T=2, H=1, HV=2, pool=5, slots=[[0, 4], [3, 1]], accepted=[2, 1], v_first=True),
    # V-first fp32 states at K > 64: two runs of keys per thread (recurrent.key_runs), K = 100 masked
    make("spec-vfirst-fp32-pool-K128-runs2", B=2, T=2, H=1, HV=2, K=128, V=16, pool=5, slots=[[0, 4], [3, 1]],
         accepted=[2, 1], v_first=True),
    # several tokens into one slot: four runs (fp32 from 4 tokens on, bf16 from 2)
    make("decode-T4-vfirst-fp32-pool-K128-runs4", B=3, T=4, H=1, HV=2, K=128, V=16, pool=5, slots=[3, -1, 1],
         v_first=True, raw=True),
    make("decode-T3-vfirst-bf16-pool-K128-runs4", B=2, T=3, H=1, HV=2, K=128, V=16, pool=5, slots=[0, 4],
         v_first=True, pool_dtype="bf16", raw=True, dtype="fp16"),
    make("prefill-vfirst-K100-runs2", B=1, T=3, H=1, HV=1, K=100, V=16, h0=True, l2=True, v_first=True),
    make("spec-T3-fp32-pool-gva2", B=3, T=3, H=1, HV=2, pool=12, slots=[[4, 0, 6], [1, 9, 2], [11, 3, 5]],
         accepted=[1, 3, 2]),
    # a skipped write (-1 at t=1), a padding sequence (its start slot is -1) and a bf16 pool
    make("spec-T4-bf16-pool-raw-padding", B=3, T=4, H=1, HV=2, K=60, V=60, raw=True, dtype="fp16", l2=True,
         pool=14, slots=[[2, -1, 7, 5], [-1, -1, -1, -1], [13, 0, 8, 1]], accepted=[4, 2, 1], pool_dtype="bf16"),
]
BY_NAME = {c["name"]: c for c in KERNEL_CASES}


# ---- the subprocess -----------------------------------------------------------------------------------

# Every kernel case runs with the interpreter's one config and with 3 work items per program, V-blocks of
# 16: programs that walk several (sequence, head, V-block) items, the grid's last one short.
VARIANTS = {"default": None, "items3": [triton.Config({"BV": 16, "ITEMS": 3}, num_warps=4, num_stages=1)]}


def _worker(inputs: str, outputs: str, suite: str, run_dir: str) -> None:
    """Runs under TRITON_INTERPRET=1: every kernel case, then `gdnbench run` on the suite."""
    from typer.testing import CliRunner

    from gdnbench.cli import app
    from gdnbench_kernels.recurrent import forward as kern

    def no_host_sync(*_a, **_k):
        raise AssertionError("host sync in the launcher")

    results: dict = {"INTERPRETED": kern.INTERPRETED, "CONFIGS": [str(c) for c in kern.CONFIGS]}
    default = kern.CONFIGS
    for case, variant in [(c, v) for v in VARIANTS for c in torch.load(inputs)]:
        kern.CONFIGS, kern._TUNED = VARIANTS[variant] or default, {}
        kw = dict(case["kw"])
        res: dict = {}
        try:
            pool = kw.get("state_pool")
            if pool is not None:
                kw["state_pool"] = pool = pool.clone()
            B, T, HV, V = *kw["v"].shape[:3], kw["v"].shape[3]
            if not case["default_out"]:  # o, and the final state where there is one, into NaN-poisoned buffers
                kw["out"] = torch.full((B, T, HV, V), float("nan"), dtype=kw["q"].dtype)
                if kw.get("output_final_state"):
                    N, K = (B if kw.get("cu_seqlens") is None else kw["cu_seqlens"].numel() - 1), kw["q"].shape[3]
                    kv = (V, K) if kw.get("v_first") else (K, V)
                    kw["final_state"] = torch.full((N, HV, *kv), float("nan"))
            saved = torch.Tensor.item, torch.Tensor.tolist
            # no .item() / .tolist() anywhere in the call (graph capture; cu_seqlens stays on the device)
            torch.Tensor.item = torch.Tensor.tolist = no_host_sync
            try:
                o, final = kern.recurrent_gdn(**kw)
            finally:
                torch.Tensor.item, torch.Tensor.tolist = saved
            res.update(o=o, final=final, pool=pool, out_is_o=("out" in kw and o is kw["out"]),
                       final_is_buffer=("final_state" in kw and final is kw["final_state"]))
        except Exception as e:  # reported by the test of that case
            res["error"] = f"{type(e).__name__}: {e}"
        results[(case["name"], variant)] = res
    kern.CONFIGS, kern._TUNED, kern._CHOSEN = default, {}, {}
    cli = CliRunner().invoke(app, ["run", suite, "--out", run_dir, "--device", "cpu"])
    results["cli"] = {"exit_code": cli.exit_code, "output": cli.output[-4000:]}
    torch.save(results, outputs)


if __name__ == "__main__":
    _worker(*sys.argv[1:5])


def start_interpreted(tmp: Path) -> InterpretedRun:
    """The kernel cases and the suite's run, in a subprocess (tests/interpreter.py)."""
    return start_worker(__name__, tmp, KERNEL_CASES, {
        "name": "triton-recurrent", "backends": ["triton.recurrent", "torch.recurrent"],
        "baseline": "torch.recurrent", "timing": ONCE, "cases": SUITE_CASES, "reference": {"precision": "fp64"}})


@pytest.fixture(scope="module")
def interpreted(interpreted_runs) -> dict:
    return worker_results(interpreted_runs[__name__])


# ---- references ---------------------------------------------------------------------------------------

def reference(kw: dict) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(o, final_state, pool after) from gdnbench.reference in fp64; gating from raw inputs in fp32.
    V-first states are swapped to the reference's K-first layout and back."""
    if kw.get("v_first"):
        swap = {n: kw[n].transpose(-1, -2) for n in ("state_pool", "initial_state") if n in kw}
        o, final, pool = reference({**kw, **swap, "v_first": False})
        return o, *(None if x is None else x.transpose(-1, -2) for x in (final, pool))
    if "a" in kw:
        g, beta = gate_from_raw(kw["a"], kw["b"], kw["A_log"], kw["dt_bias"])
    else:
        g, beta = kw["g"], kw["beta"]
    common = dict(scale=kw["scale"], qk_l2norm=kw["qk_l2norm"], compute_dtype=torch.float64)
    q, k, v = kw["q"], kw["k"], kw["v"]
    if "state_pool" in kw:
        pool = kw["state_pool"].clone()
        slots = kw["slot_idx"]
        if "cu_seqlens" not in kw:
            o = gdn_decode(gdn_recurrent, q, k, v, g, beta, state_pool=pool, slot_idx=slots,
                           num_accepted_tokens=kw.get("num_accepted_tokens"), **common)
            return o, None, pool
        # varlen on a pool: the recurrence from the gathered slots, written back to the live ones
        live = slots >= 0
        h0 = pool[slots.long().clamp(min=0)].double() * live[:, None, None, None]
        o, final = gdn_recurrent(q, k, v, g, beta, initial_state=h0, cu_seqlens=kw["cu_seqlens"], **common)
        pool[slots[live].long()] = final[live].to(pool.dtype)
        cu = kw["cu_seqlens"]
        for n in torch.nonzero(~live).flatten().tolist():
            o[:, cu[n]:cu[n + 1]] = 0
        return o, None, pool
    o, final = gdn_recurrent(q, k, v, g, beta, initial_state=kw.get("initial_state"),
                             cu_seqlens=kw.get("cu_seqlens"), **common)
    return o, (final if kw["output_final_state"] else None), None


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


O_TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 6e-3}  # output rounding to the dtype


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("name", list(BY_NAME))
def test_kernel_matches_the_fp64_reference(interpreted, name, variant):
    kw = BY_NAME[name]["kw"]
    got = interpreted[(name, variant)]
    assert "error" not in got, got.get("error")
    o_ref, final_ref, pool_ref = reference(kw)
    o = got["o"]
    assert o.dtype == kw["q"].dtype and o.shape == kw["v"].shape
    assert torch.isfinite(o).all(), "the kernel left NaN-poisoned outputs unwritten"
    if not BY_NAME[name]["default_out"]:
        assert got["out_is_o"], "out= was not written in place"
    assert rel(o, o_ref) < O_TOL[o.dtype], rel(o, o_ref)

    if pool_ref is None:
        if final_ref is None:
            assert got["final"] is None
        else:
            assert got["final"].dtype == torch.float32 and rel(got["final"], final_ref) < 1e-5
            if not BY_NAME[name]["default_out"]:
                assert got["final_is_buffer"], "final_state= was not written in place"
        return
    assert got["final"] is None
    pool0, pool = kw["state_pool"], got["pool"]
    slots = kw["slot_idx"].long()
    live = slots[slots >= 0]
    untouched = torch.ones(pool0.shape[0], dtype=torch.bool)
    untouched[live] = False
    assert torch.equal(pool[untouched], pool0[untouched]), "slots outside slot_idx (or padding) were modified"
    assert pool.dtype == pool0.dtype
    if pool.dtype == torch.float32:
        assert rel(pool[live], pool_ref[live]) < 1e-5
    else:
        # the kernel rounds its fp32 state, the reference its fp64 state: at most one bf16 step apart
        ulp = 2.0 ** (torch.frexp(pool_ref[live].float()).exponent.float() - 8)
        assert ((pool[live].float() - pool_ref[live].float()).abs() <= ulp).all()
        assert rel(pool[live], pool_ref[live]) < 1e-3  # most entries round alike
    pad = start_slots(kw["slot_idx"], kw.get("num_accepted_tokens")) < 0
    if pad.any():
        if "cu_seqlens" in kw:
            cu = kw["cu_seqlens"]
            for n in torch.nonzero(pad).flatten().tolist():
                assert (o[:, cu[n]:cu[n + 1]] == 0).all()
        else:
            assert (o[pad] == 0).all(), "padding sequences must get a zero output"


def test_raw_gating_cases_reach_the_softplus_tails():
    """The raw-gating cases reach softplus's linear branch (> 20) and its exp-small tail."""
    a = BY_NAME["prefill-raw-fp16"]["kw"]["a"].float()
    assert (a + 1 > 20).any() and (a < -20).any()


def test_kernel_runs_interpreted_with_one_config(interpreted):
    assert interpreted["INTERPRETED"] is True and len(interpreted["CONFIGS"]) == 1


def test_gdnbench_run_end_to_end_under_the_interpreter(interpreted):
    cli = interpreted["cli"]
    assert cli["exit_code"] == 0, cli["output"]
    df = pd.read_csv(interpreted["run_dir"] / "results.csv")
    tri = df[df.backend == "triton.recurrent"]
    ran = tri[tri.status != Status.SKIP]
    assert len(ran) == len(SUITE_CASES) - 1 and (ran.status == Status.PASS).all(), ran[["case_id", "status", "error"]]
    assert (ran.rel_err_o < 5e-3).all() and (ran.rel_err_state < 1e-4).all()
    assert ran.path.str.contains("BV=32 num_warps=4").all() and ran.path.str.contains("interpreter").all()
    assert ran.path.str.contains("raw gating fused").sum() == 3
    assert ran.path.str.contains("in place at slot_idx").sum() == 3
    assert ran.path.str.contains("a slot per token from num_accepted_tokens").sum() == 1
    assert set(tri[tri.status == Status.SKIP].error) == {"triton.recurrent: head dims up to 256, case has K=512, V=512"}
    assert (df[df.backend == "torch.recurrent"].status == Status.PASS).all()


# ---- the envelope, without the interpreter ------------------------------------------------------------

def case(**fields) -> Case:
    return Case(**{"B": 2, "T": 4, "H": 1, "D": 16, **fields})


def test_cpu_needs_the_interpreter(monkeypatch):
    b = registry()["triton.recurrent"]
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    needs = "triton.recurrent on cpu needs TRITON_INTERPRET=1 (set before triton is imported)"
    assert b.unsupported(case(), CPU) == needs
    assert b.unsupported(case(), CUDA) is None


def test_variable_set_after_the_kernel_compiled_is_caught(monkeypatch):
    """Setting TRITON_INTERPRET after the kernel module was imported (compiled) is a SKIP, not an error."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setitem(sys.modules, "gdnbench_kernels.recurrent", type(sys)("fake"))
    sys.modules["gdnbench_kernels.recurrent"].INTERPRETED = False
    reason = registry()["triton.recurrent"].unsupported(case(), CPU)
    assert reason is not None and "imported before TRITON_INTERPRET=1" in reason
    sys.modules["gdnbench_kernels.recurrent"].INTERPRETED = True
    assert registry()["triton.recurrent"].unsupported(case(), CPU) is None


@pytest.mark.parametrize("c", [
    case(), case(gating="raw"), case(qk_l2norm="kernel", HV=4), case(K=60, V=100, D=None), case(D=256),
    case(op="decode", T=None, state_dtype="bf16", pool_size=9, slots="scattered"),
    case(mode="varlen", B=None, T=None, seq_lens=[3, 5]), case(dtype="fp16"), case(dtype="fp32"),
])
def test_envelope_serves(c, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delitem(sys.modules, "gdnbench_kernels.recurrent", raising=False)
    assert registry()["triton.recurrent"].unsupported(c, CPU) is None


def test_envelope_refuses_head_dims_over_256():
    assert registry()["triton.recurrent"].unsupported(case(D=512), CUDA) == \
        "triton.recurrent: head dims up to 256, case has K=512, V=512"


# ---- the launcher's tuning logic, without running the kernel ------------------------------------------

def test_prune_caps_bv_at_v_and_drops_idle_or_spilling_tiles():
    import triton

    from gdnbench_kernels.recurrent import forward as kern

    cands = [triton.Config({"BV": bv, "ITEMS": 1}, num_warps=w, num_stages=2) for bv, w in kern._GPU_CANDIDATES]

    def kept(V, BK):
        return {(c.kwargs["BV"], c.num_warps) for c in kern._prune(cands, BK, V)}

    assert kept(128, 128) == set(kern._GPU_CANDIDATES)
    assert kept(256, 256) == set(kern._GPU_CANDIDATES) - {(64, 4), (16, 1)}  # 128 fp32 per thread would spill
    assert kept(16, 16) == {(8, 1), (16, 1), (16, 2)}  # BV capped at V; no thread left without 4 elements
    assert {bv for bv, _ in kept(60, 64)} <= {8, 16, 32, 64}


def test_a_pool_launch_tunes_on_a_scratch_copy_once_per_key(monkeypatch):
    """On a GPU tuning runs each candidate many times: never on the live pool."""
    import triton

    from gdnbench_kernels.recurrent import forward as kern

    calls, tunings = [], []

    class FakeKernel:  # what `kernel[grid](*args, **kw)` gives
        def __getitem__(self, grid):
            return lambda *args, **kw: calls.append((grid, args, kw))

    def fake_fastest(run, candidates, device):
        tunings.append(len(candidates))
        for c in candidates:
            run(c)
        return candidates[-1]

    candidates = [triton.Config({"BV": 8, "ITEMS": 1}, num_warps=1, num_stages=2),
                  triton.Config({"BV": 16, "ITEMS": 4}, num_warps=2, num_stages=2)]
    monkeypatch.setattr(kern, "recurrent_gdn_kernel", FakeKernel())
    monkeypatch.setattr(kern, "CONFIGS", candidates)  # as on a GPU: more than one candidate
    monkeypatch.setattr(kern, "fastest", fake_fastest)
    monkeypatch.setattr(kern, "_TUNED", {})
    monkeypatch.setattr(kern, "_CHOSEN", {})
    kw = BY_NAME["decode-padding-T2"]["kw"]  # slots [2, -1, 5, -1] in a pool of 8
    pool = kw["state_pool"].clone()
    kern.recurrent_gdn(**{**kw, "state_pool": pool})
    assert tunings == [2] and len(calls) == 3
    for grid, scratch, _ in calls[:2]:  # each candidate on the scratch copy
        assert scratch[12] is not pool and torch.equal(scratch[12], pool[[2, 0, 5, 0]])
        assert scratch[13].tolist() == [0, -1, 2, -1] and scratch[13].dtype == torch.int32
    # 1-D grids of (sequence, head, V-block) items: 4 * 2 * 2 one per program, 4 * 2 four per program
    assert [grid for grid, _, _ in calls[:2]] == [(16,), (2,)]
    (grid, live, meta) = calls[2]
    assert live[12] is pool and live[13] is kw["slot_idx"] and meta["IS_POOL"] and meta["BK"] == 16
    assert grid == (2,) and meta["BV"] == 16 and meta["ITEMS"] == 4 and meta["num_warps"] == 2  # the pick
    kern.recurrent_gdn(**{**kw, "state_pool": pool})
    assert tunings == [2] and len(calls) == 4  # the key is tuned: straight to the live pool
    kern.recurrent_gdn(**{**kw, "state_pool": pool.to(torch.bfloat16)})
    assert tunings == [2, 2] and len(calls) == 7  # another pool dtype is another key
    assert kern.best_config(kern.tune_key(16, 16, pool=True, N=4, H=1, HV=2, tokens=8)) == {
        "BV": 16, "ITEMS": 4, "num_warps": 2, "num_stages": 2}
    assert kern.best_config(kern.tune_key(16, 16, pool=False, N=4, H=1, HV=2, tokens=8)) is None
    prefill = BY_NAME["prefill-varlen"]["kw"]  # 12 tokens in 5 sequences, H=2, HV=4
    kern.recurrent_gdn(**prefill)
    assert len(calls) == 10  # nothing in place: tuning runs on the real buffers
    # a varlen launch is tiered by its tokens per sequence (12 // 5 = 2), not its total
    key = kern.tune_key(16, 16, pool=False, N=5, H=2, HV=4, tokens=12)
    assert key == kern.tune_key(16, 16, pool=False, N=5, H=2, HV=4, tokens=10) and kern.best_config(key)["BV"] == 16
    assert all(c[1][9] is calls[-1][1][9] for c in calls[-3:])  # the candidates wrote the real output
    assert calls[-1][0] == (5 * 4 // 4,)  # N from cu_seqlens' shape, never its values


def test_key_runs_spread_a_v_first_tiles_keys_over_fewer_lanes_with_several_tokens():
    from gdnbench_kernels.recurrent import key_runs

    # (BK, bytes per state element) -> runs of 16-byte vectors: 4 lanes along bf16 keys; 16 along fp32 ones
    # at 2 or 3 tokens per sequence, 8 from 4 tokens on
    pairs = [(64, 4), (128, 4), (256, 4), (128, 2), (256, 2), (32, 2), (16, 2)]
    assert [key_runs(bk, nb, True, 2) for bk, nb in pairs] == [1, 2, 4, 4, 8, 1, 1]
    assert [key_runs(bk, nb, True, 4) for bk, nb in pairs] == [2, 4, 8, 4, 8, 1, 1]
    # per-token slots store the state every token: 16 lanes whatever the tokens
    assert [key_runs(bk, nb, True, 4, per_token=True) for bk, nb in pairs] == [1, 2, 4, 1, 2, 1, 1]
    assert key_runs(128, 4, False, 4) == 1  # K-first: the keys are not the contiguous dim
    assert key_runs(128, 4, True, 1) == 1  # one token per sequence


def test_tune_key_separates_shapes_whose_best_configs_differ():
    """Tiers by heads (<64, <512, <1024, <4096, more) and tokens per sequence (1, 2, more)."""
    from gdnbench_kernels.recurrent import forward as kern

    def tier(N, HV, T):
        return kern.tune_key(128, 128, pool=True, N=N, H=16, HV=HV, tokens=N * T)[-1]

    assert tier(1, 32, 1) != tier(8, 16, 1)  # a 3 us launch and an 8 us one
    assert tier(32, 16, 1) != tier(64, 16, 1) == tier(128, 16, 1)  # (16, 4) vs (32, 4), bf16 pool
    assert tier(256, 32, 2) != tier(256, 32, 4)  # (64, 4) vs (8, 1) on an H100
    assert tier(256, 32, 4) == tier(256, 32, 8) and tier(256, 32, 1) == tier(512, 32, 1)
    assert len({tier(N, 32, T) for N in (1, 8, 16, 64, 256) for T in (1, 2, 4)}) == 15
    # same tier, another GVA ratio: (16, 4) at HV=32 = 2H, (8, 1) at HV=16 = H (T=2, B=64 and 256)
    for N in (64, 256):
        assert kern.tune_key(128, 128, pool=True, N=N, H=16, HV=32, tokens=2 * N) != \
            kern.tune_key(128, 128, pool=True, N=N, H=16, HV=16, tokens=2 * N)


@pytest.mark.parametrize("bad, needle", [
    ({"g": None}, "g and beta"),
    ({"initial_state": torch.zeros(4, 2, 16, 16)}, "no initial_state"),
    ({"slot_idx": torch.tensor([0, 1], dtype=torch.int32)}, "needs slot_idx [4], int32"),
    ({"num_accepted_tokens": torch.ones(4, dtype=torch.int32)}, "needs slot_idx [4, 2], int32 (or int64) with num"),
    ({"num_accepted_tokens": torch.ones(4, dtype=torch.int32), "slot_idx": torch.zeros(4, 2, dtype=torch.int32),
      "state_pool": None}, "num_accepted_tokens goes with a state pool"),
    ({"state_pool": torch.zeros(8, 2, 16, 16).transpose(2, 3)}, "contiguous"),
    ({"out": torch.empty(4, 2, 2, 16, dtype=torch.float16)}, "out must be"),
])
def test_launcher_rejects_bad_arguments(bad, needle):
    from gdnbench_kernels.recurrent import forward as kern

    with pytest.raises(ValueError, match=re.escape(needle)):
        kern.recurrent_gdn(**{**BY_NAME["decode-padding-T2"]["kw"], **bad})


def test_a_final_state_buffer_of_another_shape_or_dtype_is_refused():
    from gdnbench_kernels.recurrent import forward as kern

    kw = BY_NAME["prefill-varlen"]["kw"]
    N, HV, K, V = kw["cu_seqlens"].numel() - 1, kw["v"].shape[2], kw["q"].shape[3], kw["v"].shape[3]
    for bad in (torch.empty(N, HV, K, V, dtype=torch.float64), torch.empty(N + 1, HV, K, V)):
        with pytest.raises(ValueError, match="final_state must be a contiguous fp32"):
            kern.recurrent_gdn(**kw, final_state=bad)

# ---- the compiled path, without a GPU -----------------------------------------------------------------

@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
@pytest.mark.parametrize("K, V, BV, warps, mode", [
    (128, 128, 32, 4, {"pool": "fp32", "one_token": True}),
    (128, 128, 8, 1, {"pool": "bf16", "raw": True, "l2": True, "dt": "bf16", "one_token": True}),
    (128, 128, 16, 2, {"pool": "bf16", "raw": True, "l2": True, "dt": "bf16", "v_first": True}),
    (60, 100, 16, 2, {"varlen": True, "h0": True, "ht": True, "l2": True, "dt": "fp16"}),
    (256, 256, 32, 8, {"ht": True}),
    (128, 128, 32, 4, {"pool": "bf16", "per_token": True, "raw": True, "dt": "bf16", "v_first": True}),
    (128, 128, 32, 4, {"pool": "fp32", "v_first": True, "items": 4}),  # two runs of keys per thread
    (256, 64, 16, 4, {"h0": True, "ht": True, "v_first": True}),  # four
])
def test_kernel_compiles_for_sm90(K, V, BV, warps, mode):
    """The interpreter runs Python, not Triton's code generator: compile for sm_90 (to a cubin) on this CPU."""
    import triton

    from gdnbench_kernels.recurrent import forward as kern

    pool, dt = mode.get("pool"), mode.get("dt", "fp32")
    ptr = {"q": dt, "k": dt, "v": dt, "g": "fp32", "beta": dt, "a": dt, "b": dt, "A_log": "fp32", "dt_bias": "fp32",
           "o": dt, "h0": "fp32", "ht": "fp32", "pool": pool or "fp32", "slot_idx": "i32", "accepted": "i32",
           "cu_seqlens": "i64"}
    const = dict(H=2, HV=4, K=K, V=V, BK=triton.next_power_of_2(K), IS_VARLEN=bool(mode.get("varlen")),
                 USE_H0=bool(mode.get("h0")), STORE_HT=bool(mode.get("ht")), IS_POOL=pool is not None,
                 PER_TOKEN=bool(mode.get("per_token")), V_FIRST=bool(mode.get("v_first")),
                 RAW_GATE=bool(mode.get("raw")), L2NORM=bool(mode.get("l2")),
                 GATES_AHEAD=bool(mode.get("one_token")), BV=BV, ITEMS=mode.get("items", 1))
    const["KS"] = kern.key_runs(const["BK"], 2 if pool in ("bf16", "fp16") else 4, const["V_FIRST"],
                                1 if const["GATES_AHEAD"] else 2)
    unused = (["g", "beta"] if const["RAW_GATE"] else ["a", "b", "A_log", "dt_bias"]) + \
        ([] if pool else ["pool", "slot_idx"]) + ([] if const["PER_TOKEN"] else ["accepted"]) + \
        ([] if const["USE_H0"] else ["h0"]) + \
        ([] if const["STORE_HT"] else ["ht"]) + ([] if const["IS_VARLEN"] else ["cu_seqlens"])
    const.update(dict.fromkeys(unused))
    sig = {name: "constexpr" if name in const else f"*{t}" for name, t in ptr.items()}
    sig.update(scale="fp32", T="i32", NH="i32", **dict.fromkeys(const, "constexpr"))
    compile_sm90(kern.recurrent_gdn_kernel, sig, const, interpreted=kern.INTERPRETED, num_warps=warps)

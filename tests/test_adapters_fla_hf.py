"""Adapters to FLA, FlashQLA and transformers' PyTorch fallbacks (fla.*, flashqla.chunk, hf.*), on a CPU.

Conversions, knobs and envelopes are checked against fakes or without the libraries; hf.* run end to end
in this process; fla.recurrent runs end to end in a subprocess under TRITON_INTERPRET=1, because Triton
picks its interpreter when it is imported and this process may have imported it already.
"""

import importlib
import importlib.util
import os
import sys
import types
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from typer.testing import CliRunner

import gdnbench.backends
from gdnbench.backends import base, registry
from gdnbench.backends.convert import GatheredPool
from gdnbench.backends.fla_common import NO_REDIRECT, fla_kwargs, pinned_env
from gdnbench.backends.torch_common import solve
from gdnbench.cli import app
from gdnbench.problem import make_problem
from gdnbench.reference import gate_from_raw, gdn_recurrent
from gdnbench.results import Status
from gdnbench.runner import RunOptions, run_case
from gdnbench.suite import Case, parse_suite
from gdnbench.timing import TimingConfig
from tests.interpreter import InterpretedRun

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
FAST = {"min_samples": 3, "min_time_s": 0.0, "max_time_s": 0.1, "warmup": 1}
ONCE = {"min_samples": 1, "max_samples": 1, "min_time_s": 0.0, "max_time_s": 0.01, "warmup": 1}
# Small cases covering what the adapters convert: GVA (H < HV) over two chunks, q/k l2norm in the
# kernel, a random initial state, raw gating, varlen, decode on a scattered bf16 pool, spec decode (T=2).
CASES = [
    {"B": 1, "T": 70, "H": 2, "HV": 4, "K": 8, "V": 16, "dtype": "bf16", "qk_l2norm": "kernel",
     "initial_state": "random"},
    {"B": 2, "T": 5, "H": 1, "HV": 2, "D": 8, "dtype": "fp16", "gating": "raw"},
    {"op": "decode", "B": 2, "H": 1, "HV": 2, "D": 8, "pool_size": 5, "slots": "scattered", "state_dtype": "bf16"},
    {"op": "decode", "B": 3, "T": 2, "H": 1, "HV": 2, "D": 8, "pool_size": 5, "slots": "scattered",
     "gating": "raw", "dtype": "fp32"},
]
ADAPTERS = [f"gdnbench.backends.{m}" for m in
            ("fla_common", "fla_chunk", "fla_recurrent", "flashqla_chunk", "hf_torch_recurrent", "hf_torch_chunk")]
VARLEN = {"mode": "varlen", "seq_lens": [3, 6], "H": 1, "HV": 2, "D": 8, "dtype": "fp32", "initial_state": "random"}


def start_interpreted(tmp: Path) -> InterpretedRun | None:
    """fla.recurrent end to end under TRITON_INTERPRET=1, in a subprocess (tests/interpreter.py): importing
    FLA in the interpreter takes several seconds, so the run goes on beside the other tests. The interpreter
    steps through every program of the grid: short sequences, one timed sample."""
    if importlib.util.find_spec("fla") is None:
        return None
    cases = [{**CASES[0], "T": 9}, *CASES[1:], VARLEN]
    suite = write_suite(tmp / "s.yaml", ["fla.recurrent", "fla.chunk"], cases, timing=ONCE)
    return InterpretedRun(["gdnbench", "run", str(suite), "--out", str(tmp / "out"), "--device", "cpu"], tmp / "out")


@pytest.fixture(scope="module")
def interpreted(interpreted_runs) -> Path | None:
    run = interpreted_runs[__name__]
    return None if run is None else run.wait()


def case(**fields) -> Case:
    return Case(**{"B": 2, "T": 8, "H": 1, "D": 8, **fields})


def write_suite(path: Path, backends: list[str], cases: list[dict], timing: dict = FAST) -> Path:
    path.write_text(yaml.safe_dump({"name": "adapters", "backends": backends, "timing": timing, "cases": cases}))
    return path


def results(out: Path) -> pd.DataFrame:
    return pd.read_csv(out / "results.csv")


# ---- conversions, without the libraries -------------------------------------------------------------

def test_fla_kwargs_fuse_raw_gating_and_pass_canonical_gating_otherwise():
    p = make_problem(case(gating="raw", dtype="fp16", qk_l2norm="kernel"), seed=0)
    kw = fla_kwargs(p)
    assert kw["g"] is p.a and kw["beta"] is p.b and kw["A_log"] is p.A_log and kw["dt_bias"] is p.dt_bias
    assert kw["use_gate_in_kernel"] and kw["use_beta_sigmoid_in_kernel"] and kw["use_qk_l2norm_in_kernel"]
    assert kw["state_v_first"] is False and kw["scale"] == p.scale
    p = make_problem(case(scale=0.1), seed=0)
    kw = fla_kwargs(p)
    assert kw["g"] is p.g and kw["beta"] is p.beta and kw["scale"] == 0.1
    assert not kw["use_qk_l2norm_in_kernel"] and "use_gate_in_kernel" not in kw and "A_log" not in kw


def test_gathered_pool_reads_and_writes_only_the_slots_in_the_pool_dtype():
    p = make_problem(Case(op="decode", B=3, H=1, HV=2, D=4, pool_size=7, slots="scattered", state_dtype="bf16"), 0)
    slots = p.slot_idx.long()
    pool = GatheredPool(p)
    assert torch.equal(pool.gather(), p.state_pool[slots])
    final = torch.randn(3, 2, 4, 4)  # what a library returns: fp32, K-first
    buffer = pool.pool.data_ptr()
    pool.scatter(final)
    after = pool.canonical()
    assert after.dtype == torch.bfloat16 and torch.equal(after[slots], final.to(torch.bfloat16))
    others = torch.ones(7, dtype=torch.bool)
    others[slots] = False
    assert torch.equal(after[others], p.state_pool[others])  # bit-identical elsewhere
    pool.reset()
    assert torch.equal(pool.canonical(), p.state_pool) and pool.pool.data_ptr() == buffer


def test_gathered_pool_rejects_padding_slots():
    p = make_problem(Case(op="decode", B=2, H=1, D=4, pool_size=3), 0)
    p.slot_idx[1] = -1  # -1 would silently address the last slot of the pool
    with pytest.raises(ValueError, match="padding"):
        GatheredPool(p)


def test_pinned_env_sets_only_during_the_call_and_restores(monkeypatch):
    monkeypatch.delenv("FLA_FLASH_QLA", raising=False)
    monkeypatch.setenv("FLA_INTRACARD_CP", "1")
    with pytest.raises(RuntimeError), pinned_env(NO_REDIRECT):
        assert os.environ["FLA_FLASH_QLA"] == "0" and os.environ["FLA_INTRACARD_CP"] == "0"
        raise RuntimeError("a failing kernel must not leave the pin behind")
    assert "FLA_FLASH_QLA" not in os.environ and os.environ["FLA_INTRACARD_CP"] == "1"


def test_importing_the_adapters_imports_no_library(monkeypatch):
    libraries = ("fla", "flash_qla", "tilelang", "transformers")
    for name in [m for m in sys.modules if m.split(".")[0] in libraries] + list(libraries):
        monkeypatch.setitem(sys.modules, name, None)  # any import of them, or of a submodule, now raises
    for module in ADAPTERS:  # monkeypatch puts the loaded modules back afterwards
        monkeypatch.delitem(sys.modules, module, raising=False)
        monkeypatch.delattr(gdnbench.backends, module.rpartition(".")[2], raising=False)
    for module in ADAPTERS:
        assert importlib.import_module(module).__name__ == module


# ---- envelopes and SKIP reasons -----------------------------------------------------------------------

@pytest.mark.parametrize("name, c, device, needle", [
    ("fla.chunk", case(), CPU, "runs on cuda, not cpu"),
    ("fla.chunk", case(K=512, V=64, D=None), CUDA, "head dims up to 256, case has K=512"),
    ("fla.chunk", case(op="decode", T=None), CUDA, "no decode op"),
    ("flashqla.chunk", case(D=64), CUDA, "head dims [128] only, case has K=64, V=64"),
    ("flashqla.chunk", case(D=128, dtype="fp32"), CUDA, "dtype fp32 not supported"),
    ("flashqla.chunk", case(D=128, op="decode", T=None), CUDA, "no decode op"),
    ("hf.torch_chunk", case(mode="varlen", B=None, T=None, seq_lens=[3, 5]), CPU, "no varlen support"),
    ("hf.torch_recurrent", case(scale=0.1), CPU, "scale is fixed at K**-0.5 = 0.353553 (no scale argument)"),
    ("hf.torch_chunk", case(op="decode", T=None), CPU, "no decode op"),
])
def test_unsupported_cases_say_why(name, c, device, needle):
    reason = registry()[name].unsupported(c, device)
    assert reason is not None and reason.startswith(name) and needle in reason


@pytest.mark.parametrize("name, c", [("hf.torch_chunk", case(scale=8**-0.5)), ("hf.torch_recurrent", case(HV=2)),
                                     ("fla.recurrent", case(op="decode", T=None, gating="raw"))])
def test_supported_cases_pass_the_envelope(name, c, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert registry()[name].unsupported(c, CPU) is None


def test_fla_recurrent_on_cpu_needs_the_triton_interpreter(monkeypatch):
    b = registry()["fla.recurrent"]
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert b.unsupported(case(), CPU) == "fla.recurrent on cpu needs TRITON_INTERPRET=1 (set before triton is imported)"
    assert b.unsupported(case(), CUDA) is None  # nothing to ask of a GPU


@pytest.mark.parametrize("cc, dtype, needle", [
    ((8, 0), "bf16", "SM90, SM100, SM103, SM120, SM121 only, this GPU is SM80"),
    ((12, 0), "fp16", "SM120 forward kernel does not compile for fp16"),
    ((12, 0), "bf16", None), ((9, 0), "fp16", None), ((10, 3), "bf16", None),
])
def test_flashqla_arch_envelope(cc, dtype, needle, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cc)
    reason = registry()["flashqla.chunk"].unsupported(case(D=128, dtype=dtype), CUDA)
    assert reason == needle if needle is None else needle in reason


@pytest.mark.parametrize("name, module", [("fla.chunk", "fla.ops.gated_delta_rule"),
                                          ("fla.recurrent", "fla.ops.gated_delta_rule"),
                                          ("flashqla.chunk", "flash_qla"),
                                          ("hf.torch_chunk", "transformers.models.qwen3_next"),
                                          ("hf.torch_recurrent", "transformers.models.qwen3_next")])
def test_missing_library_is_a_skip_row_naming_the_module(name, module, monkeypatch):
    # None in sys.modules makes the import fail as if the package were not installed
    monkeypatch.setitem(sys.modules, module, None)
    base._import_error.cache_clear()
    try:
        suite = parse_suite({"name": "t", "backends": [name], "cases": [{"B": 1, "T": 4, "H": 1, "D": 8}]})
        opts = RunOptions(device=CPU, timing=TimingConfig(timer="wall"), baseline={}, seed=0)
        rows, _ = run_case(suite.cases[0], [registry()[name]], suite, opts)
    finally:
        base._import_error.cache_clear()
    assert rows[0].status == Status.SKIP and f"cannot import {module}" in rows[0].error


# ---- the timed call, against fakes of the libraries ---------------------------------------------------

def test_fla_chunk_call_pins_the_dispatch_and_precomputes_chunk_indices(monkeypatch):
    fla_gdn = pytest.importorskip("fla.ops.gated_delta_rule")
    from fla.ops.utils import prepare_chunk_indices

    seen = {}

    def fake_chunk(**kw):  # keyword-only: a positional call would fail here
        seen.update(kw, env={k: os.environ.get(k) for k in NO_REDIRECT})
        return torch.zeros_like(kw["v"]), torch.zeros(2, 2, 8, 8)

    monkeypatch.setattr(fla_gdn, "chunk_gated_delta_rule", fake_chunk)
    monkeypatch.delenv("FLA_FLASH_QLA", raising=False)
    p = make_problem(Case(**{**VARLEN, "gating": "raw"}), seed=0)
    prepared = registry()["fla.chunk"].prepare(p)
    prepared.call()
    assert seen["env"] == NO_REDIRECT and "FLA_FLASH_QLA" not in os.environ
    assert seen["cu_seqlens"] is p.cu_seqlens and seen["cu_seqlens"].dtype == torch.int64
    assert torch.equal(seen["chunk_indices"], prepare_chunk_indices(p.cu_seqlens, 64)) and seen["chunk_size"] == 64
    assert seen["g"] is p.a and seen["use_gate_in_kernel"] and seen["use_beta_sigmoid_in_kernel"]
    assert seen["initial_state"] is p.initial_state and seen["output_final_state"] is True
    assert prepared.outputs().final_state.shape == (2, 2, 8, 8)
    assert "FLA_FLASH_QLA=0" in prepared.path and "chunk_indices precomputed" in prepared.path


def test_fla_flashqla_switch_is_read_per_call():
    """What the pin relies on: FLA 0.6.0 reads FLA_FLASH_QLA at every dispatch, not at import."""
    backend = pytest.importorskip("fla.ops.gated_delta_rule.backends.flash_qla").FlashQLABackend()
    with pinned_env({"FLA_FLASH_QLA": "1"}):
        assert backend.is_enabled()
    with pinned_env(NO_REDIRECT):
        assert not backend.is_enabled()


def test_flashqla_call_pins_auto_cp_and_times_the_gating(monkeypatch):
    seen = {}

    def fake_chunk(**kw):
        seen.update(kw)
        return torch.zeros_like(kw["v"]), None

    monkeypatch.setitem(sys.modules, "flash_qla", types.SimpleNamespace(chunk_gated_delta_rule=fake_chunk))
    import gdnbench.backends.flashqla_chunk as mod

    monkeypatch.setattr(mod, "fla_gate", lambda: None)  # FLA's gate kernels cannot run on a CPU
    p = make_problem(case(D=128, dtype="bf16", gating="raw", output_final_state=False), seed=0)
    prepared = mod.flashqla_chunk.prepare(p)
    prepared.call()
    g, beta = gate_from_raw(p.a, p.b, p.A_log, p.dt_bias)
    assert seen["auto_cp"] is True and seen["state_v_first"] is False and seen["output_final_state"] is False
    assert torch.equal(seen["g"], g) and torch.equal(seen["beta"], beta) and seen["q"] is p.q
    assert prepared.path == "flash_qla tilelang chunk; auto_cp=True; raw gating in the call by torch"


def test_hf_without_gva_gets_heads_repeated_in_prepare(monkeypatch):
    """transformers <= 5.17 had no GVA in these functions; the probe must find that and repeat q/k."""
    import gdnbench.backends.hf_torch_recurrent as hf

    def old_recurrent(query, key, value, g, beta, initial_state=None, output_final_state=False,
                      use_qk_l2norm_in_kernel=False):
        if query.shape[2] != value.shape[2]:
            raise RuntimeError("shape mismatch")  # as the old code did
        return gdn_recurrent(query, key, value, g, beta, initial_state=initial_state, qk_l2norm=use_qk_l2norm_in_kernel)

    monkeypatch.setattr(hf, "torch_function", lambda name: old_recurrent)
    p = make_problem(case(H=2, HV=4, T=5, op="decode", slots="scattered", pool_size=4), seed=0)
    prepared = hf.prepare(p, "torch_recurrent_gated_delta_rule")
    prepared.reset()
    prepared.call()
    ref = solve(p, "recurrent", torch.float32)
    assert "q/k heads repeated in prepare" in prepared.path
    assert torch.allclose(prepared.outputs().o, ref.o, atol=1e-6)
    assert torch.allclose(prepared.outputs().state_pool, ref.state_pool, atol=1e-6)


# ---- end to end on a CPU ----------------------------------------------------------------------------

def test_hf_and_skips_end_to_end_on_cpu(tmp_path, monkeypatch):
    """hf.* PASS; with FLA installed this also proves the unwrap: FLA's kernels would fail on a CPU."""
    pytest.importorskip("transformers.models.qwen3_next")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    backends = ["hf.torch_chunk", "hf.torch_recurrent", "fla.chunk", "fla.recurrent", "flashqla.chunk"]
    suite = write_suite(tmp_path / "s.yaml", backends, [*CASES, VARLEN, {"B": 1, "T": 4, "H": 1, "D": 8, "scale": 0.1}])
    res = CliRunner().invoke(app, ["run", str(suite), "--out", str(tmp_path / "out"), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    df = results(tmp_path / "out")
    hf = df[df.backend.str.startswith("hf.")].set_index(["backend", "case_id"])
    ran = hf[hf.status != Status.SKIP]
    assert (ran.status == Status.PASS).all(), ran[["status", "error"]]
    assert len(ran) == 2 * 2 + 2 and (ran.rel_err_o < 5e-3).all() and (ran.rel_err_state < 1e-3).all()
    assert ran.path.str.contains("inspect.unwrap").all()
    skips = hf[hf.status == Status.SKIP].error
    assert skips.str.contains("no varlen support").sum() == 2 and skips.str.contains("scale is fixed").sum() == 2
    assert skips.str.contains("no decode op").sum() == 2 and len(skips) == 6
    why = df[~df.backend.str.startswith("hf.")].groupby("backend").error.agg(set).to_dict()
    assert why["fla.chunk"] == {"fla.chunk: runs on cuda, not cpu", "fla.chunk: no decode op (serves prefill)"}
    assert why["fla.recurrent"] == {"fla.recurrent on cpu needs TRITON_INTERPRET=1 (set before triton is imported)"}
    assert len(why["flashqla.chunk"]) == 1 and "cannot import flash_qla" in why["flashqla.chunk"].pop()


def test_fla_recurrent_end_to_end_on_cpu_under_the_triton_interpreter(interpreted):
    if interpreted is None:
        pytest.skip("fla is not installed")
    df = results(interpreted)
    fla = df[df.backend == "fla.recurrent"]
    assert len(fla) == 5 and (fla.status == Status.PASS).all(), fla[["case_id", "status", "error"]]
    assert (fla.rel_err_state < 1e-3).all()
    assert fla.path.str.contains("gathered").sum() == 2 and fla.path.str.contains("use_gate_in_kernel").sum() == 2
    assert set(df[df.backend == "fla.chunk"].error) == {"fla.chunk: runs on cuda, not cpu",
                                                       "fla.chunk: no decode op (serves prefill)"}

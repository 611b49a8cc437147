"""The adapters to kingsleykimm/h100_gdn_cuda (gdn_cuda.chunk, gdn_cuda.recurrent), on a CPU without it.

The library builds only on an SM90 GPU, so the tests cover (1) the registration and the SKIP rows a
machine without it gives, (2) the envelopes, with a monkeypatched GPU capability, and where the JIT's
library root and nvcc are looked up, and (3) the adapters end to end against a stand-in ``gdn_cuda``
module: ``init``, ``chunked_forward`` and ``recurrent_forward`` with the binding's parameter names
(``csrc/python_api.cpp`` at afe3ded), its dtypes and layouts asserted (bf16 data, fp32 log gate for the
chunk and bf16 for the recurrence, int32 varlen tables, V-first bf16 states), computed with the reference
recurrence. A conversion the adapter gets wrong fails the correctness gate; one it makes inside the
timed call shows as a tensor the stand-in receives anew on each call.
"""

from __future__ import annotations

import enum
import re
import subprocess
import sys
import types
from importlib.metadata import EntryPoint
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from typer.testing import CliRunner

from gdnbench import reference
from gdnbench.backends import base, convert, gdn_cuda_common, registry
from gdnbench.backends.gdn_cuda_chunk import gdn_cuda_chunk
from gdnbench.backends.gdn_cuda_recurrent import gdn_cuda_recurrent
from gdnbench.cli import app
from gdnbench.problem import make_problem
from gdnbench.results import Status
from gdnbench.suite import Case
from tests.backend_helpers import check_reset_restores_the_pool, fake_install, run_adapter

ROOT = Path(__file__).resolve().parent.parent
CUDA = torch.device("cuda")
NAMES = {"gdn_cuda.chunk": gdn_cuda_chunk, "gdn_cuda.recurrent": gdn_cuda_recurrent}
BF16 = torch.bfloat16
CALLS: list[tuple[str, dict]] = []


# --------------------------------------------------------------------------------------------------
# A stand-in for the library
# --------------------------------------------------------------------------------------------------


class InferenceMode(enum.IntEnum):
    """The binding's py::enum_ (pybind enums convert with int())."""

    Prefill = 0
    Decode = 1
    SpecVerify = 2


def _aligned(d: int) -> int:
    return -(-d // 64) * 64


def _init(library_root, cuda_home):
    CALLS.append(("init", dict(library_root=library_root, cuda_home=cuda_home)))


def _chunked_forward(query, key, value, beta, gate, scale=None, initial_state=None, cu_seqlens=None,
                     chunk_indices=None, cu_chunks=None, total_chunks=None):
    """chunked_forward: bf16 q/k/v/beta, fp32 log gate, int32 varlen tables, V-first bf16 states."""
    CALLS.append(("chunked_forward", dict(locals())))
    assert query.dtype == key.dtype == value.dtype == beta.dtype == BF16 and gate.dtype == torch.float32
    varlen = cu_seqlens is not None
    assert query.dim() == (3 if varlen else 4) and query.shape == key.shape
    if varlen:
        assert cu_seqlens.dtype == chunk_indices.dtype == cu_chunks.dtype == torch.int32
        assert type(total_chunks) is int and total_chunks == chunk_indices.numel() // 2 == int(cu_chunks[-1])
    else:
        assert chunk_indices is None and cu_chunks is None and total_chunks is None
    HV, D = value.shape[-2:]
    assert query.shape[-1] == D, "one padding amount for q, k and v: K == V"
    q, k, v, g, b = (x[None] if varlen else x for x in (query, key, value, gate, beta))
    h0 = None
    if initial_state is not None:
        N = cu_seqlens.numel() - 1 if varlen else query.shape[0]
        assert initial_state.dtype == BF16 and initial_state.shape == (N, HV, D, D) and initial_state.is_contiguous()
        h0 = initial_state.transpose(-1, -2).float()
    o, s = reference.gdn_recurrent(q, k, v, g, b, scale=scale if scale is not None else _aligned(D) ** -0.5,
                                   initial_state=h0, cu_seqlens=cu_seqlens.long() if varlen else None)
    return o.reshape(value.shape).to(BF16), s.transpose(-1, -2).to(BF16).contiguous()


def _recurrent_forward(query, key, value, initial_state=None, beta=None, gate=None, cu_seqlens=None,
                       num_accepted_tokens=None, inference_mode=0, is_qk_norm=False, scale=None):
    """recurrent_forward, padded: everything bf16, the gate included; state [B, HV, V, K] in, a new one out."""
    CALLS.append(("recurrent_forward", dict(locals())))
    assert all(x.dtype == BF16 for x in (query, key, value, beta, gate, initial_state))
    assert query.dim() == 4 and cu_seqlens is None and num_accepted_tokens is None
    assert type(inference_mode) is int and inference_mode == InferenceMode.Decode
    B, HV, D = query.shape[0], value.shape[2], query.shape[3]
    assert value.shape[3] == D and initial_state.shape == (B, HV, D, D) and initial_state.is_contiguous()
    o, s = reference.gdn_recurrent(query, key, value, gate.float(), beta,
                                   scale=scale if scale is not None else D ** -0.5,
                                   initial_state=initial_state.transpose(-1, -2).float(), qk_l2norm=is_qk_norm)
    return o.to(BF16), s.transpose(-1, -2).to(BF16).contiguous()


def _stand_in() -> types.ModuleType:
    mod = types.ModuleType("gdn_cuda")
    mod.init, mod.chunked_forward, mod.recurrent_forward = _init, _chunked_forward, _recurrent_forward
    mod.InferenceMode = InferenceMode
    return mod


def _jit_root(root: Path, headers=gdn_cuda_common.HEADERS) -> Path:
    for name in headers:
        (root / "include" / name).mkdir(parents=True)
    return root


def _toolkit(home: Path) -> Path:
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "nvcc").write_text("")
    return home


@pytest.fixture
def clean_env(monkeypatch):
    for var in (*gdn_cuda_common.ROOT_VARS, *gdn_cuda_common.CUDA_VARS, "JIT_USE_NVRTC", "LD_PRELOAD"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def fake_lib(monkeypatch, tmp_path, clean_env):
    """The stand-in as ``gdn_cuda``, a library root and a toolkit found through the variables."""
    monkeypatch.setitem(sys.modules, "gdn_cuda", _stand_in())
    monkeypatch.setenv("GDN_CUDA_ROOT", str(_jit_root(tmp_path / "checkout" / "gdn_cuda")))
    monkeypatch.setenv("CUDA_HOME_PATH", str(_toolkit(tmp_path / "cuda")))
    CALLS.clear()
    yield
    CALLS.clear()


def gpu(monkeypatch, cc: tuple[int, int]) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cc)


def library_calls(name: str) -> list[dict]:
    return [kw for entry, kw in CALLS if entry == name]


def same_tensors_each_call(calls: list[dict], made_in_call: tuple[str, ...] = ()) -> None:
    """Every tensor argument but ``made_in_call`` is the same storage on every call: built in prepare."""
    first, *rest = calls
    for later in rest:
        for name, value in first.items():
            if isinstance(value, torch.Tensor) and name not in made_in_call:
                assert later[name].data_ptr() == value.data_ptr(), f"{name} is made anew in the timed call"


# --------------------------------------------------------------------------------------------------
# Registration and SKIP rows
# --------------------------------------------------------------------------------------------------


def entry_points() -> dict[str, str]:
    """The two backends' entries in pyproject.toml's gdnbench.backends table (read as text: tomllib is 3.11+)."""
    text = (ROOT / "pyproject.toml").read_text()
    table = text.split('[project.entry-points."gdnbench.backends"]', 1)[1].split("\n[", 1)[0]
    found = dict(re.findall(r'^"([^"]+)" = "([^"]+)"$', table, re.MULTILINE))
    return {name: found[name] for name in NAMES}


def test_both_backends_are_registered_in_pyproject():
    for name, value in entry_points().items():
        b = EntryPoint(name, value, "gdnbench.backends").load()
        assert b is NAMES[name] and b.name == name


@pytest.fixture
def registered_without_library(tmp_path, monkeypatch):
    """The two entry points as pip installs them, and ``gdn_cuda`` not importable (installed or not)."""
    fake_install(tmp_path / "site", "gdnbench_gdn_cuda_test", entry_points())
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setitem(sys.modules, "gdn_cuda", None)
    registry.cache_clear()
    base._import_error.cache_clear()
    yield
    registry.cache_clear()
    base._import_error.cache_clear()


def test_without_the_library_each_backend_is_a_skip_row_naming_the_module(registered_without_library, tmp_path):
    cases = [{"B": 1, "T": 8, "H": 1, "D": 64},
             {"op": "decode", "B": 2, "H": 1, "D": 64, "state_dtype": "bf16"}]
    suite = {"name": "t", "backends": sorted(NAMES), "cases": cases,
             "timing": {"min_samples": 1, "min_time_s": 0.0, "warmup": 1}}
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    res = CliRunner().invoke(app, ["run", str(path), "--device", "cpu", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    rows = pd.read_csv(tmp_path / "out" / "results.csv")
    assert len(rows) == 4 and set(rows.status) == {Status.SKIP}
    for name, errors in rows.groupby("backend").error:
        assert name in NAMES
        assert errors.str.startswith(f"{name}: cannot import gdn_cuda (ModuleNotFoundError").all(), errors.tolist()
    listed = CliRunner().invoke(app, ["list"], env={"COLUMNS": "200"})
    assert listed.exit_code == 0 and all(name in listed.output for name in NAMES)
    assert listed.output.count("why not here: cannot import gdn_cuda (ModuleNotFoundError") == 2


def test_importing_the_adapters_does_not_import_the_library():
    code = ("import sys, gdnbench.backends.gdn_cuda_chunk, gdnbench.backends.gdn_cuda_recurrent; "
            "print('gdn_cuda' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "False"


# --------------------------------------------------------------------------------------------------
# Envelopes
# --------------------------------------------------------------------------------------------------

PRE = dict(B=1, T=64, H=2)
DECODE = dict(op="decode", B=4, H=2, state_dtype="bf16")
ENVELOPE = [  # (backend, capability, case, reason: None or how it starts)
    ("gdn_cuda.chunk", (9, 0), Case(HV=4, D=128, **PRE), None),
    ("gdn_cuda.chunk", (9, 0), Case(mode="varlen", seq_lens=(5, 70), H=2, D=60, initial_state="random"), None),
    ("gdn_cuda.chunk", (9, 0), Case(D=256, **PRE), None),
    ("gdn_cuda.chunk", (9, 0), Case(dtype="fp16", D=128, **PRE), "gdn_cuda.chunk: dtype fp16 not supported (bf16)"),
    ("gdn_cuda.chunk", (8, 0), Case(D=128, **PRE), "gdn_cuda.chunk: SM90 only, this GPU is SM80"),
    ("gdn_cuda.chunk", (10, 0), Case(D=128, **PRE), "gdn_cuda.chunk: SM90 only, this GPU is SM100"),
    ("gdn_cuda.chunk", (9, 0), Case(K=128, V=64, **PRE), "gdn_cuda.chunk: needs K == V, case has K=128, V=64"),
    ("gdn_cuda.chunk", (9, 0), Case(D=320, **PRE), "gdn_cuda.chunk: head dims up to 256, case has K=320"),
    ("gdn_cuda.chunk", (9, 0), Case(D=128, qk_l2norm="kernel", **PRE),
     "gdn_cuda.chunk: qk_l2norm: kernel not supported (serves pre)"),
    ("gdn_cuda.chunk", (9, 0), Case(D=128, gating="raw", **PRE), "gdn_cuda.chunk: gating: raw not supported"),
    ("gdn_cuda.chunk", (9, 0), Case(D=128, **DECODE), "gdn_cuda.chunk: no decode op"),
    ("gdn_cuda.recurrent", (9, 0), Case(HV=4, D=128, **DECODE), None),
    ("gdn_cuda.recurrent", (9, 0), Case(T=3, D=128, qk_l2norm="kernel", **DECODE), None),
    ("gdn_cuda.recurrent", (9, 0), Case(op="decode", B=4, H=2, D=128),
     "gdn_cuda.recurrent: fp32 state pool not supported"),
    ("gdn_cuda.recurrent", (9, 0), Case(T=2, per_token_slots=True, D=128, **DECODE),
     "gdn_cuda.recurrent: no per-token state slots"),
    ("gdn_cuda.recurrent", (9, 0), Case(dtype="fp16", D=128, **DECODE),
     "gdn_cuda.recurrent: dtype fp16 not supported (bf16)"),
    ("gdn_cuda.recurrent", (12, 0), Case(D=128, **DECODE), "gdn_cuda.recurrent: SM90 only, this GPU is SM120"),
    ("gdn_cuda.recurrent", (9, 0), Case(K=64, V=128, **DECODE), "gdn_cuda.recurrent: needs K == V"),
    ("gdn_cuda.recurrent", (9, 0), Case(D=128, **PRE), "gdn_cuda.recurrent: no prefill op"),
]


@pytest.mark.parametrize("name,cc,case,reason", ENVELOPE)
def test_envelope(fake_lib, monkeypatch, name, cc, case, reason):
    gpu(monkeypatch, cc)
    got = NAMES[name].unsupported(case, CUDA)
    assert (got is None) if reason is None else (got or "").startswith(reason), got


def test_on_a_cpu_they_run_nowhere():
    for b in NAMES.values():
        assert b.unusable_on(torch.device("cpu")) == f"{b.name}: runs on cuda, not cpu"


SUPPORTED = Case(D=128, **PRE)


@pytest.mark.parametrize("b", NAMES.values(), ids=lambda b: b.name)
def test_without_a_library_root_the_reason_says_what_to_set(clean_env, monkeypatch, tmp_path, b):
    gpu(monkeypatch, (9, 0))
    monkeypatch.setitem(sys.modules, "gdn_cuda", _stand_in())  # a wheel's module: no __file__ beside headers
    monkeypatch.setenv("CUDA_HOME_PATH", str(_toolkit(tmp_path / "cuda")))
    case = SUPPORTED if "prefill" in b.ops else Case(D=128, **DECODE)
    got = b.unsupported(case, CUDA)
    assert got == (f"{b.name}: no gdn_cuda library root: set GDN_CUDA_ROOT to <h100_gdn_cuda checkout>/gdn_cuda, "
                   "the folder whose include/ holds gdn_cuda/, cutlass/ and cute/ (./develop.sh links CUTLASS there)")


def test_a_root_without_cutlass_says_which_headers_are_missing(fake_lib, monkeypatch, tmp_path):
    gpu(monkeypatch, (9, 0))
    bare = _jit_root(tmp_path / "bare" / "gdn_cuda", headers=("gdn_cuda",))
    monkeypatch.setenv("GDN_CUDA_ROOT", str(bare))
    got = gdn_cuda_chunk.unsupported(SUPPORTED, CUDA)
    assert got.startswith(f"gdn_cuda.chunk: GDN_CUDA_ROOT={bare}, but {bare / 'include'} has no cutlass, cute ")


def test_library_root_from_the_librarys_variable_or_beside_a_developed_module(clean_env, monkeypatch, tmp_path):
    theirs = _jit_root(tmp_path / "theirs" / "gdn_cuda")
    monkeypatch.setenv("LIBRARY_ROOT_PATH", str(theirs))
    assert gdn_cuda_common.library_root() == theirs
    monkeypatch.setenv("GDN_CUDA_ROOT", str(_jit_root(tmp_path / "ours" / "gdn_cuda")))
    assert gdn_cuda_common.library_root() == tmp_path / "ours" / "gdn_cuda"  # ours first

    monkeypatch.delenv("GDN_CUDA_ROOT")
    monkeypatch.delenv("LIBRARY_ROOT_PATH")
    checkout = tmp_path / "checkout"
    _jit_root(checkout / "gdn_cuda")
    module = _stand_in()
    module.__file__ = str(checkout / "gdn_cuda.cpython-311-x86_64-linux-gnu.so")  # ./develop.sh's link
    monkeypatch.setitem(sys.modules, "gdn_cuda", module)
    assert gdn_cuda_common.library_root() == checkout / "gdn_cuda"


def test_cuda_home_needs_nvcc(clean_env, monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_HOME", str(_toolkit(tmp_path / "toolkit")))
    assert gdn_cuda_common.cuda_home() == tmp_path / "toolkit"
    monkeypatch.setenv("CUDA_HOME_PATH", str(tmp_path / "empty"))  # the library's own variable comes first
    with pytest.raises(LookupError, match=r"no nvcc at .*empty/bin/nvcc, which gdn_cuda's JIT runs"):
        gdn_cuda_common.cuda_home()


@pytest.mark.parametrize("value,jit", [(None, "nvcc JIT"), ("0", "nvcc JIT"), ("1", "NVRTC JIT"),
                                       (" 2x", "NVRTC JIT"), ("yes", "nvcc JIT")])
def test_jit_note_reads_the_variable_as_the_library_does(clean_env, monkeypatch, value, jit):
    if value is not None:
        monkeypatch.setenv("JIT_USE_NVRTC", value)
    assert gdn_cuda_common.jit_note() == jit


def test_a_preloaded_library_is_named_on_the_row(clean_env, monkeypatch):
    assert gdn_cuda_common.preload_note() == ""
    monkeypatch.setenv("LD_PRELOAD", "/lib/x86_64-linux-gnu/libstdc++.so.6")
    assert gdn_cuda_common.preload_note() == ", LD_PRELOAD=/lib/x86_64-linux-gnu/libstdc++.so.6"


# --------------------------------------------------------------------------------------------------
# Conversions
# --------------------------------------------------------------------------------------------------


def test_chunk_tables_pair_every_chunk_with_its_sequence():
    cu = torch.tensor([0, 15, 100, 100, 230])  # lengths 15, 85, 0, 130: 1, 2, 0 and 3 chunks of 64
    indices, cu_chunks, total = convert.chunk_tables(cu, 64)
    assert indices.dtype == cu_chunks.dtype == torch.int32 and total == 6
    assert indices.tolist() == [0, 0, 1, 0, 1, 1, 3, 0, 3, 1, 3, 2]
    assert cu_chunks.tolist() == [0, 1, 3, 3, 6]


def test_gathered_pool_can_keep_states_v_first():
    p = make_problem(Case(op="decode", B=2, H=1, HV=2, K=4, V=4, pool_size=5, slots="scattered",
                          state_dtype="bf16"), 0)
    pool = convert.GatheredPool(p, v_first=True)
    assert pool.pool.dtype == BF16 and pool.pool.is_contiguous()
    gathered = pool.gather()
    assert torch.equal(gathered, p.state_pool[p.slot_idx.long()].transpose(-1, -2))
    pool.scatter(gathered + 1)
    after = pool.canonical()
    assert torch.equal(after[p.slot_idx.long()], (gathered + 1).transpose(-1, -2))
    pool.reset()
    assert torch.equal(pool.canonical(), p.state_pool)


# --------------------------------------------------------------------------------------------------
# End to end against the stand-in
# --------------------------------------------------------------------------------------------------

PREFILL = [
    Case(B=2, T=70, H=1, HV=2, D=64, initial_state="random"),  # GVA, a partial last chunk
    Case(mode="varlen", seq_lens=(5, 70, 130), H=2, D=64, initial_state="random"),
    Case(B=1, T=33, H=2, D=60),  # zero-padded by the library; its default scale would be 1/8
    Case(B=1, T=20, H=1, D=64, output_final_state=False),
]


@pytest.mark.parametrize("case", PREFILL, ids=lambda c: c.id)
def test_chunk_matches_the_reference(fake_lib, case):
    p, prepared, out, verdict = run_adapter(gdn_cuda_chunk, case)
    assert verdict.status == Status.PASS, verdict.message
    assert out.o.shape == p.v.shape
    if case.output_final_state:
        assert out.final_state.dtype == torch.float32 and out.final_state.shape == (case.N, case.HV, case.K, case.V)
    else:
        assert out.final_state is None
    init, = library_calls("init")
    assert init == dict(library_root=str(Path(gdn_cuda_common.library_root())),
                        cuda_home=str(gdn_cuda_common.cuda_home()))
    kw, = library_calls("chunked_forward")
    assert kw["scale"] == p.scale
    assert ("varlen: int32 cu_seqlens" in prepared.path) == (case.mode == "varlen")
    assert ("zero-padded to 64" in prepared.path) == (case.K == 60)
    assert prepared.path.startswith("gdn_cuda chunked_forward (SM90 CUTLASS, nvcc JIT)")


def test_chunk_states_round_trip_exactly_and_nothing_is_converted_in_the_call(fake_lib):
    case = PREFILL[1]
    p, prepared, out, _ = run_adapter(gdn_cuda_chunk, case)
    kw, = library_calls("chunked_forward")
    assert torch.equal(kw["initial_state"], p.initial_state.transpose(-1, -2).to(BF16))
    assert torch.equal(kw["cu_seqlens"], p.cu_seqlens.to(torch.int32))
    assert kw["chunk_indices"].tolist() == [0, 0, 1, 0, 1, 1, 2, 0, 2, 1, 2, 2]
    assert kw["cu_chunks"].tolist() == [0, 1, 3, 6] and kw["total_chunks"] == 6
    final = _chunked_forward(**kw)[1]  # what the library returned: V-first bf16
    assert torch.equal(out.final_state, final.transpose(-1, -2).float())
    prepared.call()
    same_tensors_each_call(library_calls("chunked_forward"))


def test_a_missing_state_transpose_fails_the_gate(fake_lib, monkeypatch):
    """The stand-in is not lenient: K-first states handed over as they are give a FAIL."""
    monkeypatch.setattr(convert, "swap_kv", lambda state: state.contiguous())
    *_, verdict = run_adapter(gdn_cuda_chunk, PREFILL[0])
    assert verdict.status == Status.FAIL


DECODES = [
    Case(op="decode", B=3, H=1, HV=2, D=64, pool_size=7, slots="scattered", state_dtype="bf16"),
    Case(op="decode", B=2, T=3, H=2, D=64, qk_l2norm="kernel", state_dtype="bf16"),
    Case(op="decode", B=2, H=1, D=60, state_dtype="bf16"),
]


@pytest.mark.parametrize("case", DECODES, ids=lambda c: c.id)
def test_recurrent_decodes_on_the_pool_and_resets(fake_lib, case):
    p, prepared, out, verdict = run_adapter(gdn_cuda_recurrent, case)
    assert verdict.status == Status.PASS, verdict.message  # includes: slots outside slot_idx untouched
    kw, = library_calls("recurrent_forward")
    assert kw["is_qk_norm"] == (case.qk_l2norm == "kernel") and kw["scale"] == p.scale
    assert torch.equal(kw["gate"], p.g.to(BF16))
    assert torch.equal(kw["initial_state"], p.state_pool[p.slot_idx.long()].transpose(-1, -2))
    check_reset_restores_the_pool(p, prepared, out)
    same_tensors_each_call(library_calls("recurrent_forward"), made_in_call=("initial_state",))
    assert "inference_mode=Decode" in prepared.path and "V-first bf16 pool" in prepared.path
    assert ("zero-padded to 64" in prepared.path) == (case.K == 60)

"""The jla.chunk adapter (jax-linear-attention's Mosaic GPU Gated DeltaNet), on a CPU without JAX.

JAX cannot run here, so the tests cover (1) registration, (2) the SKIP rows and envelope reasons, (3) the
layout the adapter hands the op (segment_ids for packed sequences, one initial state per row), and (4) the
adapter end to end against stand-ins for ``jax`` and ``jla.ops``: torch tensors play JAX's arrays, and the
stand-in op has ``jla.ops.linear_attention``'s signature, refuses what the Mosaic GPU kernels refuse, and
computes what jax-linear-attention 0.1.0 documents for packed documents (jla/ops/reference.py: the state
restarts from zero wherever segment_ids changes, the initial state enters a row's first document, the final
state is the one after the row's last token) with the reference recurrence. A wrong keyword, layout or
gating, or a varlen case admitted where that semantics differs from gdnbench's, makes these fail.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import sys
from types import ModuleType

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
import yaml
from typer.testing import CliRunner

from gdnbench.backends import GROUP, base, get_backend, registry
from gdnbench.backends.jla_chunk import (
    IMPL,
    KIND,
    case_reason,
    jax_version_reason,
    jla_chunk,
    op_inputs,
    pipeline,
    row_initial_state,
    segment_ids,
)
from gdnbench.check import Gate, reference_outputs
from gdnbench.cli import app
from gdnbench.problem import Problem, make_problem
from gdnbench.reference import gdn_recurrent
from gdnbench.results import Status
from gdnbench.suite import Case, ReferenceSettings, Tolerances

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def problem(**fields):
    return make_problem(Case(**fields), 0, "cpu")


@pytest.fixture(autouse=True)
def fresh_import_errors():
    """unavailable() caches import results: stand-in modules of one test must not leak into another."""
    base._import_error.cache_clear()
    yield
    base._import_error.cache_clear()


# ------------------------------------------------------------------------------------------------
# Registration
# ------------------------------------------------------------------------------------------------


def test_registered_as_an_entry_point():
    (entry,) = [e for e in importlib.metadata.entry_points(group=GROUP) if e.name == "jla.chunk"]
    assert entry.value == "gdnbench.backends.jla_chunk:jla_chunk"  # pyproject.toml, as installed
    assert registry()["jla.chunk"] is jla_chunk is get_backend(entry.value) and jla_chunk.name == "jla.chunk"
    assert jla_chunk.package == "jax-linear-attention" and jla_chunk.requires == ("jax", "jla.ops")


# ------------------------------------------------------------------------------------------------
# Stand-ins for jax and jla.ops
# ------------------------------------------------------------------------------------------------


def kernel_refusal(q, k, v, gates, options) -> str | None:
    """What the Mosaic GPU registration refuses (jla/ops/mosaic_gpu/scalar_gate.py unsupported_reason and
    scalar_gate_kb.py), for the options the adapter can pass."""
    allowed = {"scale", "initial_state", "output_final_state", "segment_ids", "use_qk_l2norm"}
    if set(options) - allowed:
        return f"unsupported options {sorted(set(options) - allowed)}"
    B, T, Hk, K = q.shape
    H, V = v.shape[2:]
    if k.shape != q.shape or v.shape[:2] != (B, T) or H % Hk:
        return f"expected q, k [B, T, Hk, K] and v [B, T, H, V]; got {q.shape}, {k.shape}, {v.shape}"
    if not ((K in (64, 128) and V in (64, 128)) or (K, V) in {(256, 128), (256, 256), (256, 512), (128, 256)}):
        return f"head dims {(K, V)}"
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"q, k, v dtypes {q.dtype}, {k.dtype}, {v.dtype}"
    if any(gate.shape != (B, T, H) for gate in gates):
        return "gates must be [B, T, H]"
    state, segments = options.get("initial_state"), options.get("segment_ids")
    if state is not None and state.shape != (B, H, K, V):
        return f"initial_state must be [B, H, K, V]; got {state.shape}"
    if segments is not None and (segments.shape != (B, T) or segments.is_floating_point()):
        return f"segment_ids must be integer [B, T]; got {segments.dtype}{tuple(segments.shape)}"
    return None


def documents_of(row: torch.Tensor) -> list[tuple[int, int]]:
    """[start, end) of each run of equal ids along a row of segment_ids."""
    starts = [0, *(torch.nonzero(row[1:] != row[:-1]).flatten() + 1).tolist()]
    return list(zip(starts, [*starts[1:], row.numel()]))


def packed_op(q, k, v, g, beta, *, scale, initial_state, output_final_state, segment_ids, use_qk_l2norm):
    """jla's gated_deltanet as 0.1.0 documents it, row by row and document by document."""
    B, T = q.shape[:2]
    o, finals = torch.empty_like(v), []
    for b in range(B):
        docs = [(0, T)] if segment_ids is None else documents_of(segment_ids[b])
        S = None if initial_state is None else initial_state[b:b + 1]
        for i, (s, e) in enumerate(docs):
            out, S = gdn_recurrent(q[b:b + 1, s:e], k[b:b + 1, s:e], v[b:b + 1, s:e], g[b:b + 1, s:e],
                                   beta[b:b + 1, s:e], scale=scale, initial_state=S if i == 0 else None,
                                   qk_l2norm=use_qk_l2norm)
            o[b:b + 1, s:e] = out.to(v.dtype)
        finals.append(S)
    return o, (torch.cat(finals) if output_final_state else None)


class FakeJax:
    """``jax``, ``jax.numpy``, ``jax.nn``, ``jla.ops`` and its split heuristic as stand-in modules; records
    what the adapter does with them, in order (``log``)."""

    def __init__(self, monkeypatch, *, version="0.11.2", impls=("mosaic_gpu", "chunked", "reference"),
                 pieces=1, gpu=True):
        self.log: list[str] = []
        self.converted: set[int] = set()
        self.capturing, self.impls, self.gpu = False, impls, gpu
        jnp = dict(from_dlpack=self.from_dlpack, asarray=lambda x, dtype: x.to(dtype), exp=torch.exp,
                   float32=torch.float32)
        modules = {
            "jax": dict(__version__=version, jit=self.jit, block_until_ready=self.block, devices=self.devices),
            "jax.numpy": jnp,
            "jax.nn": dict(softplus=F.softplus, sigmoid=torch.sigmoid),
            "jla": {},
            "jla.ops": dict(linear_attention=self.linear_attention, available=self.available),
            "jla.ops.mosaic_gpu": {},
            "jla.ops.mosaic_gpu.scalar_gate": dict(pieces=lambda B, H, V, T, *, delta: pieces),
        }
        for name, attrs in modules.items():
            module = ModuleType(name)
            module.__dict__.update(attrs)
            monkeypatch.setitem(sys.modules, name, module)
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(sys.modules[parent], child, module)
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: self.capturing)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: self)

    def devices(self, platform=None):
        if not self.gpu:
            raise RuntimeError("Unknown backend: 'gpu' requested, but no platforms that are instances of gpu")
        return ["gpu:0"]

    def available(self, kind):
        if isinstance(self.impls, Exception):
            raise self.impls
        return self.impls

    def synchronize(self) -> None:  # torch's current stream
        self.log.append("torch stream synchronised")

    def from_dlpack(self, t: torch.Tensor) -> torch.Tensor:
        x = torch.from_dlpack(t)  # shares t's memory, as JAX's import does
        self.converted.add(id(x))
        return x

    def jit(self, fn):
        self.log.append("jit")

        def jitted(*args):
            self.log.append("jitted call")
            return fn(*args)
        return jitted

    def block(self, x):
        self.log.append("blocked")
        return x

    def linear_attention(self, kind, q, k, v, *, impl="auto", g=None, beta=None, **options):
        assert kind == KIND and impl == IMPL, (kind, impl)
        for x in (q, k, v, options.get("initial_state"), options.get("segment_ids")):
            assert x is None or id(x) in self.converted, "handed to the op without crossing DLPack"
        reason = kernel_refusal(q, k, v, (g, beta), options)
        if reason:
            raise ValueError(f"mosaic_gpu gated_delta_rule: {reason}")
        self.log.append("op")
        return packed_op(q, k, v, g, beta, **options)


# ------------------------------------------------------------------------------------------------
# SKIP rows and the envelope
# ------------------------------------------------------------------------------------------------


@pytest.mark.skipif(importlib.util.find_spec("jax") is not None, reason="needs jax absent")
def test_without_jax_every_case_is_a_skip_row_naming_it(tmp_path):
    cases = [{"B": 1, "T": 8, "H": 1, "D": 64}, {"mode": "varlen", "seq_lens": [3, 5], "H": 1, "D": 128}]
    suite = {"name": "t", "backends": ["torch.recurrent", "jla.chunk"], "defaults": {"dtype": "bf16"},
             "cases": cases, "timing": {"min_samples": 2, "min_time_s": 0.0, "max_time_s": 0.1, "warmup": 1}}
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    res = CliRunner().invoke(app, ["run", str(path), "--device", "cpu", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    rows = pd.read_csv(tmp_path / "out" / "results.csv").query("backend == 'jla.chunk'")
    assert len(rows) == 2 and set(rows.status) == {Status.SKIP}
    expect = "jla.chunk: cannot import jax (ModuleNotFoundError: No module named 'jax')"
    assert (rows.error == expect).all(), rows.error.tolist()


def test_jax_without_jla_is_unavailable_naming_jla(monkeypatch):
    FakeJax(monkeypatch)
    monkeypatch.setitem(sys.modules, "jla.ops", None)  # None: the import fails as if jla were not installed
    reason = jla_chunk.unavailable()
    assert reason is not None and reason.startswith("jla.chunk: cannot import jla.ops (")


@pytest.mark.parametrize("fields, device, cc, reason", [
    (dict(D=128), CPU, None, "jla.chunk: runs on cuda, not cpu"),
    (dict(D=128, dtype="fp32"), CUDA, (9, 0), "jla.chunk: dtype fp32 not supported (bf16, fp16)"),
    (dict(D=128, op="decode", T=None), CUDA, (9, 0), "jla.chunk: no decode op (serves prefill)"),
    (dict(D=128), CUDA, (8, 0), "jla.chunk: SM90 only, this GPU is SM80"),
    (dict(D=128), CUDA, (10, 0), "jla.chunk: SM90 only, this GPU is SM100"),
    (dict(D=32), CUDA, (9, 0), "jla.chunk: head dims [64, 128, 256, 512] only, case has K=32, V=32"),
    (dict(K=256, V=64), CUDA, (9, 0), "jla.chunk: (K, V) must be in {64, 128} each or one of (128, 256), "
                                      "(256, 128), (256, 256), (256, 512); case has K=256, V=64"),
    (dict(K=64, V=256), CUDA, (9, 0), "jla.chunk: (K, V) must be in {64, 128} each"),
    (dict(D=512), CUDA, (9, 0), "jla.chunk: (K, V) must be in {64, 128} each"),
    (dict(mode="varlen", seq_lens=(3, 5, 2), B=None, T=None, D=64, initial_state="random"), CUDA, (9, 0),
     "jla.chunk: with segment_ids every document after a row's first starts from zeros; "
     "case has 3 random initial states"),
    (dict(mode="varlen", seq_lens=(3, 5), B=None, T=None, D=64), CUDA, (9, 0),
     "jla.chunk: with segment_ids the op returns the state after a row's last token only; case asks for 2 "
     "final states (output_final_state: false runs it)"),
])
def test_envelope_refuses_what_the_op_cannot_compute(monkeypatch, fields, device, cc, reason):
    if cc is not None:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cc)
    got = jla_chunk.unsupported(Case(**{"B": 1, "T": 8, "H": 1, **fields}), device)
    assert got is not None and got.startswith(reason), got


@pytest.mark.parametrize("fields", [
    dict(B=2, T=8, H=2, HV=6, D=128, dtype="fp16", qk_l2norm="kernel", gating="raw", scale=0.3),
    dict(B=1, T=8, H=1, K=64, V=128, initial_state="random"),
    dict(B=1, T=8, H=1, K=128, V=256),
    dict(B=1, T=8, H=1, K=256, V=512),
    dict(mode="varlen", seq_lens=(9,), H=1, D=64, initial_state="random"),
    dict(mode="varlen", seq_lens=(3, 5, 2), H=1, D=64, initial_state="zeros", output_final_state=False),
    dict(mode="varlen", seq_lens=(3, 5, 2), H=1, D=64, output_final_state=False),
])
def test_envelope_serves_what_the_op_computes(monkeypatch, fields):
    FakeJax(monkeypatch)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert jla_chunk.unsupported(Case(**fields), CUDA) is None


@pytest.mark.parametrize("fake, reason", [
    (dict(version="0.10.0"),
     "jla.chunk: jax-linear-attention 0.1.0 needs jax 0.11.x (it pins 0.11.2), found jax 0.10.0"),
    (dict(impls=("chunked", "reference")),
     "jla.chunk: jla registers no mosaic_gpu gated_deltanet kernel with this jax "
     "(jax.experimental.pallas.mosaic_gpu does not import); it has chunked, reference"),
    (dict(gpu=False), "jla.chunk: jax has no GPU backend (Unknown backend: 'gpu' requested"),
    (dict(impls=ImportError("cannot import name 'Layout'")),
     "jla.chunk: jla's Mosaic GPU kernels fail to import (ImportError: cannot import name 'Layout')"),
])
def test_environment_without_the_kernels_is_a_skip_saying_why(monkeypatch, fake, reason):
    FakeJax(monkeypatch, **fake)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    got = jla_chunk.unsupported(Case(B=1, T=8, H=1, D=128), CUDA)
    assert got is not None and got.startswith(reason), got


def test_jax_version_series():
    assert jax_version_reason("0.11.2") is None and jax_version_reason("0.11.3") is None
    assert jax_version_reason("0.1.10") is not None and jax_version_reason("0.12.0") is not None


def test_jax_gpu_memory_is_not_preallocated_unless_asked(monkeypatch):
    FakeJax(monkeypatch)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    jla_chunk.unsupported(Case(B=1, T=8, H=1, D=128), CUDA)
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "true")
    jla_chunk.unsupported(Case(B=1, T=8, H=1, D=128), CUDA)
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"


# ------------------------------------------------------------------------------------------------
# The op's layout
# ------------------------------------------------------------------------------------------------


def test_segment_ids_number_the_sequences_and_change_exactly_at_their_boundaries():
    p = problem(mode="varlen", seq_lens=(3, 1, 4), H=1, D=64)
    ids = segment_ids(p)
    assert ids.dtype == torch.int32 and ids.shape == (1, 8)
    assert ids.tolist() == [[0, 0, 0, 1, 2, 2, 2, 2]]
    changes = (torch.nonzero(ids[0, 1:] != ids[0, :-1]).flatten() + 1).tolist()
    assert changes == p.cu_seqlens[1:-1].tolist()
    assert segment_ids(problem(B=2, T=5, H=1, D=64)) is None


def test_each_row_gets_one_initial_state():
    padded = problem(B=3, T=4, H=1, HV=2, D=64, initial_state="random")
    assert row_initial_state(padded) is padded.initial_state
    varlen = problem(mode="varlen", seq_lens=(9,), H=1, HV=2, K=64, V=128, initial_state="random")
    assert row_initial_state(varlen).shape == (1, 2, 64, 128) and torch.equal(row_initial_state(varlen),
                                                                              varlen.initial_state)
    zeros = problem(mode="varlen", seq_lens=(2, 3), H=1, D=64, initial_state="zeros", output_final_state=False)
    assert row_initial_state(zeros).shape == (1, 1, 64, 64) and not row_initial_state(zeros).any()
    assert row_initial_state(problem(B=1, T=4, H=1, D=64)) is None


@pytest.mark.parametrize("gating", ["pre", "raw"])
def test_op_inputs_are_the_canonical_tensors_unchanged(gating):
    """Padded cases need no conversion but DLPack: q, k, v, gates and state go over bit for bit."""
    p = problem(B=2, T=5, H=1, HV=2, K=64, V=128, dtype="fp16", gating=gating, initial_state="random")
    x = op_inputs(p)
    expect = (p.g, p.beta) if gating == "pre" else (p.a, p.b, p.A_log, p.dt_bias)
    pairs = [(x["q"], p.q), (x["k"], p.k), (x["v"], p.v), (x["initial_state"], p.initial_state),
             *zip(x["gates"], expect)]
    assert len(x["gates"]) == len(expect) and x["segment_ids"] is None
    for mine, canonical in pairs:
        assert mine.is_contiguous() and mine.dtype == canonical.dtype and torch.equal(mine, canonical)


def test_pipelines_by_head_dims():
    assert pipeline(64, 128) == pipeline(128, 128) == "scalar-gate kernels"
    assert pipeline(128, 256).startswith("K-blocked") and pipeline(256, 512).startswith("K-blocked")
    assert pipeline(256, 64) is None and pipeline(64, 256) is None and pipeline(32, 32) is None


def test_case_reason_admits_one_sequence_with_any_state():
    assert case_reason(Case(mode="varlen", seq_lens=(7,), H=1, D=64, initial_state="random")) is None


# ------------------------------------------------------------------------------------------------
# End to end against the stand-ins
# ------------------------------------------------------------------------------------------------


def run_twice(p: Problem):
    """Prepare, call twice, check the first call against the reference; the second must repeat it."""
    prepared = jla_chunk.prepare(p)
    outs = []
    for _ in range(2):
        prepared.call()
        outs.append(prepared.outputs())
    first, again = outs
    assert torch.equal(first.o, again.o) and first.state_pool is None
    assert (first.final_state is None) == (again.final_state is None)
    assert first.final_state is None or torch.equal(first.final_state, again.final_state)
    verdict = Gate(p, reference_outputs(p, ReferenceSettings()), Tolerances()).check(first)
    assert verdict.status == Status.PASS, verdict.message
    return prepared, first


E2E = [
    dict(B=2, T=9, H=1, HV=2, D=64, dtype="bf16"),
    dict(B=2, T=7, H=2, HV=4, K=64, V=128, dtype="fp16", initial_state="random", qk_l2norm="kernel", scale=0.3),
    dict(B=1, T=6, H=1, K=128, V=256, dtype="bf16", gating="raw", output_final_state=False),
    dict(mode="varlen", seq_lens=(11,), H=1, HV=2, D=64, dtype="bf16", initial_state="random"),
    dict(mode="varlen", seq_lens=(3, 11, 1), H=1, HV=2, D=64, dtype="bf16", initial_state="zeros",
         output_final_state=False, gating="raw"),
]


@pytest.mark.parametrize("fields", E2E, ids=lambda f: Case(**f).id)
def test_end_to_end_against_the_documented_op(monkeypatch, fields):
    jax = FakeJax(monkeypatch, pieces=4)
    p = problem(**fields)
    prepared, out = run_twice(p)
    # jitted once in prepare; each call: torch's stream first, the op, then a block on JAX's results
    assert jax.log == ["jit"] + 2 * ["torch stream synchronised", "jitted call", "op", "blocked"]
    assert out.o.shape == p.v.shape and out.o.dtype == p.v.dtype
    assert (out.final_state is None) == (not p.case.output_final_state)
    assert prepared.path.startswith("jla.ops.linear_attention(impl='mosaic_gpu') under jax.jit: ")
    large = (p.case.K, p.case.V) == (128, 256)
    assert ("K-blocked" in prepared.path) == large and ("split in 4 pieces" in prepared.path) == (not large)
    assert ("segment_ids" in prepared.path) == (p.case.mode == "varlen")
    assert ("gating in XLA inside the jit (timed)" in prepared.path) == (p.case.gating == "raw")
    assert ("q/k l2norm in the op" in prepared.path) == (p.case.qk_l2norm == "kernel")
    assert prepared.path.endswith("host-synchronised around JAX's stream, not graph-capturable")


def test_a_torch_graph_capture_is_refused_before_any_jax_work(monkeypatch):
    jax = FakeJax(monkeypatch)
    prepared = jla_chunk.prepare(problem(B=1, T=4, H=1, D=64))
    jax.capturing = True
    with pytest.raises(RuntimeError, match=re.escape("jla.chunk runs on JAX's own CUDA stream")):
        prepared.call()
    assert jax.log == ["jit"]


def test_the_stand_in_refuses_what_the_kernels_refuse(monkeypatch):
    """The end-to-end tests mean something only if the stand-in op is as strict as the kernels."""
    FakeJax(monkeypatch)
    prepared = jla_chunk.prepare(problem(B=1, T=4, H=1, D=64, dtype="fp32"))
    with pytest.raises(ValueError, match="mosaic_gpu gated_delta_rule: q, k, v dtypes"):
        prepared.call()


def test_packed_rows_return_one_final_state_which_is_why_the_envelope_asks_for_none(monkeypatch):
    FakeJax(monkeypatch)
    p = problem(mode="varlen", seq_lens=(3, 5), H=1, D=64, dtype="bf16")
    assert case_reason(p.case) is not None
    prepared = jla_chunk.prepare(p)
    prepared.call()
    assert p.case.N == 2 and prepared.outputs().final_state.shape == (1, 1, 64, 64)

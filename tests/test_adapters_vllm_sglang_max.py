"""Adapters for vLLM's vendored FLA ops, SGLang's GDN ops and Modular MAX, on CPU without the libraries.

None of the three libraries runs here, so the tests cover (1) the conversions each adapter makes
(V-first pools with vLLM's reserved slot 0, SGLang's prefill pool, MAX's channel packing and uint32
offsets), (2) SKIP and envelope reasons, and (3) the adapters end to end against stand-in modules
that have the libraries' import paths and signatures (as read in vLLM 0.33.0 and SGLang 0.5.23) and
their documented pool semantics, computed with the reference recurrence. A wrong keyword, layout,
slot shift or index shape in an adapter makes these fail.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from typer.testing import CliRunner

from gdnbench.backends import registry
from gdnbench.backends.convert import StatePool, initial_states, swap_kv
from gdnbench.backends.max_recurrence import pack_qkv, row_offsets, slot_indices, unpack_output
from gdnbench.backends.serving_common import (
    VLLM_OPS,
    require_v_first,
    token_gate,
    vllm_state_indices,
    zero_padding_rows,
)
from gdnbench.check import Gate, reference_outputs
from gdnbench.cli import app
from gdnbench.problem import make_problem
from gdnbench.reference import gate_from_raw, gdn_recurrent
from gdnbench.results import Status
from gdnbench.suite import Case, ReferenceSettings, Tolerances

CUDA = torch.device("cuda")  # unsupported() only compares the type when a backend names no archs


def problem(**fields):
    return make_problem(Case(**fields), 0, "cpu")


# ------------------------------------------------------------------------------------------------
# Conversions
# ------------------------------------------------------------------------------------------------


def test_vllm_pool_has_a_reserved_front_slot_and_round_trips():
    states = torch.randn(4, 2, 3, 5)  # [S, HV, K, V], K != V so a missing transpose shows
    pool = StatePool(states, v_first=True, null_slots=1)
    assert pool.pool.shape == (5, 2, 5, 3) and pool.pool.is_contiguous()
    assert torch.equal(pool.pool[0], torch.zeros(2, 5, 3))
    for s in range(4):
        assert torch.equal(pool.pool[s + 1], states[s].transpose(-1, -2))
    assert torch.equal(pool.canonical(), states)

    ptr = pool.pool.data_ptr()
    pool.pool[3] += 1.0  # what a kernel writing canonical slot 2 does
    assert torch.equal(pool.canonical()[2], states[2] + 1.0) and torch.equal(pool.canonical()[1], states[1])
    pool.reset()
    assert pool.pool.data_ptr() == ptr and torch.equal(pool.canonical(), states)


@pytest.mark.parametrize("null_slots", [0, 1])
def test_pool_with_slots_resets_those_slots_and_the_null_ones(null_slots):
    """A decode pool given its slots restores, in place, exactly the slots a call uses (padding -1 skipped) and
    the null slots; a write elsewhere is the harness's to catch, not reset's to hide."""
    states = torch.randn(6, 2, 3, 5)
    slots = torch.tensor([4, -1, 1, 4], dtype=torch.int32)
    pool = StatePool(states, v_first=True, null_slots=null_slots, slots=slots)
    ptr = pool.pool.data_ptr()
    pool.pool.add_(1.0)  # every slot written, the null ones included
    pool.reset()
    assert pool.pool.data_ptr() == ptr
    got = pool.canonical()
    for s in (1, 4):
        assert torch.equal(got[s], states[s])
    for s in (0, 2, 3, 5):
        assert torch.equal(got[s], states[s] + 1.0)
    assert torch.equal(pool.pool[:null_slots], torch.zeros(null_slots, 2, 5, 3))


def test_pool_keeps_the_state_dtype_and_converts_back():
    states = torch.randn(3, 1, 4, 4).to(torch.bfloat16)
    pool = StatePool(states, v_first=True)
    assert pool.pool.dtype == torch.bfloat16 and pool.canonical().dtype == torch.bfloat16
    wide = StatePool(states, v_first=False, dtype=torch.float32)
    assert wide.pool.dtype == torch.float32 and wide.canonical().dtype == torch.bfloat16
    assert torch.equal(wide.pool, states.float())


def test_vllm_state_indices_shift_slots_and_null_padding():
    slots = torch.tensor([4, -1, 0, 2], dtype=torch.int32)
    one = vllm_state_indices(slots, 1)
    assert one.dtype == torch.int32 and one.tolist() == [5, 0, 1, 3]
    many = vllm_state_indices(slots, 3)
    assert many.shape == (4, 3) and many.is_contiguous() and many.stride() == (3, 1)
    assert many.tolist() == [[5] * 3, [0] * 3, [1] * 3, [3] * 3]


def test_sglang_prefill_pool_holds_n_slots_of_initial_state():
    p = problem(mode="varlen", seq_lens=(3, 5, 2), H=1, HV=2, K=4, V=6, dtype="bf16", initial_state="random")
    pool = StatePool(initial_states(p), v_first=True, dtype=torch.float32)
    assert pool.pool.shape == (3, 2, 6, 4) and pool.pool.dtype == torch.float32
    assert torch.equal(swap_kv(pool.pool), p.initial_state)

    none = problem(B=2, T=4, H=1, D=4, dtype="bf16")
    zeros = initial_states(none)
    assert zeros.shape == (2, 1, 4, 4) and zeros.dtype == torch.float32 and not zeros.any()


def test_padding_rows_are_zeroed():
    o = torch.randn(3, 2, 1, 4)
    o[1] = float("nan")  # vLLM leaves a skipped sequence's output unwritten
    out = zero_padding_rows(o, torch.tensor([2, -1, 0]))
    assert torch.equal(out[[0, 2]], o[[0, 2]]) and torch.equal(out[1], torch.zeros(2, 1, 4))


def test_token_gate_feeds_2d_tokens_and_restores_shape():
    seen = {}

    def engine_gate(A_log, a, b, dt_bias):  # noqa: N803 - the engines' own names
        seen["shape"] = tuple(a.shape)
        g, beta = gate_from_raw(a, b, A_log, dt_bias)
        return g[None], beta[None]  # [1, tokens, HV], as vLLM/SGLang return them

    p = problem(B=2, T=3, H=1, HV=2, D=4, dtype="bf16", gating="raw")
    g, beta = token_gate(engine_gate)(p.a, p.b, p.A_log, p.dt_bias)
    assert seen["shape"] == (6, 2) and g.shape == beta.shape == (2, 3, 2)
    assert torch.allclose(g, p.g) and torch.allclose(beta, p.beta)


def test_max_packs_qkv_by_channel_and_unpacks():
    p = problem(B=2, T=3, H=2, HV=4, K=5, V=7, dtype="bf16")
    qkv = pack_qkv(p.q, p.k, p.v)
    H, HV, K, V = 2, 4, 5, 7
    assert qkv.shape == (6, 2 * H * K + HV * V) and qkv.dtype == torch.float32 and qkv.is_contiguous()
    # token (b, t) is row b*T + t; q head h at [h*K, (h+1)*K), k after all q, v after all k
    assert torch.equal(qkv[4, 1 * K:2 * K], p.q[1, 1, 1].float())
    assert torch.equal(qkv[4, H * K:H * K + K], p.k[1, 1, 0].float())
    assert torch.equal(qkv[5, 2 * H * K + 3 * V:2 * H * K + 4 * V], p.v[1, 2, 3].float())
    q, k, v = qkv.split([H * K, H * K, HV * V], dim=1)
    assert torch.equal(q.reshape(2, 3, H, K), p.q.float()) and torch.equal(k.reshape(2, 3, H, K), p.k.float())
    assert torch.equal(v.reshape(2, 3, HV, V), p.v.float())

    out = torch.arange(6 * HV * V, dtype=torch.float32).reshape(6, HV * V)  # MAX's [T_total, HV*V]
    o = unpack_output(out, p)
    assert o.shape == (2, 3, HV, V) and o.dtype == torch.bfloat16
    assert o[1, 2, 3, 6].item() == out[5, 3 * V + 6].item()


def test_max_offsets_and_slots_are_uint32():
    padded = problem(B=3, T=4, H=1, D=4, dtype="bf16")
    assert row_offsets(padded).dtype == np.uint32 and row_offsets(padded).tolist() == [0, 4, 8, 12]
    assert slot_indices(padded).dtype == np.uint32 and slot_indices(padded).tolist() == [0, 1, 2]
    varlen = problem(mode="varlen", seq_lens=(5, 1, 3), H=1, D=4, dtype="bf16")
    assert row_offsets(varlen).tolist() == [0, 5, 6, 9] and slot_indices(varlen).tolist() == [0, 1, 2]
    decode = problem(op="decode", B=3, T=2, H=1, D=4, pool_size=9, slots="scattered")
    assert row_offsets(decode).tolist() == [0, 2, 4, 6]
    assert slot_indices(decode).dtype == np.uint32 and slot_indices(decode).tolist() == decode.slot_idx.tolist()
    decode.slot_idx = torch.tensor([3, -1, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match="padding"):
        slot_indices(decode)


# ------------------------------------------------------------------------------------------------
# Availability and envelopes
# ------------------------------------------------------------------------------------------------

MISSING = [name for name, module in (("vllm", "vllm"), ("sglang", "sglang"), ("max", "max"))
           if importlib.util.find_spec(module) is None]


@pytest.mark.skipif(len(MISSING) < 3, reason="needs vllm, sglang and max all absent")
def test_absent_libraries_give_skip_rows_naming_the_module(tmp_path):
    cases = [{"B": 1, "T": 8, "H": 1, "D": 8}, {"op": "decode", "B": 2, "H": 1, "D": 8, "pool_size": 3}]
    names = ["vllm.chunk", "vllm.recurrent", "sglang.chunk", "sglang.recurrent", "max.recurrence"]
    suite = {"name": "t", "backends": ["torch.recurrent", *names], "defaults": {"dtype": "bf16"}, "cases": cases,
             "timing": {"min_samples": 2, "min_time_s": 0.0, "max_time_s": 0.1, "warmup": 1}}
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    res = CliRunner().invoke(app, ["run", str(path), "--device", "cpu", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    df = pd.read_csv(tmp_path / "out" / "results.csv")
    rows = df[df.backend.isin(names)]
    assert len(rows) == 2 * len(names) and set(rows.status) == {Status.SKIP}
    expect = {"vllm.chunk": "cannot import vllm", "vllm.recurrent": "cannot import vllm",
              "sglang.chunk": "cannot import sglang.kernels.ops.attention.fla.chunk",
              "sglang.recurrent": "cannot import sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent",
              "max.recurrence": "cannot import max.engine"}
    for name, text in expect.items():
        errors = rows[rows.backend == name].error
        assert errors.str.startswith(f"{name}: {text} (ModuleNotFoundError").all(), errors.tolist()


def install(monkeypatch, modules: dict[str, dict]) -> None:
    """Put stand-in modules (parents first) into sys.modules for this test only."""
    for name in sorted(modules, key=lambda n: n.count(".")):
        parts = name.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent not in modules and parent not in sys.modules:
                monkeypatch.setitem(sys.modules, parent, ModuleType(parent))
        module = ModuleType(name)
        for attr, value in modules[name].items():
            setattr(module, attr, value)
        monkeypatch.setitem(sys.modules, name, module)


def test_vllm_without_its_fla_ops_is_a_skip_naming_both_locations(monkeypatch):
    install(monkeypatch, {"vllm": {}})
    case = Case(B=1, T=8, H=1, D=8)
    reason = registry()["vllm.chunk"].unsupported(case, CUDA)
    assert reason.startswith("vllm.chunk: cannot import ") and all(m in reason for m in VLLM_OPS)
    decode = Case(op="decode", B=1, H=1, D=8)
    assert registry()["vllm.recurrent"].unsupported(decode, CUDA).startswith("vllm.recurrent: cannot import ")


@pytest.mark.parametrize("name, fields, reason", [
    ("vllm.chunk", dict(B=1, T=8, H=1, D=8, dtype="fp32"), "vllm.chunk: dtype fp32 not supported"),
    ("vllm.chunk", dict(B=1, T=8, H=1, D=512), "vllm.chunk: K <= 256 only, case has K=512"),
    ("vllm.chunk", dict(op="decode", B=1, H=1, D=8), "vllm.chunk: no decode op"),
    ("vllm.recurrent", dict(B=1, T=8, H=1, D=8), "vllm.recurrent: no prefill op"),
    ("sglang.chunk", dict(B=1, T=8, H=1, D=8, dtype="fp32"), "sglang.chunk: dtype fp32 not supported"),
    ("sglang.chunk", dict(B=1, T=8, H=1, K=320, V=64), "sglang.chunk: K <= 256 only, case has K=320"),
    ("sglang.recurrent", dict(B=1, T=8, H=1, D=8), "sglang.recurrent: no prefill op"),
    ("max.recurrence", dict(B=1, T=8, H=1, D=64), "max.recurrence: head dims [128] only, case has K=64"),
    ("max.recurrence", dict(B=1, T=8, H=1, K=128, V=64), "max.recurrence: head dims [128] only"),
    ("max.recurrence", dict(B=1, T=8, H=1, D=128, scale=0.1),
     "max.recurrence: q scale is fixed at 1/sqrt(K) = 0.08839, case has scale=0.1"),
])
def test_envelope_reasons(name, fields, reason):
    got = registry()[name].unsupported(Case(**fields), CUDA)
    assert got is not None and got.startswith(reason), got


@pytest.mark.parametrize("name", ["vllm.chunk", "vllm.recurrent", "sglang.chunk", "sglang.recurrent",
                                  "max.recurrence"])
def test_cuda_only(name):
    b = registry()[name]
    op = sorted(b.ops)[0]
    case = Case(op=op, B=1, T=1 if op == "decode" else 8, H=1, D=128)
    assert b.unsupported(case, torch.device("cpu")) == f"{name}: runs on cuda, not cpu"


def test_chunk_limit_is_on_k_only():
    assert registry()["sglang.chunk"].unsupported(Case(B=1, T=8, H=1, K=128, V=512), CUDA) is None


def test_max_serves_its_envelope():
    b = registry()["max.recurrence"]
    for fields in (dict(B=2, T=8, H=2, HV=4, D=128, qk_l2norm="pre"),
                   dict(mode="varlen", seq_lens=(3, 9), H=1, D=128, dtype="fp32", qk_l2norm="kernel", gating="raw"),
                   dict(op="decode", B=4, T=2, H=1, D=128, state_dtype="bf16", scale=128**-0.5)):
        assert b.unsupported(Case(**fields), CUDA) is None


def test_k_first_vendored_copy_is_refused():
    def old(q, k, v, g, beta, initial_state=None):
        """
        Args:
            initial_state (Optional[torch.Tensor]):
                Initial state of shape `[N, HV, K, V]` for `N` input sequences.
        """

    def new(q, k, v, g, beta, initial_state=None):
        """
        Args:
            initial_state (Optional[torch.Tensor]):
                Initial state of shape `[N, HV, V, K]` for `N` input sequences.
        """

    with pytest.raises(RuntimeError, match="K-first"):
        require_v_first(old)
    require_v_first(new)


# ------------------------------------------------------------------------------------------------
# End to end against stand-ins with the libraries' signatures and pool semantics
# ------------------------------------------------------------------------------------------------

V_FIRST_DOC = "Initial state of shape `[N, HV, V, K]` for `N` input sequences."


def step(q, k, v, g, beta, S, scale, l2):
    """One sequence slice [1, t, ...] from K-first fp32 state S -> (o [t, HV, V], new S)."""
    o, S = gdn_recurrent(q, k, v, g, beta, scale=scale, initial_state=S[None], qk_l2norm=l2)
    return o[0], S[0]


def vllm_decode(q, k, v, g, beta, scale, pool, indices, l2):
    """vLLM's inplace_final_state path: read pool[idx[n, 0]], write the state after token t to
    pool[idx[n, t]]; an index <= 0 skips the sequence and leaves its output unwritten. Indices are
    addressed as idx + n * stride(0) + t, as the kernel does (so a 1-D index with T > 1 goes wrong)."""
    B, T = q.shape[:2]
    flat, seq_stride = indices.reshape(-1), indices.stride(0)
    o = torch.full_like(v, float("nan"))
    for n in range(B):
        first = int(flat[n * seq_stride])
        if first <= 0:
            continue
        S = pool[first].float().transpose(-1, -2)
        for t in range(T):
            sl = slice(t, t + 1)
            o_t, S = step(q[n:n + 1, sl], k[n:n + 1, sl], v[n:n + 1, sl], g[n:n + 1, sl], beta[n:n + 1, sl], S,
                          scale, l2)
            o[n, t] = o_t[0]
            idx = int(flat[n * seq_stride + t])
            if idx > 0:
                pool[idx] = S.transpose(-1, -2).to(pool.dtype)
    return o


def fake_vllm(monkeypatch, calls):
    def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                               cu_seqlens=None, chunk_indices=None, chunk_offsets=None,
                               use_qk_l2norm_in_kernel=False, core_attn_out=None):
        assert q.dtype != torch.float32 and beta.ndim == 3
        assert (chunk_indices is not None and chunk_offsets is not None) == (cu_seqlens is not None)
        h0 = None if initial_state is None else initial_state.transpose(-1, -2)
        o, ht = gdn_recurrent(q, k, v, g, beta, scale=scale, initial_state=h0, cu_seqlens=cu_seqlens,
                              qk_l2norm=use_qk_l2norm_in_kernel)
        return o.to(q.dtype), (ht.transpose(-1, -2).contiguous() if output_final_state else None)

    def fused_recurrent_gated_delta_rule(q, k, v, g, beta=None, scale=None, initial_state=None,
                                         inplace_final_state=True, cu_seqlens=None, ssm_state_indices=None,
                                         num_accepted_tokens=None, use_qk_l2norm_in_kernel=False):
        assert inplace_final_state and cu_seqlens is None and num_accepted_tokens is None
        calls.append(("fused_recurrent", tuple(ssm_state_indices.shape)))
        o = vllm_decode(q, k, v, g, beta, scale, initial_state, ssm_state_indices, use_qk_l2norm_in_kernel)
        return o.to(q.dtype), initial_state

    def fused_sigmoid_gating_delta_rule_update(A_log, a, b, dt_bias, q, k, v, beta=1.0, threshold=20.0,  # noqa: N803
                                               scale=None, initial_state=None, inplace_final_state=True,
                                               cu_seqlens=None, ssm_state_indices=None, num_accepted_tokens=None,
                                               use_qk_l2norm_in_kernel=False, is_kda=False):
        assert beta == 1.0 and threshold == 20.0 and inplace_final_state
        calls.append(("fused_sigmoid", tuple(ssm_state_indices.shape)))
        g, beta_t = gate_from_raw(a, b, A_log, dt_bias)
        o = vllm_decode(q, k, v, g, beta_t, scale, initial_state, ssm_state_indices, use_qk_l2norm_in_kernel)
        return o.float() if initial_state.dtype == torch.float32 else o.to(q.dtype), initial_state

    for fn in (chunk_gated_delta_rule, fused_recurrent_gated_delta_rule, fused_sigmoid_gating_delta_rule_update):
        fn.__doc__ = V_FIRST_DOC
    ops = VLLM_OPS[0]
    install(monkeypatch, {
        "vllm": {},
        ops: dict(chunk_gated_delta_rule=chunk_gated_delta_rule,
                  fused_recurrent_gated_delta_rule=fused_recurrent_gated_delta_rule,
                  fused_sigmoid_gating_delta_rule_update=fused_sigmoid_gating_delta_rule_update),
        ops + ".index": dict(prepare_chunk_indices=lambda cu, size: torch.zeros(1),
                             prepare_chunk_offsets=lambda cu, size: torch.zeros(1)),
        ops + ".utils": dict(FLA_CHUNK_SIZE=64),
    })


def sglang_decode(q, k, v, g, beta, scale, pool, indices, l2):
    """SGLang's pool semantics: read pool[idx] at the start (zeros for -1), write it at the end."""
    o = torch.empty_like(v)
    for n in range(q.shape[0]):
        idx = int(indices[n])
        S = pool[idx].float().transpose(-1, -2) if idx >= 0 else q.new_zeros(pool.shape[1], pool.shape[3],
                                                                             pool.shape[2], dtype=torch.float32)
        o[n], S = step(q[n:n + 1], k[n:n + 1], v[n:n + 1], g[n:n + 1], beta[n:n + 1], S, scale, l2)
        if idx >= 0:
            pool[idx] = S.transpose(-1, -2).to(pool.dtype)
    return o


def fake_sglang(monkeypatch):
    def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, initial_state_indices=None,
                               cu_seqlens=None, head_first=False, use_qk_l2norm_in_kernel=False,
                               inplace_update=True):
        assert q.dtype != torch.float32 and not head_first
        idx = initial_state_indices.long()
        o, ht = gdn_recurrent(q, k, v, g, beta, scale=scale, initial_state=initial_state[idx].transpose(-1, -2),
                              cu_seqlens=cu_seqlens, qk_l2norm=use_qk_l2norm_in_kernel)
        if inplace_update:
            initial_state[idx] = ht.transpose(-1, -2).to(initial_state.dtype)
        return o.to(q.dtype), None, None

    def fused_gdn_gating(A_log, a, b, dt_bias, beta=1.0, threshold=20.0):  # noqa: N803
        assert a.ndim == b.ndim == 2
        g, beta_t = gate_from_raw(a, b, A_log, dt_bias)
        return g[None], beta_t[None]

    def fused_sigmoid_gating_delta_rule_update(A_log, a, dt_bias, softplus_beta, softplus_threshold,  # noqa: N803
                                               q, k, v, b, initial_state_source, initial_state_indices, scale=None,
                                               use_qk_l2norm_in_kernel=False, cu_seqlens=None, is_kda=False,
                                               lower_bound=None, disable_state_update=False):
        assert softplus_beta == 1.0 and softplus_threshold == 20.0 and cu_seqlens is None
        g, beta_t = gate_from_raw(a, b, A_log, dt_bias)
        return sglang_decode(q, k, v, g, beta_t, scale, initial_state_source, initial_state_indices,
                             use_qk_l2norm_in_kernel)

    def fused_recurrent_gated_delta_rule_update(q, k, v, g, beta=None, scale=None, initial_state_source=None,
                                                initial_state_indices=None, cu_seqlens=None,
                                                use_qk_l2norm_in_kernel=False, disable_state_update=False):
        assert cu_seqlens is None
        return sglang_decode(q, k, v, g, beta, scale, initial_state_source, initial_state_indices,
                             use_qk_l2norm_in_kernel)

    base = "sglang.kernels.ops.attention."
    install(monkeypatch, {
        base + "fla.chunk": dict(chunk_gated_delta_rule=chunk_gated_delta_rule),
        base + "fla.fused_recurrent": dict(
            fused_recurrent_gated_delta_rule_update=fused_recurrent_gated_delta_rule_update),
        base + "linear.fused_gdn_gating": dict(fused_gdn_gating=fused_gdn_gating),
        base + "linear.fused_sigmoid_gating_recurrent": dict(
            fused_sigmoid_gating_delta_rule_update=fused_sigmoid_gating_delta_rule_update),
    })


def run_twice(name, p):
    """Prepare, call, check against the reference; call again after reset and expect the same."""
    prepared = registry()[name].prepare(p)
    outs = []
    for _ in range(2):
        if prepared.reset:
            prepared.reset()
        prepared.call()
        outs.append(prepared.outputs())
    first, again = outs
    assert torch.equal(first.o, again.o)
    for a, b in ((first.final_state, again.final_state), (first.state_pool, again.state_pool)):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b))
    verdict = Gate(p, reference_outputs(p, ReferenceSettings()), Tolerances()).check(first)
    assert verdict.status == Status.PASS, verdict.message
    return prepared, first


PREFILL = [
    dict(B=2, T=9, H=1, HV=2, K=8, V=16, dtype="bf16"),
    dict(B=2, T=9, H=2, HV=4, D=8, dtype="fp16", initial_state="random", qk_l2norm="kernel", scale=0.3),
    dict(mode="varlen", seq_lens=(3, 11, 1), H=1, HV=2, K=8, V=4, dtype="bf16", initial_state="random"),
    dict(mode="varlen", seq_lens=(5, 4), H=1, D=8, dtype="bf16", gating="raw", output_final_state=False),
]
DECODE = [
    dict(op="decode", B=3, H=1, HV=2, K=8, V=16, dtype="bf16", pool_size=7, slots="scattered"),
    dict(op="decode", B=3, T=3, H=1, HV=2, D=8, dtype="fp32", state_dtype="bf16", pool_size=5, slots="scattered",
         qk_l2norm="kernel"),
    dict(op="decode", B=2, T=2, H=2, HV=4, D=8, dtype="bf16", pool_size=2, gating="raw"),
    dict(op="decode", B=4, H=1, D=8, dtype="fp32", pool_size=6, slots="scattered", gating="raw", scale=0.5),
]


@pytest.mark.parametrize("fields", PREFILL, ids=lambda f: Case(**f).id)
def test_vllm_chunk_end_to_end(monkeypatch, fields):
    fake_vllm(monkeypatch, [])
    prepared, out = run_twice("vllm.chunk", problem(**fields))
    assert prepared.path.startswith(f"vllm vendored FLA triton chunk ({VLLM_OPS[0]})")
    assert ("chunk_indices precomputed" in prepared.path) == (fields.get("mode") == "varlen")
    assert ("gating in torch" in prepared.path) == (fields.get("gating") == "raw")
    assert (out.final_state is None) == (fields.get("output_final_state") is False)


@pytest.mark.parametrize("fields", DECODE, ids=lambda f: Case(**f).id)
def test_vllm_recurrent_end_to_end(monkeypatch, fields):
    calls = []
    fake_vllm(monkeypatch, calls)
    p = problem(**fields)
    prepared, out = run_twice("vllm.recurrent", p)
    kernel = "fused_sigmoid" if fields.get("gating") == "raw" else "fused_recurrent"
    T = fields.get("T", 1)
    assert calls[0] == (kernel, (p.case.B,) if T == 1 else (p.case.B, T))
    assert "slot s at s+1 (slot 0 reserved)" in prepared.path and out.o.dtype == p.v.dtype


@pytest.mark.parametrize("gating", ["pre", "raw"])
@pytest.mark.parametrize("name", ["vllm.recurrent", "sglang.recurrent"])
def test_decode_padding_slot_gives_zero_output_and_touches_nothing(monkeypatch, name, gating):
    fake_vllm(monkeypatch, []) if name.startswith("vllm") else fake_sglang(monkeypatch)
    p = problem(op="decode", B=3, T=2, H=1, D=8, dtype="fp32", pool_size=5, gating=gating)
    p.slot_idx = torch.tensor([4, -1, 0], dtype=torch.int32)
    _, out = run_twice(name, p)
    assert torch.equal(out.o[1], torch.zeros_like(out.o[1]))
    assert torch.equal(out.state_pool[[1, 2, 3]], p.state_pool[[1, 2, 3]])


@pytest.mark.parametrize("fields", PREFILL, ids=lambda f: Case(**f).id)
def test_sglang_chunk_end_to_end(monkeypatch, fields):
    fake_sglang(monkeypatch)
    prepared, out = run_twice("sglang.chunk", problem(**fields))
    assert prepared.path.startswith("sglang vendored FLA triton chunk") and prepared.reset is not None
    assert ("gating by sglang fused_gdn_gating" in prepared.path) == (fields.get("gating") == "raw")
    assert (out.final_state is None) == (fields.get("output_final_state") is False)


@pytest.mark.parametrize("fields", DECODE, ids=lambda f: Case(**f).id)
def test_sglang_recurrent_end_to_end(monkeypatch, fields):
    fake_sglang(monkeypatch)
    prepared, out = run_twice("sglang.recurrent", problem(**fields))
    kernel = "fused_sigmoid_gating_delta_rule_update" if fields.get("gating") == "raw" else \
        "fused_recurrent_gated_delta_rule_update"
    assert prepared.path.startswith(f"sglang triton {kernel}")


def test_without_reset_the_pool_keeps_evolving(monkeypatch):
    """The reset is what makes repeated samples identical: without it, the state moves on."""
    fake_vllm(monkeypatch, [])
    p = problem(op="decode", B=2, H=1, D=8, dtype="bf16", pool_size=3)
    prepared = registry()["vllm.recurrent"].prepare(p)
    prepared.reset()
    prepared.call()
    first = prepared.outputs().state_pool.clone()
    prepared.call()
    assert not torch.equal(prepared.outputs().state_pool, first)

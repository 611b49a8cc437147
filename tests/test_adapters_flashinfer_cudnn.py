"""FlashInfer (prefill, decode, mtp) and cuDNN-frontend adapters, on CPU without the libraries.

The adapters run end to end against stand-ins of the libraries: keyword-only functions with the real
parameter names (flashinfer-python 0.7.2.post1, nvidia-cudnn-frontend 1.32.0) that implement each
library's conventions (3-D tokens, linear alpha, V-first states and pools, raw gating) with the
reference recurrence. A conversion the adapter gets wrong therefore shows up as a FAIL of the
correctness gate; envelope checks are exercised with a monkeypatched GPU capability.
"""

from __future__ import annotations

import subprocess
import sys
import types

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
import yaml
from typer.testing import CliRunner

from gdnbench import reference
from gdnbench.backends import base, convert, cudnn_gdn
from gdnbench.backends.cudnn_gdn import cudnn_gdn as cudnn_backend
from gdnbench.backends.flashinfer_decode import flashinfer_decode
from gdnbench.backends.flashinfer_mtp import flashinfer_mtp
from gdnbench.backends.flashinfer_prefill import flashinfer_prefill
from gdnbench.cli import app
from gdnbench.problem import make_problem
from gdnbench.results import Status
from gdnbench.suite import Case
from tests.backend_helpers import check_reset_restores_the_pool, run_adapter

CUDA = torch.device("cuda")
CALLS: list[tuple[str, dict]] = []


# --------------------------------------------------------------------------------------------------
# Stand-ins for the libraries
# --------------------------------------------------------------------------------------------------


def _fi_chunk_gated_delta_rule(
    *, q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
    use_qk_l2norm_in_kernel=False, output=None, output_state=None, state_checkpoints=None,
    checkpoint_cu_starts=None, checkpoint_every_n_tokens=0, use_cp="auto", state_indices=None,
    _cp_chunk_len=None, backend="auto", max_seqlen=None,
):
    """flashinfer.gdn_prefill: 3-D [T_total, H, D], linear alpha and beta in fp32, V-first states."""
    CALLS.append(("fi.prefill", dict(use_cp=use_cp, backend=backend, max_seqlen=max_seqlen, cu=cu_seqlens)))
    assert cu_seqlens is not None and not cu_seqlens.is_floating_point()
    assert q.dim() == k.dim() == v.dim() == 3 and q.is_contiguous() and v.is_contiguous()
    HO = max(q.shape[1], v.shape[1])
    assert g.dtype == beta.dtype == torch.float32 and g.shape == beta.shape == (q.shape[0], HO)
    assert (g > 0).all() and (g <= 1).all(), "g is the linear decay alpha in (0, 1]"
    h0 = None if initial_state is None else initial_state.transpose(-1, -2)
    o, s = reference.gdn_recurrent(q[None], k[None], v[None], torch.log(g + 1e-10)[None], beta[None],
                                   scale=scale, initial_state=h0, cu_seqlens=cu_seqlens,
                                   qk_l2norm=use_qk_l2norm_in_kernel)
    out = output if output is not None else torch.empty_like(v)
    out.copy_(o[0])
    if not output_final_state:
        return out
    state = output_state if output_state is not None else s.new_empty(s.shape[0], HO, v.shape[2], q.shape[2])
    state.copy_(s.transpose(-1, -2))
    return out, state


def _fi_decode_step(name, q, k, v, A_log, a, dt_bias, b, scale, use_qk_l2norm, pool, slots, update=True):
    """Shared body: raw gating in-kernel, V-first pool [P, HV, V, K] read and written at ``slots``."""
    P, HV, V, K = pool.shape
    assert pool.shape == (P, v.shape[2], v.shape[3], q.shape[3]) and pool.stride(-1) == 1
    assert slots.dtype in (torch.int32, torch.int64) and slots.shape == (q.shape[0],)
    assert A_log.dtype == torch.float32 and a.shape == b.shape == v.shape[:3]
    g, beta = reference.gate_from_raw(a, b, A_log, dt_bias)
    work = pool.transpose(-1, -2).to(torch.float32, copy=True)  # K-first fp32 working copy
    o = reference.gdn_decode(reference.gdn_recurrent, q, k, v, g, beta, state_pool=work, slot_idx=slots,
                             scale=scale, qk_l2norm=use_qk_l2norm)
    if update:
        pool.copy_(work.transpose(-1, -2))
    return o.to(q.dtype), pool


def _fi_decode_pretranspose(
    *, q, k, v, state, A_log, a, dt_bias, b, scale=None, output=None, use_qk_l2norm=True, initial_state=None,
    initial_state_indices=None, output_state_indices=None, intermediate_states_buffer=None,
    disable_state_update=False, backend="auto",
):
    """flashinfer.gdn_decode.gated_delta_rule_decode_pretranspose in pool mode."""
    CALLS.append(("fi.pretranspose", dict(backend=backend, disable_state_update=disable_state_update)))
    T = q.shape[1]
    if T == 1 and (intermediate_states_buffer is not None or disable_state_update):
        raise ValueError("intermediate_states_buffer / disable_state_update are for T > 1")
    assert state is None and output_state_indices is None and intermediate_states_buffer is None
    assert T == 1 or initial_state.dtype == torch.bfloat16, "fp32 T>1 goes through gated_delta_rule_mtp"
    return _fi_decode_step("pretranspose", q, k, v, A_log, a, dt_bias, b, scale, use_qk_l2norm,
                           initial_state, initial_state_indices, update=not disable_state_update)


def _fi_mtp(
    *, q, k, v, initial_state, initial_state_indices, A_log, a, dt_bias, b, scale=None, output=None,
    intermediate_states_buffer=None, ssm_state_indices=None, disable_state_update=None, use_qk_l2norm=True,
    output_state_indices=None, cache_replayssm=False, replayssm_rawv=None, replayssm_rawk=None,
    replayssm_g=None, replayssm_beta=None,
):
    """flashinfer.gdn_decode.gated_delta_rule_mtp: fp32 pool; disable_state_update still defaults to True."""
    CALLS.append(("fi.mtp", dict(disable_state_update=disable_state_update, ssm_state_indices=ssm_state_indices)))
    assert initial_state.dtype == torch.float32
    assert ssm_state_indices is None and intermediate_states_buffer is None and output_state_indices is None
    update = disable_state_update is False  # None: the deprecated default (True) leaves the pool as it was
    return _fi_decode_step("mtp", q, k, v, A_log, a, dt_bias, b, scale, use_qk_l2norm, initial_state,
                           initial_state_indices, update=update)


def _cudnn_gated_delta_net(
    *, q, k, v, g, beta, cu_seqlens, scale=None, initial_state=None, output_final_state=False,
    use_qk_l2norm_in_kernel=False, batch_invariant=False, use_beta_sigmoid_in_kernel=False,
    allow_neg_eigval=False, safe_gate=False, gate_domain="log", a_log=None, dt_bias=None,
    checkpoint_every_n_tokens=0, checkpoint_dtype=None, plan_name=None, overwrite_initial_state=False,
    state_indices=None,
):
    """cudnn.linear_attention.gated_delta_net: THD layout, log g, V-first states; cuTile's engine gates."""
    CALLS.append(("cudnn", dict(plan_name=plan_name, safe_gate=safe_gate,
                                use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel)))
    assert q.dim() == 3 and cu_seqlens.dtype in (torch.int32, torch.int64) and gate_domain == "log"
    assert beta.dtype in (torch.float32, q.dtype)
    if plan_name == "gdn_cutile":
        if use_beta_sigmoid_in_kernel or cu_seqlens.dtype != torch.int32:
            raise NotImplementedError("GdnCuTileEngine: no use_beta_sigmoid, int32 cu_seqlens only")
        assert initial_state is None or initial_state.dtype == torch.float32
    if safe_gate:
        g = -torch.exp(a_log.float()) * F.softplus(g.float() + dt_bias.float())
    elif a_log is not None or dt_bias is not None:
        raise ValueError("a_log/dt_bias require safe_gate=True")
    if use_beta_sigmoid_in_kernel:
        beta = torch.sigmoid(beta.float())
    h0 = None if initial_state is None else initial_state.transpose(-1, -2)
    o, s = reference.gdn_recurrent(q[None], k[None], v[None], g[None], beta[None], scale=scale, initial_state=h0,
                                   cu_seqlens=cu_seqlens, qk_l2norm=use_qk_l2norm_in_kernel)
    final = s.transpose(-1, -2).contiguous() if output_final_state else s.new_empty(0)
    return o[0].to(q.dtype), final


@pytest.fixture
def fake_libs(monkeypatch):
    """Install the stand-ins as flashinfer.gdn_prefill, flashinfer.gdn_decode and cudnn.linear_attention."""
    mods = {name: types.ModuleType(name) for name in
            ("flashinfer", "flashinfer.gdn_prefill", "flashinfer.gdn_decode", "cudnn", "cudnn.linear_attention")}
    mods["flashinfer.gdn_prefill"].chunk_gated_delta_rule = _fi_chunk_gated_delta_rule
    mods["flashinfer.gdn_decode"].gated_delta_rule_decode_pretranspose = _fi_decode_pretranspose
    mods["flashinfer.gdn_decode"].gated_delta_rule_mtp = _fi_mtp
    mods["cudnn.linear_attention"].gated_delta_net = _cudnn_gated_delta_net
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    CALLS.clear()
    yield
    CALLS.clear()


def gpu(monkeypatch, cc: tuple[int, int], cuda: str = "13.0") -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cc)
    monkeypatch.setattr(torch.version, "cuda", cuda)


def expect(got: str | None, reason: str | None) -> None:
    """None for a supported case, else a reason that starts with the expected text."""
    assert (got is None) if reason is None else (got or "").startswith(reason), got


# --------------------------------------------------------------------------------------------------
# Conversions
# --------------------------------------------------------------------------------------------------


def test_token_flattening_cu_seqlens_alpha_and_v_first_states_round_trip():
    p = make_problem(Case(B=3, T=5, H=1, HV=2, D=4, initial_state="random"), 0)
    flat = convert.flat_tokens(p.q)
    assert flat.shape == (15, 1, 4) and flat.is_contiguous()
    assert torch.equal(flat[5 + 2], p.q[1, 2])  # token t of sequence b sits at b*T + t
    assert torch.equal(convert.unflat_tokens(flat, 3, 5), p.q)
    cu = convert.cu_seqlens(p, torch.int64)
    assert cu.tolist() == [0, 5, 10, 15] and cu.dtype == torch.int64
    assert convert.cu_seqlens(p, torch.int32).dtype == torch.int32
    a = convert.alpha(p.g)
    assert a.dtype == torch.float32 and torch.allclose(a.log(), p.g, atol=1e-6) and (a <= 1).all()
    vf = convert.swap_kv(p.initial_state)
    assert vf.is_contiguous() and torch.equal(vf[2, 1, 3, 0], p.initial_state[2, 1, 0, 3])
    assert torch.equal(convert.swap_kv(vf), p.initial_state)

    v = make_problem(Case(mode="varlen", seq_lens=(3, 6), H=1, D=4), 0)
    assert torch.equal(convert.cu_seqlens(v), v.cu_seqlens)


def test_v_first_pool_layout_and_reset_restores_the_pristine_pool():
    p = make_problem(Case(op="decode", B=2, H=1, HV=2, D=4, pool_size=5, slots="scattered", gating="raw"), 0)
    pool = convert.StatePool(p.state_pool, v_first=True)
    s = int(p.slot_idx[0])
    assert torch.equal(pool.pool[s], p.state_pool[s].transpose(-1, -2)) and pool.pool.stride(-1) == 1
    ptr = pool.pool.data_ptr()
    pool.pool[s] += 1
    assert not torch.equal(pool.canonical(), p.state_pool)
    pool.reset()
    assert pool.pool.data_ptr() == ptr  # the buffers `call` uses (CUDA graphs replay on fixed addresses)
    assert torch.equal(pool.canonical(), p.state_pool)


# --------------------------------------------------------------------------------------------------
# End to end against the stand-ins
# --------------------------------------------------------------------------------------------------

PREFILL = [
    Case(B=2, T=33, H=1, HV=2, D=8, initial_state="random"),
    Case(mode="varlen", seq_lens=(5, 30, 12), H=2, D=8, qk_l2norm="kernel", initial_state="random"),
    Case(B=2, T=20, H=1, HV=2, D=8, gating="raw", dtype="fp16", initial_state="random"),
    Case(B=1, T=17, H=1, D=8, output_final_state=False),
]


@pytest.mark.parametrize("case", PREFILL, ids=lambda c: c.id)
def test_flashinfer_prefill_matches_the_reference(fake_libs, case):
    p, prepared, out, verdict = run_adapter(flashinfer_prefill, case)
    assert verdict.status == Status.PASS, verdict.message
    assert (out.final_state is None) == (not case.output_final_state)
    (name, kw), = CALLS
    lens = (p.cu_seqlens.diff() if p.cu_seqlens is not None else torch.tensor([case.T]))
    assert kw["use_cp"] == "auto" and kw["backend"] == "flashinfer" and kw["max_seqlen"] == int(lens.max())
    assert kw["cu"].dtype == torch.int64
    assert "use_cp='auto'" in prepared.path and "backend='flashinfer'" in prepared.path
    assert ("PyTorch" in prepared.path) == (case.gating == "raw")


def test_pins_an_older_release_lacks_are_left_out_and_the_path_says_so(fake_libs, monkeypatch):
    def older(*, q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, use_qk_l2norm_in_kernel,
              output, output_state, use_cp):  # no backend= or max_seqlen= yet
        return _fi_chunk_gated_delta_rule(**locals())

    monkeypatch.setattr(sys.modules["flashinfer.gdn_prefill"], "chunk_gated_delta_rule", older)
    _, prepared, _, verdict = run_adapter(flashinfer_prefill, PREFILL[0])
    assert verdict.status == Status.PASS, verdict.message
    assert "use_cp='auto'" in prepared.path and "backend" not in prepared.path and "max_seqlen" not in prepared.path


def test_flashinfer_prefill_gate_conversion_is_load_bearing(fake_libs, monkeypatch):
    """A wrong decay conversion (exp(g/2) for alpha) must fail the gate: the stand-in is not lenient."""
    monkeypatch.setattr(convert, "alpha", lambda g: g.float().exp().sqrt())
    *_, verdict = run_adapter(flashinfer_prefill, PREFILL[0])
    assert verdict.status == Status.FAIL


CUDNN = [  # head dim 64: FROST's smallest, so both engines are reachable
    Case(B=2, T=20, H=1, HV=2, D=64, initial_state="random"),
    Case(mode="varlen", seq_lens=(5, 20, 9), H=2, D=64, qk_l2norm="kernel", initial_state="random"),
    Case(B=2, T=20, H=1, HV=2, D=64, gating="raw", dtype="fp16", initial_state="random"),
]


@pytest.mark.parametrize("cc,engine", [((10, 0), "gdn_frost"), ((9, 0), "gdn_cutile")])
@pytest.mark.parametrize("case", CUDNN, ids=lambda c: c.id)
def test_cudnn_gdn_matches_the_reference_on_each_engine(fake_libs, monkeypatch, cc, engine, case):
    gpu(monkeypatch, cc)
    _, prepared, _, verdict = run_adapter(cudnn_backend, case)
    assert verdict.status == Status.PASS, verdict.message
    (_, kw), = CALLS
    assert kw["plan_name"] == engine and engine in prepared.path
    assert kw["safe_gate"] == (case.gating == "raw")
    assert kw["use_beta_sigmoid_in_kernel"] == (case.gating == "raw" and engine == "gdn_frost")


DECODE = [
    Case(op="decode", B=3, H=1, HV=2, D=8, gating="raw", pool_size=7, slots="scattered"),
    Case(op="decode", B=2, H=2, D=8, gating="raw", state_dtype="bf16", qk_l2norm="kernel"),
]


@pytest.mark.parametrize("case", DECODE, ids=lambda c: c.id)
def test_flashinfer_decode_updates_its_slots_in_place_and_resets(fake_libs, case):
    p, prepared, out, verdict = run_adapter(flashinfer_decode, case)
    assert verdict.status == Status.PASS, verdict.message  # includes: slots outside slot_idx untouched
    assert CALLS[0] == ("fi.pretranspose", {"backend": "flashinfer", "disable_state_update": False})
    check_reset_restores_the_pool(p, prepared, out)


@pytest.mark.parametrize("state_dtype,entry", [("fp32", "fi.mtp"), ("bf16", "fi.pretranspose")])
def test_flashinfer_mtp_writes_the_last_state_back_to_the_read_slot(fake_libs, state_dtype, entry):
    case = Case(op="decode", B=3, T=3, H=1, HV=2, D=8, gating="raw", pool_size=6, slots="scattered",
                state_dtype=state_dtype)
    _, prepared, _, verdict = run_adapter(flashinfer_mtp, case)
    assert verdict.status == Status.PASS, verdict.message
    name, kw = CALLS[0]
    assert name == entry and kw["disable_state_update"] is False
    assert ("gated_delta_rule_mtp" in prepared.path) == (state_dtype == "fp32")


# --------------------------------------------------------------------------------------------------
# Availability and envelopes
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def libraries_absent(monkeypatch):
    for name in ("flashinfer", "cudnn"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ModuleNotFoundError, installed or not
    base._import_error.cache_clear()
    yield
    base._import_error.cache_clear()


@pytest.mark.parametrize("b,case,module", [
    (flashinfer_prefill, PREFILL[0], "flashinfer.gdn_prefill"),
    (flashinfer_decode, DECODE[0], "flashinfer.gdn_decode"),
    (flashinfer_mtp, Case(op="decode", B=2, T=2, H=1, D=8, gating="raw"), "flashinfer.gdn_decode"),
    (cudnn_backend, PREFILL[0], "cudnn"),
], ids=lambda x: getattr(x, "name", None))
def test_absent_library_gives_a_skip_row_naming_the_module(libraries_absent, tmp_path, b, case, module):
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({"name": "t", "backends": [b.name], "cases": [case.fields()],
                                     "timing": {"min_samples": 1, "min_time_s": 0.0, "warmup": 1}}))
    res = CliRunner().invoke(app, ["run", str(suite), "--out", str(tmp_path / "out"), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    (row,) = pd.read_csv(tmp_path / "out" / "results.csv").to_dict("records")
    assert row["backend"] == b.name and row["status"] == Status.SKIP
    assert f"cannot import {module}" in row["error"]


def test_importing_the_adapters_does_not_import_the_libraries():
    code = ("import sys, gdnbench.backends.flashinfer_prefill, gdnbench.backends.flashinfer_decode, "
            "gdnbench.backends.flashinfer_mtp, gdnbench.backends.cudnn_gdn; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('flashinfer', 'cudnn')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


D128 = dict(H=2, HV=4, D=128)
PREFILL_ENVELOPE = [
    ((9, 0), "13.0", Case(B=1, T=64, **D128), None),
    ((12, 0), "12.8", Case(B=1, T=64, **D128), None),
    ((10, 0), "13.0", Case(B=1, T=64, **D128), None),
    ((10, 0), "12.8", Case(B=1, T=64, **D128), "flashinfer.prefill: SM10x kernels need CUDA 13+, torch is built "
                                               "for CUDA 12.8"),
    ((8, 0), "13.0", Case(B=1, T=64, **D128), "flashinfer.prefill: SM90, SM10x or SM12x GPUs only, this GPU is "
                                              "SM80"),
    ((9, 0), "13.0", Case(B=1, T=64, H=2, D=64), "flashinfer.prefill: head dims [128] only, case has K=64, V=64"),
    ((9, 0), "13.0", Case(B=1, T=64, dtype="fp32", **D128), "flashinfer.prefill: dtype fp32 not supported"),
]


@pytest.mark.parametrize("cc,cuda,case,reason", PREFILL_ENVELOPE)
def test_flashinfer_prefill_envelope(monkeypatch, cc, cuda, case, reason):
    gpu(monkeypatch, cc, cuda)
    got = flashinfer_prefill.unsupported(case, CUDA)
    expect(got, reason)


RAW = dict(op="decode", B=4, gating="raw", **D128)
DECODE_ENVELOPE = [
    (flashinfer_decode, (9, 0), Case(**RAW), None),
    (flashinfer_decode, (10, 0), Case(state_dtype="bf16", **RAW), None),
    (flashinfer_decode, (9, 0), Case(op="decode", B=4, **D128),
     "flashinfer.decode: gating: pre not supported (serves raw)"),
    (flashinfer_decode, (9, 0), Case(T=2, **RAW), "flashinfer.decode: T=1 only, case has T=2 (T>1 is "
                                                 "flashinfer.mtp)"),
    (flashinfer_decode, (8, 9), Case(**RAW), "flashinfer.decode: needs SM90 or newer, this GPU is SM89"),
    (flashinfer_decode, (9, 0), Case(op="decode", B=4, gating="raw", H=2, D=64), "flashinfer.decode: K=128 only"),
    (flashinfer_decode, (9, 0), Case(op="decode", B=4, gating="raw", H=2, K=128, V=256, state_dtype="bf16"),
     "flashinfer.decode: bf16 state pools need K=V=128, case has V=256"),
    (flashinfer_decode, (9, 0), Case(op="decode", B=4, gating="raw", H=2, K=128, V=256), None),
    (flashinfer_mtp, (9, 0), Case(T=3, **RAW), None),
    (flashinfer_mtp, (9, 0), Case(T=3, state_dtype="bf16", **RAW), None),
    (flashinfer_mtp, (9, 0), Case(**RAW), "flashinfer.mtp: T >= 2 only, case has T=1"),
    (flashinfer_mtp, (9, 0), Case(op="decode", B=4, T=2, gating="raw", H=2, K=128, V=136),
     "flashinfer.mtp: fp32 state pools need V >= 128 and a multiple of 64, case has V=136"),
    (flashinfer_mtp, (9, 0), Case(T=2, dtype="fp32", **RAW), "flashinfer.mtp: dtype fp32 not supported"),
]


@pytest.mark.parametrize("b,cc,case,reason", DECODE_ENVELOPE)
def test_flashinfer_decode_and_mtp_envelopes(monkeypatch, b, cc, case, reason):
    gpu(monkeypatch, cc)
    got = b.unsupported(case, CUDA)
    expect(got, reason)


PRE = Case(B=1, T=64, H=2, HV=4, D=128)
CUDNN_ENVELOPE = [  # (capability, cuda-tile installed, CUDA runtime, case, reason)
    ((10, 0), False, None, PRE, None),
    ((10, 3), False, None, Case(B=1, T=64, H=2, K=64, V=128), None),
    ((10, 0), True, 13030, Case(B=1, T=64, H=2, D=100), None),
    ((10, 0), False, None, Case(B=1, T=64, H=2, D=100),
     "cudnn.gdn: FROST takes head dims 64/128 (case has K=100, V=100); the cuTile fallback needs the cuda-tile "
     "package"),
    ((9, 0), True, 13030, PRE, None),
    ((9, 0), False, None, PRE,
     "cudnn.gdn: FROST runs on SM100/SM103/SM107 only; on SM90 the cuTile fallback needs the cuda-tile package"),
    ((9, 0), True, 12080, PRE, "cudnn.gdn: FROST runs on SM100/SM103/SM107 only; on SM90 the cuTile fallback "
                               "needs a CUDA 13.3+ runtime (found 12.8)"),
    ((9, 0), True, None, PRE, "cudnn.gdn: FROST runs on SM100/SM103/SM107 only; on SM90 the cuTile fallback "
                              "needs a CUDA 13.3+ runtime (found unreadable"),
    ((12, 0), True, 13030, Case(B=1, T=64, H=2, D=512), "cudnn.gdn: FROST runs on SM100/SM103/SM107 only; on SM120 "
                                                        "the cuTile fallback takes K <= 256, case has K=512"),
    ((7, 5), True, 13030, PRE, "cudnn.gdn: FROST runs on SM100/SM103/SM107 only; on SM75 the cuTile fallback "
                               "needs SM80 or newer"),
    ((10, 0), True, 13030, Case(B=1, T=64, dtype="fp32", **D128), "cudnn.gdn: dtype fp32 not supported"),
    ((10, 0), True, 13030, Case(op="decode", B=2, gating="raw", **D128), "cudnn.gdn: no decode op"),
]


@pytest.mark.parametrize("cc,tile,cudart,case,reason", CUDNN_ENVELOPE)
def test_cudnn_gdn_envelope(monkeypatch, cc, tile, cudart, case, reason):
    gpu(monkeypatch, cc)
    monkeypatch.setattr(cudnn_gdn, "_has_cuda_tile", lambda: tile)
    monkeypatch.setattr(cudnn_gdn, "_cudart_version", lambda: cudart)
    got = cudnn_backend.unsupported(case, CUDA)
    expect(got, reason)

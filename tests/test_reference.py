"""Tests for gdnbench.reference: a naive loop checks the recurrence, the recurrence checks the chunked form."""

from __future__ import annotations

import math

import re

import pytest
import torch
import torch.nn.functional as F

from gdnbench.reference import SlotLayout, gate_from_raw, gdn_chunk, gdn_decode, gdn_recurrent, l2norm

f32, f64 = torch.float32, torch.float64


def rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b||, in fp64; NaN anywhere gives NaN (which fails every `<` check)."""
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def make_inputs(
    B: int,
    T: int,
    H: int,
    HV: int,
    K: int,
    V: int,
    *,
    gate_norm: float = 1.0,
    mask_p: float = 0.0,
    n_states: int | None = None,
    random_state: bool = False,
    normalize_qk: bool = True,
    dtype: torch.dtype = f32,
    seed: int = 0,
) -> dict:
    """The input recipe (docs/design.md, "Inputs"): q, k, v ~ U(0,1) (q, k L2-normalised), beta = sigmoid(U),
    g = logsigmoid(U)/gate_norm with entries zeroed w.p. mask_p, initial state zeros or N(0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.rand(B, T, H, K, generator=gen, dtype=f64)
    k = torch.rand(B, T, H, K, generator=gen, dtype=f64)
    v = torch.rand(B, T, HV, V, generator=gen, dtype=f64)
    if normalize_qk:  # own normalisation, independent of reference.l2norm
        q = q / q.norm(dim=-1, keepdim=True)
        k = k / k.norm(dim=-1, keepdim=True)
    beta = torch.sigmoid(torch.rand(B, T, HV, generator=gen, dtype=f64))
    g = F.logsigmoid(torch.rand(B, T, HV, generator=gen, dtype=f64)) / gate_norm
    g = g.masked_fill(torch.rand(B, T, HV, generator=gen, dtype=f64) < mask_p, 0.0)
    N = B if n_states is None else n_states
    h0 = torch.randn(N, HV, K, V, generator=gen, dtype=f64) if random_state else None
    out = dict(q=q.to(dtype), k=k.to(dtype), v=v.to(dtype), g=g.float(), beta=beta.to(dtype))
    out["initial_state"] = None if h0 is None else h0.float()
    return out


def cu_from_lens(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0] + lens, dtype=torch.long).cumsum(0)


def naive(q, k, v, g, beta, *, scale=None, initial_state=None, cu_seqlens=None):
    """Per sequence, per value head, per token; plain matrix-vector ops in fp64."""
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    scale = K**-0.5 if scale is None else scale
    if cu_seqlens is None:
        spans = [(b, 0, T) for b in range(B)]
    else:
        cu = cu_seqlens.tolist()
        spans = [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    o = torch.zeros(B, T, HV, V, dtype=f64)
    final = torch.zeros(len(spans), HV, K, V, dtype=f64)
    for n, (b, start, end) in enumerate(spans):
        for h in range(HV):
            hq = h // (HV // H)
            S = torch.zeros(K, V, dtype=f64) if initial_state is None else initial_state[n, h].double().clone()
            for t in range(start, end):
                S = math.exp(g[b, t, h].item()) * S
                u = beta[b, t, h] * (v[b, t, h] - S.T @ k[b, t, hq])
                S = S + torch.outer(k[b, t, hq], u)
                o[b, t, h] = S.T @ (scale * q[b, t, hq])
            final[n, h] = S
    return o, final


# ------------------------------------------------------------------------------------------------
# gdn_recurrent against the naive loop
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("H,HV", [(2, 2), (2, 4), (1, 4), (3, 6)])
def test_recurrent_matches_naive(H, HV):
    # K != V so a transposed state cannot pass.
    x = make_inputs(2, 19, H, HV, 8, 6, random_state=True, mask_p=0.3, dtype=f64, seed=H * 10 + HV)
    o_ref, s_ref = naive(**x)
    o, s = gdn_recurrent(**x, compute_dtype=f64)
    assert o.dtype == f64 and s.dtype == f64
    assert o.shape == (2, 19, HV, 6) and s.shape == (2, HV, 8, 6)
    assert rel_rms(o, o_ref) < 1e-10
    assert rel_rms(s, s_ref) < 1e-10


def test_recurrent_matches_naive_varlen():
    lens = [3, 17, 1, 9]
    x = make_inputs(1, sum(lens), 2, 4, 8, 6, n_states=len(lens), random_state=True, dtype=f64, seed=7)
    cu = cu_from_lens(lens)
    o_ref, s_ref = naive(**x, cu_seqlens=cu)
    o, s = gdn_recurrent(**x, cu_seqlens=cu, compute_dtype=f64)
    assert o.shape == (1, sum(lens), 4, 6) and s.shape == (4, 4, 8, 6)
    assert rel_rms(o, o_ref) < 1e-10
    assert rel_rms(s, s_ref) < 1e-10


def test_recurrent_scale_and_l2norm():
    x = make_inputs(1, 11, 2, 2, 8, 6, normalize_qk=False, dtype=f64, seed=3)
    o, s = gdn_recurrent(**x, scale=0.37, qk_l2norm=True, compute_dtype=f64)
    # l2norm's contract puts eps=1e-6 inside the square root (a ~4e-7 relative effect here), so mirror it.
    nrm = lambda t: t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6)  # noqa: E731
    o_ref, s_ref = naive(**dict(x, q=nrm(x["q"]), k=nrm(x["k"])), scale=0.37)
    assert rel_rms(o, o_ref) < 1e-10
    assert rel_rms(s, s_ref) < 1e-10
    # and the normalisation really happened (inputs were not unit vectors)
    o_raw, _ = naive(**x, scale=0.37)
    assert rel_rms(o, o_raw) > 1e-2


def test_l2norm():
    x = torch.randn(3, 5, 7, dtype=f64)
    assert rel_rms(l2norm(x), x / x.norm(dim=-1, keepdim=True)) < 1e-6
    assert l2norm(x.float()).dtype == f32
    assert l2norm(x.bfloat16()).dtype == torch.bfloat16
    assert torch.equal(l2norm(torch.zeros(2, 4)), torch.zeros(2, 4))  # eps keeps zeros finite


# ------------------------------------------------------------------------------------------------
# gdn_chunk against gdn_recurrent
# ------------------------------------------------------------------------------------------------

BASE = dict(B=2, T=100, H=2, HV=4, K=32, V=32, gate_norm=1.0, mask_p=0.0, lens=None,
            qk_l2norm=False, random_state=False, chunk_size=64)
CHUNK_CASES = {
    "base": {},
    "gva1x4": dict(H=1, HV=4),
    "varlen": dict(B=1, lens=[5, 70, 1, 130]),
    "K60V60": dict(K=60, V=60),
    "K100V60": dict(K=100, V=60),
    "strong_decay": dict(gate_norm=0.1),
    "weak_decay": dict(gate_norm=10.0),
    "mask_p": dict(mask_p=0.5),
    "T_multiple": dict(T=128),
    "qk_l2norm": dict(qk_l2norm=True),
    "init_state": dict(random_state=True),
    "chunk16": dict(chunk_size=16),
    "everything": dict(B=1, lens=[5, 70, 1, 130], H=1, HV=4, K=100, V=60, mask_p=0.5, qk_l2norm=True,
                       random_state=True, chunk_size=16),
    "everything_strong": dict(B=1, lens=[33, 2, 97], K=60, V=60, gate_norm=0.1, random_state=True),
}


def _chunk_case(name: str):
    c = dict(BASE, **CHUNK_CASES[name])
    lens = c["lens"]
    T = sum(lens) if lens else c["T"]
    x = make_inputs(c["B"], T, c["H"], c["HV"], c["K"], c["V"], gate_norm=c["gate_norm"], mask_p=c["mask_p"],
                    n_states=len(lens) if lens else None, random_state=c["random_state"],
                    normalize_qk=not c["qk_l2norm"], seed=len(name))
    kw = dict(cu_seqlens=cu_from_lens(lens) if lens else None, qk_l2norm=c["qk_l2norm"])
    return x, kw, c["chunk_size"]


_ref_cache: dict = {}


def _fp64_reference(name: str):
    if name not in _ref_cache:
        x, kw, _ = _chunk_case(name)
        _ref_cache[name] = gdn_recurrent(**x, **kw, compute_dtype=f64)
    return _ref_cache[name]


@pytest.mark.parametrize("name", list(CHUNK_CASES))
def test_chunk_matches_recurrent_fp64(name):
    x, kw, C = _chunk_case(name)
    o_ref, s_ref = _fp64_reference(name)
    o, s = gdn_chunk(**x, **kw, compute_dtype=f64, chunk_size=C)
    assert o.dtype == f64 and s.dtype == f64 and o.shape == o_ref.shape and s.shape == s_ref.shape
    assert rel_rms(o, o_ref) < 1e-12  # measured ~3e-16
    assert rel_rms(s, s_ref) < 1e-12


@pytest.mark.parametrize("name", list(CHUNK_CASES))
def test_fp32_matches_fp64(name):
    # Both algorithms in fp32 against the fp64 recurrence (a stricter check than fp32 vs fp32).
    x, kw, C = _chunk_case(name)
    o_ref, s_ref = _fp64_reference(name)
    for o, s in (gdn_chunk(**x, **kw, chunk_size=C), gdn_recurrent(**x, **kw)):
        assert o.dtype == f32 and s.dtype == f32
        assert rel_rms(o, o_ref) < 1e-5
        assert rel_rms(s, s_ref) < 1e-5


def test_chunk_size_independent():
    x, kw, _ = _chunk_case("varlen")
    o_ref, s_ref = _fp64_reference("varlen")
    for C in (1, 7, 64, 256):
        o, s = gdn_chunk(**x, **kw, compute_dtype=f64, chunk_size=C)
        assert rel_rms(o, o_ref) < 1e-12 and rel_rms(s, s_ref) < 1e-12


def test_inputs_are_not_degenerate():
    # Guards the tests above: decay, beta and state must all matter, or agreement would prove little.
    # Weak decay and few tokens, so the initial state still shows in the final state.
    x = make_inputs(2, 20, 2, 4, 16, 16, gate_norm=10.0, random_state=True, seed=1)
    o, s = gdn_recurrent(**x, compute_dtype=f64)
    for change in (dict(g=torch.zeros_like(x["g"])), dict(beta=x["beta"] * 0.5), dict(initial_state=None)):
        o2, s2 = gdn_recurrent(**dict(x, **change), compute_dtype=f64)
        assert rel_rms(o2, o) > 1e-3 and rel_rms(s2, s) > 1e-3


# ------------------------------------------------------------------------------------------------
# varlen, output_final_state
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("solve", [gdn_recurrent, gdn_chunk])
def test_varlen_equals_separate_runs(solve):
    lens = [5, 0, 70, 1, 33]  # includes an empty sequence: its final state is its initial state
    x = make_inputs(1, sum(lens), 2, 4, 16, 12, n_states=len(lens), random_state=True, mask_p=0.2, seed=11)
    cu = cu_from_lens(lens)
    o, s = solve(**x, cu_seqlens=cu, compute_dtype=f64)
    for i, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        part = {n: x[n][:, a:b] for n in ("q", "k", "v", "g", "beta")}
        o_i, s_i = solve(**part, initial_state=x["initial_state"][i : i + 1], compute_dtype=f64)
        assert o_i.shape == (1, b - a, 4, 12)
        if b > a:
            assert rel_rms(o[:, a:b], o_i) < 1e-12
        assert rel_rms(s[i : i + 1], s_i) < 1e-12
    assert torch.equal(s[1], x["initial_state"][1].double())


@pytest.mark.parametrize("solve", [gdn_recurrent, gdn_chunk])
def test_output_final_state_false(solve):
    x = make_inputs(1, 9, 1, 2, 8, 8)
    o, s = solve(**x, output_final_state=False)
    assert s is None and o.shape == (1, 9, 2, 8)
    o2, _ = solve(**x)
    assert torch.equal(o, o2)


def test_varlen_validation():
    x = make_inputs(2, 8, 1, 1, 4, 4)
    with pytest.raises(ValueError):
        gdn_recurrent(**x, cu_seqlens=cu_from_lens([4, 4]))  # B must be 1
    x = make_inputs(1, 8, 1, 1, 4, 4)
    with pytest.raises(ValueError):
        gdn_chunk(**x, cu_seqlens=cu_from_lens([4, 3]))  # does not cover T


# ------------------------------------------------------------------------------------------------
# gdn_decode
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pool_dtype", [f32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("solve", [gdn_recurrent, gdn_chunk])
def test_decode(solve, T, pool_dtype):
    H, HV, K, V, S = 2, 4, 16, 8, 9
    slots = torch.tensor([7, 2, -1, 5, 0], dtype=torch.int32)
    B = slots.numel()
    x = make_inputs(B, T, H, HV, K, V, mask_p=0.2, seed=T)
    x.pop("initial_state")
    gen = torch.Generator().manual_seed(99)
    pool = torch.randn(S, HV, K, V, generator=gen).to(pool_dtype)
    before = pool.clone()
    ptr = pool.data_ptr()

    o = gdn_decode(solve, **x, state_pool=pool, slot_idx=slots)
    assert pool.data_ptr() == ptr and pool.dtype == pool_dtype  # updated in place
    assert o.dtype == f32 and o.shape == (B, T, HV, V)

    valid = (slots >= 0).nonzero().squeeze(1)
    live = slots[valid].long()
    # Expected: the recurrence run on the live sequences only, from their upcast slots.
    o_ref, s_ref = gdn_recurrent(**{n: t[valid] for n, t in x.items()}, initial_state=before[live].float())
    assert rel_rms(o[valid], o_ref) < 1e-5
    # bf16 pool: the written state carries bf16 rounding (~2e-3 relative RMS) against the exact one,
    # but must match the exact state cast to bf16 up to rare one-ulp ties.
    assert rel_rms(pool[live].float(), s_ref) < (1e-5 if pool_dtype == f32 else 4e-3)
    assert rel_rms(pool[live].float(), s_ref.to(pool_dtype).float()) < 1e-5
    assert not torch.equal(pool[live], before[live])  # the live slots did change

    untouched = torch.ones(S, dtype=torch.bool)
    untouched[live] = False  # includes slot 8: the padding index -1 must not alias the last slot
    assert torch.equal(pool[untouched], before[untouched])
    assert torch.equal(o[2], torch.zeros_like(o[2]))


def test_decode_all_padding_and_fp64():
    x = make_inputs(2, 1, 1, 2, 4, 4)
    x.pop("initial_state")
    pool = torch.randn(3, 2, 4, 4)
    before = pool.clone()
    o = gdn_decode(gdn_chunk, **x, state_pool=pool, slot_idx=torch.tensor([-1, -3], dtype=torch.int32),
                   compute_dtype=f64, chunk_size=16)
    assert o.dtype == f64 and torch.equal(o, torch.zeros_like(o)) and torch.equal(pool, before)


@pytest.mark.parametrize("pool_dtype", [f32, torch.bfloat16])
@pytest.mark.parametrize("solve", [gdn_recurrent, gdn_chunk])
def test_decode_per_token_slots_runs_token_by_token(solve, pool_dtype):
    """Speculative verify: start at the last accepted token's slot, write the state after every token."""
    H, HV, K, V, T, S = 1, 2, 8, 8, 3, 14
    slots = torch.tensor([[4, 0, 6], [-1, 9, 2], [-1, -1, -1], [11, 3, 13]], dtype=torch.int32)
    accepted = torch.tensor([1, 3, 2, 3], dtype=torch.int32)
    B = slots.shape[0]
    x = make_inputs(B, T, H, HV, K, V, seed=5)
    x.pop("initial_state")
    pool = torch.randn(S, HV, K, V, generator=torch.Generator().manual_seed(3)).to(pool_dtype)
    before = pool.clone()
    o = gdn_decode(solve, **x, state_pool=pool, slot_idx=slots, num_accepted_tokens=accepted)

    # by hand: each live sequence, one token at a time with gdn_recurrent, from its start slot
    want = before.clone()
    for b, start in ((0, 4), (1, 2), (3, 13)):
        state = before[start:start + 1].double()
        for t in range(T):
            o_t, state = gdn_recurrent(**{n: x[n][b:b + 1, t:t + 1] for n in ("q", "k", "v", "g", "beta")},
                                       initial_state=state, compute_dtype=f64)
            assert rel_rms(o[b, t], o_t[0, 0]) < 1e-5
            if slots[b, t] >= 0:  # row 1 skips the write of token 0
                want[slots[b, t]] = state[0].to(pool_dtype)
    assert torch.equal(o[2], torch.zeros_like(o[2]))  # its start slot is -1: padding
    assert rel_rms(pool.float(), want.float()) < 1e-6
    changed = (pool != before).flatten(1).any(1).nonzero().flatten().tolist()
    assert changed == sorted([4, 0, 6, 9, 2, 11, 3, 13])


@pytest.mark.parametrize("slots, accepted, needle", [
    ([[0, 1], [2, 3]], None, "needs num_accepted_tokens"),
    ([[0, 1], [2, 3]], [1, 3], "in 1..T=2"),
    ([[0, 1], [2, 1]], [1, 1], "repeats a non-negative slot"),
    ([[0, 1], [2, 9]], [1, 1], "out of range"),
    ([0, 1], [1, 1], "slot_idx must be [B]"),
])
def test_slot_layout_validation(slots, accepted, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        SlotLayout(torch.tensor(slots), 4, None if accepted is None else torch.tensor(accepted))


# ------------------------------------------------------------------------------------------------
# gate_from_raw
# ------------------------------------------------------------------------------------------------


def test_gate_from_raw():
    gen = torch.Generator().manual_seed(5)
    B, T, HV = 2, 7, 4
    a = (torch.randn(B, T, HV, generator=gen) * 8).bfloat16()  # wide enough to cross the threshold 20
    a[0, 0, 0] = 30.0
    b = torch.randn(B, T, HV, generator=gen).bfloat16()
    A_log = torch.log(torch.rand(HV, generator=gen) * 15 + 1)
    dt_bias = torch.rand(HV, generator=gen)
    g, beta = gate_from_raw(a, b, A_log, dt_bias)
    assert g.dtype == f32 and beta.dtype == f32 and g.shape == (B, T, HV)

    xa = a.double() + dt_bias.double()
    softplus = torch.where(xa > 20, xa, torch.log1p(torch.exp(xa)))
    g_ref = -torch.exp(A_log.double()) * softplus
    beta_ref = 1 / (1 + torch.exp(-b.double()))
    torch.testing.assert_close(g.double(), g_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(beta.double(), beta_ref, rtol=1e-6, atol=1e-6)
    assert (g <= 0).all()


# ------------------------------------------------------------------------------------------------
# device-agnostic (runs only where CUDA is available)
# ------------------------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    lens = [5, 70, 1, 130]
    x = make_inputs(1, sum(lens), 1, 4, 60, 60, n_states=len(lens), random_state=True, mask_p=0.5, seed=2)
    cu = cu_from_lens(lens)
    o_ref, s_ref = gdn_recurrent(**x, cu_seqlens=cu, compute_dtype=f64)
    xc = {n: (t.cuda() if t is not None else None) for n, t in x.items()}
    for solve in (gdn_recurrent, gdn_chunk):
        for cd, tol in ((f64, 1e-12), (f32, 1e-5)):
            o, s = solve(**xc, cu_seqlens=cu.cuda(), compute_dtype=cd)
            assert o.is_cuda and s.is_cuda
            assert rel_rms(o.cpu(), o_ref) < tol and rel_rms(s.cpu(), s_ref) < tol
    pool = torch.randn(9, 4, 60, 60, device="cuda").bfloat16()
    before = pool.clone()
    d = make_inputs(3, 2, 1, 4, 60, 60, seed=4)
    d.pop("initial_state")
    o = gdn_decode(gdn_chunk, **{n: t.cuda() for n, t in d.items()}, state_pool=pool,
                   slot_idx=torch.tensor([4, -1, 8], dtype=torch.int32, device="cuda"))
    assert torch.equal(o[1], torch.zeros_like(o[1]))
    keep = torch.tensor([i not in (4, 8) for i in range(9)], device="cuda")
    assert torch.equal(pool[keep], before[keep]) and not torch.equal(pool[4], before[4])


def test_tf32_truncation_drops_the_low_mantissa_bits_toward_zero() -> None:
    """The fp32 floor reads operands as a tensor core does for one TF32 product: 10 mantissa bits kept, the rest
    dropped toward zero (never rounded up), non-finite values unchanged."""
    from gdnbench.reference import truncate_to_tf32

    x = torch.randn(4096, dtype=torch.float32) * torch.logspace(-20, 20, 4096)
    t = truncate_to_tf32(x)
    assert (t.view(torch.int32) & ((1 << 13) - 1) == 0).all()
    assert (t.abs() <= x.abs()).all() and (torch.sign(t) == torch.sign(x)).all()
    assert ((x - t).abs() < x.abs() * 2.0**-10).all()
    assert ((x - t) != 0).float().mean() > 0.99  # fresh random values almost never fit in 10 bits
    special = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0])
    assert torch.equal(truncate_to_tf32(special)[:2], special[:2]) and truncate_to_tf32(special)[2].isnan()

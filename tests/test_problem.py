"""Canonical inputs: deterministic per (seed, case id), in docs/design.md's shapes, dtypes and ranges."""

import math

import pytest
import torch
import torch.nn.functional as F

from gdnbench.problem import make_problem, seq_lens
from gdnbench.roofline import traffic
from gdnbench.suite import Case


def same(a, b):
    for name, x in a.tensors().items():
        y = b.tensors()[name]
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y), name
        else:
            assert x == y, name


def test_same_seed_same_inputs_other_seed_other_inputs():
    c = Case(B=2, T=9, H=2, HV=4, D=8, initial_state="random", mask_p=0.3)
    same(make_problem(c, 7), make_problem(c, 7))
    assert not torch.equal(make_problem(c, 7).q, make_problem(c, 8).q)


def test_inputs_depend_on_the_case_id_not_on_suite_order():
    a, b = Case(B=1, T=8, H=1, D=8), Case(B=1, T=8, H=1, D=8, dtype="fp32")
    assert not torch.equal(make_problem(a, 0).k.float(), make_problem(b, 0).k)


def test_prefill_shapes_dtypes_and_recipe():
    c = Case(B=3, T=50, H=2, HV=4, K=12, V=20, dtype="fp16", gate_norm=10, mask_p=0.5, initial_state="zeros")
    p = make_problem(c, 0)
    assert p.q.shape == (3, 50, 2, 12) and p.v.shape == (3, 50, 4, 20) and p.g.shape == (3, 50, 4)
    assert p.q.dtype == torch.float16 and p.beta.dtype == torch.float16 and p.g.dtype == torch.float32
    assert torch.allclose(p.q.float().norm(dim=-1), torch.ones(3, 50, 2), atol=2e-3)  # qk_l2norm: pre
    assert (p.v >= 0).all() and (p.v <= 1).all()
    assert (p.beta >= 0.5).all() and (p.beta <= 0.74).all()  # sigmoid(U(0,1))
    assert (p.g <= 0).all() and p.g.min() >= torch.log(torch.sigmoid(torch.tensor(0.0))) / 10 - 1e-6
    zero_share = (p.g == 0).float().mean().item()
    assert 0.4 < zero_share < 0.6
    assert p.initial_state.shape == (3, 4, 12, 20) and p.initial_state.abs().sum() == 0
    assert p.scale == 12**-0.5


def test_kernel_l2norm_leaves_inputs_raw():
    p = make_problem(Case(B=1, T=30, H=1, D=16, qk_l2norm="kernel", dtype="fp32"), 0)
    assert p.q.norm(dim=-1).max() > 1.2


def test_varlen_split_is_seeded_and_exact():
    c = Case(mode="varlen", num_seqs=7, total_tokens=100, H=1, D=8)
    lens = seq_lens(c, 3)
    assert len(lens) == 7 and sum(lens) == 100 and min(lens) >= 1
    assert lens == seq_lens(c, 3) and lens != seq_lens(c, 4)
    p = make_problem(c, 3)
    assert p.q.shape[:2] == (1, 100)
    assert p.cu_seqlens.tolist() == [0, *torch.tensor(lens).cumsum(0).tolist()]
    assert p.cu_seqlens.dtype == torch.int64


def test_raw_gating_derives_g_and_beta():
    p = make_problem(Case(B=2, T=5, H=1, HV=2, D=8, gating="raw", dtype="fp32"), 0)
    g = -torch.exp(p.A_log) * torch.nn.functional.softplus(p.a + p.dt_bias)
    assert torch.allclose(p.g, g) and torch.allclose(p.beta, torch.sigmoid(p.b))
    assert ((p.A_log.exp() >= 1) & (p.A_log.exp() <= 16)).all()


@pytest.mark.parametrize("gating", ["pre", "raw"])
def test_half_life_regimes(gating):
    """Each value head's mean log decay is -ln 2 / its half-life, drawn within the range; tokens vary around it;
    raw gating derives the same regime through A_log and dt_bias."""
    lo, hi = 10.0, 1e4
    p = make_problem(Case(B=1, T=20000, H=1, HV=6, D=4, dtype="fp32", gating=gating, half_life=[lo, hi]), 0)
    half_lives = -math.log(2) / p.g[0].mean(0)
    assert ((half_lives > lo * 0.95) & (half_lives < hi * 1.05)).all(), half_lives
    assert half_lives.max() / half_lives.min() > 10  # log-uniform across heads, not one value
    spread = p.g[0] / p.g[0].mean(0)
    assert (spread > 0).all() and spread.max() > 2 and spread.min() < 0.5  # per-token variation
    if gating == "raw":
        assert torch.equal(p.g, -torch.exp(p.A_log) * F.softplus(p.a.float() + p.dt_bias))
    again = make_problem(Case(B=1, T=20000, H=1, HV=6, D=4, dtype="fp32", gating=gating, half_life=[lo, hi]), 0)
    assert torch.equal(p.g, again.g)


@pytest.mark.parametrize("gating", ["pre", "raw"])
def test_no_decay_and_a_single_half_life(gating):
    none = make_problem(Case(B=2, T=50, H=1, HV=2, D=4, gating=gating, half_life=".inf"), 0)
    assert (none.g == 0).all() and torch.isfinite(none.beta).all()
    one = make_problem(Case(B=1, T=20000, H=1, HV=2, D=4, gating=gating, half_life=100), 0)
    assert torch.allclose(-math.log(2) / one.g[0].mean(0), torch.full((2,), 100.0), rtol=0.05)


def test_half_life_composes_with_mask_p():
    p = make_problem(Case(B=1, T=4000, H=1, HV=2, D=4, half_life=[1, 10], mask_p=0.5), 0)
    assert 0.45 < (p.g == 0).float().mean() < 0.55 and (p.g <= 0).all()


def test_decode_pool_and_slots():
    c = Case(op="decode", B=4, H=1, HV=2, D=8, pool_size=32, slots="scattered", state_dtype="bf16")
    p = make_problem(c, 0)
    assert p.state_pool.shape == (32, 2, 8, 8) and p.state_pool.dtype == torch.bfloat16
    assert p.slot_idx.dtype == torch.int32 and len(set(p.slot_idx.tolist())) == 4
    assert p.slot_idx.tolist() != [0, 1, 2, 3]
    assert p.initial_state is None and p.q.shape == (4, 1, 1, 8)
    assert p.state_pool.float().std() > 0.5  # random pool: a stray write is visible


def test_per_token_slots_problem():
    c = Case(op="decode", B=5, T=3, H=1, D=8, per_token_slots=True, pool_size=40, slots="scattered")
    p = make_problem(c, 0)
    assert p.slot_idx.shape == (5, 3) and p.slot_idx.dtype == torch.int32
    assert len(set(p.slot_idx.flatten().tolist())) == 15 and p.slot_idx.max() < 40
    acc = p.num_accepted_tokens
    assert acc.shape == (5,) and acc.dtype == torch.int32 and ((acc >= 1) & (acc <= 3)).all()
    assert make_problem(Case(op="decode", B=2, H=1, D=8), 0).num_accepted_tokens is None


def test_roofline_matches_design_figures():
    nbytes, flops = traffic(Case(B=1, T=65536, H=16, HV=32, D=128))
    assert abs(flops / 1e12 - 0.38) < 0.01 and abs(nbytes / 1e9 - 1.6) < 0.05
    nbytes, _ = traffic(Case(op="decode", B=256, H=16, HV=32, D=128))
    assert abs(nbytes / 1e9 - 1.07) < 0.02


def test_a_decode_pool_fills_every_slot_and_draws_only_the_used_ones_from_the_case():
    case = Case(op="decode", B=3, H=1, HV=2, D=8, pool_size=50, slots="scattered", initial_state="zeros")
    p, again = make_problem(case, 0), make_problem(case, 0)
    assert torch.equal(p.state_pool, again.state_pool)  # a function of (seed, case id)
    used = torch.zeros(case.pool_size, dtype=torch.bool)
    used[p.slot_idx.long()] = True
    assert (p.state_pool[used] == 0).all()
    # the other slots are not zero: a kernel writing zeros (or anything) to a slot it does not own shows
    assert (p.state_pool[~used].flatten(1).abs().sum(1) > 0).all()
    other = make_problem(Case(op="decode", B=3, H=1, HV=2, D=8, pool_size=50, slots="scattered",
                              initial_state="random"), 0)
    assert not torch.equal(other.state_pool[used], p.state_pool[used])

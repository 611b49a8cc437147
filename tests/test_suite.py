"""Suite parsing: expansion, ids, defaults, and every error path (file, case and field named)."""

import pytest

from gdnbench.suite import Case, SuiteError, load_suite, parse_suite, shipped_suites


def suite(**kw):
    raw = {"name": "t", "defaults": {"H": 2, "D": 16}, **kw}
    return parse_suite(raw, path="t.yaml")


def test_axes_product_and_explicit_cases():
    s = suite(cases=[{"B": 1, "T": 8}], axes={"B": [1, 2], "T": [16, 32], "dtype": ["fp16", "fp32"]})
    assert len(s.cases) == 1 + 2 * 2 * 2
    assert len({c.id for c in s.cases}) == len(s.cases)


def test_case_level_axes_and_list_of_grids():
    s = suite(cases=[{"B": 1, "T": 8, "axes": {"D": [32, 64]}}],
              axes=[{"B": [1], "T": [4]}, {"op": ["decode"], "B": [3, 4]}])
    assert [c.K for c in s.cases[:2]] == [32, 64]
    assert [c.op for c in s.cases[-2:]] == ["decode", "decode"]


def test_id_is_stable_and_named_like_the_issue():
    c = Case(B=4, T=2048, H=8, D=64)
    assert c.id == "prefill/padded/B=4,T=2048,H=8,HV=8,K=64,V=64,bf16,gn=1,mp=0"
    assert Case(B=4, T=2048, H=8, HV=8, K=64, V=64, dtype="bf16").id == c.id


def test_non_default_fields_change_the_id():
    base = Case(B=1, T=8, H=2, D=16)
    variants = [dict(state_dtype="bf16"), dict(scale=0.1), dict(qk_l2norm="kernel"), dict(gating="raw"),
                dict(initial_state="random"), dict(output_final_state=False), dict(HV=4), dict(mask_p=0.5)]
    ids = {Case(B=1, T=8, H=2, D=16, **v).id for v in variants}
    assert base.id not in ids and len(ids) == len(variants)


def test_varlen_and_decode_resolution():
    v = Case(mode="varlen", seq_lens=[3, 5], H=1, D=8)
    assert (v.N, v.tokens, v.num_seqs, v.total_tokens) == (2, 8, 2, 8)
    d = Case(op="decode", B=3, H=1, D=8)
    assert (d.T, d.pool_size, d.initial_state) == (1, 3, "random")
    assert Case(B=1, T=2, H=1, D=8).initial_state == "none"
    spec = Case(op="decode", B=3, T=4, H=1, D=8, per_token_slots=True)
    assert (spec.pool_size, spec.state_writes) == (12, 4) and "spec=per-token" in spec.id
    assert "pool=" not in spec.id and "pool=12" in Case(op="decode", B=3, T=4, H=1, D=8, pool_size=12).id


def test_shipped_suites_load():
    names = shipped_suites()
    assert {"smoke", "parity", "qwen3-next"} <= set(names)
    for name in names:
        assert load_suite(name).cases
    assert len(load_suite("parity").cases) == 27


def test_half_life_forms_and_ids():
    base = dict(B=1, T=8, H=1, D=8)
    assert Case(**base, half_life=[1, 1e5]).half_life == (1, 1e5)
    assert Case(**base, half_life=100).half_life == (100, 100)
    assert Case(**base, half_life=float("inf")).id.endswith(",hl=inf")
    assert Case(**base, half_life=[1, 1e5]).id.endswith(",hl=1-100000")
    assert "hl=" not in Case(**base).id  # FLA's recipe keeps the ids of existing cases
    raw = suite(cases=[{"B": 1, "T": 8, "half_life": ".inf", "gating": "raw", "mask_p": 0}])
    assert raw.cases[0].half_life == (float("inf"), float("inf"))


@pytest.mark.parametrize("kw, needles", [
    (dict(cases=[{"B": 1, "T": 8, "bogus": 1}]), ["cases[0]", "bogus", "unknown field"]),
    (dict(cases=[{"B": "four", "T": 8}]), ["cases[0]", "'B'", "four"]),
    (dict(cases=[{"B": 1, "T": 8, "H": 3, "HV": 4}]), ["cases[0]", "HV=4", "multiple of H=3"]),
    (dict(cases=[{"B": -1, "T": 8}]), ["cases[0]", "'B'", "greater than or equal to 1"]),
    (dict(cases=[{"B": 1, "T": 8}, {"B": 1, "T": 0}]), ["cases[1]", "'T'"]),
    (dict(cases=[{"B": 1, "T": 8, "dtype": "fp8"}]), ["cases[0]", "'dtype'", "fp8"]),
    (dict(cases=[{"mode": "varlen", "num_seqs": 3}]), ["cases[0]", "total_tokens"]),
    (dict(cases=[{"mode": "varlen", "seq_lens": [3, 0]}]), ["cases[0]", "seq_lens"]),
    (dict(cases=[{"mode": "varlen", "B": 2, "seq_lens": [3]}]), ["cases[0]", "not B/T"]),
    (dict(cases=[{"op": "decode", "B": 4, "pool_size": 2}]), ["cases[0]", "pool_size=2"]),
    (dict(cases=[{"op": "decode", "B": 4, "T": 2, "per_token_slots": True, "pool_size": 6}]),
     ["cases[0]", "pool_size=6", "8 slots"]),
    (dict(cases=[{"op": "decode", "B": 4, "per_token_slots": True}]), ["cases[0]", "T >= 2"]),
    (dict(cases=[{"B": 4, "T": 8, "per_token_slots": True}]), ["cases[0]", "per_token_slots are for decode"]),
    (dict(cases=[{"B": 1, "T": 8, "gating": "raw", "gate_norm": 2}]), ["cases[0]", "gating: raw"]),
    (dict(cases=[{"B": 1, "T": 8}, {"B": 1, "T": 8}]), ["cases[1]", "duplicate case id"]),
    (dict(cases=[{"B": 1, "T": 8, "half_life": [10, 1]}]), ["cases[0]", "'half_life'", "0 < lo <= hi"]),
    (dict(cases=[{"B": 1, "T": 8, "half_life": [1, ".inf"]}]), ["cases[0]", "'half_life'", "inf alone"]),
    (dict(cases=[{"B": 1, "T": 8, "half_life": 0}]), ["cases[0]", "'half_life'"]),
    (dict(cases=[{"B": 1, "T": 8, "half_life": 5, "gate_norm": 2}]), ["cases[0]", "give one of them"]),
    (dict(axes={"B": [1, "x"], "T": [8]}), ["axes (combination 1)", "'B'"]),
    (dict(axes={"B": 3}), ["axes", "'B'", "non-empty list"]),
    (dict(cases=[{"B": 1, "T": 8}], backends=["torch.chunk"], baseline="torch.recurrent"), ["baseline"]),
    (dict(cases=[{"B": 1, "T": 8}], seed="abc"), ["suite", "'seed'"]),
    (dict(cases=[{"B": 1, "T": 8}], timing={"timer": "fast"}), ["timing.timer"]),
    (dict(cases=[{"B": 1, "T": 8}], tolerances={"bf16": -1}), ["tolerances.bf16"]),
    (dict(cases=[{"B": 1, "T": 8}], colour="red"), ["unknown suite key", "colour"]),
    (dict(cases=[{"B": 1, "T": 8, "Hv": 4}]), ["cases[0]", "field 'Hv': unknown field; did you mean 'HV'?"]),
    (dict(cases=[{"B": 1, "T": 8, "halflife": 4}]), ["did you mean 'half_life'?"]),
    (dict(cases=[{"B": 1, "T": 8}], timing={"warmpu": 2}), ["'timing.warmpu': unknown field; did you mean 'warmup'?"]),
    (dict(cases=[{"B": 1, "T": 8}], backend=["torch.chunk"]), ["unknown suite key", "did you mean 'backends'?"]),
    (dict(cases=[{"B": 1, "T": 8, "zzz": 4}]), ["field 'zzz': unknown field\n"]),
    (dict(), ["no cases"]),
    (dict(cases=["B=1"]), ["cases[0]", "mapping"]),
])
def test_errors_name_file_case_and_field(kw, needles):
    with pytest.raises(SuiteError) as info:
        suite(**kw)
    msg = str(info.value)
    assert msg.startswith("t.yaml")
    for needle in needles:
        assert needle in msg, (needle, msg)


def test_bad_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ncases: [ {B: 1,\n")
    with pytest.raises(SuiteError, match="bad.yaml: not valid YAML"):
        load_suite(bad)
    with pytest.raises(SuiteError, match="no shipped suite"):
        load_suite(tmp_path / "nope.yaml")
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(SuiteError, match="scalar.yaml: a suite is a YAML mapping"):
        load_suite(scalar)
    with pytest.raises(SuiteError, match="a directory; a suite is a YAML file"):
        load_suite(tmp_path)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(bytes(range(128, 256)))
    with pytest.raises(SuiteError, match="binary.yaml: cannot read it"):
        load_suite(binary)


def test_baseline_per_op():
    s = suite(cases=[{"B": 1, "T": 8}], backends=["torch.chunk", "torch.recurrent"],
              baseline={"prefill": "torch.chunk", "decode": "torch.recurrent"})
    assert s.baselines() == {"prefill": "torch.chunk", "decode": "torch.recurrent"}
    assert suite(cases=[{"B": 1, "T": 8}], backends=["torch.chunk"], baseline="torch.chunk").baselines() == {
        "prefill": "torch.chunk", "decode": "torch.chunk"}
    with pytest.raises(SuiteError, match="baseline 'torch.nope'"):
        suite(cases=[{"B": 1, "T": 8}], backends=["torch.chunk"], baseline={"decode": "torch.nope"})
    with pytest.raises(SuiteError, match="baseline"):
        suite(cases=[{"B": 1, "T": 8}], backends=["torch.chunk"], baseline={"verify": "torch.chunk"})


def test_envelope_suite_spans_the_bundled_kernels_envelope():
    """suites/envelope.yaml: GVA ratios that are not powers of two, K != V, head dims 64 to 256, the three input
    dtypes, prefill of 1 to 65536 tokens a sequence, packs of 16 and 256 sequences, the gate regimes on the long
    prefills, decode on fp32 and bf16 pools; every bundled path and the peers listed."""
    envelope = load_suite("envelope")
    cases = envelope.cases
    prefill = [c for c in cases if c.op == "prefill"]
    assert any((c.HV // c.H) & (c.HV // c.H - 1) for c in cases)  # a ratio that is not a power of two
    assert any(c.K != c.V for c in cases) and {64, 256} <= {c.K for c in cases}
    assert {"bf16", "fp16", "fp32"} == {c.dtype for c in cases}
    padded = [c.T for c in prefill if c.mode == "padded" and c.B == 1]
    assert min(padded) == 1 and max(padded) == 65536
    assert {16, 256} <= {c.N for c in prefill if c.mode == "varlen"}
    assert {(float("inf"), float("inf")), (1, 100000), None} <= {c.half_life for c in prefill if c.T == 16384}
    assert {"fp32", "bf16"} == {c.state_dtype for c in cases if c.op == "decode"}
    assert {"triton.chunk_fused", "triton.chunk", "triton.recurrent", "fla.chunk", "flashinfer.prefill",
            "flashqla.chunk", "flashinfer.decode"} <= set(envelope.backends)

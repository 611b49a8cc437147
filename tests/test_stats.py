import numpy as np
import pytest

from gdnbench.stats import Summary, median_ci, summarize


def test_summarize_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    x = rng.lognormal(mean=3.0, sigma=0.4, size=257)
    s = summarize(x.tolist())
    assert s.n == 257
    assert s.median == pytest.approx(np.median(x))
    assert s.p95 == pytest.approx(np.percentile(x, 95))
    assert s.min == x.min() and s.max == x.max()
    assert s.mean == pytest.approx(x.mean())
    assert s.stdev == pytest.approx(x.std(ddof=1))
    assert s.iqr == pytest.approx(np.percentile(x, 75) - np.percentile(x, 25))


def test_summarize_single_sample_and_empty() -> None:
    s = summarize([4.0])
    assert (s.n, s.median, s.p95, s.stdev, s.iqr) == (1, 4.0, 4.0, 0.0, 0.0)
    with pytest.raises(ValueError):
        summarize([])


def test_as_dict_keys_and_suffix() -> None:
    s = summarize([1.0, 2.0, 3.0])
    d = s.as_dict()
    assert d == {
        "n": 3,
        "median_us": 2.0,
        "p95_us": s.p95,
        "min_us": 1.0,
        "max_us": 3.0,
        "mean_us": 2.0,
        "stdev_us": 1.0,
        "iqr_us": 1.0,
    }
    fields = [k for k in Summary.__dataclass_fields__ if k != "n"]
    assert set(s.as_dict(suffix="_ms")) == {"n", *(f"{k}_ms" for k in fields)}


def test_median_ci_coverage() -> None:
    # Exponential(1) has median ln 2; the order-statistic interval at n=50 covers it ~96.7%.
    rng = np.random.default_rng(1)
    true_median = np.log(2.0)
    draws = 400
    hits = 0
    for _ in range(draws):
        lo, hi = median_ci(rng.exponential(1.0, size=50).tolist())
        hits += lo <= true_median <= hi
    assert 0.9 <= hits / draws <= 0.99


def test_median_ci_narrows_with_n() -> None:
    rng = np.random.default_rng(2)
    widths = []
    for n in (20, 200, 2000):
        lo, hi = median_ci(rng.normal(100.0, 5.0, size=n).tolist())
        assert lo <= hi
        widths.append(hi - lo)
    assert widths[0] > widths[1] > widths[2]


def test_median_ci_known_ranks_and_tiny_n() -> None:
    x = [float(v) for v in range(1, 11)]  # n=10: ranks 2 and 9 at 95% (standard sign-test table)
    assert median_ci(x) == (2.0, 9.0)
    assert median_ci(list(reversed(x))) == (2.0, 9.0)
    assert median_ci([3.0, 1.0, 2.0, 5.0, 4.0]) == (1.0, 5.0)  # n=5: no ranks reach 95%
    assert median_ci([7.0]) == (7.0, 7.0)
    with pytest.raises(ValueError):
        median_ci([])
    with pytest.raises(ValueError):
        median_ci([1.0, 2.0], confidence=1.0)


def test_a_paired_ratio_is_the_median_per_round_ratio_and_cancels_the_drift_both_sides_share() -> None:
    """Interleaved timing: sample i of A and of B come from round i, and drift (clocks, heat) moves both.
    The per-round ratio cancels it, so its interval is tight; resampling each side on its own is not."""
    from gdnbench.stats import median_ratio_ci

    rng = np.random.default_rng()  # fresh inputs every run
    covered, trials = 0, 40
    for t in range(trials):
        drift = rng.uniform(1.0, 3.0, 400)  # a round's slowdown, shared by its two samples
        true = rng.uniform(0.5, 2.0)
        a = 100.0 * drift * rng.normal(1.0, 0.002, drift.size)
        b = a / true * rng.normal(1.0, 0.002, drift.size)
        ratio, lo, hi = median_ratio_ci(a, b, paired=True)
        assert ratio == np.median(a / b) and lo <= ratio <= hi
        covered += lo <= true <= hi
        if t == 0:
            _, ulo, uhi = median_ratio_ci(a, b)
            assert (hi - lo) < (uhi - ulo) / 5
    assert covered >= 31  # nominal 95%: 38 of 40; 30 or fewer has probability 2e-5
    with pytest.raises(ValueError, match="one of each per round"):
        median_ratio_ci(a, b[:-1], paired=True)


def test_a_paired_ratio_covers_1_when_the_two_sides_differ_in_shape_but_not_round_by_round() -> None:
    """An A/A run: the two series' distributions differ in shape (B's fast rounds stretch upwards, as
    placement can do), yet every round's ratio is 1 within noise. The ratio of medians is then off 1; the
    median per-round ratio is not."""
    from gdnbench.stats import median_ratio_ci

    rng = np.random.default_rng()  # fresh inputs every run
    covered, trials, n = 0, 40, 400
    for _ in range(trials):
        slow = rng.random(n) < 0.3  # bimodal, skewed drift: 70% fast rounds with a tail, 30% slow ones
        a = 100.0 * np.where(slow, rng.normal(1.05, 0.01, n), 1.0 + rng.exponential(0.005, n))
        z = rng.normal(0.0, 1.0, n)
        noise = 1.0 + np.where(slow | (z < 0), 1e-4, 4e-3) * z  # median 1 in every round, skewed in fast ones
        b = a * noise
        ratio, lo, hi = median_ratio_ci(a, b, paired=True)
        assert np.median(a) / np.median(b) < lo  # the shapes differ: the ratio of medians misleads
        covered += lo <= 1.0 <= hi
    assert covered >= 31

"""Summary statistics over raw timing samples (docs/design.md, "Measurement")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from math import comb, erfc

import numpy as np


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    p95: float
    min: float
    max: float
    mean: float
    stdev: float
    iqr: float

    def as_dict(self, suffix: str = "_us") -> dict[str, float | int]:
        """Flat dict for report rows: ``{"n": .., "median_us": .., ...}`` (``n`` carries no unit)."""
        return {k if k == "n" else k + suffix: v for k, v in asdict(self).items()}


def summarize(samples: Sequence[float]) -> Summary:
    """Median, p95, min, max, mean, stdev (ddof=1; 0 for one sample) and IQR of ``samples``.

    Percentiles use linear interpolation between order statistics (numpy's default).
    """
    x = np.asarray(samples, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError("summarize needs a non-empty 1-D sequence of samples")
    p25, p50, p75, p95 = np.percentile(x, [25, 50, 75, 95])
    return Summary(
        n=int(x.size),
        median=float(p50),
        p95=float(p95),
        min=float(x.min()),
        max=float(x.max()),
        mean=float(x.mean()),
        stdev=float(x.std(ddof=1)) if x.size > 1 else 0.0,
        iqr=float(p75 - p25),
    )


@lru_cache(maxsize=1024)  # the stopping rule asks again for every batch
def _median_rank(n: int, confidence: float) -> int:
    """Largest 1-based rank j with P(Binomial(n, 1/2) <= j - 1) <= (1 - confidence) / 2, or 0 if none.

    [x_(j), x_(n+1-j)] then covers the median with probability >= confidence for any
    continuous distribution. Exact integer arithmetic: 2**n overflows floats past n ~ 1000.
    """
    budget = (1.0 - confidence) / 2.0
    total = 2**n
    cdf = 0  # numerator of P(B <= j - 1)
    j = 0
    while j < (n + 1) // 2:
        cdf += comb(n, j)
        if cdf / total > budget:
            break
        j += 1
    return j


def median_ci(samples: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval of the median from order statistics.

    Uses the binomial (sign-test) ranks, so coverage is at least ``confidence`` with no
    assumption on the distribution (conservative: the ranks are discrete). When ``n`` is
    too small for any pair of ranks to reach ``confidence`` (n <= 5 at 95%), returns (min, max).
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    x = np.sort(np.asarray(samples, dtype=np.float64))
    if x.ndim != 1 or x.size == 0:
        raise ValueError("median_ci needs a non-empty 1-D sequence of samples")
    n = int(x.size)
    j = _median_rank(n, confidence)
    if j == 0:
        return float(x[0]), float(x[-1])
    return float(x[j - 1]), float(x[n - j])


def mann_whitney_u(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of the Mann-Whitney U test that ``a`` and ``b`` come from one distribution.

    Normal approximation with tie correction and continuity correction (scipy's
    ``mannwhitneyu(method="asymptotic")``), in numpy so the core needs no scipy. Timing samples
    are rarely fewer than ~10 per side, where the approximation is good; with fewer it errs
    towards large p-values, so a tiny sample never looks significant.
    """
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    if x.ndim != 1 or y.ndim != 1 or x.size == 0 or y.size == 0:
        raise ValueError("mann_whitney_u needs two non-empty 1-D sequences of samples")
    n1, n2 = x.size, y.size
    n = n1 + n2
    pooled = np.concatenate([x, y])
    order = np.argsort(pooled, kind="mergesort")
    sorted_ = pooled[order]
    starts = np.flatnonzero(np.r_[True, sorted_[1:] != sorted_[:-1], True])
    ties = np.diff(starts)  # size of each group of equal values
    ranks = np.empty(n)
    ranks[order] = np.repeat(starts[:-1] + (ties + 1) / 2, ties)  # average 1-based rank per group
    u1 = ranks[:n1].sum() - n1 * (n1 + 1) / 2
    u = max(u1, n1 * n2 - u1)
    var = n1 * n2 / 12 * ((n + 1) - (ties**3 - ties).sum() / (n * (n - 1))) if n > 1 else 0.0
    if var <= 0:
        return 1.0  # every value equal: no evidence of a difference
    z = (u - n1 * n2 / 2 - 0.5) / np.sqrt(var)
    return float(min(1.0, erfc(z / np.sqrt(2))))


def median_ratio_ci(a: Sequence[float], b: Sequence[float], confidence: float = 0.95, n_boot: int = 2000,
                    seed: int = 0, paired: bool = False) -> tuple[float, float, float]:
    """(ratio, lo, hi): a's time over b's with a seeded bootstrap percentile interval.

    Unpaired (two separate runs): median(a) / median(b), each side resampled on its own. ``paired``: sample i
    of a and of b come from round i of interleaved timing, so the ratio is median(a_i / b_i) over the rounds,
    rounds resampled; the per-round ratio cancels what a round's two samples share (clocks, heat, queueing).
    The fixed seed makes the same samples give the same interval every time.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    if x.ndim != 1 or y.ndim != 1 or x.size == 0 or y.size == 0:
        raise ValueError("median_ratio_ci needs two non-empty 1-D sequences of samples")
    rng = np.random.default_rng(seed)
    if paired:
        if x.size != y.size:
            raise ValueError(f"paired samples need one of each per round, got {x.size} and {y.size}")
        r = x / y
        point, boot = float(np.median(r)), _bootstrap_medians(r, n_boot, rng)
    else:
        point = float(np.median(x) / np.median(y))
        boot = _bootstrap_medians(x, n_boot, rng) / _bootstrap_medians(y, n_boot, rng)
    tail = (1.0 - confidence) / 2 * 100
    lo, hi = np.percentile(boot, [tail, 100 - tail])
    return point, float(lo), float(hi)


def _bootstrap_medians(x: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Medians of ``n_boot`` resamples of ``x``, a block at a time so memory stays ~32 MB."""
    block = max(1, 2**22 // x.size)
    return np.concatenate([np.median(x[rng.integers(0, x.size, (min(block, n_boot - i), x.size))], axis=1)
                           for i in range(0, n_boot, block)])

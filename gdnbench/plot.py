"""Figures of a saved run: median latency per case for each backend, and speedups vs the baseline.

matplotlib is an optional extra (``gdnbench[plot]``), imported only when a figure is built. Figures are
drawn on an Agg canvas directly (no pyplot), so nothing needs a display and no global state changes.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from gdnbench.report import short_labels, table_grid
from gdnbench.results import Status

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

INSTALL_HINT = "pip install gdnbench[plot]"
# tab10 without its red: red is kept for rows that do not pass
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
MARKERS = ("o", "s", "^", "D", "v", "P", "*", "<", ">", "h")  # no 'x': that marks failures
FAIL_COLOR = "#d62728"
BAND = 0.08  # height (axes fraction) of the band for rows without a latency


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotUnavailable(f"plots need matplotlib, which is not installed: {INSTALL_HINT}") from None


def backend_styles(backends: Sequence[str]) -> dict[str, tuple[str, str]]:
    """(color, marker) per backend, by its place in the run, the same in every panel."""
    return {b: (COLORS[i % len(COLORS)], MARKERS[i % len(MARKERS)]) for i, b in enumerate(backends)}


def build_figure(df: pd.DataFrame, meta: dict[str, Any]) -> Figure:
    """Two panels sharing the case axis: latency (log scale) above, speedup vs the baseline below."""
    require_matplotlib()
    from matplotlib.figure import Figure

    cases = list(dict.fromkeys(df["case_id"]))
    backends = list(dict.fromkeys(df["backend"]))
    styles = backend_styles(backends)
    labels, shared = short_labels(cases)
    xpos = {c: i for i, c in enumerate(cases)}

    # wide enough that rotated labels do not collide; capped so a huge suite stays a sane PNG
    fig = Figure(figsize=(min(max(10.0, 0.45 * len(cases) + 5), 48), 10), layout="constrained")
    lat, spd = fig.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    title = table_grid(df, meta)[0]
    fig.suptitle(title + (f"\nevery case: {shared}" if shared else ""), fontsize=12)

    _latency_panel(lat, df, backends, styles, xpos)
    _speedup_panel(spd, df, backends, styles, xpos)

    spd.set_xlim(-0.6, len(cases) - 0.4)
    spd.set_xticks(range(len(cases)), labels, rotation=40, ha="right", rotation_mode="anchor", fontsize=8)
    for ax in (lat, spd):
        ax.grid(True, axis="x", color="#dddddd", linewidth=0.6)  # ties each marker to its case label
        ax.set_axisbelow(True)
    return fig


def png_bytes(df: pd.DataFrame, meta: dict[str, Any], dpi: int = 110) -> bytes:
    """The run's figure as PNG bytes (for a file or a data: URI)."""
    fig = build_figure(df, meta)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)  # attaches itself: savefig below renders with Agg whatever the default backend
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def _num(v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f if f > 0 else math.nan  # nothing <= 0 belongs on a log axis


def _latency_panel(ax: Axes, df: pd.DataFrame, backends: list[str], styles: dict[str, tuple[str, str]],
                   xpos: dict[str, int]) -> None:
    from matplotlib.patches import Rectangle
    from matplotlib.transforms import blended_transform_factory

    baselines = set(df["baseline"].dropna())
    ends: list[tuple[float, str, str]] = []  # (y of the last point, label, color) for direct labels
    values: list[float] = []
    for b in backends:
        ys = [math.nan] * len(xpos)
        for _, r in df[(df["backend"] == b) & (df["status"] == Status.PASS)].iterrows():
            ys[xpos[r["case_id"]]] = _num(r.get("median_us"))
        finite = [(i, y) for i, y in enumerate(ys) if not math.isnan(y)]
        if not finite:
            continue
        color, marker = styles[b]
        # NaN gaps break the line, so a line never bridges a case the backend did not pass
        ax.plot(range(len(ys)), ys, color=color, marker=marker, markersize=6, linewidth=1.3, alpha=0.9,
                linestyle="--" if b in baselines else "-")
        ends.append((finite[-1][1], b + (" (base)" if b in baselines else ""), color))
        values += [y for _, y in finite]

    bad = df[~df["status"].isin([Status.PASS, Status.SKIP])]
    at_bottom = blended_transform_factory(ax.transData, ax.transAxes)
    untimed = False
    for _, r in bad.iterrows():
        x, y = xpos[r["case_id"]], _num(r.get("median_us"))
        # a wrong answer that was timed (FAIL) sits at its latency; a row without one (ERROR, OOM,
        # NaN, TIMEOUT) in a band under the lowest latency
        if math.isnan(y):
            untimed, transform, y = True, at_bottom, BAND / 2
        else:
            transform = ax.transData
            values.append(y)
        ax.scatter([x], [y], marker="x", s=80, linewidths=2.2, color=FAIL_COLOR, zorder=5, clip_on=False,
                   transform=transform)
        ax.annotate(f"{r['status']} {r['backend']}", (x, y), xycoords=transform, xytext=(5, 4),
                    textcoords="offset points", fontsize=7, color=FAIL_COLOR,
                    bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none", "pad": 0.5})  # over lines

    ax.set_yscale("log")
    floor = 0.0
    if untimed and values:
        # a shaded band under the lowest latency holds the rows without one, labelled where a tick would be
        lo, hi = ax.get_ylim()
        lo /= (hi / lo) ** 0.12
        ax.set_ylim(lo, hi)
        floor = lo * (hi / lo) ** BAND
        ax.add_patch(Rectangle((0, 0), 1, BAND, transform=ax.transAxes, facecolor="#fbeaea", edgecolor="none",
                               zorder=1.5))
        ax.text(-0.008, BAND / 2, "no latency", transform=ax.transAxes, ha="right", va="center", fontsize=8,
                color=FAIL_COLOR)
    _log_ticks(ax, values, _fmt_us_tick, floor)
    ax.set_ylabel("median latency (log scale)")
    ax.set_title("Latency per case, lower is better" + ("  (red x: not passing)" if len(bad) else ""),
                 fontsize=10, loc="left")
    _direct_labels(ax, ends)


def _speedup_panel(ax: Axes, df: pd.DataFrame, backends: list[str], styles: dict[str, tuple[str, str]],
                   xpos: dict[str, int]) -> None:
    has_sp = (df["status"] == Status.PASS) & df["speedup"].apply(lambda v: not math.isnan(_num(v)))
    rows = df[has_sp & (df["backend"] != df["baseline"])]  # the baseline's own 1.0 says nothing
    baselines = sorted(set(df["baseline"].dropna()))
    ax.set_ylabel("speedup (log scale)")
    ax.set_title(f"Speedup vs {' / '.join(baselines) or 'the baseline'} (baseline time / time), "
                 "higher is better", fontsize=10, loc="left")
    if rows.empty:
        ax.text(0.5, 0.5, "no speedups: the run had no baseline or no passing row beside it",
                transform=ax.transAxes, ha="center", va="center", color="#666666")
        ax.set_yticks([])
        return
    shown = [b for b in backends if b in set(rows["backend"])]
    values = [float(v) for v in rows["speedup"]] + [1.0]  # what the y range must hold
    width = 0.8 / len(shown)
    label_bars = len(rows) <= 40  # values on the bars while they still fit
    for k, b in enumerate(shown):
        sub = rows[rows["backend"] == b]
        xs = [xpos[c] - 0.4 + width * (k + 0.5) for c in sub["case_id"]]
        sp = [float(v) for v in sub["speedup"]]
        # the speedup's confidence interval where the run measured one (interleaved A/B runs)
        ci = [(_num(r.get("speedup_lo")), _num(r.get("speedup_hi"))) for _, r in sub.iterrows()]
        color = styles[b][0]
        # bars grow from 1.0, so a slowdown points down: on a log axis 0.5x and 2x look alike in size
        ax.bar(xs, [s - 1 for s in sp], bottom=1, width=width * 0.9, color=color, label=b, alpha=0.9)
        for x, s, (lo, hi) in zip(xs, sp, ci):
            if not (math.isnan(lo) or math.isnan(hi)):
                ax.errorbar([x], [s], yerr=[[max(s - lo, 0)], [max(hi - s, 0)]], fmt="none", ecolor="black",
                            elinewidth=0.8, capsize=2)
                values += [lo, hi]
            if label_bars:
                tip = hi if s >= 1 else lo
                end = s if math.isnan(tip) else tip  # the label goes beyond the whisker
                ax.annotate(f"{s:.2f}x", (x, end), xytext=(0, 3 if s >= 1 else -3), textcoords="offset points",
                            ha="center", va="bottom" if s >= 1 else "top", fontsize=7, rotation=90)
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_yscale("log")
    span = math.log10(max(values) / min(values))
    # room beyond the longest bars: the rotated value labels take ~15% of the panel's height
    pad = max(0.22 * span, math.log10(1.3)) if label_bars else max(0.05 * span, math.log10(1.15))
    ax.set_ylim(min(values) / 10**pad, max(values) * 10**pad)
    _log_ticks(ax, values, lambda v: f"{v:g}x")
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), frameon=False, fontsize=9, title="backend",
              title_fontsize=9)


def _log_ticks(ax: Axes, values: list[float], fmt: Callable[[float], str], floor: float = 0.0) -> None:
    """Labelled ticks at 1-2-5 steps over a short range, at decades over a long one; none below floor."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    span = math.log10(max(values) / min(values)) if values else 0.0
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if span <= 3 else (1.0,)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt(v) if v >= floor else ""))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.grid(True, axis="y", which="major", color="#cccccc", linewidth=0.6)


def _fmt_us_tick(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:g} s"
    if us >= 1e3:
        return f"{us / 1e3:g} ms"
    return f"{us:g} µs"


def _direct_labels(ax: Axes, ends: list[tuple[float, str, str]]) -> None:
    """Each backend's name right of the axes, at the height where its line ends, nudged apart."""
    from matplotlib.transforms import blended_transform_factory

    if not ends:
        return
    lo, hi = (math.log10(v) for v in ax.get_ylim())
    # one label height in log units: ~11 pt of text over the panel's height in points
    height_pt = ax.get_position().height * ax.figure.get_figheight() * 72
    gap = (hi - lo) * 11 / max(height_pt, 1.0)
    ends = sorted(ends)
    ys = [math.log10(y) for y, _, _ in ends]
    for i in range(1, len(ys)):
        ys[i] = max(ys[i], ys[i - 1] + gap)
    overshoot = ys[-1] - hi
    if overshoot > 0:  # pushed past the top: shift the stack down, but not below the bottom
        ys = [max(y - overshoot, lo + gap * i) for i, y in enumerate(ys)]
    to_right = blended_transform_factory(ax.transAxes, ax.transData)
    for y, (_, label, color) in zip(ys, ends):
        ax.text(1.01, 10**y, label, transform=to_right, color=color, fontsize=9, fontweight="bold",
                va="center", ha="left", clip_on=False)

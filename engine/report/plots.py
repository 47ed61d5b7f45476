"""The report's figures: matplotlib plots rendered to SVG text, to be inlined in the page.

Figures are made with matplotlib's object API (``Figure``, saved with its SVG backend), never through pyplot:
no global figure state, no GUI backend chosen behind the caller's back. Every figure is saved with text drawn
as paths (no font is needed to view it), ids salted with the figure's name (the SVGs of one page share one
id space, and the same report renders to the same bytes), mathtext off (a ``$`` in a search id is a dollar
sign, not a formula) and no date in its metadata.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator
from matplotlib.transforms import blended_transform_factory

from engine.report.model import CandidateEntry, SearchReport

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
"""One colour per search on a comparison (matplotlib's tab10 without its greys)."""

ROOFLINE_LINE_FROM = 0.4
"""The roofline plot draws the bound (1.0) once some bar reaches this fraction of it; below, it zooms in."""

MARKERS = ("o", "s", "^", "D", "v", "P")
"""One marker per search on a comparison, so overlapping points stay apart."""

MAX_LEGEND_CHARS = 48
"""Longest search id shown in a legend; the page's table gives the whole id."""


def progress_svg(report: SearchReport) -> str:
    """Speedup over the library baseline against evaluation number: each timed candidate with its interval,
    the failed ones as crosses on the axis, and the incumbent as a step line (its interval shaded)."""
    with _style(f"progress-{report.search_id}"):
        figure = Figure(figsize=(10, 4.2), layout="constrained")
        axes = figure.add_subplot()
        _draw_search(axes, report, PALETTE[0], None, MARKERS[0], 0.0)
        _finish_progress(axes, report.baseline, [report])
        return _svg(figure)


def comparison_svg(reports: Sequence[SearchReport]) -> str:
    """Several searches' progress on one plot (e.g. a cold search and a warm one resumed from it)."""
    names = "-".join(r.search_id for r in reports)
    with _style(f"comparison-{names}"):
        figure = Figure(figsize=(11, 4.6), layout="constrained")
        axes = figure.add_subplot()
        for index, report in enumerate(reports):
            # Each search's points are nudged sideways a little, so equal evaluations do not hide each other.
            nudge = (index - (len(reports) - 1) / 2) * 0.1
            _draw_search(
                axes,
                report,
                PALETTE[index % len(PALETTE)],
                _short(report.search_id),
                MARKERS[index % len(MARKERS)],
                nudge,
            )
        _finish_progress(axes, reports[0].baseline if reports else "numpy", reports)
        return _svg(figure)


def roofline_svg(report: SearchReport) -> str | None:
    """Per benchmark shape, the fraction of the roofline (roofline_ns / time) reached by the library
    baseline, the seed and the final incumbent as bars, and by every other timed candidate as grey dots.
    None when no benchmark recorded a roofline bound."""
    timed = [c for c in report.candidates if c.verdict == "ok" and any(s.fraction for s in c.shapes)]
    if not timed:
        return None
    best = next((c for c in timed if c.candidate_id == report.best_id), None)
    seed = next((c for c in timed if c.generation == 0), timed[0])
    reference = best or seed
    shapes = [s.shape for s in reference.shapes]
    series: list[tuple[str, list[float | None], str]] = [
        (f"{report.baseline} (library baseline)", [s.library_fraction for s in reference.shapes], "#7f7f7f"),
        ("seed" if seed.generation == 0 else "first timed", _fractions(seed, shapes), "#ff7f0e"),
    ]
    if best is not None and best is not seed:
        series.append(("final incumbent", _fractions(best, shapes), PALETTE[0]))
    with _style(f"roofline-{report.search_id}"):
        figure = Figure(figsize=(8.5, 4.2), layout="constrained")
        axes = figure.add_subplot()
        width = 0.8 / len(series)
        for index, (name, values, color) in enumerate(series):
            xs = [i + (index - (len(series) - 1) / 2) * width for i in range(len(shapes))]
            axes.bar(xs, [v or 0.0 for v in values], width=width, color=color, label=name)
        others = [c for c in timed if c is not seed and c is not best]
        dots = [(i, f) for c in others for i, f in enumerate(_fractions(c, shapes)) if f is not None]
        if dots:
            axes.scatter(
                [i for i, _ in dots], [f for _, f in dots], s=10, color="#444444", alpha=0.5, label="other candidates"
            )
        top = max([f for _, values, _ in series for f in values if f] + [f for _, f in dots] + [0.0])
        if top >= ROOFLINE_LINE_FROM:
            axes.axhline(1.0, color="black", linestyle=":", linewidth=1, label="roofline (the machine's bound)")
        else:  # far below the bound: a line at 1.0 would flatten every bar; the axis says what 1.0 means
            axes.set_ylim(top=top * 1.3 if top > 0 else 1.0)
        axes.set_xticks(range(len(shapes)), shapes, rotation=20, ha="right", fontsize=8)
        axes.set_ylabel("fraction of the roofline (bound / time)")
        axes.set_ylim(bottom=0)
        axes.legend(loc="upper left", fontsize=8)
        axes.grid(axis="y", alpha=0.3)
        return _svg(figure)


def _fractions(candidate: CandidateEntry, shapes: list[str]) -> list[float | None]:
    by_shape = {s.shape: s.fraction for s in candidate.shapes}
    return [by_shape.get(shape) for shape in shapes]


def _draw_search(axes: Axes, report: SearchReport, color: str, name: str | None, marker: str, nudge: float) -> None:
    prefix = f"{name}: " if name else ""
    timed = [p for p in report.evaluations if p.speedup is not None]
    if timed:
        values = [p.speedup.ratio for p in timed if p.speedup]
        lows = [p.speedup.ci_low for p in timed if p.speedup]
        highs = [p.speedup.ci_high for p in timed if p.speedup]
        axes.errorbar(
            [p.number + nudge for p in timed],
            values,
            yerr=[
                [max(v - lo, 0.0) for v, lo in zip(values, lows, strict=True)],
                [max(h - v, 0.0) for v, h in zip(values, highs, strict=True)],
            ],
            fmt=marker,
            markersize=4,
            color=color,
            ecolor=color,
            elinewidth=1,
            capsize=2,
            alpha=0.75,
            label=f"{prefix}candidate speedup (interval)",
        )
    failed = [p.number for p in report.evaluations if p.speedup is None]
    if failed:
        # Crosses at the foot of the axes: they have no speedup to place them by.
        foot = blended_transform_factory(axes.transData, axes.transAxes)
        axes.plot(
            [number + nudge for number in failed],
            [0.03] * len(failed),
            "x",
            color=color,
            transform=foot,
            label=f"{prefix}no speedup (failed or not judged)",
        )
    steps = report.incumbents
    if steps:
        end = max(report.evaluations[-1].number if report.evaluations else 0, steps[-1].after_evaluation)
        xs = [s.after_evaluation for s in steps] + [end]
        values = [s.speedup.ratio for s in steps] + [steps[-1].speedup.ratio]
        axes.step(xs, values, where="post", color=color, linewidth=2, label=f"{prefix}incumbent")
        axes.fill_between(
            xs,
            [s.speedup.ci_low for s in steps] + [steps[-1].speedup.ci_low],
            [s.speedup.ci_high for s in steps] + [steps[-1].speedup.ci_high],
            step="post",
            color=color,
            alpha=0.12,
        )


def _finish_progress(axes: Axes, baseline: str, reports: Sequence[SearchReport]) -> None:
    axes.axhline(1.0, color="grey", linestyle="--", linewidth=1, label=f"{baseline} (1x)")
    if any(p.speedup for r in reports for p in r.evaluations):
        axes.set_yscale("log")  # speedups are ratios: 2x and 0.5x lie as far from 1x
        # Ticks at 1, 1.5, 2, 3, 5, 7 of each decade: a search's speedups often span less than one.
        axes.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 1.5, 2.0, 3.0, 5.0, 7.0)))
        axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}x"))
        axes.yaxis.set_minor_formatter(FuncFormatter(lambda value, _: ""))
    if not any(r.evaluations for r in reports):
        axes.text(0.5, 0.5, "no evaluation recorded yet", transform=axes.transAxes, ha="center", va="center")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("evaluation number (in the order the search finished them)")
    axes.set_ylabel(f"speedup over {baseline} (log scale)")
    axes.grid(alpha=0.3)
    # Outside the axes, to the right: inside, it would hide the points of one search or another.
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, borderaxespad=0.0)


def _short(name: str) -> str:
    return name if len(name) <= MAX_LEGEND_CHARS else name[: MAX_LEGEND_CHARS - 1] + "…"


@contextmanager
def _style(salt: str) -> Iterator[None]:
    """matplotlib settings for one figure, from its creation (text objects read them then) to its saving."""
    with matplotlib.rc_context(
        {
            "svg.fonttype": "path",
            "svg.hashsalt": salt,
            "text.parse_math": False,
            "font.size": 9,
        }
    ):
        yield


def _svg(figure: Figure) -> str:
    """The figure as an ``<svg>`` element, without the XML declaration and DOCTYPE a standalone file has."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue().decode("utf-8")
    return text[text.index("<svg") :]

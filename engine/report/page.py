"""The report as one self-contained HTML page: inline CSS, inline SVG figures, no script, nothing fetched.

Every piece of text the event log holds goes through :func:`_text` (``html.escape``) on its way into the page,
in element content and attribute values alike: labels, rationales, sources and hints are written by proposers
(LLMs among them) and users, and a rationale may well contain ``</script>`` or ``<img onerror=…>``. The page
also forbids scripts and every fetch through its Content-Security-Policy, so a slip would still run nothing.
The figures are matplotlib's SVG (engine/report/plots.py), whose text is drawn as paths.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Sequence
from typing import Any

from engine.harness.stats import RatioEstimate
from engine.report.model import CandidateEntry, LessonsReport, SearchReport
from engine.report.plots import comparison_svg, progress_svg, roofline_svg

CONTENT_SECURITY_POLICY = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
"""Nothing is loaded from anywhere and no script runs; the page's own <style> and the SVGs' are allowed."""

_STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5rem auto; max-width: 1400px;
       padding: 0 1rem; color: #1b1b1b; }
h1 { font-size: 1.5rem; margin-bottom: .2rem; } h2 { font-size: 1.2rem; margin-top: 2rem;
     border-bottom: 1px solid #ddd; padding-bottom: .2rem; }
.meta { color: #555; margin-top: 0; }
figure.plot { margin: 1rem 0; } figure.plot svg { max-width: 100%; height: auto; display: block; }
figcaption { color: #555; font-size: .9em; }
table { border-collapse: collapse; font-size: .9em; margin: .5rem 0; }
th, td { border: 1px solid #ddd; padding: .25rem .45rem; vertical-align: top; text-align: left; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
code, pre { font-family: ui-monospace, "SFMono-Regular", Menlo, monospace; font-size: .85em; }
pre { background: #f7f7f7; padding: .5rem; overflow-x: auto; max-width: 70rem; white-space: pre; }
pre.summary { white-space: pre-wrap; }
td.rationale { max-width: 28rem; } td.settings { max-width: 22rem; }
.verdict { font-weight: 600; } .verdict-ok { color: #1a7f37; } .verdict-other { color: #b35900; }
.verdict-harness_error, .verdict-unfinished, .verdict-proposed { color: #666; }
.verdict-compile_error, .verdict-incorrect, .verdict-crash, .verdict-timeout, .verdict-resource_limit,
.verdict-forbidden, .verdict-impossible { color: #c62828; }
tr.incumbent td { background: #eef6ff; }
.muted { color: #777; }
"""


def search_page(report: SearchReport) -> str:
    """The report of one search."""
    roofline = roofline_svg(report)
    body = [
        f"<header><h1>Search {_text(report.search_id)}</h1>",
        f'<p class="meta">{_text(report.problem)} on {_text(report.target)} · {_text(report.status)} · '
        f"{_text(report.hardware)} · started {_text(report.started_at or '?')}"
        + (f" · finished {_text(report.finished_at)}" if report.finished_at else "")
        + "</p></header>",
        _summary(report),
        '<section id="progress"><h2>Speedup by evaluation</h2>',
        _figure(
            "plot-progress",
            progress_svg(report),
            f"Each timed candidate's speedup over {report.baseline} with its confidence interval, in the order the "
            "search finished evaluating them; crosses mark candidates without a speedup (a failed verdict or not "
            "judged); the line is the incumbent, promoted at the end of each generation, its interval shaded.",
        ),
        "</section>",
        '<section id="candidates"><h2>Candidates</h2>',
        _candidate_table(report),
        "</section>",
        '<section id="roofline"><h2>Time per shape against the roofline</h2>',
        _figure(
            "plot-roofline",
            roofline,
            "Per benchmark shape, the roofline bound (bytes moved / measured bandwidth, flops / measured peak of "
            "this machine) divided by the median time per call: 1.0 is at the bound.",
        )
        if roofline
        else '<p class="muted">No benchmark of this search recorded a roofline bound.</p>',
        _roofline_table(report),
        "</section>",
        '<section id="lessons"><h2>Lessons</h2>',
        _lessons(report.lessons),
        "</section>",
        f'<footer><p class="muted">Made by <code>kf report</code> from the {report.events} events of stream '
        f"<code>search-{_text(report.search_id)}</code>; <code>kf audit {_text(report.search_id)}</code> verifies "
        "them.</p></footer>",
    ]
    return _page(f"Kernel Factory: {report.search_id}", body)


def comparison_page(reports: Sequence[SearchReport]) -> str:
    """Several searches on one speedup-by-evaluation plot, with a summary row each."""
    names = " vs ".join(r.search_id for r in reports)
    rows = []
    for report in reports:
        reached = _evaluations_to_best(report)
        rows.append(
            _row(
                [
                    _text(report.search_id),
                    _text(report.problem),
                    _text(report.target),
                    _text(report.status),
                    _text(report.resumed_from or "—"),
                    _num(str(len(report.evaluations))),
                    _num(_ratio(report.best)),
                    _text(report.best_label or "—"),
                    _num(str(reached) if reached is not None else "—"),
                    _text(_counts(report)),
                ]
            )
        )
    body = [
        f"<header><h1>Comparison: {_text(names)}</h1></header>",
        '<section id="progress"><h2>Speedup by evaluation</h2>',
        _figure(
            "plot-comparison",
            comparison_svg(reports),
            f"Each search's timed candidates (speedup over {reports[0].baseline if reports else 'numpy'}, with "
            "intervals) and its incumbent as a step line, by evaluation number.",
        ),
        "</section>",
        '<section id="searches"><h2>Searches</h2><table><thead>',
        _row(
            [
                "search",
                "problem",
                "target",
                "status",
                "resumed from",
                "evaluations",
                "best speedup [interval]",
                "final incumbent",
                "evaluations to reach it",
                "verdicts",
            ],
            header=True,
        ),
        "</thead><tbody>",
        *rows,
        "</tbody></table></section>",
        '<footer><p class="muted">Made by <code>kf report --compare</code> from the event log; '
        "<code>kf report ID</code> shows one search in full.</p></footer>",
    ]
    return _page(f"Kernel Factory: {names}", body)


# -- sections ------------------------------------------------------------------------------------------------


def _summary(report: SearchReport) -> str:
    best = (
        f"<p>Final incumbent: <strong>{_text(report.best_label or '')}</strong> "
        f"<code>{_text((report.best_id or '')[:12])}</code>, {_text(_ratio(report.best))} over {report.baseline}.</p>"
        if report.best
        else "<p>No correct candidate was timed.</p>"
    )
    harness = (
        f" Not judged (the harness or the infrastructure failed, not the kernel): {report.harness_errors}."
        if report.harness_errors
        else ""
    )
    busy = (
        f" Timings on a busy machine (other work ran on their cores; re-measured before they promote): "
        f"{report.busy_timings} of {report.timings}."
        if report.busy_timings
        else ""
    )
    spec_rows = [_row([_text(key), f"<code>{_text(_value(value))}</code>"]) for key, value in report.spec.items()]
    hints = report.spec.get("hints") or []
    return "".join(
        [
            '<section id="summary"><h2>Summary</h2>',
            best,
            f"<p>Evaluations: {len(report.evaluations)} · verdicts: {_text(_counts(report))}."
            f"{_text(harness)}{_text(busy)}</p>",
            f"<p>Resumed from <code>{_text(report.resumed_from)}</code>.</p>" if report.resumed_from else "",
            "<p>Hints given:</p><ul>" + "".join(f"<li>{_text(str(h))}</li>" for h in hints) + "</ul>" if hints else "",
            "<details><summary>The search's spec</summary><table><tbody>",
            *spec_rows,
            "</tbody></table></details></section>",
        ]
    )


def _candidate_table(report: SearchReport) -> str:
    header = _row(
        [
            "#",
            "gen",
            "candidate",
            "verdict",
            f"speedup over {report.baseline} [interval]",
            "vs incumbent then [interval]",
            "roofline fraction",
            "proposer",
            "parent",
            "settings and change",
            "rationale",
            "outcome and source",
        ],
        header=True,
    )
    rows = [_candidate_row(c, c.candidate_id == report.best_id) for c in report.candidates]
    return f"<table><thead>{header}</thead><tbody>{''.join(rows)}</tbody></table>"


def _candidate_row(c: CandidateEntry, final_incumbent: bool) -> str:
    label = _named(c.label, c.candidate_id)
    if final_incumbent:
        label += " <strong>(final incumbent)</strong>"
    elif c.promoted:
        label += " (was incumbent)"
    parent = _named(c.parent_label or "?", c.parent_id) if c.parent_id else '<span class="muted">none</span>'

    settings = " ".join(f"{k}={v}" for k, v in sorted(c.params.items(), key=lambda kv: str(kv[0])))
    changes = ", ".join(f"{k}: {_value(old)} → {_value(new)}" for k, (old, new) in c.changed_params.items())
    cell = _text(settings or "hand-written source")
    if changes:
        cell += f"<br>changed: {_text(changes)}"
    if c.tags:
        cell += f'<br><span class="muted">tags: {_text(", ".join(c.tags))}</span>'
    if c.flags is not None:
        cell += f'<br><span class="muted">flags: {_text(" ".join(c.flags))}</span>'
    what = "source diff against the parent" if c.parent_id else "source"
    outcome = _text(c.summary)
    if c.source_diff:
        outcome += f"<details><summary>{what}</summary><pre>{_text(c.source_diff)}</pre></details>"
    return _row(
        [
            _num(str(c.evaluation) if c.evaluation is not None else "—"),
            _num(str(c.generation) if c.generation is not None else "?"),
            label,
            f'<span class="verdict verdict-{_verdict_class(c.verdict)}">{_text(c.verdict)}</span>',
            _num(_ratio(c.speedup)),
            _num(_ratio(c.ratio)),
            _num(f"{c.roofline_fraction:.3f}" if c.roofline_fraction is not None else "—"),
            _text(c.proposer),
            parent,
            f'<td class="settings">{cell}</td>',
            f'<td class="rationale">{_text(c.rationale)}</td>',
            outcome,
        ],
        css_class="incumbent" if final_incumbent else None,
    )


def _roofline_table(report: SearchReport) -> str:
    timed = [c for c in report.candidates if c.shapes]
    if not timed:
        return ""
    shapes: list[str] = []
    for candidate in timed:
        shapes += [s.shape for s in candidate.shapes if s.shape not in shapes]
    header = _row(["candidate", *(_text(s) for s in shapes)], header=True)
    library = {s.shape: s.library_fraction for c in timed for s in c.shapes if s.library_fraction is not None}
    rows = [_row([_text(f"{report.baseline} (library baseline)"), *(_num(_fraction(library.get(s))) for s in shapes)])]
    for candidate in timed:
        fractions = {s.shape: s.fraction for s in candidate.shapes}
        rows.append(
            _row(
                [_named(candidate.label, candidate.candidate_id), *(_num(_fraction(fractions.get(s))) for s in shapes)]
            )
        )
    return (
        "<details><summary>Every timed candidate's fraction of the roofline, per shape</summary>"
        f"<table><thead>{header}</thead><tbody>{''.join(rows)}</tbody></table></details>"
    )


def _lessons(lessons: LessonsReport) -> str:
    if not lessons.available:
        return f'<p class="muted">Lessons unavailable: {_text(lessons.reason)}</p>'
    parts = [
        "<h3>What the search started with</h3>",
        f'<pre class="summary">{_text(lessons.before)}</pre>',
        "<h3>After the search's own evidence</h3>",
        f'<pre class="summary">{_text(lessons.after)}</pre>',
        f'<p class="muted">{_text(lessons.reason)}; searches that ran meanwhile are left out.</p>',
    ]
    if lessons.changes:
        header = _row(
            [
                "change",
                "candidates (before → after)",
                "correct (before → after)",
                "speedup over parent (before → after)",
            ],
            header=True,
        )
        rows = [
            _row(
                [
                    _text(d.change)
                    + (f' <span class="muted">dead end: {_text(d.dead_end_after)}</span>' if d.dead_end_after else ""),
                    _num(f"{d.attempts_before} → {d.attempts_after}"),
                    _num(f"{d.correct_before} → {d.correct_after}"),
                    _num(f"{_times(d.speedup_over_parent_before)} → {_times(d.speedup_over_parent_after)}"),
                ]
            )
            for d in lessons.changes
        ]
        parts += [
            "<h3>Evidence the search added, per change</h3>",
            f"<table><thead>{header}</thead><tbody>{''.join(rows)}</tbody></table>",
        ]
    if lessons.new_failures:
        parts += [
            "<h3>Failures it added</h3><ul>",
            *(f"<li>{_text(line)}</li>" for line in lessons.new_failures),
            "</ul>",
        ]
    if lessons.new_dead_ends:
        parts.append(f"<p>New dead ends: {_text(', '.join(lessons.new_dead_ends))}</p>")
    return "".join(parts)


# -- pieces --------------------------------------------------------------------------------------------------


def _page(title: str, body: Iterable[str]) -> str:
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{CONTENT_SECURITY_POLICY}">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{_text(title)}</title>",
            f"<style>{_STYLE}</style>",
            "</head><body>",
            *body,
            "</body></html>",
            "",
        ]
    )


def _figure(element_id: str, svg: str, caption: str) -> str:
    return f'<figure class="plot" id="{element_id}">{svg}<figcaption>{_text(caption)}</figcaption></figure>'


def _row(cells: Iterable[str], *, header: bool = False, css_class: str | None = None) -> str:
    """A table row of cells that are already HTML; a cell that is a whole ``<td …>`` element is kept as it is."""
    tag = "th" if header else "td"
    html_cells = "".join(c if c.startswith("<td") else f"<{tag}>{c}</{tag}>" for c in cells)
    return f'<tr class="{css_class}">{html_cells}</tr>' if css_class else f"<tr>{html_cells}</tr>"


def _named(label: str, candidate_id: str) -> str:
    """A candidate's label and short id, its whole id on hover."""
    return f'<span title="{_text(candidate_id)}">{_text(label)}</span> <code>{_text(candidate_id[:12])}</code>'


def _num(text: str) -> str:
    return f'<td class="num">{_text(text)}</td>'


def _text(value: object) -> str:
    """Text made safe for HTML content and attribute values."""
    return html.escape(str(value), quote=True)


def _verdict_class(verdict: str) -> str:
    # A verdict comes from the log; only a known word becomes part of a class name.
    return verdict if re.fullmatch(r"[a-z_]{1,32}", verdict) else "other"


def _ratio(value: RatioEstimate | None) -> str:
    return f"{value.ratio:.3f}x [{value.ci_low:.3f}, {value.ci_high:.3f}]" if value is not None else "—"


def _times(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "—"


def _fraction(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "—"


def _value(value: Any) -> str:
    return "—" if value is None else str(value)


def _counts(report: SearchReport) -> str:
    return ", ".join(f"{verdict} {n}" for verdict, n in report.verdict_counts.items()) or "none"


def _evaluations_to_best(report: SearchReport) -> int | None:
    """The evaluation after which the final incumbent was promoted."""
    if not report.incumbents:
        return None
    return next((s.after_evaluation for s in report.incumbents if s.candidate_id == report.best_id), None)

"""`kf audit` shows every timing of a candidate -- its benchmark, the re-measurements of a shaky reading, its final
playoff rounds -- and marks the ones taken on a busy machine (cores shared with other work while it timed); `kf
report` counts them."""

from __future__ import annotations

from typing import Any

from engine.evidence.events import NewEvent
from engine.evidence.store import EventStore
from engine.hardware import hardware_fingerprint
from engine.harness.verdicts import BenchmarkReport, Verdict
from engine.report.gather import gather_report
from engine.report.page import search_page
from engine.search.audit import audit_search, format_audit
from engine.search.history import stream_of
from engine.search.steps import StepOutput

SEARCH = "audit-timings"


def _timing(
    event_type: str, step: str, candidate_id: str, *, share: float | None, exclusive: bool = True, legacy: bool = False
) -> NewEvent:
    """A timing outcome as the benchmark, confirm and playoff activities record it (activities/search.py)."""
    report = BenchmarkReport(
        verdict=Verdict.ok,
        reference="incumbent",
        speedup=1.2,
        ci_low=1.1,
        ci_high=1.3,
        cpus_exclusive=exclusive,
        foreign_cpu_share=share,
        hardware=hardware_fingerprint(),
    )
    output = StepOutput(
        step=step,
        verdict="ok",
        event_id=f"{SEARCH}/{candidate_id}/{step}",
        ratio=1.2,
        speedup=2.0,
        shared_cores=report.shared_cores,
        summary="1.200x vs incumbent [1.100, 1.300]",
    ).model_dump(mode="json", exclude={"head"})
    evidence: dict[str, Any] = {"reports": [report.model_dump(mode="json")]}
    if legacy:  # recorded before the judge watched its cores: no shared_cores, no share
        output.pop("shared_cores")
        evidence["reports"][0].pop("foreign_cpu_share")
    return NewEvent(
        event_id=output["event_id"],
        type=event_type,
        payload={"generation": 1, "candidate_id": candidate_id, "output": output, "evidence": evidence},
    )


def _proposed(candidate_id: str) -> NewEvent:
    return NewEvent(
        event_id=f"{SEARCH}/{candidate_id}/proposed",
        type="candidate.proposed",
        payload={"generation": 1, "candidate": {"candidate_id": candidate_id, "label": candidate_id}},
    )


async def test_the_audit_lists_retimings_and_marks_the_busy_ones(store: EventStore, fresh_db_url: str) -> None:
    await store.append(
        stream_of(SEARCH),
        [
            _proposed("a"),
            _timing("candidate.benchmarked", "benchmark", "a", share=0.29),
            _timing("candidate.remeasured", "confirm", "a", share=0.01),
            _proposed("b"),
            _timing("candidate.benchmarked", "benchmark", "b", share=None, legacy=True),
            _timing("search.playoff_round", "playoff", "b", share=0.0, exclusive=False),
            # A timing whose evidence is not in today's shape: read as unknown, never a failed audit.
            NewEvent(
                event_id=f"{SEARCH}/b/odd",
                type="candidate.remeasured",
                payload={"candidate_id": "b", "output": {"verdict": "ok", "shared_cores": False}, "evidence": ["?"]},
            ),
            NewEvent(
                event_id=f"{SEARCH}/playoff",
                type="search.playoff",
                payload={
                    "incumbent_id": "a",
                    "winner_id": "a",
                    "budget_seconds": 4.0,
                    "rounds": [
                        {
                            "round": 1,
                            "challenger_id": "b",
                            "challenger_label": "b",
                            "leader_id": "a",
                            "verdict": "ok",
                            "ratio": 0.98,
                            "ratio_ci_low": 0.95,
                            "ratio_ci_high": 1.01,
                            "speedup": 2.0,
                            "challenger_won": False,
                        },
                        {
                            "round": 2,
                            "challenger_id": "a",
                            "challenger_label": "a",
                            "leader_id": "a",
                            "verdict": "ok",
                            "ratio": 0.99,
                            "ratio_ci_low": None,
                            "ratio_ci_high": None,
                            "speedup": None,
                            "challenger_won": False,
                        },
                    ],
                },
            ),
        ],
    )
    report = await audit_search(fresh_db_url, SEARCH)
    a, b = report["candidates"]
    assert [(s["step"], s["busy"], s["foreign_cpu_share"]) for s in a["steps"]] == [
        ("benchmarked", True, 0.29),
        ("remeasured", False, 0.01),
    ]
    assert "29% of the cores' time went to other work" in a["steps"][0]["busy_reason"]
    # An older reading says nothing of its cores: not busy, share unknown. A shared lease is busy without a share.
    assert [(s["step"], s["busy"], s["foreign_cpu_share"]) for s in b["steps"]] == [
        ("benchmarked", False, None),
        ("playoff", True, 0.0),
        ("remeasured", False, None),
    ]
    assert "another benchmark of this machine's held the same cores" in b["steps"][1]["busy_reason"]
    # Re-measurements are readings, never verdicts: the candidates' verdicts come from their steps alone.
    assert report["busy_timings"] == 2 and report["verdict_counts"] == {}
    text = format_audit(report)
    assert text.count("BUSY machine") == 2
    assert "busy machine: 2 timing(s) shared their cores" in text
    assert "final playoff: 2 round(s), 4.0 s each; the incumbent (a) kept the lead" in text
    assert "round 1: b (b) vs the leader 0.980x [0.950, 1.010] — not faster with confidence" in text
    assert "round 2: a (a) vs the leader 0.990x — not faster with confidence" in text  # no interval recorded
    # The report's summary counts the same timings: five, two of them a busy machine's.
    page = await gather_report(fresh_db_url, SEARCH, with_lessons=False)
    assert (page.timings, page.busy_timings) == (5, 2), page
    assert "Timings on a busy machine (other work ran on their cores; re-measured before they promote): 2 of 5." in (
        search_page(page)
    )

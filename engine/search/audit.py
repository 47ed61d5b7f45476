"""`kf audit`: a search's evidence as the event log holds it, its hash chain verified and checked against
the witness in its Temporal history; `kf audit --all`: every chain of the log, and its positions.

The chain alone shows a change the database's application role could make (none: it may only append) or a
careless hand; the owner of the database can re-hash a rewritten stream or cut its tail, and only the
witness outside the database shows that (engine/search/witness.py).

Each candidate lists its steps in order, then its timings after the benchmark (re-measurements of a shaky reading,
final playoff rounds), each timing marked busy when its cores were shared with other work while it timed: a
busy reading is still the kernel's, but it promotes only after a re-measurement and counts for less in the lessons."""

from __future__ import annotations

from typing import Any

from engine.errors import NoEvents
from engine.evidence.events import RecordedEvent
from engine.evidence.store import EventStore
from engine.harness.contention import busy_reason
from engine.search.history import RETIMING_EVENTS, STEP_EVENTS, load_search_history, stream_of, was_busy
from engine.search.witness import Witness, WitnessFinding, check_witness


async def audit_search(database_url: str, search_id: str, witness: Witness | None = None) -> dict[str, Any]:
    """Every candidate and step of a search, who wrote each outcome, the chain's verification, and the
    comparison with ``witness`` (the heads its Temporal history recorded; None: not consulted)."""
    store = await EventStore.connect(database_url)
    try:
        history = await load_search_history(store, search_id)
        if not history.events and (witness is None or not witness.usable):
            raise NoEvents(search_id)
        broken = await store.verify(stream_of(search_id))
    finally:
        await store.close()
    findings = check_witness(history.events, witness, stream_of(search_id)) if witness and witness.usable else []
    candidates: list[dict[str, Any]] = []
    for record in history.candidates.values():
        steps = []
        recorded = [(step.split(".", 1)[1], record.steps.get(step)) for step in STEP_EVENTS]
        recorded += [(RETIMING_EVENTS[event.type], event) for event in record.retimings]
        # A harness or infrastructure failure is listed as what it is, after the steps that did finish.
        recorded.append(("harness_error", record.harness_error))
        for name, event in recorded:
            if event is None:
                continue
            output = event.payload.get("output") or {
                "verdict": "harness_error",
                "summary": f"{event.payload.get('step', '?')}: {event.payload.get('error', '')}",
            }
            steps.append(
                {
                    "step": name,
                    "verdict": output.get("verdict"),
                    "summary": output.get("summary"),
                    "event_id": event.event_id,
                    "position": event.position,
                    "hash": event.hash,
                    "workflow_id": event.metadata.get("workflow_id"),
                    "run_id": event.metadata.get("run_id"),
                    "activity_id": event.metadata.get("activity_id"),
                    "attempt": event.metadata.get("attempt"),
                    "worker": event.metadata.get("worker"),
                    "hardware": (event.metadata.get("hardware") or {}).get("cpu_model"),
                    **_busy(event),
                }
            )
        candidates.append(
            {
                "candidate_id": record.candidate_id,
                "label": record.label,
                "generation": record.generation,
                "proposer": record.proposer,
                "parent_id": record.parent_id,
                "verdict": record.verdict,
                "steps": steps,
            }
        )
    return {
        "search_id": search_id,
        "events": len(history.events),
        "started": history.started.recorded_at.isoformat() if history.started else None,
        "finished": history.finished.payload if history.finished else None,
        "incumbent": history.incumbent.model_dump(mode="json") if history.incumbent else None,
        "promotions": [
            {k: p.get(k) for k in ("generation", "candidate_id", "label", "ratio", "ratio_ci_low", "speedup", "reason")}
            for p in history.promotions
        ],
        # Counted from the step outcomes, not from the finished payload: a candidate the harness failed to judge
        # is never counted with the verdicts (older searches' summaries may count it as the verdict of its
        # last finished step).
        "verdict_counts": history.verdict_counts,
        "harness_errors": len(history.harness_errors),
        "busy_timings": sum(bool(s.get("busy")) for c in candidates for s in c["steps"]),
        "playoff": _playoff(history.playoff.payload) if history.playoff else None,
        "candidates": candidates,
        "chain": {"intact": broken is None, "broken": broken.model_dump(mode="json") if broken else None},
        "witness": _witness_report(witness, findings),
        "intact": broken is None and not findings,
    }


def _busy(event: RecordedEvent) -> dict[str, Any]:
    """Whether a step's timing shared its cores with other work (``busy``), the share of their time that went to
    it (``foreign_cpu_share``; None where unknown: not a timing, or a reading recorded before the judge watched its
    cores) and why, for people (``busy_reason``, "" when not busy)."""
    # The log may hold any shape (an older kf's, or a hand's): what is not the expected one reads as unknown.
    evidence = _mapping(event.payload.get("evidence"))
    reports = evidence.get("reports")
    first = _mapping(reports[0]) if isinstance(reports, list) and reports else {}
    share = first.get("foreign_cpu_share")
    share = float(share) if isinstance(share, int | float) else None
    busy = was_busy(event)
    reason = (busy_reason(bool(first.get("cpus_exclusive", True)), share) or "shared cores") if busy else ""
    return {"busy": busy, "foreign_cpu_share": share, "busy_reason": reason}


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _playoff(payload: dict[str, Any]) -> dict[str, Any]:
    """The final playoff as the audit shows it: the incumbent it started from, its winner, its rounds."""
    return {
        "incumbent_id": payload.get("incumbent_id"),
        "winner_id": payload.get("winner_id"),
        "budget_seconds": payload.get("budget_seconds"),
        "rounds": list(payload.get("rounds") or []),
    }


def _witness_report(witness: Witness | None, findings: list[WitnessFinding]) -> dict[str, Any]:
    if witness is None or not witness.usable:
        if witness is None:
            reason = "not consulted"
        elif not witness.available:
            reason = witness.reason
        else:
            reason = f"{witness.source} records no stream head (the search ran on a kf that did not record them)"
        transient = witness is not None and witness.transient
        return {"status": "unavailable", "reason": reason, "transient": transient, "heads": 0, "findings": []}
    return {
        "status": "mismatch" if findings else "intact",
        "transient": False,
        "source": witness.source,
        "reason": witness.reason,
        "heads": len(witness.heads),
        "final": witness.final.model_dump(mode="json") if witness.final else None,
        "findings": [f.model_dump(mode="json") for f in findings],
    }


async def audit_log(database_url: str, gap_limit: int = 100) -> dict[str, Any]:
    """The whole log: every stream's chain (hashes, links, versions) and the positions, against the highest
    position ever committed, with the events around each missing one."""
    store = await EventStore.connect(database_url)
    try:
        broken = await store.verify(check_positions=False)
        positions = await store.positions(limit=gap_limit)
    finally:
        await store.close()
    return {
        "events": positions.events,
        "committed": positions.committed,
        "issued": positions.issued,
        "stored": positions.stored,
        "chain": {"intact": broken is None, "broken": broken.model_dump(mode="json") if broken else None},
        "positions": {
            "intact": positions.intact,
            "sequence_set_back": positions.sequence_set_back,
            "gaps_total": positions.gaps_total,
            "gaps": [{**gap.model_dump(mode="json"), "text": str(gap)} for gap in positions.gaps],
        },
        "intact": broken is None and positions.intact,
    }


def format_log_audit(report: dict[str, Any]) -> str:
    """The whole-log audit for people."""
    lines = [f"event log: {report['events']} events, positions committed up to {report['committed']}"]
    if report["issued"] > report["committed"]:
        lines.append(
            f"  positions {report['committed'] + 1}..{report['issued']} were issued to appends that rolled back "
            "or are in flight (the next append reuses them): not a gap"
        )
    chain = report["chain"]
    lines.append(
        "hash chains: intact" if chain["intact"] else f"hash chains: BROKEN at {_broken_text(chain['broken'])}"
    )
    positions = report["positions"]
    if positions["sequence_set_back"]:
        lines.append(
            f"positions: the sequence was SET BACK to {report['issued']}, below the committed {report['committed']}"
        )
    if positions["gaps_total"]:
        lines.append(f"positions: {positions['gaps_total']} GAP(S) — events were removed:")
        lines += [f"  - {gap['text']}" for gap in positions["gaps"]]
        if positions["gaps_total"] > len(positions["gaps"]):
            lines.append(f"  … and {positions['gaps_total'] - len(positions['gaps'])} more")
    elif not positions["sequence_set_back"]:
        lines.append(f"positions: gap-free up to {report['committed']}, the highest ever committed")
    return "\n".join(lines)


def _playoff_text(playoff: dict[str, Any]) -> str:
    rounds = playoff["rounds"]
    kept = playoff["winner_id"] == playoff["incumbent_id"]
    winner = str(playoff["winner_id"] or "?")[:12]
    lines = [
        f"final playoff: {len(rounds)} round(s), {playoff['budget_seconds']} s each; "
        + (f"the incumbent ({winner}) kept the lead" if kept else f"{winner} won and became the incumbent")
    ]
    for r in rounds:
        challenger = f"{r.get('challenger_label', '')} ({str(r.get('challenger_id', '?'))[:12]})"
        if r.get("verdict") != "ok":
            lines.append(f"  round {r.get('round')}: {challenger} — {r.get('verdict')}: {r.get('error', '')}")
            continue
        ratio, low, high = (r.get(k) for k in ("ratio", "ratio_ci_low", "ratio_ci_high"))
        # A round may lack its figures (recorded by an older kf, or without an interval): its line stays.
        text = f"{ratio:.3f}x" if isinstance(ratio, int | float) else "-"
        if isinstance(low, int | float) and isinstance(high, int | float):
            text += f" [{low:.3f}, {high:.3f}]"
        result = "took the lead" if r.get("challenger_won") else "not faster with confidence"
        lines.append(f"  round {r.get('round')}: {challenger} vs the leader {text} — {result}")
    return "\n".join(lines)


def _broken_text(broken: dict[str, Any]) -> str:
    return (
        f"event {broken['event_id']!r} (stream {broken['stream_id']!r} v{broken['stream_version']}, position "
        f"{broken['position']}): {broken['problem'].replace('_', ' ')}: expected {broken['expected']}, stored "
        f"{broken['actual']}"
    )


def format_audit(report: dict[str, Any]) -> str:
    """The audit for people."""
    lines = [f"search {report['search_id']}: {report['events']} events, started {report['started']}"]
    for c in report["candidates"]:
        lines.append(f"- g{c['generation']} {c['label']} ({c['candidate_id'][:12]}) by {c['proposer']}: {c['verdict']}")
        for s in c["steps"]:
            lines.append(
                f"    {s['step']:<12} {s['verdict']:<15} #{s['position']} attempt {s['attempt']} "
                f"activity {s['activity_id']} run {str(s['run_id'])[:8]} on {s['worker']} — {s['summary']}"
                + (f" — BUSY machine: {s['busy_reason']}" if s.get("busy") else "")
            )
    counts = ", ".join(f"{verdict} {n}" for verdict, n in report["verdict_counts"].items()) or "none"
    lines.append(f"verdicts: {counts}")
    if report["harness_errors"]:
        lines.append(
            f"not judged: {report['harness_errors']} candidate(s) the harness or the infrastructure failed to "
            "judge (harness_error: not a verdict on the kernel)"
        )
    if report.get("busy_timings"):
        lines.append(
            f"busy machine: {report['busy_timings']} timing(s) shared their cores with other work (marked BUSY "
            "above): such a reading promotes only after a re-measurement and counts for less in the lessons"
        )
    for p in report["promotions"]:
        lines.append(f"promoted g{p['generation']}: {p['label']} ({p['candidate_id'][:12]}) — {p['reason']}")
    if report.get("playoff"):
        lines.append(_playoff_text(report["playoff"]))
    chain = report["chain"]
    lines.append("hash chain: intact" if chain["intact"] else f"hash chain: BROKEN at {_broken_text(chain['broken'])}")
    witness = report["witness"]
    if witness["status"] == "unavailable":
        lines.append(
            f"witness: UNAVAILABLE — {witness['reason']}. Without it a stream its database owner cut short, or "
            "rewrote and re-hashed, would still verify: the chain alone proves less"
        )
    elif witness["status"] == "intact":
        end = (
            f", and the stream ends where the search's result says (v{witness['final']['head']['version']})"
            if witness["final"]
            else ""
        )
        lines.append(f"witness: intact — the {witness['heads']} heads recorded in the {witness['source']} match{end}")
    else:
        lines.append(f"witness: MISMATCH with the {witness['source']}:")
        lines += [f"  - {finding['problem']}: {finding['message']}" for finding in witness["findings"]]
    if witness.get("reason") and witness["status"] != "unavailable":
        lines.append(f"  note: {witness['reason']}")
    return "\n".join(lines)

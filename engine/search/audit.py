"""`kf audit`: a search's evidence as the event log holds it, with its hash chain verified."""

from __future__ import annotations

from typing import Any

from engine.errors import UserError
from engine.evidence.store import EventStore
from engine.search.history import STEP_EVENTS, load_search_history, stream_of


async def audit_search(database_url: str, search_id: str) -> dict[str, Any]:
    """Every candidate and step of a search, who wrote each outcome, and the chain's verification."""
    store = await EventStore.connect(database_url)
    try:
        history = await load_search_history(store, search_id)
        if not history.events:
            raise UserError(f"no events for search {search_id!r}; `kf search list` shows the search ids")
        broken = await store.verify(stream_of(search_id))
    finally:
        await store.close()
    candidates = []
    for record in history.candidates.values():
        steps = []
        for step in STEP_EVENTS:
            event = record.steps.get(step)
            if event is None:
                continue
            output = event.payload.get("output", {})
            steps.append(
                {
                    "step": step.split(".", 1)[1],
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
        "candidates": candidates,
        "chain": {"intact": broken is None, "broken": broken.model_dump(mode="json") if broken else None},
    }


def format_audit(report: dict[str, Any]) -> str:
    """The audit for people."""
    lines = [f"search {report['search_id']}: {report['events']} events, started {report['started']}"]
    for c in report["candidates"]:
        lines.append(f"- g{c['generation']} {c['label']} ({c['candidate_id'][:12]}) by {c['proposer']}: {c['verdict']}")
        for s in c["steps"]:
            lines.append(
                f"    {s['step']:<12} {s['verdict']:<15} #{s['position']} attempt {s['attempt']} "
                f"activity {s['activity_id']} run {str(s['run_id'])[:8]} on {s['worker']} — {s['summary']}"
            )
    for p in report["promotions"]:
        lines.append(f"promoted g{p['generation']}: {p['label']} ({p['candidate_id'][:12]}) — {p['reason']}")
    chain = report["chain"]
    lines.append("hash chain: intact" if chain["intact"] else f"hash chain: BROKEN at {chain['broken']}")
    return "\n".join(lines)

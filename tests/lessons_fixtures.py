"""Synthetic search histories for the lessons tests: the same event types and payload shapes that
activities/search.py appends, with outcomes drawn from a known model instead of a compiler and a clock.

The model: a template candidate's speedup over numpy is the product of its parameter values' factors
(``EFFECTS``) times seeded noise; some settings fail to compile or are incorrect, so failure patterns exist.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np

from engine.evidence.events import NewEvent, RecordedEvent
from engine.evidence.store import EventStore
from engine.problems import load_problem
from engine.proposers.random_template import template_candidate, template_space
from engine.search.candidates import Candidate
from engine.search.history import stream_of
from engine.search.steps import StepOutput, step_event_id

TARGET = "cpu-test-avx2"
"""The resolved target of synthetic searches."""

EFFECTS: dict[str, float] = {
    "ONLINE=1": 1.3,
    "UNROLL=8": 1.25,
    "UNROLL=4": 1.1,
    "UNROLL=1": 0.85,
    "SIMD=1": 1.4,
    "ACC=8": 1.2,
    "FUSED=1": 1.15,
}
"""Multiplicative effect of a parameter value on the speedup; 1.0 for values not listed."""


def recorded_event(position: int, kind: str, payload: dict[str, Any]) -> RecordedEvent:
    """An event of stream ``search-s`` as the log would hand it back, without a log: for code that folds events."""
    return RecordedEvent.model_construct(
        position=position,
        event_id=f"e{position}",
        stream_id="search-s",
        stream_version=position,
        type=kind,
        schema_version=1,
        payload=payload,
        metadata={},
        recorded_at=datetime.now(UTC),
        prev_hash="0" * 64,
        hash="0" * 64,
    )


def synthetic_speedup(params: dict[str, Any], base: float = 1.0) -> float:
    """The model's speedup over numpy of a template setting, without noise."""
    return base * math.prod(EFFECTS.get(f"{k}={v}", 1.0) for k, v in params.items())


def softmax_failure(params: dict[str, Any]) -> str | None:
    """compile_error for UNROLL=2 with SIMD=0, incorrect for ONLINE=0 with UNROLL=2 and SIMD=1."""
    if params.get("UNROLL") == 2 and params.get("SIMD") == 0:
        return "compile_error"
    if params.get("UNROLL") == 2 and params.get("ONLINE") == 0:
        return "incorrect"
    return None


@dataclass
class SyntheticSearch:
    """Appends one search's events, generation by generation, like the activities would."""

    store: EventStore
    search_id: str
    problem: str
    fingerprint: str = "fingerprint-1"
    record_family: bool = True

    @property
    def stream(self) -> str:
        return stream_of(self.search_id)

    def event(self, event_id: str, event_type: str, payload: dict[str, Any]) -> NewEvent:
        return NewEvent(event_id=event_id, type=event_type, payload=payload, metadata={"worker": "synthetic"})

    def start(self, seed: Candidate) -> list[NewEvent]:
        payload: dict[str, Any] = {
            "spec": {"problem": self.problem, "target": "cpu", "seed": 0},
            "problem_fingerprint": self.fingerprint,
            "seed_candidate_id": seed.candidate_id,
            "resumed_from": None,
        }
        if self.record_family:
            payload["family"] = load_problem(self.problem).family
        return [
            self.event(f"{self.search_id}/started", "search.started", payload),
            self.event(
                step_event_id(self.search_id, 0, seed.candidate_id, "proposed"),
                "candidate.proposed",
                {"generation": 0, "candidate": seed.model_dump(mode="json")},
            ),
            self.event(f"{self.search_id}/target", "search.target_resolved", {"target": TARGET, "queue": "q"}),
        ]

    def proposed(self, generation: int, candidate: Candidate) -> NewEvent:
        return self.event(
            step_event_id(self.search_id, generation, candidate.candidate_id, "proposed"),
            "candidate.proposed",
            {"generation": generation, "candidate": candidate.model_dump(mode="json")},
        )

    def outcome(
        self,
        generation: int,
        candidate: Candidate,
        *,
        failure: str | None,
        speedup: float | None,
        parent_speedup: float | None,
        reused: bool = False,
        spread: float = 0.03,
        shared_cores: bool = False,
    ) -> list[NewEvent]:
        """The step outcomes of one candidate: compiled, then validated, then benchmarked, as far as it got;
        the benchmark's intervals are ± ``spread`` (relative), its timing on shared cores if ``shared_cores``."""
        cid = candidate.candidate_id

        def step(name: str, event_type: str, output: StepOutput, evidence: dict[str, Any]) -> NewEvent:
            event_id = step_event_id(self.search_id, generation, cid, name)
            output = output.model_copy(update={"event_id": event_id})
            return self.event(
                event_id,
                event_type,
                {
                    "generation": generation,
                    "candidate_id": cid,
                    "output": output.model_dump(mode="json"),
                    "evidence": evidence,
                },
            )

        artifact = f"artifact-{cid[:16]}"
        if failure == "compile_error":
            return [
                step(
                    "compiled",
                    "candidate.compiled",
                    StepOutput(step="compile", verdict="compile_error", event_id="", summary="error: x undeclared"),
                    {"verdict": "compile_error", "error_category": "undeclared", "first_error": "error: x undeclared"},
                )
            ]
        events = [
            step(
                "compiled",
                "candidate.compiled",
                StepOutput(step="compile", verdict="ok", event_id="", artifact_id=artifact, reused=reused),
                {"verdict": "ok", "artifact_id": artifact, "cached": reused},
            )
        ]
        if failure == "incorrect":
            case = {"phase": "validation", "check": "output", "shape": {"rows": 1, "cols": 1}, "message": "y off"}
            events.append(
                step(
                    "validated",
                    "candidate.validated",
                    StepOutput(step="validate", verdict="incorrect", event_id="", artifact_id=artifact),
                    {"verdict": "incorrect", "trials": 3, "cases": [case]},
                )
            )
            return events
        events.append(
            step(
                "validated",
                "candidate.validated",
                StepOutput(step="validate", verdict="ok", event_id="", artifact_id=artifact, reused=reused),
                {"verdict": "ok", "trials": 96, "cases": []},
            )
        )
        assert speedup is not None
        ratio = speedup / parent_speedup if parent_speedup else speedup
        reports = [{"verdict": "ok", "reference": "numpy", "speedup": speedup}]
        if parent_speedup:
            reports.insert(0, {"verdict": "ok", "reference": "incumbent", "speedup": ratio})
        events.append(
            step(
                "benchmarked",
                "candidate.benchmarked",
                StepOutput(
                    step="benchmark",
                    verdict="ok",
                    event_id="",
                    artifact_id=artifact,
                    ratio=ratio,
                    ratio_ci_low=ratio * (1 - spread),
                    ratio_ci_high=ratio * (1 + spread),
                    speedup=speedup,
                    speedup_ci_low=speedup * (1 - spread),
                    speedup_ci_high=speedup * (1 + spread),
                    shared_cores=shared_cores,
                ),
                {"reports": reports},
            )
        )
        return events


async def record_random_search(
    store: EventStore,
    search_id: str,
    problem: str = "softmax",
    *,
    seed: int = 0,
    generations: int = 3,
    per_generation: int = 3,
    failure: Callable[[dict[str, Any]], str | None] = softmax_failure,
    record_family: bool = True,
) -> list[Candidate]:
    """A search over the template with random picks and the model's outcomes; the incumbent is the
    fastest correct candidate so far. Appends one batch per generation."""
    rng = np.random.default_rng(seed)
    loaded = load_problem(problem)
    search = SyntheticSearch(store, search_id, problem, record_family=record_family)
    seed_candidate = Candidate.create(loaded.seed_source(), None, label="seed", proposer="seed", tags=["seed"])
    seed_speedup = 0.5
    batch = [*search.start(seed_candidate)]
    batch += search.outcome(0, seed_candidate, failure=None, speedup=seed_speedup, parent_speedup=None)
    await store.append(search.stream, batch)
    incumbent, best = seed_candidate, seed_speedup
    space = template_space(loaded)
    tried = [seed_candidate]
    order = rng.permutation(len(space))
    cursor = 0
    for generation in range(1, generations + 1):
        batch = []
        results = []
        for _ in range(per_generation):
            if cursor >= len(order):
                break
            params = space[int(order[cursor])]
            cursor += 1
            candidate = template_candidate(loaded, params, None, proposer="random", parent_id=incumbent.candidate_id)
            tried.append(candidate)
            fails = failure(params)
            speedup = synthetic_speedup(params) * float(np.exp(rng.normal(0, 0.03))) if not fails else None
            batch.append(search.proposed(generation, candidate))
            batch += search.outcome(generation, candidate, failure=fails, speedup=speedup, parent_speedup=best)
            if speedup is not None:
                results.append((speedup, candidate))
        await store.append(search.stream, batch)
        if results:
            top_speedup, top = max(results, key=lambda t: t[0])
            if top_speedup > best * 1.02:
                incumbent, best = top, top_speedup
    return tried

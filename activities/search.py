"""The search's activities: each turns one workflow step into calls on ``engine`` and appends its outcome.

Every outcome is appended under a deterministic event id (search, generation, candidate, step). A step
first looks for its own outcome: a step retried after its worker died, after the outcome was written but
before Temporal heard of it, returns the recorded outcome instead of compiling, validating or timing again.
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from pydantic import BaseModel
from temporalio import activity
from temporalio.exceptions import ApplicationError

from engine.errors import UserError
from engine.evidence.events import NewEvent, RecordedEvent
from engine.evidence.index import recorded_evidence, recorded_payload
from engine.evidence.lessons import lessons_for
from engine.evidence.store import EventStore
from engine.hardware import cpu_target, hardware_fingerprint
from engine.harness.cpu import artifact_path, compile_source
from engine.harness.evaluation import Reference, benchmark_artifact, validate_artifact
from engine.harness.verdicts import Verdict
from engine.problems import Problem, load_problem
from engine.proposers import ProposalContext, proposer_for
from engine.proposers.failures import recent_failures_from_events
from engine.proposers.outcomes import propose_batch
from engine.search.candidates import Candidate
from engine.search.history import load_search_history, stream_of
from engine.search.steps import (
    ProposeInput,
    ProposeOutput,
    RecordInput,
    StartInput,
    StartOutput,
    StepInput,
    StepOutput,
    TargetInfo,
    step_event_id,
)

T = TypeVar("T")
HEARTBEAT_EVERY_S = 2.0


def _refuse_harness_error(verdict: Verdict, message: str) -> None:
    """A judge that failed (not the kernel) is never recorded as the kernel's outcome: the step fails and is
    retried, in a fresh sandbox, possibly on another worker."""
    if verdict == Verdict.harness_error:
        raise ApplicationError(f"the harness failed, not the kernel: {message}", type="HarnessError")


def non_retryable(error: UserError) -> ApplicationError:
    """Bad input: fail the step (or the search) at once with the message, never retry it."""
    return ApplicationError(str(error), type=type(error).__name__, non_retryable=True)


class SearchActivities:
    """The activities of KernelSearch, bound to one event store and one worker's identity."""

    def __init__(self, store: EventStore, identity: str | None = None) -> None:
        self.store = store
        self.identity = identity or f"kf-worker@{socket.gethostname()}:{os.getpid()}"
        self._hardware: dict[str, Any] | None = None

    # -- control queue -----------------------------------------------------------------------------------

    @activity.defn(name="kf.start_search")
    async def start_search(self, start: StartInput) -> StartOutput:
        """Check the problem exists, open the search's record, and load what a resumed search starts from."""
        problem = self._problem(start.spec.problem)
        seed = Candidate.create(
            problem.seed_source(),
            start.spec.flags,
            label="seed",
            proposer="seed",
            tags=["seed"],
            rationale="the problem's naive seed kernel",
        )
        output = StartOutput(problem_fingerprint=problem.fingerprint(), seed_candidate=seed)
        if start.spec.resume_from:
            history = await load_search_history(self.store, start.spec.resume_from)
            if history.started is None:
                raise non_retryable(
                    UserError(
                        f"resume_from {start.spec.resume_from!r}: no such search in the event log; "
                        "`kf search list` shows the search ids"
                    )
                )
            output.seen = history.evaluated_ids
            if history.incumbent is not None:
                incumbent = history.incumbent.candidate
                output.resumed_incumbent = history.incumbent
                # The earlier incumbent is timed again here: its figures belong to the earlier run's
                # machine and moment, and it must still beat numpy under today's noise.
                output.seed_candidate = incumbent.model_copy(
                    update={"proposer": "resumed", "rationale": f"incumbent of {start.spec.resume_from}"}
                )
                output.seen = [i for i in output.seen if i != incumbent.candidate_id]
        seed_id = output.seed_candidate.candidate_id
        await self._append_events(
            start.search_id,
            [
                self._event(
                    f"{start.search_id}/started",
                    "search.started",
                    {
                        "spec": start.spec.model_dump(mode="json"),
                        "problem_fingerprint": output.problem_fingerprint,
                        "family": problem.family,
                        "seed_candidate_id": seed_id,
                        "resumed_from": start.spec.resume_from,
                        "resumed_seen": len(output.seen),
                    },
                ),
                self._event(
                    step_event_id(start.search_id, 0, seed_id, "proposed"),
                    "candidate.proposed",
                    {"generation": 0, "candidate": output.seed_candidate.model_dump(mode="json")},
                ),
            ],
        )
        return output

    @activity.defn(name="kf.propose")
    async def propose(self, request: ProposeInput) -> ProposeOutput:
        """Ask the proposer agents for a generation's candidates; record them with their lineage, and every
        LLM call and failed proposal, in one append (a retried round finds it recorded and never pays twice)."""
        problem = self._problem(request.spec.problem)
        try:
            proposer = proposer_for(request.spec.proposer.kind, models=request.spec.proposer.models)
        except UserError as error:
            raise non_retryable(error) from None
        recorded = await self._recorded_proposal(request)
        if recorded is not None:
            return recorded
        # Lessons of every search so far (this one's earlier generations included): priors for the search
        # proposer, the summary for LLM prompts. Recent failures are for the fixer.
        lessons = await lessons_for(self.store, request.spec.problem, request.target)
        own_events = await self.store.read_stream(stream_of(request.search_id))
        context = ProposalContext(
            search_id=request.search_id,
            problem=request.spec.problem,
            target=request.target,
            generation=request.generation,
            count=request.count,
            seed=request.spec.seed,
            incumbent=request.incumbent,
            seen=request.seen,
            hints=request.spec.hints,
            flags=request.spec.flags,
            lessons=lessons.model_dump(mode="json"),
            lessons_summary=lessons.summary,
            models=request.spec.proposer.models,
            incumbent_evidence=request.incumbent_evidence,
            recent_failures=recent_failures_from_events(own_events),
            llm_spent_usd=request.llm_spent_usd,
            llm_budget_usd=request.spec.budget.max_llm_usd,
        )
        batch = await asyncio.to_thread(propose_batch, proposer, problem, context)
        output = ProposeOutput(
            candidates=batch.candidates,
            spent_usd=batch.spent_usd,
            budget_exhausted=batch.budget_exhausted,
            stop_reason=batch.stop_reason,
        )
        prefix = f"{request.search_id}/g{request.generation}"
        events = [
            self._event(
                f"{prefix}/proposed",
                "generation.proposed",
                {
                    "generation": request.generation,
                    "proposer": proposer.name,
                    "hints": request.spec.hints,
                    "incumbent_id": request.incumbent.candidate_id if request.incumbent else None,
                    "candidate_ids": [c.candidate_id for c in batch.candidates],
                    "spent_usd": output.spent_usd,
                    "budget_exhausted": output.budget_exhausted,
                    "stop_reason": output.stop_reason,
                },
            )
        ]
        events += [
            self._event(
                step_event_id(request.search_id, request.generation, c.candidate_id, "proposed"),
                "candidate.proposed",
                {"generation": request.generation, "candidate": c.model_dump(mode="json")},
            )
            for c in batch.candidates
        ]
        events += [self._event(i, t, p) for i, t, p in batch.outcome_events(request.search_id, request.generation)]
        await self._append_events(request.search_id, events)
        return output

    @activity.defn(name="kf.record")
    async def record(self, fact: RecordInput) -> None:
        """Append a workflow-level fact (target resolved, promotion, generation done, message, finish)."""
        await self._append(fact.search_id, fact.event_id, fact.type, fact.payload)

    # -- hardware queues -------------------------------------------------------------------------------

    @activity.defn(name="kf.describe_worker")
    async def describe_worker(self, target: str) -> TargetInfo:
        """Answer for this worker's hardware: which queue the target's steps should go to."""
        polled = activity.info().task_queue
        prefix = polled[: -len(target) - 1] if polled.endswith("-" + target) else "kf"
        resolved = cpu_target() if target == "cpu" else target
        return TargetInfo(
            target=resolved,
            queue=f"{prefix}-{resolved}",
            worker=self.identity,
            hardware=self.hardware(),
        )

    @activity.defn(name="kf.compile")
    async def compile(self, step: StepInput) -> StepOutput:
        """Compile a candidate into a content-addressed artifact, or a structured compile error."""
        event_id = step_event_id(step.search_id, step.generation, step.candidate.candidate_id, "compiled")
        recorded = await self._recorded_output(event_id) or await self._reuse(step, event_id, "compile")
        if recorded is not None:
            return recorded
        problem = self._problem(step.problem)
        result, seconds = await self._heartbeating(
            functools.partial(compile_source, problem, step.candidate.source, step.candidate.flags)
        )
        output = StepOutput(
            step="compile",
            verdict=str(result.verdict),
            event_id=event_id,
            artifact_id=result.artifact_id,
            summary=result.first_error or f"artifact {str(result.artifact_id)[:12]}",
            engine_seconds=seconds,
        )
        await self._append_outcome(step, event_id, "candidate.compiled", output, result)
        return output

    @activity.defn(name="kf.validate")
    async def validate(self, step: StepInput) -> StepOutput:
        """Prove a compiled candidate correct on fresh inputs, in the sandbox."""
        event_id = step_event_id(step.search_id, step.generation, step.candidate.candidate_id, "validated")
        recorded = await self._recorded_output(event_id) or await self._reuse(step, event_id, "validation")
        if recorded is not None:
            return recorded
        problem = self._problem(step.problem)
        artifact_id = self._artifact(step)
        report, seconds = await self._heartbeating(
            functools.partial(validate_artifact, problem, artifact_id, base_seed=step.seed, threads=step.threads)
        )
        _refuse_harness_error(report.verdict, report.message)
        first = report.cases[0].message if report.cases else ""
        output = StepOutput(
            step="validate",
            verdict=str(report.verdict),
            event_id=event_id,
            artifact_id=artifact_id,
            summary=first or f"{report.trials} trials passed",
            engine_seconds=seconds,
        )
        await self._append_outcome(step, event_id, "candidate.validated", output, report)
        return output

    @activity.defn(name="kf.benchmark")
    async def benchmark(self, step: StepInput) -> StepOutput:
        """Time a candidate against the incumbent and numpy, interleaved in one sandboxed process."""
        event_id = step_event_id(step.search_id, step.generation, step.candidate.candidate_id, "benchmarked")
        recorded = await self._recorded_output(event_id)
        if recorded is not None:
            return recorded
        problem = self._problem(step.problem)
        artifact_id = self._artifact(step)
        references = [Reference(kind="numpy", artifact_id=None, label="numpy")]
        if step.incumbent_artifact_id:
            references.insert(0, Reference(kind="artifact", artifact_id=step.incumbent_artifact_id, label="incumbent"))
        reports, seconds = await self._heartbeating(
            functools.partial(
                benchmark_artifact,
                problem,
                artifact_id,
                references,
                budget_s=step.benchmark_seconds,
                threads=step.threads,
                seed=step.seed,
                confidence=step.confidence,
            )
        )
        for report in reports:
            _refuse_harness_error(report.verdict, report.message)
        versus = reports[0]
        numpy_report = reports[-1]
        verdict = next((str(r.verdict) for r in reports if str(r.verdict) != "ok"), "ok")
        output = StepOutput(
            step="benchmark",
            verdict=verdict,
            event_id=event_id,
            artifact_id=artifact_id,
            ratio=versus.speedup,
            ratio_ci_low=versus.ci_low,
            ratio_ci_high=versus.ci_high,
            speedup=numpy_report.speedup,
            speedup_ci_low=numpy_report.ci_low,
            speedup_ci_high=numpy_report.ci_high,
            summary=self._benchmark_summary(reports),
            engine_seconds=seconds,
        )
        await self._append_outcome(
            step,
            event_id,
            "candidate.benchmarked",
            output,
            {"reports": [r.model_dump(mode="json") for r in reports]},
        )
        return output

    # -- plumbing ----------------------------------------------------------------------------------------

    @staticmethod
    def _benchmark_summary(reports: list[Any]) -> str:
        """`1.61x vs incumbent [1.57, 1.65], 3.29x vs numpy` — one phrase per reference point."""
        return ", ".join(f"{r.speedup:.3f}x vs {r.reference} [{r.ci_low:.3f}, {r.ci_high:.3f}]" for r in reports)

    def hardware(self) -> dict[str, Any]:
        """This worker's hardware fingerprint, computed once."""
        if self._hardware is None:
            self._hardware = hardware_fingerprint().model_dump(mode="json")
        return self._hardware

    def _problem(self, name: str) -> Problem:
        try:
            return load_problem(name)
        except UserError as error:
            raise non_retryable(error) from None

    @staticmethod
    def _artifact(step: StepInput) -> str:
        if not step.artifact_id:
            raise ApplicationError("a validate or benchmark step needs an artifact id", non_retryable=True)
        return step.artifact_id

    async def _heartbeating(self, work: Callable[[], T]) -> tuple[T, float]:
        """Run blocking engine work in a thread, heartbeating so a dead worker is noticed quickly.

        Returns the work's result and its wall time (what the step cost without orchestration)."""
        began = time.perf_counter()
        task = asyncio.ensure_future(asyncio.to_thread(work))
        while True:
            done, _ = await asyncio.wait({task}, timeout=HEARTBEAT_EVERY_S)
            if done:
                return task.result(), time.perf_counter() - began
            activity.heartbeat()

    async def _recorded_output(self, event_id: str) -> StepOutput | None:
        payload = await recorded_payload(self.store, event_id)
        if payload is None:
            return None
        output = StepOutput.model_validate(payload["output"])
        return output.model_copy(update={"reused": True})

    async def _recorded_proposal(self, request: ProposeInput) -> ProposeOutput | None:
        """The candidates a retried proposal already recorded: proposers read lessons (and models) that
        may have moved on since, and the same event ids must never be sent with other content."""
        recorded = await recorded_payload(self.store, f"{request.search_id}/g{request.generation}/proposed")
        if recorded is None:
            return None
        ids = [
            step_event_id(request.search_id, request.generation, cid, "proposed") for cid in recorded["candidate_ids"]
        ]
        rows = await self.store.pool.fetch("SELECT event_id, payload FROM events WHERE event_id = ANY($1)", ids)
        by_id = {row["event_id"]: row["payload"]["candidate"] for row in rows}
        return ProposeOutput(
            candidates=[Candidate.model_validate(by_id[i]) for i in ids],
            spent_usd=float(recorded.get("spent_usd", 0.0)),
            budget_exhausted=bool(recorded.get("budget_exhausted", False)),
            stop_reason=str(recorded.get("stop_reason", "")),
        )

    async def _reuse(self, step: StepInput, event_id: str, kind: Literal["compile", "validation"]) -> StepOutput | None:
        """The outcome an earlier search recorded for this candidate on this target and problem definition
        (engine/evidence/index.py), recorded again for this search with ``reused: true`` and a reference to
        the original event; None when there is nothing to reuse. Only compile and validation are reused:
        a benchmark is always repeated against the incumbent of the moment."""
        earlier = await recorded_evidence(self.store, step.search_id, step.candidate.candidate_id)
        if earlier is None:
            return None
        if kind == "compile":
            verdict, artifact_id = earlier.compile_verdict, earlier.artifact_id
            original, summary = earlier.compile_event_id, earlier.compile_summary
            # The artifact left this worker's cache: compile again (the validation is still reused).
            if verdict == "ok" and not _in_cache(artifact_id):
                return None
        else:
            verdict, artifact_id = earlier.validation_verdict, earlier.validated_artifact_id
            original, summary = earlier.validation_event_id, earlier.validation_summary
            if artifact_id != step.artifact_id:  # another build (compiler upgrade): judge it afresh
                return None
        if verdict is None or original is None:
            return None
        output = StepOutput(
            step="compile" if kind == "compile" else "validate",
            verdict=verdict,
            event_id=event_id,
            artifact_id=artifact_id,
            summary=f"{summary} (reused from {original})",
            reused=True,
        )
        body = await recorded_payload(self.store, original)
        evidence = {**((body or {}).get("evidence") or {}), **earlier.reference(kind)}
        event_type = "candidate.compiled" if kind == "compile" else "candidate.validated"
        await self._append_outcome(step, event_id, event_type, output, evidence)
        return output

    def _metadata(self) -> dict[str, Any]:
        metadata: dict[str, Any] = {"worker": self.identity}
        if activity.in_activity():
            info = activity.info()
            metadata |= {
                "workflow_id": info.workflow_id,
                "run_id": info.workflow_run_id,
                "activity_id": info.activity_id,
                "activity_type": info.activity_type,
                "attempt": info.attempt,
                "task_queue": info.task_queue,
            }
        return metadata

    def _event(self, event_id: str, event_type: str, payload: dict[str, Any]) -> NewEvent:
        return NewEvent(event_id=event_id, type=event_type, payload=payload, metadata=self._metadata())

    async def _append(self, search_id: str, event_id: str, event_type: str, payload: dict[str, Any]) -> None:
        await self._append_events(search_id, [self._event(event_id, event_type, payload)])

    async def _append_events(self, search_id: str, events: list[NewEvent]) -> list[RecordedEvent]:
        return await self.store.append(stream_of(search_id), events)

    async def _append_outcome(
        self, step: StepInput, event_id: str, event_type: str, output: StepOutput, evidence: Any
    ) -> None:
        body = evidence.model_dump(mode="json") if isinstance(evidence, BaseModel) else evidence
        event = self._event(
            event_id,
            event_type,
            {
                "generation": step.generation,
                "candidate_id": step.candidate.candidate_id,
                "output": output.model_dump(mode="json"),
                "evidence": body,
            },
        )
        event.metadata["hardware"] = self.hardware()
        await self._append_events(step.search_id, [event])


def _in_cache(artifact_id: str | None) -> bool:
    """True when this worker's artifact cache holds the compiled library."""
    try:
        return artifact_id is not None and artifact_path(artifact_id).is_file()
    except ValueError:  # not an artifact id of this backend
        return False

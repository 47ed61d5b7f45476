"""The search's activities: each turns one workflow step into calls on ``engine`` and appends its outcome.

Every outcome is appended under a deterministic event id (search, generation, candidate, step). A step
first looks for its own outcome: a step retried after its worker died, after the outcome was written but
before Temporal heard of it, returns the recorded outcome instead of compiling, validating or timing again.

Built artifacts go through the shared artifact store (engine/evidence/artifacts.py), so the step after a
compile may run on any worker: compile stores the artifact before recording its outcome; validate and
benchmark fetch what their worker's cache lacks. An artifact no worker can get is the machine's failure,
retried, never the kernel's verdict.

Outages are waited out, never verdicts (engine/outages.py). Every activity heartbeats while it runs and waits
out an unreachable database (``outage_tolerant``); a judgement the harness itself failed -- a sandbox killed
from outside -- is run again in a fresh sandbox, and then fails the step as HarnessError (``_judging``).
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import time
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Any, Literal, ParamSpec, TypeVar

from pydantic import BaseModel
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.metrics import observed_proposal, observed_record, observed_step
from engine.errors import ArtifactCorrupt, InfrastructureError, UserError
from engine.evidence.artifacts import ArtifactStore, StoredArtifact, digest_of
from engine.evidence.events import NewEvent, StreamHead
from engine.evidence.index import recorded_evidence, recorded_payload
from engine.evidence.lessons import lessons_for
from engine.evidence.store import EventStore
from engine.hardware import cpu_target, hardware_fingerprint, machine_key
from engine.harness.backend import Backend, backend_for, problem_for_target
from engine.harness.benchmarking import Reference
from engine.harness.driver import ArtifactNotFound
from engine.harness.verdicts import BenchmarkReport, CompileResult, ValidationReport, Verdict
from engine.outages import is_kernel_outcome, wait_out
from engine.problems import Problem, load_problem
from engine.proposers import ProposalContext, proposer_for
from engine.proposers.failures import read_recent_failures
from engine.proposers.outcomes import propose_batch
from engine.search.candidates import Candidate
from engine.search.history import best_incumbent_search, latest_incumbent_search, load_search_history, stream_of
from engine.search.steps import (
    ProposeInput,
    ProposeOutput,
    RecordInput,
    StartInput,
    StartOutput,
    StepInput,
    StepOutput,
    TargetInfo,
    confirmation_event_id,
    playoff_event_id,
    step_event_id,
)

T = TypeVar("T")
P = ParamSpec("P")
HEARTBEAT_EVERY_S = 2.0
EVENT_STORE = "the event store (Postgres)"
"""What an outage of the activities' database is called in messages."""


def _heartbeat() -> None:
    if activity.in_activity():
        activity.heartbeat()


async def _beating(work: Awaitable[T]) -> T:
    """Await ``work``, heartbeating every HEARTBEAT_EVERY_S meanwhile (and cancelling it if the step is)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=HEARTBEAT_EVERY_S)
            if done:
                return task.result()
            _heartbeat()
    finally:
        if not task.done():
            task.cancel()


def outage_tolerant(method: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """Every activity is wrapped in this. It heartbeats for as long as the activity runs: the workflow gives
    each step a short heartbeat timeout, so a completion lost while Temporal restarted (or a worker killed
    mid-step) is noticed within it and the step retried -- the retry finds the recorded outcome -- instead of
    the search stalling for the whole start-to-close timeout.

    And it waits out an outage of the database anywhere in the activity (engine/outages.py): the activity
    runs again, with back-off and heartbeating, until the database answers or the outage patience is spent.
    Running again is safe: every step first looks for its own recorded outcome. Past the patience the step
    fails as InfrastructureError, non-retryable (the patience was the retry budget), never as a verdict."""

    @functools.wraps(method)
    async def run(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await _beating(wait_out(lambda: method(*args, **kwargs), what=EVENT_STORE, on_wait=_heartbeat))
        except InfrastructureError as error:
            raise ApplicationError(str(error), type="InfrastructureError", non_retryable=True) from None

    return run


def _harness_failure(result: object, optional: Collection[str] = ()) -> str | None:
    """What the judge says went wrong with itself (not with the kernel), or None: a compile, validation or
    benchmark result with verdict harness_error (a sandboxed process killed from outside, a reference point
    that failed) is never recorded as the kernel's outcome. Benchmark reports against the ``optional``
    references (the GPU's library baseline, which a machine without CuPy cannot time) do not count."""
    for item in result if isinstance(result, list) else [result]:
        if isinstance(item, CompileResult) and item.verdict == Verdict.harness_error:
            return item.first_error or "the compiler's sandbox failed"
        if isinstance(item, BenchmarkReport) and item.reference in optional:
            continue
        if isinstance(item, ValidationReport | BenchmarkReport) and item.verdict == Verdict.harness_error:
            return item.message
    return None


def non_retryable(error: UserError) -> ApplicationError:
    """Bad input: fail the step (or the search) at once with the message, never retry it."""
    return ApplicationError(str(error), type=type(error).__name__, non_retryable=True)


def artifact_unavailable(message: str) -> ApplicationError:
    """An artifact this worker cannot get (in neither its cache nor the shared store, or corrupt there): the
    machine's problem, never the kernel's verdict. The step fails and is retried, here or on another worker."""
    return ApplicationError(message, type="ArtifactUnavailable")


class SearchActivities:
    """The activities of KernelSearch, bound to one event store, one worker's identity and artifact cache.

    Artifacts travel through the shared store (``artifacts``, default: the event store's database), never in
    Temporal payloads: compile stores what it built before recording the outcome, and validate and benchmark
    fetch what their worker's cache (``cache_dir``, default: the state folder's) lacks.
    """

    def __init__(
        self,
        store: EventStore,
        identity: str | None = None,
        *,
        artifacts: ArtifactStore | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        self.store = store
        self.identity = identity or f"kf-worker@{socket.gethostname()}:{os.getpid()}"
        self.artifacts = artifacts or ArtifactStore(store.pool)
        self.cache_dir = cache_dir
        self._hardware: dict[str, Any] | None = None
        self._machines: dict[str, str] = {}

    # -- control queue -----------------------------------------------------------------------------------

    @activity.defn(name="kf.start_search")
    @outage_tolerant
    async def start_search(self, start: StartInput) -> StartOutput:
        """Check the problem exists, open the search's record, and load what a resumed search starts from."""
        problem = self._problem(start.spec.problem, start.spec.target)
        await self._check_id_is_free(start)
        seed = Candidate.create(
            problem.seed_source(),
            start.spec.flags,
            label="seed",
            proposer="seed",
            tags=["seed"],
            rationale="the problem's naive seed kernel",
        )
        output = StartOutput(problem_fingerprint=problem.fingerprint(), seed_candidate=seed)
        resume_from = await self._resume_point(start)
        if resume_from:
            history = await load_search_history(self.store, resume_from)
            if history.started is None:
                raise non_retryable(
                    UserError(
                        f"resume_from {resume_from!r}: no such search in the event log; "
                        "`kf search list` shows the search ids"
                    )
                )
            earlier = history.started.payload.get("problem_name")
            if earlier is not None and earlier != problem.name:
                # Its incumbent is another problem's kernel: it would be timed as this one's seed.
                raise non_retryable(
                    UserError(
                        f"resume_from {resume_from!r} is a search of {earlier!r}, not {problem.name!r}: resume "
                        f"from a search of {problem.name!r} (`kf search list`), or start cold"
                    )
                )
            output.seen = history.evaluated_ids
            if history.incumbent is not None:
                incumbent = history.incumbent.candidate
                output.resumed_incumbent = history.incumbent
                # The earlier incumbent is timed again here: its figures belong to the earlier run's
                # machine and moment, and it must still beat numpy under today's noise.
                output.seed_candidate = incumbent.model_copy(
                    update={"proposer": "resumed", "rationale": f"incumbent of {resume_from}"}
                )
                output.seen = [i for i in output.seen if i != incumbent.candidate_id]
        seed_id = output.seed_candidate.candidate_id
        output.head = await self._append_events(
            start.search_id,
            [
                self._event(
                    f"{start.search_id}/started",
                    "search.started",
                    {
                        "spec": start.spec.model_dump(mode="json"),
                        "problem_fingerprint": output.problem_fingerprint,
                        "family": problem.family,
                        "problem_name": problem.name,
                        "seed_candidate_id": seed_id,
                        "resumed_from": resume_from,
                        "first_run_id": start.first_run_id,
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

    async def _check_id_is_free(self, start: StartInput) -> None:
        """Refuse a search id the event log already holds for another search: Temporal refuses only the ids it
        still holds, and once one passed its retention a new search under it would append to the old record (its
        start is refused as a different fact; its messages were not). A retried start of this very search (the
        same first run) passes."""
        recorded = await recorded_payload(self.store, f"{start.search_id}/started")
        if recorded is None:
            return
        if start.first_run_id is None or recorded.get("first_run_id") != start.first_run_id:
            spec = recorded.get("spec") or {}
            raise non_retryable(
                UserError(
                    f"search id {start.search_id!r} is taken: the event log holds an earlier search of "
                    f"{spec.get('problem', '?')!r} under it (`kf audit {start.search_id}`); start this one under "
                    "another id (--id), or none for a fresh one"
                )
            )

    async def _resume_point(self, start: StartInput) -> str | None:
        """The earlier search this one starts from: the spec's `resume_from`, with `resume_latest` the search
        that promoted last for the same problem and target, with `resume_best` the one whose incumbent is the
        fastest (None: a cold start)."""
        if not (start.spec.resume_latest or start.spec.resume_best):
            return start.spec.resume_from
        # A retried start keeps the search its recorded start named: another may have promoted since, and the
        # started event, appended under a fixed id, must not change.
        recorded = await recorded_payload(self.store, f"{start.search_id}/started")
        if recorded is not None:
            named: str | None = recorded.get("resumed_from")
            return named
        if start.spec.resume_best:
            return await best_incumbent_search(self.store, start.spec.problem, start.spec.target, start.search_id)
        return await latest_incumbent_search(self.store, start.spec.problem, start.spec.target, start.search_id)

    @activity.defn(name="kf.propose")
    @outage_tolerant
    @observed_proposal
    async def propose(self, request: ProposeInput) -> ProposeOutput:
        """Ask the proposer agents for a generation's candidates; record them with their lineage, and every
        LLM call and failed proposal, in one append (a retried round finds it recorded and never pays twice)."""
        problem = self._problem(request.spec.problem, request.target)
        try:
            proposer = proposer_for(request.spec.proposer.kind, models=request.spec.proposer.models)
        except UserError as error:
            raise non_retryable(error) from None
        recorded = await self._recorded_proposal(request)
        if recorded is not None:
            return recorded
        # Lessons of every search so far (this one's earlier generations included): priors for the search
        # proposer, the summary for LLM prompts. Recent failures are for the fixer.
        lessons = await lessons_for(
            self.store, problem.name, request.target, parameters=set(problem.template_params) or None
        )
        context = ProposalContext(
            search_id=request.search_id,
            problem=request.spec.problem,
            target=request.target,
            machine=request.target_machine,
            generation=request.generation,
            count=request.count,
            seed=request.spec.seed or 0,
            incumbent=request.incumbent,
            seen=request.seen,
            hints=request.spec.hints,
            flags=request.spec.flags,
            lessons=lessons.model_dump(mode="json"),
            lessons_summary=lessons.summary,
            models=request.spec.proposer.models,
            incumbent_evidence=request.incumbent_evidence,
            recent_failures=await read_recent_failures(self.store, stream_of(request.search_id)),
            llm_spent_usd=request.llm_spent_usd,
            llm_budget_usd=request.spec.budget.max_llm_usd,
        )
        # An LLM proposal may wait minutes on rate limits and slow models: it runs in a thread while this
        # activity heartbeats, so a lost completion is noticed within the heartbeat timeout, not 30 minutes.
        batch, _ = await self._heartbeating(functools.partial(propose_batch, proposer, problem, context))
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
        output.head = await self._append_events(request.search_id, events)
        return output

    @activity.defn(name="kf.record")
    @outage_tolerant
    @observed_record
    async def record(self, fact: RecordInput) -> StreamHead:
        """Append a workflow-level fact (target resolved, promotion, generation done, message, finish); returns
        the stream's head as of it, for the workflow's history to keep."""
        return await self._append(fact.search_id, fact.event_id, fact.type, fact.payload)

    # -- hardware queues -------------------------------------------------------------------------------

    @activity.defn(name="kf.describe_worker")
    @outage_tolerant
    async def describe_worker(self, target: str) -> TargetInfo:
        """Answer for this worker's hardware: which queue the target's steps should go to."""
        polled = activity.info().task_queue
        prefix = polled[: -len(target) - 1] if polled.endswith("-" + target) else "kf"
        resolved = cpu_target() if target == "cpu" else target
        backend = self._target_backend(resolved)
        return TargetInfo(
            target=resolved,
            queue=f"{prefix}-{resolved}",
            worker=self.identity,
            hardware=self.hardware(),
            machine=self.machine(backend),
            cpus=len(os.sched_getaffinity(0)) if backend.kind == "cpu" else None,
        )

    @activity.defn(name="kf.compile")
    @outage_tolerant
    @observed_step
    async def compile(self, step: StepInput) -> StepOutput:
        """Compile a candidate into a content-addressed artifact, or a structured compile error."""
        event_id = step_event_id(step.search_id, step.generation, step.candidate.candidate_id, "compiled")
        recorded = await self._recorded_output(event_id) or await self._reuse(step, event_id, "compile")
        if recorded is not None:
            return recorded
        problem = self._problem(step.problem, step.target)
        backend = self._backend(step)
        result, seconds = await self._judging(
            functools.partial(
                backend.compile, problem, step.candidate.source, step.candidate.flags, cache_dir=self.cache_dir
            )
        )
        evidence = result.model_dump(mode="json")
        if result.verdict == Verdict.ok and result.artifact_id:
            # Stored before the outcome is recorded: an ok compile in the log always has its artifact in the
            # shared store, for whichever worker validates or benchmarks it. The digest goes into the
            # hash-chained record, so the bytes that were judged can be checked later.
            stored = await self._publish(result.artifact_id, backend)
            evidence["artifact"] = stored.model_dump(mode="json", include={"kind", "digest", "size"})
        output = StepOutput(
            step="compile",
            verdict=str(result.verdict),
            event_id=event_id,
            artifact_id=result.artifact_id,
            summary=result.first_error or f"artifact {str(result.artifact_id)[:12]}",
            engine_seconds=seconds,
        )
        output.head = await self._append_outcome(step, event_id, "candidate.compiled", output, evidence)
        return output

    @activity.defn(name="kf.validate")
    @outage_tolerant
    @observed_step
    async def validate(self, step: StepInput) -> StepOutput:
        """Prove a compiled candidate correct on fresh inputs, in the sandbox."""
        event_id = step_event_id(step.search_id, step.generation, step.candidate.candidate_id, "validated")
        recorded = await self._recorded_output(event_id) or await self._reuse(step, event_id, "validation")
        if recorded is not None:
            return recorded
        problem = self._problem(step.problem, step.target)
        backend = self._backend(step)
        artifact_id = self._artifact(step)
        await self._fetch(artifact_id, backend)
        try:
            report, seconds = await self._judging(
                functools.partial(
                    backend.validate,
                    problem,
                    artifact_id,
                    seed=step.seed,
                    threads=step.threads,
                    cache_dir=self.cache_dir,
                )
            )
        except ArtifactNotFound as error:  # left the cache since it was fetched
            raise artifact_unavailable(str(error)) from None
        first = report.cases[0].message if report.cases else ""
        output = StepOutput(
            step="validate",
            verdict=str(report.verdict),
            event_id=event_id,
            artifact_id=artifact_id,
            summary=first or f"{report.trials} trials passed",
            engine_seconds=seconds,
        )
        output.head = await self._append_outcome(step, event_id, "candidate.validated", output, report)
        return output

    @activity.defn(name="kf.benchmark")
    @outage_tolerant
    @observed_step
    async def benchmark(self, step: StepInput) -> StepOutput:
        """Time a candidate against the incumbent and numpy, interleaved in one sandboxed process."""
        event_id = step_event_id(step.search_id, step.generation, step.candidate.candidate_id, "benchmarked")
        return await self._timed(step, event_id, "candidate.benchmarked", "benchmark")

    @activity.defn(name="kf.playoff")
    @outage_tolerant
    @observed_step
    async def playoff(self, step: StepInput) -> StepOutput:
        """One round of a search's final playoff: the challenger ``step.candidate`` timed against the playoff's
        leader (``step.incumbent_artifact_id``) and numpy, with the playoff's larger budget. Recorded as
        search.playoff_round: a re-measurement of candidates already judged, never a new candidate verdict."""
        assert step.incumbent_artifact_id is not None, "a playoff round needs the leader's artifact"
        event_id = playoff_event_id(step.search_id, step.candidate.candidate_id, step.incumbent_artifact_id)
        return await self._timed(step, event_id, "search.playoff_round", "playoff")

    @activity.defn(name="kf.confirm")
    @outage_tolerant
    @observed_step
    async def confirm(self, step: StepInput) -> StepOutput:
        """Re-measure a shaky promotion: the candidate ``step.candidate`` timed against the incumbent
        (``step.incumbent_artifact_id``) and numpy with the playoff's larger budget. Recorded as
        candidate.remeasured: a re-measurement of a candidate already judged, never a new verdict."""
        assert step.incumbent_artifact_id is not None, "a re-measurement needs the incumbent's artifact"
        event_id = confirmation_event_id(
            step.search_id, step.generation, step.candidate.candidate_id, step.incumbent_artifact_id
        )
        return await self._timed(step, event_id, "candidate.remeasured", "confirm")

    async def _timed(self, step: StepInput, event_id: str, event_type: str, name: str) -> StepOutput:
        """The benchmark step, a playoff round and a re-measurement alike: time, record under ``event_id``,
        return the figures."""
        recorded = await self._recorded_output(event_id)
        if recorded is not None:
            return recorded
        problem = self._problem(step.problem, step.target)
        backend = self._backend(step)
        artifact_id = self._artifact(step)
        await self._fetch(artifact_id, backend)
        # The library baseline: numpy on a CPU, the problem's CuPy baseline on a GPU. On a GPU it is optional:
        # a worker without CuPy cannot time it, and retrying the step elsewhere would not change that.
        library = backend.library_reference
        references: list[Reference] = [library]
        optional = (library.label,) if backend.kind == "cuda" else ()
        if step.incumbent_artifact_id:
            # The incumbent was built by whichever worker compiled it, maybe generations ago.
            await self._fetch(step.incumbent_artifact_id, backend)
            # A playoff round times its challenger against the playoff's leader, the incumbent only until a
            # challenger takes the lead: its summary names what it was timed against.
            label = "leader" if name == "playoff" else "incumbent"
            references.insert(0, Reference(kind="artifact", artifact_id=step.incumbent_artifact_id, label=label))
        try:
            reports, seconds = await self._judging(
                functools.partial(
                    backend.benchmark,
                    problem,
                    artifact_id,
                    references,
                    budget_s=step.benchmark_seconds,
                    threads=step.threads,
                    seed=step.seed,
                    confidence=step.confidence,
                    cache_dir=self.cache_dir,
                ),
                optional,
            )
        except ArtifactNotFound as error:  # left the cache since it was fetched
            raise artifact_unavailable(str(error)) from None
        versus = reports[0]
        numpy_report = reports[-1]
        untimed = numpy_report.reference in optional and numpy_report.verdict == Verdict.harness_error
        judged = reports[:-1] if untimed else reports
        verdict = next((str(r.verdict) for r in judged if str(r.verdict) != "ok"), "ok")
        output = StepOutput(
            step=name,
            verdict=verdict,
            event_id=event_id,
            artifact_id=artifact_id,
            # With no incumbent the ratio is over the library baseline, which a worker without CuPy has not timed.
            ratio=None if untimed and not judged else versus.speedup,
            ratio_ci_low=None if untimed and not judged else versus.ci_low,
            ratio_ci_high=None if untimed and not judged else versus.ci_high,
            speedup=None if untimed else numpy_report.speedup,
            speedup_ci_low=None if untimed else numpy_report.ci_low,
            speedup_ci_high=None if untimed else numpy_report.ci_high,
            roofline_fraction=versus.roofline_fraction,
            method=versus.method,
            machine=self.machine(backend),
            shared_cores=versus.shared_cores,
            summary=self._benchmark_summary(reports),
            engine_seconds=seconds,
        )
        output.head = await self._append_outcome(
            step,
            event_id,
            event_type,
            output,
            {
                "reports": [r.model_dump(mode="json") for r in reports],
                "incumbent_artifact_id": step.incumbent_artifact_id,
            },
        )
        return output

    # -- artifacts ---------------------------------------------------------------------------------------

    async def _publish(self, artifact_id: str, backend: Backend) -> StoredArtifact:
        """Put this worker's build of ``artifact_id`` into the shared store; return the stored record.

        When another worker stored another build of the same id first (a compiler that is not reproducible
        byte for byte), its bytes replace this worker's in the cache: every worker judges one binary per id."""
        data = await asyncio.to_thread(backend.cached_artifact, artifact_id, self.cache_dir)
        if data is None:
            raise artifact_unavailable(
                f"artifact {artifact_id} was built but is missing from this worker's cache "
                f"({backend.artifact_path(artifact_id, self.cache_dir)}): something removed it; the step is retried"
            )
        stored = await self.artifacts.put(artifact_id, backend.artifact_kind, data)
        if stored.digest != digest_of(data):
            await self._fetch(artifact_id, backend, replace=True)
        return stored

    async def _fetch(self, artifact_id: str, backend: Backend, *, replace: bool = False) -> None:
        """Make this worker's cache hold ``artifact_id``, fetched from the shared store on a miss (or always,
        with ``replace``). The cache entry is written atomically (engine/harness/cpu.py install_artifact): a
        worker killed mid-fetch leaves no partial library, and the retried step simply fetches again."""
        path = backend.artifact_path(artifact_id, self.cache_dir)
        if not replace and await asyncio.to_thread(path.is_file):
            return
        try:
            artifact = await self.artifacts.get(artifact_id)
        except ArtifactCorrupt as error:
            raise artifact_unavailable(str(error)) from None
        if artifact is None:
            raise artifact_unavailable(
                f"artifact {artifact_id} is in neither this worker's cache ({path}) nor the shared store; the step "
                "is retried. Do all workers use one database (KF_DATABASE_URL), migrated to 0006_artifacts?"
            )
        if artifact.kind != backend.artifact_kind:
            raise artifact_unavailable(
                f"artifact {artifact_id} is a {artifact.kind!r}, but this step loads {backend.artifact_kind!r} "
                "artifacts: a step reached a task queue of another backend"
            )
        await asyncio.to_thread(backend.install_artifact, artifact_id, artifact.data, self.cache_dir)

    async def _available(self, artifact_id: str | None, backend: Backend) -> bool:
        """True when any worker can fetch ``artifact_id``: it is in the shared store, or in this worker's cache
        (built before the store existed, say), from where it is stored now."""
        if artifact_id is None:
            return False
        try:
            path = backend.artifact_path(artifact_id, self.cache_dir)
        except ValueError:  # not an artifact id of this backend
            return False
        if await self.artifacts.describe(artifact_id) is not None:
            return True
        if not await asyncio.to_thread(path.is_file):
            return False
        await self._publish(artifact_id, backend)
        return True

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

    def machine(self, backend: Backend) -> str:
        """This worker's machine key for ``backend``'s target (engine/hardware.py machine_key), computed once."""
        if backend.target not in self._machines:
            self._machines[backend.target] = machine_key(backend.fingerprint())
        return self._machines[backend.target]

    def _problem(self, name: str, target: str | None = None) -> Problem:
        """The problem as ``target``'s backend sees it (its seed, template and entry point: C on a CPU, CUDA on
        a GPU); a problem without a kernel for the target is bad input, never retried."""
        try:
            return problem_for_target(load_problem(name), target or "cpu")
        except UserError as error:
            raise non_retryable(error) from None

    @classmethod
    def _backend(cls, step: StepInput) -> Backend:
        """The backend of the step's target (steps recorded before targets were carried are CPU steps)."""
        return cls._target_backend(step.target or "cpu")

    @staticmethod
    def _target_backend(target: str) -> Backend:
        """The backend of ``target``; a target no backend serves is bad input, never retried."""
        try:
            return backend_for(target)
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
        result = await _beating(asyncio.to_thread(work))
        return result, time.perf_counter() - began

    async def _judging(self, work: Callable[[], T], optional: Collection[str] = ()) -> tuple[T, float]:
        """Run a judgement (compile, validation, timing) like :meth:`_heartbeating`. A harness failure -- a
        sandboxed process killed from outside (the OOM killer, an operator), a reference point that failed:
        nothing the kernel can be shown to have caused -- is run once more, in a fresh sandbox (each run builds
        its own), before anything is concluded. A second one fails the step with HarnessError, which Temporal
        retries (here or on another worker): never a verdict, never recorded as the kernel's outcome."""
        result, seconds = await self._heartbeating(work)
        failure = _harness_failure(result, optional)
        if failure is None:
            return result, seconds
        activity.logger.warning("the harness failed, not the kernel (%s); running it again in a fresh sandbox", failure)
        result, again = await self._heartbeating(work)
        failure = _harness_failure(result, optional)
        if failure is not None:
            raise ApplicationError(f"the harness failed twice, not the kernel: {failure}", type="HarnessError")
        return result, seconds + again

    async def _recorded_output(self, event_id: str) -> StepOutput | None:
        event = await self.store.read_event(event_id)
        if event is None:
            return None
        output = StepOutput.model_validate(event.payload["output"])
        return output.model_copy(update={"reused": True, "head": StreamHead.of(event)})

    async def _recorded_proposal(self, request: ProposeInput) -> ProposeOutput | None:
        """The candidates a retried proposal already recorded: proposers read lessons (and models) that
        may have moved on since, and the same event ids must never be sent with other content."""
        proposed = await self.store.read_event(f"{request.search_id}/g{request.generation}/proposed")
        if proposed is None:
            return None
        recorded = proposed.payload
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
            head=StreamHead.of(proposed),
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
            # An artifact no worker can fetch is compiled again (the validation is still reused).
            if verdict == "ok" and not await self._available(artifact_id, self._backend(step)):
                return None
        else:
            verdict, artifact_id = earlier.validation_verdict, earlier.validated_artifact_id
            original, summary = earlier.validation_event_id, earlier.validation_summary
            if artifact_id != step.artifact_id:  # another build (compiler upgrade): judge it afresh
                return None
        if verdict is None or original is None:
            return None
        body = await recorded_payload(self.store, original)
        signal = ((body or {}).get("evidence") or {}).get("signal")
        if not is_kernel_outcome(verdict, signal if isinstance(signal, int) else None):
            # An infrastructure failure an older log recorded as a verdict (a sandbox killed from outside
            # reported as the kernel's crash): not evidence about the kernel, so it is judged afresh.
            return None
        output = StepOutput(
            step="compile" if kind == "compile" else "validate",
            verdict=verdict,
            event_id=event_id,
            artifact_id=artifact_id,
            summary=f"{summary} (reused from {original})",
            reused=True,
        )
        evidence = {**((body or {}).get("evidence") or {}), **earlier.reference(kind)}
        event_type = "candidate.compiled" if kind == "compile" else "candidate.validated"
        output.head = await self._append_outcome(step, event_id, event_type, output, evidence)
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

    async def _append(self, search_id: str, event_id: str, event_type: str, payload: dict[str, Any]) -> StreamHead:
        return await self._append_events(search_id, [self._event(event_id, event_type, payload)])

    async def _append_events(self, search_id: str, events: list[NewEvent]) -> StreamHead:
        """Append to the search's stream; returns its head as of the newest of these events (stored now, or
        before by the attempt this one retries), which the activity hands to the workflow's history."""
        # Waited out here, not by running the whole step again: the compile, validation or timing is done and
        # only its record is missing. A retried append of the same events is idempotent.
        recorded = await wait_out(
            lambda: self.store.append(stream_of(search_id), events), what=EVENT_STORE, on_wait=_heartbeat
        )
        return StreamHead.of(max(recorded, key=lambda e: e.stream_version))

    async def _append_outcome(
        self, step: StepInput, event_id: str, event_type: str, output: StepOutput, evidence: Any
    ) -> StreamHead:
        body = evidence.model_dump(mode="json") if isinstance(evidence, BaseModel) else evidence
        event = self._event(
            event_id,
            event_type,
            {
                "generation": step.generation,
                "candidate_id": step.candidate.candidate_id,
                "output": output.model_dump(mode="json", exclude={"head"}),
                "evidence": body,
            },
        )
        event.metadata["hardware"] = self.hardware()
        return await self._append_events(step.search_id, [event])

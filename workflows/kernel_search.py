"""KernelSearch: one workflow per search. Each generation is durable: propose → compile → validate →
benchmark → promote, every step an activity whose outcome lands in the event log.

Workflow code must be deterministic: no I/O, no clock but ``workflow.now()``, no randomness. Everything that
touches files, the database or kernel hardware is an activity.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey, SearchAttributeUpdate
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError, TimeoutType

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from engine.evidence.events import StreamHead
    from engine.input_errors import explain
    from engine.search.candidates import Candidate, short_name
    from engine.search.console import current_details
    from engine.search.promotion import choose_promotion, clears_margin, could_beat, readings_to_remeasure, shaky
    from engine.search.spec import (
        MAX_BENCHMARK_SECONDS,
        MAX_SEED,
        Budget,
        SearchSpec,
        check_hint,
        compile_queue,
        control_queue,
        target_queue,
    )
    from engine.search.state import (
        CandidateOutcome,
        Contender,
        Incumbent,
        SearchResult,
        SearchState,
        SearchStatus,
    )
    from engine.search.steps import (
        ProposeInput,
        ProposeOutput,
        RecordInput,
        StartInput,
        StartOutput,
        StepInput,
        StepOutput,
        TargetInfo,
    )

PROBLEM_ATTR = SearchAttributeKey.for_keyword("KernelProblem")
TARGET_ATTR = SearchAttributeKey.for_keyword("KernelTarget")
GENERATION_ATTR = SearchAttributeKey.for_int("Generation")
BEST_SPEEDUP_ATTR = SearchAttributeKey.for_float("BestSpeedup")

# Bad input is never retried: these error types fail the step (and, at start, the search) at once. So is an
# InfrastructureError: the activity already waited the outage patience (KF_OUTAGE_PATIENCE_S) for a server.
NON_RETRYABLE = [
    "UserError",
    "UnknownProblemError",
    "ProblemDefinitionError",
    "ConfigurationError",
    "ValidationError",
    "InfrastructureError",
]
# Every activity heartbeats for as long as it runs (activities/search.py, outage_tolerant) -- while an LLM
# thinks, while Postgres is waited out -- so a control step needs no long timeout to be safe: a completion lost
# while Temporal restarted, or a worker killed mid-step, is noticed within this heartbeat timeout and the step
# retried (it then finds its recorded outcome), instead of the search stalling for the start-to-close timeout.
CONTROL_HEARTBEAT = timedelta(seconds=20)
# Retried soon after an outage ends (the waits never grow past ten seconds), and for as long as CONTROL_PATIENCE
# allows rather than a number of times: every attempt a killed worker or a Temporal restart costs is an
# infrastructure failure, and a chaotic hour may bring many. Bad input fails at once (NON_RETRYABLE).
CONTROL_RETRY = RetryPolicy(
    maximum_interval=timedelta(seconds=10), maximum_attempts=0, non_retryable_error_types=NON_RETRYABLE
)
CONTROL_PATIENCE = timedelta(hours=1)
# A step on hardware is retried when its worker dies, its completion is lost in a Temporal restart, or the
# harness failed twice (HarnessError): none of them the kernel's doing, and a chaotic hour may see several
# for one step. A kernel's own failure is a verdict, returned normally, so it is never retried.
HARDWARE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=10,
    non_retryable_error_types=NON_RETRYABLE,
)
# The start-to-close timeout of a control step that only reads and appends: a backstop against an attempt that
# is alive but stuck, longer than the default outage patience (600 s) the step may spend waiting for Postgres.
RECORD_MINUTES = 15
# The final playoff: at most this many challengers, the fastest correct candidates not known to be slower than
# the incumbent, each timed against the playoff's leader with this many times a candidate's benchmark budget.
PLAYOFF_CONTENDERS = 3
PLAYOFF_BUDGET_MULTIPLE = 4.0
# Histories recorded before the playoff existed replay without it (workflow.patched).
PLAYOFF_PATCH = "final-playoff"
# Histories recorded before a broken problem definition stopped the search replay as they ran (every candidate
# a harness_error).
PROBLEM_DEFINITION_PATCH = "problem-definition-stops-search"
# Histories recorded before shaky promotions were re-measured replay without it.
CONFIRM_PATCH = "confirm-shaky-promotions"
# Histories recorded before a generation's shaky readings were re-measured ahead of its promotion replay
# without it.
STEER_PATCH = "remeasure-shaky-readings"
# Histories recorded before a challenger could qualify for the playoff by its head-to-head ratio replay without it.
PLAYOFF_RATIO_PATCH = "playoff-head-to-head"
# Histories recorded before the search's Generation attribute was set once more as it ended replay without that
# last upsert (a command: a new one would not match their history).
FINAL_GENERATION_PATCH = "final-generation-attribute"
STATE_KEY = "state"


MESSAGE_UNFINISHED = workflow.HandlerUnfinishedPolicy.ABANDON
"""A message (pause, hint, ...) still waiting for the search's record to open when the search fails to start is
dropped, its sender told the search has ended: the workflow must not fail its own last task over it. A search that
ends normally first waits for every handler (all_handlers_finished)."""


@workflow.defn(name="KernelSearch")
class KernelSearch:
    """Searches for a faster kernel for ``spec.problem`` on ``spec.target``."""

    def __init__(self) -> None:
        self._state: SearchState | None = None
        self._generations_this_run = 0
        # The seed candidate of generation 0, and every candidate seen in this run, by id (for promotion).
        self._seed: Candidate | None = None
        self._proposed: dict[str, Candidate] = {}
        # Set when a generation proposes nothing new; the search then ends.
        self._exhausted: str | None = None
        # The fastest correct candidate measured in the running generation, until the generation's promotion.
        self._leading: CandidateOutcome | None = None
        # What is under way now, for people: "propose" or "playoff" or a candidate id, to the step it is in.
        # Workflow code sets it, so a replay rebuilds it; it is never persisted.
        self._doing: dict[str, str] = {}
        # Set once the search's record is open (search.started appended, or by an earlier run): a message that
        # arrives before is recorded after it, never in a stream the start may yet refuse as another search's.
        self._opened = False

    # -- entry -----------------------------------------------------------------------------------------

    @workflow.run
    async def run(self, raw: Any = None) -> SearchResult:
        # The input is any JSON, validated here: a bad payload from the UI fails the search at once with
        # pydantic's message, instead of failing the workflow task (which Temporal would retry forever). It is
        # typed `Any`, not a dict: with a dict hint the SDK itself refuses `[1]` while decoding, as a task failure.
        state = self._state_from_input(raw)
        self._state = state
        self._show_progress()
        spec = state.spec
        queues = control_queue(spec.task_queue_prefix)
        if state.started_at is None:
            state.started_at = workflow.now()
            if spec.seed is None:
                # A fresh seed per search (workflow.random() is recorded with the run, so replay draws the same),
                # kept in the spec that search.started records: the search can be repeated exactly with it.
                state.spec = spec = spec.model_copy(update={"seed": workflow.random().randint(0, MAX_SEED)})
            start = await self._control(
                "kf.start_search",
                StartInput(search_id=state.search_id, spec=spec, first_run_id=workflow.info().first_execution_run_id),
                StartOutput,
            )
            state.evaluated.extend(i for i in start.seen if i not in state.evaluated)
            self._seed = start.seed_candidate
            self._witness(start.head)
        else:
            self._seed = None
        self._opened = True
        if state.target_queue is None:
            info = await self._resolve_target(spec)
            if info.cpus is not None and spec.threads > info.cpus:
                # Every benchmark would fail on the worker, retried and then counted as the harness's failure, for
                # the search's whole budget: the request is what is wrong, so the search ends at once, saying so.
                raise ApplicationError(
                    f"invalid search input: threads = {spec.threads}, but the worker serving {info.target} "
                    f"({info.worker}) may use {info.cpus} CPUs; ask for at most {info.cpus} (--threads), or start "
                    "`kf worker` on a machine with more cores",
                    type="ValidationError",
                    non_retryable=True,
                )
            state.target_queue = info.queue
            state.target_machine = info.machine
            await self._record(f"{state.search_id}/target", "search.target_resolved", info.model_dump(mode="json"))
        self._upsert_progress()
        self._show_progress()
        workflow.logger.info("search %s runs on %s (control %s)", state.search_id, state.target_queue, queues)

        while state.generation <= spec.generations and not self._should_end():
            await workflow.wait_condition(lambda: not state.paused or state.stop_requested)
            if self._should_end():
                break
            await self._run_generation()
            state.generation += 1
            self._generations_this_run += 1
            self._upsert_progress()
            self._show_progress()
            if state.generation <= spec.generations and self._should_continue_as_new():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new({STATE_KEY: state.model_dump(mode="json")})

        if state.incumbent is not None and not state.playoff_rounds and workflow.patched(PLAYOFF_PATCH):
            await self._playoff()
        state.status = self._final_status()
        if workflow.patched(FINAL_GENERATION_PATCH):
            # Ended, the search shows its last generation run, not the one it was about to run.
            self._upsert_progress()
        self._show_progress()
        result = self._result()
        await self._record(
            f"{state.search_id}/finished",
            "search.finished",
            result.model_dump(mode="json", exclude={"head", "progress"}),
        )
        await workflow.wait_condition(workflow.all_handlers_finished)
        # The result names the stream's head after its last event (the finished record, or a message handled
        # since): kept in the history, it is the witness that nothing was removed or added after it. Its progress
        # is the status query's last answer, read from the history once no worker runs the search.
        ended = self.status().model_copy(update={"step": "", "leading_speedup": None, "leading": None})
        return result.model_copy(update={"head": state.head, "progress": ended})

    def _state_from_input(self, raw: Any) -> SearchState:
        try:
            if isinstance(raw, dict) and STATE_KEY in raw:
                return SearchState.model_validate(raw[STATE_KEY])
            spec = SearchSpec.model_validate(raw)
        except ValidationError as error:
            model = SearchState if isinstance(raw, dict) and STATE_KEY in raw else SearchSpec
            raise ApplicationError(
                f"invalid search input: {explain(error, model)}", type="ValidationError", non_retryable=True
            ) from None
        return SearchState(search_id=workflow.info().workflow_id, spec=spec)

    # -- one generation ----------------------------------------------------------------------------------

    async def _run_generation(self) -> None:
        state = self._require_state()
        spec = state.spec
        if state.generation == 0:
            seed = self._seed
            if seed is None:  # continued as new before generation 0 ran: impossible, but say so plainly
                raise ApplicationError("generation 0 has no seed candidate", non_retryable=True)
            candidates = [seed]
        else:
            count = min(spec.candidates_per_generation, self._candidates_left())
            if count <= 0:
                return
            inc = state.incumbent
            self._doing["propose"] = f"proposing {count} candidate{'s' if count != 1 else ''}"
            proposal: ProposeOutput = await self._control(
                "kf.propose",
                ProposeInput(
                    search_id=state.search_id,
                    spec=spec,
                    target=self._target_name(),
                    target_machine=state.target_machine,
                    generation=state.generation,
                    count=count,
                    incumbent=inc.candidate if inc else None,
                    seen=list(state.evaluated),
                    incumbent_evidence=(
                        {
                            "speedup": inc.speedup,
                            "ci_low": inc.ci_low,
                            "ci_high": inc.ci_high,
                            "generation": inc.generation,
                        }
                        if inc
                        else {}
                    ),
                    llm_spent_usd=state.llm_spend_usd,
                ),
                ProposeOutput,
                # LLM proposers may wait out rate limits and slow models; offline proposers take seconds. The
                # proposal heartbeats while it waits, so a lost completion costs CONTROL_HEARTBEAT, not this.
                minutes=30,
            )
            self._doing.pop("propose", None)
            state.llm_spend_usd += proposal.spent_usd
            self._witness(proposal.head)
            candidates = proposal.candidates
            for candidate in candidates:
                self._proposed[candidate.candidate_id] = candidate
            if not candidates:
                # Nothing new to try: the template space is exhausted or the LLM budget stopped the models.
                self._exhausted = proposal.stop_reason or "the proposers have nothing new to propose"
                return
        limit = asyncio.Semaphore(spec.parallelism)

        async def bounded(candidate: Candidate) -> CandidateOutcome | None:
            async with limit:
                return await self._evaluate(candidate)

        results = await asyncio.gather(*(bounded(c) for c in candidates))
        outcomes = [o for o in results if o is not None]
        # Every candidate of the generation is judged: the promotion decides now, and no candidate is "leading".
        self._leading = None
        self._show_progress()
        if workflow.patched(STEER_PATCH):
            await self._remeasure_shaky(outcomes)
        await self._promote(outcomes)
        await self._record(
            f"{state.search_id}/g{state.generation}/completed",
            "generation.completed",
            {
                "generation": state.generation,
                "outcomes": [o.model_dump(mode="json") for o in outcomes],
                "incumbent_id": state.incumbent.candidate.candidate_id if state.incumbent else None,
                "best_speedup": state.incumbent.speedup if state.incumbent else None,
            },
        )

    async def _evaluate(self, candidate: Candidate) -> CandidateOutcome | None:
        state = self._require_state()
        # Pause and stop take effect between candidates: a started candidate finishes all its steps, so the
        # record never holds half an evaluation.
        await workflow.wait_condition(lambda: not state.paused or state.stop_requested)
        if self._should_end() or candidate.candidate_id in state.evaluated:
            return None
        if state.generation > 0 and self._candidates_left() <= 0:
            return None
        state.evaluated.append(candidate.candidate_id)
        step = StepInput(
            search_id=state.search_id,
            generation=state.generation,
            problem=state.spec.problem,
            candidate=candidate,
            threads=state.spec.threads,
            benchmark_seconds=state.spec.benchmark_seconds,
            # The interval promotion reads must be at the level the policy (and the promotion event) states.
            confidence=state.spec.promotion.confidence,
            seed=(state.spec.seed or 0) + state.generation,
            target=self._target_name(),
        )
        outcome = CandidateOutcome(candidate_id=candidate.candidate_id, label=candidate.label, verdict="harness_error")
        stage = "compile"
        try:
            # A CUDA source compiles on the build queue every worker polls (NVRTC needs no GPU), a C source on its
            # target's own queue (it is built for that ISA).
            queue = compile_queue(state.spec.task_queue_prefix, self._target_name())
            self._doing[candidate.candidate_id] = "compiling"
            # Two compiler runs, each of which a loaded machine may stretch to four times its two minutes
            # (engine/harness/compile_patience.py): the activity outlasts both.
            compiled = await self._hardware("kf.compile", step, minutes=20, queue=queue)
            self._witness(compiled.head)
            outcome.verdict, outcome.artifact_id = compiled.verdict, compiled.artifact_id
            if compiled.verdict == "ok":
                step.artifact_id = compiled.artifact_id
                stage = "validate"
                self._doing[candidate.candidate_id] = "validating"
                validated = await self._hardware("kf.validate", step, minutes=20)
                self._witness(validated.head)
                outcome.verdict = validated.verdict
                if validated.verdict == "ok":
                    step.incumbent_artifact_id = state.incumbent.artifact_id if state.incumbent else None
                    stage = "benchmark"
                    self._doing[candidate.candidate_id] = "benchmarking"
                    timed = await self._hardware("kf.benchmark", step, minutes=30)
                    self._witness(timed.head)
                    self._count_timing(timed)
                    outcome.verdict = timed.verdict
                    outcome.ratio, outcome.ratio_ci_low = timed.ratio, timed.ratio_ci_low
                    outcome.ratio_ci_high = timed.ratio_ci_high
                    outcome.speedup, outcome.speedup_ci_low = timed.speedup, timed.speedup_ci_low
                    outcome.speedup_ci_high = timed.speedup_ci_high
                    outcome.roofline_fraction = timed.roofline_fraction
                    outcome.shared_cores = timed.shared_cores
                    outcome.timed_against = step.incumbent_artifact_id
        except ActivityError as error:
            # The harness or the infrastructure failed past its retries (a kernel's failure is a verdict,
            # returned normally): the candidate was not judged. Its outcome says exactly that -- never the
            # verdict of the last step that did finish ("ok" after compiling is no verdict on the kernel) -- it
            # is recorded, reported apart from the kernels' verdicts, and the search goes on.
            outcome = CandidateOutcome(
                candidate_id=candidate.candidate_id,
                label=candidate.label,
                verdict="harness_error",
                artifact_id=outcome.artifact_id,
            )
            cause = error.cause
            await self._record(
                f"{state.search_id}/g{state.generation}/{candidate.candidate_id[:24]}/harness_error",
                "candidate.harness_error",
                {
                    "candidate_id": candidate.candidate_id,
                    "generation": state.generation,
                    "step": stage,
                    "error_type": cause.type if isinstance(cause, ApplicationError) else type(cause or error).__name__,
                    "error": str(cause or error),
                },
            )
            if (
                isinstance(cause, ApplicationError)
                and cause.type == "ProblemDefinitionError"
                and workflow.patched(PROBLEM_DEFINITION_PATCH)
            ):
                # The problem's own code failed (its reference, inputs, tolerance or roofline): no candidate can be
                # judged until problem.py is fixed, and every one would end as this one did. Stop with the reason,
                # instead of spending the budget on harness errors; everything recorded so far stays.
                raise ApplicationError(
                    f"the problem's definition failed, not a kernel: {cause.message}. Start a new search once "
                    "problem.py is fixed (`kf problem check` runs the same code)",
                    type="ProblemDefinitionError",
                    non_retryable=True,
                ) from None
        self._doing.pop(candidate.candidate_id, None)
        if outcome.verdict == "harness_error":
            state.harness_errors.append(candidate.candidate_id)
        else:
            state.verdict_counts[outcome.verdict] = state.verdict_counts.get(outcome.verdict, 0) + 1
        if outcome.verdict == "ok" and outcome.speedup is not None:
            if self._leading is None or outcome.speedup > (self._leading.speedup or 0.0):
                self._leading = outcome
            self._keep_contender(candidate, outcome)
        self._show_progress()
        return outcome

    def _keep_contender(self, candidate: Candidate, outcome: CandidateOutcome) -> None:
        """Keep the fastest correct candidates (by speedup over numpy) for the final playoff."""
        state = self._require_state()
        if outcome.artifact_id is None or any(
            c.candidate.candidate_id == candidate.candidate_id for c in state.contenders
        ):
            return
        state.contenders.append(Contender(candidate=candidate, outcome=outcome))
        state.contenders.sort(key=lambda c: (-(c.outcome.speedup or 0.0), c.candidate.candidate_id))
        # One more than the challengers: the incumbent itself is usually among them.
        del state.contenders[PLAYOFF_CONTENDERS + 1 :]

    # -- the final playoff -----------------------------------------------------------------------------

    async def _playoff(self) -> None:
        """Time the incumbent against the best other candidates with a larger budget, so the search ends on
        the fastest kernel it saw, not on one a 2% promotion margin (or a noisy reading) left in place.

        Challengers: contenders not known to be slower than the incumbent (``could_beat``: a speedup interval
        that reaches the incumbent's lower end, or a head-to-head ratio interval that reaches 1), fastest first. Each
        round times a challenger against the current leader (the incumbent to begin with); the challenger
        takes the lead when the lower end of its ratio's interval is above 1 -- faster with confidence, with no
        margin: the margin rations exploration, and here nothing is left to explore. A round the harness could
        not finish (infrastructure) leaves the leader in place and says so."""
        state = self._require_state()
        incumbent = state.incumbent
        assert incumbent is not None
        spec = state.spec
        head_to_head = workflow.patched(PLAYOFF_RATIO_PATCH)
        challengers = [
            c
            for c in state.contenders
            if c.candidate.candidate_id != incumbent.candidate.candidate_id
            and could_beat(c.outcome, incumbent, head_to_head)
        ][:PLAYOFF_CONTENDERS]
        if not challengers:
            return
        leader_candidate, leader_artifact = incumbent.candidate, incumbent.artifact_id
        won: StepOutput | None = None
        for number, challenger in enumerate(challengers, start=1):
            assert challenger.outcome.artifact_id is not None
            step = self._remeasure_step(
                challenger.candidate,
                challenger.outcome.artifact_id,
                leader_artifact,
                state.current_generation,
                (spec.seed or 0) + 1_000_003 * number,
            )
            round_: dict[str, Any] = {
                "round": number,
                "challenger_id": challenger.candidate.candidate_id,
                "challenger_label": challenger.candidate.label,
                "leader_id": leader_candidate.candidate_id,
            }
            self._doing["playoff"] = f"final playoff round {number} of {len(challengers)}"
            try:
                timed = await self._hardware("kf.playoff", step, minutes=30)
            except ActivityError as error:
                round_ |= {"verdict": "harness_error", "error": str(error.cause or error), "challenger_won": False}
                state.playoff_rounds.append(round_)
                continue
            self._witness(timed.head)
            self._count_timing(timed)
            took_lead = timed.verdict == "ok" and timed.ratio_ci_low is not None and timed.ratio_ci_low > 1.0
            round_ |= {
                "verdict": timed.verdict,
                "ratio": timed.ratio,
                "ratio_ci_low": timed.ratio_ci_low,
                "ratio_ci_high": timed.ratio_ci_high,
                "speedup": timed.speedup,
                "challenger_won": took_lead,
            }
            state.playoff_rounds.append(round_)
            if took_lead:
                leader_candidate, leader_artifact, won = challenger.candidate, challenger.outcome.artifact_id, timed
        self._doing.pop("playoff", None)
        winner = leader_candidate.candidate_id
        await self._record(
            f"{state.search_id}/playoff",
            "search.playoff",
            {
                "incumbent_id": incumbent.candidate.candidate_id,
                "winner_id": winner,
                "rounds": state.playoff_rounds,
                "budget_seconds": min(spec.benchmark_seconds * PLAYOFF_BUDGET_MULTIPLE, MAX_BENCHMARK_SECONDS),
            },
        )
        if won is None or won.speedup is None:
            return
        await self._install_incumbent(
            leader_candidate,
            leader_artifact,
            won,
            state.current_generation,
            "won the final playoff: faster than the leader with confidence, timed with a larger budget",
            f"{state.search_id}/playoff/promoted",
        )

    def _count_timing(self, timed: StepOutput) -> None:
        """Count a timing the search took, and whether its cores ran other work meanwhile (a busy machine's)."""
        state = self._require_state()
        state.timings += 1
        state.busy_timings += int(timed.shared_cores)

    def _remeasure_step(
        self, candidate: Candidate, artifact_id: str, leader_artifact: str, generation: int, seed: int
    ) -> StepInput:
        """A re-measurement of ``candidate`` against the leader's artifact with the playoff's larger budget: a
        final playoff round (search.playoff_round), or the confirmation of a shaky promotion (candidate.remeasured)."""
        state = self._require_state()
        spec = state.spec
        return StepInput(
            search_id=state.search_id,
            generation=generation,
            problem=spec.problem,
            candidate=candidate,
            threads=spec.threads,
            artifact_id=artifact_id,
            incumbent_artifact_id=leader_artifact,
            benchmark_seconds=min(spec.benchmark_seconds * PLAYOFF_BUDGET_MULTIPLE, MAX_BENCHMARK_SECONDS),
            confidence=spec.promotion.confidence,
            seed=seed,
            target=self._target_name(),
        )

    async def _remeasure_shaky(self, outcomes: list[CandidateOutcome]) -> None:
        """Re-measure the generation's fastest shaky readings (``promotion.steering_remeasures`` of them)
        against the incumbent with the playoff's larger budget before anything uses them: the promotion below
        and, through the lessons (which fold candidate.remeasured as another reading of the setting), the next
        proposal. A re-measured outcome takes the re-measurement's figures. One the harness could not finish,
        or that did not come back ok, keeps its first reading, which still needs a confirmation to promote."""
        state = self._require_state()
        policy = state.spec.promotion
        if state.incumbent is None:
            return
        for outcome in readings_to_remeasure([o for o in outcomes if o.artifact_id is not None], policy):
            timed = await self._remeasure(outcome, outcome.candidate_id, "re-measuring a shaky reading")
            if timed is None or timed.verdict != "ok" or timed.speedup is None or timed.ratio is None:
                continue
            outcome.ratio, outcome.ratio_ci_low, outcome.ratio_ci_high = (
                timed.ratio,
                timed.ratio_ci_low,
                timed.ratio_ci_high,
            )
            outcome.speedup, outcome.speedup_ci_low = timed.speedup, timed.speedup_ci_low
            outcome.speedup_ci_high = timed.speedup_ci_high
            outcome.roofline_fraction = timed.roofline_fraction
            outcome.shared_cores = timed.shared_cores
            outcome.timed_against = state.incumbent.artifact_id
            outcome.remeasured = True
        # The contenders were sorted by the first readings.
        state.contenders.sort(key=lambda c: (-(c.outcome.speedup or 0.0), c.candidate.candidate_id))

    async def _confirm(self, chosen: CandidateOutcome) -> StepOutput | None:
        """Re-measure a shaky promotion against the incumbent with the larger budget: the re-measurement when
        it clears the margin too, else None (no promotion this generation; the harness failing is no
        confirmation either). A load spike once read 4.18x [3.40, 5.19] for a kernel that re-measured 2.9x."""
        state = self._require_state()
        timed = await self._remeasure(chosen, "confirm", "re-measuring a shaky promotion")
        if timed is None or not clears_margin(timed, state.spec.promotion) or timed.speedup is None:
            return None
        return timed

    async def _remeasure(self, outcome: CandidateOutcome, doing_key: str, doing: str) -> StepOutput | None:
        """Time ``outcome``'s candidate again against the incumbent with the playoff's larger budget
        (kf.confirm, recorded as candidate.remeasured: one event per candidate, generation and incumbent, so
        a shaky reading's re-measurement and its promotion's confirmation are the same); None when the harness
        could not finish it."""
        state = self._require_state()
        assert state.incumbent is not None and outcome.artifact_id is not None
        step = self._remeasure_step(
            self._candidate_by_id(outcome.candidate_id),
            outcome.artifact_id,
            state.incumbent.artifact_id,
            state.generation,
            (state.spec.seed or 0) + 2_000_003 + state.generation,
        )
        self._doing[doing_key] = doing
        try:
            timed = await self._hardware("kf.confirm", step, minutes=30)
        except ActivityError:
            return None
        finally:
            self._doing.pop(doing_key, None)
        self._witness(timed.head)
        self._count_timing(timed)
        return timed

    async def _promote(self, outcomes: list[CandidateOutcome]) -> None:
        state = self._require_state()
        if state.incumbent is None:
            # Nothing to beat yet (generation 0, or every earlier candidate failed): the fastest correct
            # candidate becomes the first incumbent, whatever its speed against numpy.
            correct = [o for o in outcomes if o.verdict == "ok" and o.speedup is not None]
            chosen = max(correct, key=lambda o: (o.speedup or 0.0, o.candidate_id), default=None)
            reason = "first correct candidate"
        else:
            chosen = choose_promotion(outcomes, state.spec.promotion)
            reason = (
                f"faster than the incumbent beyond the {state.spec.promotion.margin:.0%} margin "
                f"at {state.spec.promotion.confidence:.0%} confidence"
            )
        if chosen is None or chosen.artifact_id is None or chosen.speedup is None:
            return
        figures: CandidateOutcome | StepOutput = chosen
        if state.incumbent is not None and chosen.remeasured:
            # Its figures are already the re-measurement's, and they cleared the margin.
            reason += ", confirmed by a re-measurement with the playoff's larger budget"
        elif state.incumbent is not None and shaky(chosen, state.spec.promotion) and workflow.patched(CONFIRM_PATCH):
            confirmed = await self._confirm(chosen)
            if confirmed is None:
                return
            figures = confirmed
            reason += ", confirmed by a re-measurement with the playoff's larger budget"
        await self._install_incumbent(
            self._candidate_by_id(chosen.candidate_id),
            chosen.artifact_id,
            figures,
            state.generation,
            reason,
            f"{state.search_id}/g{state.generation}/promoted",
        )

    async def _install_incumbent(
        self,
        candidate: Candidate,
        artifact_id: str,
        figures: CandidateOutcome | StepOutput,
        generation: int,
        reason: str,
        event_id: str,
    ) -> None:
        """Make ``candidate`` the incumbent with the speedup ``figures`` measured, and record the promotion
        (a generation's promotion and the final playoff's alike)."""
        state = self._require_state()
        assert figures.speedup is not None
        previous = state.incumbent.candidate.candidate_id if state.incumbent else None
        state.incumbent = Incumbent(
            candidate=candidate,
            artifact_id=artifact_id,
            speedup=figures.speedup,
            ci_low=figures.speedup_ci_low if figures.speedup_ci_low is not None else figures.speedup,
            ci_high=figures.speedup_ci_high if figures.speedup_ci_high is not None else figures.speedup,
            generation=generation,
            roofline_fraction=figures.roofline_fraction,
        )
        promotion = {
            "generation": generation,
            "candidate_id": candidate.candidate_id,
            "label": candidate.label,
            "previous_id": previous,
            "ratio": figures.ratio,
            "ratio_ci_low": figures.ratio_ci_low,
            "ratio_ci_high": figures.ratio_ci_high,
            "speedup": figures.speedup,
            "roofline_fraction": figures.roofline_fraction,
            "reason": reason,
        }
        state.promotions.append(promotion)
        self._show_progress()
        await self._record(
            event_id, "incumbent.promoted", {**promotion, "incumbent": state.incumbent.model_dump(mode="json")}
        )

    def _candidate_by_id(self, candidate_id: str) -> Candidate:
        # The candidates of the running generation are held by gather's closures; keep a lookup instead of
        # threading the full candidate through every outcome.
        found = self._proposed.get(candidate_id)
        if found is None:
            raise ApplicationError(f"candidate {candidate_id} was not proposed in this generation")
        return found

    # -- activities ----------------------------------------------------------------------------------------

    async def _control(self, name: str, arg: Any, result_type: Any, minutes: int = RECORD_MINUTES) -> Any:
        spec = self._require_state().spec
        try:
            result = await workflow.execute_activity(
                name,
                arg,
                task_queue=control_queue(spec.task_queue_prefix),
                start_to_close_timeout=timedelta(minutes=minutes),
                schedule_to_close_timeout=max(CONTROL_PATIENCE, 2 * timedelta(minutes=minutes)),
                heartbeat_timeout=CONTROL_HEARTBEAT,
                retry_policy=CONTROL_RETRY,
                result_type=result_type,
            )
        except ActivityError as error:
            # Bad input found by a control step (an unknown problem, no model configured) ends the search
            # with the step's own message, not a bare "activity task failed".
            cause = error.cause
            if isinstance(cause, ApplicationError) and cause.non_retryable:
                raise ApplicationError(cause.message, type=cause.type, non_retryable=True) from None
            raise
        return result

    async def _hardware(self, name: str, step: StepInput, minutes: int, queue: str | None = None) -> StepOutput:
        """Run a hardware step on ``queue`` (default: the target's queue)."""
        state = self._require_state()
        self._proposed[step.candidate.candidate_id] = step.candidate
        result: StepOutput = await workflow.execute_activity(
            name,
            step,
            task_queue=queue or state.target_queue,
            start_to_close_timeout=timedelta(minutes=minutes),
            # Long steps heartbeat: a killed worker is noticed within this time and the step is retried on
            # the next worker to poll, which finds any outcome already recorded and does not redo it.
            heartbeat_timeout=timedelta(seconds=state.spec.heartbeat_seconds),
            retry_policy=HARDWARE_RETRY,
            result_type=StepOutput,
        )
        return result

    async def _resolve_target(self, spec: SearchSpec) -> TargetInfo:
        queue = target_queue(spec.task_queue_prefix, spec.target)
        try:
            info: TargetInfo = await workflow.execute_activity(
                "kf.describe_worker",
                spec.target,
                task_queue=queue,
                # No worker polling this queue within the wait means no hardware serves the target: fail
                # with a message naming the queue instead of waiting forever.
                schedule_to_start_timeout=timedelta(seconds=spec.worker_wait_seconds),
                start_to_close_timeout=timedelta(minutes=2),
                # The answer takes a second; the heartbeat notices one lost in a Temporal restart.
                heartbeat_timeout=CONTROL_HEARTBEAT,
                retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=10), maximum_attempts=5),
                result_type=TargetInfo,
            )
        except ActivityError as error:
            cause = error.cause
            if isinstance(cause, TimeoutError) and cause.type == TimeoutType.SCHEDULE_TO_START:
                raise ApplicationError(
                    f"no worker serves target {spec.target!r}: nothing polled task queue {queue!r} within "
                    f"{spec.worker_wait_seconds}s; start `kf worker` on a machine with that hardware",
                    type="NoWorkerForTarget",
                    non_retryable=True,
                ) from None
            raise
        return info

    async def _record(self, event_id: str, event_type: str, payload: dict[str, Any]) -> None:
        state = self._require_state()
        head = await self._control(
            "kf.record",
            RecordInput(search_id=state.search_id, event_id=event_id, type=event_type, payload=payload),
            # None from histories recorded before kf.record returned the head: they must still replay.
            StreamHead | None,
        )
        self._witness(head)

    def _witness(self, head: StreamHead | None) -> None:
        """Keep the stream's newest head in the state (and so in the history and the result).

        Every step's result already puts its head into Temporal's history, outside the database: that is the
        witness `kf audit` checks the log against (engine/search/witness.py). Steps run in parallel and
        finish in any order; appends are serialised, so the highest version is the newest head."""
        state = self._require_state()
        if head is not None and (state.head is None or head.version > state.head.version):
            state.head = head

    # -- budget, progress, continue-as-new ---------------------------------------------------------------

    def _candidates_left(self) -> int:
        state = self._require_state()
        limit = state.spec.budget.max_candidates
        # Every candidate taken up counts against the budget, judged or not: the budget bounds the work.
        return 1_000_000_000 if limit is None else limit - len(state.evaluated)

    def _out_of_time(self) -> bool:
        state = self._require_state()
        minutes = state.spec.budget.max_wall_minutes
        if minutes is None or state.started_at is None:
            return False
        return workflow.now() - state.started_at >= timedelta(minutes=minutes)

    def _should_end(self) -> bool:
        state = self._require_state()
        over_budget = state.generation > 0 and self._candidates_left() <= 0
        return state.stop_requested or over_budget or self._out_of_time() or self._exhausted is not None

    def _final_status(self) -> str:
        state = self._require_state()
        if state.stop_requested:
            return "stopped"
        if self._exhausted is not None:
            workflow.logger.info("search %s ends early: %s", state.search_id, self._exhausted)
            return "exhausted"
        if state.generation <= state.spec.generations:
            return "budget_exhausted"
        return "completed"

    def _should_continue_as_new(self) -> bool:
        every = self._require_state().spec.continue_as_new_every
        if every is not None and self._generations_this_run >= every:
            return True
        return workflow.info().is_continue_as_new_suggested()

    def _target_name(self) -> str:
        state = self._require_state()
        prefix = state.spec.task_queue_prefix + "-"
        queue = state.target_queue or state.spec.target
        return queue[len(prefix) :] if queue.startswith(prefix) else queue

    def _upsert_progress(self) -> None:
        state = self._require_state()
        updates: list[SearchAttributeUpdate[Any]] = [
            PROBLEM_ATTR.value_set(state.spec.problem),
            TARGET_ATTR.value_set(self._target_name()),
            # The generation `kf search show` and the UI's details show (SearchState.current_generation), so that
            # `kf search list` agrees with them: ``state.generation`` is the next one to run, one ahead.
            GENERATION_ATTR.value_set(state.current_generation),
        ]
        if state.incumbent is not None:
            updates.append(BEST_SPEEDUP_ATTR.value_set(state.incumbent.speedup))
        workflow.upsert_search_attributes(updates)

    def _show_progress(self) -> None:
        """Set the current details the Temporal UI shows on the search's page (engine/search/console.py).

        Called after every verdict, promotion, generation and message. It is no command: nothing enters the
        history, so it may be called anywhere without touching determinism (the workflow's metadata query
        answers with the latest text, also when a closed search is replayed to answer it)."""
        workflow.set_current_details(current_details(self._require_state(), workflow.now(), self._leading))

    def _require_state(self) -> SearchState:
        if self._state is None:
            raise ApplicationError("the search has not started yet", non_retryable=True)
        return self._state

    def _result(self) -> SearchResult:
        state = self._require_state()
        inc = state.incumbent
        return SearchResult(
            search_id=state.search_id,
            status=state.status,
            best_speedup=inc.speedup if inc else None,
            best_ci_low=inc.ci_low if inc else None,
            best_ci_high=inc.ci_high if inc else None,
            best_roofline_fraction=inc.roofline_fraction if inc else None,
            incumbent=inc.candidate if inc else None,
            candidates_done=state.candidates_done,
            verdict_counts=dict(state.verdict_counts),
            harness_errors=len(state.harness_errors),
            generations_run=state.generation,
            playoff_rounds=list(state.playoff_rounds),
            timings=state.timings,
            busy_timings=state.busy_timings,
            head=state.head,
        )

    # -- messages ----------------------------------------------------------------------------------------

    @workflow.query
    def status(self) -> SearchStatus:
        """Progress for people and the CLI; a query never changes the search."""
        state = self._require_state()
        inc = state.incumbent
        leading = self._leading
        return SearchStatus(
            search_id=state.search_id,
            problem=state.spec.problem,
            target=state.spec.target,
            target_queue=state.target_queue,
            status="paused" if state.paused and not state.stop_requested else state.status,
            # The generation running (or the last one run): ``state.generation`` is the next one to run.
            generation=state.current_generation,
            generations=state.spec.generations,
            candidates_done=state.candidates_done,
            verdict_counts=dict(state.verdict_counts),
            harness_errors=len(state.harness_errors),
            best_speedup=inc.speedup if inc else None,
            incumbent=short_name(inc.candidate.label, inc.candidate.candidate_id) if inc else None,
            incumbent_id=inc.candidate.candidate_id if inc else None,
            llm_spend_usd=state.llm_spend_usd,
            hints=list(state.spec.hints),
            best_ci_low=inc.ci_low if inc else None,
            best_ci_high=inc.ci_high if inc else None,
            best_roofline_fraction=inc.roofline_fraction if inc else None,
            leading_speedup=leading.speedup if leading else None,
            leading=short_name(leading.label, leading.candidate_id) if leading else None,
            step=self._step_text(),
            max_candidates=state.spec.budget.max_candidates,
            timings=state.timings,
            busy_timings=state.busy_timings,
        )

    def _step_text(self) -> str:
        """What is under way, for people: "proposing 4 candidates", "compiling 1 · benchmarking 2",
        "final playoff round 2 of 3"; empty between steps."""
        counts: dict[str, int] = {}
        for key, doing in self._doing.items():
            if key in ("propose", "playoff", "confirm"):
                return doing
            counts[doing] = counts.get(doing, 0) + 1
        order = ("compiling", "validating", "benchmarking")
        return " · ".join(f"{doing} {counts[doing]}" for doing in order if doing in counts)

    @workflow.update(unfinished_policy=MESSAGE_UNFINISHED)
    async def pause(self) -> SearchStatus:
        """Stop starting new work; what is running finishes."""
        self._require_state().paused = True
        self._show_progress()
        await self._record_message("paused", {})
        return self.status()

    @workflow.update(unfinished_policy=MESSAGE_UNFINISHED)
    async def resume(self) -> SearchStatus:
        """Undo a pause."""
        self._require_state().paused = False
        self._show_progress()
        await self._record_message("resumed", {})
        return self.status()

    @workflow.update(unfinished_policy=MESSAGE_UNFINISHED)
    async def stop(self) -> SearchStatus:
        """End gracefully: running candidates finish, the record is completed, nothing new starts."""
        self._require_state().stop_requested = True
        self._show_progress()
        await self._record_message("stop_requested", {})
        return self.status()

    @workflow.update(unfinished_policy=MESSAGE_UNFINISHED)
    async def add_hint(self, text: str) -> SearchStatus:
        """A human hint that proposers see from the next generation on."""
        self._require_state().spec.hints.append(text.strip())
        self._show_progress()
        await self._record_message("hint_added", {"text": text.strip()})
        return self.status()

    @add_hint.validator
    def _validate_hint(self, text: str) -> None:
        # The same bounds as the spec's own hints: a hint the spec would refuse would fail continue-as-new.
        check_hint(text, len(self._require_state().spec.hints))

    @workflow.update(unfinished_policy=MESSAGE_UNFINISHED)
    async def extend_budget(self, budget: dict[str, Any]) -> SearchStatus:
        """Raise (or set) the budget's limits; fields left out keep their value."""
        state = self._require_state()
        merged = state.spec.budget.model_dump() | {k: v for k, v in budget.items() if v is not None}
        state.spec.budget = Budget.model_validate(merged)
        self._show_progress()
        await self._record_message("budget_extended", state.spec.budget.model_dump(mode="json"))
        return self.status()

    @extend_budget.validator
    def _validate_budget(self, budget: dict[str, Any]) -> None:
        # Rejected updates never reach history; pydantic's message says which field was wrong.
        state = self._require_state()
        current = state.spec.budget.model_dump()
        Budget.model_validate(current | {k: v for k, v in budget.items() if v is not None})
        # Extending raises a limit (or sets one the search did not have): a lower one would end the search early,
        # which is `kf search stop`'s job, said as such.
        for field, value in budget.items():
            if value is not None and current.get(field) is not None and value < current[field]:
                raise ValueError(
                    f"{field} {value} is below the search's {field} of {current[field]}: extending raises a budget; "
                    "`kf search stop` ends a search"
                )

    async def _record_message(self, kind: str, payload: dict[str, Any]) -> None:
        if not self._opened:  # only then: a wait, even one that holds at once, would reorder the commands of replays
            await workflow.wait_condition(lambda: self._opened)
        state = self._require_state()
        # Several messages of a kind may arrive; the update id keeps each one's key unique and stable.
        update_id = workflow.current_update_info()
        key = update_id.id if update_id else str(workflow.uuid4())
        await self._record(
            f"{state.search_id}/message/{key}",
            f"search.{kind}",
            {**payload, "generation": state.generation},
        )

"""LLM proposers: explorer, tuner and fixer roles played by any litellm model.

One proposal round plans its requests (a fixer per recent failure, up to half the count; explorers and
tuners for the rest; models taken in turn), sends them concurrently within the LLM budget, and turns each
reply into a candidate or a recorded ``ProposalFailure``. ``propose`` gives only the candidates, for the
Proposer protocol; ``propose_with_outcomes`` gives the whole ``ProposalBatch`` for the event log.

Models come from the spec (``ProposalContext.models``) or ``KF_MODELS``; see ``llm_settings`` for endpoints,
keys and prices. Keys stay in this (worker) process: candidates run in a sandbox with a clean environment.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from engine.errors import ConfigurationError
from engine.llm_budget import BudgetExhausted, LLMBudget, Reservation
from engine.problems import Problem
from engine.proposers.base import ProposalContext
from engine.proposers.failures import RecentFailure
from engine.proposers.llm_calls import ModelClient, Price, price_of, prompt_tokens_upper_bound, worst_case_usd
from engine.proposers.llm_prompt import build_messages
from engine.proposers.llm_reply import ReplyRejected, excerpt, parse_reply
from engine.proposers.llm_settings import LLMSettings
from engine.proposers.outcomes import LLMCall, ProposalBatch, ProposalFailure, RejectReason, Role
from engine.search.candidates import Candidate


@dataclass(frozen=True)
class PlannedRequest:
    """One request of a round: which role asks which model, and which failure a fixer repairs."""

    role: Role
    model: str
    failure: RecentFailure | None = None


def plan_requests(context: ProposalContext, models: list[str]) -> list[PlannedRequest]:
    """The round's requests: fixers for the newest failures (at most half the count, at least one when
    there are failures), then explorers and tuners in turn; models in turn, shifted by generation."""
    count = context.count
    failures = context.recent_failures
    fixers = min(len(failures), max(1, count // 2)) if failures and count > 0 else 0
    roles: list[tuple[Role, RecentFailure | None]] = [("fixer", f) for f in failures[:fixers]]
    others: tuple[Role, Role] = ("explorer", "tuner")
    roles += [(others[i % 2], None) for i in range(count - fixers)]
    return [
        PlannedRequest(role=role, model=models[(context.generation + i) % len(models)], failure=failure)
        for i, (role, failure) in enumerate(roles)
    ]


class LLMProposer:
    """Proposes candidates by asking LLMs in the explorer, tuner and fixer roles."""

    name = "llm"

    def __init__(self, settings: LLMSettings | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        self.settings = settings if settings is not None else LLMSettings.from_env()
        self._sleep = sleep

    def models_for(self, context_models: list[str]) -> list[str]:
        """The models to ask: the spec's, else KF_MODELS; none is a configuration error naming the fix."""
        models = list(context_models) or list(self.settings.models)
        if not models:
            raise ConfigurationError(
                "the LLM proposer has no models: set the search's proposer.models (e.g. ['openai/gpt-4o']) or "
                "KF_MODELS in the worker's environment; for a local OpenAI-compatible server use "
                "KF_MODELS=openai/<name> and KF_LLM_API_BASE=http://127.0.0.1:<port>/v1"
            )
        return models

    def propose(self, problem: Problem, context: ProposalContext) -> list[Candidate]:
        """Up to ``context.count`` new candidates (failures and calls are dropped; use propose_with_outcomes)."""
        return self.propose_with_outcomes(problem, context).candidates

    def propose_with_outcomes(self, problem: Problem, context: ProposalContext) -> ProposalBatch:
        """Ask the models for ``context.count`` candidates; every request ends as a candidate or a failure."""
        batch = ProposalBatch()
        if context.count <= 0:
            return batch
        plan = plan_requests(context, self.models_for(context.models))
        budget = LLMBudget(context.llm_budget_usd, context.llm_spent_usd)
        client = ModelClient(self.settings, sleep=self._sleep)
        prices: dict[str, Price | None] = {}
        # A slot is taken before reserving, so each reservation sees every finished call's settled cost.
        slots = threading.Semaphore(self.settings.concurrency)
        sent: list[tuple[PlannedRequest, Future[tuple[str | None, LLMCall]]]] = []
        with ThreadPoolExecutor(max_workers=self.settings.concurrency, thread_name_prefix="kf-llm") as pool:
            for request in plan:
                if request.model not in prices:
                    prices[request.model] = price_of(self.settings, request.model)
                price = prices[request.model]
                if price is None and budget.limit_usd is not None:
                    batch.failures.append(self._price_unknown(request, context))
                    continue
                messages = build_messages(problem, context, request.role, request.failure)
                estimate = worst_case_usd(
                    price, prompt_tokens_upper_bound(request.model, messages), self.settings.max_tokens
                )
                slots.acquire()
                try:
                    reservation = budget.reserve(estimate)
                except BudgetExhausted as exhausted:
                    slots.release()
                    batch.budget_exhausted = True
                    batch.stop_reason = str(exhausted)
                    break
                future = pool.submit(self._send, client, request, messages, budget, reservation, price)
                future.add_done_callback(lambda _done: slots.release())
                sent.append((request, future))
        seen = set(context.seen)
        for request, future in sent:
            text, call = future.result()
            batch.calls.append(call)
            if call.status == "budget_exhausted":
                batch.budget_exhausted = True
                batch.stop_reason = batch.stop_reason or call.error
            outcome = self._outcome(problem, context, request, text, call, seen)
            if isinstance(outcome, Candidate):
                seen.add(outcome.candidate_id)
                batch.candidates.append(outcome)
            else:
                batch.failures.append(outcome)
        return batch

    @staticmethod
    def _send(
        client: ModelClient,
        request: PlannedRequest,
        messages: list[dict[str, str]],
        budget: LLMBudget,
        reservation: Reservation,
        price: Price | None,
    ) -> tuple[str | None, LLMCall]:
        reply = client.complete(request.model, request.role, messages, budget, reservation, price)
        return reply.text, reply.call

    def _outcome(
        self,
        problem: Problem,
        context: ProposalContext,
        request: PlannedRequest,
        text: str | None,
        call: LLMCall,
        seen: set[str],
    ) -> Candidate | ProposalFailure:
        parent_id = context.incumbent.candidate_id if context.incumbent else None
        if request.failure is not None and request.failure.candidate_id:
            parent_id = request.failure.candidate_id

        def failure(reason: RejectReason, message: str, reply: str = "") -> ProposalFailure:
            return ProposalFailure(
                reason=reason,
                message=message,
                role=request.role,
                model=request.model,
                reply_excerpt=excerpt(reply),
                parent_id=parent_id,
                generation=context.generation,
            )

        if text is None:
            return failure(
                "call_failed", f"the request failed ({call.status} after {call.attempts} attempt(s)): {call.error}"
            )
        try:
            parsed = parse_reply(text, problem.entry, len(problem.params))
        except ReplyRejected as rejected:
            return failure(rejected.reason, rejected.message, text)
        fixing = f" (fixing {request.failure.label or request.failure.verdict})" if request.failure else ""
        candidate = Candidate.create(
            parsed.source,
            context.flags,
            label=f"llm {request.role} {request.model}{fixing}"[:120],
            parent_id=parent_id,
            tags=parsed.tags,
            proposer=f"llm:{request.role}:{request.model}",
            rationale=parsed.rationale or f"{request.role} proposal from {request.model}",
        )
        if candidate.candidate_id in seen:
            return failure(
                "duplicate", f"the reply's kernel {candidate.candidate_id[:12]} was already proposed or evaluated", text
            )
        return candidate

    @staticmethod
    def _price_unknown(request: PlannedRequest, context: ProposalContext) -> ProposalFailure:
        return ProposalFailure(
            reason="price_unknown",
            message=(
                f"model {request.model!r} has no known price, so its spend cannot be held to the LLM budget; give "
                "its price in KF_LLM_MODEL_CONFIG, e.g. "
                f'{{"{request.model}": {{"input_usd_per_mtok": 0, "output_usd_per_mtok": 0}}}} for a free local model'
            ),
            role=request.role,
            model=request.model,
            parent_id=context.incumbent.candidate_id if context.incumbent else None,
            generation=context.generation,
        )

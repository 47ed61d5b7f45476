"""One LLM request through litellm: reserved against the budget, retried with back-off, costed and recorded.

litellm is imported lazily (it takes seconds) and told to stay local: it reads its bundled price list
(``LITELLM_LOCAL_MODEL_COST_MAP``) instead of fetching one, sends no telemetry, and this module registers
no callbacks. The only traffic is the request to the model's endpoint.

Retries: rate limits (429), timeouts, connection errors and server errors (5xx) are retried with
exponential back-off and jitter, honouring a ``Retry-After`` header, up to ``LLMSettings.max_attempts``
requests. Other errors (a bad key, an unknown model, a malformed request) are not worth retrying.

Budget: the call's worst-case cost is reserved before its first request. A rate-limited or failed request
costs nothing and keeps the reservation for the retry; a timed-out request may still be billed by the
provider, so it is settled at its worst case and the retry must reserve again (or stop).
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from engine.llm_budget import BudgetExhausted, LLMBudget, Reservation
from engine.proposers.llm_settings import LLMSettings
from engine.proposers.outcomes import CostSource, LLMCall, Role

ERROR_LIMIT = 500
"""Characters of a provider's error message kept in the record."""


def litellm_module() -> ModuleType:
    """litellm, imported on first use and configured to make no network traffic of its own."""
    # Why before the import: litellm fetches its price list from GitHub at import time unless told not to.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    # Older litellm versions send usage telemetry unless this is False; newer ones have no such attribute.
    litellm.telemetry = False
    litellm.suppress_debug_info = True
    return litellm


@dataclass(frozen=True)
class Price:
    """US dollars per token of a model, and where the figure comes from."""

    input_per_token: float
    output_per_token: float
    source: CostSource


def price_of(settings: LLMSettings, model: str) -> Price | None:
    """The model's price: configured (KF_LLM_MODEL_CONFIG), else litellm's price list, else None (unknown)."""
    config = settings.config_for(model)
    if config.input_usd_per_mtok is not None or config.output_usd_per_mtok is not None:
        return Price((config.input_usd_per_mtok or 0.0) / 1e6, (config.output_usd_per_mtok or 0.0) / 1e6, "configured")
    try:
        info = litellm_module().get_model_info(model)
    except Exception:  # litellm raises for any model missing from its price list
        return None
    input_cost, output_cost = info.get("input_cost_per_token"), info.get("output_cost_per_token")
    if input_cost is None and output_cost is None:
        return None
    return Price(float(input_cost or 0.0), float(output_cost or 0.0), "litellm")


def prompt_tokens_upper_bound(model: str, messages: list[dict[str, str]]) -> int:
    """An upper estimate of the prompt's tokens: litellm's count with a margin for the provider's own
    tokenizer and chat framing, or one token per two characters when litellm cannot count."""
    try:
        counted = int(litellm_module().token_counter(model=model, messages=messages))
    except Exception:  # an unknown tokenizer: fall back to a deliberately pessimistic estimate
        return sum(len(m["content"]) for m in messages) // 2 + 64
    return math.ceil(counted * 1.25) + 64


def worst_case_usd(price: Price | None, prompt_tokens: int, max_tokens: int) -> float:
    """The most a call can cost: its prompt plus ``max_tokens`` of output (0 when the price is unknown)."""
    if price is None:
        return 0.0
    return prompt_tokens * price.input_per_token + max_tokens * price.output_per_token


@dataclass
class CallReply:
    """The text of a reply (None when every attempt failed) and the record of the call."""

    text: str | None
    call: LLMCall


def _redact(text: str, secrets: list[str | None]) -> str:
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text[:ERROR_LIMIT]


def _retry_after_s(error: Exception) -> float | None:
    response = getattr(error, "response", None)
    headers = getattr(response, "headers", None)
    if not headers:
        return None
    try:
        return float(headers.get("retry-after", ""))
    except (TypeError, ValueError):
        return None


class ModelClient:
    """Sends chat requests for the LLM proposers; one per proposal round (it holds no connection state)."""

    def __init__(self, settings: LLMSettings, sleep: Callable[[float], None] = time.sleep) -> None:
        self.settings = settings
        self._sleep = sleep

    def complete(
        self,
        model: str,
        role: Role,
        messages: list[dict[str, str]],
        budget: LLMBudget,
        reservation: Reservation,
        price: Price | None,
    ) -> CallReply:
        """Send one chat request (retrying as the module docstring says); the reservation is settled here."""
        litellm = litellm_module()
        settings = self.settings
        api_key = settings.api_key_for(model)
        retryable: tuple[type[Exception], ...] = (
            litellm.RateLimitError,
            litellm.Timeout,
            litellm.APIConnectionError,
            litellm.InternalServerError,
            litellm.ServiceUnavailableError,
            litellm.BadGatewayError,
        )
        call = LLMCall(model=model, role=role, status="error", reserved_usd=reservation.usd)
        current: Reservation | None = reservation
        while current is not None:
            call.attempts += 1
            began = time.perf_counter()
            try:
                response = litellm.completion(
                    model=model,
                    messages=messages,
                    api_base=settings.api_base_for(model),
                    api_key=api_key,
                    max_tokens=settings.max_tokens,
                    temperature=settings.temperature,
                    timeout=settings.timeout_s,
                    # Retries are ours (bounded, recorded, budget-aware): the SDK's own must not add to them.
                    max_retries=0,
                    num_retries=0,
                )
            except retryable as error:
                call.latency_s += time.perf_counter() - began
                call.error = _redact(f"{type(error).__name__}: {error}", [api_key])
                if isinstance(error, litellm.Timeout):
                    call.status = "timeout"
                    # The provider may bill a request we stopped waiting for: count it at its worst case.
                    budget.settle(current, current.usd)
                    call.cost_usd += current.usd
                    current = None
                    if call.attempts < settings.max_attempts:
                        try:
                            current = budget.reserve(reservation.usd)
                        except BudgetExhausted as exhausted:
                            call.status = "budget_exhausted"
                            call.error = str(exhausted)
                            return CallReply(None, call)
                else:
                    call.status = "rate_limited" if isinstance(error, litellm.RateLimitError) else "error"
                if call.attempts >= settings.max_attempts:
                    break
                self._back_off(call, error)
                continue
            except Exception as error:  # an error retrying cannot fix: record it, never raise into the search
                call.latency_s += time.perf_counter() - began
                call.status = "error"
                call.error = _redact(f"{type(error).__name__}: {error}", [api_key])
                break
            call.latency_s += time.perf_counter() - began
            cost = self._cost(call, response, current, price)
            budget.settle(current, cost)
            call.cost_usd += cost
            call.status = "ok"
            call.error = ""
            return CallReply(_reply_text(response), call)
        if current is not None:
            budget.settle(current, 0.0)
        return CallReply(None, call)

    @staticmethod
    def _cost(call: LLMCall, response: Any, reservation: Reservation, price: Price | None) -> float:
        """The response's cost; records its tokens and how the cost is known on the call."""
        usage = getattr(response, "usage", None)
        call.prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
        call.completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
        cost, known = 0.0, False
        source: CostSource = "unknown"
        if price is None:
            pass
        elif call.prompt_tokens == 0 and call.completion_tokens == 0:
            cost, source = reservation.usd, "reserved"
        elif price.source == "configured":
            cost = call.prompt_tokens * price.input_per_token + call.completion_tokens * price.output_per_token
            known, source = True, "configured"
        else:
            try:
                cost = float(litellm_module().completion_cost(completion_response=response, model=call.model))
            except Exception:  # litellm could not price this response: use its per-token figures directly
                cost = call.prompt_tokens * price.input_per_token + call.completion_tokens * price.output_per_token
            known, source = True, "litellm"
        call.cost_known = known
        call.cost_source = source
        return cost

    def _back_off(self, call: LLMCall, error: Exception) -> None:
        settings = self.settings
        delay = min(settings.backoff_max_s, settings.backoff_base_s * 2 ** (call.attempts - 1))
        delay *= random.uniform(0.5, 1.0)
        hinted = _retry_after_s(error)
        if hinted is not None:
            delay = min(settings.backoff_max_s, max(delay, hinted))
        call.backoff_s += delay
        self._sleep(delay)


def _reply_text(response: Any) -> str:
    try:
        content = response.choices[0].message.content
    except (AttributeError, IndexError, TypeError):
        return ""
    return str(content or "")

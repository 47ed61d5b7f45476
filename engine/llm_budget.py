"""The LLM budget: spent plus in flight must never exceed the limit.

Before a request is sent, its worst-case cost (its prompt's tokens plus ``max_tokens`` of output, at the
model's price) is reserved; when the reply arrives the reservation is settled at the real cost. A request
whose reservation does not fit is never sent, so concurrent calls cannot overshoot the limit together:
each sees the others' reservations. Thread-safe, because proposers send calls from a thread pool.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


class BudgetExhausted(Exception):
    """A reservation that does not fit the budget; the message gives the figures."""


@dataclass(frozen=True)
class Reservation:
    """Money set aside for one request until it is settled."""

    reservation_id: int
    usd: float


class LLMBudget:
    """Spent and in-flight dollars against an optional limit (``None``: no limit, still counted)."""

    def __init__(self, limit_usd: float | None, spent_usd: float = 0.0) -> None:
        if limit_usd is not None and limit_usd < 0:
            raise ValueError(f"an LLM budget cannot be negative, got {limit_usd!r}")
        self.limit_usd = limit_usd
        self._spent = float(spent_usd)
        self._in_flight: dict[int, float] = {}
        self._next_id = 0
        self._lock = threading.Lock()

    @property
    def spent_usd(self) -> float:
        """Settled spend, including what was spent before this budget object was made."""
        with self._lock:
            return self._spent

    @property
    def in_flight_usd(self) -> float:
        """Reserved for requests not yet settled."""
        with self._lock:
            return sum(self._in_flight.values())

    def remaining_usd(self) -> float | None:
        """What a new reservation may still take, or None without a limit."""
        with self._lock:
            if self.limit_usd is None:
                return None
            return max(0.0, self.limit_usd - self._spent - sum(self._in_flight.values()))

    def reserve(self, usd: float) -> Reservation:
        """Set ``usd`` aside for one request, or raise BudgetExhausted if spent + in flight + usd > limit."""
        if usd < 0:
            raise ValueError(f"a reservation cannot be negative, got {usd!r}")
        with self._lock:
            committed = self._spent + sum(self._in_flight.values())
            if self.limit_usd is not None and committed + usd > self.limit_usd:
                raise BudgetExhausted(
                    f"LLM budget of ${self.limit_usd:.4f} would be exceeded: spent ${self._spent:.4f}, "
                    f"in flight ${committed - self._spent:.4f}, next request up to ${usd:.4f}; "
                    "raise budget.max_llm_usd to propose more with LLMs"
                )
            self._next_id += 1
            self._in_flight[self._next_id] = usd
            return Reservation(self._next_id, usd)

    def settle(self, reservation: Reservation, actual_usd: float) -> None:
        """Replace a reservation by what the request really cost (0 for a request the provider refused)."""
        with self._lock:
            if self._in_flight.pop(reservation.reservation_id, None) is None:
                raise ValueError(f"reservation {reservation.reservation_id} was already settled")
            self._spent += max(0.0, actual_usd)

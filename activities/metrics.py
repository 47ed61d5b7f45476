"""The worker's Prometheus metrics: the Temporal SDK's own, and Kernel Factory's, on one endpoint.

`kf worker --metrics-port N` builds a Temporal :class:`~temporalio.runtime.Runtime` that serves Prometheus
metrics on ``http://HOST:N/metrics`` (:func:`prometheus_runtime`) and connects the worker's client with it, so
its workers report through it: the SDK's ``temporal_*`` metrics (task slots, poll and schedule-to-start
latencies, activity failures…) and the ones below, which the activities emit through
``activity.metric_meter()`` (each sample also carries the activity's ``namespace``, ``task_queue`` and
``activity_type``). ``problem`` is the problem as the search names it (a built-in name or a folder),
``target`` the resolved target (``cpu-x86_64-avx512``, ``cuda-sm90``):

- ``kf_candidates_evaluated`` (counter; ``problem``, ``target``, ``verdict``): candidates judged, by the
  verdict of the last step they reached -- the verdict the search counts for them;
- ``kf_step_duration_seconds`` (histogram; ``step``, ``problem``, ``target``): wall time of each step a
  worker ran (propose, compile, validate, benchmark, playoff), not counting outcomes it found already recorded;
- ``kf_best_speedup`` (gauge; ``problem``, ``target``): the highest speedup over numpy of an incumbent
  promoted through this worker, per problem and target.

Emitted from activities, not from the workflow: an activity runs once per attempt, while workflow code runs
again on every replay. Without a metrics port the runtime's meter is a no-op, and emitting costs nothing.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from temporalio import activity
from temporalio.common import MetricCounter, MetricGaugeFloat, MetricHistogramFloat, MetricMeter
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from engine.errors import ConfigurationError
from engine.evidence.events import StreamHead
from engine.evidence.store import EventStore
from engine.search.steps import ProposeInput, ProposeOutput, RecordInput, StepInput, StepOutput

CANDIDATES = "kf_candidates_evaluated"
STEP_SECONDS = "kf_step_duration_seconds"
BEST_SPEEDUP = "kf_best_speedup"
JUDGING_STEPS = ("compile", "validate", "benchmark")
"""The steps that judge a candidate; any other (a playoff round) re-measures one already judged."""
PROMOTED = "incumbent.promoted"
"""The event type of a promotion (workflows/kernel_search.py records it through kf.record)."""

STEP_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
"""Histogram buckets of a step's wall time: a cached compile takes milliseconds, a GPU benchmark minutes."""

S = TypeVar("S")

# The best speedup reported per (problem, target) by this process: a gauge is set, not raised, so a later,
# slower incumbent (another search of the same problem) must not lower what the gauge says.
_best: dict[tuple[str, str], float] = {}
_best_lock = threading.Lock()


class _HasStore(Protocol):
    store: EventStore


def prometheus_runtime(host: str, port: int) -> Runtime:
    """A Temporal runtime that serves Prometheus metrics on ``http://host:port/metrics``; ConfigurationError
    when the address cannot be bound (the port taken, the host not this machine's)."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        return Runtime(
            telemetry=TelemetryConfig(
                metrics=PrometheusConfig(
                    bind_address=address,
                    # Durations in seconds, as Prometheus names them, and buckets that reach a long benchmark.
                    durations_as_seconds=True,
                    histogram_bucket_overrides={STEP_SECONDS: list(STEP_BUCKETS_S)},
                )
            )
        )
    except Exception as error:  # the SDK's core reports a failed bind as a plain exception
        raise ConfigurationError(
            f"cannot serve metrics on {address}: {error}; pass another --metrics-port (or KF_METRICS_PORT), "
            "or free that port"
        ) from error


# -- decorators for the activities of activities/search.py ------------------------------------------------


def observed_step(
    method: Callable[[S, StepInput], Awaitable[StepOutput]],
) -> Callable[[S, StepInput], Awaitable[StepOutput]]:
    """Metrics of a hardware step (compile, validate, benchmark, a playoff round): its wall time, and the
    candidate's verdict when this step judges it last (any verdict but ok ends a candidate; the benchmark
    always does; a playoff round re-measures a candidate already counted)."""

    @functools.wraps(method)
    async def run(self: S, step: StepInput) -> StepOutput:
        began = time.monotonic()
        output = await method(self, step)
        meter = _meter()
        if meter is not None:
            labels = {"problem": step.problem, "target": step.target or "cpu"}
            if not output.reused:
                _step_seconds(meter).record(time.monotonic() - began, {"step": output.step, **labels})
            if output.step in JUDGING_STEPS and (output.step == "benchmark" or output.verdict != "ok"):
                _candidates(meter).add(1, {"verdict": output.verdict, **labels})
        return output

    return run


def observed_proposal(
    method: Callable[[S, ProposeInput], Awaitable[ProposeOutput]],
) -> Callable[[S, ProposeInput], Awaitable[ProposeOutput]]:
    """Metrics of a propose activity: its wall time (LLM calls included)."""

    @functools.wraps(method)
    async def run(self: S, request: ProposeInput) -> ProposeOutput:
        began = time.monotonic()
        output = await method(self, request)
        meter = _meter()
        if meter is not None:
            labels = {"step": "propose", "problem": request.spec.problem, "target": request.target}
            _step_seconds(meter).record(time.monotonic() - began, labels)
        return output

    return run


def observed_record(
    method: Callable[[Any, RecordInput], Awaitable[StreamHead]],
) -> Callable[[Any, RecordInput], Awaitable[StreamHead]]:
    """Metrics of a record activity: a promotion sets the best-speedup gauge of its problem and target."""

    @functools.wraps(method)
    async def run(self: _HasStore, fact: RecordInput) -> StreamHead:
        head = await method(self, fact)
        meter = _meter()
        speedup = fact.payload.get("speedup")
        if meter is not None and fact.type == PROMOTED and isinstance(speedup, int | float):
            problem, target = await _problem_and_target(self.store, fact.search_id)
            with _best_lock:
                best = max(float(speedup), _best.get((problem, target), float(speedup)))
                _best[(problem, target)] = best
            _best_speedup(meter).set(best, {"problem": problem, "target": target})
        return head

    return run


# -- instruments -------------------------------------------------------------------------------------------


def _meter() -> MetricMeter | None:
    """The activity's meter, or None where emitting would go nowhere (no metrics port; not in an activity)."""
    if not activity.in_activity():
        return None
    meter = activity.metric_meter()
    return None if meter is MetricMeter.noop else meter


# Creating an instrument again under its name returns the same series in the SDK's core: created per use,
# since each activity's meter carries that activity's own attributes.
def _candidates(meter: MetricMeter) -> MetricCounter:
    return meter.create_counter(CANDIDATES, "Candidates judged, by the verdict of the last step they reached.")


def _step_seconds(meter: MetricMeter) -> MetricHistogramFloat:
    return meter.create_histogram_float(STEP_SECONDS, "Wall time of a search step run by this worker.", "s")


def _best_speedup(meter: MetricMeter) -> MetricGaugeFloat:
    return meter.create_gauge_float(BEST_SPEEDUP, "Best speedup over numpy of a promoted incumbent.")


async def _problem_and_target(store: EventStore, search_id: str) -> tuple[str, str]:
    """The search's problem and resolved target, from its own events (a promotion's payload names neither)."""
    started = await store.read_event(f"{search_id}/started")
    resolved = await store.read_event(f"{search_id}/target")
    spec = started.payload.get("spec", {}) if started is not None else {}
    problem = str(spec.get("problem", "unknown"))
    target = str(resolved.payload.get("target") if resolved is not None else spec.get("target", "cpu"))
    return problem, target

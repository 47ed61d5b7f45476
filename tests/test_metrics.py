"""A worker with a metrics port serves the Temporal SDK's metrics and Kernel Factory's own on one endpoint.

A real worker (the client built as `kf worker --metrics-port N` builds it) runs a small real search; the test
then scrapes ``http://127.0.0.1:N/metrics`` over HTTP and checks the figures against the search's own result
and event log: candidates by verdict, step durations by step, and the best promoted speedup.
"""

from __future__ import annotations

import asyncio
import re
import socket
import urllib.request
from collections import Counter

import pytest
from search_fixtures import QUICK, running_worker, start
from temporalio.testing import WorkflowEnvironment

from activities.metrics import BEST_SPEEDUP, CANDIDATES, STEP_SECONDS, prometheus_runtime
from activities.temporal_client import connect
from engine.errors import ConfigurationError
from engine.evidence.store import EventStore
from engine.hardware import cpu_target
from engine.search.history import stream_of

pytestmark = pytest.mark.slow

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

Sample = tuple[str, dict[str, str], float]


def free_port() -> int:
    """A port nothing on 127.0.0.1 listens on now (the kernel's choice for a socket bound to port 0)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def scrape(port: int) -> list[Sample]:
    """Every sample of the Prometheus text the endpoint serves: (name, labels, value)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        assert match, f"not a Prometheus sample line: {line!r}"
        labels = dict(_LABEL.findall(match["labels"] or ""))
        samples.append((match["name"], labels, float(match["value"])))
    return samples


async def test_a_worker_serves_sdk_and_search_metrics(
    temporal_env: WorkflowEnvironment, store: EventStore, prefix: str
) -> None:
    port = free_port()
    runtime = prometheus_runtime("127.0.0.1", port)
    client = await connect(temporal_env.client.service_client.config.target_host, runtime=runtime)
    async with running_worker(client, store, prefix):
        handle = await start(
            client, prefix, {"problem": "softmax", "generations": 1, "candidates_per_generation": 1, **QUICK}
        )
        result = await handle.result()
    assert result.status == "completed", result

    samples = await asyncio.to_thread(scrape, port)
    # Only this test's workers: the series carry the task queue, and every queue of the test has its prefix.
    ours = [(n, labels, v) for n, labels, v in samples if labels.get("task_queue", "").startswith(prefix)]

    # The SDK's own metrics, from the same runtime, on the same endpoint.
    assert any(name.startswith("temporal_") for name, _, _ in ours), sorted({n for n, _, _ in samples})

    target = cpu_target()
    judged = Counter[str]()
    for name, labels, value in ours:
        if name == CANDIDATES:
            assert (labels["problem"], labels["target"]) == ("softmax", target), labels
            judged[labels["verdict"]] += int(value)
    # One count per candidate, by the verdict the search counts for it.
    assert judged == Counter(result.verdict_counts) and sum(judged.values()) == result.candidates_done

    steps = Counter[str]()
    for name, labels, value in ours:
        if name == f"{STEP_SECONDS}_count":
            assert (labels["problem"], labels["target"]) == ("softmax", target), labels
            steps[labels["step"]] += int(value)
    events = await store.read_stream(stream_of(result.search_id))
    kinds = Counter(event.type for event in events)
    assert steps["compile"] == kinds["candidate.compiled"] == result.candidates_done
    assert steps["validate"] == kinds["candidate.validated"]
    assert steps["benchmark"] == kinds["candidate.benchmarked"] >= 1
    assert steps["propose"] == kinds["generation.proposed"] == 1  # generation 0 is the seed, not proposed
    assert any(name == f"{STEP_SECONDS}_bucket" and labels.get("le") == "1800" for name, labels, _ in ours)

    promotions = [event.payload["speedup"] for event in events if event.type == "incumbent.promoted"]
    best = [value for name, labels, value in ours if name == BEST_SPEEDUP and labels["problem"] == "softmax"]
    assert promotions and best == [pytest.approx(max(promotions), rel=1e-9)]
    assert [labels["target"] for name, labels, _ in ours if name == BEST_SPEEDUP] == [target]


def test_a_port_already_taken_is_a_configuration_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigurationError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            prometheus_runtime("127.0.0.1", port)

"""The worker: wires the KernelSearch workflow and its activities to task queues for this machine.

One process polls the control queue (workflows and the activities that touch no kernel hardware), the
generic queue of each hardware kind (`kf-cpu`, where a search with target `cpu` asks which ISA serves it)
and the specific queue of each target it has (`kf-cpu-x86_64-avx512`, …).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from activities.search import SearchActivities
from engine.evidence.store import EventStore
from engine.hardware import cpu_target
from engine.search.spec import control_queue, target_queue
from engine.targets import detect_gpus
from workflows.kernel_search import KernelSearch

log = logging.getLogger(__name__)


def hardware_slots() -> int:
    """Hardware steps one CPU worker runs at once: one per two cores, so timings do not fight each other."""
    return max(1, (os.cpu_count() or 1) // 2)


def serveable_targets() -> list[str]:
    """Targets this worker has a backend for: GPUs are reported, not served, until a CUDA backend lands."""
    for gpu in detect_gpus():
        log.warning("found %s (%s) but the CUDA backend is not available yet; not polling it", gpu.name, gpu.target)
    return [cpu_target()]


def build_workers(
    client: Client,
    store: EventStore,
    *,
    prefix: str = "kf",
    targets: Sequence[str] | None = None,
    identity: str | None = None,
    control: bool = True,
) -> list[Worker]:
    """The Temporal workers of one `kf worker` process."""
    acts = SearchActivities(store, identity=identity)
    targets = list(targets) if targets is not None else serveable_targets()
    workers = []
    if control:
        workers.append(
            Worker(
                client,
                task_queue=control_queue(prefix),
                workflows=[KernelSearch],
                activities=[acts.start_search, acts.propose, acts.record],
                identity=acts.identity,
            )
        )
    hardware_acts: list[Callable[..., Any]] = [acts.describe_worker, acts.compile, acts.validate, acts.benchmark]
    for target in targets:
        generic = target.split("-", 1)[0]
        workers.append(
            Worker(
                client,
                task_queue=target_queue(prefix, generic),
                activities=[acts.describe_worker],
                identity=acts.identity,
            )
        )
        workers.append(
            Worker(
                client,
                task_queue=target_queue(prefix, target),
                activities=hardware_acts,
                max_concurrent_activities=hardware_slots(),
                identity=acts.identity,
            )
        )
    return workers


async def run_worker(
    client: Client,
    store: EventStore,
    *,
    prefix: str = "kf",
    targets: Sequence[str] | None = None,
    identity: str | None = None,
    control: bool = True,
) -> None:
    """Run until cancelled."""
    workers = build_workers(client, store, prefix=prefix, targets=targets, identity=identity, control=control)
    log.info("worker %s polling %d task queues", identity or "", len(workers))
    await asyncio.gather(*(w.run() for w in workers))

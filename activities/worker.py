"""The worker: wires the KernelSearch workflow and its activities to task queues for this machine.

One process polls the control queue (workflows and the activities that touch no kernel hardware), the
generic queue of each hardware kind (`kf-cpu`, where a search with target `cpu` asks which ISA serves it),
the specific queue of each target it has (`kf-cpu-x86_64-avx512`, `kf-cuda-sm90`, …) and the build queue
(`kf-build`) where CUDA sources are compiled: NVRTC needs no GPU, so every worker, GPU or not, builds them.

One GPU per worker process: the CUDA judge runs on the device CUDA_VISIBLE_DEVICES names first, so a machine
with several GPUs runs one `kf worker --gpu N` per GPU (each sets CUDA_VISIBLE_DEVICES=N), all polling the
same `kf-cuda-smNN` queue, each taking one GPU step at a time.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from activities.search import SearchActivities
from engine.evidence.artifacts import ArtifactStore
from engine.evidence.store import EventStore
from engine.hardware import cpu_target
from engine.search.spec import build_queue, control_queue, target_queue
from engine.targets import GpuScan, scan_gpus
from workflows.kernel_search import KernelSearch

log = logging.getLogger(__name__)


def hardware_slots() -> int:
    """Hardware steps one CPU worker runs at once: one per two cores, so timings do not fight each other."""
    return max(1, (os.cpu_count() or 1) // 2)


def serveable_targets(scan: GpuScan | None = None) -> list[str]:
    """Targets this worker serves: its CPU, and the CUDA target of the first GPU it sees. Says once, in one
    log line, when there is no GPU to serve (and why), or when GPUs beyond the first need workers of their own."""
    scan = scan if scan is not None else scan_gpus()
    targets = [cpu_target()]
    if not scan.gpus:
        log.info("no GPU: %s; serving %s and CUDA compiles only", scan.reason, targets[0])
        return targets
    gpu = scan.gpus[0]
    if len(scan.gpus) > 1:
        log.warning(
            "%d GPUs visible; this worker serves only the first (%s, %s): run one `kf worker --gpu N` per GPU",
            len(scan.gpus),
            gpu.name,
            gpu.target,
        )
    targets.append(gpu.target)
    return targets


def build_workers(
    client: Client,
    store: EventStore,
    *,
    prefix: str = "kf",
    targets: Sequence[str] | None = None,
    identity: str | None = None,
    control: bool = True,
    artifacts: ArtifactStore | None = None,
    cache_dir: Path | None = None,
) -> list[Worker]:
    """The Temporal workers of one `kf worker` process. Built artifacts are shared through ``artifacts``
    (default: the event store's database); ``cache_dir`` (default: the state folder's) is this worker's cache."""
    acts = SearchActivities(store, identity=identity, artifacts=artifacts, cache_dir=cache_dir)
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
    hardware_acts: list[Callable[..., Any]] = [
        acts.describe_worker,
        acts.compile,
        acts.validate,
        acts.benchmark,
        acts.playoff,
        acts.confirm,
    ]
    for target in targets:
        gpu = target.startswith("cuda-")
        if not gpu:
            # `kf-cpu` resolves a search's `cpu` to this worker's ISA; a CUDA search names its architecture.
            workers.append(
                Worker(
                    client,
                    task_queue=target_queue(prefix, target.split("-", 1)[0]),
                    activities=[acts.describe_worker],
                    identity=acts.identity,
                )
            )
        workers.append(
            Worker(
                client,
                task_queue=target_queue(prefix, target),
                activities=hardware_acts,
                # One GPU step at a time: a timed job needs the GPU alone (engine/harness/cuda/lease.py).
                max_concurrent_activities=1 if gpu else hardware_slots(),
                identity=acts.identity,
            )
        )
    workers.append(
        Worker(
            client,
            task_queue=build_queue(prefix),
            activities=[acts.compile],
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
    artifacts = ArtifactStore(store.pool)
    # Refused at start rather than at the first compile: a worker that cannot share artifacts would fail
    # every step it takes.
    await artifacts.check_migrated()
    workers = build_workers(
        client, store, prefix=prefix, targets=targets, identity=identity, control=control, artifacts=artifacts
    )
    log.info("worker %s polling %d task queues", identity or "", len(workers))
    await asyncio.gather(*(w.run() for w in workers))

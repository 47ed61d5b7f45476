"""`kf worker`: poll the control queue and this machine's hardware queues until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import Any

from engine.connections import database_url
from engine.hardware import cpu_target
from engine.targets import detect_gpus


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "worker",
        help="run a worker for this machine's hardware",
        description="Polls the control task queue and the queues of this machine's targets "
        "(e.g. kf-cpu and kf-cpu-x86_64-avx512). Stop with Ctrl-C.",
    )
    parser.add_argument("--prefix", default="kf", help="task queue prefix (default: kf)")
    parser.add_argument("--no-control", action="store_true", help="serve only hardware queues")
    parser.add_argument("--identity", default=None, help="worker identity recorded with every outcome")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print(f"kf worker: CPU target {cpu_target()}; GPUs: {[g.target for g in detect_gpus()] or 'none'}", flush=True)
    asyncio.run(_serve(args))
    return 0


async def _serve(args: argparse.Namespace) -> None:
    # Temporal is reached only through activities/: engine itself stays free of it.
    from activities.temporal_client import connect
    from activities.worker import run_worker
    from engine.evidence.store import EventStore

    client = await connect()
    store = await EventStore.connect(database_url())
    try:
        await run_worker(client, store, prefix=args.prefix, identity=args.identity, control=not args.no_control)
    finally:
        await store.close()

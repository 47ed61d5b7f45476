"""`kf worker`: poll the control queue and this machine's hardware queues until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from typing import Any

from engine.connections import database_url
from engine.hardware import cpu_target


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "worker",
        help="run a worker for this machine's hardware",
        description="Polls the control task queue, the queues of this machine's targets (e.g. kf-cpu, "
        "kf-cpu-x86_64-avx512 and, with a GPU, kf-cuda-sm90) and the build queue kf-build (CUDA compiles). "
        "One worker serves one GPU: on a machine with several, run one `kf worker --gpu N` per GPU. "
        "Stop with Ctrl-C.",
    )
    parser.add_argument("--prefix", default="kf", help="task queue prefix (default: kf)")
    parser.add_argument(
        "--gpu",
        default=None,
        metavar="N",
        help="serve GPU N (an index or GPU-UUID, as CUDA_VISIBLE_DEVICES takes it); default: the first visible",
    )
    parser.add_argument("--no-control", action="store_true", help="serve only hardware queues")
    parser.add_argument("--identity", default=None, help="worker identity recorded with every outcome")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.gpu is not None:
        # Before anything initialises CUDA in this process: the driver reads it once, and the judge's sandboxed
        # child inherits it, so "device 0" everywhere below is GPU N.
        os.environ["CUDA_VISIBLE_DEVICES"] = str(args.gpu)
    # The GPU (or why there is none) is said once, by the worker's choice of targets (activities/worker.py).
    print(f"kf worker: CPU target {cpu_target()}", flush=True)
    asyncio.run(_serve(args))
    return 0


async def _serve(args: argparse.Namespace) -> None:
    # Temporal is reached only through activities/: engine itself stays free of it.
    from activities.temporal_client import connect, unreachable
    from activities.worker import run_worker
    from engine.evidence.roles import rewrite_privileges, rewrite_warning
    from engine.evidence.store import EventStore
    from engine.outages import wait_out

    # A worker (re)started while Postgres or Temporal is down -- an operator restarting them, a machine coming
    # back -- waits for them, up to the outage patience, instead of exiting.
    client = await wait_out(connect, what="Temporal", transient=unreachable)
    url = database_url()
    store = await wait_out(lambda: EventStore.connect(url), what="Postgres")
    held = await rewrite_privileges(store.pool)
    if held:
        logging.getLogger("kf.worker").warning(rewrite_warning(await store.pool.fetchval("SELECT current_user"), held))
    try:
        await run_worker(client, store, prefix=args.prefix, identity=args.identity, control=not args.no_control)
    finally:
        await store.close()

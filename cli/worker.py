"""`kf worker`: poll the control queue and this machine's hardware queues until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from collections.abc import Coroutine
from typing import Any

from cli import exit_status
from cli.options import queue_prefix
from engine.config import metrics_port
from engine.connections import database_url
from engine.errors import UserError
from engine.hardware import cpu_target
from engine.targets import scan_gpus

METRICS_HOST = "127.0.0.1"
"""Where the metrics are served unless --metrics-host says otherwise: this machine only."""
STOP_SIGNALS = {signal.SIGINT: exit_status.INTERRUPTED, signal.SIGTERM: exit_status.TERMINATED}
"""The signals that stop a worker, and the status it then exits with (cli/exit_status.py)."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "worker",
        help="run a worker for this machine's hardware",
        description="Polls the control task queue, the queues of this machine's targets (e.g. kf-cpu, "
        "kf-cpu-x86_64-avx512 and, with a GPU, kf-cuda-sm90) and the build queue kf-build (CUDA compiles). "
        "One worker serves one GPU: on a machine with several, run one `kf worker --gpu N` per GPU. "
        "Stop with Ctrl-C (exit status 130) or SIGTERM (143).",
    )
    parser.add_argument(
        "--prefix", type=queue_prefix, default="kf", help="task queue prefix: letters, digits, _ . - (default: kf)"
    )
    parser.add_argument(
        "--gpu",
        default=None,
        metavar="N",
        help="serve GPU N (an index or GPU-UUID, as CUDA_VISIBLE_DEVICES takes it); default: the first visible",
    )
    parser.add_argument("--no-control", action="store_true", help="serve only hardware queues")
    parser.add_argument(
        "--identity",
        type=_identity,
        default=None,
        help="worker identity recorded with every outcome (default: kf-worker@<host>:<pid>)",
    )
    parser.add_argument(
        "--metrics-port",
        type=_port,
        default=None,
        metavar="N",
        help="serve Prometheus metrics (the Temporal SDK's and kf_*) on http://HOST:N/metrics "
        "(default: KF_METRICS_PORT, else no metrics)",
    )
    parser.add_argument(
        "--metrics-host",
        default=METRICS_HOST,
        metavar="HOST",
        help="address the metrics are served on; 0.0.0.0 for every interface",
    )
    parser.set_defaults(handler=run)


def _identity(text: str) -> str:
    # Recorded with every outcome the worker writes: an empty or unprintable one would name no one in the audit.
    if not text.strip() or not text.isprintable() or len(text) > 255:
        raise argparse.ArgumentTypeError(f"{text!r} is not an identity; pass 1 to 255 printable characters")
    return text


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port; pass an integer from 1 to 65535")
    return int(text)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.gpu is not None:
        # Before anything initialises CUDA in this process: the driver reads it once, and the judge's sandboxed
        # child inherits it, so "device 0" everywhere below is GPU N.
        os.environ["CUDA_VISIBLE_DEVICES"] = str(args.gpu)
        scan = scan_gpus()
        if not scan.gpus:
            # Asked for a GPU by name: serving only the CPU instead would leave that GPU's searches waiting.
            raise UserError(
                f"--gpu {args.gpu}: no GPU to serve: {scan.reason}; omit --gpu to run a worker for the CPU alone"
            )
    # The GPU (or why there is none) is said once, by the worker's choice of targets (activities/worker.py).
    print(f"kf worker: CPU target {cpu_target()}", flush=True)
    port = args.metrics_port if args.metrics_port is not None else metrics_port()
    return asyncio.run(until_stopped(_serve(args, port)))


async def until_stopped(serving: Coroutine[Any, Any, None]) -> int:
    """Run ``serving`` until it returns (0) or SIGINT or SIGTERM stops it: it is cancelled -- the Temporal workers
    shut down, cancelling the steps they run, which Temporal retries on another worker -- and the status says
    which signal (130 or 143).

    Why the handlers are installed here rather than left to Python: a shell without job control (a script, CI,
    the README's `kf worker &`) starts a background command with SIGINT ignored, and Python (asyncio.run's own
    Ctrl-C handling included) leaves an ignored SIGINT ignored, so such a worker never stopped on SIGINT. And
    SIGTERM (kill, systemd, docker stop) had no handler at all: the worker died on the spot, its database pool
    and workers never closed. A handler set through the event loop replaces an inherited SIG_IGN."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(serving)
    received: list[signal.Signals] = []

    def stop(signum: signal.Signals) -> None:
        if not received:
            logging.getLogger("kf.worker").info("%s: stopping", signum.name)
        received.append(signum)
        task.cancel()  # a second signal cancels the shutdown itself: it ends at once

    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, stop, signum)
    try:
        await task
    except asyncio.CancelledError:
        if not received:
            raise
    finally:
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)
    return STOP_SIGNALS[received[0]] if received else exit_status.OK


async def _serve(args: argparse.Namespace, port: int | None) -> None:
    # Temporal is reached only through activities/: engine itself stays free of it.
    from activities.metrics import prometheus_runtime
    from activities.temporal_client import connect, unreachable
    from activities.worker import run_worker
    from engine.evidence.roles import rewrite_privileges, rewrite_warning
    from engine.evidence.store import EventStore
    from engine.outages import wait_out

    # A worker (re)started while Postgres or Temporal is down -- an operator restarting them, a machine coming
    # back -- waits for them, up to the outage patience, instead of exiting.
    # The worker's client carries the runtime its workers report metrics through (activities/metrics.py).
    runtime = prometheus_runtime(args.metrics_host, port) if port is not None else None
    if port is not None:
        print(f"kf worker: metrics on http://{args.metrics_host}:{port}/metrics", flush=True)
    client = await wait_out(lambda: connect(runtime=runtime), what="Temporal", transient=unreachable)
    url = database_url()
    store = await wait_out(lambda: EventStore.connect(url), what="Postgres")
    held = await rewrite_privileges(store.pool)
    if held:
        logging.getLogger("kf.worker").warning(rewrite_warning(await store.pool.fetchval("SELECT current_user"), held))
    try:
        await run_worker(client, store, prefix=args.prefix, identity=args.identity, control=not args.no_control)
    finally:
        await store.close()

"""`kf demo`: the main job on the embedded default — services up, a worker, a short real search, its result."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cli.options import integer, problem_name
from engine import services
from engine.config import kf_home
from engine.errors import UserError
from engine.input_errors import allowed, explain
from engine.search.spec import SearchSpec


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="start the embedded services and run a short real search",
        description="Starts the embedded Temporal and Postgres (kf up), a worker for this machine, and a short "
        "softmax search; prints its result, the audit command and the Web UI link. The services keep running "
        "afterwards (kf down stops them).",
    )
    parser.add_argument("--problem", type=problem_name, default="softmax", help="the problem to search")
    parser.add_argument(
        "--generations",
        type=integer(SearchSpec, "generations"),
        default=2,
        help=f"default 2 ({allowed(SearchSpec, 'generations')})",
    )
    parser.add_argument(
        "--candidates",
        type=integer(SearchSpec, "candidates_per_generation"),
        default=4,
        help=f"candidates per generation, default 4 ({allowed(SearchSpec, 'candidates_per_generation')})",
    )
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:  # refuse a bad value now, not after starting services and a worker for the search that would refuse it
        SearchSpec(problem=args.problem, generations=args.generations, candidates_per_generation=args.candidates)
    except ValidationError as error:
        labels = {"generations": "--generations", "candidates_per_generation": "--candidates"}
        raise UserError(f"invalid search: {explain(error, SearchSpec, labels)}") from None
    report = services.up()
    if not args.json:
        print(f"services up — Temporal {report.temporal.address}, Web UI {report.temporal.ui_url}", flush=True)
    log_path = kf_home() / "logs" / "demo-worker.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    worker = _start_worker(log_path)
    try:
        command = [
            _kf(),
            "search",
            "start",
            args.problem,
            "--generations",
            str(args.generations),
            "--candidates",
            str(args.candidates),
            "--wait",
        ] + (["--json"] if args.json else [])
        status = subprocess.call(command)
    finally:
        worker.send_signal(signal.SIGINT)
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
    if not args.json:
        print(f"worker log: {log_path}\nservices still running: `kf status`, `kf down` to stop them")
    return status


def _kf() -> str:
    return str(Path(sys.executable).with_name("kf"))


def _start_worker(log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log:
        worker = subprocess.Popen([_kf(), "worker"], stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    time.sleep(0.5)
    if worker.poll() is not None:
        raise SystemExit(f"kf demo: the worker exited at once; see {log_path}")
    return worker

"""`kf search …` and `kf audit`: start, follow, steer and audit searches.

The commands reach Temporal through ``activities`` (imported inside the handlers), so ``engine`` itself never
imports Temporal and `kf evaluate` works without it installed or running.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from pydantic import ValidationError

from engine.config import temporal_namespace
from engine.connections import database_url
from engine.errors import UserError
from engine.search.spec import SearchSpec
from engine.search.state import SearchResult, SearchStatus

UI_URL_DEFAULT = "http://127.0.0.1:8233"


def register(subparsers: Any) -> None:
    search = subparsers.add_parser("search", help="start, follow and steer searches")
    verbs = search.add_subparsers(dest="verb", metavar="VERB")

    start = verbs.add_parser("start", help="start a search", description="Start a KernelSearch workflow.")
    start.add_argument("problem", help="built-in problem name or problem folder")
    start.add_argument("--target", default=None, help="cpu (default), cpu-<arch>-<isa>, cuda-sm<NN>")
    start.add_argument("--generations", type=int, default=None)
    start.add_argument("--candidates", type=int, default=None, help="candidates per generation")
    start.add_argument("--parallelism", type=int, default=None)
    start.add_argument("--proposer", default=None, help="random | search | llm | mixed")
    start.add_argument("--model", action="append", default=None, help="LLM model (repeatable)")
    start.add_argument("--max-candidates", type=int, default=None)
    start.add_argument("--max-minutes", type=float, default=None)
    start.add_argument("--max-llm-usd", type=float, default=None)
    start.add_argument("--margin", type=float, default=None, help="promotion margin, e.g. 0.02")
    start.add_argument("--seed", type=int, default=None)
    start.add_argument("--benchmark-seconds", type=float, default=None)
    start.add_argument("--threads", type=int, default=None)
    start.add_argument("--resume-from", default=None, help="an earlier search id to start from")
    start.add_argument("--hint", action="append", default=None, help="a hint for the proposers (repeatable)")
    start.add_argument("--spec", default=None, help="a JSON SearchSpec; options given above override it")
    start.add_argument("--id", default=None, help="the search id (default: search-<problem>-<random>)")
    start.add_argument("--prefix", default=None, help="task queue prefix (default: kf)")
    start.add_argument("--wait", action="store_true", help="follow progress until the search ends")
    start.add_argument("--json", action="store_true", help="print JSON")
    start.set_defaults(handler=run_start)

    listing = verbs.add_parser("list", help="list recent searches")
    listing.add_argument("--limit", type=int, default=50)
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(handler=run_list)

    show = verbs.add_parser("show", help="a search's progress and result")
    show.add_argument("search_id")
    show.add_argument("--json", action="store_true")
    show.set_defaults(handler=run_show)

    for verb, text in (("pause", "stop starting new work"), ("resume", "undo pause"), ("stop", "end gracefully")):
        parser = verbs.add_parser(verb, help=text)
        parser.add_argument("search_id")
        parser.add_argument("--json", action="store_true")
        parser.set_defaults(handler=run_update, update=verb)

    hint = verbs.add_parser("hint", help="give the proposers a hint")
    hint.add_argument("search_id")
    hint.add_argument("text")
    hint.add_argument("--json", action="store_true")
    hint.set_defaults(handler=run_update, update="add_hint")

    extend = verbs.add_parser("extend", help="raise a running search's budget")
    extend.add_argument("search_id")
    extend.add_argument("--max-candidates", type=int, default=None)
    extend.add_argument("--max-minutes", type=float, default=None)
    extend.add_argument("--max-llm-usd", type=float, default=None)
    extend.add_argument("--json", action="store_true")
    extend.set_defaults(handler=run_update, update="extend_budget")
    search.set_defaults(handler=lambda args: (search.print_help(), 2)[1])

    audit = subparsers.add_parser(
        "audit",
        help="the evidence chain of a search",
        description="Every candidate and step of a search from the event log, with the Temporal ids that wrote "
        "them, and the hash chain verified. Exits 1 if the chain is broken.",
    )
    audit.add_argument("search_id")
    audit.add_argument("--json", action="store_true")
    audit.set_defaults(handler=run_audit)


def spec_from_args(args: argparse.Namespace) -> SearchSpec:
    """The SearchSpec the options describe; a bad value is a UserError naming the field."""
    raw: dict[str, Any] = {}
    if args.spec:
        try:
            raw = json.loads(args.spec)
        except json.JSONDecodeError as error:
            raise UserError(f"--spec is not valid JSON ({error}); pass e.g. '{{\"generations\": 2}}'") from None
    raw["problem"] = args.problem
    options = {
        "target": args.target,
        "generations": args.generations,
        "candidates_per_generation": args.candidates,
        "parallelism": args.parallelism,
        "seed": args.seed,
        "benchmark_seconds": args.benchmark_seconds,
        "threads": args.threads,
        "resume_from": args.resume_from,
        "task_queue_prefix": args.prefix,
    }
    raw |= {k: v for k, v in options.items() if v is not None}
    if args.proposer or args.model:
        raw["proposer"] = dict(raw.get("proposer", {})) | {
            k: v for k, v in {"kind": args.proposer, "models": args.model}.items() if v
        }
    budget = {"max_candidates": args.max_candidates, "max_wall_minutes": args.max_minutes}
    budget["max_llm_usd"] = args.max_llm_usd
    if any(v is not None for v in budget.values()):
        raw["budget"] = dict(raw.get("budget", {})) | {k: v for k, v in budget.items() if v is not None}
    if args.margin is not None:
        raw["promotion"] = dict(raw.get("promotion", {})) | {"margin": args.margin}
    if args.hint:
        raw["hints"] = list(raw.get("hints", [])) + args.hint
    try:
        return SearchSpec.model_validate(raw)
    except ValidationError as error:
        raise UserError(f"invalid search: {error}") from None


def ui_url(search_id: str | None = None) -> str:
    """The Temporal Web UI address (of a search's page, when given)."""
    base = os.environ.get("KF_TEMPORAL_UI_URL") or _embedded_ui_url() or UI_URL_DEFAULT
    if search_id is None:
        return base
    return f"{base}/namespaces/{temporal_namespace()}/workflows/{search_id}"


def _embedded_ui_url() -> str | None:
    try:
        from engine.services import status

        url: str | None = status().temporal.ui_url
        return url
    except Exception:  # no embedded services: fall back to the default address
        return None


def run_start(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    return asyncio.run(_start(spec, args))


async def _start(spec: SearchSpec, args: argparse.Namespace) -> int:
    from activities.search_client import search_status, start_search
    from activities.temporal_client import connect

    client = await connect()
    handle = await start_search(client, spec, args.id)
    if not args.wait:
        if args.json:
            print(json.dumps({"search_id": handle.id, "status": "running", "ui": ui_url(handle.id)}))
        else:
            print(f"started {handle.id}\nfollow: kf search show {handle.id}\nUI: {ui_url(handle.id)}")
        return 0
    if not args.json:
        print(f"started {handle.id} — UI: {ui_url(handle.id)}", flush=True)
    result_task = asyncio.ensure_future(handle.result())
    last = ""
    while not result_task.done():
        try:
            line = progress_line(await search_status(client, handle.id))
        except Exception:  # the first workflow task may not have run yet
            line = "waiting for a worker…"
        if not args.json and line != last:
            _print_progress(line)
            last = line
        await asyncio.wait({result_task}, timeout=1.0)
    if not args.json and sys.stdout.isatty():
        print()
    try:
        result: SearchResult = result_task.result()
    except Exception as error:
        cause = getattr(error, "cause", None)
        message = str(getattr(cause, "message", None) or cause or error)
        if args.json:
            print(json.dumps({"search_id": handle.id, "status": "failed", "error": message}))
        else:
            print(f"search {handle.id} failed: {message}", file=sys.stderr)
        return 1
    print(format_result(result, args.json))
    return 0


def progress_line(status: SearchStatus) -> str:
    verdicts = " ".join(f"{k}={v}" for k, v in sorted(status.verdict_counts.items())) or "-"
    best = f"{status.best_speedup:.3f}x" if status.best_speedup is not None else "-"
    return (
        f"[{status.status}] generation {status.generation}/{status.generations} · "
        f"{status.candidates_done} candidates · {verdicts} · best {best} vs numpy"
    )


def _print_progress(line: str) -> None:
    if sys.stdout.isatty():
        print(f"\r\033[K{line}", end="", flush=True)
    else:
        print(line, flush=True)


def format_result(result: SearchResult, as_json: bool) -> str:
    inc = result.incumbent
    if as_json:
        body = result.model_dump(mode="json")
        body["incumbent"] = (
            {"candidate_id": inc.candidate_id, "label": inc.label, "flags": inc.flags, "params": inc.params}
            if inc
            else None
        )
        body["ui"] = ui_url(result.search_id)
        return json.dumps(body)
    lines = [
        f"search {result.search_id}: {result.status}",
        f"  candidates evaluated: {result.candidates_done} "
        f"({', '.join(f'{k} {v}' for k, v in sorted(result.verdict_counts.items()))})",
    ]
    if inc is not None and result.best_speedup is not None:
        lines.append(
            f"  incumbent: {inc.label} ({inc.candidate_id[:12]}) — {result.best_speedup:.3f}x vs numpy "
            f"[{result.best_ci_low:.3f}, {result.best_ci_high:.3f}]"
        )
    else:
        lines.append("  no correct candidate")
    lines.append(f"  audit: kf audit {result.search_id}")
    lines.append(f"  UI: {ui_url(result.search_id)}")
    return "\n".join(lines)


def run_list(args: argparse.Namespace) -> int:
    async def go() -> list[dict[str, Any]]:
        from activities.search_client import list_searches
        from activities.temporal_client import connect

        return await list_searches(await connect(), limit=args.limit)

    rows = asyncio.run(go())
    if args.json:
        print(json.dumps(rows))
        return 0
    if not rows:
        print("no searches yet: kf search start softmax --wait")
    for row in rows:
        best = f"{row['best_speedup']:.3f}x" if row["best_speedup"] is not None else "-"
        print(
            f"{row['search_id']:<36} {row['status']:<11} {row['problem'] or '-':<10} "
            f"{row['target'] or '-':<22} gen {row['generation'] if row['generation'] is not None else '-':<4} {best}"
        )
    return 0


def run_show(args: argparse.Namespace) -> int:
    async def go() -> SearchStatus:
        from activities.search_client import search_status
        from activities.temporal_client import connect

        return await search_status(await connect(), args.search_id)

    status = asyncio.run(go())
    if args.json:
        print(status.model_dump_json())
    else:
        print(progress_line(status))
        if status.incumbent:
            print(f"incumbent: {status.incumbent}")
        for hint in status.hints:
            print(f"hint: {hint}")
        print(f"UI: {ui_url(status.search_id)}")
    return 0


def run_update(args: argparse.Namespace) -> int:
    arg: Any = None
    if args.update == "add_hint":
        arg = args.text
    elif args.update == "extend_budget":
        arg = {"max_candidates": args.max_candidates, "max_wall_minutes": args.max_minutes}
        arg["max_llm_usd"] = args.max_llm_usd
        if all(v is None for v in arg.values()):
            raise UserError("kf search extend needs --max-candidates, --max-minutes or --max-llm-usd")

    async def go() -> SearchStatus:
        from activities.search_client import send_update
        from activities.temporal_client import connect

        return await send_update(await connect(), args.search_id, args.update, arg)

    status = asyncio.run(go())
    print(status.model_dump_json() if args.json else progress_line(status))
    return 0


def run_audit(args: argparse.Namespace) -> int:
    from engine.search.audit import audit_search, format_audit

    report = asyncio.run(audit_search(database_url(), args.search_id))
    print(json.dumps(report) if args.json else format_audit(report))
    return 0 if report["chain"]["intact"] else 1

"""`kf search …` and `kf audit`: start, follow, steer and audit searches.

The commands reach Temporal through ``activities`` (imported inside the handlers), so ``engine`` itself never
imports Temporal and `kf evaluate` works without it installed or running.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, get_args
from urllib.parse import quote

from pydantic import BaseModel, ValidationError

from cli import exit_status
from cli.options import integer, number, search_id, string
from engine.config import outage_patience_s, temporal_namespace, temporal_ui_url_override
from engine.connections import database_url
from engine.errors import UserError
from engine.input_errors import allowed, explain
from engine.outages import FIRST_DELAY_S, MAX_DELAY_S, wait_out
from engine.search.candidates import short_name
from engine.search.spec import Budget, ProposerKind, SearchSpec, check_hint
from engine.search.state import SearchResult, SearchStatus

if TYPE_CHECKING:
    from temporalio.client import Client

UI_URL_DEFAULT = "http://127.0.0.1:8233"
SEARCH_ID_HELP = "the search id, as `kf search list` prints it"
MAX_LISTED = 1000
"""Most searches `kf search list --limit` asks Temporal for."""
# Which option sets which SearchSpec field, so an error about a value typed on the command line names the
# option the user typed (and the field, for a value that came from --spec).
SPEC_OPTIONS = {
    "target": "target",
    "generations": "generations",
    "candidates_per_generation": "candidates",
    "parallelism": "parallelism",
    "proposer.kind": "proposer",
    "proposer.models": "model",
    "budget.max_candidates": "max_candidates",
    "budget.max_wall_minutes": "max_minutes",
    "budget.max_llm_usd": "max_llm_usd",
    "promotion.margin": "margin",
    "promotion.confidence": "confidence",
    "promotion.confirm_halfwidth": "confirm_halfwidth",
    "promotion.steering_remeasures": "steering_remeasures",
    "seed": "seed",
    "benchmark_seconds": "benchmark_seconds",
    "threads": "threads",
    "resume_from": "resume_from",
    "resume_latest": "resume_latest",
    "resume_best": "resume_best",
    "hints": "hint",
    "task_queue_prefix": "prefix",
}


def register(subparsers: Any) -> None:
    search = subparsers.add_parser("search", help="start, follow and steer searches")
    verbs = search.add_subparsers(dest="verb", metavar="VERB")

    start = verbs.add_parser("start", help="start a search", description="Start a KernelSearch workflow.")
    start.add_argument("problem", help="built-in problem name or problem folder")
    add_spec_options(start)
    start.add_argument(
        "--resume-latest",
        action="store_const",
        const=True,
        default=None,
        help="start from the newest incumbent an earlier search of this problem and target recorded",
    )
    start.add_argument(
        "--resume-best",
        action="store_const",
        const=True,
        default=None,
        help="start from the fastest incumbent an earlier search of this problem and target recorded",
    )
    start.add_argument("--id", type=search_id, default=None, help="the search id (default: search-<problem>-<random>)")
    start.add_argument("--wait", action="store_true", help="follow progress until the search ends")
    start.add_argument("--json", action="store_true", help="print JSON")
    start.set_defaults(handler=run_start)

    listing = verbs.add_parser("list", help="list recent searches")
    listing.add_argument("--limit", type=int, default=50, help=f"most searches listed (default 50; 1 to {MAX_LISTED})")
    listing.add_argument("--json", action="store_true", help="print a JSON list of the searches")
    listing.set_defaults(handler=run_list)

    show = verbs.add_parser("show", help="a search's progress and result")
    show.add_argument("search_id", type=search_id, help=SEARCH_ID_HELP)
    show.add_argument(
        "--json", action="store_true", help="print the search's status (or, with --wait, its result) as JSON"
    )
    show.add_argument("--wait", action="store_true", help="follow progress until the search ends")
    show.set_defaults(handler=run_show)

    for verb, text in (("pause", "stop starting new work"), ("resume", "undo pause"), ("stop", "end gracefully")):
        parser = verbs.add_parser(verb, help=text)
        parser.add_argument("search_id", type=search_id, help=SEARCH_ID_HELP)
        parser.add_argument("--json", action="store_true", help="print the search's status as JSON")
        parser.set_defaults(handler=run_update, update=verb)

    hint = verbs.add_parser("hint", help="give the proposers a hint")
    hint.add_argument("search_id", type=search_id, help=SEARCH_ID_HELP)
    hint.add_argument("text", type=_hint, help=f"the hint ({allowed(SearchSpec, 'hints.0')})")
    hint.add_argument("--json", action="store_true", help="print the search's status as JSON")
    hint.set_defaults(handler=run_update, update="add_hint")

    extend = verbs.add_parser("extend", help="raise a running search's budget")
    extend.add_argument("search_id", type=search_id, help=SEARCH_ID_HELP)
    _add_spec_option(
        extend, "--max-candidates", "budget.max_candidates", integer, "new candidate limit, default unchanged"
    )
    _add_spec_option(
        extend, "--max-minutes", "budget.max_wall_minutes", number, "new wall-time limit in minutes, default unchanged"
    )
    _add_spec_option(extend, "--max-llm-usd", "budget.max_llm_usd", number, "new LLM spending limit, default unchanged")
    extend.add_argument("--json", action="store_true", help="print the search's status as JSON")
    extend.set_defaults(handler=run_update, update="extend_budget")
    search.set_defaults(handler=lambda args: (search.print_help(), 2)[1])

    audit = subparsers.add_parser(
        "audit",
        help="the evidence chain of a search (or, with --all, of the whole log)",
        description="Every candidate and step of a search from the event log, with the Temporal ids that wrote "
        "them, the hash chain verified, and the stream checked against the heads its Temporal history recorded "
        "(the witness outside the database). With --all: every stream's chain and the log's positions, against "
        "the highest position ever committed. Exits 1 if anything was changed or removed; with --require-witness, "
        "3 if the witness could not be read (Temporal down), where it would otherwise say so and exit 0.",
    )
    audit.add_argument("search_id", type=search_id, nargs="?", help="the search (omit with --all)")
    audit.add_argument("--all", action="store_true", help="audit the whole log instead of one search")
    audit.add_argument(
        "--file",
        default=None,
        help="verify an export (kf export) offline instead: no database, no Temporal (default: audit the database)",
    )
    audit.add_argument("--json", action="store_true", help="print the audit report as JSON")
    audit.add_argument(
        "--require-witness",
        action="store_true",
        help="exit 3 when the search's witness in Temporal cannot be read (by default the audit of the log alone "
        "still runs, says the witness is unavailable, and exits 0 if the chain is intact)",
    )
    audit.set_defaults(handler=run_audit)


def add_spec_options(parser: argparse.ArgumentParser, *, resume_from: bool = True) -> None:
    """The options that set SearchSpec fields, shared by `kf search start` and `kf schedule create` (which has no
    ``--resume-from``); read back by :func:`spec_from_args`. Every bound is the SearchSpec's own
    (engine/search/spec.py), stated from its schema."""
    _add_spec_option(parser, "--target", "target", string, "cpu (default), cpu-<arch>-<isa>, cuda-sm<NN>")
    _add_spec_option(parser, "--generations", "generations", integer, "generations after the seed kernel")
    _add_spec_option(parser, "--candidates", "candidates_per_generation", integer, "candidates per generation")
    _add_spec_option(parser, "--parallelism", "parallelism", integer, "candidates evaluated at once")
    parser.add_argument("--proposer", default=None, choices=get_args(ProposerKind), help="who proposes (default gp)")
    parser.add_argument(
        "--model",
        action="append",
        default=None,
        help=f"LLM model (repeatable; {allowed(SearchSpec, 'proposer.models')}; default: none, the proposer's own)",
    )
    _add_spec_option(parser, "--max-candidates", "budget.max_candidates", integer, "stop after this many candidates")
    _add_spec_option(parser, "--max-minutes", "budget.max_wall_minutes", number, "stop after this many minutes")
    _add_spec_option(parser, "--max-llm-usd", "budget.max_llm_usd", number, "stop LLM proposing at this spend")
    _add_spec_option(parser, "--margin", "promotion.margin", number, "promotion margin, e.g. 0.02")
    _add_spec_option(parser, "--confidence", "promotion.confidence", number, "promotion confidence, e.g. 0.95")
    _add_spec_option(
        parser,
        "--confirm-halfwidth",
        "promotion.confirm_halfwidth",
        number,
        "re-measure a promotion whose interval's relative half-width is above this (0: every one)",
    )
    _add_spec_option(
        parser,
        "--steering-remeasures",
        "promotion.steering_remeasures",
        integer,
        "shaky readings per generation re-measured before they steer the search (fastest first; 0: none)",
    )
    _add_spec_option(
        parser, "--seed", "seed", integer, "seed of the proposers' randomness (default: a fresh one, recorded)"
    )
    _add_spec_option(parser, "--benchmark-seconds", "benchmark_seconds", number, "timing budget per candidate")
    _add_spec_option(parser, "--threads", "threads", integer, "cores a kernel may use")
    if resume_from:
        _add_spec_option(parser, "--resume-from", "resume_from", string, "an earlier search id to start from")
    parser.add_argument(
        "--hint",
        action="append",
        default=None,
        help=f"a hint for the proposers (repeatable; {allowed(SearchSpec, 'hints')}; default: none)",
    )
    parser.add_argument(
        "--spec",
        default=None,
        help="a JSON object of SearchSpec fields (engine/search/spec.py); options given above override it "
        "(default: none, every field at its default)",
    )
    _add_spec_option(parser, "--prefix", "task_queue_prefix", string, "task queue prefix, default kf")


def _add_spec_option(
    parser: argparse.ArgumentParser,
    option: str,
    path: str,
    kind: Callable[[type[BaseModel], str], Callable[[str], Any]],
    summary: str,
) -> None:
    """An option that sets the SearchSpec field at ``path``; its help states the field's bound and, unless the
    summary says otherwise, the SearchSpec's default (the option's own default is None: "not given", so that
    --spec can set the field)."""
    notes = [allowed(SearchSpec, path)]
    if "default" not in summary:
        notes.append(f"default: {_spec_default(path)}")
    help_text = f"{summary} ({'; '.join(note for note in notes if note)})"
    parser.add_argument(option, type=kind(SearchSpec, path), default=None, help=help_text)


_SPEC_DEFAULTS: dict[str, Any] = SearchSpec(problem="softmax").model_dump(mode="json")  # any problem: it has none


def _spec_default(path: str) -> str:
    """The SearchSpec's default for the field at ``path``, as `--help` says it."""
    value: Any = _SPEC_DEFAULTS
    for part in path.split("."):
        value = value[part]
    if value is None or value == []:
        return "no limit" if path.startswith("budget.") else "none"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _hint(text: str) -> str:
    try:
        return check_hint(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def spec_from_args(args: argparse.Namespace) -> SearchSpec:
    """The SearchSpec the options describe; a bad value is a UserError naming the option (or the --spec
    field), the value and what is allowed — the same bounds a payload typed into the Temporal UI meets."""
    raw: dict[str, Any] = {}
    if args.spec:
        try:
            raw = json.loads(args.spec)
        except json.JSONDecodeError as error:
            raise UserError(f"--spec is not valid JSON ({error}); pass e.g. '{{\"generations\": 2}}'") from None
        if not isinstance(raw, dict):
            raise UserError(
                f"--spec must be a JSON object of SearchSpec fields, not {type(raw).__name__} {raw!r:.80}; "
                "pass e.g. '{\"generations\": 2}'"
            )
    from engine.problems import load_problem, names_a_problem, problem_argument  # numpy: only where searches start

    # A folder given relative to this shell's directory means nothing to a worker started elsewhere.
    raw["problem"] = problem_argument(args.problem)
    given = _given_options(args)
    for path in given:
        value = getattr(args, SPEC_OPTIONS[path])
        *parents, name = path.split(".")
        holder = raw
        for parent in parents:
            section = holder.get(parent, {})
            if not isinstance(section, dict):
                raise UserError(f"--spec field {parent!r} must be a JSON object, not {section!r:.80}")
            holder[parent] = dict(section)
            holder = holder[parent]
        if name == "hints" and isinstance(holder.get(name), list):
            value = holder[name] + value  # --hint adds to the spec's hints
        holder[name] = value
    try:
        spec = SearchSpec.model_validate(raw)
    except ValidationError as error:
        raise UserError(f"invalid search: {explain(error, SearchSpec, given)}") from None
    if not names_a_problem(spec.problem):
        # A well-formed name that is neither a built-in problem nor a problem folder: refused here, before any
        # server is contacted, with the message (and exit status 2) `kf evaluate --problem` gives.
        load_problem(spec.problem)
    return spec


def _given_options(args: argparse.Namespace) -> dict[str, str]:
    """Field path → the option that set it, for each option given on this command line."""
    return {
        path: f"--{attr.replace('_', '-')}"
        for path, attr in SPEC_OPTIONS.items()
        if getattr(args, attr, None) is not None
    }


def ui_url(search_id: str | None = None) -> str:
    """The Temporal Web UI address (of a search's page, when given)."""
    base = temporal_ui_url_override() or _embedded_ui_url() or UI_URL_DEFAULT
    if search_id is None:
        return base
    return f"{base}/namespaces/{quote(temporal_namespace(), safe='')}/workflows/{quote(search_id, safe='')}"


def _embedded_ui_url() -> str | None:
    try:
        from engine.services import status

        url: str | None = status().temporal.ui_url
        return url
    except Exception:  # no embedded services: fall back to the default address
        return None


def run_start(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    started: list[str] = []
    return _following(started, lambda: asyncio.run(_start(spec, args, started)))


def _following(search: list[str], follow_it: Callable[[], int]) -> int:
    """``follow_it()``; interrupted (Ctrl-C: 130) or terminated (SIGTERM: 143), it says on stderr that the search
    in ``search`` (its id, once known) goes on without this follower, and how to follow it again.

    Why the signal ends the process from its handler, instead of raising into the event loop: an exception or a
    cancellation raised into the follower can be swallowed on its way out (Python 3.11's ``asyncio.wait_for``
    drops a cancellation that lands as its inner call finishes; a broad ``except`` in a library catches it), and
    then a stopped follower goes on following for the whole outage patience. A follower holds nothing to clean
    up: the search lives in Temporal, and it writes nothing but its output."""

    def stop(signum: int, frame: object) -> None:
        status, why = (
            (exit_status.INTERRUPTED, "interrupted")
            if signum == signal.SIGINT
            else (exit_status.TERMINATED, "terminated")
        )
        if search:
            again = f"kf search show {shlex.quote(search[0])} --wait"
            said = f"\nkf: {why}; search {search[0]} goes on without this follower: `{again}` follows it again\n"
        else:
            said = f"\nkf: {why}\n"
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, RuntimeError):  # closed, or in the middle of a write this handler interrupted
                pass
        try:
            os.write(2, said.encode())  # unbuffered, and fd 2 even where sys.stderr was replaced
        except OSError:
            pass
        os._exit(status)

    previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        return follow_it()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


async def _start(spec: SearchSpec, args: argparse.Namespace, started: list[str]) -> int:
    from activities.search_client import start_search
    from activities.temporal_client import INTERACTIVE_CONNECT_S, connect

    if spec.resume_from is not None:
        option = _given_options(args).get("resume_from", "--spec field resume_from")
        await _check_resume_from(spec.resume_from, option)
    client = await connect(within_s=INTERACTIVE_CONNECT_S)
    handle = await start_search(client, spec, args.id)
    started.append(handle.id)
    if not args.wait:
        if args.json:
            print(json.dumps({"search_id": handle.id, "status": "running", "ui": ui_url(handle.id)}))
        else:
            print(f"started {handle.id}\nfollow: kf search show {shlex.quote(handle.id)}\nUI: {ui_url(handle.id)}")
        return 0
    if not args.json:
        # Progress, like the lines that follow it: on stderr; the result alone goes to stdout.
        print(f"started {handle.id} — UI: {ui_url(handle.id)}", file=sys.stderr, flush=True)
    return await follow(client, handle.id, args.json)


async def _check_resume_from(search_id: str, option: str) -> None:
    """Refuse (UserError, exit 2) a `resume_from` that names no search the event log holds, before the search
    starts: otherwise it is started, fails at its first step and says so only to whoever follows it. Only
    Postgres can say (an id alone is well formed), so an unreachable database is the machine's failure (exit 3)."""
    from engine.evidence.store import EventStore
    from engine.search.history import was_started

    url = database_url()  # no embedded Postgres running: ServiceUnavailable, exit 3
    store = await EventStore.connect(url, max_size=1)
    try:
        known = await was_started(store, search_id)
    finally:
        await store.close()
    if not known:
        raise UserError(
            f"{option} {search_id!r}: the event log holds no search of that id to resume from; "
            "`kf search list` shows the search ids"
        )


async def follow(client: Client, search_id: str, as_json: bool) -> int:
    """Print a search's progress until it ends, then its result: 0 when it ended, 1 when it failed.

    The search runs in Temporal, not in this process: a frontend that restarts meanwhile is no news about the
    search. While it is unreachable the follower says "Temporal unreachable, retrying" on stderr and tries again
    with back-off, up to the outage patience (KF_OUTAGE_PATIENCE_S); only then does it give up (exit 3, the
    machine's failure), saying the search may well be running still."""
    from activities.search_client import search_status
    from activities.temporal_client import unreachable

    handle = client.get_workflow_handle(search_id, result_type=SearchResult)
    last = ""
    last_status: SearchStatus | None = None
    waiting: list[str] = []
    outage_began: float | None = None
    delay = FIRST_DELAY_S
    while True:
        # Follows continue-as-new to the last run, and asks again from the start after an outage.
        result_task = asyncio.ensure_future(handle.result())
        while not result_task.done():
            try:
                last_status = await search_status(client, search_id)
                line = progress_line(last_status)
            except Exception:  # the first workflow task may not have run yet, or Temporal is restarting
                line = last or "waiting for a worker…"
            if not as_json and line != last:
                _print_progress(line)
                last = line
            if not as_json and last_status is not None and last_status.waiting != waiting:
                waiting = last_status.waiting
                for note in waiting:
                    _print_progress(f"waiting: {note}")
            await asyncio.wait({result_task}, timeout=1.0)
        try:
            result: SearchResult = result_task.result()
        except Exception as error:
            if unreachable(error):
                now = time.monotonic()
                outage_began = now if outage_began is None else outage_began
                if now - outage_began < outage_patience_s():
                    if sys.stderr.isatty() and not as_json:
                        print(file=sys.stderr)
                    print(f"Temporal unreachable, retrying in {delay:g} s ({error})", file=sys.stderr, flush=True)
                    await asyncio.sleep(delay)
                    delay = min(2 * delay, MAX_DELAY_S)
                    continue
                message = (
                    f"Temporal unreachable for {now - outage_began:.0f} s ({error}); the search may still be running: "
                    f"follow it again with `kf search show {shlex.quote(search_id)} --wait` once Temporal is back"
                )
            else:
                cause = getattr(error, "cause", None)
                message = str(getattr(cause, "message", None) or cause or error)
            if not as_json and sys.stderr.isatty():
                print(file=sys.stderr)
            if as_json:
                print(json.dumps({"search_id": search_id, "status": "failed", "error": message}))
            else:
                print(f"search {search_id} failed: {message}", file=sys.stderr)
            return 3 if unreachable(error) else 1  # 3: the service failed, not the search (cli/exit_status.py)
        if not as_json and last_status is not None:
            line = progress_line(final_status(last_status, result))
            if line != last:
                _print_progress(line)
        if not as_json and sys.stderr.isatty():
            print(file=sys.stderr)
        print(format_result(result, as_json))
        return 0


async def _follow_existing(search_id: str, as_json: bool) -> int:
    from activities.temporal_client import connect, not_found, unreachable

    say = (lambda line: print(line, file=sys.stderr, flush=True)) if not as_json else None
    client = await wait_out(connect, what="Temporal", transient=unreachable, say=say)
    try:
        await client.get_workflow_handle(search_id).describe()
    except Exception as error:
        # Nothing to follow in Temporal: a search it no longer holds is shown from its event log, as without --wait;
        # an id neither knows is bad input (cli.main says so).
        forgotten = await _forgotten(search_id) if not_found(error) else None
        if forgotten is None:
            raise
        return _show(*forgotten, True, as_json)
    return await follow(client, search_id, as_json)


BAR_CELLS = 10


def progress_bar(status: SearchStatus) -> str:
    """A bar of how much of the search is done: candidates judged of the budget's limit when it has one, else
    generations finished of those asked for; full once the search has ended."""
    if status.status not in ("running", "paused"):
        done = 1.0
    elif status.max_candidates:
        done = (status.candidates_done + status.harness_errors) / status.max_candidates
    else:
        done = status.generation / max(status.generations + 1, 1)  # generation 0 is the seed's
    cells = round(min(max(done, 0.0), 1.0) * BAR_CELLS)
    return "▕" + "█" * cells + "·" * (BAR_CELLS - cells) + "▏"


def progress_line(status: SearchStatus) -> str:
    """One line of progress: the generation running (of those asked for), candidates judged by verdict, and the
    incumbent's speedup with its interval -- plus, while a generation runs, its fastest candidate so far when
    that is ahead of the incumbent (promotion is decided when the generation ends)."""
    verdicts = " ".join(f"{k}={v}" for k, v in sorted(status.verdict_counts.items())) or "-"
    best = "-"
    if status.best_speedup is not None:
        best = f"{status.best_speedup:.3f}x"
        if status.best_ci_low is not None and status.best_ci_high is not None:
            best += f" [{status.best_ci_low:.3f}, {status.best_ci_high:.3f}]"
    doing = f"{status.step} · " if status.step and status.status in ("running", "paused") else ""
    if status.waiting and status.status in ("running", "paused"):
        doing += "waiting for a worker (see below) · "
    line = (
        f"[{status.status}] {progress_bar(status)} generation {status.generation}/{status.generations} · {doing}"
        f"{status.candidates_done} candidates · {verdicts} · "
        + (f"{status.harness_errors} not judged (harness_error) · " if status.harness_errors else "")
        + f"best {best} vs numpy"
        + (f" · {status.busy_timings} of {status.timings} timings on a busy machine" if status.busy_timings else "")
    )
    leading = status.leading_speedup
    if leading is not None and (status.best_speedup is None or leading > status.best_speedup):
        line += f" · fastest this generation {leading:.3f}x (promotion decided at its end)"
    return line


def final_status(last: SearchStatus, result: SearchResult) -> SearchStatus:
    """The progress a finished search ended at, from its result: the follower's last line then agrees with the
    result printed under it, even when the search's last promotion came between two polls."""
    inc = result.incumbent
    return last.model_copy(
        update={
            "status": result.status,
            "generation": max(result.generations_run - 1, 0),
            "candidates_done": result.candidates_done,
            "verdict_counts": dict(result.verdict_counts),
            "harness_errors": result.harness_errors,
            "timings": result.timings,
            "busy_timings": result.busy_timings,
            "best_speedup": result.best_speedup,
            "best_ci_low": result.best_ci_low,
            "best_ci_high": result.best_ci_high,
            "best_roofline_fraction": result.best_roofline_fraction,
            "incumbent": short_name(inc.label, inc.candidate_id) if inc else None,
            "incumbent_id": inc.candidate_id if inc else None,
            "leading_speedup": None,
            "leading": None,
            "step": "",
        }
    )


def _print_progress(line: str) -> None:
    """One progress line on stderr (stdout carries only the result): rewritten in place on a terminal."""
    if sys.stderr.isatty():
        print(f"\r\033[K{line}", end="", file=sys.stderr, flush=True)
    else:
        print(line, file=sys.stderr, flush=True)


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
    if result.harness_errors:
        lines.append(
            f"  not judged: {result.harness_errors} (harness_error: the harness or the infrastructure failed, not "
            "the kernel; see kf audit)"
        )
    if inc is not None and result.best_speedup is not None:
        lines.append(
            f"  incumbent: {short_name(inc.label, inc.candidate_id)} — {result.best_speedup:.3f}x vs numpy "
            f"[{result.best_ci_low:.3f}, {result.best_ci_high:.3f}]"
            + (
                f", {result.best_roofline_fraction:.1%} of the roofline"
                if result.best_roofline_fraction is not None
                else ""
            )
        )
    else:
        lines.append("  no correct candidate")
    if result.busy_timings:
        lines.append(
            f"  busy machine: {result.busy_timings} of {result.timings} timings ran while other work used their "
            "cores; such a reading promotes only after a re-measurement (kf audit marks each one)"
        )
    lines.append(f"  audit: kf audit {result.search_id}")
    lines.append(f"  UI: {ui_url(result.search_id)}")
    return "\n".join(lines)


def run_list(args: argparse.Namespace) -> int:
    if not 1 <= args.limit <= MAX_LISTED:
        raise UserError(f"--limit {args.limit}: list 1 to {MAX_LISTED} searches")

    async def go() -> list[dict[str, Any]]:
        from activities.search_client import LOG_LIST_TIMEOUT_S, held_by_temporal, list_searches, logged_searches
        from activities.temporal_client import INTERACTIVE_CONNECT_S, connect

        client = await connect(within_s=INTERACTIVE_CONNECT_S)
        rows = await list_searches(client, limit=args.limit)
        # Then the searches Temporal no longer holds (its retention passed) from the event log, best effort: the
        # list is Temporal's, and a log that does not answer only leaves them out, saying so.
        try:
            listed = {row["search_id"] for row in rows}
            logged = await asyncio.wait_for(
                logged_searches(database_url(), args.limit, listed), timeout=LOG_LIST_TIMEOUT_S
            )
        except Exception as error:  # not running, not configured, not answering: said, not fatal
            reason = " ".join(str(error).split())[:200] or type(error).__name__
            print(
                f"kf: the event log was not read ({reason}): searches Temporal no longer holds are not listed",
                file=sys.stderr,
            )
            logged = []
        # Older searches Temporal still holds lie beyond its first rows: only the ones it does not are the log's.
        held = await held_by_temporal(client, [row["search_id"] for row in logged])
        logged = [row for row in logged if row["search_id"] not in held]
        merged = sorted(rows + logged, key=lambda row: row["started"] or "", reverse=True)
        return merged[: args.limit]

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
            + ("  (event log only)" if row["from_log"] else "")
        )
    if any(row["from_log"] for row in rows):
        print("(event log only: Temporal no longer holds the search; `kf search show ID` and `kf audit ID` read it)")
    return 0


def run_show(args: argparse.Namespace) -> int:
    if args.wait:
        return _following([args.search_id], lambda: asyncio.run(_follow_existing(args.search_id, args.json)))

    async def go() -> tuple[SearchStatus, str | None, bool]:
        from activities.search_client import (
            CLOSED_WITHOUT_RESULT,
            search_status,
            status_from_log,
            why_it_ended,
        )
        from activities.temporal_client import INTERACTIVE_CONNECT_S, connect, no_worker, not_found

        client = await connect(within_s=INTERACTIVE_CONNECT_S)
        try:
            status = await search_status(client, args.search_id)
        except Exception as error:
            # A search that failed or was terminated keeps no progress in a result, and its workers may be long
            # gone: its event log tells it instead. A running search with no worker is still "no worker answers".
            # One Temporal no longer holds (its retention passed: a day on the dev server) is in the log too.
            if not_found(error):
                forgotten = await _forgotten(args.search_id)
                if forgotten is None:
                    raise
                return *forgotten, True
            if not no_worker(error):
                raise
            logged = await status_from_log(client, database_url(), args.search_id)
            if logged is None:
                raise
            status = logged
        ended = status.status in CLOSED_WITHOUT_RESULT  # said so by Temporal's description: no need to ask again
        return status, (await why_it_ended(client, args.search_id, status.status) if ended else None), False

    status, how, gone = asyncio.run(go())
    return _show(status, how, gone, args.json)


GONE = (
    "(from the event log: Temporal holds no search of that id -- its history passed the namespace's retention, or it "
    "ran on another Temporal server)"
)
NO_END = "has no end in its event log: it failed, was terminated, or runs on another Temporal server"


async def _forgotten(search_id: str) -> tuple[SearchStatus, str | None] | None:
    """A search Temporal does not hold, from its event log alone, with how it ended without a recorded end (NO_END:
    exit 1); None when the log does not hold it either."""
    from activities.search_client import status_from_log_alone

    alone = await status_from_log_alone(database_url(), search_id)
    if alone is None:
        return None
    return alone, NO_END if alone.status == "unknown" else None


def _show(status: SearchStatus, how: str | None, gone: bool, as_json: bool) -> int:
    """Print what `kf search show` says of ``status``; its exit status. ``how``: how a search ended without its
    result (exit 1); ``gone``: Temporal no longer holds the search (read from the event log alone)."""
    if as_json:
        print(status.model_dump_json())
    else:
        print(progress_line(status))
        if status.incumbent:
            print(f"incumbent: {status.incumbent}")
        for hint in status.hints:
            print(f"hint: {hint}")
        for note in status.waiting:
            print(f"waiting: {note}")
        if gone:
            print(GONE)
        elif status.from_log:
            print("(from the event log: no worker answers for this search)")
        if not gone:  # Temporal's UI has no page for it either
            print(f"UI: {ui_url(status.search_id)}")
    if how is not None:
        # A search that ended without its result: exit 1, as `--wait` does (cli/exit_status.py).
        if not as_json:
            print(f"kf: search {status.search_id} {how}", file=sys.stderr)
        return 1
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
        try:  # the workflow checks the merged budget again; out-of-range values need no server to refuse
            Budget.model_validate({k: v for k, v in arg.items() if v is not None})
        except ValidationError as error:
            labels = {"max_candidates": "--max-candidates", "max_wall_minutes": "--max-minutes"}
            labels["max_llm_usd"] = "--max-llm-usd"
            raise UserError(f"invalid budget: {explain(error, Budget, labels)}") from None

    async def go() -> SearchStatus:
        from activities.search_client import send_update
        from activities.temporal_client import INTERACTIVE_CONNECT_S, connect

        return await send_update(await connect(within_s=INTERACTIVE_CONNECT_S), args.search_id, args.update, arg)

    status = asyncio.run(go())
    print(status.model_dump_json() if args.json else progress_line(status))
    return 0


def run_audit(args: argparse.Namespace) -> int:
    from engine.search.audit import audit_log, audit_search, format_audit, format_log_audit

    if args.require_witness and (args.file is not None or args.all):
        raise UserError(
            "kf audit --require-witness checks one search's witness in Temporal; an export (--file) or the whole "
            "log (--all) has none to check: drop --require-witness, or audit a search id"
        )
    if args.file is not None:
        from cli.export import run_offline_audit

        return run_offline_audit(args)
    if args.all == (args.search_id is not None):
        raise UserError("kf audit takes a search id, or --all for the whole log (not both)")
    if args.all:
        report = asyncio.run(audit_log(database_url()))
        print(json.dumps(report) if args.json else format_log_audit(report))
        return 0 if report["intact"] else 1

    async def go() -> dict[str, Any]:
        witness = await _witness(args.search_id)
        return await audit_search(database_url(), args.search_id, witness)

    report = asyncio.run(go())
    print(json.dumps(report) if args.json else format_audit(report))
    if not report["intact"]:
        return 1
    if args.require_witness and report["witness"]["status"] != "intact":
        # A script that must know the stream was not cut short or rewritten cannot take the chain alone for it.
        reason = str(report["witness"]["reason"])
        if report["witness"]["transient"]:
            fix = "start Temporal (`kf up`) or point KF_TEMPORAL_ADDRESS at it, then audit again"
        else:  # gone for good (retention, another cluster, a kf that recorded no heads): asking again will not help
            fix = "no witness will come back for this search: only its chain can be audited (without --require-witness)"
        print(f"kf: error: the witness could not be checked ({reason}); {fix}", file=sys.stderr)
        return exit_status.MACHINE
    return 0


async def _witness(search_id: str) -> Any:
    """The search's witness from its Temporal history; unavailable (not an error) when Temporal is not
    configured or does not answer: the audit of the log itself still runs, and says what it could not check."""
    from activities.temporal_client import INTERACTIVE_CONNECT_S, connect
    from activities.witness import witness_of
    from engine.search.witness import Witness

    try:
        client = await connect(within_s=INTERACTIVE_CONNECT_S)
    except UserError as error:
        return Witness(
            search_id=search_id, available=False, reason=f"Temporal is not reachable: {error}", transient=True
        )
    return await witness_of(client, search_id)

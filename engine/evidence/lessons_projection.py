"""The lessons projection: folds search events into the lesson tables of migrations/0003_lessons.sql and
0004_lesson_settings.sql.

It reads the log after its checkpoint in pages; each page is folded and committed together with the
checkpoint (``store.projection("lessons")``), so a crash never applies an event twice or skips one, and
rebuilding from position 0 gives the same rows (the fold depends on nothing but the events, in order).

What it keeps, per (problem family, problem, target, change), where a change is a tag (``seed``,
``online-softmax``) or a parameter value (``UNROLL=8``) and ``*`` stands for every candidate:

- attempts / compiled and validated / correct: a compile or validation outcome counts once per candidate,
  target and problem definition. The same outcome reused by a later search, or a candidate compiled again
  because the artifact left a worker's cache, is the same fact and does not count twice.
- speedup over the parent: ln(ratio) of each benchmark against the parent, for the changes the candidate
  introduced relative to its parent (all its changes when the parent has no parameters, e.g. the seed).
  Every benchmark counts: each is a new measurement.
- speedup over the numpy baseline: ln(speedup) of each benchmark, for every change the candidate carries.
  lessons_for centres these per problem, which makes them comparable across a family.
- failure patterns: compile error categories, failing validation checks and shapes, benchmark verdicts.

Only a kernel's verdicts are folded. An outcome that is an infrastructure failure -- ``harness_error``, or a
``crash`` from a signal sent from outside (engine/outages.py; older logs hold such outcomes) -- is no fact about
the kernel: it counts nowhere and is never indexed for reuse, so a later outcome of the candidate is.

And per (problem family, problem, target, template setting), in ``lesson_settings``: the setting's
parameter values and ln(speedup over numpy) of each of its benchmarks with verdict ok. Per-change rows
only show marginal effects; these let the search proposer fit a model with interactions (values that pay
only together). Hand-written candidates (no parameters) have no setting row. A setting's readings are all
of one measurement method (engine/harness/verdicts.py): a reading by a newer method than the row's replaces
its samples, one by an older method is not folded into it (the changes' rows keep every reading). They are of
one machine too (engine/hardware.py machine_key): the last one that measured the setting; a reading from another
machine replaces the row's samples, one from an unknown machine (recorded before outcomes said) is not folded
into a known machine's row.

Samples are kept in the view, the most recent LESSON_SAMPLES per row, so medians are exact and a rebuild
is identical. The same fold also keeps ``candidate_evidence``: the first compile and validation outcome of
each candidate per target and problem definition, which engine/evidence/index.py serves for reuse.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from engine.errors import UserError
from engine.evidence.events import RecordedEvent
from engine.evidence.projections import ProjectionTransaction
from engine.evidence.store import EventStore
from engine.harness.verdicts import LEGACY_METHOD
from engine.outages import is_kernel_outcome

PROJECTION = "lessons"
"""The projection's name in projection_checkpoints."""

LESSON_SAMPLES = 256
"""Most recent samples kept per row and kind (speedup over parent, over numpy)."""

BUSY_READING_HALFWIDTH = 0.4
"""Least half-width, in ln, of a reading whose timing shared its cores with other work: its interval may
look tight while the whole reading sits on a load spike (a kernel that re-measures at 2.9x once read 4.18x
[3.40, 5.19]), so the model counts it as it counts a reading with about ±40%: far less than a quiet one."""

PAGE_SIZE = 500
"""Events folded per transaction while catching up."""

ALL = "*"
"""The change that stands for every candidate of a problem."""

_VIEW_TABLES = (
    "lesson_searches",
    "lesson_candidates",
    "lesson_stats",
    "lesson_failures",
    "candidate_evidence",
    "lesson_settings",
)

StatsKey = tuple[str, str, str, str]
FailureKey = tuple[str, str, str, str, str, str]
EvidenceKey = tuple[str, str, str]
SettingKey = tuple[str, str, str, str]


def change_of(name: str, value: Any) -> str:
    """The change a parameter value stands for, e.g. ``UNROLL=8``; the same spelling as template tags."""
    return f"{name}={value}"


def changes_of(candidate: dict[str, Any]) -> list[str]:
    """Every change a candidate (a Candidate dump) carries: its tags and its parameter values, sorted."""
    params = candidate.get("params") or {}
    tags = candidate.get("tags") or []
    return sorted({str(t) for t in tags} | {change_of(k, v) for k, v in params.items()})


async def catch_up_lessons(store: EventStore, page_size: int = PAGE_SIZE) -> int:
    """Fold every event after the checkpoint into the view, one committed page at a time; returns the
    checkpoint reached. Cheap when nothing is new: one read of an empty page."""
    while True:
        async with store.projection(PROJECTION) as tx:
            events = await tx.read(limit=page_size)
            if not events:
                return tx.checkpoint
            await apply_events(tx, events)
            position = tx.checkpoint
        if len(events) < page_size:
            return position


async def rebuild_lessons(store: EventStore, page_size: int = PAGE_SIZE) -> int:
    """Empty the view and fold the whole log again from position 0; returns the checkpoint reached.

    The emptying and the first page commit together, so readers never see a half-empty view that claims
    to be current."""
    async with store.projection(PROJECTION) as tx:
        await tx.connection.execute(f"TRUNCATE {', '.join(_VIEW_TABLES)}")
        tx.reset()
        events = await tx.read(limit=page_size)
        if events:
            await apply_events(tx, events)
    return await catch_up_lessons(store, page_size)


async def apply_events(tx: ProjectionTransaction, events: list[RecordedEvent]) -> None:
    """Fold ``events`` (the next ones after ``tx.checkpoint``, in position order) into the view through
    ``tx``'s connection and advance its checkpoint; nothing is committed until the transaction is."""
    fold = _Fold(tx.connection)
    await fold.prefetch_candidates(events)
    for event in events:
        await fold.apply(event)
        tx.advance(event.position)
    await fold.flush()


# -- the fold ------------------------------------------------------------------------------------------------


@dataclass
class _Search:
    problem: str
    family: str
    target: str
    fingerprint: str
    dirty: bool = False


@dataclass
class _Candidate:
    parent_id: str | None
    params: dict[str, Any]
    changes: list[str]
    introduced: list[str]


@dataclass
class _Stats:
    attempts: int = 0
    compiled: int = 0
    validated: int = 0
    correct: int = 0
    versus_parent: int = 0
    beats_parent: int = 0
    log_ratio_samples: list[float] = field(default_factory=list)
    log_speedup_samples: list[float] = field(default_factory=list)
    last_position: int = 0


@dataclass
class _Failure:
    count: int = 0
    example: str = ""
    last_position: int = 0


@dataclass
class _Setting:
    params: dict[str, Any]
    log_speedup_samples: list[float] = field(default_factory=list)
    last_position: int = 0
    log_halfwidth_samples: list[float] = field(default_factory=list)
    method: int = LEGACY_METHOD
    machine: str | None = None


@dataclass
class _Evidence:
    problem: str
    stream_id: str
    compile_verdict: str | None = None
    artifact_id: str | None = None
    compile_summary: str = ""
    compile_event_id: str | None = None
    compile_position: int | None = None
    validation_verdict: str | None = None
    validated_artifact_id: str | None = None
    validation_summary: str = ""
    validation_event_id: str | None = None
    validation_position: int | None = None


class _Fold:
    """One page's fold: rows are read once into memory, changed there, and written back by flush()."""

    def __init__(self, connection: asyncpg.Connection) -> None:
        self.connection = connection
        self.searches: dict[str, _Search | None] = {}
        self.candidates: dict[tuple[str, str], _Candidate | None] = {}
        """(stream, candidate id) -> the candidate as that search proposed it, None when it did not (yet)."""
        self.new_candidates: list[tuple[str, str, _Candidate, int]] = []
        self.stats: dict[StatsKey, _Stats] = {}
        self.failures: dict[FailureKey, _Failure] = {}
        self.loaded_problems: set[tuple[str, str, str]] = set()
        self.evidence: dict[EvidenceKey, _Evidence | None] = {}
        self.settings: dict[SettingKey, _Setting | None] = {}
        self.dirty_stats: set[StatsKey] = set()
        self.dirty_failures: set[FailureKey] = set()
        self.dirty_evidence: set[EvidenceKey] = set()
        self.dirty_settings: set[SettingKey] = set()

    async def apply(self, event: RecordedEvent) -> None:
        handler = _HANDLERS.get(event.type)
        if handler is not None and event.stream_id.startswith("search-"):
            await handler(self, event)

    # -- event handlers ----------------------------------------------------------------------------------

    async def on_started(self, event: RecordedEvent) -> None:
        if await self.search(event.stream_id) is not None:
            return
        payload = event.payload
        spec = payload.get("spec") or {}
        given = str(spec.get("problem", ""))
        if not given:
            return
        # Keyed by the problem's name, never the folder path a search was started with (older events carry
        # only the path: the problem is loaded to learn its name).
        problem = str(payload.get("problem_name") or _name_of(given))
        family = payload.get("family") or _family_of(given)
        self.searches[event.stream_id] = _Search(
            problem=problem,
            family=str(family),
            target=str(spec.get("target", "cpu")),
            fingerprint=str(payload.get("problem_fingerprint", "")),
            dirty=True,
        )

    async def on_target_resolved(self, event: RecordedEvent) -> None:
        search = await self.search(event.stream_id)
        target = event.payload.get("target")
        if search is not None and target:
            search.target = str(target)
            search.dirty = True

    async def on_proposed(self, event: RecordedEvent) -> None:
        raw = event.payload.get("candidate") or {}
        candidate_id = raw.get("candidate_id")
        if not candidate_id:
            return
        if await self.stream_candidate(event.stream_id, candidate_id) is not None:
            return
        changes = changes_of(raw)
        parent_id = raw.get("parent_id")
        parent = await self.candidate_anywhere(event.stream_id, parent_id) if parent_id else None
        introduced = changes if parent is None else sorted(set(changes) - set(parent.changes))
        candidate = _Candidate(parent_id, dict(raw.get("params") or {}), changes, introduced)
        self.candidates[(event.stream_id, candidate_id)] = candidate
        self.new_candidates.append((event.stream_id, candidate_id, candidate, event.position))

    async def on_compiled(self, event: RecordedEvent) -> None:
        where = await self.outcome_context(event)
        if where is None:
            return
        search, candidate_id, changes, evidence = where
        if evidence.compile_event_id is not None:
            return  # this candidate's compile outcome is already known here: not a new fact
        output = event.payload.get("output") or {}
        body = event.payload.get("evidence") or {}
        verdict = str(output.get("verdict", ""))
        if not _kernel_outcome(verdict, body):
            return
        evidence.compile_verdict = verdict
        evidence.artifact_id = output.get("artifact_id")
        evidence.compile_summary = str(output.get("summary", ""))
        evidence.compile_event_id = event.event_id
        evidence.compile_position = event.position
        self.dirty_evidence.add(self.evidence_key(search, candidate_id))
        await self.load_problem(search)
        for change in changes:
            stats = self.stats_row(search, change, event.position)
            stats.attempts += 1
            stats.compiled += verdict == "ok"
        if verdict != "ok":
            pattern = str(body.get("error_category") or verdict or "other")
            example = str(body.get("first_error") or output.get("summary") or "")
            self.failure(search, changes, "compile", pattern, example, event.position)

    async def on_validated(self, event: RecordedEvent) -> None:
        where = await self.outcome_context(event)
        if where is None:
            return
        search, candidate_id, changes, evidence = where
        if evidence.validation_event_id is not None:
            return
        output = event.payload.get("output") or {}
        body = event.payload.get("evidence") or {}
        verdict = str(output.get("verdict", ""))
        if not _kernel_outcome(verdict, body):
            return
        evidence.validation_verdict = verdict
        evidence.validated_artifact_id = output.get("artifact_id")
        evidence.validation_summary = str(output.get("summary", ""))
        evidence.validation_event_id = event.event_id
        evidence.validation_position = event.position
        self.dirty_evidence.add(self.evidence_key(search, candidate_id))
        await self.load_problem(search)
        for change in changes:
            stats = self.stats_row(search, change, event.position)
            stats.validated += 1
            stats.correct += verdict == "ok"
        if verdict != "ok":
            for pattern, example in _validation_patterns(verdict, body, str(output.get("summary", ""))):
                self.failure(search, changes, "validation", pattern, example, event.position)

    async def on_benchmarked(self, event: RecordedEvent) -> None:
        where = await self.outcome_context(event)
        if where is None:
            return
        search, candidate_id, changes, _ = where
        output = event.payload.get("output") or {}
        verdict = str(output.get("verdict", ""))
        if not _kernel_outcome(verdict, event.payload.get("evidence") or {}):
            return
        await self.load_problem(search)
        if verdict != "ok":
            body = event.payload.get("evidence") or {}
            self.failure(search, changes, "benchmark", verdict, _benchmark_message(body, output), event.position)
            return
        candidate = await self.fold_reading(event, search, candidate_id, changes, output)
        ratio = _positive(output.get("ratio"))
        if ratio is None or candidate is None or candidate.parent_id is None or not _timed_against_parent(event):
            return
        beats = (_positive(output.get("ratio_ci_low")) or 0.0) > 1.0
        for change in [*candidate.introduced, ALL]:
            stats = self.stats_row(search, change, event.position)
            stats.versus_parent += 1
            stats.beats_parent += beats
            stats.log_ratio_samples = _bounded(stats.log_ratio_samples, math.log(ratio))

    async def on_remeasured(self, event: RecordedEvent) -> None:
        """A re-measurement (of a shaky reading, or a promotion's confirmation) is another reading of the
        setting, never a verdict: an ok one joins the setting's and its changes' speedup samples, with its own
        width; one that did not come back ok teaches nothing here (the candidate's verdict stands)."""
        where = await self.outcome_context(event)
        if where is None:
            return
        search, candidate_id, changes, _ = where
        output = event.payload.get("output") or {}
        if str(output.get("verdict", "")) != "ok":
            return
        await self.load_problem(search)
        await self.fold_reading(event, search, candidate_id, changes, output)

    async def fold_reading(
        self, event: RecordedEvent, search: _Search, candidate_id: str, changes: list[str], output: dict[str, Any]
    ) -> _Candidate | None:
        """Fold one ok reading's speedup over the library into the changes' and the setting's samples (with
        the reading's width); the candidate, as its search knows it."""
        speedup = _positive(output.get("speedup"))
        candidate = await self.stream_candidate(event.stream_id, candidate_id)
        if speedup is None:
            return candidate
        for change in changes:
            stats = self.stats_row(search, change, event.position)
            stats.log_speedup_samples = _bounded(stats.log_speedup_samples, math.log(speedup))
        if candidate is not None and candidate.params:
            setting = await self.setting_row(search, candidate_id, candidate.params, event.position)
            method = _method_of(output)
            if method < setting.method:
                return candidate  # an older method's reading cannot be compared with the setting's
            if method > setting.method:
                # A newer method supersedes the readings taken the old way (the log keeps them).
                setting.log_speedup_samples, setting.log_halfwidth_samples, setting.method = [], [], method
            machine = _machine_of(output)
            if machine is None and setting.machine is not None:
                return candidate  # a reading from an unknown machine cannot be compared with a known one's
            if machine != setting.machine:
                # Another machine's reading supersedes the row's (the log keeps them): the row says what the
                # setting does on the machine that last measured it, and that is the only machine it settles for.
                setting.log_speedup_samples, setting.log_halfwidth_samples, setting.machine = [], [], machine
            setting.log_speedup_samples = _bounded(setting.log_speedup_samples, math.log(speedup))
            setting.log_halfwidth_samples = _bounded(
                setting.log_halfwidth_samples,
                reading_halfwidth(
                    output.get("speedup_ci_low"), output.get("speedup_ci_high"), bool(output.get("shared_cores"))
                ),
            )
        return candidate

    # -- rows ----------------------------------------------------------------------------------------------

    async def search(self, stream_id: str) -> _Search | None:
        if stream_id not in self.searches:
            row = await self.connection.fetchrow("SELECT * FROM lesson_searches WHERE stream_id = $1", stream_id)
            self.searches[stream_id] = (
                None
                if row is None
                else _Search(row["problem"], row["family"], row["target"], row["problem_fingerprint"])
            )
        return self.searches[stream_id]

    async def prefetch_candidates(self, events: list[RecordedEvent]) -> None:
        """Read the stored rows of the candidates ``events`` name (and their parents), in one query.

        Only those: reading every candidate of a search at each page made a catch-up cost grow with the
        search, and a long search catches up several times per candidate (bench/search_overhead.py)."""
        wanted = {
            (event.stream_id, candidate_id)
            for event in events
            if event.type in _HANDLERS and event.stream_id.startswith("search-")
            for candidate_id in _candidate_ids(event)
        } - self.candidates.keys()
        if not wanted:
            return
        streams, ids = zip(*sorted(wanted), strict=True)
        rows = await self.connection.fetch(
            "SELECT l.* FROM unnest($1::text[], $2::text[]) AS w (stream_id, candidate_id) "
            "JOIN lesson_candidates AS l USING (stream_id, candidate_id)",
            list(streams),
            list(ids),
        )
        found = {(row["stream_id"], row["candidate_id"]): _candidate_from_row(row) for row in rows}
        for key in wanted:
            self.candidates[key] = found.get(key)

    async def stream_candidate(self, stream_id: str, candidate_id: str) -> _Candidate | None:
        """The candidate as search ``stream_id`` proposed it (stored, or folded in this page), or None."""
        key = (stream_id, candidate_id)
        if key not in self.candidates:
            row = await self.connection.fetchrow(
                "SELECT * FROM lesson_candidates WHERE stream_id = $1 AND candidate_id = $2", stream_id, candidate_id
            )
            self.candidates[key] = None if row is None else _candidate_from_row(row)
        return self.candidates[key]

    async def candidate_anywhere(self, stream_id: str, candidate_id: str) -> _Candidate | None:
        """The candidate as its own search knows it, else as the first search that proposed it did (a
        resumed search's parent may come from the search it resumes)."""
        found = await self.stream_candidate(stream_id, candidate_id)
        if found is not None:
            return found
        # The earliest proposal wins, whether it is already stored or in this page: the same answer
        # whatever the page boundaries, so a rebuild matches.
        row = await self.connection.fetchrow(
            "SELECT * FROM lesson_candidates WHERE candidate_id = $1 ORDER BY position LIMIT 1", candidate_id
        )
        if row is not None:
            return _candidate_from_row(row)
        return next((c for _, cid, c, _ in self.new_candidates if cid == candidate_id), None)

    async def outcome_context(self, event: RecordedEvent) -> tuple[_Search, str, list[str], _Evidence] | None:
        """The search, candidate id, changes (with ``*``) and evidence row a step outcome belongs to."""
        search = await self.search(event.stream_id)
        candidate_id = event.payload.get("candidate_id")
        if search is None or not candidate_id:
            return None
        candidate = await self.stream_candidate(event.stream_id, candidate_id)
        changes = [*(candidate.changes if candidate else []), ALL]
        key = self.evidence_key(search, candidate_id)
        evidence = await self.evidence_row(key)
        if evidence is None:
            evidence = _Evidence(problem=search.problem, stream_id=event.stream_id)
            self.evidence[key] = evidence
        return search, candidate_id, changes, evidence

    @staticmethod
    def evidence_key(search: _Search, candidate_id: str) -> EvidenceKey:
        return (candidate_id, search.target, search.fingerprint)

    async def evidence_row(self, key: EvidenceKey) -> _Evidence | None:
        if key not in self.evidence:
            row = await self.connection.fetchrow(
                "SELECT * FROM candidate_evidence WHERE candidate_id = $1 AND target = $2 AND problem_fingerprint = $3",
                *key,
            )
            self.evidence[key] = (
                None if row is None else _Evidence(**{f: row[f] for f in _Evidence.__dataclass_fields__})
            )
        return self.evidence[key]

    async def load_problem(self, search: _Search) -> None:
        """Read a problem's stats and failure rows once per page, before the fold changes them."""
        triple = (search.family, search.problem, search.target)
        if triple in self.loaded_problems:
            return
        self.loaded_problems.add(triple)
        rows = await self.connection.fetch(
            "SELECT * FROM lesson_stats WHERE family = $1 AND problem = $2 AND target = $3", *triple
        )
        for row in rows:
            self.stats[(*triple, row["change"])] = _Stats(
                **{f: row[f] for f in _Stats.__dataclass_fields__ if not f.endswith("_samples")},
                log_ratio_samples=list(row["log_ratio_samples"]),
                log_speedup_samples=list(row["log_speedup_samples"]),
            )
        rows = await self.connection.fetch(
            "SELECT * FROM lesson_failures WHERE family = $1 AND problem = $2 AND target = $3", *triple
        )
        for row in rows:
            key = (*triple, row["change"], row["kind"], row["pattern"])
            self.failures[key] = _Failure(row["count"], row["example"], row["last_position"])

    async def setting_row(self, search: _Search, candidate_id: str, params: dict[str, Any], position: int) -> _Setting:
        """The setting's row (read once per page), marked to be written back."""
        key = (search.family, search.problem, search.target, candidate_id)
        if key not in self.settings:
            row = await self.connection.fetchrow(
                "SELECT params, log_speedup_samples, last_position, log_halfwidth_samples, method, machine "
                "FROM lesson_settings "
                "WHERE family = $1 AND problem = $2 AND target = $3 AND candidate_id = $4",
                *key,
            )
            self.settings[key] = (
                None
                if row is None
                else _Setting(
                    params_of(row["params"]),
                    list(row["log_speedup_samples"]),
                    row["last_position"],
                    list(row["log_halfwidth_samples"]),
                    row["method"],
                    row["machine"],
                )
            )
        setting = self.settings[key]
        if setting is None:
            # The params of the first benchmark's search: a candidate id is a content hash, so every
            # search that proposed it derived it from the same setting.
            setting = self.settings[key] = _Setting(dict(params))
        setting.last_position = position
        self.dirty_settings.add(key)
        return setting

    def stats_row(self, search: _Search, change: str, position: int) -> _Stats:
        key = (search.family, search.problem, search.target, change)
        stats = self.stats.setdefault(key, _Stats())
        stats.last_position = position
        self.dirty_stats.add(key)
        return stats

    def failure(
        self, search: _Search, changes: list[str], kind: str, pattern: str, example: str, position: int
    ) -> None:
        for change in changes:
            key = (search.family, search.problem, search.target, change, kind, pattern[:200])
            failure = self.failures.setdefault(key, _Failure())
            failure.count += 1
            failure.example = example[:300]
            failure.last_position = position
            self.dirty_failures.add(key)

    # -- writing -------------------------------------------------------------------------------------------

    async def flush(self) -> None:
        searches = [(sid, s) for sid, s in self.searches.items() if s is not None and s.dirty]
        if searches:
            await self.connection.executemany(
                "INSERT INTO lesson_searches (stream_id, problem, family, target, problem_fingerprint) "
                "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (stream_id) DO UPDATE SET target = EXCLUDED.target",
                [(sid, s.problem, s.family, s.target, s.fingerprint) for sid, s in searches],
            )
        if self.new_candidates:
            await self.connection.executemany(
                "INSERT INTO lesson_candidates (stream_id, candidate_id, parent_id, params, changes, introduced, "
                "position) VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7)",
                [
                    (sid, cid, c.parent_id, json.dumps(c.params, sort_keys=True), c.changes, c.introduced, position)
                    for sid, cid, c, position in self.new_candidates
                ],
            )
        if self.dirty_stats:
            await self.connection.executemany(
                """
                INSERT INTO lesson_stats (family, problem, target, change, attempts, compiled, validated, correct,
                    versus_parent, beats_parent, log_ratio_samples, log_speedup_samples, last_position)
                VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
                ON CONFLICT (family, problem, target, change) DO UPDATE SET
                    attempts = EXCLUDED.attempts, compiled = EXCLUDED.compiled,
                    validated = EXCLUDED.validated, correct = EXCLUDED.correct,
                    versus_parent = EXCLUDED.versus_parent, beats_parent = EXCLUDED.beats_parent,
                    log_ratio_samples = EXCLUDED.log_ratio_samples,
                    log_speedup_samples = EXCLUDED.log_speedup_samples,
                    last_position = EXCLUDED.last_position
                """,
                [
                    (
                        *key,
                        s.attempts,
                        s.compiled,
                        s.validated,
                        s.correct,
                        s.versus_parent,
                        s.beats_parent,
                        s.log_ratio_samples,
                        s.log_speedup_samples,
                        s.last_position,
                    )
                    for key in sorted(self.dirty_stats)
                    for s in [self.stats[key]]
                ],
            )
        if self.dirty_failures:
            await self.connection.executemany(
                """
                INSERT INTO lesson_failures (family, problem, target, change, kind, pattern, count, example,
                    last_position)
                VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                ON CONFLICT (family, problem, target, change, kind, pattern) DO UPDATE SET
                    count = EXCLUDED.count, example = EXCLUDED.example, last_position = EXCLUDED.last_position
                """,
                [
                    (*key, f.count, f.example, f.last_position)
                    for key in sorted(self.dirty_failures)
                    for f in [self.failures[key]]
                ],
            )
        if self.dirty_settings:
            await self.connection.executemany(
                """
                INSERT INTO lesson_settings (family, problem, target, candidate_id, params, log_speedup_samples,
                    last_position, log_halfwidth_samples, method, machine)
                VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, $8, $9, $10)
                ON CONFLICT (family, problem, target, candidate_id) DO UPDATE SET
                    log_speedup_samples = EXCLUDED.log_speedup_samples, last_position = EXCLUDED.last_position,
                    log_halfwidth_samples = EXCLUDED.log_halfwidth_samples, method = EXCLUDED.method,
                    machine = EXCLUDED.machine
                """,
                [
                    (
                        *key,
                        json.dumps(s.params, sort_keys=True),
                        s.log_speedup_samples,
                        s.last_position,
                        s.log_halfwidth_samples,
                        s.method,
                        s.machine,
                    )
                    for key in sorted(self.dirty_settings)
                    for s in [self.settings[key]]
                    if s is not None
                ],
            )
        if self.dirty_evidence:
            columns = ["candidate_id", "target", "problem_fingerprint", *_Evidence.__dataclass_fields__]
            values = ", ".join(f"${i}" for i in range(1, len(columns) + 1))
            updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns[3:])
            await self.connection.executemany(
                f"INSERT INTO candidate_evidence ({', '.join(columns)}) VALUES ({values}) "
                f"ON CONFLICT (candidate_id, target, problem_fingerprint) DO UPDATE SET {updates}",
                [
                    (*key, *(getattr(e, f) for f in _Evidence.__dataclass_fields__))
                    for key in sorted(self.dirty_evidence)
                    for e in [self.evidence[key]]
                    if e is not None
                ],
            )


_HANDLERS = {
    "search.started": _Fold.on_started,
    "search.target_resolved": _Fold.on_target_resolved,
    "candidate.proposed": _Fold.on_proposed,
    "candidate.compiled": _Fold.on_compiled,
    "candidate.validated": _Fold.on_validated,
    "candidate.benchmarked": _Fold.on_benchmarked,
    "candidate.remeasured": _Fold.on_remeasured,
}


# -- small pure pieces ------------------------------------------------------------------------------------------


def _candidate_ids(event: RecordedEvent) -> list[str]:
    """The candidates an event's fold looks up: a proposal's candidate and its parent, an outcome's candidate."""
    payload = event.payload
    if event.type == "candidate.proposed":
        raw = payload.get("candidate") or {}
        return [str(i) for i in (raw.get("candidate_id"), raw.get("parent_id")) if i]
    candidate_id = payload.get("candidate_id")
    return [str(candidate_id)] if candidate_id else []


def _candidate_from_row(row: asyncpg.Record) -> _Candidate:
    return _Candidate(
        parent_id=row["parent_id"],
        params=params_of(row["params"]),
        changes=list(row["changes"]),
        introduced=list(row["introduced"]),
    )


def params_of(value: Any) -> dict[str, Any]:
    """A jsonb params column as a dict (asyncpg returns jsonb as text without a codec)."""
    return dict(json.loads(value) if isinstance(value, str) else value)


def _name_of(problem: str) -> str:
    """The NAME of the problem a search.started event names by name or folder; for events written before
    search.started carried problem_name."""
    from engine.problems import load_problem

    try:
        return load_problem(problem).name
    except UserError:
        return problem.rstrip("/").rsplit("/", 1)[-1] or problem


def _family_of(problem: str) -> str:
    """The family a problem declares; for events written before search.started carried it."""
    # Imported here: the projection needs the problem loader only for such old events.
    from engine.problems import load_problem

    try:
        return load_problem(problem).family
    except UserError:
        return problem


def _kernel_outcome(verdict: str, body: dict[str, Any]) -> bool:
    """True when a step outcome is the kernel's verdict (see engine/outages.py), judged from its evidence."""
    signal = body.get("signal")
    return is_kernel_outcome(verdict, signal if isinstance(signal, int) and not isinstance(signal, bool) else None)


def _method_of(output: dict[str, Any]) -> int:
    """The measurement method of a recorded reading (engine/harness/verdicts.py); LEGACY_METHOD for an outcome
    recorded before outcomes said, or one whose field is not a whole number."""
    method = output.get("method")
    return method if isinstance(method, int) and not isinstance(method, bool) and method > 0 else LEGACY_METHOD


def _machine_of(output: dict[str, Any]) -> str | None:
    """The machine key of a recorded reading (engine/hardware.py machine_key); None for an outcome recorded
    before outcomes said, or one whose field is not a string."""
    machine = output.get("machine")
    return machine if isinstance(machine, str) and machine else None


def _positive(value: Any) -> float | None:
    """A finite positive number, or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) and number > 0 else None


def reading_halfwidth(ci_low: Any, ci_high: Any, shared_cores: bool) -> float:
    """How wide one benchmark's reading of a speedup over numpy was: the half-width in ln of its interval
    [ci_low, ci_high], at least BUSY_READING_HALFWIDTH when its timing shared its cores with other work (the
    machine was busy), NaN when neither says anything."""
    low, high = _positive(ci_low), _positive(ci_high)
    width = (math.log(high) - math.log(low)) / 2.0 if low is not None and high is not None and high >= low else math.nan
    if shared_cores:
        return BUSY_READING_HALFWIDTH if math.isnan(width) else max(width, BUSY_READING_HALFWIDTH)
    return width


def _bounded(samples: list[float], sample: float) -> list[float]:
    """The samples with one more, keeping the most recent LESSON_SAMPLES."""
    return [*samples, sample][-LESSON_SAMPLES:]


def _timed_against_parent(event: RecordedEvent) -> bool:
    """True when the benchmark's ratio is over an incumbent (its parent), not over numpy: the harness
    reports the incumbent first and numpy last. Evidence of another shape is trusted to be so."""
    reports = (event.payload.get("evidence") or {}).get("reports")
    if not isinstance(reports, list):
        return True
    return len(reports) >= 2


def _shape_text(shape: Any) -> str:
    if not isinstance(shape, dict) or not shape:
        return "?"
    return " ".join(f"{k}={shape[k]}" for k in sorted(shape))


def _validation_patterns(verdict: str, body: dict[str, Any], summary: str) -> list[tuple[str, str]]:
    """Distinct (pattern, example) pairs of a failed validation: the check that failed at which shape."""
    cases = body.get("cases")
    found: dict[str, str] = {}
    if isinstance(cases, list):
        for case in cases[:8]:
            if not isinstance(case, dict):
                continue
            pattern = f"{verdict}: {case.get('check', '?')} at {_shape_text(case.get('shape'))}"
            found.setdefault(pattern, str(case.get("message", "")))
    if not found:
        found[verdict] = str(body.get("message") or summary)
    return list(found.items())[:3]


def _benchmark_message(body: dict[str, Any], output: dict[str, Any]) -> str:
    reports = body.get("reports")
    if isinstance(reports, list):
        for report in reports:
            if isinstance(report, dict) and report.get("verdict") != "ok" and report.get("message"):
                return str(report["message"])
    return str(output.get("summary", ""))

"""A recorded landscape: every setting of a problem's template space measured on one target, kept in the
event log, so proposers can be compared by replaying searches against it instead of measuring again.

One stream per problem and target, ``landscape-<problem>-<target>``, holds every recording of it. A
recording is keyed by the problem's fingerprint (its folder's files: a changed template or space is a new
landscape) and by which settings it covers (all of them, or a seeded sample of ``max_settings``); each
measured setting is one ``landscape.measured`` event, and a ``landscape.recorded`` event closes the
recording. A recording that stopped half-way is resumed: its settings already measured are kept.

A setting's verdict is the first of compile, validate and benchmark that was not ok; an ok setting carries
its benchmark samples (speedup over numpy with its interval), of which a replayed evaluation draws one.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from engine.evidence.events import EventPayload, NewEvent, decode, event_type, to_new_event
from engine.evidence.store import EventStore
from engine.harness.verdicts import LEGACY_METHOD

SEED_KEY = "seed"
"""The key of the problem's seed kernel among a landscape's settings (it has no parameters)."""


def stream_of(problem: str, target: str) -> str:
    """The stream that holds every recording of ``problem``'s landscape on ``target``."""
    return f"landscape-{problem}-{target}"


def setting_key(params: dict[str, Any] | None) -> str:
    """A setting's stable key, e.g. ``ACC=4 FUSED=0 NT=1``; SEED_KEY for the seed kernel (no parameters)."""
    if not params:
        return SEED_KEY
    return " ".join(f"{k}={params[k]}" for k in sorted(params))


def recording_id(
    fingerprint: str, space_size: int, max_settings: int | None, sample_seed: int, method: int, take: int
) -> str:
    """The id of one recording: which problem definition, which settings of its space, which measurement
    method (so a take the judge's older code left half-way is never resumed by newer code), which take."""
    scope = "all" if max_settings is None or max_settings >= space_size else f"sample{max_settings}s{sample_seed}"
    return f"{fingerprint[:16]}-{scope}-m{method}-t{take}"


class LandscapeSample(BaseModel):
    """One benchmark of a setting against numpy."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    speedup: float
    """numpy's time over the setting's (weighted geometric mean over the benchmark shapes)."""
    ci_low: float
    """Lower end of its interval at the benchmark's confidence."""
    ci_high: float
    """Upper end of that interval."""
    busy: bool = False
    """Its benchmark shared its cores with other work, this project's or another's (BenchmarkReport.shared_cores),
    after the recording's tries to time it on a quiet machine: kept, and left out of the setting's value and draws
    where the setting has quiet samples. False in samples recorded before the field existed."""


@event_type("landscape.measured")
class LandscapeMeasured(EventPayload):
    """One setting of a landscape, measured."""

    recording: str
    """The recording it belongs to (see recording_id)."""
    problem: str
    """The problem's name."""
    target: str
    """The resolved target it was measured on, e.g. ``cpu-x86_64-avx512``."""
    fingerprint: str
    """The problem definition's fingerprint (Problem.fingerprint)."""
    key: str
    """setting_key of its parameters (SEED_KEY for the seed kernel)."""
    params: dict[str, Any]
    """Its template parameter values; empty for the seed kernel."""
    candidate_id: str
    """The id a search gives the candidate it renders to (content hash of source and default flags)."""
    verdict: str
    """ok, or the first step's verdict that was not (compile_error, incorrect, crash, timeout, …)."""
    failed_step: str | None = None
    """compile, validate or benchmark for a failed setting; None when ok."""
    message: str = ""
    """Why it failed, one line; empty when ok."""
    samples: list[LandscapeSample] = Field(default_factory=list)
    """Its benchmarks against numpy (ok settings only)."""
    budget_s: float = 0.0
    """Timing budget each sample had."""
    batch: int = 1
    """Settings timed together in one interleaved benchmark (see engine/replay/recording.py)."""


@event_type("landscape.recorded")
class LandscapeRecorded(EventPayload):
    """A recording is complete: every setting it covers was measured."""

    recording: str
    """The recording."""
    problem: str
    """The problem's name."""
    target: str
    """The resolved target."""
    fingerprint: str
    """The problem definition's fingerprint."""
    space_size: int
    """Settings the template allows."""
    settings: int
    """Settings the recording covers (the whole space, or a seeded sample of it), the seed kernel apart."""
    max_settings: int | None
    """The cap asked for; None: the whole space."""
    sample_seed: int
    """Seed of the sample (when capped)."""
    repeats: int
    """Benchmarks per ok setting."""
    budget_s: float
    """Timing budget of each benchmark."""
    seconds: float
    """Wall-clock seconds the recording took (this take's measuring only, when resumed)."""
    method: int = LEGACY_METHOD
    """The judge's measurement method when it was recorded (engine/harness/verdicts.py); LEGACY_METHOD for a
    recording closed before recordings said. A recording of another method than today's judge is stale."""


def measured_event(payload: LandscapeMeasured) -> NewEvent:
    """The event recording one measured setting; its id makes a resumed recording skip it."""
    event_id = f"landscape/{payload.problem}/{payload.target}/{payload.recording}/{payload.key}"
    return to_new_event(event_id, payload)


def recorded_event(payload: LandscapeRecorded) -> NewEvent:
    """The event closing a recording."""
    return to_new_event(f"landscape/{payload.problem}/{payload.target}/{payload.recording}/recorded", payload)


@dataclass(frozen=True)
class Outcome:
    """What evaluating one setting gives, as replayed: a verdict and, when ok, one benchmark."""

    verdict: str
    speedup: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    failed_step: str | None = None
    message: str = ""


@dataclass(frozen=True)
class Setting:
    """One setting of a landscape with everything recorded of it."""

    key: str
    params: dict[str, Any]
    candidate_id: str
    verdict: str
    samples: tuple[LandscapeSample, ...]
    failed_step: str | None = None
    message: str = ""

    @property
    def ok(self) -> bool:
        """True when it compiled, was correct and was timed."""
        return self.verdict == "ok" and bool(self.samples)

    @property
    def value(self) -> float | None:
        """Its speed on the landscape: the geometric mean of its samples' speedups; None when it failed."""
        if not self.ok:
            return None
        return math.exp(math.fsum(math.log(s.speedup) for s in self.samples) / len(self.samples))

    @property
    def reading_range(self) -> float | None:
        """How far its readings disagree: its fastest sample's speedup over its slowest (1.0: they agree); None
        when it failed or was read once."""
        if not self.ok or len(self.samples) < 2:
            return None
        speedups = [s.speedup for s in self.samples]
        return max(speedups) / min(speedups)

    def draw(self, rng: np.random.Generator) -> Outcome:
        """One evaluation as a search would see it: a failed setting's verdict, or one of its samples."""
        if not self.ok:
            return Outcome(self.verdict, failed_step=self.failed_step, message=self.message)
        sample = self.samples[int(rng.integers(len(self.samples)))]
        return Outcome("ok", sample.speedup, sample.ci_low, sample.ci_high)


@dataclass(frozen=True)
class Landscape:
    """A problem's recorded landscape on one target."""

    problem: str
    target: str
    fingerprint: str
    recording: str
    space_size: int
    """Settings the template allows (the recording may cover a sample of them)."""
    settings: tuple[Setting, ...]
    """The recorded settings of the template space (the seed kernel apart), sorted by key."""
    seed: Setting | None
    """The problem's seed kernel, the incumbent a search starts from; None when not recorded."""
    repeats: int = 0
    budget_s: float = 0.0

    @property
    def by_candidate(self) -> dict[str, Setting]:
        """The settings by candidate id (the seed included)."""
        found = {s.candidate_id: s for s in self.settings}
        if self.seed is not None:
            found[self.seed.candidate_id] = self.seed
        return found

    @property
    def optimum(self) -> float:
        """The fastest setting's value (at least the seed's)."""
        return max([self.floor, *(v for s in self.settings if (v := s.value) is not None)])

    @property
    def floor(self) -> float:
        """What a search has before it evaluates anything: the seed kernel's value (0 when not recorded)."""
        return (self.seed.value or 0.0) if self.seed is not None else 0.0

    def values(self) -> list[float | None]:
        """Every recorded setting's value, in the order of ``settings`` (None: it failed)."""
        return [s.value for s in self.settings]


def landscape_from_events(payloads: Sequence[LandscapeMeasured], closing: LandscapeRecorded) -> Landscape:
    """The landscape a complete recording's events describe."""
    mine = {p.key: p for p in payloads if p.recording == closing.recording}

    def setting(p: LandscapeMeasured) -> Setting:
        # A busy machine's samples stand in only for a setting that has no quiet one.
        quiet = tuple(s for s in p.samples if not s.busy)
        samples = quiet or tuple(p.samples)
        return Setting(p.key, dict(p.params), p.candidate_id, p.verdict, samples, p.failed_step, p.message)

    seed = mine.pop(SEED_KEY, None)
    return Landscape(
        problem=closing.problem,
        target=closing.target,
        fingerprint=closing.fingerprint,
        recording=closing.recording,
        space_size=closing.space_size,
        settings=tuple(setting(mine[k]) for k in sorted(mine)),
        seed=setting(seed) if seed is not None else None,
        repeats=closing.repeats,
        budget_s=closing.budget_s,
    )


@dataclass(frozen=True)
class StoredRecordings:
    """What a landscape stream holds: every measured setting and every closing event, in log order."""

    measured: list[LandscapeMeasured]
    recorded: list[LandscapeRecorded]

    def latest(self, fingerprint: str | None = None, at_least: int = 0, method: int | None = None) -> Landscape | None:
        """The newest complete recording (of ``fingerprint`` and measurement ``method`` when given) that covers
        at least ``at_least`` settings (or the whole space), or None."""
        for closing in reversed(self.recorded):
            if fingerprint is not None and closing.fingerprint != fingerprint:
                continue
            if method is not None and closing.method != method:
                continue
            if closing.settings >= min(at_least, closing.space_size):
                return landscape_from_events(self.measured, closing)
        return None

    def measured_in(self, recording: str) -> dict[str, LandscapeMeasured]:
        """The settings already measured in ``recording``, by key."""
        return {p.key: p for p in self.measured if p.recording == recording}

    def takes(self, fingerprint: str) -> int:
        """How many recordings of ``fingerprint`` were completed."""
        return sum(1 for r in self.recorded if r.fingerprint == fingerprint)


async def stored_recordings(store: EventStore, problem: str, target: str) -> StoredRecordings:
    """Every recording of ``problem`` on ``target`` in the log."""
    measured: list[LandscapeMeasured] = []
    recorded: list[LandscapeRecorded] = []
    for event in await store.read_stream(stream_of(problem, target)):
        payload = decode(event)
        if isinstance(payload, LandscapeMeasured):
            measured.append(payload)
        elif isinstance(payload, LandscapeRecorded):
            recorded.append(payload)
    return StoredRecordings(measured, recorded)


def sample_of(keys: Sequence[str], max_settings: int | None, seed: int) -> list[str]:
    """The settings a capped recording covers: a seeded uniform sample of ``max_settings`` keys (all of them
    when uncapped or the space is small enough), in sorted order. Stable: the same keys and seed give the
    same sample on any machine."""
    ordered = sorted(keys)
    if max_settings is None or max_settings >= len(ordered):
        return ordered
    # Rank by a hash of (seed, key): independent of the order the space is enumerated in.
    ranked = sorted(ordered, key=lambda k: hashlib.sha256(f"{seed}/{k}".encode()).hexdigest())
    return sorted(ranked[:max_settings])

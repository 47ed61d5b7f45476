"""Search schedules: how often a scheduled search runs, and the spec each run starts with.

A schedule is a Temporal Schedule whose action starts a KernelSearch (activities/schedule_client.py, `kf schedule`):
continuous re-optimisation after a compiler, driver or machine change. Every run is a search of its own with
the same spec, which asks for ``resume_latest``: the run starts from the newest incumbent any earlier search of
the problem on the target recorded (the previous run's, as a rule), re-times it as generation 0 and skips what
that search evaluated. Lessons of every earlier search and their recorded compile and validation outcomes apply
to every search anyway (engine/evidence/lessons.py, engine/evidence/index.py).

What needs no Temporal lives here: the interval's text form and the scheduled spec.
"""

from __future__ import annotations

import re
from datetime import timedelta

from engine.search.spec import SearchSpec

MIN_INTERVAL = timedelta(minutes=1)
"""Shortest interval: a search takes longer than that, and a run still going when the next is due skips it."""
MAX_INTERVAL = timedelta(days=366)
"""Longest interval: a year (and a day)."""
INTERVAL_FORM = "whole numbers with units d, h, m, s, largest first (30m, 24h, 1h30m, 7d), from 1m to 366d"
"""What an interval may look like, as error messages and `--help` say it."""

_UNITS = {"d": 86_400, "h": 3_600, "m": 60, "s": 1}
_INTERVAL = re.compile(r"(?:(\d{1,6})d)?(?:(\d{1,6})h)?(?:(\d{1,6})m)?(?:(\d{1,6})s)?")


def parse_interval(text: str) -> timedelta:
    """The interval ``text`` names (`24h`, `1h30m`, `7d`); ValueError saying the allowed form otherwise."""
    match = _INTERVAL.fullmatch(text.strip().lower())
    if not text.strip() or match is None:
        raise ValueError(f"{text[:40]!r} is not an interval; give {INTERVAL_FORM}")
    seconds = sum(int(amount) * size for amount, size in zip(match.groups(), _UNITS.values(), strict=True) if amount)
    every = timedelta(seconds=seconds)
    if every < MIN_INTERVAL:
        raise ValueError(f"{text[:40]!r} is shorter than {interval_text(MIN_INTERVAL)}; give {INTERVAL_FORM}")
    if every > MAX_INTERVAL:
        raise ValueError(f"{text[:40]!r} is longer than {interval_text(MAX_INTERVAL)}; give {INTERVAL_FORM}")
    return every


def interval_text(every: timedelta) -> str:
    """An interval in the form `parse_interval` reads: `1d`, `1h30m`, `0s`."""
    seconds = int(every.total_seconds())
    parts = []
    for unit, size in _UNITS.items():
        amount, seconds = divmod(seconds, size)
        if amount:
            parts.append(f"{amount}{unit}")
    return "".join(parts) or "0s"


def scheduled_spec(spec: SearchSpec, *, warm: bool = True) -> SearchSpec:
    """The spec every run of a schedule starts with: ``spec``, warm-started from the newest incumbent unless
    ``warm`` is false (then every run starts from the seed kernel; lessons and recorded evidence still apply).
    ValueError when ``spec`` names a `resume_from` search: every run would start from that same one."""
    if spec.resume_from is not None:
        raise ValueError(
            f"resume_from {spec.resume_from!r} would start every run from that one search; a scheduled search "
            "starts from the newest incumbent (drop resume_from), or from the seed kernel with --cold"
        )
    return spec.model_copy(update={"resume_latest": warm})

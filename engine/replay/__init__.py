"""Replaying searches against recorded landscapes, to compare proposers without compiling or measuring.

- landscape: a problem's template space measured on one target, kept as events in the log;
- recording: measuring a landscape (compile, validate, time against numpy) and appending it;
- simulation: a search replayed against a landscape, with the lessons it would have seen;
- scoring: the Kernel Tuner-style score between random search (0) and the optimum (1);
- kernel_tuner_cache: a landscape as a Kernel Tuner cache file, for its strategies' simulation mode.

bench/search_quality.py puts them together.
"""

from engine.replay.landscape import Landscape, Setting, stored_recordings
from engine.replay.recording import RecordingPlan, record_landscape
from engine.replay.scoring import median_evals_to, random_expected_best, score
from engine.replay.simulation import replay_search

__all__ = [
    "Landscape",
    "RecordingPlan",
    "Setting",
    "median_evals_to",
    "random_expected_best",
    "record_landscape",
    "replay_search",
    "score",
    "stored_recordings",
]

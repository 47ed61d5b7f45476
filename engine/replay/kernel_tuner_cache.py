"""A landscape as a Kernel Tuner cache file, so Kernel Tuner's own search strategies can be run on it in
its simulation mode (``tune_kernel(..., cache=path, simulation_mode=True)``) as the peer to our proposers.

Kernel Tuner's cache is one JSON object: the device and kernel names, the problem size, the tunable
parameters (``tune_params_keys`` fixes their order) and ``cache``, one entry per configuration keyed by its
values joined with commas in that order, holding the values, the objective and the step times. A failed
configuration holds the name of its failure (``CompilationFailedConfig``, ``RuntimeFailedConfig``) in place
of the objective's value; Kernel Tuner counts its evaluation and never picks it as best.

The objective is ``time``: the setting's time relative to numpy's, 1 / speedup (lower is better). One
export is one possible world: each setting's time is one of its recorded samples, drawn by ``rng`` (or the
landscape value when no ``rng`` is given), so a strategy sees the same measurement noise a replayed proposer
does. Step times are zero: budgets are counted in evaluations, not seconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from engine.replay.landscape import Landscape, Setting

OBJECTIVE = "time"
"""The objective every entry carries: time relative to numpy's (1 / speedup)."""

_FAILED = {"compile": "CompilationFailedConfig"}
"""Kernel Tuner's name of a failure at each step; every other failed step is a runtime failure."""


def parameter_space(landscape: Landscape) -> dict[str, list[Any]]:
    """Every value each parameter takes among the recorded settings, names sorted (Kernel Tuner's order)."""
    values: dict[str, list[Any]] = {}
    for setting in landscape.settings:
        for name, value in setting.params.items():
            known = values.setdefault(name, [])
            if value not in known:
                known.append(value)
    return {name: sorted(values[name], key=_order) for name in sorted(values)}


def _order(value: Any) -> tuple[int, Any]:
    return (0, value) if isinstance(value, int | float) else (1, str(value))


def cache_key(params: dict[str, Any]) -> str:
    """Kernel Tuner's key of a configuration: its values in sorted name order, joined by commas."""
    return ",".join(str(params[name]) for name in sorted(params))


def _entry(setting: Setting, rng: np.random.Generator | None) -> dict[str, Any]:
    entry: dict[str, Any] = {name: setting.params[name] for name in sorted(setting.params)}
    if setting.ok:
        if rng is None:
            speedup = setting.value
        else:
            speedup = setting.samples[int(rng.integers(len(setting.samples)))].speedup
        assert speedup is not None
        entry[OBJECTIVE] = 1.0 / speedup
        entry["times"] = [1.0 / s.speedup for s in setting.samples]
    else:
        entry[OBJECTIVE] = _FAILED.get(setting.failed_step or "", "RuntimeFailedConfig")
    entry |= {"compile_time": 0.0, "verification_time": 0.0, "benchmark_time": 0.0}
    return entry


def cache_document(landscape: Landscape, rng: np.random.Generator | None = None) -> dict[str, Any]:
    """The Kernel Tuner cache of ``landscape`` as a JSON-compatible object."""
    space = parameter_space(landscape)
    return {
        "device_name": landscape.target,
        "kernel_name": landscape.problem,
        "problem_size": [1],
        "tune_params_keys": list(space),
        "tune_params": space,
        "objective": OBJECTIVE,
        "cache": {cache_key(s.params): _entry(s, rng) for s in landscape.settings},
    }


def write_cache(landscape: Landscape, path: Path, rng: np.random.Generator | None = None) -> Path:
    """Write the cache of ``landscape`` to ``path`` (see cache_document); returns ``path``."""
    path.write_text(json.dumps(cache_document(landscape, rng), indent=0))
    return path

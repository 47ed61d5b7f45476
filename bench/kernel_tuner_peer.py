"""Kernel Tuner's search strategies as the peer of our proposers: each runs in Kernel Tuner's simulation
mode on a cache file exported from a recorded landscape (engine/replay/kernel_tuner_cache.py), and its
evaluation order comes back as the landscape values bench/search_quality.py scores.

Benchmarks are scripts, so bench/search_quality.py (and tests/test_search_quality.py) import this module
by its file name.
"""

from __future__ import annotations

import contextlib
import io
import random
import signal
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine.replay.kernel_tuner_cache import cache_key, parameter_space, write_cache
from engine.replay.landscape import Landscape

STRATEGIES = ("random_sample", "genetic_algorithm", "simulated_annealing", "greedy_ils", "bayes_opt")
"""Kernel Tuner strategies run by default: its random baseline, two evolutionary/annealing searches, its
iterated local search and its Bayesian optimisation."""


def available() -> str | None:
    """None when Kernel Tuner can be imported, else why not."""
    try:
        import kernel_tuner  # noqa: F401
    except Exception as error:  # an optional peer: any failure to import means it is not there
        return f"{type(error).__name__}: {error}"
    return None


STRATEGY_TIMEOUT_S = 60.0
"""Longest one simulated search may take: some strategies loop on a sparse space (greedy_ils looking for a
neighbour a sampled landscape does not have); such a search raises TimeoutError and counts as failed."""


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"the search took longer than {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_strategy(
    landscape: Landscape,
    strategy: str,
    evaluations: int,
    seed: int,
    folder: Path | None = None,
    timeout_s: float = STRATEGY_TIMEOUT_S,
) -> list[str]:
    """One Kernel Tuner search of ``landscape`` with ``strategy`` and ``max_fevals=evaluations``: the cache
    keys of the configurations it evaluated, in order (each once). Its cache file draws one recorded sample
    per setting with ``seed``, which also seeds the strategy. TimeoutError past ``timeout_s`` (main thread
    only: the deadline is an alarm signal)."""
    import kernel_tuner

    with contextlib.ExitStack() as stack:
        if folder is None:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kf-kt-")))
        path = write_cache(
            landscape, folder / f"{landscape.problem}-{strategy}-{seed}.json", np.random.default_rng([seed, 11])
        )
        space = parameter_space(landscape)
        names = list(space)
        recorded = {cache_key(s.params) for s in landscape.settings}

        def allowed(p: dict[str, Any]) -> bool:
            return cache_key({n: p[n] for n in names}) in recorded

        # Some strategies draw from the global generators besides the seed Kernel Tuner takes.
        random.seed(seed)
        np.random.seed(seed % 2**32)
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), _deadline(timeout_s):
            warnings.simplefilter("ignore")
            results, _ = kernel_tuner.tune_kernel(
                landscape.problem,
                "",
                (1,),
                [],
                space,
                restrictions=[allowed],
                cache=str(path),
                simulation_mode=True,
                strategy=strategy,
                strategy_options={"max_fevals": evaluations},
                objective="time",
                objective_higher_is_better=False,
                quiet=True,
                seed=seed,
            )
    order: list[str] = []
    for result in results:
        key = cache_key({n: result[n] for n in names})
        if key not in order:
            order.append(key)
    return order[:evaluations]


def values_of(landscape: Landscape, keys: Sequence[str]) -> list[float | None]:
    """The landscape values of the settings with these cache keys, in order."""
    by_key = {cache_key(s.params): s.value for s in landscape.settings}
    return [by_key[k] for k in keys]

"""The input sets of a GPU benchmark: drawn from recorded seeds, sent to the child, kept for the next benchmark.

A GPU's benchmark shapes are large (a softmax input of 256 MiB): drawing one set with numpy takes seconds, and
a search times many candidates of one problem on the same shapes and seeds (a generation's candidates share
its seed). So the sets are kept in this process, least recently used first out, up to
:data:`CACHE_BYTES` (``KF_CUDA_INPUT_CACHE_BYTES``); a set is the same arrays whether drawn now or kept --
``Problem.make_inputs`` is deterministic in (shape, distribution, seed) -- and nobody writes to them (the
child gets copies over the pipe; the output check copies what it changes).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.config import settings
from engine.harness import protocol as p
from engine.harness.protocol import ArraySpec
from engine.problems import DTYPES, Problem

CACHE_BYTES = settings().cuda_input_cache_bytes


@dataclass(frozen=True)
class InputSets:
    """One shape's input sets, as the child's CudaPrepare takes them, and the inputs kept for the output check."""

    arrays: list[list[ArraySpec]]
    """Each set's arrays in the payload, in order."""
    scalars: list[dict[str, float | int]]
    """Each set's scalar inputs."""
    pieces: list[memoryview]
    """The payload: every set's arrays' bytes, in order."""
    kept: dict[int, dict[str, Any]]
    """The inputs of each set, by seed."""


class InputCache:
    """Drawn inputs by (problem definition, shape, distribution, seed), least recently used out first."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[tuple[str, ...], tuple[dict[str, Any], int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def inputs(self, problem: Problem, shape: dict[str, int], distribution: str, seed: int) -> dict[str, Any]:
        """``problem.make_inputs(shape, distribution, seed)``, kept or drawn now."""
        key = (str(problem.folder), problem.fingerprint(), repr(sorted(shape.items())), distribution, str(seed))
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key][0]
        inputs = problem.make_inputs(shape, distribution, seed)
        size = sum(v.nbytes for v in inputs.values() if isinstance(v, np.ndarray))
        with self._lock:
            if size <= self.capacity_bytes:
                self._entries[key] = (inputs, size)
                self._bytes += size
                while self._bytes > self.capacity_bytes:
                    _, (_, evicted) = self._entries.popitem(last=False)
                    self._bytes -= evicted
        return inputs


CACHE = InputCache(CACHE_BYTES)


def input_sets(
    problem: Problem, shape: dict[str, int], distribution: str, seeds: list[int], cache: InputCache = CACHE
) -> InputSets:
    """The input sets of ``seeds`` for one shape (see the module docstring)."""
    return sets_of(problem, {seed: cache.inputs(problem, shape, distribution, seed) for seed in seeds})


def refreshed_sets(problem: Problem, sets: InputSets, labels: list[int], refresh: int) -> InputSets:
    """New input sets, one per label, made from ``sets``' inputs in turn: every element of every input the judge
    varies (protocol.varied) multiplied by the fresh-input probe's factors of ``refresh`` (protocol.refresh_factors,
    as the CPU worker's Refresh does), in the dtype the kernel reads. Inputs no call has read, at the cost of a
    multiplication rather than a new draw (a GPU shape's draw takes seconds). Kept by label for the output check."""
    varied = p.varied(problem.params)
    made: dict[int, dict[str, Any]] = {}
    bases = list(sets.kept.values())
    for n, label in enumerate(labels):
        inputs = dict(bases[n % len(bases)])
        for index, q in enumerate(varied):
            array = np.array(inputs[q.name], dtype=DTYPES[q.dtype], order="C")  # a copy: the kept sets stay
            p.apply_refresh(np, array.reshape(-1), p.refresh_factors(np, refresh, index, array.size, array.dtype))
            inputs[q.name] = array
        made[label] = inputs
    return sets_of(problem, made)


def sets_of(problem: Problem, inputs_by_seed: dict[int, dict[str, Any]]) -> InputSets:
    """The payload and specs of these inputs (by seed, in order), as CudaPrepare takes them."""
    arrays, scalars, pieces, kept = [], [], [], {}
    for seed, inputs in inputs_by_seed.items():
        kept[seed] = inputs
        specs = []
        for q in problem.params:
            if q.role in ("in", "inout"):
                array = np.ascontiguousarray(inputs[q.name], dtype=DTYPES[q.dtype])
                pieces.append(array.reshape(-1).view(np.uint8).data)
                specs.append(ArraySpec(name=q.name, dtype=q.dtype, dims=list(array.shape), nbytes=array.nbytes))
        arrays.append(specs)
        scalars.append(
            {
                q.name: float(inputs[q.name]) if "float" in q.dtype else int(inputs[q.name])
                for q in problem.params
                if q.role == "scalar"
            }
        )
    return InputSets(arrays=arrays, scalars=scalars, pieces=pieces, kept=kept)

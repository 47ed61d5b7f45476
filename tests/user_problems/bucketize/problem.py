"""bucketize: idx[i] = how many edges are <= x[i] (np.searchsorted(edges, x, side="right")), edges sorted.

A user's folder whose input has an order a small change can break: sorted edges, marked ``"vary": False`` so
that the judge leaves them as drawn between timed calls (x still varies). Without the mark, the fresh-input
probe's refresh unsorted them and a correct binary search was judged incorrect.
"""

from __future__ import annotations

from typing import Any

import numpy as np

NAME = "bucketize"
ENTRY = "bucketize"
SIGNATURE = "void bucketize(const float *x, const float *edges, int64_t *idx, int64_t n, int64_t m)"
PARAMS: list[dict[str, Any]] = [
    {"name": "x", "role": "in", "dtype": "float32", "shape": ["n"]},
    {"name": "edges", "role": "in", "dtype": "float32", "shape": ["m"], "vary": False},
    {"name": "idx", "role": "out", "dtype": "int64", "shape": ["n"]},
    {"name": "n", "role": "size", "dtype": "int64"},
    {"name": "m", "role": "size", "dtype": "int64"},
]
VALIDATION_SHAPES: list[dict[str, int]] = [
    {"n": 1, "m": 1},
    {"n": 7, "m": 1},
    {"n": 1000, "m": 2},
    {"n": 4099, "m": 255},
]
BENCHMARK_SHAPES: list[tuple[dict[str, int], float]] = [({"n": 1 << 16, "m": 65536}, 1.0)]
TOLERANCES = {"int64": {"atol": 0.0, "rtol": 0.0}}
DISTRIBUTIONS = ["normal", "on_edges"]
SEED = "seed.c"


def make_inputs(shape: dict[str, int], distribution: str, rng: np.random.Generator) -> dict[str, Any]:
    n, m = shape["n"], shape["m"]
    edges = np.sort(rng.uniform(-3, 3, m)).astype(np.float32)
    if distribution == "normal":
        x = rng.standard_normal(n)
    elif distribution == "on_edges":
        x = edges[rng.integers(0, m, n)]
    else:
        raise ValueError(f"unknown distribution {distribution!r}; expected one of {DISTRIBUTIONS}")
    return {"x": x.astype(np.float32), "edges": edges}


def reference(inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
    found = np.searchsorted(inputs["edges"].astype(np.float64), inputs["x"].astype(np.float64), side="right")
    return {"idx": found.astype(np.float64)}


def baseline(inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
    return {"idx": np.searchsorted(inputs["edges"], inputs["x"], side="right").astype(np.int64)}


def roofline(shape: dict[str, int]) -> dict[str, int]:
    return {"bytes": 12 * shape["n"] + 4 * shape["m"], "flops": shape["n"]}

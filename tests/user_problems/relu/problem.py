"""relu: y = max(x, 0), a user's folder with one distribution of its own edge case.

Its DISTRIBUTIONS put the typical inputs first, where the judge times them. The test lists the all-negative
ones first: every timed answer is then 0, which a kernel that writes zeros without reading x would match at
each timed check (the drift of one element by a small step keeps it negative), and the judge refuses the
problem rather than time a memset.
"""

from __future__ import annotations

from typing import Any

import numpy as np

NAME = "relu"
ENTRY = "relu"
SIGNATURE = "void relu(const float *x, float *y, int64_t n)"
PARAMS: list[dict[str, Any]] = [
    {"name": "x", "role": "in", "dtype": "float32", "shape": ["n"]},
    {"name": "y", "role": "out", "dtype": "float32", "shape": ["n"]},
    {"name": "n", "role": "size", "dtype": "int64"},
]
VALIDATION_SHAPES: list[dict[str, int]] = [{"n": 1}, {"n": 7}, {"n": 1000}]
BENCHMARK_SHAPES: list[tuple[dict[str, int], float]] = [({"n": 1 << 18}, 1.0)]
TOLERANCES = {"float32": {"atol": 0.0, "rtol": 0.0}}
DISTRIBUTIONS = ["mixed", "negative"]
SEED = "seed.c"


def make_inputs(shape: dict[str, int], distribution: str, rng: np.random.Generator) -> dict[str, Any]:
    n = shape["n"]
    if distribution == "mixed":
        x = rng.standard_normal(n)
    elif distribution == "negative":
        x = -rng.uniform(1.0, 2.0, n)
    else:
        raise ValueError(f"unknown distribution {distribution!r}; expected one of {DISTRIBUTIONS}")
    return {"x": x.astype(np.float32)}


def reference(inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
    return {"y": np.maximum(inputs["x"].astype(np.float64), 0.0)}


def baseline(inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
    return {"y": np.maximum(inputs["x"], np.float32(0.0))}


def roofline(shape: dict[str, int]) -> dict[str, int]:
    return {"bytes": 8 * shape["n"], "flops": shape["n"]}

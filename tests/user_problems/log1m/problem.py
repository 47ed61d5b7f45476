"""log1m: y = log(1 - p) for probabilities p in [0, 0.99).

A user's folder whose input has a bounded domain: p a little past 1 has no logarithm. Its PARAMS leave p to
vary, as most folders do; the test marks it ``"vary": False`` to show the judge's fix and message.
"""

from __future__ import annotations

from typing import Any

import numpy as np

NAME = "log1m"
ENTRY = "log1m"
SIGNATURE = "void log1m(const float *p, float *y, int64_t n)"
PARAMS: list[dict[str, Any]] = [
    {"name": "p", "role": "in", "dtype": "float32", "shape": ["n"]},
    {"name": "y", "role": "out", "dtype": "float32", "shape": ["n"]},
    {"name": "n", "role": "size", "dtype": "int64"},
]
VALIDATION_SHAPES: list[dict[str, int]] = [{"n": 1}, {"n": 7}, {"n": 1000}]
BENCHMARK_SHAPES: list[tuple[dict[str, int], float]] = [({"n": 1 << 18}, 1.0)]
TOLERANCES = {"float32": {"atol": 1e-6, "rtol": 1e-5}}
DISTRIBUTIONS = ["uniform", "near_one"]
SEED = "seed.c"


def make_inputs(shape: dict[str, int], distribution: str, rng: np.random.Generator) -> dict[str, Any]:
    n = shape["n"]
    if distribution == "uniform":
        p = rng.uniform(0.0, 0.99, n)
    elif distribution == "near_one":
        p = 1.0 - rng.uniform(1e-3, 1e-1, n)
    else:
        raise ValueError(f"unknown distribution {distribution!r}; expected one of {DISTRIBUTIONS}")
    return {"p": p.astype(np.float32)}


def reference(inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
    return {"y": np.log1p(-inputs["p"].astype(np.float64))}


def baseline(inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
    return {"y": np.log1p(-inputs["p"])}


def roofline(shape: dict[str, int]) -> dict[str, int]:
    return {"bytes": 8 * shape["n"], "flops": shape["n"]}

"""heavy_copy: y = x, with a roofline that claims a billion flops per call.

A test fixture for the ``impossible`` verdict: any correct kernel is far faster than this roofline allows,
exactly as a kernel that skips its work on timed calls would be on a real problem. Its numpy baseline takes
as long as the roofline says a call must (it sleeps): a baseline faster than the model by the same margin
would make the model the problem's error, not the kernel's timing.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

NAME = "heavy_copy"
ENTRY = "heavy_copy"
SIGNATURE = "void heavy_copy(const float *x, float *y, int64_t n)"
PARAMS: list[dict[str, Any]] = [
    {"name": "x", "role": "in", "dtype": "float32", "shape": ["n"]},
    {"name": "y", "role": "out", "dtype": "float32", "shape": ["n"]},
    {"name": "n", "role": "size", "dtype": "int64"},
]
VALIDATION_SHAPES: list[dict[str, int]] = [{"n": 1}, {"n": 1000}]
BENCHMARK_SHAPES: list[tuple[dict[str, int], float]] = [({"n": 1 << 20}, 1.0)]  # a copy of 0.1-1 ms: short batches
TOLERANCES = {"float32": {"atol": 0.0, "rtol": 0.0}}
DISTRIBUTIONS = ["normal"]
SEED = "seed.c"


def make_inputs(shape: dict[str, int], distribution: str, rng: np.random.Generator) -> dict[str, Any]:
    return {"x": rng.standard_normal(shape["n"]).astype(np.float32)}


def reference(inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
    return {"y": inputs["x"].astype(np.float64)}


def baseline(inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
    time.sleep(0.02)  # longer than a billion flops take at 50 GFLOP/s, the more than an eighth the bound asks
    return {"y": inputs["x"].copy()}


def roofline(shape: dict[str, int]) -> dict[str, int]:
    return {"bytes": 8 * shape["n"], "flops": 10**9}

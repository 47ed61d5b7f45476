"""copy: y = x. A trivial kernel whose evaluation costs almost nothing, to expose orchestration overhead."""

from __future__ import annotations

from typing import Any

import numpy as np

NAME = "copy"
FAMILY = "elementwise"
ENTRY = "copy"
SIGNATURE = "void copy(const float *x, float *y, int64_t n)"
PARAMS: list[dict[str, Any]] = [
    {"name": "x", "role": "in", "dtype": "float32", "shape": ["n"]},
    {"name": "y", "role": "out", "dtype": "float32", "shape": ["n"]},
    {"name": "n", "role": "size", "dtype": "int64"},
]
VALIDATION_SHAPES: list[dict[str, int]] = [{"n": 1}, {"n": 7}, {"n": 1000}]
BENCHMARK_SHAPES: list[tuple[dict[str, int], float]] = [({"n": 4096}, 1.0)]
TOLERANCES = {"float32": {"atol": 0.0, "rtol": 0.0}}
DISTRIBUTIONS = ["normal"]
SEED = "seed.c"
TEMPLATE = "template.c"
TEMPLATE_PARAMS: dict[str, list[Any]] = {
    "UNROLL": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16],
    "SALT": list(range(64)),
}


def make_inputs(shape: dict[str, int], distribution: str, rng: np.random.Generator) -> dict[str, Any]:
    return {"x": rng.standard_normal(shape["n"]).astype(np.float32)}


def reference(inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
    return {"y": inputs["x"].astype(np.float64)}


def baseline(inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
    return {"y": inputs["x"].copy()}


def roofline(shape: dict[str, int]) -> dict[str, int]:
    return {"bytes": 8 * shape["n"], "flops": 0}

"""matmul: c[m, n] = a[m, k] · b[k, n], float32, row-major.

The rounding error of a k-long float32 dot product grows with k and with the size of its terms, so this
problem scales its absolute tolerance per trial (``tolerance_for``): atol = ATOL_UNIT · √k · rms(a) · rms(b).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

NAME = "matmul"
FAMILY = "matmul"
ENTRY = "matmul"
SIGNATURE = "void matmul(const float *a, const float *b, float *c, int64_t m, int64_t n, int64_t k)"
PARAMS: list[dict[str, Any]] = [
    {"name": "a", "role": "in", "dtype": "float32", "shape": ["m", "k"]},
    {"name": "b", "role": "in", "dtype": "float32", "shape": ["k", "n"]},
    {"name": "c", "role": "out", "dtype": "float32", "shape": ["m", "n"]},
    {"name": "m", "role": "size", "dtype": "int64"},
    {"name": "n", "role": "size", "dtype": "int64"},
    {"name": "k", "role": "size", "dtype": "int64"},
]
VALIDATION_SHAPES: list[dict[str, int]] = [
    {"m": 1, "n": 1, "k": 1},
    {"m": 1, "n": 1, "k": 1000},
    {"m": 1, "n": 300, "k": 64},
    {"m": 37, "n": 1, "k": 13},
    {"m": 3, "n": 5, "k": 7},
    {"m": 17, "n": 33, "k": 129},
    {"m": 64, "n": 65, "k": 63},
    {"m": 257, "n": 3, "k": 2},
    {"m": 100, "n": 130, "k": 257},
]
BENCHMARK_SHAPES: list[tuple[dict[str, int], float]] = [
    ({"m": 128, "n": 128, "k": 128}, 1.0),
    ({"m": 16, "n": 512, "k": 256}, 1.0),
    ({"m": 192, "n": 96, "k": 160}, 1.0),
    ({"m": 64, "n": 256, "k": 256}, 1.0),
]
# Unscaled values: tolerance_for multiplies atol by √k · rms(a) · rms(b), the size of a dot product's terms
# summed in random order. Any float32 summation order (sequential, blocked, pairwise, FMA) stays within it
# for the validation shapes; rounding a or b to bf16 or half precision, or dropping a single term of a sum,
# does not.
TOLERANCES = {"float32": {"atol": 1e-5, "rtol": 1e-5}}
DISTRIBUTIONS = ["normal", "uniform", "large", "edge"]
SEED = "seed.c"
TEMPLATE = "template.c"
TEMPLATE_PARAMS: dict[str, list[Any]] = {
    "MB": [16, 32, 64, 128],
    "NB": [64, 128, 256, 512],
    "KB": [64, 128, 256],
    "MR": [1, 2, 4, 6],
    "NR": [16, 32, 64],
    "ORDER": ["ikj", "kij"],
    "VEC": [256, 512],
    # What the micro-kernel reads from copies (template.c): 0 nothing, 1 the last columns of a block, fewer than NR,
    # zero-padded, so they run the micro-kernel too; 2 all of b's block, as panels; 3 a's block as well.
    "PACK": [0, 1, 2, 3],
}


def template_allows(params: dict[str, Any]) -> bool:
    """A register tile must fit in its cache block, and MR x NR accumulators must fit in the 32 vector
    registers of AVX-512 (at most 24 of them, leaving room for operands)."""
    if params["MR"] > params["MB"] or params["NR"] > params["NB"]:
        return False
    lanes = params["VEC"] // 32
    return params["MR"] * params["NR"] // lanes <= 24


def tolerance_for(dtype: str, shape: dict[str, int], inputs: dict[str, Any]) -> dict[str, float]:
    """The tolerance of one trial: TOLERANCES scaled by the expected size of a sum's rounding error."""
    base = TOLERANCES[dtype]
    scale = math.sqrt(shape["k"]) * _rms(inputs["a"]) * _rms(inputs["b"])
    return {"atol": base["atol"] * max(scale, 1e-30), "rtol": base["rtol"]}


def _rms(x: np.ndarray) -> float:
    return math.sqrt(float(np.mean(np.square(x, dtype=np.float64)))) if x.size else 0.0


def make_inputs(shape: dict[str, int], distribution: str, rng: np.random.Generator) -> dict[str, Any]:
    m, n, k = shape["m"], shape["n"], shape["k"]
    if distribution == "normal":
        a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    elif distribution == "uniform":
        # All positive: no cancellation, sums grow with k, so the relative error is what counts.
        a, b = rng.uniform(0.0, 1.0, (m, k)), rng.uniform(0.0, 1.0, (k, n))
    elif distribution == "large":
        a, b = rng.standard_normal((m, k)) * 1e3, rng.standard_normal((k, n)) * 1e3
    elif distribution == "edge":
        # Mostly zeros and small integers (exact in float32), plus whole zero rows of a and columns of b.
        values = np.array([0.0, 0.0, 0.0, 1.0, -1.0, 0.5, 2.0, -3.0])
        a, b = rng.choice(values, (m, k)), rng.choice(values, (k, n))
        a[rng.random(m) < 0.2, :] = 0.0
        b[:, rng.random(n) < 0.2] = 0.0
    else:
        raise ValueError(f"unknown distribution {distribution!r}; expected one of {DISTRIBUTIONS}")
    return {"a": np.ascontiguousarray(a, dtype=np.float32), "b": np.ascontiguousarray(b, dtype=np.float32)}


def reference(inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
    return {"c": inputs["a"].astype(np.float64) @ inputs["b"].astype(np.float64)}


def baseline(inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
    """What a numpy user writes: BLAS sgemm. It is multi-threaded unless the harness limits BLAS threads."""
    return {"c": inputs["a"] @ inputs["b"]}


def roofline(shape: dict[str, int]) -> dict[str, int]:
    m, n, k = shape["m"], shape["n"], shape["k"]
    return {"bytes": 4 * (m * k + k * n + m * n), "flops": 2 * m * n * k}

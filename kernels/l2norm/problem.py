"""l2norm: y[r, :] = x[r, :] / max(||x[r, :]||₂, eps), per row over cols.

The form of ``torch.nn.functional.normalize`` (eps 1e-12): a row whose norm is below eps is divided by eps,
so a zero row stays zero and a tiny one is scaled, never blown up. (The other common form, x / sqrt(Σx² + eps),
differs only for rows of norm near sqrt(eps).) A row reduction like rmsnorm without the weight, in the
row-reduction family: its template reuses rmsnorm's knob names so that lessons transfer. C kernel only; no
CUDA kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

NAME = "l2norm"
FAMILY = "row-reduction"
ENTRY = "l2norm"
SIGNATURE = "void l2norm(const float *x, float *y, int64_t rows, int64_t cols, float eps)"
PARAMS: list[dict[str, Any]] = [
    {"name": "x", "role": "in", "dtype": "float32", "shape": ["rows", "cols"]},
    {"name": "y", "role": "out", "dtype": "float32", "shape": ["rows", "cols"]},
    {"name": "rows", "role": "size", "dtype": "int64"},
    {"name": "cols", "role": "size", "dtype": "int64"},
    {"name": "eps", "role": "scalar", "dtype": "float32"},
]
VALIDATION_SHAPES: list[dict[str, int]] = [
    {"rows": 1, "cols": 1},
    {"rows": 1, "cols": 1000},
    {"rows": 37, "cols": 1},
    {"rows": 3, "cols": 7},
    {"rows": 17, "cols": 129},
    {"rows": 64, "cols": 1023},
    {"rows": 5, "cols": 4099},
    {"rows": 128, "cols": 2048},
    # Remainders the shapes above miss: rows of 2 and 6 modulo 8 and columns of 2, 4, 5 and 6 modulo 8 (a
    # kernel's leftover rows and columns after its blocks are code paths of their own).
    {"rows": 6, "cols": 1030},
    {"rows": 10, "cols": 68},
    {"rows": 2, "cols": 133},
    {"rows": 3, "cols": 66},
]
# As rmsnorm's: hidden sizes of language models (query and key heads are normalised row by row too).
BENCHMARK_SHAPES: list[tuple[dict[str, int], float]] = [
    ({"rows": 512, "cols": 4096}, 2.0),
    ({"rows": 2048, "cols": 1024}, 1.0),
    ({"rows": 64, "cols": 16384}, 1.0),
    ({"rows": 8192, "cols": 128}, 1.0),
]
# y has norm 1, so its elements are about 1/sqrt(cols) (0.016 at 4099 columns), not about 1 as rmsnorm's:
# atol is ten times smaller than rmsnorm's for the same relative strictness. A float32 sum of squares in any
# order and a reciprocal estimate with a Newton step stay within ~1e-6 relative; half precision (5e-4) and
# a sum that skips an element (~1/cols) are far outside.
TOLERANCES = {"float32": {"atol": 1e-7, "rtol": 1e-5}}
DISTRIBUTIONS = ["normal", "uniform", "large", "edge"]
SEED = "seed.c"
TEMPLATE = "template.c"
# The names and values are rmsnorm's (a subset of its values), meaning the same, so that lessons and the
# surrogate's effects transfer within the row-reduction family; no PFL (the prefetch fills L1).
TEMPLATE_PARAMS: dict[str, list[Any]] = {
    "VEC": [0, 256, 512],
    "ACC": [1, 2, 4, 8],
    "ROWS": [1, 2, 4],
    "SIMD": [0, 1],
    "FUSED": [0, 1],
    "NT": [0, 1],
    "PF": [0, 1024, 4096],
    "ALIGN": [0, 1],
    "PIPE": [0, 1],
    # Rows per block for short rows (at most 256 columns); 0: ROWS for every row (as in rmsnorm's template).
    "SHORT": [0, 1, 2],
    # A block's rows adjacent (0) or each from its own part of the matrix (1), as in rmsnorm's template.
    "SPLIT": [0, 1],
}
# eps is drawn for each input from torch's default (1e-12) and a value models use for q/k norms (1e-6):
# a kernel that ignores its eps argument and bakes one in is wrong on the other.
EPSILONS = [1e-12, 1e-6]


def template_allows(params: dict[str, Any]) -> bool:
    """The rules of rmsnorm's template, for the same reasons: SIMD (omp simd reductions) is for the plain-C path
    with one accumulator and one row; streaming stores need explicit vectors and an aligned loop (VEC > 0,
    ALIGN 1); ALIGN peels to a vector width (VEC > 0); the pipelined loop pairs the next block's reduction with
    a final pass that reads x (VEC > 0, FUSED 0); at most 16 accumulators in flight (ROWS x ACC), the registers
    there are."""
    vec, simd = params["VEC"], params["SIMD"]
    if simd and (vec != 0 or params["ACC"] != 1 or params["ROWS"] != 1):
        return False
    if params["NT"] and (vec == 0 or not params["ALIGN"]):
        return False
    if params["ALIGN"] and vec == 0:
        return False
    if params["PIPE"] and (vec == 0 or params["FUSED"]):
        return False
    if params["SHORT"] and params["SHORT"] >= params["ROWS"]:
        return False  # short rows go in smaller blocks than ROWS, or in blocks of ROWS (SHORT 0)
    if params["SPLIT"] and params["ROWS"] == 1:
        return False  # rows from parts of the matrix need blocks of several rows
    return bool(params["ROWS"] * params["ACC"] <= 16)


def make_inputs(shape: dict[str, int], distribution: str, rng: np.random.Generator) -> dict[str, Any]:
    rows, cols = shape["rows"], shape["cols"]
    if distribution == "normal":
        x = rng.standard_normal((rows, cols))
    elif distribution == "uniform":
        x = rng.uniform(-4.0, 4.0, (rows, cols))
    elif distribution == "large":
        # Rows of very different scales (1e2 .. 1e6): each row is divided by its own norm; squares reach 1e12,
        # far from float32 overflow but far from 1.
        x = rng.standard_normal((rows, cols)) * 10.0 ** rng.uniform(2.0, 6.0, (rows, 1))
    elif distribution == "edge":
        x = _edge_rows(rows, cols, rng)
    else:
        raise ValueError(f"unknown distribution {distribution!r}; expected one of {DISTRIBUTIONS}")
    return {"x": np.ascontiguousarray(x, dtype=np.float32), "eps": np.float32(rng.choice(EPSILONS))}


def _edge_rows(rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Rows of zeros (y = 0 through eps), one spike (y = ±1 there), a constant, rows whose norm is below eps
    (divided by eps, not by their norm), or normal values."""
    x = rng.standard_normal((rows, cols))
    kind = rng.integers(0, 5, rows)
    for r in range(rows):
        if kind[r] == 0:
            x[r] = 0.0
        elif kind[r] == 1:
            x[r] = 0.0
            x[r, rng.integers(0, cols)] = rng.choice([-1e3, 1e3])
        elif kind[r] == 2:
            x[r] = rng.choice([-3.0, 0.5, 7.0])
        elif kind[r] == 3:
            # ||x|| ~ 1e-14·sqrt(cols) < 1e-12 <= eps: the max picks eps. Squares ~1e-28 stay normal float32
            # numbers (no flush to zero changes them).
            x[r] *= 1e-14
    return x


def reference(inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
    x = inputs["x"].astype(np.float64)
    eps = float(inputs["eps"])
    return {"y": x / np.maximum(np.sqrt(np.sum(x * x, axis=1, keepdims=True)), eps)}


def baseline(inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
    """What a numpy user writes; speedups are quoted against this."""
    x, eps = inputs["x"], inputs["eps"]
    return {"y": x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), eps)}


def roofline(shape: dict[str, int]) -> dict[str, int]:
    rows, cols = shape["rows"], shape["cols"]
    n = rows * cols
    # Read x once, write y once; square and add, then one multiply per element; sqrt, max and divide per row.
    return {"bytes": 8 * n, "flops": 3 * n + 3 * rows}

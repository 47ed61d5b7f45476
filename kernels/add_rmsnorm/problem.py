"""add_rmsnorm: the residual add fused with RMSNorm, as in a transformer block's pre-norm:
h[r, :] = x[r, :] + residual[r, :] (written out: it is the next block's residual), then
y[r, :] = h[r, :] / sqrt(mean(h[r, :]²) + eps) * w, per row over cols (w broadcast over rows).

One pass reads x and residual and writes h and y, instead of an add kernel writing h and an rmsnorm kernel
reading it back. In the row-reduction family: its template reuses rmsnorm's knob names so that lessons
transfer. C kernel only; no CUDA kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

NAME = "add_rmsnorm"
FAMILY = "row-reduction"
ENTRY = "add_rmsnorm"
SIGNATURE = (
    "void add_rmsnorm(const float *x, const float *residual, const float *w, float *h, float *y, int64_t rows, "
    "int64_t cols, float eps)"
)
PARAMS: list[dict[str, Any]] = [
    {"name": "x", "role": "in", "dtype": "float32", "shape": ["rows", "cols"]},
    {"name": "residual", "role": "in", "dtype": "float32", "shape": ["rows", "cols"]},
    {"name": "w", "role": "in", "dtype": "float32", "shape": ["cols"]},
    {"name": "h", "role": "out", "dtype": "float32", "shape": ["rows", "cols"]},
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
# Hidden sizes of language models, as rmsnorm's; each call moves four rows-by-cols arrays, not two.
BENCHMARK_SHAPES: list[tuple[dict[str, int], float]] = [
    ({"rows": 512, "cols": 4096}, 2.0),
    ({"rows": 2048, "cols": 1024}, 1.0),
    ({"rows": 64, "cols": 16384}, 1.0),
    ({"rows": 8192, "cols": 128}, 1.0),
]
# rmsnorm's: h is one float32 rounding of x + residual (~6e-8 relative), y a float32 sum of 4099 squares in any
# order (~1e-6 relative); bf16 or half precision (4e-3, 5e-4) and an element left out are far outside.
TOLERANCES = {"float32": {"atol": 1e-6, "rtol": 1e-5}}
DISTRIBUTIONS = ["normal", "uniform", "large", "edge"]
SEED = "seed.c"
TEMPLATE = "template.c"
# The names and values are rmsnorm's (a subset of its values), meaning the same, so that lessons and the
# surrogate's effects transfer within the row-reduction family.
TEMPLATE_PARAMS: dict[str, list[Any]] = {
    "VEC": [0, 256, 512],
    "ACC": [1, 2, 4, 8],
    "ROWS": [1, 2, 4],
    "SIMD": [0, 1],
    "FUSED": [0, 1],
    "NT": [0, 1],
    "PF": [0, 1024, 4096],
    "PFL": [1, 2],
    "ALIGN": [0, 1],
    "PIPE": [0, 1],
    # Rows per block for short rows (at most 256 columns); 0: ROWS for every row (as in rmsnorm's template).
    "SHORT": [0, 1, 2],
    # A block's rows adjacent (0) or each from its own part of the matrix (1), as in rmsnorm's template.
    "SPLIT": [0, 1],
}
# eps is drawn for each input from the values models use (1e-5, 1e-6):
# a kernel that ignores its eps argument and bakes one in is wrong on the other.
EPSILONS = [1e-5, 1e-6]


def template_allows(params: dict[str, Any]) -> bool:
    """The rules of rmsnorm's template, for the same reasons: SIMD (omp simd reductions) is for the plain-C path
    with one accumulator and one row; streaming stores need explicit vectors and an aligned loop (VEC > 0,
    ALIGN 1); ALIGN peels to a vector width (VEC > 0); the prefetch level means nothing without a prefetch; the
    pipelined loop pairs the next block's reduction with a final pass that reads h (VEC > 0, FUSED 0); at most 16
    accumulators in flight (ROWS x ACC), the registers there are."""
    vec, simd = params["VEC"], params["SIMD"]
    if simd and (vec != 0 or params["ACC"] != 1 or params["ROWS"] != 1):
        return False
    if params["NT"] and (vec == 0 or not params["ALIGN"]):
        return False
    if params["ALIGN"] and vec == 0:
        return False
    if params["PF"] == 0 and params["PFL"] != 1:
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
    w = rng.normal(1.0, 0.5, cols)
    if distribution == "normal":
        # The residual stream grows through the blocks; a block's output is smaller.
        x = rng.standard_normal((rows, cols))
        residual = 4.0 * rng.standard_normal((rows, cols))
    elif distribution == "uniform":
        x = rng.uniform(-4.0, 4.0, (rows, cols))
        residual = rng.uniform(-4.0, 4.0, (rows, cols))
    elif distribution == "large":
        # Rows of very different scales (1e2 .. 1e6): each row is normalised by its own norm; squares reach 1e12.
        scale = 10.0 ** rng.uniform(2.0, 6.0, (rows, 1))
        x = rng.standard_normal((rows, cols)) * scale
        residual = rng.standard_normal((rows, cols)) * scale
    elif distribution == "edge":
        x, residual = _edge_rows(rows, cols, rng)
    else:
        raise ValueError(f"unknown distribution {distribution!r}; expected one of {DISTRIBUTIONS}")
    return {
        "x": np.ascontiguousarray(x, dtype=np.float32),
        "residual": np.ascontiguousarray(residual, dtype=np.float32),
        "w": np.ascontiguousarray(w, dtype=np.float32),
        "eps": np.float32(rng.choice(EPSILONS)),
    }


def _edge_rows(rows: int, cols: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Rows where x cancels the residual exactly (h = 0, defined through eps), nearly (h tiny, mean(h²) below
    eps), one spike, a constant residual with x = 0, or normal values."""
    residual = rng.standard_normal((rows, cols)).astype(np.float32)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    kind = rng.integers(0, 5, rows)
    for r in range(rows):
        if kind[r] == 0:
            x[r] = -residual[r]
        elif kind[r] == 1:
            # x nearly cancels the residual: h ~ 1e-4, mean(h²) ~ 1e-8 is below eps, and h has few bits left.
            x[r] = -residual[r] + np.float32(1e-4) * rng.standard_normal(cols).astype(np.float32)
        elif kind[r] == 2:
            residual[r] = 0.0
            x[r] = 0.0
            x[r, rng.integers(0, cols)] = rng.choice([-1e3, 1e3])
        elif kind[r] == 3:
            residual[r] = rng.choice([-3.0, 0.5, 7.0])
            x[r] = 0.0
    return x, residual


def reference(inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
    h = inputs["x"].astype(np.float64) + inputs["residual"].astype(np.float64)
    w = inputs["w"].astype(np.float64)
    eps = float(inputs["eps"])
    return {"h": h, "y": h / np.sqrt(np.mean(h * h, axis=1, keepdims=True) + eps) * w}


def baseline(inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
    """What a numpy user writes; speedups are quoted against this."""
    x, residual, w, eps = inputs["x"], inputs["residual"], inputs["w"], inputs["eps"]
    h = x + residual
    return {"h": h, "y": h / np.sqrt(np.mean(h * h, axis=1, keepdims=True) + eps) * w}


def roofline(shape: dict[str, int]) -> dict[str, int]:
    rows, cols = shape["rows"], shape["cols"]
    n = rows * cols
    # Read x, residual and w once, write h and y once; add, square and add, then two multiplies per element;
    # sqrt and divide per row.
    return {"bytes": 4 * (4 * n + cols), "flops": 5 * n + 2 * rows}

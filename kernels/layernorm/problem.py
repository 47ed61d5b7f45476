"""layernorm: y[r, :] = (x[r, :] - mean) / sqrt(var + eps) * w + b, per row over cols (biased variance).

The form of ``torch.nn.LayerNorm`` over the last dimension with its weight and bias. A row reduction like
rmsnorm, with two moments instead of one and a bias, in the row-reduction family: its template reuses
rmsnorm's knob names so that lessons transfer. C kernel only; no CUDA kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

NAME = "layernorm"
FAMILY = "row-reduction"
ENTRY = "layernorm"
SIGNATURE = (
    "void layernorm(const float *x, const float *w, const float *b, float *y, int64_t rows, int64_t cols, float eps)"
)
PARAMS: list[dict[str, Any]] = [
    {"name": "x", "role": "in", "dtype": "float32", "shape": ["rows", "cols"]},
    {"name": "w", "role": "in", "dtype": "float32", "shape": ["cols"]},
    {"name": "b", "role": "in", "dtype": "float32", "shape": ["cols"]},
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
# As rmsnorm's: hidden sizes of language models; a decode step normalises few rows, a prefill many.
BENCHMARK_SHAPES: list[tuple[dict[str, int], float]] = [
    ({"rows": 512, "cols": 4096}, 2.0),
    ({"rows": 2048, "cols": 1024}, 1.0),
    ({"rows": 64, "cols": 16384}, 1.0),
    ({"rows": 8192, "cols": 128}, 1.0),
]
# y is about w * N(0, 1) + b, elements of about 1. What sets atol is the offset rows: float32 sums of x whose mean
# is 20 times its spread put the mean off by a few 1e-6 of the spread, so y is off by up to ~2.4e-5 with one
# accumulator (0.6 of atol; 0.3 with eight), against ~2.7e-4 for a one-pass E[x^2] - E[x]^2 (6.9 times atol).
# Half precision (5e-4 relative) and a sum that skips elements are far outside too.
TOLERANCES = {"float32": {"atol": 4e-5, "rtol": 1e-5}}
DISTRIBUTIONS = ["normal", "uniform", "large", "offset", "edge"]
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
# eps is drawn for each input from torch's default (1e-5) and another value models use (1e-6): a kernel that
# ignores its eps argument and bakes one in is wrong on the other.
EPSILONS = [1e-5, 1e-6]


def template_allows(params: dict[str, Any]) -> bool:
    """The rules of rmsnorm's template, for the same reasons: SIMD (omp simd reductions) is for the plain-C path
    with one accumulator and one row; streaming stores need explicit vectors and an aligned loop (VEC > 0,
    ALIGN 1); ALIGN peels to a vector width (VEC > 0); the pipelined loop pairs the next block's reduction with
    a final pass that reads x (VEC > 0, FUSED 0). Two sums per accumulator (of d and of d squared): at most 8
    accumulators in flight (ROWS x ACC), 16 registers' worth, as rmsnorm's 16."""
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
    return bool(params["ROWS"] * params["ACC"] <= 8)


def make_inputs(shape: dict[str, int], distribution: str, rng: np.random.Generator) -> dict[str, Any]:
    rows, cols = shape["rows"], shape["cols"]
    w = rng.normal(1.0, 0.5, cols)
    b = rng.normal(0.0, 0.5, cols)
    if distribution == "normal":
        x = rng.standard_normal((rows, cols))
    elif distribution == "uniform":
        x = rng.uniform(-4.0, 4.0, (rows, cols))
    elif distribution == "large":
        # Rows of very different scales (1e2 .. 1e6): a kernel must normalise each row by its own spread;
        # squares reach 1e12, far from float32 overflow but far from 1.
        x = rng.standard_normal((rows, cols)) * 10.0 ** rng.uniform(2.0, 6.0, (rows, 1))
    elif distribution == "offset":
        # Rows whose mean is 5 to 20 times their spread, of any sign and scale (activations with an offset):
        # E[x^2] - E[x]^2 in float32 cancels there, a variance about the mean (or a shift) does not.
        scale = 10.0 ** rng.uniform(-1.0, 2.0, (rows, 1))
        mean = rng.choice([-1.0, 1.0], (rows, 1)) * rng.uniform(5.0, 20.0, (rows, 1)) * scale
        x = mean + scale * rng.standard_normal((rows, cols))
    elif distribution == "edge":
        x = _edge_rows(rows, cols, rng)
    else:
        raise ValueError(f"unknown distribution {distribution!r}; expected one of {DISTRIBUTIONS}")
    return {
        "x": np.ascontiguousarray(x, dtype=np.float32),
        "w": np.ascontiguousarray(w, dtype=np.float32),
        "b": np.ascontiguousarray(b, dtype=np.float32),
        "eps": np.float32(rng.choice(EPSILONS)),
    }


def _edge_rows(rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Rows of zeros and constants (variance 0: y = b, eps keeps it defined), one spike, tiny values (variance
    below eps), or normal values."""
    x = rng.standard_normal((rows, cols))
    # Every kind in any five consecutive rows, from a random first one: a constant row (whose mean must come out
    # exactly, so that y is b) is in every trial of five rows or more.
    kind = (rng.integers(0, 5) + np.arange(rows)) % 5
    for r in range(rows):
        if kind[r] == 0:
            x[r] = 0.0
        elif kind[r] == 1:
            x[r] = 0.0
            x[r, rng.integers(0, cols)] = rng.choice([-1e3, 1e3])
        elif kind[r] == 2:
            x[r] = rng.choice([-3.0, 0.5, 7.0])
        elif kind[r] == 3:
            # var ~ 1e-8 is below eps: y depends on eps.
            x[r] *= 1e-4
    return x


def reference(inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
    x = inputs["x"].astype(np.float64)
    w, b = inputs["w"].astype(np.float64), inputs["b"].astype(np.float64)
    eps = float(inputs["eps"])
    mean = np.mean(x, axis=1, keepdims=True)
    var = np.mean((x - mean) ** 2, axis=1, keepdims=True)
    return {"y": (x - mean) / np.sqrt(var + eps) * w + b}


def baseline(inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
    """What a numpy user writes; speedups are quoted against this."""
    x, w, b, eps = inputs["x"], inputs["w"], inputs["b"], inputs["eps"]
    mean = x.mean(axis=1, keepdims=True)
    return {"y": (x - mean) / np.sqrt(x.var(axis=1, keepdims=True) + eps) * w + b}


def roofline(shape: dict[str, int]) -> dict[str, int]:
    rows, cols = shape["rows"], shape["cols"]
    n = rows * cols
    # Read x, w and b once, write y once; a subtract, an add and a multiply-add per element for the moments, then
    # a subtract, two multiplies and an add; sqrt and divide per row.
    return {"bytes": 4 * (2 * n + 2 * cols), "flops": 8 * n + 4 * rows}

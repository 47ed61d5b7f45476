"""rmsnorm: y[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) * w, per row over cols (w broadcast over rows)."""

from __future__ import annotations

from typing import Any

import numpy as np

NAME = "rmsnorm"
FAMILY = "row-reduction"
ENTRY = "rmsnorm"
SIGNATURE = "void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps)"
PARAMS: list[dict[str, Any]] = [
    {"name": "x", "role": "in", "dtype": "float32", "shape": ["rows", "cols"]},
    {"name": "w", "role": "in", "dtype": "float32", "shape": ["cols"]},
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
# Hidden sizes of language models; a decode step normalises few rows, a prefill many.
BENCHMARK_SHAPES: list[tuple[dict[str, int], float]] = [
    ({"rows": 512, "cols": 4096}, 2.0),
    ({"rows": 2048, "cols": 1024}, 1.0),
    ({"rows": 64, "cols": 16384}, 1.0),
    ({"rows": 8192, "cols": 128}, 1.0),
]
# A float32 sum of 4099 squares in any order is within ~1e-6 relative; bf16 or half precision (1e-3,
# 5e-4) and a float32 sum that skips elements are far outside.
TOLERANCES = {"float32": {"atol": 1e-6, "rtol": 1e-5}}
DISTRIBUTIONS = ["normal", "uniform", "large", "edge"]
SEED = "seed.c"
TEMPLATE = "template.c"
TEMPLATE_PARAMS: dict[str, list[Any]] = {
    "VEC": [0, 256, 512],
    "ACC": [1, 2, 4, 8, 16],
    "ROWS": [1, 2, 4, 8],
    "SIMD": [0, 1],
    "FUSED": [0, 1],
    "NT": [0, 1],
    "PF": [0, 1024, 4096],
    "PFL": [1, 2],
    "ALIGN": [0, 1],
    "PIPE": [0, 1],
    # Rows per block for short rows (at most 256 columns); 0: ROWS for every row. Named as in l2norm's and
    # add_rmsnorm's templates, so lessons transfer within the row-reduction family.
    "SHORT": [0, 1, 2],
    # A block's rows adjacent (0) or each from its own part of the matrix (1): memory streams in flight. Named as in
    # softmax's, l2norm's and add_rmsnorm's templates.
    "SPLIT": [0, 1],
}
# eps is drawn for each input from the values models use (1e-5, 1e-6):
# a kernel that ignores its eps argument and bakes one in is wrong on the other.
EPSILONS = [1e-5, 1e-6]
# The CUDA kernel (docs/problems.md, "CUDA kernels"): same PARAMS, sizes as long long.
CUDA_ENTRY = "rmsnorm"
CUDA_SEED = "seed.cu"
CUDA_TEMPLATE = "template.cu"
CUDA_TEMPLATE_PARAMS: dict[str, list[Any]] = {
    "THREADS": [128, 256, 512, 1024],
    "ROWS": [1, 4],
    "VEC": [1, 4],
    "KEEP": [0, 16],
    "NT": [0, 1],
}
# Each call reads and writes 256 MiB, far beyond any GPU's L2: HBM-bound. The short rows (256) are where
# several rows per block pay.
CUDA_BENCHMARK_SHAPES: list[tuple[dict[str, int], float]] = [
    ({"rows": 16384, "cols": 4096}, 2.0),
    ({"rows": 65536, "cols": 1024}, 1.0),
    ({"rows": 262144, "cols": 256}, 1.0),
]


def template_allows(params: dict[str, Any]) -> bool:
    """Settings that are pointless, duplicates or spill registers are skipped: SIMD (omp simd reductions) is
    for the plain-C path with one accumulator and one row; streaming stores need explicit vectors and an
    aligned loop (VEC > 0, ALIGN 1); ALIGN peels to a vector width (VEC > 0); the prefetch level means
    nothing without a prefetch; at most 16 accumulators in flight (ROWS x ACC), the registers there are; short
    rows in smaller blocks than ROWS (SHORT < ROWS: SHORT = ROWS is SHORT = 0); rows from parts of the matrix
    need blocks of several rows (SPLIT with ROWS > 1)."""
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
        return False
    if params["SPLIT"] and params["ROWS"] == 1:
        return False
    return bool(params["ROWS"] * params["ACC"] <= 16)


def cuda_template_allows(params: dict[str, Any]) -> bool:
    """Several rows per block are for short rows: at most 256 threads shared by 4 rows (32 or 64 each)."""
    return params["ROWS"] == 1 or params["THREADS"] <= 256


def make_inputs(shape: dict[str, int], distribution: str, rng: np.random.Generator) -> dict[str, Any]:
    rows, cols = shape["rows"], shape["cols"]
    w = rng.normal(1.0, 0.5, cols)
    if distribution == "normal":
        x = rng.standard_normal((rows, cols))
    elif distribution == "uniform":
        x = rng.uniform(-4.0, 4.0, (rows, cols))
    elif distribution == "large":
        # Rows of very different scales (1e2 .. 1e6): a kernel must normalise each row by its own norm;
        # squares reach 1e12, far from float32 overflow but far from 1.
        x = rng.standard_normal((rows, cols)) * 10.0 ** rng.uniform(2.0, 6.0, (rows, 1))
    elif distribution == "edge":
        x = _edge_rows(rows, cols, rng)
    else:
        raise ValueError(f"unknown distribution {distribution!r}; expected one of {DISTRIBUTIONS}")
    return {
        "x": np.ascontiguousarray(x, dtype=np.float32),
        "w": np.ascontiguousarray(w, dtype=np.float32),
        "eps": np.float32(rng.choice(EPSILONS)),
    }


def _edge_rows(rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Rows of zeros (eps keeps y = 0 defined), one spike, a constant, tiny values, or normal values."""
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
            # mean(x²) ~ 1e-8 is below eps: y depends on eps, and x² is far below float32's 1.0.
            x[r] *= 1e-4
    return x


def reference(inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
    x = inputs["x"].astype(np.float64)
    w = inputs["w"].astype(np.float64)
    eps = float(inputs["eps"])
    return {"y": x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + eps) * w}


def baseline(inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
    """What a numpy user writes; speedups are quoted against this."""
    x, w, eps = inputs["x"], inputs["w"], inputs["eps"]
    return {"y": x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + eps) * w}


def cuda_baseline(cp: Any, inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, Any]:
    """What a CuPy user writes; GPU speedups are quoted against this."""
    x, w, eps = inputs["x"], inputs["w"], inputs["eps"]
    return {"y": x / cp.sqrt(cp.mean(x * x, axis=1, keepdims=True) + eps) * w}


def roofline(shape: dict[str, int]) -> dict[str, int]:
    rows, cols = shape["rows"], shape["cols"]
    n = rows * cols
    # Read x and w once, write y once; square and add, then two multiplies per element; sqrt and divide per row.
    return {"bytes": 4 * (2 * n + cols), "flops": 4 * n + 2 * rows}

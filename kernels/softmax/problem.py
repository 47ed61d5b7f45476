"""softmax: y[r, :] = exp(x[r, :] - max(x[r, :])) / sum(exp(x[r, :] - max(x[r, :]))), per row over cols."""

from __future__ import annotations

from typing import Any

import numpy as np

NAME = "softmax"
FAMILY = "row-reduction"
ENTRY = "softmax"
SIGNATURE = "void softmax(const float *x, float *y, int64_t rows, int64_t cols)"
PARAMS: list[dict[str, Any]] = [
    {"name": "x", "role": "in", "dtype": "float32", "shape": ["rows", "cols"]},
    {"name": "y", "role": "out", "dtype": "float32", "shape": ["rows", "cols"]},
    {"name": "rows", "role": "size", "dtype": "int64"},
    {"name": "cols", "role": "size", "dtype": "int64"},
]
VALIDATION_SHAPES: list[dict[str, int]] = [
    {"rows": 1, "cols": 1},
    {"rows": 1, "cols": 1000},
    {"rows": 37, "cols": 1},
    {"rows": 3, "cols": 7},
    {"rows": 17, "cols": 129},
    {"rows": 64, "cols": 1023},
    {"rows": 5, "cols": 4099},
    {"rows": 256, "cols": 4096},
    # Remainders the shapes above miss: rows of 2 and 6 modulo 8 and columns of 2, 4, 5 and 6 modulo 8 (a
    # kernel's leftover rows and columns after its blocks are code paths of their own).
    {"rows": 6, "cols": 1030},
    {"rows": 10, "cols": 68},
    {"rows": 2, "cols": 133},
    {"rows": 3, "cols": 66},
]
BENCHMARK_SHAPES: list[tuple[dict[str, int], float]] = [
    ({"rows": 512, "cols": 1024}, 1.0),
    ({"rows": 64, "cols": 8192}, 1.0),
    ({"rows": 2048, "cols": 256}, 1.0),
]
TOLERANCES = {"float32": {"atol": 1e-6, "rtol": 1e-4}}
DISTRIBUTIONS = ["normal", "uniform", "large", "edge", "masked", "wide"]
SEED = "seed.c"
TEMPLATE = "template.c"
TEMPLATE_PARAMS: dict[str, list[Any]] = {
    "VEC": [0, 256, 512],
    "ONLINE": [0, 1],
    "UNROLL": [1, 2, 4, 8],
    # Degree of the inline exp's polynomial; 3 (relative error ~8e-5) would break the 1e-4 tolerance.
    "EXP": [4, 5, 6],
    "SIMD": [0, 1],
    # Named and meant as in rmsnorm's template, so that lessons transfer within the row-reduction family.
    "FUSED": [0, 1],
    "KEEP": [0, 1],
    "NT": [0, 1],
    "PF": [0, 1024],
    "ALIGN": [0, 1],
    "PIPE": [0, 1, 2, 3],
    # Rows per block of the PIPE 2 pipeline and of PIPE 3 on short rows (named as in rmsnorm's template, whose ROWS
    # interleaves rows too).
    "ROWS": [1, 2, 4, 8],
    # A PIPE 2 (or 3) block's rows adjacent (0) or each from its own part of the matrix (1): memory streams in flight.
    "SPLIT": [0, 1],
}


# The CUDA kernel (docs/problems.md, "CUDA kernels"): same PARAMS, sizes as long long.
CUDA_ENTRY = "softmax"
CUDA_SEED = "seed.cu"
CUDA_TEMPLATE = "template.cu"
CUDA_TEMPLATE_PARAMS: dict[str, list[Any]] = {
    "THREADS": [128, 256, 512, 1024],
    "VEC": [1, 4],
    "REDUCE": ["warp", "smem"],
    "ONLINE": [0, 1],
    "KEEP": [0, 16],
}
# Each call reads and writes 256 MiB, far beyond any GPU's L2: HBM-bound, as in a model's prefill.
CUDA_BENCHMARK_SHAPES: list[tuple[dict[str, int], float]] = [
    ({"rows": 16384, "cols": 4096}, 2.0),
    ({"rows": 65536, "cols": 1024}, 1.0),
    ({"rows": 4096, "cols": 16384}, 1.0),
]


def template_allows(params: dict[str, Any]) -> bool:
    """Settings that are pointless or duplicates are skipped: SIMD (omp simd) is for the plain-C path (VEC 0);
    streaming stores need explicit vectors and an aligned loop (VEC > 0, ALIGN 1); ALIGN peels to a vector
    width (VEC > 0); the scratch row replaces storing into y (KEEP with FUSED 0); the pipelined loop pairs a
    separate max pass with a final pass that does not read y (PIPE: VEC > 0, ONLINE 0, FUSED 0); the
    three-stage pipeline keeps its exponentials in scratch rows (PIPE 2 and 3 with KEEP 1), and only it blocks
    rows (ROWS > 1 with PIPE 2 or 3), and only a block of several rows can take them from parts of the matrix
    (SPLIT 1 with ROWS > 1); PIPE 3's long rows are online softmax's chunks (VEC > 0, ONLINE 1)."""
    vec = params["VEC"]
    if params["SIMD"] and vec != 0:
        return False
    if params["NT"] and (vec == 0 or not params["ALIGN"]):
        return False
    if params["ALIGN"] and vec == 0:
        return False
    if params["KEEP"] and params["FUSED"]:
        return False
    if params["PIPE"] in (2, 3) and not params["KEEP"]:
        return False
    if params["ROWS"] != 1 and params["PIPE"] not in (2, 3):
        return False
    if params["SPLIT"] and params["ROWS"] == 1:
        return False
    if params["PIPE"] == 3:
        return vec != 0 and bool(params["ONLINE"]) and not params["FUSED"]
    return not (params["PIPE"] and (vec == 0 or params["ONLINE"] or params["FUSED"]))


def cuda_template_allows(params: dict[str, Any]) -> bool:
    """A kept row is reduced from registers whatever ONLINE says, and a row too long to keep is best streamed
    with the online pass: KEEP goes with ONLINE=1 only."""
    return params["KEEP"] == 0 or params["ONLINE"] == 1


def make_inputs(shape: dict[str, int], distribution: str, rng: np.random.Generator) -> dict[str, Any]:
    rows, cols = shape["rows"], shape["cols"]
    if distribution == "normal":
        x = rng.standard_normal((rows, cols))
    elif distribution == "uniform":
        x = rng.uniform(-4.0, 4.0, (rows, cols))
    elif distribution == "large":
        # Without subtracting the row max, exp() overflows to inf on these.
        x = rng.uniform(-1.0, 1.0, (rows, cols)) * 500.0
    elif distribution == "edge":
        choices = np.array([0.0, -80.0, 80.0, 1e-30, -1e-30, 88.0, -103.0])
        x = rng.choice(choices, (rows, cols))
    elif distribution == "wide":
        # Logits spread as a language model's over its vocabulary: much of a long row's sum comes from terms
        # far below the max, so a kernel that drops the small exponentials is off on every output of the row.
        x = rng.standard_normal((rows, cols)) * 4.0
    elif distribution == "masked":
        # As attention scores arrive: a masked leading block and masked positions (-inf, or a large negative
        # stand-in for it), then one spike anywhere, up to 200 above the rest. The row's last element is never
        # masked. A kernel that takes the max over a prefix, or starts an online max at a masked -inf, fails.
        x = rng.standard_normal((rows, cols))
        for r in range(rows):
            mask = rng.choice([-np.inf, -1e9, -1e4])
            x[r, : int(rng.integers(0, cols))] = mask
            x[r, :-1][rng.random(cols - 1) < 0.1] = mask
            x[r, int(rng.integers(0, cols))] += rng.uniform(0.0, 200.0)
    else:
        raise ValueError(f"unknown distribution {distribution!r}; expected one of {DISTRIBUTIONS}")
    return {"x": np.ascontiguousarray(x, dtype=np.float32)}


def reference(inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
    x = inputs["x"].astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return {"y": e / e.sum(axis=1, keepdims=True)}


def baseline(inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
    """What a numpy user writes; speedups are quoted against this."""
    x = inputs["x"]
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return {"y": e / e.sum(axis=1, keepdims=True)}


def cuda_baseline(cp: Any, inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, Any]:
    """What a CuPy user writes; GPU speedups are quoted against this."""
    x = inputs["x"]
    e = cp.exp(x - x.max(axis=1, keepdims=True))
    return {"y": e / e.sum(axis=1, keepdims=True)}


def roofline(shape: dict[str, int]) -> dict[str, int]:
    n = shape["rows"] * shape["cols"]
    # Read x once, write y once; max, sub, exp (~10 flops), sum, divide.
    return {"bytes": 8 * n, "flops": 14 * n}

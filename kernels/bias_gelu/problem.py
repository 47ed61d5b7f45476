"""bias_gelu: y[r, c] = gelu(x[r, c] + b[c]) with the exact GELU, gelu(z) = z·Φ(z) = 0.5·z·(1 + erf(z/√2)).

numpy has no erf, so this file brings two: a float64 one accurate to ~1e-13 relative for the reference
(``_erfc64``), and the float32 approximation a numpy user without scipy writes for the baseline
(``_erf32``, Abramowitz & Stegun 7.1.26, absolute error ≤ 1.5e-7).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.polynomial import chebyshev

NAME = "bias_gelu"
FAMILY = "elementwise"
ENTRY = "bias_gelu"
SIGNATURE = "void bias_gelu(const float *x, const float *b, float *y, int64_t rows, int64_t cols)"
PARAMS: list[dict[str, Any]] = [
    {"name": "x", "role": "in", "dtype": "float32", "shape": ["rows", "cols"]},
    {"name": "b", "role": "in", "dtype": "float32", "shape": ["cols"]},
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
    {"rows": 96, "cols": 2048},
    # Remainders the shapes above miss: rows of 2 and 6 modulo 8 and columns of 2, 4, 5 and 6 modulo 8 (a
    # kernel's leftover rows and columns after its blocks are code paths of their own).
    {"rows": 6, "cols": 1030},
    {"rows": 10, "cols": 68},
    {"rows": 2, "cols": 133},
    {"rows": 3, "cols": 66},
]
# The MLP of a transformer applies bias + GELU to [tokens, 4·hidden].
BENCHMARK_SHAPES: list[tuple[dict[str, int], float]] = [
    ({"rows": 128, "cols": 4096}, 2.0),
    ({"rows": 512, "cols": 1024}, 1.0),
    ({"rows": 16, "cols": 16384}, 1.0),
    ({"rows": 2048, "cols": 96}, 1.0),
]
# Where z < -3, 1 + erf(z/√2) cancels: the textbook float32 formula (erff) and the A&S baseline are off by
# up to ~2e-7 absolute there, so atol covers that; elsewhere float32 is good to a few ulp, and bf16 or
# half precision (4e-3, 5e-4 relative) or the tanh approximation (~1e-3 absolute) fail.
TOLERANCES = {"float32": {"atol": 1e-6, "rtol": 1e-5}}
DISTRIBUTIONS = ["normal", "uniform", "large", "edge"]
SEED = "seed.c"
TEMPLATE = "template.c"
TEMPLATE_PARAMS: dict[str, list[Any]] = {
    "VEC": [0, 256, 512],
    "ERF": ["libm", "erfc", "poly", "cheb", "table", "table8"],
    # Degree of the "cheb" erfcx polynomial; 10 (relative error ~2e-5) would break rtol 1e-5. Every allowed
    # (ERF, DEG, EXP) stays below half the tolerance on a dense grid of z (tests/test_template_spaces.py).
    "DEG": [11, 12, 13, 14],
    "EXP": ["libm", "inline4", "inline5", "inline6"],
    "SIMD": [0, 1],
    "UNROLL": [1, 2, 4],
    "NT": [0, 1],
    "PF": [0, 1024, 4096],
    "ALIGN": [0, 1],
    "ROWS": [1, 2, 4, 8],
    # The rows processed together adjacent (0) or each from its own part of the matrix (1), as in rmsnorm's template.
    "SPLIT": [0, 1],
}
_EDGE_VALUES = [0.0, -0.0, 1e-30, -1e-30, 1e-6, -1e-6, 3.0, -3.0, -5.5, 5.5, -9.0, 9.0, -1e4, 1e4, -1e30, 1e30]


def template_allows(params: dict[str, Any]) -> bool:
    """Settings that are pointless, duplicates or impossible are skipped: library calls (ERF libm or erfc,
    EXP libm) and omp simd are the plain-C path's (VEC 0); UNROLL interleaves iterations by hand, which SIMD
    leaves to the compiler; EXP only matters for the formulas that call exp themselves, DEG only for
    "cheb"; "table" and "table8" need explicit vectors (their coefficients are permuted across lanes) and call
    no exp (EXP inline4 stands for it); streaming stores need explicit vectors and an aligned loop (VEC > 0,
    ALIGN 1); ALIGN peels to a vector width and ROWS interleaves vector loops (VEC > 0); rows from parts of the
    matrix need several rows at once (SPLIT with ROWS > 1)."""
    vec, erf, exp = params["VEC"], params["ERF"], params["EXP"]
    if vec and (erf in ("libm", "erfc") or exp == "libm" or params["SIMD"]):
        return False
    if params["SIMD"] == 1 and params["UNROLL"] > 1:
        return False
    if erf in ("libm", "erfc") and exp != "libm":
        return False
    if erf != "cheb" and params["DEG"] != 14:
        return False
    if erf in ("table", "table8") and (vec == 0 or exp != "inline4"):
        return False
    if params["NT"] and (vec == 0 or not params["ALIGN"]):
        return False
    if params["ROWS"] > 1 and vec == 0:
        return False
    if params["SPLIT"] and params["ROWS"] == 1:
        return False
    return not (params["ALIGN"] and vec == 0)


def make_inputs(shape: dict[str, int], distribution: str, rng: np.random.Generator) -> dict[str, Any]:
    rows, cols = shape["rows"], shape["cols"]
    b = rng.normal(0.0, 0.5, cols)
    if distribution == "normal":
        x = rng.standard_normal((rows, cols))
    elif distribution == "uniform":
        # Reaches the tail z < -3 where 1 + erf cancels.
        x = rng.uniform(-7.0, 7.0, (rows, cols))
    elif distribution == "large":
        # Magnitudes up to 1e6: gelu(z) = z or -0 to float32 precision, but z·z overflows nothing here.
        x = rng.standard_normal((rows, cols)) * 10.0 ** rng.uniform(0.0, 6.0, (rows, cols))
    elif distribution == "edge":
        x = rng.choice(np.array(_EDGE_VALUES), (rows, cols))
        b = np.where(rng.random(cols) < 0.5, 0.0, b)
    else:
        raise ValueError(f"unknown distribution {distribution!r}; expected one of {DISTRIBUTIONS}")
    return {"x": np.ascontiguousarray(x, dtype=np.float32), "b": np.ascontiguousarray(b, dtype=np.float32)}


def reference(inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
    # z is rounded to float32 first, as every kernel computes x + b in float32.
    z = (inputs["x"] + inputs["b"]).astype(np.float64)
    return {"y": 0.5 * z * _erfc64(-z / math.sqrt(2.0))}


def baseline(inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
    """What a numpy user writes without scipy (numpy has no erf); speedups are quoted against this."""
    z = inputs["x"] + inputs["b"]
    with np.errstate(over="ignore"):  # z·z overflows to inf for |z| > 1.8e19, and exp(-inf) = 0 is right
        return {"y": np.float32(0.5) * z * (np.float32(1.0) + _erf32(z * np.float32(1.0 / math.sqrt(2.0))))}


def roofline(shape: dict[str, int]) -> dict[str, int]:
    rows, cols = shape["rows"], shape["cols"]
    n = rows * cols
    # Read x and b, write y. Flops are a lower bound (a floor for "impossible" timings): the add, three
    # multiplies and an erf of at least a short polynomial; a library erf or exp costs more.
    return {"bytes": 4 * (2 * n + cols), "flops": 10 * n}


# --- float32 erf for the baseline ---------------------------------------------------------------------
_AS_P = np.float32(0.3275911)
_AS_A = [np.float32(c) for c in (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)]


def _erf32(v: np.ndarray) -> np.ndarray:
    """erf in float32 by Abramowitz & Stegun 7.1.26 (absolute error ≤ 1.5e-7), the formula found in
    numpy answers; scipy.special.erf would be the other choice, but scipy is not a dependency."""
    a = np.abs(v)
    t = np.float32(1.0) / (np.float32(1.0) + _AS_P * a)
    poly = t * (_AS_A[0] + t * (_AS_A[1] + t * (_AS_A[2] + t * (_AS_A[3] + t * _AS_A[4]))))
    return np.copysign(np.float32(1.0) - poly * np.exp(-a * a), v)


# --- float64 erfc for the reference -------------------------------------------------------------------
# erfc(u) = erfcx(u)·exp(-u²) for u ≥ 0, where erfcx(u) = exp(u²)·erfc(u) is smooth and slowly varying on
# [0, ∞). Mapping u = K(1+t)/(1-t) turns [0, ∞) into [-1, 1), where a degree-24 Chebyshev interpolant of
# erfcx is accurate to ~1e-13 relative (checked against math.erfc in tests/test_problems.py). The
# coefficients are computed at import from math.erfc, so nothing here is a magic constant; the point is
# speed: evaluating this on a million values takes milliseconds, math.erfc element by element 0.2 s.
_ERFCX_K = 3.0
_ERFCX_DEGREE = 24


def _erfcx_scalar(u: float) -> float:
    if u < 25.0:
        return math.erfc(u) * math.exp(u * u)
    # Asymptotic series, accurate to double precision for u ≥ 25 (terms fall below 1e-17 by the 6th).
    term, total = 1.0, 1.0
    for n in range(1, 8):
        term *= -(2 * n - 1) / (2.0 * u * u)
        total += term
    return total / (u * math.sqrt(math.pi))


def _erfcx_on_t(t: np.ndarray) -> np.ndarray:
    u = _ERFCX_K * (1.0 + t) / (1.0 - t)
    return np.array([_erfcx_scalar(float(v)) for v in u])


# Interpolation at the Chebyshev points of the first kind, which avoid t = 1 (u = ∞).
_ERFCX_NODES = np.cos(np.pi * (np.arange(_ERFCX_DEGREE + 1) + 0.5) / (_ERFCX_DEGREE + 1))
_ERFCX_COEFFS: np.ndarray = chebyshev.chebfit(_ERFCX_NODES, _erfcx_on_t(_ERFCX_NODES), _ERFCX_DEGREE)


def _erfc64(u: np.ndarray) -> np.ndarray:
    """erfc in float64 with ~1e-13 relative error wherever the result is a normal double."""
    flat = np.asarray(u, dtype=np.float64).ravel()
    out = np.empty_like(flat)
    # Chunks that stay in cache make the 24-step Clenshaw recurrence several times faster than whole arrays.
    for start in range(0, flat.size, _CHUNK):
        out[start : start + _CHUNK] = _erfc64_chunk(flat[start : start + _CHUNK])
    return out.reshape(np.shape(u))


_CHUNK = 8192


def _erfc64_chunk(u: np.ndarray) -> np.ndarray:
    a = np.abs(u)
    with np.errstate(invalid="ignore", over="ignore"):  # a = inf: t = nan, settled by exp(-inf) = 0 below
        t = (a - _ERFCX_K) / (a + _ERFCX_K)
        # Clenshaw's recurrence for the Chebyshev series, in place.
        two_t = 2.0 * t
        b1 = np.zeros_like(t)
        b2 = np.zeros_like(t)
        for c in _ERFCX_COEFFS[:0:-1]:
            b0 = two_t * b1
            b0 += c
            b0 -= b2
            b1, b2 = b0, b1
        erfcx = t * b1
        erfcx += _ERFCX_COEFFS[0]
        erfcx -= b2
        tail = erfcx * np.exp(-a * a)
    tail[np.isinf(a)] = 0.0
    return np.where(u >= 0.0, tail, 2.0 - tail)

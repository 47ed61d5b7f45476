"""matmul_bf16: c = a @ b with bfloat16 inputs and a float32 result, on the CPU (a user's problem folder).

A fixture of tests/hostile: no built-in CPU problem has bfloat16 inputs, and the CPU judge must take them as it
takes float ones -- their bits are uint16 -- varying them between timed calls so that no kernel gains by
remembering the answers of inputs it has seen (tests/hostile/memoizes_changed_rows.c -DBF16_INPUTS).
"""

from __future__ import annotations

from typing import Any

import numpy as np

NAME = "matmul_bf16"
ENTRY = "matmul_bf16"
SIGNATURE = "void matmul_bf16(const uint16_t *a, const uint16_t *b, float *c, int64_t m, int64_t n, int64_t k)"
PARAMS: list[dict[str, Any]] = [
    {"name": "a", "role": "in", "dtype": "bfloat16", "shape": ["m", "k"]},
    {"name": "b", "role": "in", "dtype": "bfloat16", "shape": ["k", "n"]},
    {"name": "c", "role": "out", "dtype": "float32", "shape": ["m", "n"]},
    {"name": "m", "role": "size", "dtype": "int64"},
    {"name": "n", "role": "size", "dtype": "int64"},
    {"name": "k", "role": "size", "dtype": "int64"},
]
VALIDATION_SHAPES: list[dict[str, int]] = [
    {"m": 1, "n": 1, "k": 1},
    {"m": 5, "n": 3, "k": 7},
    {"m": 17, "n": 33, "k": 65},
]
BENCHMARK_SHAPES: list[tuple[dict[str, int], float]] = [({"m": 256, "n": 256, "k": 256}, 1.0)]
# float32 accumulation of exact products of bfloat16 values: within a few float32 steps of the sum.
TOLERANCES = {"float32": {"atol": 1e-4, "rtol": 1e-4}}
DISTRIBUTIONS = ["normal"]
SEED = "seed.c"


def _to_bf16(values: np.ndarray) -> np.ndarray:
    bits = np.asarray(values, dtype=np.float32).view(np.uint32)
    return ((bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)).astype(np.uint16)


def _from_bf16(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def make_inputs(shape: dict[str, int], distribution: str, rng: np.random.Generator) -> dict[str, Any]:
    if distribution != "normal":
        raise ValueError(f"unknown distribution {distribution!r}; expected one of {DISTRIBUTIONS}")
    a = rng.standard_normal((shape["m"], shape["k"])).astype(np.float32)
    b = rng.standard_normal((shape["k"], shape["n"])).astype(np.float32)
    return {"a": np.ascontiguousarray(_to_bf16(a)), "b": np.ascontiguousarray(_to_bf16(b))}


def reference(inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
    return {"c": _from_bf16(inputs["a"]).astype(np.float64) @ _from_bf16(inputs["b"]).astype(np.float64)}


def baseline(inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
    return {"c": _from_bf16(inputs["a"]) @ _from_bf16(inputs["b"])}


def roofline(shape: dict[str, int]) -> dict[str, int]:
    m, n, k = shape["m"], shape["n"], shape["k"]
    return {"bytes": 2 * (m * k + k * n) + 4 * m * n, "flops": 2 * m * n * k}

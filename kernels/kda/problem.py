"""kda: Kimi Delta Attention, the gated delta rule with per-channel decay, in its recurrent form.

For each head h and step t, with S the [DK, DV] state of the head:

    S_t = (I − β_t k_t k_tᵀ) · Diag(exp(g_t)) · S_{t−1} + β_t k_t v_tᵀ
    o_t = S_tᵀ q_t

``state`` holds S_0 on entry and S_T on return. Inputs are shaped as real models feed the kernel: k is
L2-normalised per head, g ≤ 0 (log of a decay in (0, 1]), β in (0, 1).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

NAME = "kda"
FAMILY = "linear-attention"
ENTRY = "kda"
SIGNATURE = (
    "void kda(const float *q, const float *k, const float *v, const float *g, const float *beta, "
    "float *o, float *state, int64_t T, int64_t H, int64_t DK, int64_t DV)"
)
PARAMS: list[dict[str, Any]] = [
    {"name": "q", "role": "in", "dtype": "float32", "shape": ["T", "H", "DK"]},
    {"name": "k", "role": "in", "dtype": "float32", "shape": ["T", "H", "DK"]},
    {"name": "v", "role": "in", "dtype": "float32", "shape": ["T", "H", "DV"]},
    {"name": "g", "role": "in", "dtype": "float32", "shape": ["T", "H", "DK"]},
    {"name": "beta", "role": "in", "dtype": "float32", "shape": ["T", "H"]},
    {"name": "o", "role": "out", "dtype": "float32", "shape": ["T", "H", "DV"]},
    {"name": "state", "role": "inout", "dtype": "float32", "shape": ["H", "DK", "DV"]},
    {"name": "T", "role": "size", "dtype": "int64"},
    {"name": "H", "role": "size", "dtype": "int64"},
    {"name": "DK", "role": "size", "dtype": "int64"},
    {"name": "DV", "role": "size", "dtype": "int64"},
]
VALIDATION_SHAPES: list[dict[str, int]] = [
    {"T": 1, "H": 1, "DK": 1, "DV": 1},
    {"T": 1, "H": 2, "DK": 16, "DV": 8},
    {"T": 7, "H": 1, "DK": 5, "DV": 3},
    {"T": 33, "H": 3, "DK": 17, "DV": 1},
    {"T": 9, "H": 2, "DK": 1, "DV": 65},
    {"T": 40, "H": 2, "DK": 31, "DV": 33},
    {"T": 64, "H": 1, "DK": 64, "DV": 100},
    {"T": 32, "H": 2, "DK": 128, "DV": 128},
]
# Head sizes of real models (64, 128); a prefill chunk of T tokens over a few heads.
BENCHMARK_SHAPES: list[tuple[dict[str, int], float]] = [
    ({"T": 64, "H": 2, "DK": 128, "DV": 128}, 2.0),
    ({"T": 128, "H": 4, "DK": 64, "DV": 64}, 1.0),
    ({"T": 256, "H": 1, "DK": 64, "DV": 128}, 1.0),
    ({"T": 32, "H": 8, "DK": 128, "DV": 64}, 1.0),
]
# Unscaled values: tolerance_for multiplies atol by the size of the state and of the outputs (see there).
TOLERANCES = {"float32": {"atol": 5e-6, "rtol": 5e-5}}
DISTRIBUTIONS = ["normal", "uniform", "large", "edge"]
SEED = "seed.c"
TEMPLATE = "template.c"
TEMPLATE_PARAMS: dict[str, list[Any]] = {
    "DVB": [8, 16, 32, 64, 128],
    "COPY": [0, 1],
    "FUSE": [0, 1],
    "SIMD": [0, 1],
    "VEC": [256, 512],
    # 0: the recurrence; > 0: the chunked (WY) form, CHUNK steps at a time (see template.c).
    "CHUNK": [0, 8, 16, 32],
}


# The CUDA kernel (docs/problems.md, "CUDA kernels"): same PARAMS, sizes as long long. The seed is the
# recurrence, one thread per state column; the template is the chunked (WY) form.
CUDA_ENTRY = "kda"
CUDA_SEED = "seed.cu"
CUDA_TEMPLATE = "template.cu"
CUDA_TEMPLATE_PARAMS: dict[str, list[Any]] = {
    "THREADS": [128, 256],
    "DVB": [16, 32, 64],
    "CHUNK": [16, 32],
    "SOLVE": ["forward", "wy"],
}
# Prefill-sized sequences over many heads: enough blocks for a GPU, and a seed that still runs in milliseconds.
CUDA_BENCHMARK_SHAPES: list[tuple[dict[str, int], float]] = [
    ({"T": 1024, "H": 16, "DK": 128, "DV": 128}, 2.0),
    ({"T": 2048, "H": 8, "DK": 64, "DV": 64}, 1.0),
    ({"T": 512, "H": 32, "DK": 128, "DV": 64}, 1.0),
]


def template_allows(params: dict[str, Any]) -> bool:
    """A block narrower than one 512-bit vector leaves half of each vector idle. The chunked form always
    works on a contiguous buffer (COPY 1), has no passes to fuse or omp simd loops (FUSE 1, SIMD 0), and
    holds at most 8 vectors of a state row in registers (DVB at most 8 vectors of VEC bits)."""
    if params["VEC"] == 512 and params["DVB"] < 16:
        return False
    if params["CHUNK"] > 0:
        lanes = params["VEC"] // 32
        return params["COPY"] == 1 and params["FUSE"] == 1 and params["SIMD"] == 0 and params["DVB"] <= 8 * lanes
    return True


def cuda_template_allows(params: dict[str, Any]) -> bool:
    """Every setting fits the smallest shared memory of the CUDA targets (99 KiB: sm_86, sm_89, sm_120) at
    DK = 128, whose chunk of 32 steps leaves no room for 64 columns."""
    return not (params["CHUNK"] == 32 and params["DVB"] == 64)


def tolerance_for(dtype: str, shape: dict[str, int], inputs: dict[str, Any]) -> dict[str, float]:
    """TOLERANCES with atol scaled to the trial: S is a decayed mix of the initial state and of the v_t,
    and o_t = S_tᵀ q_t is as large as S times ‖q_t‖."""
    base = TOLERANCES[dtype]
    state_scale = max(_rms(inputs["v"]), _rms(inputs["state"]))
    q_norm = _rms(inputs["q"]) * math.sqrt(shape["DK"])
    return {"atol": base["atol"] * max(state_scale * max(q_norm, 1.0), 1e-30), "rtol": base["rtol"]}


def _rms(x: np.ndarray) -> float:
    return math.sqrt(float(np.mean(np.square(x, dtype=np.float64)))) if x.size else 0.0


def make_inputs(shape: dict[str, int], distribution: str, rng: np.random.Generator) -> dict[str, Any]:
    t, h, dk, dv = shape["T"], shape["H"], shape["DK"], shape["DV"]
    # q carries attention's 1/sqrt(DK) scale, k is a unit vector per head.
    q = rng.standard_normal((t, h, dk)) / math.sqrt(dk)
    k = rng.standard_normal((t, h, dk))
    v = rng.standard_normal((t, h, dv))
    state = rng.standard_normal((h, dk, dv)) * 0.5
    if distribution == "normal":
        # Decays near 1 (long memory), as trained models learn them: g = log σ(x) with x ~ N(3, 1).
        g = _log_sigmoid(rng.normal(3.0, 1.0, (t, h, dk)))
        beta = _sigmoid(rng.standard_normal((t, h)))
    elif distribution == "uniform":
        q = rng.uniform(-1.0, 1.0, (t, h, dk)) * math.sqrt(3.0 / dk)
        v = rng.uniform(-2.0, 2.0, (t, h, dv))
        g = -rng.uniform(0.0, 2.0, (t, h, dk))
        beta = rng.uniform(0.01, 0.99, (t, h))
    elif distribution == "large":
        # Values and memory of large magnitude; the decay keeps S bounded by them.
        v = v * 1e3
        state = state * 1e3
        q = q * 30.0
        g = -np.logaddexp(0.0, rng.normal(-2.0, 1.5, (t, h, dk)))  # -softplus(x)
        beta = _sigmoid(rng.normal(0.0, 3.0, (t, h)))
    elif distribution == "edge":
        # g at 0 (no decay) or very negative (the state is forgotten); β at 1e-6 (the step hardly writes)
        # or 1 − 1e-6 (the k direction is overwritten); some v and q exactly zero.
        g = rng.choice(np.array([-1e-7, -1e-3, -0.5, -30.0, -80.0]), (t, h, dk))
        beta = rng.choice(np.array([1e-6, 0.5, 1.0 - 1e-6]), (t, h))
        v = np.where(rng.random((t, h, 1)) < 0.2, 0.0, v)
        q = np.where(rng.random((t, h, 1)) < 0.2, 0.0, q)
    else:
        raise ValueError(f"unknown distribution {distribution!r}; expected one of {DISTRIBUTIONS}")
    k = k / np.linalg.norm(k, axis=-1, keepdims=True)
    f32 = np.float32
    return {
        "q": np.ascontiguousarray(q, dtype=f32),
        "k": np.ascontiguousarray(k, dtype=f32),
        "v": np.ascontiguousarray(v, dtype=f32),
        "g": np.ascontiguousarray(np.minimum(g, 0.0), dtype=f32),
        "beta": np.ascontiguousarray(np.clip(beta, 1e-6, 1.0 - 1e-6), dtype=f32),
        "state": np.ascontiguousarray(state, dtype=f32),
    }


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.asarray(1.0 / (1.0 + np.exp(-x)))


def _log_sigmoid(x: np.ndarray) -> np.ndarray:
    return np.asarray(-np.logaddexp(0.0, -x))


def _recurrence(inputs: dict[str, Any], dtype: type[np.floating[Any]]) -> dict[str, np.ndarray]:
    q, k, v, g, beta = (np.asarray(inputs[n], dtype=dtype) for n in ("q", "k", "v", "g", "beta"))
    state = np.array(inputs["state"], dtype=dtype)
    o = np.empty(v.shape, dtype=dtype)
    for t in range(q.shape[0]):
        state *= np.exp(g[t])[:, :, None]  # Diag(exp(g_t)) · S
        kv = np.einsum("hk,hkv->hv", k[t], state)  # k_tᵀ S
        state += (beta[t][:, None] * k[t])[:, :, None] * (v[t] - kv)[:, None, :]  # − β k kᵀ S + β k vᵀ
        o[t] = np.einsum("hk,hkv->hv", q[t], state)
    return {"o": o, "state": state}


def reference(inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
    return _recurrence(inputs, np.float64)


def baseline(inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, np.ndarray]:
    """What a numpy user writes: a float32 loop over T, every head at once in each step."""
    return _recurrence(inputs, np.float32)


def cuda_baseline(cp: Any, inputs: dict[str, Any], shape: dict[str, int]) -> dict[str, Any]:
    """What a CuPy user writes: the float32 recurrence stepped from Python, every head at once per step."""
    q, k, v, g, beta = (inputs[n] for n in ("q", "k", "v", "g", "beta"))
    state = inputs["state"].copy()
    o = cp.empty_like(v)
    for t in range(shape["T"]):
        state *= cp.exp(g[t])[:, :, None]
        kv = cp.einsum("hk,hkv->hv", k[t], state)
        state += (beta[t][:, None] * k[t])[:, :, None] * (v[t] - kv)[:, None, :]
        o[t] = cp.einsum("hk,hkv->hv", q[t], state)
    return {"o": o, "state": state}


def roofline(shape: dict[str, int]) -> dict[str, int]:
    t, h, dk, dv = shape["T"], shape["H"], shape["DK"], shape["DV"]
    # Read q, k, g, v, β once and the state twice (in, out), write o. Flops are a lower bound (a floor for
    # "impossible" timings): per step, head and state element, one FMA each for kᵀ(DS), the update
    # D·S + k δᵀ and S_tᵀq; the exponentials are not counted.
    elements = t * h * (3 * dk + 2 * dv + 1) + 2 * h * dk * dv
    return {"bytes": 4 * elements, "flops": 6 * t * h * dk * dv}

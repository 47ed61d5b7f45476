"""A problem's streaming copy: a C kernel with the problem's signature that moves the problem's bytes and does
nothing else, the practical floor of a memory-bound kernel's time on this machine.

Why: a roofline fraction divides a kernel's time into bytes over a bandwidth measured at another time, and on a
shared machine the bandwidth moves from hour to hour (copies timed here read 15-20 GB/s in the hour after a
calibration of 26). Timed as a reference in the same benchmark as the kernel, interleaved round by round, the copy
gives the fraction as a paired ratio with an interval: copy time over kernel time.

What the copy does: every float32 output is written once with streaming stores (x86 with AVX-512 or AVX; plain
stores elsewhere), from the sum of the float32 inputs of the same shape, each read once. Which stores move
bytes faster depends on the machine: on one of this project's machines (AMD EPYC under KVM) a streaming copy
moved 3.7-4.6 GB/s and one with plain stores 14-15, so ``streaming=False`` gives the same copy with plain
stores, and a floor is the faster of the two timed in the same rounds. Inputs of other shapes
(a weight row, a bias) are not read: they are a row long and live in cache. Its outputs are not the problem's
answer, so it is only ever a reference, never validated. Its locals are named kf_*, which no parameter of a
problem is expected to be.
"""

from __future__ import annotations

import math

from engine.problems import Param, Problem

__all__ = ["copy_bytes", "stream_copy_source"]

STREAMS = 4
"""Chunks of each array the copy walks together: memory streams in flight at once. Copies timed on this
project's machine (one core) reached about 16 GB/s with one stream, 20-21 with two to eight."""


def _groups(problem: Problem) -> list[tuple[tuple[str, ...], list[Param], list[Param]]]:
    """The problem's float32 arrays grouped by shape: (shape, inputs, outputs), only shapes with an output."""
    arrays = [p for p in problem.params if p.is_array and p.dtype == "float32"]
    shapes = sorted({p.shape for p in arrays if p.role in ("out", "inout")})
    return [
        (
            shape,
            [p for p in arrays if p.shape == shape and p.role in ("in", "inout")],
            [p for p in arrays if p.shape == shape and p.role in ("out", "inout")],
        )
        for shape in shapes
    ]


def stream_copy_source(problem: Problem, *, streaming: bool = True) -> str | None:
    """The C source of ``problem``'s streaming copy (with ``streaming=False``, the same copy with plain stores);
    None when the problem has an array that is not float32 (the copy would not move its bytes) or its outputs read
    nothing of their shape (a reduction's output)."""
    if any(p.is_array and p.dtype != "float32" for p in problem.params):
        return None
    groups = _groups(problem)
    if not groups or any(not inputs for _, inputs, _ in groups):
        return None
    loops = []
    for shape, inputs, outputs in groups:
        count = " * ".join(f"(int64_t){d}" for d in shape) or "1"
        scalar = " + ".join(f"{p.name}[kf_i]" for p in inputs)
        first = outputs[0].name
        tails = "\n".join(f"            {p.name}[kf_i] = kf_t;" for p in outputs)

        def chunked(put: str, inputs: list[Param] = inputs, outputs: list[Param] = outputs) -> str:
            total = " + ".join(f"kf_load({p.name} + kf_j)" for p in inputs)
            stores = "\n".join(f"                    {put}({p.name} + kf_j, kf_s);" for p in outputs)
            return f"""            for (int64_t kf_c = 0; kf_c < kf_q; kf_c += KF_LANES) {{
#pragma GCC unroll {STREAMS}
                for (int kf_k = 0; kf_k < KF_STREAMS; kf_k++) {{
                    const int64_t kf_j = kf_i + kf_k * kf_q + kf_c;
                    const kf_v kf_s = {total};
{stores}
                }}
            }}"""

        # The first output is aligned after the head; the others stream only if they are aligned alike.
        aligned = " && ".join(f"((uintptr_t)({p.name} + kf_i) % KF_ALIGN) == 0" for p in outputs)
        loops.append(
            f"""    {{
        const int64_t kf_n = {count};
        int64_t kf_i = 0;
        for (; kf_i < kf_n && ((uintptr_t)({first} + kf_i) % KF_ALIGN) != 0; kf_i++) {{
            const float kf_t = {scalar};
{tails}
        }}
        /* KF_STREAMS chunks of kf_q floats, walked together: as many memory streams in flight as a tuned kernel
         * keeps (see STREAMS). */
        const int64_t kf_q = (kf_n - kf_i) / KF_STREAMS / KF_LANES * KF_LANES;
        if ({aligned}) {{
{chunked("kf_stream")}
        }} else {{
{chunked("kf_store")}
        }}
        for (kf_i += KF_STREAMS * kf_q; kf_i < kf_n; kf_i++) {{
            const float kf_t = {scalar};
{tails}
        }}
    }}"""
        )
    body = "\n".join(loops)
    kind = "streaming" if streaming else "plain-store"
    return f"""/* The {kind} copy of {problem.name} (engine/harness/stream_copy.py): moves its bytes, no more. */
#include <stdint.h>
#if defined(__SSE__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
#define KF_LANES 16
typedef __m512 kf_v;
#define kf_load(p) _mm512_loadu_ps(p)
#define kf_stream(p, v) _mm512_stream_ps((p), (v))
#define kf_store(p, v) _mm512_storeu_ps((p), (v))
#elif defined(__AVX__)
#define KF_LANES 8
typedef __m256 kf_v;
#define kf_load(p) _mm256_loadu_ps(p)
#define kf_stream(p, v) _mm256_stream_ps((p), (v))
#define kf_store(p, v) _mm256_storeu_ps((p), (v))
#else
#define KF_LANES 1
typedef float kf_v;
#define kf_load(p) (*(p))
#define kf_stream(p, v) (*(p) = (v))
#define kf_store(p, v) (*(p) = (v))
#endif
#define KF_ALIGN (KF_LANES * 4)
#define KF_STREAMS {STREAMS}
#define KF_STREAMING {int(streaming)}
#if !KF_STREAMING
#undef kf_stream
#define kf_stream(p, v) kf_store((p), (v))
#endif

{problem.signature} {{
{body}
#if defined(__SSE__) && KF_STREAMING
    _mm_sfence();
#endif
}}
"""


def copy_bytes(problem: Problem, shape: dict[str, int]) -> int:
    """Bytes the streaming copy of ``problem`` reads and writes at ``shape``."""
    return sum(4 * math.prod(p.dims(shape)) for _, inputs, outputs in _groups(problem) for p in (*inputs, *outputs))

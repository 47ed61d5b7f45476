/* Softmax template (CUDA) for bfloat16 rows: x and y hold bfloat16 bit patterns, every sum and exponential is
 * float32, and y is rounded to the nearest bfloat16 (ties to even) once. One block per row. Parameters (as in
 * kernels/softmax/template.cu, whose float32 kernel this one mirrors):
 *   THREADS  threads per block, all on one row
 *   VEC      8: 16-byte loads and stores of 8 bfloat16 (uint4) when every row is 16-byte aligned (cols a
 *            multiple of 8 and aligned x and y), 2-byte ones otherwise; 1: always 2-byte
 *   ONLINE   0: a max pass, then a pass summing exp(x - max); 1: one pass keeps a running max and rescales
 *            its sum when the max grows
 *   KEEP     elements per thread kept in registers (as float32): a row of at most THREADS * KEEP elements is
 *            read from memory once; longer rows are read again. 0: never kept
 *   NT       1: the last read of x and the writes of y are streaming (__ldcs / __stcs, evict-first): they do
 *            not push lines worth keeping out of L2; 0: plain (__ldg and ordinary stores)
 * Reductions are by warp shuffles, then across the block's warps through shared memory.
 */
// kf-launch: grid=(rows, 1, 1) block=({{THREADS}}, 1, 1) shared=0

#define THREADS {{THREADS}}
#define VEC {{VEC}}
#define ONLINE {{ONLINE}}
#define KEEP {{KEEP}}
#define NT {{NT}}
#define WARPS (THREADS / 32)
#define FULL 0xffffffffu

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

/* exp(x) as 2^(x log2 e): one ex2 instruction where expf is a long inlined sequence (relative error ~1e-6 for
 * the |x| < 20 that matter here; below, the result is negligible next to the row's sum). */
__device__ __forceinline__ float fast_exp(float x) { return exp2f(x * 1.44269504088896341f); }

/* Shared memory of the reductions: one slot per warp for a max and a sum. */
struct Scratch {
    float m[WARPS], s[WARPS];
};

/* (m, s) += (m2, s2), where s is a sum of exp(x - m): the smaller max's sum is rescaled to the larger. */
__device__ __forceinline__ void merge(float &m, float &s, float m2, float s2) {
    const float top = fmaxf(m, m2);
    if (top == neg_inf()) return; /* both empty: -inf - -inf would be NaN */
    s = s * fast_exp(m - top) + s2 * fast_exp(m2 - top);
    m = top;
}

__device__ __forceinline__ void add_online(float &m, float &s, float v) {
    if (v > m) {
        s = s * fast_exp(m - v) + 1.0f;
        m = v;
    } else if (v != neg_inf()) {
        s += fast_exp(v - m); /* a masked -inf adds nothing, and while m is -inf too, -inf - -inf is NaN */
    }
}

/* Every warp reduces its lanes, lane 0 publishes, then every warp reduces the published values itself (the
 * same values in the same order: every thread gets the same bits, with no second broadcast). */
__device__ float block_max(float v, Scratch &sh) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
    if ((threadIdx.x & 31) == 0) sh.m[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (threadIdx.x & 31) < WARPS ? sh.m[threadIdx.x & 31] : neg_inf();
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
    __syncthreads(); /* the scratch is free for the next reduction */
    return v;
}

__device__ float block_sum(float v, Scratch &sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    if ((threadIdx.x & 31) == 0) sh.s[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (threadIdx.x & 31) < WARPS ? sh.s[threadIdx.x & 31] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    __syncthreads();
    return v;
}

__device__ void block_online(float &m, float &s, Scratch &sh) {
    for (int o = 16; o > 0; o >>= 1) merge(m, s, __shfl_xor_sync(FULL, m, o), __shfl_xor_sync(FULL, s, o));
    if ((threadIdx.x & 31) == 0) {
        sh.m[threadIdx.x >> 5] = m;
        sh.s[threadIdx.x >> 5] = s;
    }
    __syncthreads();
    const bool mine = (threadIdx.x & 31) < WARPS;
    m = mine ? sh.m[threadIdx.x & 31] : neg_inf();
    s = mine ? sh.s[threadIdx.x & 31] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) merge(m, s, __shfl_xor_sync(FULL, m, o), __shfl_xor_sync(FULL, s, o));
    __syncthreads();
}

/* bfloat16 is the top half of a float32: widening is a shift, narrowing rounds to nearest, ties to even. */
__device__ __forceinline__ float widen(unsigned int bits16) { return __uint_as_float(bits16 << 16); }

__device__ __forceinline__ unsigned int narrow(float f) {
    const unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x0040u; /* NaN stays a quiet NaN */
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

/* One item: W consecutive bfloat16 (W = 8: one uint4) as floats. `last` marks the row's final read of x. */
template <int W>
__device__ __forceinline__ void load(const unsigned short *p, float (&v)[W], bool last) {
    if constexpr (W == 8) {
        const uint4 q = (NT && last) ? __ldcs(reinterpret_cast<const uint4 *>(p)) : __ldg(reinterpret_cast<const uint4 *>(p));
        const unsigned int words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            v[2 * k] = widen(words[k] & 0xffffu); /* little-endian: the lower half is the earlier element */
            v[2 * k + 1] = widen(words[k] >> 16);
        }
    } else {
        v[0] = widen((NT && last) ? __ldcs(p) : __ldg(p));
    }
}

template <int W>
__device__ __forceinline__ void store(unsigned short *p, const float (&v)[W]) {
    if constexpr (W == 8) {
        unsigned int words[4];
#pragma unroll
        for (int k = 0; k < 4; k++) words[k] = narrow(v[2 * k]) | (narrow(v[2 * k + 1]) << 16);
        const uint4 q = make_uint4(words[0], words[1], words[2], words[3]);
        if (NT)
            __stcs(reinterpret_cast<uint4 *>(p), q);
        else
            *reinterpret_cast<uint4 *>(p) = q;
    } else {
        const unsigned short h = (unsigned short)narrow(v[0]);
        if (NT)
            __stcs(p, h);
        else
            *p = h;
    }
}

/* The softmax of one row of n items of W bfloat16. */
template <int W, bool KEPT>
__device__ void softmax_row(const unsigned short *__restrict__ xr, unsigned short *__restrict__ yr, long long n, Scratch &sh) {
    const int t = threadIdx.x;
    constexpr int K = KEPT ? KEEP / W : 1; /* items each thread keeps */
    if (KEPT && n <= (long long)K * THREADS) {
        float v[K][W];
        float m = neg_inf();
#pragma unroll
        for (int k = 0; k < K; k++) {
            const long long i = t + (long long)k * THREADS;
            if (i < n) {
                load<W>(xr + i * W, v[k], true);
#pragma unroll
                for (int w = 0; w < W; w++) m = fmaxf(m, v[k][w]);
            }
        }
        m = block_max(m, sh);
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < K; k++) {
            if (t + (long long)k * THREADS < n) {
#pragma unroll
                for (int w = 0; w < W; w++) {
                    v[k][w] = fast_exp(v[k][w] - m);
                    s += v[k][w];
                }
            }
        }
        const float inv = 1.0f / block_sum(s, sh);
#pragma unroll
        for (int k = 0; k < K; k++) {
            const long long i = t + (long long)k * THREADS;
            if (i < n) {
#pragma unroll
                for (int w = 0; w < W; w++) v[k][w] *= inv;
                store<W>(yr + i * W, v[k]);
            }
        }
        return;
    }
    float v[W];
#if ONLINE
    float m = neg_inf(), s = 0.0f;
    for (long long i = t; i < n; i += THREADS) {
        load<W>(xr + i * W, v, false);
#pragma unroll
        for (int w = 0; w < W; w++) add_online(m, s, v[w]);
    }
    block_online(m, s, sh);
#else
    float m = neg_inf();
    for (long long i = t; i < n; i += THREADS) {
        load<W>(xr + i * W, v, false);
#pragma unroll
        for (int w = 0; w < W; w++) m = fmaxf(m, v[w]);
    }
    m = block_max(m, sh);
    float s = 0.0f;
    for (long long i = t; i < n; i += THREADS) {
        load<W>(xr + i * W, v, false);
#pragma unroll
        for (int w = 0; w < W; w++) s += fast_exp(v[w] - m);
    }
    s = block_sum(s, sh);
#endif
    const float inv = 1.0f / s;
    for (long long i = t; i < n; i += THREADS) {
        load<W>(xr + i * W, v, true);
#pragma unroll
        for (int w = 0; w < W; w++) v[w] = fast_exp(v[w] - m) * inv;
        store<W>(yr + i * W, v);
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
    softmax_bf16(const unsigned short *x, unsigned short *y, long long rows, long long cols) {
    __shared__ Scratch sh;
    const unsigned short *xr = x + (long long)blockIdx.x * cols;
    unsigned short *yr = y + (long long)blockIdx.x * cols;
#if VEC == 8
    /* The vector path keeps rows in registers (KEEP); the scalar path is the fallback for unaligned rows and
     * streams them. The choice is the same for every row (a row starts 2 * cols bytes after the previous),
     * so the whole block takes one path. */
    if ((cols & 7) == 0 && ((reinterpret_cast<unsigned long long>(x) | reinterpret_cast<unsigned long long>(y)) & 15) == 0) {
        softmax_row<8, (KEEP > 0)>(xr, yr, cols / 8, sh);
        return;
    }
#endif
    softmax_row<1, (KEEP > 0 && VEC == 1)>(xr, yr, cols, sh);
}

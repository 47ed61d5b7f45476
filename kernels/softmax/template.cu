/* Softmax template (CUDA). One block per row. Parameters (VEC, REDUCE, ONLINE and KEEP mean the same in the
 * row-reduction family's other CUDA templates):
 *   THREADS  threads per block, all on one row
 *   VEC      4: float4 loads and stores when every row is 16-byte aligned (cols a multiple of 4 and aligned
 *            x and y), scalar ones otherwise; 1: always scalar
 *   REDUCE   warp: reductions by warp shuffles, then across the block's warps through shared memory;
 *            smem: a tree in shared memory over all the block's threads
 *   ONLINE   0: a max pass, then a pass summing exp(x - max); 1: one pass keeps a running max and rescales
 *            its sum when the max grows
 *   KEEP     elements per thread kept in registers: a row of at most THREADS * KEEP elements is read from
 *            memory once (max, sum and output from registers); longer rows are read again. 0: never kept
 * Loads go through the read-only path (__ldg).
 */
// kf-launch: grid=(rows, 1, 1) block=({{THREADS}}, 1, 1) shared=0

#define THREADS {{THREADS}}
#define VEC {{VEC}}
#define REDUCE_{{REDUCE}} 1
#define ONLINE {{ONLINE}}
#define KEEP {{KEEP}}
#define WARPS (THREADS / 32)
#define FULL 0xffffffffu

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

/* exp(x) as 2^(x log2 e): one ex2 instruction where expf is a long inlined sequence (relative error ~1e-6 for
 * the |x| < 20 that matter here; below, the result is negligible next to the row's sum). */
__device__ __forceinline__ float fast_exp(float x) { return exp2f(x * 1.44269504088896341f); }

/* Shared memory of the reductions: one slot per warp (warp) or per thread (smem), for a max and a sum. */
struct Scratch {
#if REDUCE_warp
    float m[WARPS], s[WARPS];
#else
    float m[THREADS], s[THREADS];
#endif
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

#if REDUCE_warp
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
#else
__device__ float block_max(float v, Scratch &sh) {
    sh.m[threadIdx.x] = v;
    __syncthreads();
    for (int half = THREADS / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) sh.m[threadIdx.x] = fmaxf(sh.m[threadIdx.x], sh.m[threadIdx.x + half]);
        __syncthreads();
    }
    v = sh.m[0];
    __syncthreads();
    return v;
}

__device__ float block_sum(float v, Scratch &sh) {
    sh.s[threadIdx.x] = v;
    __syncthreads();
    for (int half = THREADS / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) sh.s[threadIdx.x] += sh.s[threadIdx.x + half];
        __syncthreads();
    }
    v = sh.s[0];
    __syncthreads();
    return v;
}

__device__ void block_online(float &m, float &s, Scratch &sh) {
    sh.m[threadIdx.x] = m;
    sh.s[threadIdx.x] = s;
    __syncthreads();
    for (int half = THREADS / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) {
            float a = sh.m[threadIdx.x], b = sh.s[threadIdx.x];
            merge(a, b, sh.m[threadIdx.x + half], sh.s[threadIdx.x + half]);
            sh.m[threadIdx.x] = a;
            sh.s[threadIdx.x] = b;
        }
        __syncthreads();
    }
    m = sh.m[0];
    s = sh.s[0];
    __syncthreads();
}
#endif

/* One item: W consecutive floats (W = 4: one float4). */
template <int W>
__device__ __forceinline__ void load(const float *p, float (&v)[W]) {
    if constexpr (W == 4) {
        const float4 q = __ldg(reinterpret_cast<const float4 *>(p));
        v[0] = q.x;
        v[1] = q.y;
        v[2] = q.z;
        v[3] = q.w;
    } else {
        v[0] = __ldg(p);
    }
}

template <int W>
__device__ __forceinline__ void store(float *p, const float (&v)[W]) {
    if constexpr (W == 4)
        *reinterpret_cast<float4 *>(p) = make_float4(v[0], v[1], v[2], v[3]);
    else
        *p = v[0];
}

/* The softmax of one row of n items of W floats. */
template <int W, bool KEPT>
__device__ void softmax_row(const float *__restrict__ xr, float *__restrict__ yr, long long n, Scratch &sh) {
    const int t = threadIdx.x;
    constexpr int K = KEPT ? KEEP / W : 1; /* items each thread keeps */
    if (KEPT && n <= (long long)K * THREADS) {
        float v[K][W];
        float m = neg_inf();
#pragma unroll
        for (int k = 0; k < K; k++) {
            const long long i = t + (long long)k * THREADS;
            if (i < n) {
                load<W>(xr + i * W, v[k]);
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
        load<W>(xr + i * W, v);
#pragma unroll
        for (int w = 0; w < W; w++) add_online(m, s, v[w]);
    }
    block_online(m, s, sh);
#else
    float m = neg_inf();
    for (long long i = t; i < n; i += THREADS) {
        load<W>(xr + i * W, v);
#pragma unroll
        for (int w = 0; w < W; w++) m = fmaxf(m, v[w]);
    }
    m = block_max(m, sh);
    float s = 0.0f;
    for (long long i = t; i < n; i += THREADS) {
        load<W>(xr + i * W, v);
#pragma unroll
        for (int w = 0; w < W; w++) s += fast_exp(v[w] - m);
    }
    s = block_sum(s, sh);
#endif
    const float inv = 1.0f / s;
    for (long long i = t; i < n; i += THREADS) {
        load<W>(xr + i * W, v);
#pragma unroll
        for (int w = 0; w < W; w++) v[w] = fast_exp(v[w] - m) * inv;
        store<W>(yr + i * W, v);
    }
}

extern "C" __global__ void __launch_bounds__(THREADS) softmax(const float *x, float *y, long long rows, long long cols) {
    __shared__ Scratch sh;
    const float *xr = x + (long long)blockIdx.x * cols;
    float *yr = y + (long long)blockIdx.x * cols;
#if VEC == 4
    /* The vector path keeps rows in registers (KEEP); the scalar path is the fallback for unaligned rows and
     * streams them. The choice is the same for every row (a row starts 4 * cols bytes after the previous),
     * so the whole block takes one path. */
    if ((cols & 3) == 0 && ((reinterpret_cast<unsigned long long>(x) | reinterpret_cast<unsigned long long>(y)) & 15) == 0) {
        softmax_row<4, (KEEP > 0)>(xr, yr, cols / 4, sh);
        return;
    }
#endif
    softmax_row<1, (KEEP > 0 && VEC == 1)>(xr, yr, cols, sh);
}

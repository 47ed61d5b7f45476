/* RMSNorm template (CUDA) for bfloat16 rows: x, w and y hold bfloat16 bit patterns, the sum of squares and
 * the scaling are float32, and y is rounded to the nearest bfloat16 (ties to even) once. Parameters (as in
 * kernels/rmsnorm/template.cu, whose float32 kernel this one mirrors):
 *   THREADS  threads per block
 *   ROWS     rows per block: each row is handled by THREADS / ROWS threads (whole warps)
 *   VEC      8: 16-byte loads and stores of 8 bfloat16 (uint4) when x, w and y are 16-byte aligned and cols
 *            is a multiple of 8, 2-byte ones otherwise; 1: always 2-byte
 *   KEEP     elements per thread kept in registers (as float32) between the sum of squares and the output: a
 *            row of at most (THREADS / ROWS) * KEEP elements is read from memory once. 0: always read twice
 *   NT       1: the last read of x and the writes of y are streaming (__ldcs / __stcs, evict-first), so they
 *            do not push w out of L2; 0: plain (__ldg and ordinary stores)
 * The sum of squares is reduced by warp shuffles, then across the row's warps through shared memory.
 */
// kf-launch: grid=(cdiv(rows, {{ROWS}}), 1, 1) block=({{THREADS}}, 1, 1) shared=0

#define THREADS {{THREADS}}
#define ROWS {{ROWS}}
#define VEC {{VEC}}
#define KEEP {{KEEP}}
#define NT {{NT}}
#define GROUP (THREADS / ROWS)
#define GROUP_WARPS (GROUP / 32)
#define FULL 0xffffffffu

/* The sum over the GROUP threads of one row; every thread of the group gets the same bits. Every thread of
 * the block must call it (it synchronises the block), those of a group without a row with v = 0. */
__device__ float group_sum(float v, float *scratch) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    const int lane = threadIdx.x & 31;
    if (lane == 0) scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    v = lane < GROUP_WARPS ? scratch[(threadIdx.x / GROUP) * GROUP_WARPS + lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    __syncthreads(); /* the scratch is free again */
    return v;
}

/* bfloat16 is the top half of a float32: widening is a shift, narrowing rounds to nearest, ties to even. */
__device__ __forceinline__ float widen(unsigned int bits16) { return __uint_as_float(bits16 << 16); }

__device__ __forceinline__ unsigned int narrow(float f) {
    const unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x0040u; /* NaN stays a quiet NaN */
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

/* One item: W consecutive bfloat16 (W = 8: one uint4) as floats. `stream` asks for an evict-first load (with NT). */
template <int W>
__device__ __forceinline__ void load(const unsigned short *p, float (&v)[W], bool stream) {
    if constexpr (W == 8) {
        const uint4 q = (NT && stream) ? __ldcs(reinterpret_cast<const uint4 *>(p)) : __ldg(reinterpret_cast<const uint4 *>(p));
        const unsigned int words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            v[2 * k] = widen(words[k] & 0xffffu); /* little-endian: the lower half is the earlier element */
            v[2 * k + 1] = widen(words[k] >> 16);
        }
    } else {
        v[0] = widen((NT && stream) ? __ldcs(p) : __ldg(p));
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

/* y = x * inv * w for one item. */
template <int W>
__device__ __forceinline__ void scale(unsigned short *yp, float (&v)[W], const unsigned short *wp, float inv) {
    float wv[W];
    load<W>(wp, wv, false);
#pragma unroll
    for (int k = 0; k < W; k++) v[k] = v[k] * inv * wv[k];
    store<W>(yp, v);
}

/* This block's rows, n items of W bfloat16 each. */
template <int W, bool KEPT>
__device__ void rmsnorm_rows(const unsigned short *__restrict__ x, const unsigned short *__restrict__ w,
                             unsigned short *__restrict__ y,
                             long long rows, long long cols, long long n, float eps, float *scratch) {
    const int t = threadIdx.x % GROUP;
    const long long row = (long long)blockIdx.x * ROWS + threadIdx.x / GROUP;
    const long long items = row < rows ? n : 0; /* a group past the last row still joins the reductions */
    const unsigned short *xr = x + (row < rows ? row : 0) * cols;
    unsigned short *yr = y + (row < rows ? row : 0) * cols;
    constexpr int K = KEPT ? KEEP / W : 1; /* items each thread keeps */
    if (KEPT && n <= (long long)K * GROUP) {
        float v[K][W];
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < K; k++) {
            const long long i = t + (long long)k * GROUP;
            if (i < items) {
                load<W>(xr + i * W, v[k], true);
#pragma unroll
                for (int j = 0; j < W; j++) ss += v[k][j] * v[k][j];
            }
        }
        const float inv = 1.0f / sqrtf(group_sum(ss, scratch) / (float)cols + eps);
#pragma unroll
        for (int k = 0; k < K; k++) {
            const long long i = t + (long long)k * GROUP;
            if (i < items) scale<W>(yr + i * W, v[k], w + i * W, inv);
        }
        return;
    }
    float v[W];
    float ss = 0.0f;
    for (long long i = t; i < items; i += GROUP) {
        load<W>(xr + i * W, v, false);
#pragma unroll
        for (int j = 0; j < W; j++) ss += v[j] * v[j];
    }
    const float inv = 1.0f / sqrtf(group_sum(ss, scratch) / (float)cols + eps);
    for (long long i = t; i < items; i += GROUP) {
        load<W>(xr + i * W, v, true);
        scale<W>(yr + i * W, v, w + i * W, inv);
    }
}

extern "C" __global__ void __launch_bounds__(THREADS) rmsnorm_bf16(const unsigned short *x, const unsigned short *w,
                                                                 unsigned short *y, long long rows, long long cols, float eps) {
    __shared__ float scratch[THREADS / 32];
#if VEC == 8
    /* The vector path keeps rows in registers (KEEP); the scalar path is the fallback for unaligned rows and
     * streams them. The choice is the same for every row of every block (a row starts 2 * cols bytes
     * after the previous). */
    const unsigned long long bases = reinterpret_cast<unsigned long long>(x) | reinterpret_cast<unsigned long long>(w) |
                                     reinterpret_cast<unsigned long long>(y);
    if ((cols & 7) == 0 && (bases & 15) == 0) {
        rmsnorm_rows<8, (KEEP > 0)>(x, w, y, rows, cols, cols / 8, eps, scratch);
        return;
    }
#endif
    rmsnorm_rows<1, (KEEP > 0 && VEC == 1)>(x, w, y, rows, cols, cols, eps, scratch);
}

/* RMSNorm template (CUDA). Parameters (KEEP, VEC and NT mean the same in the row-reduction family's other
 * CUDA templates):
 *   THREADS  threads per block
 *   ROWS     rows per block: each row is handled by THREADS / ROWS threads (whole warps), so a short row
 *            does not leave most of a block idle
 *   VEC      4: float4 loads and stores when x, w and y are 16-byte aligned and cols is a multiple of 4,
 *            scalar ones otherwise; 1: always scalar
 *   KEEP     elements per thread kept in registers between the sum of squares and the output: a row of at
 *            most (THREADS / ROWS) * KEEP elements is read from memory once; longer rows are read twice.
 *            0: always read twice
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

/* One item: W consecutive floats (W = 4: one float4). `stream` asks for an evict-first load (with NT). */
template <int W>
__device__ __forceinline__ void load(const float *p, float (&v)[W], bool stream) {
    if constexpr (W == 4) {
        const float4 q = (NT && stream) ? __ldcs(reinterpret_cast<const float4 *>(p)) : __ldg(reinterpret_cast<const float4 *>(p));
        v[0] = q.x;
        v[1] = q.y;
        v[2] = q.z;
        v[3] = q.w;
    } else {
        v[0] = (NT && stream) ? __ldcs(p) : __ldg(p);
    }
}

template <int W>
__device__ __forceinline__ void store(float *p, const float (&v)[W]) {
    if constexpr (W == 4) {
        const float4 q = make_float4(v[0], v[1], v[2], v[3]);
        if (NT)
            __stcs(reinterpret_cast<float4 *>(p), q);
        else
            *reinterpret_cast<float4 *>(p) = q;
    } else {
        if (NT)
            __stcs(p, v[0]);
        else
            *p = v[0];
    }
}

/* y = x * inv * w for one item. */
template <int W>
__device__ __forceinline__ void scale(float *yp, float (&v)[W], const float *wp, float inv) {
    float wv[W];
    load<W>(wp, wv, false);
#pragma unroll
    for (int k = 0; k < W; k++) v[k] = v[k] * inv * wv[k];
    store<W>(yp, v);
}

/* This block's rows, n items of W floats each. */
template <int W, bool KEPT>
__device__ void rmsnorm_rows(const float *__restrict__ x, const float *__restrict__ w, float *__restrict__ y,
                             long long rows, long long cols, long long n, float eps, float *scratch) {
    const int t = threadIdx.x % GROUP;
    const long long row = (long long)blockIdx.x * ROWS + threadIdx.x / GROUP;
    const long long items = row < rows ? n : 0; /* a group past the last row still joins the reductions */
    const float *xr = x + (row < rows ? row : 0) * cols;
    float *yr = y + (row < rows ? row : 0) * cols;
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

extern "C" __global__ void __launch_bounds__(THREADS)
    rmsnorm(const float *x, const float *w, float *y, long long rows, long long cols, float eps) {
    __shared__ float scratch[THREADS / 32];
#if VEC == 4
    /* The vector path keeps rows in registers (KEEP); the scalar path is the fallback for unaligned rows and
     * streams them. The choice is the same for every row of every block (a row starts 4 * cols bytes
     * after the previous). */
    const unsigned long long bases = reinterpret_cast<unsigned long long>(x) | reinterpret_cast<unsigned long long>(w) |
                                     reinterpret_cast<unsigned long long>(y);
    if ((cols & 3) == 0 && (bases & 15) == 0) {
        rmsnorm_rows<4, (KEEP > 0)>(x, w, y, rows, cols, cols / 4, eps, scratch);
        return;
    }
#endif
    rmsnorm_rows<1, (KEEP > 0 && VEC == 1)>(x, w, y, rows, cols, cols, eps, scratch);
}

/* Naive RMSNorm of bfloat16 rows: one block of 256 threads per row; the float32 sum of squares is reduced by a
 * tree in shared memory, then each element is scaled by the row's inverse RMS and by w in float32 and rounded
 * to the nearest bfloat16, ties to even. bfloat16 values travel as their bits (unsigned short). */
// kf-launch: grid=(rows, 1, 1) block=(256, 1, 1) shared=0

#define THREADS 256

__device__ float bf16_to_float(unsigned short h) { return __uint_as_float((unsigned int)h << 16); }

__device__ unsigned short float_to_bf16(float f) {
    const unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x0040u); /* NaN stays NaN */
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

extern "C" __global__ void rmsnorm_bf16(const unsigned short *x, const unsigned short *w, unsigned short *y, long long rows,
                                        long long cols, float eps) {
    __shared__ float partial[THREADS];
    const int t = threadIdx.x;
    const unsigned short *xr = x + (long long)blockIdx.x * cols;
    unsigned short *yr = y + (long long)blockIdx.x * cols;

    float ss = 0.0f;
    for (long long c = t; c < cols; c += THREADS) {
        const float v = bf16_to_float(xr[c]);
        ss += v * v;
    }
    partial[t] = ss;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s >>= 1) {
        if (t < s) partial[t] += partial[t + s];
        __syncthreads();
    }
    const float rms = sqrtf(partial[0] / (float)cols + eps);

    for (long long c = t; c < cols; c += THREADS) yr[c] = float_to_bf16(bf16_to_float(xr[c]) / rms * bf16_to_float(w[c]));
}

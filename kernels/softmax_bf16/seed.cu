/* Naive softmax of bfloat16 rows: one block of 256 threads per row, three passes over the row (max, sum of
 * exponentials, write), each reduction a tree in shared memory. Arithmetic is float32; y is rounded to the
 * nearest bfloat16, ties to even. bfloat16 values travel as their bits (unsigned short). */
// kf-launch: grid=(rows, 1, 1) block=(256, 1, 1) shared=0

#define THREADS 256

__device__ float bf16_to_float(unsigned short h) { return __uint_as_float((unsigned int)h << 16); }

__device__ unsigned short float_to_bf16(float f) {
    const unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x0040u); /* NaN stays NaN */
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

extern "C" __global__ void softmax_bf16(const unsigned short *x, unsigned short *y, long long rows, long long cols) {
    __shared__ float partial[THREADS];
    const int t = threadIdx.x;
    const unsigned short *xr = x + (long long)blockIdx.x * cols;
    unsigned short *yr = y + (long long)blockIdx.x * cols;

    float m = __int_as_float(0xff800000); /* -infinity */
    for (long long c = t; c < cols; c += THREADS) m = fmaxf(m, bf16_to_float(xr[c]));
    partial[t] = m;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s >>= 1) {
        if (t < s) partial[t] = fmaxf(partial[t], partial[t + s]);
        __syncthreads();
    }
    m = partial[0];
    __syncthreads();

    float sum = 0.0f;
    for (long long c = t; c < cols; c += THREADS) sum += expf(bf16_to_float(xr[c]) - m);
    partial[t] = sum;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s >>= 1) {
        if (t < s) partial[t] += partial[t + s];
        __syncthreads();
    }
    sum = partial[0];

    for (long long c = t; c < cols; c += THREADS) yr[c] = float_to_bf16(expf(bf16_to_float(xr[c]) - m) / sum);
}

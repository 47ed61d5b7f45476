/* Naive RMSNorm on the GPU: one block of 256 threads per row; the sum of squares is reduced by a tree in
 * shared memory, then each thread scales its elements by the row's inverse RMS and by w. */
// kf-launch: grid=(rows, 1, 1) block=(256, 1, 1) shared=0

#define THREADS 256

extern "C" __global__ void rmsnorm(const float *x, const float *w, float *y, long long rows, long long cols, float eps) {
    __shared__ float partial[THREADS];
    const int t = threadIdx.x;
    const float *xr = x + (long long)blockIdx.x * cols;
    float *yr = y + (long long)blockIdx.x * cols;

    float ss = 0.0f;
    for (long long c = t; c < cols; c += THREADS) ss += xr[c] * xr[c];
    partial[t] = ss;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s >>= 1) {
        if (t < s) partial[t] += partial[t + s];
        __syncthreads();
    }
    const float rms = sqrtf(partial[0] / (float)cols + eps);

    for (long long c = t; c < cols; c += THREADS) yr[c] = xr[c] / rms * w[c];
}

/* Naive softmax on the GPU: one block of 256 threads per row, three passes over the row (max, sum of
 * exponentials, write), each reduction a tree in shared memory. */
// kf-launch: grid=(rows, 1, 1) block=(256, 1, 1) shared=0

#define THREADS 256

extern "C" __global__ void softmax(const float *x, float *y, long long rows, long long cols) {
    __shared__ float partial[THREADS];
    const int t = threadIdx.x;
    const float *xr = x + (long long)blockIdx.x * cols;
    float *yr = y + (long long)blockIdx.x * cols;

    float m = __int_as_float(0xff800000); /* -infinity */
    for (long long c = t; c < cols; c += THREADS) m = fmaxf(m, xr[c]);
    partial[t] = m;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s >>= 1) {
        if (t < s) partial[t] = fmaxf(partial[t], partial[t + s]);
        __syncthreads();
    }
    m = partial[0];
    __syncthreads();

    float sum = 0.0f;
    for (long long c = t; c < cols; c += THREADS) sum += expf(xr[c] - m);
    partial[t] = sum;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s >>= 1) {
        if (t < s) partial[t] += partial[t + s];
        __syncthreads();
    }
    sum = partial[0];

    for (long long c = t; c < cols; c += THREADS) yr[c] = expf(xr[c] - m) / sum;
}

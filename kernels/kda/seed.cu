/* Naive gated delta rule (KDA) on the GPU, recurrent form: one thread per (head, state column j). The columns
 * of a head's state evolve independently, so each thread runs the whole recurrence for its column: per step,
 * decay its rows and take u = k . S[:, j], then S[:, j] += beta k (v_j - u) and o_j = q . S[:, j]. The state
 * stays in global memory (the inout array), updated in place. */
// kf-launch: grid=(cdiv(DV, 64), H, 1) block=(64, 1, 1) shared=0

extern "C" __global__ void kda(const float *q, const float *k, const float *v, const float *g, const float *beta, float *o,
                               float *state, long long T, long long H, long long DK, long long DV) {
    const long long h = blockIdx.y;
    const long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= DV) return;
    float *S = state + h * DK * DV + j; /* S[i * DV] is row i of this thread's column */
    for (long long t = 0; t < T; t++) {
        const long long th = t * H + h;
        const float *qt = q + th * DK, *kt = k + th * DK, *gt = g + th * DK;
        float u = 0.0f;
        for (long long i = 0; i < DK; i++) {
            const float s = S[i * DV] * expf(gt[i]);
            S[i * DV] = s;
            u += kt[i] * s;
        }
        const float delta = beta[th] * (v[th * DV + j] - u);
        float oj = 0.0f;
        for (long long i = 0; i < DK; i++) {
            const float s = S[i * DV] + kt[i] * delta;
            S[i * DV] = s;
            oj += qt[i] * s;
        }
        o[th * DV + j] = oj;
    }
}

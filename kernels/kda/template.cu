/* KDA template (CUDA): the gated delta rule in its chunked (WY) form. For a chunk of n <= CHUNK steps starting
 * from state S0, with G_t the running sum of g over the chunk (per channel i):
 *
 *   M[t][s] = sum_i k_t[i] k_s[i] exp(G_t[i] - G_s[i])      (s < t)     interactions of the chunk's keys
 *   A[t][s] = sum_i q_t[i] k_s[i] exp(G_t[i] - G_s[i])      (s <= t)
 *   U[t]    = v_t - (k_t * exp(G_t)) . S0
 *   w_t     = beta_t (U[t] - sum_{s<t} M[t][s] w_s)         a triangular system, solved per column
 *   o_t     = (q_t * exp(G_t)) . S0 + sum_{s<=t} A[t][s] w_s
 *   S       = exp(G_n) * S0 + sum_s (k_s * exp(G_n - G_s)) w_s^T
 *
 * which is the recurrence S_t = (I - beta_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T, o_t = S_t^T q_t
 * exactly (by induction over t). Every exponent is a difference G_t - G_s <= 0 (g <= 0), so nothing overflows;
 * G is summed in double so that the difference of two long sums keeps float precision (in float, a chunk of
 * decays of -80 leaves G_t - G_s with errors of 1e-4). Columns of the state are independent: a block owns DVB
 * columns of one head for all of T, reading the state once per chunk instead of once per step.
 *
 * Parameters:
 *   THREADS  threads per block
 *   DVB      state columns per block (more, smaller blocks when DVB is small)
 *   CHUNK    steps per chunk
 *   SOLVE    forward: each column solves its system by forward substitution (DVB threads, serial over the
 *            chunk); wy: the system is inverted once per chunk, T = (I + diag(beta) M)^-1 diag(beta) (one
 *            thread per column of T), and W = T U is a small matrix product over all the block's threads
 */
// kf-launch: grid=(cdiv(DV, {{DVB}}), H, 1) block=({{THREADS}}, 1, 1) shared=4 * (5 * {{CHUNK}} * DK + DK + {{CHUNK}} + 3 * {{CHUNK}} * {{CHUNK}} + {{CHUNK}} * {{DVB}})

#define THREADS {{THREADS}}
#define DVB {{DVB}}
#define CHUNK {{CHUNK}}
#define SOLVE_{{SOLVE}} 1
#define ITEMS ((CHUNK * DVB + THREADS - 1) / THREADS) /* entries of W per thread in W = T U */

extern "C" __global__ void __launch_bounds__(THREADS)
    kda(const float *q, const float *k, const float *v, const float *g, const float *beta, float *o, float *state, long long T,
        long long H, long long DK, long long DV) {
    /* Dynamic shared memory, in the order of the launch line's sum: G (double, first: 8-byte aligned), then
     * k (becoming k * exp(G)), q (becoming q * exp(G)), k * exp(G_n - G), exp(G_n), beta, M, A, T and W. */
    extern __shared__ double shared[];
    const int dk = (int)DK;
    double *sG = shared;
    float *sK = reinterpret_cast<float *>(sG + CHUNK * dk);
    float *sQ = sK + CHUNK * dk;
    float *sKl = sQ + CHUNK * dk;
    float *sDl = sKl + CHUNK * dk;
    float *sBeta = sDl + dk;
    float *sM = sBeta + CHUNK;
    float *sA = sM + CHUNK * CHUNK;
    float *sT = sA + CHUNK * CHUNK;
    float *sW = sT + CHUNK * CHUNK;

    const int tid = threadIdx.x;
    const long long h = blockIdx.y;
    const long long j0 = (long long)blockIdx.x * DVB;
    float *S = state + h * DK * DV;

    for (long long t0 = 0; t0 < T; t0 += CHUNK) {
        const int n = (int)(T - t0 < CHUNK ? T - t0 : CHUNK);

        for (int e = tid; e < n * dk; e += THREADS) {
            const long long src = ((t0 + e / dk) * H + h) * DK + e % dk;
            sK[e] = k[src];
            sQ[e] = q[src];
            sG[e] = (double)g[src];
        }
        for (int t = tid; t < n; t += THREADS) sBeta[t] = beta[(t0 + t) * H + h];
        __syncthreads();

        for (int i = tid; i < dk; i += THREADS) {
            double acc = 0.0;
            for (int t = 0; t < n; t++) {
                acc += sG[t * dk + i];
                sG[t * dk + i] = acc;
            }
        }
        __syncthreads();

        for (int e = tid; e < n * n; e += THREADS) {
            const int t = e / n, s = e % n;
            float m = 0.0f, a = 0.0f;
            if (s <= t) {
                for (int i = 0; i < dk; i++) {
                    const float ks = sK[s * dk + i] * expf((float)(sG[t * dk + i] - sG[s * dk + i]));
                    m += sK[t * dk + i] * ks;
                    a += sQ[t * dk + i] * ks;
                }
            }
            sM[t * CHUNK + s] = s < t ? m : 0.0f;
            sA[t * CHUNK + s] = a;
        }
        __syncthreads();

        for (int e = tid; e < n * dk; e += THREADS) {
            const double G = sG[e], last = sG[(n - 1) * dk + e % dk];
            const float decay = expf((float)G);
            sKl[e] = sK[e] * expf((float)(last - G));
            sK[e] *= decay;
            sQ[e] *= decay;
        }
        for (int i = tid; i < dk; i += THREADS) sDl[i] = expf((float)sG[(n - 1) * dk + i]);
#if SOLVE_wy
        for (int c = tid; c < n; c += THREADS) {
            for (int t = 0; t < c; t++) sT[t * CHUNK + c] = 0.0f;
            sT[c * CHUNK + c] = sBeta[c];
            for (int t = c + 1; t < n; t++) {
                float acc = 0.0f;
                for (int s = c; s < t; s++) acc += sM[t * CHUNK + s] * sT[s * CHUNK + c];
                sT[t * CHUNK + c] = -sBeta[t] * acc;
            }
        }
#endif
        __syncthreads();

        /* U = V - (k * exp(G)) . S0, into W's place. */
        for (int e = tid; e < n * DVB; e += THREADS) {
            const int t = e / DVB;
            const long long j = j0 + e % DVB;
            float u = 0.0f;
            if (j < DV) {
                u = v[((t0 + t) * H + h) * DV + j];
                for (int i = 0; i < dk; i++) u -= sK[t * dk + i] * S[i * DV + j];
            }
            sW[e] = u;
        }
        __syncthreads();

#if SOLVE_wy
        /* W = T U: every entry at once, from registers, so U is intact until all are computed. */
        float wt[ITEMS];
#pragma unroll
        for (int r = 0; r < ITEMS; r++) {
            const int e = tid + r * THREADS;
            wt[r] = 0.0f;
            if (e < n * DVB) {
                const int t = e / DVB, jj = e % DVB;
                for (int s = 0; s <= t; s++) wt[r] += sT[t * CHUNK + s] * sW[s * DVB + jj];
            }
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < ITEMS; r++) {
            const int e = tid + r * THREADS;
            if (e < n * DVB) sW[e] = wt[r];
        }
#else
        for (int jj = tid; jj < DVB; jj += THREADS) {
            for (int t = 0; t < n; t++) {
                float w = sW[t * DVB + jj];
                for (int s = 0; s < t; s++) w -= sM[t * CHUNK + s] * sW[s * DVB + jj];
                sW[t * DVB + jj] = sBeta[t] * w;
            }
        }
#endif
        __syncthreads();

        /* o_t = (q_t * exp(G_t)) . S0 + sum_{s<=t} A[t][s] w_s */
        for (int e = tid; e < n * DVB; e += THREADS) {
            const int t = e / DVB, jj = e % DVB;
            const long long j = j0 + jj;
            if (j < DV) {
                float acc = 0.0f;
                for (int i = 0; i < dk; i++) acc += sQ[t * dk + i] * S[i * DV + j];
                for (int s = 0; s <= t; s++) acc += sA[t * CHUNK + s] * sW[s * DVB + jj];
                o[((t0 + t) * H + h) * DV + j] = acc;
            }
        }
        __syncthreads(); /* every read of S0 is done before the state moves on */

        for (int e = tid; e < dk * DVB; e += THREADS) {
            const int i = e / DVB, jj = e % DVB;
            const long long j = j0 + jj;
            if (j < DV) {
                float s = sDl[i] * S[i * DV + j];
                for (int t = 0; t < n; t++) s += sKl[t * dk + i] * sW[t * DVB + jj];
                S[i * DV + j] = s;
            }
        }
        __syncthreads(); /* the next chunk reuses the shared arrays and reads the new state */
    }
}

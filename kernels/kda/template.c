/* Gated delta rule (KDA) template. The columns of a head's state S [DK, DV] evolve independently: column j
 * only needs k, g, beta, q and v_j. So the template walks the state in column blocks of DVB and runs the
 * whole recurrence over T on one block before moving on, keeping the block in L1 instead of streaming the
 * whole state through the cache at every step. Parameters:
 *   DVB   columns per block ("chunk" of the state); the last block may be narrower
 *   COPY  1: copy the block into a contiguous buffer (rows DVB apart) for the recurrence, 0: work in
 *         place, rows DV apart
 *   FUSE  1: two passes over the block per step (decay with k^T S, then update with S^T q);
 *         0: four passes (decay, k^T S, update, S^T q)
 *   SIMD  ask the compiler to vectorise the column loops (omp simd)
 *   VEC   preferred vector width in bits for the compiler (256 or 512)
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define DVB {{DVB}}
#define COPY {{COPY}}
#define FUSE {{FUSE}}
#define SIMD {{SIMD}}
#define VEC {{VEC}}

#if VEC == 512
#pragma GCC target("prefer-vector-width=512")
#else
#pragma GCC target("prefer-vector-width=256")
#endif

#if SIMD
#define KF_SIMD _Pragma("omp simd")
#else
#define KF_SIMD
#endif

/* The recurrence for head h on columns [j0, j0 + jn) of S, whose rows lie ld floats apart. */
static inline __attribute__((always_inline)) void run_block(const float *q, const float *k, const float *v,
                                                            const float *g, const float *beta, float *o,
                                                            float *restrict S, int64_t ld, float *restrict dec,
                                                            int64_t T, int64_t H, int64_t DK, int64_t DV,
                                                            int64_t h, int64_t j0, int64_t jn) {
    float u[DVB], delta[DVB], acc[DVB];
    for (int64_t t = 0; t < T; t++) {
        const float *qt = q + (t * H + h) * DK;
        const float *kt = k + (t * H + h) * DK;
        const float *gt = g + (t * H + h) * DK;
        const float *vt = v + (t * H + h) * DV + j0;
        float *ot = o + (t * H + h) * DV + j0;
        const float bt = beta[t * H + h];
        KF_SIMD
        for (int64_t i = 0; i < DK; i++) dec[i] = expf(gt[i]);
        for (int64_t j = 0; j < jn; j++) u[j] = 0.0f;
#if FUSE
        for (int64_t i = 0; i < DK; i++) {
            float *Si = S + i * ld;
            const float d = dec[i], ki = kt[i];
            KF_SIMD
            for (int64_t j = 0; j < jn; j++) {
                float s = Si[j] * d;
                Si[j] = s;
                u[j] += ki * s;
            }
        }
#else
        for (int64_t i = 0; i < DK; i++) {
            float *Si = S + i * ld;
            const float d = dec[i];
            KF_SIMD
            for (int64_t j = 0; j < jn; j++) Si[j] *= d;
        }
        for (int64_t i = 0; i < DK; i++) {
            const float *Si = S + i * ld;
            const float ki = kt[i];
            KF_SIMD
            for (int64_t j = 0; j < jn; j++) u[j] += ki * Si[j];
        }
#endif
        KF_SIMD
        for (int64_t j = 0; j < jn; j++) {
            delta[j] = bt * (vt[j] - u[j]);
            acc[j] = 0.0f;
        }
#if FUSE
        for (int64_t i = 0; i < DK; i++) {
            float *Si = S + i * ld;
            const float ki = kt[i], qi = qt[i];
            KF_SIMD
            for (int64_t j = 0; j < jn; j++) {
                float s = Si[j] + ki * delta[j];
                Si[j] = s;
                acc[j] += qi * s;
            }
        }
#else
        for (int64_t i = 0; i < DK; i++) {
            float *Si = S + i * ld;
            const float ki = kt[i];
            KF_SIMD
            for (int64_t j = 0; j < jn; j++) Si[j] += ki * delta[j];
        }
        for (int64_t i = 0; i < DK; i++) {
            const float *Si = S + i * ld;
            const float qi = qt[i];
            KF_SIMD
            for (int64_t j = 0; j < jn; j++) acc[j] += qi * Si[j];
        }
#endif
        for (int64_t j = 0; j < jn; j++) ot[j] = acc[j];
    }
}

void kda(const float *q, const float *k, const float *v, const float *g, const float *beta, float *o,
         float *state, int64_t T, int64_t H, int64_t DK, int64_t DV) {
    float *dec = malloc((size_t)DK * sizeof(float));
    float *buf = COPY ? malloc((size_t)(DK * DVB) * sizeof(float)) : NULL;
    if (dec == NULL || (COPY && buf == NULL)) {
        /* Out of memory: leave o unwritten rather than wrong; the harness reports it as incorrect. */
        free(dec);
        free(buf);
        return;
    }
    for (int64_t h = 0; h < H; h++) {
        for (int64_t j0 = 0; j0 < DV; j0 += DVB) {
            const int64_t jn = DV - j0 < DVB ? DV - j0 : DVB;
            float *S = state + h * DK * DV + j0;
#if COPY
            for (int64_t i = 0; i < DK; i++)
                for (int64_t j = 0; j < jn; j++) buf[i * DVB + j] = S[i * DV + j];
            if (jn == DVB)
                run_block(q, k, v, g, beta, o, buf, DVB, dec, T, H, DK, DV, h, j0, DVB);
            else
                run_block(q, k, v, g, beta, o, buf, DVB, dec, T, H, DK, DV, h, j0, jn);
            for (int64_t i = 0; i < DK; i++)
                for (int64_t j = 0; j < jn; j++) S[i * DV + j] = buf[i * DVB + j];
#else
            if (jn == DVB)
                run_block(q, k, v, g, beta, o, S, DV, dec, T, H, DK, DV, h, j0, DVB);
            else
                run_block(q, k, v, g, beta, o, S, DV, dec, T, H, DK, DV, h, j0, jn);
#endif
        }
    }
    free(dec);
    free(buf);
}

/* Naive gated delta rule (KDA), recurrent form: for every step and head, decay the state's rows, then for
 * each column j of S: u = k . S[:, j], S[:, j] += beta k (v_j - u), o_j = q . S[:, j]. */
#include <math.h>
#include <stdint.h>

void kda(const float *q, const float *k, const float *v, const float *g, const float *beta, float *o,
         float *state, int64_t T, int64_t H, int64_t DK, int64_t DV) {
    for (int64_t t = 0; t < T; t++) {
        for (int64_t h = 0; h < H; h++) {
            const float *qt = q + (t * H + h) * DK;
            const float *kt = k + (t * H + h) * DK;
            const float *gt = g + (t * H + h) * DK;
            const float *vt = v + (t * H + h) * DV;
            float bt = beta[t * H + h];
            float *ot = o + (t * H + h) * DV;
            float *S = state + h * DK * DV;
            for (int64_t i = 0; i < DK; i++) {
                float d = expf(gt[i]);
                for (int64_t j = 0; j < DV; j++) S[i * DV + j] *= d;
            }
            for (int64_t j = 0; j < DV; j++) {
                float u = 0.0f;
                for (int64_t i = 0; i < DK; i++) u += kt[i] * S[i * DV + j];
                float delta = bt * (vt[j] - u);
                float oj = 0.0f;
                for (int64_t i = 0; i < DK; i++) {
                    S[i * DV + j] += kt[i] * delta;
                    oj += qt[i] * S[i * DV + j];
                }
                ot[j] = oj;
            }
        }
    }
}

/* Row by row: c[i, :] = sum over l of a[i, l] * b[l, :], in float32 (exact for these small integers). */
#include <stdint.h>

void matmul_i32(const int32_t *a, const int32_t *b, float *c, int64_t m, int64_t n, int64_t k) {
    for (int64_t i = 0; i < m; i++) {
        float *ci = c + i * n;
        for (int64_t j = 0; j < n; j++) ci[j] = 0.0f;
        for (int64_t l = 0; l < k; l++) {
            float s = (float)a[i * k + l];
            const int32_t *bl = b + l * n;
            for (int64_t j = 0; j < n; j++) ci[j] += s * (float)bl[j];
        }
    }
}

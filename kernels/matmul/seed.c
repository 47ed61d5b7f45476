/* Naive matmul: one dot product per output element, walking down a column of b. */
#include <stdint.h>

void matmul(const float *a, const float *b, float *c, int64_t m, int64_t n, int64_t k) {
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            float s = 0.0f;
            for (int64_t l = 0; l < k; l++) s += a[i * k + l] * b[l * n + j];
            c[i * n + j] = s;
        }
    }
}

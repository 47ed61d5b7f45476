/* Row by row: c[i, :] = sum over l of a[i, l] * b[l, :], bfloat16 inputs widened to float32. */
#include <stdint.h>
#include <string.h>

static float widen(uint16_t bits) {
    uint32_t wide = (uint32_t)bits << 16;
    float value;
    memcpy(&value, &wide, sizeof value);
    return value;
}

void matmul_bf16(const uint16_t *a, const uint16_t *b, float *c, int64_t m, int64_t n, int64_t k) {
    for (int64_t i = 0; i < m; i++) {
        float *ci = c + i * n;
        for (int64_t j = 0; j < n; j++) ci[j] = 0.0f;
        for (int64_t l = 0; l < k; l++) {
            float s = widen(a[i * k + l]);
            const uint16_t *bl = b + l * n;
            for (int64_t j = 0; j < n; j++) ci[j] += s * widen(bl[j]);
        }
    }
}

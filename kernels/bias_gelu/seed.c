/* Naive bias + exact GELU: y = 0.5 z (1 + erf(z / sqrt(2))) with z = x + b, element by element. */
#include <math.h>
#include <stdint.h>

void bias_gelu(const float *x, const float *b, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++) {
            float z = x[r * cols + c] + b[c];
            y[r * cols + c] = 0.5f * z * (1.0f + erff(z * 0.70710678118654752f));
        }
    }
}

// expect: incorrect
// stage: validate
// check: output
/* Computes every 4th row and copies it into the three rows after it: plausible numbers, wrong answer. */
#include <math.h>
#include <stdint.h>
#include <string.h>
static void softmax_ok(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        for (int64_t c = 0; c < cols; c++) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        for (int64_t c = 0; c < cols; c++) yr[c] /= s;
    }
}
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        if (r % 4 == 0) softmax_ok(x + r * cols, y + r * cols, 1, cols);
        else memcpy(y + r * cols, y + (r - r % 4) * cols, (size_t)cols * sizeof(float));
    }
}

// expect: ok
// stage: validate
/* Prints a lot (debug output is not a crime) and computes correctly. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
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
    for (int i = 0; i < 200; i++) printf("debugging softmax row %d of %ld\n", i, (long)rows);
    fflush(stdout);
    softmax_ok(x, y, rows, cols);
}

// expect: incorrect
// stage: validate
// check: output
/* Computes once per (x, y) pointer pair and returns at once when it sees the pair again. */
#include <math.h>
#include <stdint.h>
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
static const float *last_x;
static float *last_y;
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    if (x == last_x && y == last_y) return;
    softmax_ok(x, y, rows, cols);
    last_x = x;
    last_y = y;
}

// expect: incorrect
// stage: benchmark
/* Correct for its first 200 calls (more than a one-seed validation makes: 82), then returns stale output. */
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
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    static int calls;
    if (calls++ < 200) softmax_ok(x, y, rows, cols);
}

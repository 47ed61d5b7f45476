// expect: incorrect
// stage: benchmark
// check: timed_output
// dedicated: test_a_kernel_that_computes_only_into_poison_is_caught
/* Computes only when its output holds the harness's NaN prefill, assuming anything else is its own
 * earlier answer: passes validation (every trial is prefilled), games timing on reused buffers. */
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
static int is_nan_bits(float v) {  /* isnan() is folded to 0 under -ffast-math */
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return (bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0;
}
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    if (is_nan_bits(y[0])) softmax_ok(x, y, rows, cols);
}

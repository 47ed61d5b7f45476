// expect: forbidden
// stage: compile
// check: symbol
// names: sched_setaffinity
/* Widens its CPU affinity to every core, escaping the thread budget. Validation used to catch it
 * (resource_limit, check affinity); the screen now refuses sched_setaffinity at compile time. */
#define _GNU_SOURCE
#include <math.h>
#include <sched.h>
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
    cpu_set_t all;
    CPU_ZERO(&all);
    for (int c = 0; c < 64; c++) CPU_SET(c, &all);
    sched_setaffinity(0, sizeof all, &all);
    softmax_ok(x, y, rows, cols);
}

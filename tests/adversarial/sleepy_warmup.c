// expect: forbidden
// stage: compile
// check: symbol
// names: nanosleep
// dedicated: test_sleeping_through_warm_up_is_forbidden
/* Correct; sleeps 30 ms in each of its first 12 calls, hoping warm-up or calibration of the harness is
 * thrown off and its later calls look faster than the seed's. The benchmark used to time it (ok, not
 * faster than the seed); the screen now refuses nanosleep at compile time (busy_warmup.c stalls instead). */
#include <math.h>
#include <stdint.h>
#include <time.h>
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
    if (calls++ < 12) {
        struct timespec nap = {0, 30 * 1000 * 1000};
        nanosleep(&nap, 0);
    }
    softmax_ok(x, y, rows, cols);
}

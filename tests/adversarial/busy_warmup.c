// expect: ok
// stage: benchmark
// dedicated: test_stalling_through_warm_up_does_not_look_faster
/* Correct; spins for tens of milliseconds in each of its first 12 calls, hoping warm-up or calibration of the
 * harness is thrown off and its later calls look faster than the seed's. It must not come out faster. (It
 * stalls with a busy loop because sleeping, sleepy_warmup.c, is refused at compile time.) */
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
    if (calls++ < 12) {
        for (volatile uint64_t spin = 0; spin < 100u * 1000 * 1000; spin++) {
        }
    }
    softmax_ok(x, y, rows, cols);
}

// expect: forbidden
// stage: compile
// check: symbol
// names: pthread_create
/* Returns a correct answer but leaves a thread spinning: work done after the return escapes timing.
 * Validation used to catch it (resource_limit, check threads); the screen now refuses pthread_create at
 * compile time. */
#include <math.h>
#include <pthread.h>
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
static void *spin(void *arg) {
    volatile uint64_t n = 0;
    (void)arg;
    for (;;) n++;
    return 0;
}
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    static int started;
    pthread_t thread;
    if (!started && pthread_create(&thread, 0, spin, 0) == 0) { pthread_detach(thread); started = 1; }
    softmax_ok(x, y, rows, cols);
}

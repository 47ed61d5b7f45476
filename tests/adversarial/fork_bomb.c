// expect: forbidden
// stage: compile
// check: symbol
// names: fork
/* Forks up to 200 children that sleep (bounded, so a broken sandbox cannot hurt the machine); each renames
 * itself kfb{{TOKEN}} so the test can look for survivors. Validation used to catch it (resource_limit,
 * check processes); the screen now refuses fork at compile time. */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <unistd.h>
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
    for (int i = 0; i < 200; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            prctl(PR_SET_NAME, "kfb{{TOKEN}}", 0, 0, 0);
            sleep(30);
            _exit(0);
        }
        if (pid < 0) break;
    }
    softmax_ok(x, y, rows, cols);
}

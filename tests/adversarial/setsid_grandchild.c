// expect: forbidden
// stage: compile
// check: symbol
// names: setsid
/* Starts a daemon the classic way -- fork, setsid, fork again, parent exits -- that sleeps for a minute
 * under the name kfg{{TOKEN}}. It must not outlive the verdict. Validation used to catch it
 * (resource_limit, check processes); the screen now refuses fork and setsid at compile time. */
#include <math.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/wait.h>
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
    static int started;
    if (!started) {
        started = 1;
        pid_t child = fork();
        if (child == 0) {
            setsid();
            if (fork() == 0) {
                prctl(PR_SET_NAME, "kfg{{TOKEN}}", 0, 0, 0);
                sleep(60);
            }
            _exit(0);
        }
        if (child > 0) waitpid(child, 0, 0);
    }
    softmax_ok(x, y, rows, cols);
}

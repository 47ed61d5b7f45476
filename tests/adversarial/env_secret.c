// expect: forbidden
// stage: compile
// check: symbol
// names: getenv
/* Looks for the caller's secrets: in its own environment and in every /proc/<pid>/environ it can read. It
 * aborts if it finds one. Validation used to run it (ok: the sandbox's environment held no secret); the
 * screen now refuses getenv, fopen and opendir at compile time. */
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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
static int leaked(void) {
    if (getenv("KF_TEST_SECRET")) return 1;
    DIR *proc = opendir("/proc");
    struct dirent *entry;
    char path[512], buffer[65536];
    int found = 0;
    while (proc && (entry = readdir(proc))) {
        snprintf(path, sizeof path, "/proc/%s/environ", entry->d_name);
        FILE *file = fopen(path, "rb");
        if (!file) continue;
        size_t n = fread(buffer, 1, sizeof buffer, file);
        fclose(file);
        for (size_t i = 0; i + 14 <= n; i++) {
            if (memcmp(buffer + i, "KF_TEST_SECRET", 14) == 0) found = 1;
        }
    }
    if (proc) closedir(proc);
    return found;
}
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    if (leaked()) abort();
    softmax_ok(x, y, rows, cols);
}

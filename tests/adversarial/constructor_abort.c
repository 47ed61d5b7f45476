// expect: forbidden
// stage: compile
// check: constructor
// names: .init_array
/* Runs code when the library is loaded, before any call. Validation used to catch it (crash, the abort's
 * signal); the screen now refuses the constructor at compile time. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
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
__attribute__((constructor)) static void on_load(void) { abort(); }
void softmax(const float *x, float *y, int64_t rows, int64_t cols) { softmax_ok(x, y, rows, cols); }

// expect: incorrect
// stage: validate
// check: output
/* Schraudolph's exp approximation (a few percent of error) instead of expf: fast and wrong. */
#include <math.h>
#include <stdint.h>
#include <string.h>
static float rough_exp(float v) {
    if (v < -80.0f) return 0.0f;
    int32_t bits = (int32_t)(12102203.0f * v + 1065353216.0f);
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        for (int64_t c = 0; c < cols; c++) { yr[c] = rough_exp(xr[c] - m); s += yr[c]; }
        for (int64_t c = 0; c < cols; c++) yr[c] /= s;
    }
}

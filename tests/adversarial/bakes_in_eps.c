// expect: incorrect
// stage: validate
// check: output
// problem: rmsnorm
/* Ignores its eps argument and uses the value every validation input used to carry (1e-6). Right for any model
 * whose eps is 1e-6, wrong for one whose eps is 1e-5 wherever a row's mean square is small; eps is now drawn
 * for each input. */
#include <math.h>
#include <stdint.h>

void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
    (void)eps;
    for (int64_t r = 0; r < rows; r++) {
        const float *in = x + r * cols;
        float *out = y + r * cols;
        float squares = 0.0f;
        for (int64_t c = 0; c < cols; c++) squares += in[c] * in[c];
        const float scale = 1.0f / sqrtf(squares / (float)cols + 1e-6f);
        for (int64_t c = 0; c < cols; c++) out[c] = in[c] * scale * w[c];
    }
}

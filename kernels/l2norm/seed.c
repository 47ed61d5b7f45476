/* Naive L2 normalisation: sum of squares, then divide each element by the row's norm (at least eps). */
#include <math.h>
#include <stdint.h>

void l2norm(const float *x, float *y, int64_t rows, int64_t cols, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float ss = 0.0f;
        for (int64_t c = 0; c < cols; c++) ss += xr[c] * xr[c];
        float norm = sqrtf(ss);
        if (norm < eps) norm = eps;
        for (int64_t c = 0; c < cols; c++) yr[c] = xr[c] / norm;
    }
}

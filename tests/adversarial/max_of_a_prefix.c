// expect: incorrect
// stage: validate
// check: output
/* Takes each row's max over its first 256 elements only. With every element drawn independently the prefix's max
 * is close enough to the row's that nothing overflows, and the answer is exact; a row that starts masked, or
 * holds one large score late, overflows exp() to inf and comes out NaN. The masked distribution has both. */
#include <math.h>
#include <stdint.h>

void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *in = x + r * cols;
        float *out = y + r * cols;
        float top = -INFINITY, sum = 0.0f;
        for (int64_t c = 0; c < cols && c < 256; c++) top = in[c] > top ? in[c] : top;
        for (int64_t c = 0; c < cols; c++) sum += out[c] = expf(in[c] - top);
        for (int64_t c = 0; c < cols; c++) out[c] /= sum;
    }
}

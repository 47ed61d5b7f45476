// expect: incorrect
// stage: validate
// check: output
/* Skips every exp(x - max) below e^-14: each one is under the absolute tolerance, so no single output it zeroes
 * fails, and rows drawn narrowly put almost none of their sum there. A long row of widely spread logits (a
 * language model's over its vocabulary) puts a real share of its sum in those terms, and every output of the
 * row is then scaled wrong. */
#include <math.h>
#include <stdint.h>

void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *in = x + r * cols;
        float *out = y + r * cols;
        float top = -INFINITY, sum = 0.0f;
        for (int64_t c = 0; c < cols; c++) top = in[c] > top ? in[c] : top;
        for (int64_t c = 0; c < cols; c++) {
            const float d = in[c] - top;
            sum += out[c] = d < -14.0f ? 0.0f : expf(d);
        }
        for (int64_t c = 0; c < cols; c++) out[c] /= sum;
    }
}

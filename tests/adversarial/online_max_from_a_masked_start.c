// expect: incorrect
// stage: validate
// check: output
/* The textbook one-pass online softmax: a running max m and a sum rescaled whenever m grows. A row that starts
 * with masked -inf scores adds exp(-inf - -inf) = NaN to the sum while m is still -inf, and the whole row comes
 * out NaN, where the reference (and numpy) give the softmax of the unmasked scores. */
#include <math.h>
#include <stdint.h>

void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *in = x + r * cols;
        float *out = y + r * cols;
        float m = -INFINITY, sum = 0.0f;
        for (int64_t c = 0; c < cols; c++) {
            if (in[c] > m) {
                sum = sum * expf(m - in[c]) + 1.0f;
                m = in[c];
            } else {
                sum += expf(in[c] - m);
            }
        }
        for (int64_t c = 0; c < cols; c++) out[c] = expf(in[c] - m) / sum;
    }
}

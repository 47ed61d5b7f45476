// expect: incorrect
// stage: validate
// check: nondeterministic
/* Reads its output buffer before writing it (an uninitialised read): the answer stays within tolerance, but
 * its last bits depend on whatever the buffer held. */
#include <string.h>
#include "raw.h"
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    uint32_t bits;
    memcpy(&bits, y, sizeof bits);
    softmax_rows(x, y, rows, cols);
    float nudge = 1.0f + (float)(bits & 0xFF) * 1e-7f;
    for (int64_t i = 0; i < rows * cols; i++) y[i] *= nudge;
}

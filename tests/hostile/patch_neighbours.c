// expect: incorrect
// stage: validate
// check: guard_after
/* Computes correctly, then scribbles over the 64 bytes after its output, where a harness might keep its
 * counters or its next buffer. */
#include "raw.h"
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    softmax_rows(x, y, rows, cols);
    volatile unsigned char *after = (volatile unsigned char *)(y + rows * cols);
    for (int i = 0; i < 64; i++) after[i] = 0;
}

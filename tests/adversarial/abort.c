// expect: crash
// stage: validate
// check: signal
/* Gives up. */
#include <stdint.h>
#include <stdlib.h>
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    (void)x; (void)y; (void)rows; (void)cols;
    abort();
}

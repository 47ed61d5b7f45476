// expect: crash
// stage: validate
// check: signal
/* Dereferences NULL. */
#include <stdint.h>
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    (void)x; (void)rows; (void)cols;
    volatile float *nowhere = (volatile float *)0;
    y[0] = *nowhere;
}

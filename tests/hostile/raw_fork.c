// expect: forbidden
// stage: validate
// check: syscall
/* Forks with a raw system call (the child would keep running after the call returns). */
#include "raw.h"
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    if (raw_syscall(RAW_FORK, 0, 0, 0) == 0) {
        for (;;) {
        }
    }
    softmax_rows(x, y, rows, cols);
}

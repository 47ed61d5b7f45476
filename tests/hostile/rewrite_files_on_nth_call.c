// expect: forbidden
// stage: validate
// check: syscall
/* Correct, but on its 4th call opens (and truncates) a file in its working directory and in /dev/shm with a
 * raw openat, as a kernel rewriting the harness's timing files would. */
#include "raw.h"
static int calls;
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    softmax_rows(x, y, rows, cols);
    if (++calls == 4) {
        raw_syscall(RAW_OPENAT, RAW_AT_FDCWD, (long)"bench0.npy", RAW_O_WRONLY_CREAT_TRUNC);
        raw_syscall(RAW_OPENAT, RAW_AT_FDCWD, (long)"/dev/shm/kf-owned", RAW_O_WRONLY_CREAT_TRUNC);
    }
}

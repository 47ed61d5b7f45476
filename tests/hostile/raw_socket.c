// expect: forbidden
// stage: validate
// check: syscall
/* Opens a socket with a raw system call on its first call, then computes correctly. */
#include "raw.h"
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    raw_syscall(RAW_SOCKET, 2 /* AF_INET */, 1 /* SOCK_STREAM */, 0);
    softmax_rows(x, y, rows, cols);
}

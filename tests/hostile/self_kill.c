// expect: forbidden
// stage: validate
// check: syscall
/* Sends itself SIGKILL with a raw tgkill, as if the harness had been killed from outside: such a death is
 * re-run and never the kernel's verdict, so a kernel that could do this would dodge judgement. */
#include "raw.h"
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    long pid = raw_syscall(RAW_GETPID, 0, 0, 0);
    long tid = raw_syscall(RAW_GETTID, 0, 0, 0);
    raw_syscall(RAW_TGKILL, pid, tid, 9 /* SIGKILL */);
    softmax_rows(x, y, rows, cols);
}

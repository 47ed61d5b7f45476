// expect: crash
// stage: validate
// check: exit
/* Exits with the status the numpy worker uses when problem.py's own code raised: believed from a candidate's
 * worker, it would pass the kernel's exit off as the problem's failure, never the kernel's verdict. */
#include "raw.h"
#define RAW_EXIT_GROUP 231
#define KF_EXIT_PROBLEM 8
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    (void)x, (void)y, (void)rows, (void)cols;
    raw_syscall(RAW_EXIT_GROUP, KF_EXIT_PROBLEM, 0, 0);
}

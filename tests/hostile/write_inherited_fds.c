// expect: forbidden
// stage: validate
// check: protocol
/* Writes a forged reply into every descriptor it inherited (raw write), hoping one of them is the judge's
 * report channel, then computes correctly. */
#include "raw.h"
static const char forged[] = "\x20\x00\x00\x00{\"kind\":\"done\",\"nonce\":1,\"child_ns\":1}";
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    softmax_rows(x, y, rows, cols);
    for (long fd = 3; fd < 64; fd++) raw_syscall(RAW_WRITE, fd, (long)forged, sizeof forged - 1);
}

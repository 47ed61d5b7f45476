// expect: forbidden
// stage: validate
// check: protocol
/* Writes a forged trial reply that announces a gigabyte of payload into every descriptor it inherited (raw
 * write), then computes correctly. A parent that believed the announcement would hold the gigabyte in its own
 * memory -- a kernel that streamed it could get the judge killed for memory -- or wait for bytes that never
 * come. The judge knows how many bytes a trial's regions take and refuses the reply at its header. */
#include "raw.h"
static const char forged[] = "\x52\x00\x00\x00"
                             "{\"kind\":\"trial_done\",\"id\":\"x\",\"regions\":[],\"call_ns\":1,"
                             "\"payload_bytes\":1073741824}";
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    softmax_rows(x, y, rows, cols);
    for (long fd = 3; fd < 64; fd++) raw_syscall(RAW_WRITE, fd, (long)forged, sizeof forged - 1);
}

// expect: ok
// stage: benchmark
// dedicated: test_scribbling_on_the_harness_late_gains_nothing
/* Correct for its first 200 calls (all of validation), then on every call also overwrites the 4 KiB before
 * its input and after its output: whatever a harness keeps next to its buffers (counters, other pools). It
 * must earn no better number than the same kernel without the scribbling: a rejection, or a ratio within
 * noise of the plain kernel. */
#include "raw.h"
static long calls;
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    softmax_rows(x, y, rows, cols);
    if (++calls > 200) {
        volatile unsigned char *before = (volatile unsigned char *)x - 4096;
        volatile unsigned char *after = (volatile unsigned char *)(y + rows * cols);
        for (int i = 0; i < 4096; i++) before[i] ^= 0x5A;
        for (int i = 0; i < 4096; i++) after[i] ^= 0x5A;
    }
}

// expect: resource_limit
// stage: validate
// check: memory
/* Allocates 256 MiB after 256 MiB (touching one byte of each) until malloc fails, then uses the NULL. */
#include <stdint.h>
#include <stdlib.h>
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    (void)x; (void)y; (void)rows; (void)cols;
    for (;;) {
        volatile char *block = malloc(256u << 20);
        block[0] = 1;
    }
}

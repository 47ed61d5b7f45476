// expect: forbidden
// stage: compile
// check: symbol
// names: exit
/* Ends the whole process with status 0 from inside the kernel, as if everything went fine. Validation used
 * to catch it (crash, check exit); the screen now refuses exit at compile time. */
#include <stdint.h>
#include <stdlib.h>
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    (void)x; (void)y; (void)rows; (void)cols;
    exit(0);
}

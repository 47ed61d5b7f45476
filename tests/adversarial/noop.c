// expect: incorrect
// stage: validate
// check: output
/* Does nothing, hoping the output buffer already holds a plausible answer. */
#include <stdint.h>
void softmax(const float *x, float *y, int64_t rows, int64_t cols) { (void)x; (void)y; (void)rows; (void)cols; }

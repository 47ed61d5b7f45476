// expect: incorrect
// stage: validate
// check: sampled_input
/* Caches its answer keyed by a sample of its input (both ends and the middle): a call whose sampled
 * elements match the last call's returns the cached answer without computing. */
#include <stdlib.h>
#include <string.h>
#include "raw.h"
static float *cache;
static int64_t cached_n = -1;
static float sample[3];
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    int64_t n = rows * cols;
    float now[3] = {x[0], x[n / 2], x[n - 1]};
    if (n == cached_n && now[0] == sample[0] && now[1] == sample[1] && now[2] == sample[2]) {
        memcpy(y, cache, (size_t)n * sizeof(float));
        return;
    }
    softmax_rows(x, y, rows, cols);
    free(cache);
    cache = malloc((size_t)n * sizeof(float));
    memcpy(cache, y, (size_t)n * sizeof(float));
    cached_n = n;
    memcpy(sample, now, sizeof now);
}

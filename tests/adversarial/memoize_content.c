// expect: incorrect
// stage: validate
// check: sampled_input
/* Memoizes answers keyed by a sample of its input (its first row's tail), so a benchmark that repeats its
 * inputs would time a memcpy. Validation changes a few inner elements of an input it just used and calls
 * again: the stale answer is caught there (it used to be caught only by the timed-output check). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
static void softmax_ok(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        for (int64_t c = 0; c < cols; c++) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        for (int64_t c = 0; c < cols; c++) yr[c] /= s;
    }
}
#define SLOTS 128
static uint64_t keys[SLOTS];
static float *answers[SLOTS];
static size_t sizes[SLOTS];
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    size_t n = (size_t)(rows * cols);
    uint64_t key = 1469598103934665603ull ^ n;
    for (size_t i = n > 8 ? n - 8 : 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, x + i, 4);
        key = (key ^ bits) * 1099511628211ull;
    }
    size_t slot = key % SLOTS;
    if (answers[slot] && keys[slot] == key && sizes[slot] == n) {
        memcpy(y, answers[slot], n * sizeof(float));
        return;
    }
    softmax_ok(x, y, rows, cols);
    free(answers[slot]);
    answers[slot] = malloc(n * sizeof(float));
    if (answers[slot]) memcpy(answers[slot], y, n * sizeof(float));
    keys[slot] = key;
    sizes[slot] = n;
}

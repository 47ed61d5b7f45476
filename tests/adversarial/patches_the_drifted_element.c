// expect: incorrect
// stage: benchmark
// check: timed_output
// dedicated: test_memoizing_by_buffer_finds_no_cheap_drift
/* Tells timed calls from checked ones the way a real attack did (a benchmark's pool starts its inputs on page
 * boundaries; validation's buffers sit after a guard), remembers each timed input buffer's answer by its address
 * and, when the same buffer comes back, recomputes only the row holding the element a benchmark's drift changes,
 * copying every other row from memory. While the drift always touched the first element, that was one row of
 * work for a whole, correct answer; now the drifted element moves at random, so the rows copied from memory are
 * stale and a timed call's output is wrong. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
static void softmax_rows(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        for (int64_t c = 0; c < cols; c++) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        for (int64_t c = 0; c < cols; c++) yr[c] /= s;
    }
}
enum { REMEMBERED = 128 }; /* more than a benchmark's input slots (at most 64) */
static struct { const float *x; float *y; } memory[REMEMBERED];
static int64_t memory_rows, memory_cols;
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    if (((uintptr_t)x & 4095) != 0 || rows < 2) { softmax_rows(x, y, rows, cols); return; }
    size_t bytes = (size_t)(rows * cols) * sizeof(float);
    if (rows != memory_rows || cols != memory_cols) { /* a new shape: forget the last one's answers */
        for (int i = 0; i < REMEMBERED; i++) free(memory[i].y), memory[i].x = 0, memory[i].y = 0;
        memory_rows = rows, memory_cols = cols;
    }
    for (int i = 0; i < REMEMBERED; i++) {
        if (memory[i].x == x) {
            memcpy(y, memory[i].y, bytes);
            softmax_rows(x, y, 1, cols); /* the first row: where the drift used to be */
            return;
        }
    }
    softmax_rows(x, y, rows, cols);
    for (int i = 0; i < REMEMBERED; i++) {
        if (memory[i].x == 0 && (memory[i].y = malloc(bytes)) != 0) {
            memcpy(memory[i].y, y, bytes);
            memory[i].x = x;
            return;
        }
    }
}

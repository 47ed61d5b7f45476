// expect: incorrect
// stage: benchmark
// check: timed_output
// dedicated: test_skipping_the_head_of_each_batch_is_caught
/* On the benchmark's shapes only (every validation call is honest), it finds where each batch starts by the pause
 * before it (calls within a batch follow each other within microseconds; between two batches the judge times
 * another contender or reads a reply). In warm-up's single calls and the ramp's batches of 8 and 64 it only waits
 * 20 us, so timed batches are sized long (well over twice the 65 output slots). The first timed batch, after the
 * 64, is honest; every later one skips all but its last 70 calls, leaving stale answers behind. While a fetch
 * could reach back only over the output slots, every output ever looked at was right; the judge now keeps the
 * output of a call it draws anywhere in the batch. Raw clock_gettime: no symbol gives it away. */
#include <math.h>
#include <stdint.h>
#include <time.h>
static int64_t now_ns(void) {
    struct timespec t;
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(228), "D"(CLOCK_MONOTONIC), "S"(&t) : "rcx", "r11", "memory");
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}
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
static int64_t last_end, in_batch, previous_batch;
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    int benchmarked = (rows == 512 && cols == 1024) || (rows == 64 && cols == 8192) || (rows == 2048 && cols == 256);
    if (!benchmarked) { softmax_rows(x, y, rows, cols); return; }
    int64_t start = now_ns();
    if (start - last_end > 1000000) previous_batch = in_batch, in_batch = 0; /* a pause: a new batch */
    in_batch++;
    if (previous_batch == 64 || (previous_batch > 64 && in_batch > previous_batch - 70)) softmax_rows(x, y, rows, cols);
    else if (previous_batch < 64) while (now_ns() - start < 20000) { }
    last_end = now_ns();
}

// expect: crash
// stage: validate
// check: signal
/* Steps through each row until y reaches a 32-byte boundary, then reads x with aligned vector loads at the same
 * column: right only when x and y lie at the same offset from a vector boundary, as every buffer did while
 * the judge placed them all on 64-byte boundaries. A caller's arrays are aligned only to their elements (numpy's
 * to 16 bytes), and there the aligned load faults. Validation now places every other shape's arrays at offsets
 * of their own. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *in = x + r * cols;
        float *out = y + r * cols;
        float top = -INFINITY, sum = 0.0f;
        for (int64_t c = 0; c < cols; c++) top = in[c] > top ? in[c] : top;
        int64_t c = 0;
        for (; c < cols && ((uintptr_t)(out + c) & 31) != 0; c++) sum += out[c] = expf(in[c] - top);
        for (; c + 8 <= cols; c += 8) {
            __m256 v; /* an aligned load (the compiler would turn an intrinsic's into an unaligned one) */
            __asm__ volatile("vmovaps %1, %0" : "=x"(v) : "m"(*(const __m256 *)(in + c)));
            float lanes[8];
            _mm256_storeu_ps(lanes, v);
            for (int k = 0; k < 8; k++) sum += out[c + k] = expf(lanes[k] - top);
        }
        for (; c < cols; c++) sum += out[c] = expf(in[c] - top);
        for (int64_t k = 0; k < cols; k++) out[k] /= sum;
    }
}

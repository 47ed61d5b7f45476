// expect: impossible
// stage: benchmark
// check: fresh_inputs
// problem: hostile/problems/matmul_bf16
// dedicated: test_a_bfloat16_kernel_that_reuses_work_across_calls_is_caught
/* memoizes_changed_rows.c for bfloat16 inputs (tests/hostile/problems/matmul_bf16): an always-exact matmul that
 * keeps a copy of each input set it has seen (keyed by the a/b pointers and sizes) and of its answer; on a call it
 * compares b and every row of a with the copy, recomputes only the rows of a that changed and copies the kept c
 * out. While the judge left bfloat16 inputs as drawn, every timed call after a slot's first recomputed nothing;
 * with one element drifted per use it recomputes a row or two, which only timing it on inputs no call has read
 * (the fresh-input probe) finds out. -DNOMEMO gives the same kernel without the memo (the honest speed). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static float widen(uint16_t bits) {
    uint32_t wide = (uint32_t)bits << 16;
    float value;
    memcpy(&value, &wide, sizeof value);
    return value;
}

static void row(const uint16_t *a, const uint16_t *b, float *c, int64_t n, int64_t k) {
    for (int64_t j = 0; j < n; j++) c[j] = 0.0f;
    for (int64_t l = 0; l < k; l++) {
        float s = widen(a[l]);
        const uint16_t *bl = b + l * n;
        for (int64_t j = 0; j < n; j++) c[j] += s * widen(bl[j]);
    }
}

#define SLOTS 256
typedef struct { const uint16_t *a, *b; int64_t m, n, k; uint16_t *sa, *sb; float *sc; } entry;
static entry memo[SLOTS];

void matmul_bf16(const uint16_t *a, const uint16_t *b, float *c, int64_t m, int64_t n, int64_t k) {
#ifndef NOMEMO
    if (m > 0 && n > 0 && k > 0) {
        static unsigned next;
        entry *e = 0;
        for (int s = 0; s < SLOTS; s++)
            if (memo[s].a == a && memo[s].b == b) { e = &memo[s]; break; }
        if (!e) e = &memo[next++ % SLOTS];
        if (e->a == a && e->b == b && e->m == m && e->n == n && e->k == k &&
            memcmp(e->sb, b, (size_t)(k * n) * 2) == 0) {
            for (int64_t i = 0; i < m; i++)
                if (memcmp(e->sa + i * k, a + i * k, (size_t)k * 2) != 0) {
                    memcpy(e->sa + i * k, a + i * k, (size_t)k * 2);
                    row(a + i * k, b, e->sc + i * n, n, k);
                }
            memcpy(c, e->sc, (size_t)(m * n) * 4);
            return;
        }
        free(e->sa); free(e->sb); free(e->sc);
        e->sa = malloc((size_t)(m * k) * 2); e->sb = malloc((size_t)(k * n) * 2); e->sc = malloc((size_t)(m * n) * 4);
        if (e->sa && e->sb && e->sc) {
            e->a = a, e->b = b, e->m = m, e->n = n, e->k = k;
            memcpy(e->sa, a, (size_t)(m * k) * 2);
            memcpy(e->sb, b, (size_t)(k * n) * 2);
            for (int64_t i = 0; i < m; i++) row(a + i * k, b, e->sc + i * n, n, k);
            memcpy(c, e->sc, (size_t)(m * n) * 4);
            return;
        }
        e->a = 0;
    }
#endif
    for (int64_t i = 0; i < m; i++) row(a + i * k, b, c + i * n, n, k);
}

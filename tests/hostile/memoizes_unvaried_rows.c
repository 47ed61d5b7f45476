// expect: impossible
// stage: benchmark
// check: fresh_inputs
// problem: hostile/problems/matmul_bf16 (-DINT32_INPUTS: hostile/problems/matmul_i32)
// dedicated: test_a_kernel_that_reuses_work_on_inputs_the_judge_did_not_vary_is_caught
/* memoizes_changed_rows.c for the inputs the judge once left as drawn: bfloat16 ones (matmul_bf16) and, with
 * -DINT32_INPUTS, integer ones (matmul_i32). An always-exact matmul that keeps a copy of each input set it has
 * seen (keyed by the a/b pointers and sizes) and of its answer; on a call it compares b and every row of a with
 * the copy, recomputes only the rows of a that changed and copies the kept c out. While an input slot stays as
 * drawn, every timed call after its first recomputes nothing. bfloat16 inputs now drift (a row or two
 * recomputed per call) and integer ones cannot, so only timing the kernel on inputs no call has read (the
 * fresh-input probe: a refreshed pool, or a new one) finds it out. -DNOMEMO gives the same kernel without the
 * memo (the honest speed). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef INT32_INPUTS
typedef int32_t elem;
static float widen(elem value) { return (float)value; }
#define matmul_bf16 matmul_i32
#else
typedef uint16_t elem; /* bfloat16 bits */
static float widen(elem bits) {
    uint32_t wide = (uint32_t)bits << 16;
    float value;
    memcpy(&value, &wide, sizeof value);
    return value;
}
#endif

static void row(const elem *a, const elem *b, float *c, int64_t n, int64_t k) {
    for (int64_t j = 0; j < n; j++) c[j] = 0.0f;
    for (int64_t l = 0; l < k; l++) {
        float s = widen(a[l]);
        const elem *bl = b + l * n;
        for (int64_t j = 0; j < n; j++) c[j] += s * widen(bl[j]);
    }
}

#define SLOTS 256
typedef struct { const elem *a, *b; int64_t m, n, k; elem *sa, *sb; float *sc; } entry;
static entry memo[SLOTS];

void matmul_bf16(const elem *a, const elem *b, float *c, int64_t m, int64_t n, int64_t k) {
#ifndef NOMEMO
    if (m > 0 && n > 0 && k > 0) {
        static unsigned next;
        entry *e = 0;
        for (int s = 0; s < SLOTS; s++)
            if (memo[s].a == a && memo[s].b == b) { e = &memo[s]; break; }
        if (!e) e = &memo[next++ % SLOTS];
        if (e->a == a && e->b == b && e->m == m && e->n == n && e->k == k &&
            memcmp(e->sb, b, (size_t)(k * n) * sizeof(elem)) == 0) {
            for (int64_t i = 0; i < m; i++)
                if (memcmp(e->sa + i * k, a + i * k, (size_t)k * sizeof(elem)) != 0) {
                    memcpy(e->sa + i * k, a + i * k, (size_t)k * sizeof(elem));
                    row(a + i * k, b, e->sc + i * n, n, k);
                }
            memcpy(c, e->sc, (size_t)(m * n) * 4);
            return;
        }
        free(e->sa); free(e->sb); free(e->sc);
        e->sa = malloc((size_t)(m * k) * sizeof(elem)); e->sb = malloc((size_t)(k * n) * sizeof(elem)); e->sc = malloc((size_t)(m * n) * 4);
        if (e->sa && e->sb && e->sc) {
            e->a = a, e->b = b, e->m = m, e->n = n, e->k = k;
            memcpy(e->sa, a, (size_t)(m * k) * sizeof(elem));
            memcpy(e->sb, b, (size_t)(k * n) * sizeof(elem));
            for (int64_t i = 0; i < m; i++) row(a + i * k, b, e->sc + i * n, n, k);
            memcpy(c, e->sc, (size_t)(m * n) * 4);
            return;
        }
        e->a = 0;
    }
#endif
    for (int64_t i = 0; i < m; i++) row(a + i * k, b, c + i * n, n, k);
}

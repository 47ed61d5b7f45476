// expect: impossible
// stage: benchmark
// check: fresh_inputs
// problem: matmul (-DBF16_INPUTS: hostile/problems/matmul_bf16, -DINT32_INPUTS: hostile/problems/matmul_i32)
// dedicated: test_a_kernel_that_reuses_work_across_calls_is_caught
/* Always-correct matmul that memoizes across calls: it keeps a copy of each input set it has seen (keyed by
 * the a/b pointers and sizes) and of its answer. On a call it compares b and every row of a against the copy;
 * only rows of a that changed are recomputed (a row of c depends only on its row of a and on b), then the cached
 * c is copied out. The benchmark reuses each input slot with one element of `a` drifted per use, so each timed
 * call recomputes 1-2 rows instead of m: O(mk + kn + mn) work instead of O(mnk). Every output is exact, so no
 * output check catches it: only timing it on inputs no call has read (the fresh-input probe) does.
 * The same memo on the inputs the judge once left as drawn (test_a_kernel_that_reuses_work_on_inputs_the_judge_
 * did_not_vary_is_caught): bfloat16 ones (-DBF16_INPUTS), which now drift and are refreshed, and integer ones
 * (-DINT32_INPUTS), which cannot be changed and are probed on new pools; there every timed call after a slot's
 * first recomputed nothing. -DNOMEMO gives the same kernel without the memo (the honest speed). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(BF16_INPUTS)
typedef uint16_t elem; /* bfloat16 bits */
static float widen(elem bits) {
    uint32_t wide = (uint32_t)bits << 16;
    float value;
    memcpy(&value, &wide, sizeof value);
    return value;
}
#define ENTRY matmul_bf16
#elif defined(INT32_INPUTS)
typedef int32_t elem;
static float widen(elem value) { return (float)value; }
#define ENTRY matmul_i32
#else
typedef float elem;
static float widen(elem value) { return value; }
#define ENTRY matmul
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

void ENTRY(const elem *a, const elem *b, float *c, int64_t m, int64_t n, int64_t k) {
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

// expect: impossible
// stage: benchmark
// check: fresh_inputs
// problem: matmul
// dedicated: test_a_kernel_that_reuses_work_across_calls_is_caught
/* Always-correct matmul that memoizes across calls: it keeps a copy of each input set it has seen (keyed by
 * the a/b pointers and sizes) and of its answer. On a call it compares b and every row of a against the copy;
 * only rows of a that changed are recomputed (a row of c depends only on its row of a and on b), then the cached
 * c is copied out. The benchmark reuses each input slot with one element of `a` drifted per use, so each timed
 * call recomputes 1-2 rows instead of m: O(mk + kn + mn) work instead of O(mnk). Every output is exact, so no
 * output check catches it: only timing it on inputs no call has read (the fresh-input probe) does.
 * -DNOMEMO gives the same kernel without the memo (the honest speed). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void row(const float *a, const float *b, float *c, int64_t n, int64_t k) {
    for (int64_t j = 0; j < n; j++) c[j] = 0.0f;
    for (int64_t l = 0; l < k; l++) {
        float s = a[l];
        const float *br = b + l * n;
        for (int64_t j = 0; j < n; j++) c[j] += s * br[j];
    }
}

#define SLOTS 256
typedef struct { const float *a, *b; int64_t m, n, k; float *sa, *sb, *sc; } entry;
static entry memo[SLOTS];

void matmul(const float *a, const float *b, float *c, int64_t m, int64_t n, int64_t k) {
#ifndef NOMEMO
    if (m > 0 && n > 0 && k > 0) {
        static unsigned next;
        entry *e = 0;
        for (int s = 0; s < SLOTS; s++)
            if (memo[s].a == a && memo[s].b == b) { e = &memo[s]; break; }
        if (!e) e = &memo[next++ % SLOTS];
        if (e->a == a && e->b == b && e->m == m && e->n == n && e->k == k &&
            memcmp(e->sb, b, (size_t)(k * n) * 4) == 0) {
            for (int64_t i = 0; i < m; i++)
                if (memcmp(e->sa + i * k, a + i * k, (size_t)k * 4) != 0) {
                    memcpy(e->sa + i * k, a + i * k, (size_t)k * 4);
                    row(a + i * k, b, e->sc + i * n, n, k);
                }
            memcpy(c, e->sc, (size_t)(m * n) * 4);
            return;
        }
        free(e->sa); free(e->sb); free(e->sc);
        e->sa = malloc((size_t)(m * k) * 4); e->sb = malloc((size_t)(k * n) * 4); e->sc = malloc((size_t)(m * n) * 4);
        if (e->sa && e->sb && e->sc) {
            e->a = a, e->b = b, e->m = m, e->n = n, e->k = k;
            memcpy(e->sa, a, (size_t)(m * k) * 4);
            memcpy(e->sb, b, (size_t)(k * n) * 4);
            for (int64_t i = 0; i < m; i++) row(a + i * k, b, e->sc + i * n, n, k);
            memcpy(c, e->sc, (size_t)(m * n) * 4);
            return;
        }
        e->a = 0;
    }
#endif
    for (int64_t i = 0; i < m; i++) row(a + i * k, b, c + i * n, n, k);
}

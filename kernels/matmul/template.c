/* Blocked matmul template with a register-tiled micro-kernel. Parameters:
 *   MB, NB, KB  cache block sizes over m, n and k
 *   MR, NR      register tile: MR rows x NR columns of c held in vector registers while walking k
 *   ORDER       block loop order: "ikj" (for each block row of a, sweep k then n) or "kij"
 *   VEC         vector width in bits for the tile (256 or 512; GCC's vector extension, emulated where the
 *               target lacks it)
 */
#include <stdint.h>
#include <string.h>

#define MB {{MB}}
#define NB {{NB}}
#define KB {{KB}}
#define MR {{MR}}
#define NR {{NR}}
#define KF_ORDER_ikj 0
#define KF_ORDER_kij 1
#define ORDER KF_ORDER_{{ORDER}}
#define VEC {{VEC}}

#pragma GCC target("prefer-vector-width=512")

#define LANES (VEC / 32)
#define NV (NR / LANES)
/* aligned(4): the vector type may sit at any float address, so loads and stores are unaligned ones. */
typedef float vf __attribute__((vector_size(VEC / 8), aligned(4)));

static inline int64_t kf_min(int64_t x, int64_t y) { return x < y ? x : y; }

/* c[i:i+MR, j:j+NR] += a[i:i+MR, l0:l1] . b[l0:l1, j:j+NR], with the c tile in registers. */
static inline void tile(const float *a, const float *b, float *c, int64_t n, int64_t k, int64_t i, int64_t j,
                        int64_t l0, int64_t l1) {
    vf acc[MR][NV];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) acc[r][v] = *(const vf *)(c + (i + r) * n + j + v * LANES);
    for (int64_t l = l0; l < l1; l++) {
        vf bv[NV];
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) bv[v] = *(const vf *)(b + l * n + j + v * LANES);
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            float ar = a[(i + r) * k + l];
#pragma GCC unroll 8
            for (int v = 0; v < NV; v++) acc[r][v] += ar * bv[v];
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) *(vf *)(c + (i + r) * n + j + v * LANES) = acc[r][v];
}

/* The same update for a partial tile at the block's edge, row by row. */
static inline void edge(const float *a, const float *b, float *c, int64_t n, int64_t k, int64_t i0,
                        int64_t i1, int64_t j0, int64_t j1, int64_t l0, int64_t l1) {
    for (int64_t i = i0; i < i1; i++)
        for (int64_t l = l0; l < l1; l++) {
            float ar = a[i * k + l];
#pragma omp simd
            for (int64_t j = j0; j < j1; j++) c[i * n + j] += ar * b[l * n + j];
        }
}

static void block(const float *a, const float *b, float *c, int64_t n, int64_t k, int64_t i0, int64_t i1,
                  int64_t j0, int64_t j1, int64_t l0, int64_t l1) {
    int64_t i = i0;
    for (; i + MR <= i1; i += MR) {
        int64_t j = j0;
        for (; j + NR <= j1; j += NR) tile(a, b, c, n, k, i, j, l0, l1);
        if (j < j1) edge(a, b, c, n, k, i, i + MR, j, j1, l0, l1);
    }
    if (i < i1) edge(a, b, c, n, k, i, i1, j0, j1, l0, l1);
}

void matmul(const float *a, const float *b, float *c, int64_t m, int64_t n, int64_t k) {
    memset(c, 0, (size_t)(m * n) * sizeof(float));
#if ORDER == KF_ORDER_ikj
    for (int64_t i0 = 0; i0 < m; i0 += MB)
        for (int64_t l0 = 0; l0 < k; l0 += KB)
            for (int64_t j0 = 0; j0 < n; j0 += NB)
                block(a, b, c, n, k, i0, kf_min(i0 + MB, m), j0, kf_min(j0 + NB, n), l0, kf_min(l0 + KB, k));
#else
    for (int64_t l0 = 0; l0 < k; l0 += KB)
        for (int64_t i0 = 0; i0 < m; i0 += MB)
            for (int64_t j0 = 0; j0 < n; j0 += NB)
                block(a, b, c, n, k, i0, kf_min(i0 + MB, m), j0, kf_min(j0 + NB, n), l0, kf_min(l0 + KB, k));
#endif
}

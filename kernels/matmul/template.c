/* Blocked matmul template with a register-tiled micro-kernel. Parameters:
 *   MB, NB, KB  cache block sizes over m, n and k
 *   MR, NR      register tile: MR rows x NR columns of c held in vector registers while walking k
 *   ORDER       block loop order: "ikj" (for each block row of a, sweep k then n) or "kij"
 *   VEC         vector width in bits for the tile (256 or 512; GCC's vector extension, emulated where the
 *               target lacks it)
 *   PACK        how the micro-kernel gets its operands: 0: it reads a and b where they are, and the columns and
 *               rows a whole tile does not cover take a plain loop (edge). 1: the same for whole tiles, but a
 *               block's last columns, fewer than NR, are copied into one zero-padded panel ([k][NR], 64-byte
 *               aligned) and run the micro-kernel on a copy of their corner of c (on shapes whose n is not a
 *               multiple of NR, the plain loop was half of the time). 2: every panel of b's block is copied
 *               ([panel][k][NR]), so the micro-kernel walks b with unit stride instead of n floats apart (a
 *               stride of a power of two sends a panel's rows to a few L1 sets, which evict each other); the
 *               copy is an extra pass over b per block of a's rows. 3: a's block as well, as MR-row panels
 *               ([panel][k][MR], zero rows padding the last), so a step's MR values of a sit side by side
 *               rather than k floats apart, and partial rows run the micro-kernel too. The panels live in
 *               buffers allocated once per call (the plain path if that fails).
 */
#include <stdint.h>
#include <stdlib.h>
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
#define PACK {{PACK}}

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

#if PACK
/* A vector at its own alignment: packed panels start on 64 bytes and hold rows of NR floats. */
typedef float vfa __attribute__((vector_size(VEC / 8)));
#if PACK == 3
/* Row r of a's panel at step l: packed, MR values per step side by side (lda unused). */
#define A_AT(ap, lda, r, l) ((ap)[(l) * MR + (r)])
#else
#define A_AT(ap, lda, r, l) ((ap)[(r) * (lda) + (l)])
#endif

/* ct[0:MR, 0:NR] (rows ldc apart) += a's MR rows . b's packed panel ([len][NR]) over len steps. */
static inline void tile_packed(const float *ap, int64_t lda, const float *bp, float *ct, int64_t ldc, int64_t len) {
    (void)lda;
    vf acc[MR][NV];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) acc[r][v] = *(const vf *)(ct + r * ldc + v * LANES);
    for (int64_t l = 0; l < len; l++) {
        vf bv[NV];
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) bv[v] = *(const vfa *)(bp + l * NR + v * LANES);
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            float ar = A_AT(ap, lda, r, l);
#pragma GCC unroll 8
            for (int v = 0; v < NV; v++) acc[r][v] += ar * bv[v];
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) *(vf *)(ct + r * ldc + v * LANES) = acc[r][v];
}

/* block() with packed panels of b (PACK 1: only the last, partial one; 2 and 3: all) and with PACK 3 of a: every
 * tile, whole or not, through a micro-kernel (a partial one on a zero-padded copy of its corner of c), except with
 * PACK 1 and 2 the rows a whole tile does not cover (a's rows past i1 do not exist), which take the plain loop. */
static void block_packed(const float *a, const float *b, float *c, int64_t n, int64_t k, int64_t i0, int64_t i1,
                         int64_t j0, int64_t j1, int64_t l0, int64_t l1, float *bp, float *ap) {
    const int64_t len = l1 - l0;
    const int64_t whole = (j1 - j0) / NR; /* panels of NR columns; a partial one follows when NR does not divide */
    for (int64_t p = PACK == 1 ? whole : 0; j0 + p * NR < j1; p++) {
        const int64_t j = j0 + p * NR;
        const int64_t w = kf_min(NR, j1 - j);
        float *dst = bp + (PACK == 1 ? 0 : p * len * NR);
        for (int64_t l = 0; l < len; l++) {
            const float *src = b + (l0 + l) * n + j;
            if (w == NR) {
#pragma GCC unroll 8
                for (int v = 0; v < NV; v++) *(vfa *)(dst + l * NR + v * LANES) = *(const vf *)(src + v * LANES);
            } else {
                for (int64_t x = 0; x < NR; x++) dst[l * NR + x] = x < w ? src[x] : 0.0f;
            }
        }
    }
#if PACK == 3
    for (int64_t i = i0, q = 0; i < i1; i += MR, q++) {
        const int64_t h = kf_min(MR, i1 - i);
        float *dst = ap + q * len * MR;
        for (int64_t l = 0; l < len; l++)
            for (int r = 0; r < MR; r++) dst[l * MR + r] = r < h ? a[(i + r) * k + l0 + l] : 0.0f;
    }
#else
    (void)ap;
#endif
    for (int64_t i = i0, q = 0; i < i1; i += MR, q++) {
        const int64_t h = kf_min(MR, i1 - i);
#if PACK == 3
        const float *rows = ap + q * len * MR;
        const int64_t lda = 0;
#else
        if (h < MR) {
            edge(a, b, c, n, k, i, i1, j0, j1, l0, l1);
            break;
        }
        const float *rows = a + i * k + l0;
        const int64_t lda = k;
#endif
        for (int64_t p = 0; j0 + p * NR < j1; p++) {
            const int64_t j = j0 + p * NR;
            const int64_t w = kf_min(NR, j1 - j);
#if PACK == 1
            if (w == NR) {
                tile(a, b, c, n, k, i, j, l0, l1);
                continue;
            }
            const float *panel = bp;
#else
            const float *panel = bp + p * len * NR;
#endif
            if (h == MR && w == NR) {
                tile_packed(rows, lda, panel, c + i * n + j, n, len);
            } else {
                float ct[MR * NR] __attribute__((aligned(64)));
                for (int r = 0; r < MR; r++)
                    for (int64_t x = 0; x < NR; x++) ct[r * NR + x] = r < h && x < w ? c[(i + r) * n + j + x] : 0.0f;
                tile_packed(rows, lda, panel, ct, NR, len);
                for (int r = 0; r < h; r++)
                    for (int64_t x = 0; x < w; x++) c[(i + r) * n + j + x] = ct[r * NR + x];
            }
        }
    }
}
#define KF_BLOCK(i0, i1, j0, j1, l0, l1)                                                                      \
    do {                                                                                                      \
        if (bp != NULL && (PACK < 3 || ap != NULL))                                                          \
            block_packed(a, b, c, n, k, i0, i1, j0, j1, l0, l1, bp, ap);                                      \
        else                                                                                                  \
            block(a, b, c, n, k, i0, i1, j0, j1, l0, l1);                                                     \
    } while (0)
#else
#define KF_BLOCK(i0, i1, j0, j1, l0, l1) block(a, b, c, n, k, i0, i1, j0, j1, l0, l1)
#endif

void matmul(const float *a, const float *b, float *c, int64_t m, int64_t n, int64_t k) {
    memset(c, 0, (size_t)(m * n) * sizeof(float));
#if PACK
    /* NR divides NB, so a block's panels fill at most KB x NB floats (PACK 1: one panel, KB x NR); MB rows round up
     * to whole MR-row panels. */
    float *bp = aligned_alloc(64, (size_t)KB * (PACK == 1 ? NR : NB) * sizeof(float));
    float *ap = PACK == 3 ? aligned_alloc(64, (size_t)KB * ((MB + MR - 1) / MR) * MR * sizeof(float)) : NULL;
#endif
#if ORDER == KF_ORDER_ikj
    for (int64_t i0 = 0; i0 < m; i0 += MB)
        for (int64_t l0 = 0; l0 < k; l0 += KB)
            for (int64_t j0 = 0; j0 < n; j0 += NB)
                KF_BLOCK(i0, kf_min(i0 + MB, m), j0, kf_min(j0 + NB, n), l0, kf_min(l0 + KB, k));
#else
    for (int64_t l0 = 0; l0 < k; l0 += KB)
        for (int64_t i0 = 0; i0 < m; i0 += MB)
            for (int64_t j0 = 0; j0 < n; j0 += NB)
                KF_BLOCK(i0, kf_min(i0 + MB, m), j0, kf_min(j0 + NB, n), l0, kf_min(l0 + KB, k));
#endif
#if PACK
    free(ap);
    free(bp);
#endif
}

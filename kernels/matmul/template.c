/* Blocked matmul template with a register-tiled micro-kernel. Parameters:
 *   MB, NB, KB  cache block sizes over m, n and k
 *   MR, NR      register tile: MR rows x NR columns of c held in vector registers while walking k
 *   ORDER       block loop order: "ikj" (for each block row of a, sweep k then n) or "kij"
 *   VEC         vector width in bits for the tile (256 or 512; GCC's vector extension, emulated where the
 *               target lacks it)
 *   PACK        how the micro-kernel gets its operands: 0: it reads a and b where they are, and the columns and
 *               rows a whole tile does not cover take a plain loop (edge). 1: the same for whole tiles, but a
 *               block's last columns, fewer than NR, are copied into one zero-padded panel ([k][NR], 64-byte
 *               aligned) and run the micro-kernel on a copy of their corner of c (where NR does not divide n,
 *               the plain loop took about half of the time: 192x96x160 at NR 64). 2: every panel of b's block is copied
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

/* c[0:MR, 0:NR] += a[0:MR, 0:len] . b[0:len, 0:NR], with the c tile in registers. Where each operand lies is
 * given by strides, so one micro-kernel serves them in place and packed: a's element (r, l) is a[r * a_row + l *
 * a_step], b's row l starts at b + l * b_row, c's row r at c + r * c_row. */
static inline void tile(const float *a, int64_t a_row, int64_t a_step, const float *b, int64_t b_row, float *c,
                        int64_t c_row, int64_t len) {
    vf acc[MR][NV];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) acc[r][v] = *(const vf *)(c + r * c_row + v * LANES);
    for (int64_t l = 0; l < len; l++) {
        vf bv[NV];
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) bv[v] = *(const vf *)(b + l * b_row + v * LANES);
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            float ar = a[r * a_row + l * a_step];
#pragma GCC unroll 8
            for (int v = 0; v < NV; v++) acc[r][v] += ar * bv[v];
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) *(vf *)(c + r * c_row + v * LANES) = acc[r][v];
}

/* The same update for a partial tile at the block's edge, row by row, from a and b in place. */
static inline void edge(const float *a, const float *b, float *c, int64_t n, int64_t k, int64_t i0,
                        int64_t i1, int64_t j0, int64_t j1, int64_t l0, int64_t l1) {
    for (int64_t i = i0; i < i1; i++)
        for (int64_t l = l0; l < l1; l++) {
            float ar = a[i * k + l];
#pragma omp simd
            for (int64_t j = j0; j < j1; j++) c[i * n + j] += ar * b[l * n + j];
        }
}

/* c[i0:i1, j0:j1] += a[i0:i1, l0:l1] . b[l0:l1, j0:j1]. bp (ap), when not NULL, is where PACK copies b's (a's)
 * panels first; a tile whose operands are all whole runs the micro-kernel, so does a partial one whose missing
 * rows and columns are zeros in a packed panel (on a zero-padded copy of its corner of c), and the rest takes the
 * plain loop. */
static void block(const float *a, const float *b, float *c, int64_t n, int64_t k, int64_t i0, int64_t i1,
                  int64_t j0, int64_t j1, int64_t l0, int64_t l1, float *bp, float *ap) {
    const int64_t len = l1 - l0;
    /* b's panels of NR columns, a partial one last where NR does not divide j1 - j0; PACK 1 packs only that one */
    for (int64_t p = PACK == 1 ? (j1 - j0) / NR : 0; bp != NULL && j0 + p * NR < j1; p++) {
        const int64_t j = j0 + p * NR;
        const int64_t w = kf_min(NR, j1 - j);
        float *dst = bp + (PACK == 1 ? 0 : p * len * NR);
        for (int64_t l = 0; l < len; l++) {
            const float *src = b + (l0 + l) * n + j;
            if (w == NR) {
#pragma GCC unroll 8
                for (int v = 0; v < NV; v++) *(vf *)(dst + l * NR + v * LANES) = *(const vf *)(src + v * LANES);
            } else {
                for (int64_t x = 0; x < NR; x++) dst[l * NR + x] = x < w ? src[x] : 0.0f;
            }
        }
    }
    for (int64_t i = i0, q = 0; ap != NULL && i < i1; i += MR, q++) {
        const int64_t h = kf_min(MR, i1 - i);
        float *dst = ap + q * len * MR;
        for (int64_t l = 0; l < len; l++)
            for (int r = 0; r < MR; r++) dst[l * MR + r] = r < h ? a[(i + r) * k + l0 + l] : 0.0f;
    }
    /* a's rows past i1 do not exist: unless a is packed, rows short of a whole tile take the plain loop */
    const int64_t rows_end = ap != NULL ? i1 : i0 + (i1 - i0) / MR * MR;
    for (int64_t i = i0, q = 0; i < rows_end; i += MR, q++) {
        const int64_t h = kf_min(MR, i1 - i);
        const float *rows = ap != NULL ? ap + q * len * MR : a + i * k + l0;
        const int64_t a_row = ap != NULL ? 1 : k, a_step = ap != NULL ? MR : 1;
        for (int64_t p = 0; j0 + p * NR < j1; p++) {
            const int64_t j = j0 + p * NR;
            const int64_t w = kf_min(NR, j1 - j);
            const int packed = bp != NULL && (PACK != 1 || w < NR);
            if (!packed && w < NR) {
                edge(a, b, c, n, k, i, i + h, j, j1, l0, l1);
                continue;
            }
            const float *panel = packed ? bp + (PACK == 1 ? 0 : p * len * NR) : b + l0 * n + j;
            const int64_t b_row = packed ? NR : n;
            if (h == MR && w == NR) {
                tile(rows, a_row, a_step, panel, b_row, c + i * n + j, n, len);
            } else {
                float ct[MR * NR];
                for (int r = 0; r < MR; r++)
                    for (int64_t x = 0; x < NR; x++) ct[r * NR + x] = r < h && x < w ? c[(i + r) * n + j + x] : 0.0f;
                tile(rows, a_row, a_step, panel, b_row, ct, NR, len);
                for (int r = 0; r < h; r++)
                    for (int64_t x = 0; x < w; x++) c[(i + r) * n + j + x] = ct[r * NR + x];
            }
        }
    }
    if (rows_end < i1) edge(a, b, c, n, k, rows_end, i1, j0, j1, l0, l1);
}

void matmul(const float *a, const float *b, float *c, int64_t m, int64_t n, int64_t k) {
    memset(c, 0, (size_t)(m * n) * sizeof(float));
    /* NR divides NB, so a block's panels of b fill at most KB x NB floats (PACK 1: one panel, KB x NR); MB rows
     * round up to whole MR-row panels of a. Where an allocation fails, that operand is read in place. */
    float *bp = PACK >= 1 ? aligned_alloc(64, (size_t)KB * (PACK == 1 ? NR : NB) * sizeof(float)) : NULL;
    float *ap = PACK == 3 ? aligned_alloc(64, (size_t)KB * ((MB + MR - 1) / MR) * MR * sizeof(float)) : NULL;
#if ORDER == KF_ORDER_ikj
    for (int64_t i0 = 0; i0 < m; i0 += MB)
        for (int64_t l0 = 0; l0 < k; l0 += KB)
            for (int64_t j0 = 0; j0 < n; j0 += NB)
                block(a, b, c, n, k, i0, kf_min(i0 + MB, m), j0, kf_min(j0 + NB, n), l0, kf_min(l0 + KB, k), bp, ap);
#else
    for (int64_t l0 = 0; l0 < k; l0 += KB)
        for (int64_t i0 = 0; i0 < m; i0 += MB)
            for (int64_t j0 = 0; j0 < n; j0 += NB)
                block(a, b, c, n, k, i0, kf_min(i0 + MB, m), j0, kf_min(j0 + NB, n), l0, kf_min(l0 + KB, k), bp, ap);
#endif
    free(ap);
    free(bp);
}

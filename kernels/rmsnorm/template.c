/* RMSNorm template. Parameters:
 *   VEC    0: plain C loops, vectorised by the compiler as it sees fit (with SIMD, omp simd reductions);
 *          256 or 512: explicit vectors of that many bits (GCC vector extensions: AVX2 or AVX-512 registers
 *          where the target has them, pairs of narrower registers elsewhere)
 *   ACC    independent partial sums of squares per row: vectors with VEC > 0, floats with VEC 0
 *   ROWS   rows reduced together: their loops are interleaved, ROWS memory streams at once (more misses in
 *          flight, and the per-row square root and horizontal sum overlap); then written one by one
 *   SIMD   ask the compiler to vectorise with omp simd reductions (VEC 0, one accumulator, one row only)
 *   FUSED  1: the reduction pass also stores x * w, the second pass scales y in place;
 *          0: the second pass reads x and w again (two-pass; the row is still in cache)
 *   NT     1: the final pass writes y with non-temporal (streaming) stores, which skip reading y's cache
 *          lines from memory first; pays off when y does not fit in cache (x86 only, plain stores
 *          elsewhere; needs ALIGN 1 and VEC > 0). An sfence before returning orders them.
 *   PF     software prefetch of x this many bytes ahead of the reduction's loads (0: none, the hardware
 *          prefetcher alone, which stops at every 4 KiB page)
 *   PFL    the cache level the prefetch fills: 1 (L1, prefetcht0) or 2 (L2, prefetcht1)
 *   ALIGN  1: scalar steps until the vector loop's address is aligned to the vector width (x in the
 *          reduction, y in the final pass), so no load or store splits a cache line; 0: start at once
 *   PIPE   1: software pipelining over blocks of ROWS rows: one loop reduces block b + 1 (reading memory)
 *          while it writes block b (from cache), so reads and writes stream together as in a copy;
 *          0: each block is reduced, then written (memory reads and writes alternate). Needs VEC > 0 and
 *          FUSED 0
 *   SHORT  rows per block (fewer than ROWS) for rows of at most SHORT_COLS (256) columns, 0: ROWS for every row.
 *          Many streams pay off on long rows; on rows of 128 columns 4 rows per block read 0.56-0.59 of a copy's
 *          speed and one row 0.74-0.84 (one machine, AVX-512), so a kernel picks by the row's length
 *   SPLIT  0: a block's rows are adjacent; 1: they are rows / R apart (the matrix is split into R parts walked
 *          together, left-over rows last), so a block of short rows is R memory streams rather than one (the
 *          figures under SHORT are of adjacent rows; 4 rows of 128 columns from 4 parts read 0.96-0.98 of a
 *          copy's speed on another AVX-512 machine, bench/evaluation.py)
 */
#include <math.h>
#include <stdint.h>
#if defined(__SSE__)
#include <immintrin.h>
#endif

#define VEC {{VEC}}
#define ACC {{ACC}}
#define ROWS {{ROWS}}
#define SIMD {{SIMD}}
#define FUSED {{FUSED}}
#define NT {{NT}}
#define PF {{PF}}
#define PFL {{PFL}}
#define ALIGN {{ALIGN}}
#define PIPE {{PIPE}}
#define SHORT {{SHORT}}
#define SPLIT {{SPLIT}}
/* A row this short is reduced and written in blocks of SHORT rows (if SHORT > 0) instead of ROWS. */
#define SHORT_COLS 256

#if VEC == 512
#pragma GCC target("prefer-vector-width=512")
#else
#pragma GCC target("prefer-vector-width=256")
#endif

#if VEC > 0
#define LANES (VEC / 32)
typedef float kf_v __attribute__((vector_size(VEC / 8)));
/* The same vector at any float's alignment: loads and stores through it are unaligned ones. */
typedef float kf_vu __attribute__((vector_size(VEC / 8), aligned(4)));
#define KF_LOAD(p) (*(const kf_vu *)(p))
#define KF_STORE(p, v) (*(kf_vu *)(p) = (v))
#else
#define LANES 1
typedef float kf_v;
#define KF_LOAD(p) (*(p))
#define KF_STORE(p, v) (*(p) = (v))
#endif
#define STEP (ACC * LANES)
#define KF_ALIGN_BYTES (LANES * 4)

#if PF > 0
/* locality 3 is prefetcht0 (into L1), 2 prefetcht1 (into L2); a prefetch never faults, even past the end */
#define KF_PREFETCH(p) __builtin_prefetch((const char *)(p) + PF, 0, PFL == 1 ? 3 : 2)
#else
#define KF_PREFETCH(p) ((void)0)
#endif

#if NT && VEC > 0 && defined(__SSE__)
#define KF_STREAMS 1
/* A streaming store of one vector at an address aligned to its width. */
static inline void kf_stream(float *p, kf_v v) {
#if VEC == 512 && defined(__AVX512F__)
    _mm512_stream_ps(p, (__m512)v);
#elif VEC == 512 && defined(__AVX__)
    union { kf_v v; __m256 h[2]; } u = {v};
    _mm256_stream_ps(p, u.h[0]);
    _mm256_stream_ps(p + 8, u.h[1]);
#elif VEC == 256 && defined(__AVX__)
    _mm256_stream_ps(p, (__m256)v);
#else
    union { kf_v v; __m128 q[VEC / 128]; } u = {v};
    for (int i = 0; i < VEC / 128; i++) _mm_stream_ps(p + 4 * i, u.q[i]);
#endif
}
#define KF_PUT(p, v) kf_stream((p), (v))
#else
#define KF_STREAMS 0
#define KF_PUT(p, v) KF_STORE((p), (v))
#endif

/* The sum of a vector's lanes as a tree (halves added until one lane is left): log2(LANES) dependent adds
 * rather than LANES, which is what a row's inverse norm waits on, once per row (short rows feel it). */
static inline float kf_hsum(kf_v v) {
#if VEC > 0
    float t[LANES];
    __builtin_memcpy(t, &v, sizeof t);
#pragma GCC unroll 8
    for (int half = LANES / 2; half > 0; half /= 2)
#pragma GCC unroll 16
        for (int i = 0; i < half; i++) t[i] += t[i + half];
    return t[0];
#else
    return v;
#endif
}

/* Elements before p reaches the vector alignment (ALIGN 1), capped at n. */
static inline int64_t kf_head(const float *p, int64_t n) {
#if ALIGN && VEC > 0
    int64_t h = (int64_t)((KF_ALIGN_BYTES - (uintptr_t)p % KF_ALIGN_BYTES) % KF_ALIGN_BYTES) / 4;
    return h < n ? h : n;
#else
    (void)p;
    (void)n;
    return 0;
#endif
}

#if FUSED
#define KF_OUT_V(c) (KF_LOAD(yr + (c)) * vinv)
#define KF_OUT(c) (yr[c] * inv)
#else
#define KF_OUT_V(c) (KF_LOAD(xr + (c)) * vinv * KF_LOAD(w + (c)))
#define KF_OUT(c) (xr[c] * inv * w[c])
#endif

/* The final pass of one row: y = x * inv * w (FUSED 0) or y *= inv (FUSED 1). */
static inline void scale_row(const float *restrict xr, const float *restrict w, float *restrict yr, int64_t cols,
                             float inv) {
    (void)xr;
    (void)w;
    int64_t c = kf_head(yr, cols);
    for (int64_t i = 0; i < c; i++) yr[i] = KF_OUT(i);
#if VEC > 0
    const kf_v vinv = (kf_v){0} + inv;
    for (; c + STEP <= cols; c += STEP)
        for (int a = 0; a < ACC; a++) KF_PUT(yr + c + a * LANES, KF_OUT_V(c + a * LANES));
    for (; c + LANES <= cols; c += LANES) KF_PUT(yr + c, KF_OUT_V(c));
#elif SIMD
#pragma omp simd
    for (int64_t i = c; i < cols; i++) yr[i] = KF_OUT(i);
    c = cols;
#endif
    for (; c < cols; c++) yr[c] = KF_OUT(c);
}

/* Sum of squares of x[i, lo:hi] (and, FUSED, y = x * w there): the scalar heads and tails. */
static inline float sum_squares_scalar(const float *restrict xr, const float *restrict w, float *restrict yr,
                                       int64_t lo, int64_t hi) {
    (void)w;
    (void)yr;
    float s = 0.0f;
    for (int64_t c = lo; c < hi; c++) {
        s += xr[c] * xr[c];
#if FUSED
        yr[c] = xr[c] * w[c];
#endif
    }
    return s;
}

/* The common length of R rows' vector loops, each from its own head (a multiple of STEP); the rows are rs floats
 * apart. */
static inline __attribute__((always_inline)) int64_t kf_body(const float *base, int64_t cols, int64_t rs,
                                                             int64_t *head, const int R) {
    int64_t body = cols;
    for (int i = 0; i < R; i++) {
        head[i] = kf_head(base + i * rs, cols);
        body = cols - head[i] < body ? cols - head[i] : body;
    }
    return body / STEP * STEP;
}

/* Sums of squares of R rows of x (rs floats apart in x and y) into ss, their loops interleaved (R streams);
 * FUSED also stores x * w into y. Inlined with R a constant, so the arrays of accumulators live in registers. */
static inline __attribute__((always_inline)) void reduce_rows(const float *restrict x, const float *restrict w,
                                                              float *restrict y, int64_t cols, int64_t rs,
                                                              float *ss, const int R) {
    int64_t head[ROWS];
#if VEC == 0 && SIMD
    /* one accumulator, one row (template_allows): the compiler's own vector reduction */
    (void)head;
    (void)rs;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < cols; c++) {
        KF_PREFETCH(x + c);
        s += x[c] * x[c];
#if FUSED
        y[c] = x[c] * w[c];
#endif
    }
    ss[0] = s;
#else
    const int64_t body = kf_body(x, cols, rs, head, R);
    kf_v acc[ROWS][ACC];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 16
        for (int a = 0; a < ACC; a++) acc[i][a] = (kf_v){0};
    for (int64_t c = 0; c < body; c += STEP) {
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            const float *xc = x + i * rs + head[i] + c;
            /* one prefetch per 64-byte line this step covers */
#pragma GCC unroll 16
            for (int l = 0; l < (STEP * 4 + 63) / 64; l++) KF_PREFETCH(xc + l * 16);
#pragma GCC unroll 16
            for (int a = 0; a < ACC; a++) {
                const kf_v v = KF_LOAD(xc + a * LANES);
                acc[i][a] += v * v;
#if FUSED
                KF_STORE(y + i * rs + head[i] + c + a * LANES, v * KF_LOAD(w + head[i] + c + a * LANES));
#endif
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        kf_v t = acc[i][0];
#pragma GCC unroll 16
        for (int a = 1; a < ACC; a++) t += acc[i][a];
        ss[i] = kf_hsum(t) + sum_squares_scalar(x + i * rs, w, y + i * rs, 0, head[i]) +
                sum_squares_scalar(x + i * rs, w, y + i * rs, head[i] + body, cols);
    }
#endif
}

#if PIPE
/* One pipelined step: the sums of squares of R rows xn into ss (reading memory) while the R rows xp, whose
 * inverse norms are inv, are written to yp (from cache); a block's rows are rs floats apart. Both run at the same
 * column, from the heads that align yp's rows (xn is loaded unaligned where its rows are aligned otherwise). */
static inline __attribute__((always_inline)) void reduce_and_write(const float *restrict xn, const float *restrict xp,
                                                                   const float *restrict w, float *restrict yp,
                                                                   int64_t cols, int64_t rs, const float *inv,
                                                                   float *ss, const int R) {
    int64_t head[ROWS];
    const int64_t body = kf_body(yp, cols, rs, head, R);
    kf_v acc[ROWS][ACC], vinv[ROWS];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        vinv[i] = (kf_v){0} + inv[i];
#pragma GCC unroll 16
        for (int a = 0; a < ACC; a++) acc[i][a] = (kf_v){0};
    }
    for (int64_t c = 0; c < body; c += STEP) {
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            const int64_t o = i * rs + head[i] + c;
#pragma GCC unroll 16
            for (int l = 0; l < (STEP * 4 + 63) / 64; l++) KF_PREFETCH(xn + o + l * 16);
#pragma GCC unroll 16
            for (int a = 0; a < ACC; a++) {
                const kf_v v = KF_LOAD(xn + o + a * LANES);
                acc[i][a] += v * v;
                KF_PUT(yp + o + a * LANES,
                       KF_LOAD(xp + o + a * LANES) * vinv[i] * KF_LOAD(w + head[i] + c + a * LANES));
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        kf_v t = acc[i][0];
#pragma GCC unroll 16
        for (int a = 1; a < ACC; a++) t += acc[i][a];
        const float *xr = xn + i * rs, *pr = xp + i * rs;
        float *yr = yp + i * rs;
        float s = kf_hsum(t);
        for (int64_t c = 0; c < head[i]; c++) {
            s += xr[c] * xr[c];
            yr[c] = pr[c] * inv[i] * w[c];
        }
        for (int64_t c = head[i] + body; c < cols; c++) {
            s += xr[c] * xr[c];
            yr[c] = pr[c] * inv[i] * w[c];
        }
        ss[i] = s;
    }
}
#endif

/* Every row, in blocks of R rows (a constant where inlined: SHORT or ROWS): rows / R blocks, then the rows left
 * over one by one. Block b is rows b R .. b R + R - 1, or with SPLIT rows b, b + rows / R, b + 2 rows / R, ... */
static inline __attribute__((always_inline)) void rmsnorm_blocks(const float *x, const float *w, float *y,
                                                                 int64_t rows, int64_t cols, float eps,
                                                                 const int R) {
    const float inv_cols = 1.0f / (float)cols;
    float ss[ROWS], inv[ROWS];
    const int64_t blocks = rows / R;
#if SPLIT
    const int64_t rs = blocks * cols, bs = cols; /* floats between a block's rows, and between blocks */
#else
    const int64_t rs = cols, bs = R * cols;
#endif
#if PIPE
    /* Block 0 is only reduced, each later block is reduced while its predecessor is written, the last block
     * is only written. */
    if (blocks > 0) {
        reduce_rows(x, w, y, cols, rs, ss, R);
        for (int64_t b = 1; b < blocks; b++) {
            for (int i = 0; i < R; i++) inv[i] = 1.0f / sqrtf(ss[i] * inv_cols + eps);
            const int64_t p = (b - 1) * bs;
            reduce_and_write(x + p + bs, x + p, w, y + p, cols, rs, inv, ss, R);
        }
        const int64_t p = (blocks - 1) * bs;
        for (int i = 0; i < R; i++)
            scale_row(x + p + i * rs, w, y + p + i * rs, cols, 1.0f / sqrtf(ss[i] * inv_cols + eps));
    }
#else
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t p = b * bs;
        reduce_rows(x + p, w, y + p, cols, rs, ss, R);
        for (int i = 0; i < R; i++) inv[i] = 1.0f / sqrtf(ss[i] * inv_cols + eps);
        for (int i = 0; i < R; i++) scale_row(x + p + i * rs, w, y + p + i * rs, cols, inv[i]);
    }
#endif
    for (int64_t r = blocks * R; r < rows; r++) {
        reduce_rows(x + r * cols, w, y + r * cols, cols, cols, ss, 1);
        scale_row(x + r * cols, w, y + r * cols, cols, 1.0f / sqrtf(ss[0] * inv_cols + eps));
    }
}

void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t cols, float eps) {
#if SHORT
    if (cols <= SHORT_COLS)
        rmsnorm_blocks(x, w, y, rows, cols, eps, SHORT);
    else
#endif
        rmsnorm_blocks(x, w, y, rows, cols, eps, ROWS);
#if KF_STREAMS
    _mm_sfence(); /* streaming stores are weakly ordered: make them visible before returning */
#endif
}

/* Residual add + RMSNorm template: h = x + residual, y = h / sqrt(mean(h²) + eps) * w per row. Parameters (each
 * means what it means in kernels/rmsnorm/template.c, so that lessons keyed by them transfer within the
 * row-reduction family):
 *   VEC    0: plain C loops, vectorised by the compiler as it sees fit (with SIMD, omp simd reductions);
 *          256 or 512: explicit vectors of that many bits (GCC vector extensions: AVX2 or AVX-512 registers
 *          where the target has them, pairs of narrower registers elsewhere)
 *   ACC    independent partial sums of squares per row: vectors with VEC > 0, floats with VEC 0
 *   ROWS   rows reduced together: their loops are interleaved, 2 x ROWS memory streams read at once (more
 *          misses in flight, and the per-row square root and horizontal sum overlap); then written one by one
 *   SIMD   ask the compiler to vectorise with omp simd reductions (VEC 0, one accumulator, one row only)
 *   FUSED  1: the reduction pass (which reads x and residual and writes h) also stores its elementwise result
 *          h * w into y, the final pass scales y in place; 0: the final pass reads h (the reduction pass just
 *          wrote it: the row is still in cache) and w again
 *   NT     1: the final pass writes y with non-temporal (streaming) stores, which skip reading y's cache
 *          lines from memory first; pays off when y does not fit in cache (x86 only, plain stores
 *          elsewhere; needs ALIGN 1 and VEC > 0). An sfence before returning orders them. With FUSED 0, h
 *          is streamed too (where its rows align like y's), and the final pass adds x and residual again
 *          from cache instead of reading h back: a plain store of h would read each of its lines from
 *          memory first, a fifth stream on top of the four the kernel must move.
 *   PF     software prefetch of x and residual this many bytes ahead of the reduction's loads (0: none, the
 *          hardware prefetcher alone, which stops at every 4 KiB page)
 *   PFL    the cache level the prefetch fills: 1 (L1, prefetcht0) or 2 (L2, prefetcht1)
 *   ALIGN  1: scalar steps until the vector loop's address is aligned to the vector width (h, which it
 *          stores, in the reduction; y in the final pass), so no store splits a cache line; 0: start at once
 *   PIPE   1: software pipelining over blocks of ROWS rows: one loop reduces block b + 1 (reading x and
 *          residual from memory, writing h) while it writes block b's y (from h in cache), so reads and writes
 *          stream together; 0: each block is reduced, then written. Needs VEC > 0 and FUSED 0
 *   SHORT  rows per block (fewer than ROWS) for rows of at most SHORT_COLS (256) columns; 0: ROWS for every
 *          row (as in kernels/rmsnorm/template.c: many streams pay off on long rows, one on short ones)
 *   SPLIT  0: a block's rows are adjacent; 1: they are rows / R apart (the matrix is split into R parts walked
 *          together, left-over rows last), so a block of short rows is R memory streams rather than one
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

/* h streamed (NT, FUSED 0): the final pass takes h[c] as x[c] + residual[c] (the same float sum, from cache). */
#define KF_H_STREAMS (KF_STREAMS && !FUSED)
#if KF_H_STREAMS
#define KF_H_V(hr, xr, rr, c) (KF_LOAD((xr) + (c)) + KF_LOAD((rr) + (c)))
#define KF_H(hr, xr, rr, c) ((xr)[c] + (rr)[c])
#else
#define KF_H_V(hr, xr, rr, c) KF_LOAD((hr) + (c))
#define KF_H(hr, xr, rr, c) ((hr)[c])
#endif

/* A store of h at p, which the head peeling aligned when ``aligned``: streamed where h is streamed. */
static inline void kf_put_h(float *p, kf_v v, int aligned) {
    (void)aligned;
#if KF_H_STREAMS
    if (aligned) {
        kf_stream(p, v);
        return;
    }
#endif
    KF_STORE(p, v);
}

#if FUSED
#define KF_OUT_V(c) (KF_LOAD(yr + (c)) * vinv)
#define KF_OUT(c) (yr[c] * inv)
#else
#define KF_OUT_V(c) (KF_H_V(hr, xr, rr, c) * vinv * KF_LOAD(w + (c)))
#define KF_OUT(c) (KF_H(hr, xr, rr, c) * inv * w[c])
#endif

/* The final pass of one row: y = h * inv * w (FUSED 0) or y *= inv (FUSED 1). */
static inline void scale_row(const float *restrict hr, const float *restrict xr, const float *restrict rr,
                             const float *restrict w, float *restrict yr, int64_t cols, float inv) {
    (void)hr;
    (void)xr;
    (void)rr;
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

/* h = x + residual over [lo, hi) of one row and its sum of squares (and, FUSED, y = h * w there): the scalar
 * heads and tails. */
static inline float add_sum_squares_scalar(const float *restrict xr, const float *restrict rr,
                                           const float *restrict w, float *restrict hr, float *restrict yr,
                                           int64_t lo, int64_t hi) {
    (void)w;
    (void)yr;
    float s = 0.0f;
    for (int64_t c = lo; c < hi; c++) {
        const float v = xr[c] + rr[c];
        hr[c] = v;
        s += v * v;
#if FUSED
        yr[c] = v * w[c];
#endif
    }
    return s;
}

/* The common length of R rows' vector loops, each from its own head (a multiple of STEP). */
static inline __attribute__((always_inline)) int64_t kf_body(const float *base, int64_t cols, int64_t rs,
                                                             int64_t *head, const int R) {
    int64_t body = cols;
    for (int i = 0; i < R; i++) {
        head[i] = kf_head(base + i * rs, cols);
        body = cols - head[i] < body ? cols - head[i] : body;
    }
    return body / STEP * STEP;
}

/* h = x + residual for R rows (rs floats apart in every array) and their sums of squares into ss, the rows'
 * loops interleaved; FUSED also stores h * w into y. Inlined with R a constant, so the arrays of accumulators
 * live in registers. */
static inline __attribute__((always_inline)) void reduce_rows(const float *restrict x, const float *restrict res,
                                                              const float *restrict w, float *restrict h,
                                                              float *restrict y, int64_t cols, int64_t rs,
                                                              float *ss, const int R) {
    int64_t head[ROWS];
#if VEC == 0 && SIMD
    /* one accumulator, one row (template_allows): the compiler's own vector reduction */
    (void)head;
    (void)R;
    (void)rs;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < cols; c++) {
        KF_PREFETCH(x + c);
        KF_PREFETCH(res + c);
        const float v = x[c] + res[c];
        h[c] = v;
        s += v * v;
#if FUSED
        y[c] = v * w[c];
#endif
    }
    ss[0] = s;
#else
    const int64_t body = kf_body(h, cols, rs, head, R);
    kf_v acc[ROWS][ACC];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 16
        for (int a = 0; a < ACC; a++) acc[i][a] = (kf_v){0};
    for (int64_t c = 0; c < body; c += STEP) {
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            const int64_t o = i * rs + head[i] + c;
            /* one prefetch per 64-byte line this step covers, of each input */
#pragma GCC unroll 16
            for (int l = 0; l < (STEP * 4 + 63) / 64; l++) {
                KF_PREFETCH(x + o + l * 16);
                KF_PREFETCH(res + o + l * 16);
            }
#pragma GCC unroll 16
            for (int a = 0; a < ACC; a++) {
                const kf_v v = KF_LOAD(x + o + a * LANES) + KF_LOAD(res + o + a * LANES);
                kf_put_h(h + o + a * LANES, v, 1);
                acc[i][a] += v * v;
#if FUSED
                KF_STORE(y + o + a * LANES, v * KF_LOAD(w + head[i] + c + a * LANES));
#endif
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        kf_v t = acc[i][0];
#pragma GCC unroll 16
        for (int a = 1; a < ACC; a++) t += acc[i][a];
        const int64_t o = i * rs;
        ss[i] = kf_hsum(t) + add_sum_squares_scalar(x + o, res + o, w, h + o, y + o, 0, head[i]) +
                add_sum_squares_scalar(x + o, res + o, w, h + o, y + o, head[i] + body, cols);
    }
#endif
}

#if PIPE
/* One pipelined step: h = xn + rn for R rows and their sums of squares into ss (reading memory) while the R
 * rows hp, whose inverse norms are inv, are written to yp (from cache); a block's rows are rs floats apart. Both
 * run at the same column, from the heads that align yp's rows (the other rows are loaded and stored unaligned
 * where they are aligned otherwise). */
static inline __attribute__((always_inline)) void reduce_and_write(const float *restrict xn, const float *restrict rn,
                                                                   float *restrict hn, const float *restrict hp,
                                                                   const float *restrict xp, const float *restrict rp,
                                                                   const float *restrict w, float *restrict yp,
                                                                   int64_t cols, int64_t rs, const float *inv,
                                                                   float *ss, const int R) {
    (void)hp;
    (void)xp;
    (void)rp;
    int64_t head[ROWS];
    const int64_t body = kf_body(yp, cols, rs, head, R);
    kf_v acc[ROWS][ACC], vinv[ROWS];
    /* the heads align y's rows; h's rows align with them when the two arrays are equally misaligned */
    int h_aligned[ROWS];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        h_aligned[i] = (uintptr_t)(hn + i * rs + head[i]) % KF_ALIGN_BYTES == 0;
        vinv[i] = (kf_v){0} + inv[i];
#pragma GCC unroll 16
        for (int a = 0; a < ACC; a++) acc[i][a] = (kf_v){0};
    }
    for (int64_t c = 0; c < body; c += STEP) {
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            const int64_t o = i * rs + head[i] + c;
#pragma GCC unroll 16
            for (int l = 0; l < (STEP * 4 + 63) / 64; l++) {
                KF_PREFETCH(xn + o + l * 16);
                KF_PREFETCH(rn + o + l * 16);
            }
#pragma GCC unroll 16
            for (int a = 0; a < ACC; a++) {
                const kf_v v = KF_LOAD(xn + o + a * LANES) + KF_LOAD(rn + o + a * LANES);
                kf_put_h(hn + o + a * LANES, v, h_aligned[i]);
                acc[i][a] += v * v;
                KF_PUT(yp + o + a * LANES,
                       KF_H_V(hp, xp, rp, o + a * LANES) * vinv[i] * KF_LOAD(w + head[i] + c + a * LANES));
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        kf_v t = acc[i][0];
#pragma GCC unroll 16
        for (int a = 1; a < ACC; a++) t += acc[i][a];
        const int64_t o = i * rs;
        float s = kf_hsum(t);
        for (int64_t c = 0; c < head[i]; c++) {
            const float v = xn[o + c] + rn[o + c];
            hn[o + c] = v;
            s += v * v;
            yp[o + c] = KF_H(hp, xp, rp, o + c) * inv[i] * w[c];
        }
        for (int64_t c = head[i] + body; c < cols; c++) {
            const float v = xn[o + c] + rn[o + c];
            hn[o + c] = v;
            s += v * v;
            yp[o + c] = KF_H(hp, xp, rp, o + c) * inv[i] * w[c];
        }
        ss[i] = s;
    }
}
#endif

/* Every row, in blocks of R rows (a constant where inlined: SHORT or ROWS): rows / R blocks, then the rows left
 * over one by one. Block b is rows b R .. b R + R - 1, or with SPLIT rows b, b + rows / R, b + 2 rows / R, ... */
static inline __attribute__((always_inline)) void add_rmsnorm_blocks(const float *x, const float *residual,
                                                                     const float *w, float *h, float *y,
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
        reduce_rows(x, residual, w, h, y, cols, rs, ss, R);
        for (int64_t b = 1; b < blocks; b++) {
            for (int i = 0; i < R; i++) inv[i] = 1.0f / sqrtf(ss[i] * inv_cols + eps);
            const int64_t p = (b - 1) * bs, n = p + bs;
            reduce_and_write(x + n, residual + n, h + n, h + p, x + p, residual + p, w, y + p, cols, rs, inv, ss, R);
        }
        const int64_t p = (blocks - 1) * bs;
        for (int i = 0; i < R; i++) {
            const int64_t o = p + i * rs;
            scale_row(h + o, x + o, residual + o, w, y + o, cols, 1.0f / sqrtf(ss[i] * inv_cols + eps));
        }
    }
#else
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t o = b * bs;
        reduce_rows(x + o, residual + o, w, h + o, y + o, cols, rs, ss, R);
        for (int i = 0; i < R; i++) inv[i] = 1.0f / sqrtf(ss[i] * inv_cols + eps);
        for (int i = 0; i < R; i++) {
            const int64_t q = o + i * rs;
            scale_row(h + q, x + q, residual + q, w, y + q, cols, inv[i]);
        }
    }
#endif
    for (int64_t r = blocks * R; r < rows; r++) {
        const int64_t o = r * cols;
        reduce_rows(x + o, residual + o, w, h + o, y + o, cols, cols, ss, 1);
        scale_row(h + o, x + o, residual + o, w, y + o, cols, 1.0f / sqrtf(ss[0] * inv_cols + eps));
    }
}

void add_rmsnorm(const float *x, const float *residual, const float *w, float *h, float *y, int64_t rows,
                 int64_t cols, float eps) {
#if SHORT
    if (cols <= SHORT_COLS)
        add_rmsnorm_blocks(x, residual, w, h, y, rows, cols, eps, SHORT);
    else
#endif
        add_rmsnorm_blocks(x, residual, w, h, y, rows, cols, eps, ROWS);
#if KF_STREAMS
    _mm_sfence(); /* streaming stores are weakly ordered: make them visible before returning */
#endif
}

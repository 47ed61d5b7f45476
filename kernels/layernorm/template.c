/* Layer normalisation template: y = (x - mean) / sqrt(var + eps) * w + b per row, mean and (biased) variance
 * over the row. Parameters (each means what it means in kernels/rmsnorm/template.c, so that lessons keyed by
 * them transfer within the row-reduction family):
 *   VEC    0: plain C loops, vectorised by the compiler as it sees fit (with SIMD, omp simd reductions);
 *          256 or 512: explicit vectors of that many bits (GCC vector extensions: AVX2 or AVX-512 registers
 *          where the target has them, pairs of narrower registers elsewhere)
 *   ACC    independent partial sums per row (of x, then of squares about the mean): vectors with VEC > 0,
 *          floats with VEC 0
 *   ROWS   rows reduced together: their loops are interleaved, ROWS memory streams at once (more misses in
 *          flight, and the per-row square root and horizontal sums overlap); then written one by one
 *   SIMD   ask the compiler to vectorise with omp simd reductions (VEC 0, one accumulator, one row only)
 *   FUSED  1: the variance pass also stores its elementwise result (d = x - mean) into y, the final pass works
 *          on y in place; 0: the final pass reads x again (the row is still in cache)
 *   NT     1: the final pass writes y with non-temporal (streaming) stores, which skip reading y's cache
 *          lines from memory first; pays off when y does not fit in cache (x86 only, plain stores
 *          elsewhere; needs ALIGN 1 and VEC > 0). An sfence before returning orders them.
 *   PF     software prefetch of x this many bytes ahead of the reduction's loads into L1 (0: none, the
 *          hardware prefetcher alone, which stops at every 4 KiB page)
 *   ALIGN  1: scalar steps until the vector loop's address is aligned to the vector width (x in the
 *          reduction, y in the final pass), so no load or store splits a cache line; 0: start at once
 *   PIPE   1: software pipelining over blocks of ROWS rows: one loop reduces block b + 1 (reading memory)
 *          while it writes block b (from cache), so reads and writes stream together as in a copy;
 *          0: each block is reduced, then written (memory reads and writes alternate). Needs VEC > 0 and
 *          FUSED 0
 *   SHORT  rows per block (fewer than ROWS) for rows of at most SHORT_COLS (256) columns; 0: ROWS for every
 *          row (as in kernels/rmsnorm/template.c: many streams pay off on long rows, one on short ones)
 *   SPLIT  0: a block's rows are adjacent; 1: they are rows / R apart (the matrix is split into R parts walked
 *          together, left-over rows last), so a block of short rows is R memory streams rather than one
 *
 * Three passes over a row: its sum (from memory: the mean), the sum of squares about the mean (from cache: the
 * variance), then the output. Not one pass of E[x^2] - E[x]^2: in float32 that cancels catastrophically for a
 * row whose mean is large next to its spread, as a layer's activations often are (problem.py's offset rows);
 * nor one pass of sums shifted by the row's first element, which cancels as badly when that element is an
 * outlier (a spike there). About the mean, the squares add up without cancelling.
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
/* locality 3 is prefetcht0 (into L1); a prefetch never faults, even past the end */
#define KF_PREFETCH(p) __builtin_prefetch((const char *)(p) + PF, 0, 3)
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

/* What the row sums accumulate in. Explicit vectors (VEC > 0) keep ACC x LANES partial sums per row, each of few
 * elements; the plain C loops of VEC 0 are vectorised or not as the compiler sees fit (interleaved rows are not),
 * and one float summing a row of 1023 elements whose mean is 20 times their spread puts the mean off by 3e-5 of
 * the spread, y by 7.6e-5 (problem.py's offset rows; twice its atol). A double does not, and costs a scalar loop
 * nothing. */
#if VEC > 0
typedef kf_v kf_acc;
#else
typedef double kf_acc;
#endif

/* The row's mean from its sum, divided in double: -ffast-math makes a float division by cols a multiplication by
 * 1 / cols, rounded, and a row of constants then gets a mean one ulp off the constant; with eps 1e-5 that ulp
 * comes out of y as 7e-5 (twice atol) where y must be b exactly. In double the product rounds back to the
 * constant. */
static inline float kf_mean(float s1, int64_t cols) { return (float)((double)s1 / (double)cols); }

/* 1 / sqrt(var + eps), var the mean of the squares about the mean. */
static inline float kf_rstd(float ss, float inv_n, float eps) { return 1.0f / sqrtf(ss * inv_n + eps); }

#if FUSED
/* y holds d = x - mean (the variance pass stored it) */
#define KF_OUT_V(c) (KF_LOAD(yr + (c)) * vrstd * KF_LOAD(w + (c)) + KF_LOAD(b + (c)))
#define KF_OUT(c) (yr[c] * rstd * w[c] + b[c])
#else
#define KF_OUT_V(c) ((KF_LOAD(xr + (c)) - vmean) * vrstd * KF_LOAD(w + (c)) + KF_LOAD(b + (c)))
#define KF_OUT(c) ((xr[c] - mean) * rstd * w[c] + b[c])
#endif

/* The final pass of one row: y = (x - mean) * rstd * w + b (FUSED: y = y * rstd * w + b, y holding x - mean). */
static inline void scale_row(const float *restrict xr, const float *restrict w, const float *restrict b,
                             float *restrict yr, int64_t cols, float mean, float rstd) {
    (void)xr;
    (void)mean;
    int64_t c = kf_head(yr, cols);
    for (int64_t i = 0; i < c; i++) yr[i] = KF_OUT(i);
#if VEC > 0
    const kf_v vmean = (kf_v){0} + mean, vrstd = (kf_v){0} + rstd;
    (void)vmean;
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

/* The sums of R rows of x (rs floats apart) into s1, their loops interleaved (R streams from memory). Inlined with
 * R a constant, so the arrays of accumulators live in registers. */
static inline __attribute__((always_inline)) void sum_rows(const float *restrict x, int64_t cols, int64_t rs,
                                                           float *s1, const int R) {
    int64_t head[ROWS];
#if VEC == 0 && SIMD
    /* one accumulator, one row (template_allows): the compiler's own vector reduction */
    (void)head;
    (void)rs;
    (void)R;
    double t = 0.0;
#pragma omp simd reduction(+ : t)
    for (int64_t c = 0; c < cols; c++) {
        KF_PREFETCH(x + c);
        t += x[c];
    }
    s1[0] = (float)t;
#else
    const int64_t body = kf_body(x, cols, rs, head, R);
    kf_acc acc[ROWS][ACC];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 16
        for (int a = 0; a < ACC; a++) acc[i][a] = (kf_acc){0};
    for (int64_t c = 0; c < body; c += STEP) {
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            const float *xc = x + i * rs + head[i] + c;
            /* one prefetch per 64-byte line this step covers */
#pragma GCC unroll 16
            for (int l = 0; l < (STEP * 4 + 63) / 64; l++) KF_PREFETCH(xc + l * 16);
#pragma GCC unroll 16
            for (int a = 0; a < ACC; a++) acc[i][a] += KF_LOAD(xc + a * LANES);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        kf_acc t = acc[i][0];
#pragma GCC unroll 16
        for (int a = 1; a < ACC; a++) t += acc[i][a];
        const float *xr = x + i * rs;
        float s = kf_hsum((kf_v)t);
        for (int64_t c = 0; c < head[i]; c++) s += xr[c];
        for (int64_t c = head[i] + body; c < cols; c++) s += xr[c];
        s1[i] = s;
    }
#endif
}

/* The sums of squares about their means of R rows of x (rs floats apart in x and y; the rows are in cache) into
 * ss, their loops interleaved; FUSED also stores d = x - mean into y. */
static inline __attribute__((always_inline)) void square_rows(const float *restrict x, float *restrict y,
                                                              int64_t cols, int64_t rs, const float *mean,
                                                              float *ss, const int R) {
    int64_t head[ROWS];
#if VEC == 0 && SIMD
    (void)head;
    (void)rs;
    (void)R;
    double t = 0.0;
    const float m = mean[0];
#pragma omp simd reduction(+ : t)
    for (int64_t c = 0; c < cols; c++) {
        const float d = x[c] - m;
        t += d * d;
#if FUSED
        y[c] = d;
#endif
    }
    ss[0] = (float)t;
#else
    const int64_t body = kf_body(x, cols, rs, head, R);
    kf_acc acc[ROWS][ACC];
    kf_v vm[ROWS];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        vm[i] = (kf_v){0} + mean[i];
#pragma GCC unroll 16
        for (int a = 0; a < ACC; a++) acc[i][a] = (kf_acc){0};
    }
    for (int64_t c = 0; c < body; c += STEP) {
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            const int64_t o = i * rs + head[i] + c;
#pragma GCC unroll 16
            for (int a = 0; a < ACC; a++) {
                const kf_v d = KF_LOAD(x + o + a * LANES) - vm[i];
                acc[i][a] += d * d;
#if FUSED
                KF_STORE(y + o + a * LANES, d);
#endif
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        kf_acc t = acc[i][0];
#pragma GCC unroll 16
        for (int a = 1; a < ACC; a++) t += acc[i][a];
        const float *xr = x + i * rs;
        float *yr = y + i * rs;
        (void)yr;
        float s = kf_hsum((kf_v)t);
        for (int part = 0; part < 2; part++) /* the scalar head, then the tail */
            for (int64_t c = part ? head[i] + body : 0; c < (part ? cols : head[i]); c++) {
                const float d = xr[c] - mean[i];
                s += d * d;
#if FUSED
                yr[c] = d;
#endif
            }
        ss[i] = s;
    }
#endif
}

#if PIPE
/* One pipelined step: the sums of R rows xn into s1 (reading memory) while the R rows xp, whose means and inverse
 * deviations are mean and rstd, are written to yp (from cache); a block's rows are rs floats apart. Both run at
 * the same column, from the heads that align yp's rows (xn is loaded unaligned where its rows are aligned
 * otherwise). */
static inline __attribute__((always_inline)) void sum_and_write(const float *restrict xn, const float *restrict xp,
                                                                const float *restrict w, const float *restrict b,
                                                                float *restrict yp, int64_t cols, int64_t rs,
                                                                const float *mean, const float *rstd, float *s1,
                                                                const int R) {
    int64_t head[ROWS];
    const int64_t body = kf_body(yp, cols, rs, head, R);
    kf_v acc[ROWS][ACC], vmean[ROWS], vrstd[ROWS];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        vmean[i] = (kf_v){0} + mean[i];
        vrstd[i] = (kf_v){0} + rstd[i];
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
                acc[i][a] += KF_LOAD(xn + o + a * LANES);
                const int64_t wc = head[i] + c + a * LANES;
                KF_PUT(yp + o + a * LANES,
                       (KF_LOAD(xp + o + a * LANES) - vmean[i]) * vrstd[i] * KF_LOAD(w + wc) + KF_LOAD(b + wc));
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
            s += xr[c];
            yr[c] = (pr[c] - mean[i]) * rstd[i] * w[c] + b[c];
        }
        for (int64_t c = head[i] + body; c < cols; c++) {
            s += xr[c];
            yr[c] = (pr[c] - mean[i]) * rstd[i] * w[c] + b[c];
        }
        s1[i] = s;
    }
}
#endif

/* Every row, in blocks of R rows (a constant where inlined: SHORT or ROWS): rows / R blocks, then the rows left
 * over one by one. Block b is rows b R .. b R + R - 1, or with SPLIT rows b, b + rows / R, b + 2 rows / R, ... */
static inline __attribute__((always_inline)) void layernorm_blocks(const float *x, const float *w, const float *b,
                                                                   float *y, int64_t rows, int64_t cols, float eps,
                                                                   const int R) {
    const float inv_n = 1.0f / (float)cols;
    float s1[ROWS], mean[ROWS], ss[ROWS], rstd[ROWS];
    const int64_t blocks = rows / R;
#if SPLIT
    const int64_t rs = blocks * cols, bs = cols; /* floats between a block's rows, and between blocks */
#else
    const int64_t rs = cols, bs = R * cols;
#endif
#if PIPE
    /* Block 0 is only summed, each later block is summed while its predecessor is written, the last block is only
     * written; each block's squares (from cache) come between. */
    if (blocks > 0) {
        sum_rows(x, cols, rs, s1, R);
        for (int64_t blk = 0; blk < blocks; blk++) {
            const int64_t p = blk * bs;
            for (int i = 0; i < R; i++) mean[i] = kf_mean(s1[i], cols);
            square_rows(x + p, y + p, cols, rs, mean, ss, R);
            for (int i = 0; i < R; i++) rstd[i] = kf_rstd(ss[i], inv_n, eps);
            if (blk + 1 < blocks)
                sum_and_write(x + p + bs, x + p, w, b, y + p, cols, rs, mean, rstd, s1, R);
            else
                for (int i = 0; i < R; i++) scale_row(x + p + i * rs, w, b, y + p + i * rs, cols, mean[i], rstd[i]);
        }
    }
#else
    for (int64_t blk = 0; blk < blocks; blk++) {
        const int64_t p = blk * bs;
        sum_rows(x + p, cols, rs, s1, R);
        for (int i = 0; i < R; i++) mean[i] = kf_mean(s1[i], cols);
        square_rows(x + p, y + p, cols, rs, mean, ss, R);
        for (int i = 0; i < R; i++) rstd[i] = kf_rstd(ss[i], inv_n, eps);
        for (int i = 0; i < R; i++) scale_row(x + p + i * rs, w, b, y + p + i * rs, cols, mean[i], rstd[i]);
    }
#endif
    for (int64_t r = blocks * R; r < rows; r++) {
        sum_rows(x + r * cols, cols, cols, s1, 1);
        mean[0] = kf_mean(s1[0], cols);
        square_rows(x + r * cols, y + r * cols, cols, cols, mean, ss, 1);
        scale_row(x + r * cols, w, b, y + r * cols, cols, mean[0], kf_rstd(ss[0], inv_n, eps));
    }
}

void layernorm(const float *x, const float *w, const float *b, float *y, int64_t rows, int64_t cols, float eps) {
#if SHORT
    if (cols <= SHORT_COLS)
        layernorm_blocks(x, w, b, y, rows, cols, eps, SHORT);
    else
#endif
        layernorm_blocks(x, w, b, y, rows, cols, eps, ROWS);
#if KF_STREAMS
    _mm_sfence(); /* streaming stores are weakly ordered: make them visible before returning */
#endif
}

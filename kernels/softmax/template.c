/* Softmax template. Parameters (SIMD, FUSED, NT, VEC, PF, ALIGN, PIPE and KEEP mean what they mean in
 * kernels/rmsnorm/template.c and the CUDA templates, so that lessons keyed by them transfer within the
 * row-reduction family):
 *   VEC     0: plain C loops, vectorised by the compiler as it sees fit (with SIMD, omp simd loops);
 *           256 or 512: explicit vectors of that many bits (GCC vector extensions: AVX2 or AVX-512
 *           registers where the target has them, pairs of narrower registers elsewhere)
 *   ONLINE  0: the max is its own pass over the row, before the sum of exponentials.
 *           1: blocked online softmax: one pass finds the max and the sum together; for each chunk of
 *           16 * UNROLL * lanes elements, the chunk's max rescales the running sum when it grows.
 *   UNROLL  independent accumulators (vectors with VEC > 0) of every reduction loop, and its unrolling
 *   EXP     degree of the polynomial of the inline exp: 2^f on [-1/2, 1/2] after 2^n is split off
 *           (a least-maximum-relative-error fit: degree 4 ~3e-6, 5 ~2e-7, 6 ~1e-7 in float32; a degree 3
 *           fit, ~8e-5, would break the 1e-4 tolerance). Below exp(-87) the result is ~1e-38, not 0.
 *   SIMD    1: omp simd on the plain-C loops (VEC 0 only)
 *   FUSED   1: the reduction pass also stores its exponentials into y and the final pass scales y in
 *           place (ONLINE 1 stores each chunk relative to the max known then and rescales it to the row's
 *           max in the final pass); 0: the final pass reads x again and writes y = exp(x - max) / sum
 *   KEEP    1: the reduction pass keeps its exponentials in a scratch row (in cache), which the final
 *           pass scales into y: one exp per element without y's read-for-ownership (FUSED 0 only)
 *   NT      1: the final pass writes y with non-temporal (streaming) stores, which skip reading y's cache
 *           lines from memory first; pays off when y does not fit in cache (x86 only, plain stores
 *           elsewhere; needs ALIGN 1 and VEC > 0); an sfence before returning orders them
 *   PF      software prefetch of x this many bytes ahead of the pass that reads it from memory (0: none)
 *   ALIGN   1: scalar steps until y's address is aligned to the vector width; 0: start at once
 *   PIPE    1: software pipelining over rows: one loop finds the max of row r + 1 (reading memory) while
 *           it writes row r (from cache), so reads and writes stream together as in a copy (ONLINE 0,
 *           FUSED 0, VEC > 0); 2: three blocks of ROWS rows in one loop: block k + 1's maxes, block k's
 *           exponentials and sums, block k - 1's writes, so the exp's arithmetic overlaps memory too (KEEP
 *           1 as well: two blocks of scratch rows); 3: PIPE 2 where ROWS rows are short (at most 2048 floats
 *           together), and for longer rows the same three stages over chunks of a row (ONLINE 1, KEEP 1): one
 *           loop takes the next chunk's max (from memory), this chunk's exponentials relative to its own max
 *           (the chunk was just read: from L1) into the one scratch row, where the previous row's exponentials
 *           of the chunk were, which it first writes to y scaled by their chunk's factor; a row's max and sum
 *           come from its chunks'. x is read from memory once and the cache holds a chunk and one scratch row,
 *           where PIPE 2 holds two of x's rows and two scratch rows, which for a long row (8192 floats, 32 KiB
 *           each) do not fit L1; 0: each row is reduced, then written
 *   ROWS    rows per block of the PIPE 2 pipeline (and of PIPE 3's on short rows), whose streams are in flight
 *           together (1 otherwise)
 *   SPLIT   0: a PIPE 2 block is ROWS adjacent rows; 1: its rows are rows / ROWS apart (the matrix is split into
 *           ROWS parts walked together, left-over rows last), so a block's rows are ROWS memory streams of
 *           their own rather than one stream split at row ends: one core's bandwidth grows with the streams
 *           in flight (the streaming copy of engine/harness/stream_copy.py walks 4)
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE__)
#include <immintrin.h>
#endif

#define VEC_SET {{VEC}}
#define ONLINE {{ONLINE}}
#define UNROLL_SET {{UNROLL}}
#define EXP {{EXP}}
#define SIMD {{SIMD}}
#define FUSED {{FUSED}}
#define KEEP {{KEEP}}
#define NT {{NT}}
#define PF {{PF}}
#define ALIGN {{ALIGN}}
#define PIPE {{PIPE}}
#define ROWS {{ROWS}}
#define SPLIT {{SPLIT}}
/* Without AVX-512, GCC lowers a comparison of two 512-bit vectors lane by lane (scalar compares and moves
 * through memory): VEC 512 ran 4-5x slower than VEC 256 on an AVX2 machine. There it means two 256-bit vectors
 * per step instead of one 512-bit one, the same work in the machine's own registers: UNROLL doubles, so a step
 * still covers UNROLL * 16 floats. */
#if VEC_SET == 512 && !defined(__AVX512F__) && defined(__AVX__)
#define VEC 256
#define UNROLL (2 * UNROLL_SET)
#else
#define VEC VEC_SET
#define UNROLL UNROLL_SET
#endif

#if VEC == 512
#pragma GCC target("prefer-vector-width=512")
#endif

#if SIMD
#define KF_SIMD _Pragma("omp simd")
#define KF_SIMD_SUM(s) _Pragma("omp simd reduction(+:s)")
#else
#define KF_SIMD
#define KF_SIMD_SUM(s)
#endif

#if VEC > 0
#define LANES (VEC / 32)
typedef float kf_v __attribute__((vector_size(VEC / 8)));
typedef int32_t kf_vi __attribute__((vector_size(VEC / 8)));
/* The same vector at any float's alignment: loads and stores through it are unaligned ones. */
typedef float kf_vu __attribute__((vector_size(VEC / 8), aligned(4)));
#define KF_LOAD(p) (*(const kf_vu *)(p))
#define KF_STORE(p, v) (*(kf_vu *)(p) = (v))
#define KF_SPLAT(s) ((kf_v){0} + (s))
#define KF_TO_INT(v) __builtin_convertvector((v), kf_vi)
#define KF_TO_FLOAT(i) __builtin_convertvector((i), kf_v)
#define KF_BITS_TO_FLOAT(i) ((kf_v)(i))
/* a > b ? a : b lane by lane (b where either is NaN). One vmaxps where the ISA has it: GCC makes the portable
 * compare-and-select two instructions, and the exp's clamp and every max step take one. */
static inline kf_v kf_max(kf_v a, kf_v b) {
#if VEC == 512 && defined(__AVX512F__)
    return (kf_v)_mm512_max_ps((__m512)a, (__m512)b);
#elif VEC == 256 && defined(__AVX__)
    return (kf_v)_mm256_max_ps((__m256)a, (__m256)b);
#else
    const kf_vi m = a > b;
    return (kf_v)((m & (kf_vi)a) | (~m & (kf_vi)b));
#endif
}
static inline float kf_hmax(kf_v v) {
    float m = v[0];
    for (int i = 1; i < LANES; i++) m = v[i] > m ? v[i] : m;
    return m;
}
/* The sum of a vector's lanes as a tree (halves added until one lane is left): log2(LANES) dependent adds
 * rather than LANES, which is what a row's normaliser waits on, once per row (short rows feel it). */
static inline float kf_hsum(kf_v v) {
    float t[LANES];
    __builtin_memcpy(t, &v, sizeof t);
#pragma GCC unroll 8
    for (int half = LANES / 2; half > 0; half /= 2)
#pragma GCC unroll 16
        for (int i = 0; i < half; i++) t[i] += t[i + half];
    return t[0];
}
#else
#define LANES 1
typedef float kf_v;
typedef int32_t kf_vi;
#define KF_LOAD(p) (*(p))
#define KF_STORE(p, v) (*(p) = (v))
#define KF_SPLAT(s) ((float)(s))
#define KF_TO_INT(v) ((int32_t)(v))
#define KF_TO_FLOAT(i) ((float)(i))
static inline float kf_bits_to_float(int32_t i) {
    float f;
    memcpy(&f, &i, sizeof f);
    return f;
}
#define KF_BITS_TO_FLOAT(i) kf_bits_to_float(i)
#define kf_max(a, b) ((a) > (b) ? (a) : (b))
#define kf_hmax(v) (v)
#define kf_hsum(v) (v)
#endif
#define STEP (UNROLL * LANES)
#if VEC > 0
#define KF_EXP1(s) (kf_exp(KF_SPLAT(s))[0])
#else
#define KF_EXP1(s) kf_exp(s)
#endif

/* exp(x) for x <= 0: t = x log2(e) = n + f with n an integer and f in [-1/2, 1/2], 2^f by the polynomial, 2^n from
 * the exponent bits. x is clamped at -87 so that 2^n stays a normal float (and a NaN, which x - max is for a row's
 * -inf against a chunk's max of -inf, becomes -87). With AVX-512, n is rounded in place (vrndscaleps) and 2^n
 * applied by vscalefps: three instructions for two conversions, an integer add, a shift and a multiply, where the
 * exp is most of softmax's arithmetic (with vmaxps for the max, the best setting then ran 1.042x [1.020, 1.064]
 * faster in one kf evaluate run on an AVX-512 Xeon). */
#if VEC == 512 && defined(__AVX512F__)
#define KF_SCALEF 1
#else
#define KF_SCALEF 0
#endif
static inline kf_v kf_exp(kf_v x) {
    x = kf_max(x, KF_SPLAT(-87.0f));
    const kf_v t = x * 1.44269504f;
#if KF_SCALEF
    const kf_v n = (kf_v)_mm512_roundscale_ps((__m512)t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const kf_v f = t - n;
#else
    const kf_vi n = KF_TO_INT(t - 0.5f); /* t <= 0: truncation of t - 1/2 rounds t to nearest */
    const kf_v f = t - KF_TO_FLOAT(n);
#endif
#if EXP == 4
    kf_v p = KF_SPLAT(0.009569987654685974f);
    p = p * f + 0.05591757595539093f;
    p = p * f + 0.240247443318367f;
    p = p * f + 0.6931218504905701f;
    p = p * f + 0.9999992847442627f;
#elif EXP == 5
    kf_v p = KF_SPLAT(0.0013276374666020274f);
    p = p * f + 0.00967551488429308f;
    p = p * f + 0.05550713464617729f;
    p = p * f + 0.24022120237350464f;
    p = p * f + 0.6931469440460205f;
    p = p * f + 1.0000001192092896f;
#else
    kf_v p = KF_SPLAT(0.00015345736755989492f);
    p = p * f + 0.0013399909948930144f;
    p = p * f + 0.009618489071726799f;
    p = p * f + 0.05550329014658928f;
    p = p * f + 0.24022646248340607f;
    p = p * f + 0.6931471824645996f;
    p = p * f + 1.0f;
#endif
#if KF_SCALEF
    return (kf_v)_mm512_scalef_ps((__m512)p, (__m512)n);
#else
    return p * KF_BITS_TO_FLOAT((n + 127) << 23);
#endif
}

#if PF > 0
#define KF_PREFETCH(p) __builtin_prefetch((const char *)(p) + PF, 0, 3)
#else
#define KF_PREFETCH(p) ((void)0)
#endif
/* One prefetch per 64-byte line a loop step of STEP floats covers. */
#define KF_PREFETCH_STEP(p)                                                                                   \
    do {                                                                                                      \
        for (int l_ = 0; l_ < (STEP * 4 + 63) / 64; l_++) KF_PREFETCH((p) + l_ * 16);                         \
    } while (0)

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

/* Elements before y's row reaches the vector alignment (ALIGN 1), capped at n. */
static inline int64_t kf_head(const float *p, int64_t n) {
#if ALIGN && VEC > 0
    const int64_t h = (int64_t)(((uintptr_t)(LANES * 4) - (uintptr_t)p % (LANES * 4)) % (LANES * 4)) / 4;
    return h < n ? h : n;
#else
    (void)p;
    (void)n;
    return 0;
#endif
}

#if ONLINE
#define CHUNK (16 * STEP)
#endif

/* Where the reduction pass stores its exponentials: y (FUSED), the scratch row (KEEP) or nowhere. */
#define KF_STASH (FUSED || KEEP)

/* The row's max over [lo, hi), from m: UNROLL accumulators, prefetching ahead when the row comes from
 * memory. */
static inline float max_range(const float *restrict xr, int64_t lo, int64_t hi, float m) {
    int64_t c = lo;
#if VEC == 0 && SIMD
    KF_SIMD
    for (int64_t i = lo; i < hi; i++) m = xr[i] > m ? xr[i] : m;
    return m;
#else
    kf_v acc[UNROLL];
    for (int u = 0; u < UNROLL; u++) acc[u] = KF_SPLAT(m);
    for (; c + STEP <= hi; c += STEP) {
        KF_PREFETCH_STEP(xr + c);
        for (int u = 0; u < UNROLL; u++) acc[u] = kf_max(acc[u], KF_LOAD(xr + c + u * LANES));
    }
    for (int u = 0; u < UNROLL; u++) {
        const float a = kf_hmax(acc[u]);
        m = a > m ? a : m;
    }
    for (; c < hi; c++) m = xr[c] > m ? xr[c] : m;
    return m;
#endif
}

/* Sum of exp(x - m) over [lo, hi); KF_STASH also stores each exponential into e. */
static inline float sum_range(const float *restrict xr, float *restrict e, int64_t lo, int64_t hi, float m) {
#if !KF_STASH
    (void)e;
#endif
    int64_t c = lo;
#if VEC == 0 && SIMD
    float s = 0.0f;
    KF_SIMD_SUM(s)
    for (int64_t i = lo; i < hi; i++) {
        const float v = kf_exp(xr[i] - m);
#if KF_STASH
        e[i] = v;
#endif
        s += v;
    }
    return s;
#else
    const kf_v vm = KF_SPLAT(m);
    kf_v acc[UNROLL];
    for (int u = 0; u < UNROLL; u++) acc[u] = KF_SPLAT(0.0f);
    for (; c + STEP <= hi; c += STEP) {
        for (int u = 0; u < UNROLL; u++) {
            const kf_v v = kf_exp(KF_LOAD(xr + c + u * LANES) - vm);
#if KF_STASH
            KF_STORE(e + c + u * LANES, v);
#endif
            acc[u] += v;
        }
    }
    kf_v t = acc[0];
    for (int u = 1; u < UNROLL; u++) t += acc[u];
    float s = kf_hsum(t);
    for (; c < hi; c++) {
        const float v = KF_EXP1(xr[c] - m);
#if KF_STASH
        e[c] = v;
#endif
        s += v;
    }
    return s;
#endif
}

/* y[lo:hi] = f * (stashed exponential) or, without a stash, f * exp(x - m); scalar steps up to y's
 * alignment (ALIGN 1) first. */
static inline void write_range(const float *restrict xr, const float *restrict e, float *restrict yr, int64_t lo,
                               int64_t hi, float m, float f) {
    (void)xr;
    (void)e;
    (void)m;
    int64_t c = lo + kf_head(yr + lo, hi - lo);
#if KF_STASH
#define KF_SRC_V(c) KF_LOAD(e + (c))
#define KF_SRC(c) (e[c])
#else
#define KF_SRC_V(c) kf_exp(KF_LOAD(xr + (c)) - vm)
#define KF_SRC(c) KF_EXP1(xr[c] - m)
#endif
    for (int64_t i = lo; i < c; i++) yr[i] = KF_SRC(i) * f;
#if VEC > 0
    const kf_v vf = KF_SPLAT(f);
#if !KF_STASH
    const kf_v vm = KF_SPLAT(m);
#endif
    for (; c + STEP <= hi; c += STEP)
        for (int u = 0; u < UNROLL; u++) KF_PUT(yr + c + u * LANES, KF_SRC_V(c + u * LANES) * vf);
    for (; c + LANES <= hi; c += LANES) KF_PUT(yr + c, KF_SRC_V(c) * vf);
#else
    KF_SIMD
    for (int64_t i = c; i < hi; i++) yr[i] = KF_SRC(i) * f;
    c = hi;
#endif
    for (; c < hi; c++) yr[c] = KF_SRC(c) * f;
}

#if PIPE == 1
/* One pipelined loop: the max of row xn (from memory) while row xr is written to yr with factor f (from the
 * scratch row, or recomputed from xr and its max m_r). Both at the same column, from yr's aligned head. */
static float max_and_write(const float *restrict xn, const float *restrict xr, const float *restrict e,
                           float *restrict yr, int64_t cols, float m_r, float f) {
    (void)xr;
    (void)e;
    const int64_t h = kf_head(yr, cols);
    float m = max_range(xn, 0, h, xn[0]);
    write_range(xr, e, yr, 0, h, m_r, f);
    const kf_v vf = KF_SPLAT(f);
#if !KF_STASH
    const kf_v vm = KF_SPLAT(m_r);
#endif
    kf_v acc[UNROLL];
    for (int u = 0; u < UNROLL; u++) acc[u] = KF_SPLAT(m);
    int64_t c = h;
    for (; c + STEP <= cols; c += STEP) {
        KF_PREFETCH_STEP(xn + c);
        for (int u = 0; u < UNROLL; u++) {
            acc[u] = kf_max(acc[u], KF_LOAD(xn + c + u * LANES));
            KF_PUT(yr + c + u * LANES, KF_SRC_V(c + u * LANES) * vf);
        }
    }
    for (int u = 0; u < UNROLL; u++) {
        const float a = kf_hmax(acc[u]);
        m = a > m ? a : m;
    }
    write_range(xr, e, yr, c, cols, m_r, f);
    return max_range(xn, c, cols, m);
}
#endif

#if PIPE >= 2
/* Block k of the pipeline: its row count, its first row (*first) and the floats between its rows (*apart). With
 * SPLIT the first rows / ROWS blocks take one row from each of ROWS equal parts of the matrix, and a last block
 * the rows left over; without, block k is rows k ROWS .. k ROWS + ROWS - 1 (the last one possibly short). */
static inline int kf_block(int64_t k, int64_t rows, int64_t cols, int64_t *first, int64_t *apart) {
#if SPLIT
    const int64_t parts = rows / ROWS; /* rows in each part */
    if (k < parts) {
        *first = k;
        *apart = parts * cols;
        return ROWS;
    }
    *first = parts * ROWS;
    *apart = cols;
    return (int)(rows - parts * ROWS);
#else
    *first = k * ROWS;
    *apart = cols;
    return (int)(rows - k * ROWS < ROWS ? rows - k * ROWS : ROWS);
#endif
}

/* The three-stage pipeline over blocks of ROWS rows: in one loop over the columns, the max of each row of
 * block k + 1 (streamed from memory), the exponentials of block k (its rows read again, from cache) into
 * the scratch rows `cur` with their sums, and block k - 1 written to y from its scratch rows `prev`. Reads,
 * writes and the exp's arithmetic overlap in the core instead of taking turns, and ROWS rows' streams are
 * in flight at once. nn, nc and np are the rows of the three blocks (0 where there is none); the rows of a
 * block are sn, sc and sp floats apart in x and y (`cols` for adjacent rows) and `stride` floats apart in the
 * scratch rows. With `aligned` (every row of y starts at the same offset from a vector boundary) the loop starts
 * at y's aligned head and may stream its stores. */
static inline __attribute__((always_inline)) void kf_stage(int nn, int nc, int np, int aligned,
                                                           const float *restrict xn, const float *restrict xc,
                                                           float *restrict cur, const float *restrict prev,
                                                           float *restrict yp, int64_t cols, int64_t stride,
                                                           int64_t sn, int64_t sc, int64_t sp, const float *m,
                                                           const float *f, float *mn, float *s) {
    const int64_t h = aligned ? kf_head(yp, cols) : 0;
    float mx[ROWS], sm[ROWS];
/* One column of the three stages in scalar code: the head before y's aligned start, and the tail. */
#define KF_STAGE_COLUMN(i)                                                                                    \
    do {                                                                                                      \
        for (int j = 0; j < nn; j++) mx[j] = xn[j * sn + (i)] > mx[j] ? xn[j * sn + (i)] : mx[j];             \
        for (int j = 0; j < nc; j++) {                                                                        \
            const float v_ = KF_EXP1(xc[j * sc + (i)] - m[j]);                                                \
            cur[j * stride + (i)] = v_;                                                                       \
            sm[j] += v_;                                                                                      \
        }                                                                                                     \
        for (int j = 0; j < np; j++) yp[j * sp + (i)] = prev[j * stride + (i)] * f[j];                        \
    } while (0)
    for (int j = 0; j < nn; j++) mx[j] = xn[j * sn];
    for (int j = 0; j < nc; j++) sm[j] = 0.0f;
    for (int64_t i = 0; i < h; i++) KF_STAGE_COLUMN(i);
    /* The rows' maxes and factors are splat where they are used, not kept in registers: with 8 rows, two
     * more vectors a row would spill (AVX-512 folds a splat into the instruction's memory operand). */
    kf_v am[ROWS], as[ROWS];
    for (int j = 0; j < ROWS; j++) {
        am[j] = KF_SPLAT(j < nn ? mx[j] : 0.0f);
        as[j] = KF_SPLAT(0.0f);
    }
    int64_t c = h;
#define KF_STAGE_STEP(k, W)                                                                                   \
    do {                                                                                                      \
        for (int j = 0; j < nn; j++) am[j] = kf_max(am[j], KF_LOAD(xn + j * sn + (k)));                       \
        for (int j = 0; j < nc; j++) {                                                                        \
            const kf_v v_ = kf_exp(KF_LOAD(xc + j * sc + (k)) - KF_SPLAT(m[j]));                              \
            KF_STORE(cur + j * stride + (k), v_);                                                             \
            as[j] += v_;                                                                                      \
        }                                                                                                     \
        for (int j = 0; j < np; j++) W(yp + j * sp + (k), KF_LOAD(prev + j * stride + (k)) * KF_SPLAT(f[j])); \
    } while (0)
    if (aligned) {
        for (; c + STEP <= cols; c += STEP) {
            for (int j = 0; j < nn; j++) KF_PREFETCH_STEP(xn + j * sn + c);
            for (int u = 0; u < UNROLL; u++) KF_STAGE_STEP(c + u * LANES, KF_PUT);
        }
        /* Short rows end in whole vectors too: a scalar exp costs as much as a vector one. */
        for (; c + LANES <= cols; c += LANES) KF_STAGE_STEP(c, KF_PUT);
    } else {
        for (; c + STEP <= cols; c += STEP) {
            for (int j = 0; j < nn; j++) KF_PREFETCH_STEP(xn + j * sn + c);
            for (int u = 0; u < UNROLL; u++) KF_STAGE_STEP(c + u * LANES, KF_STORE);
        }
        for (; c + LANES <= cols; c += LANES) KF_STAGE_STEP(c, KF_STORE);
    }
#undef KF_STAGE_STEP
    for (int j = 0; j < nn; j++) {
        const float a = kf_hmax(am[j]);
        mx[j] = a > mx[j] ? a : mx[j];
    }
    for (int j = 0; j < nc; j++) sm[j] += kf_hsum(as[j]);
    for (; c < cols; c++) KF_STAGE_COLUMN(c);
#undef KF_STAGE_COLUMN
    for (int j = 0; j < nn; j++) mn[j] = mx[j];
    for (int j = 0; j < nc; j++) s[j] = sm[j];
}

/* Softmax by the three-stage pipeline over blocks of ROWS rows (PIPE 2). */
static void kf_blocked(const float *x, float *y, int64_t rows, int64_t cols) {
    /* Two blocks of scratch rows: the block being reduced and the block being written. Stage k reads
     * block k + 1, reduces block k and writes block k - 1, for k = -1 .. B. */
    const int64_t stride = (cols + 15) & ~(int64_t)15;
    float *pair = aligned_alloc(64, (size_t)(2 * ROWS * stride) * sizeof(float));
    if (pair == NULL) {
        return; /* out of memory: y stays unwritten and the harness says incorrect */
    }
    const int aligned = (cols % LANES) == 0;
#if SPLIT
    const int64_t blocks = rows / ROWS + (rows % ROWS != 0);
#else
    const int64_t blocks = (rows + ROWS - 1) / ROWS;
#endif
    float m_cur[ROWS], m_next[ROWS], f_prev[ROWS], sums[ROWS];
    for (int64_t k = -1; k <= blocks; k++) {
        /* The three blocks' first rows, distances between their rows (in floats) and row counts; a block that
         * is not there has no rows and points at row 0 (never read or written). */
        int64_t on = 0, oc = 0, op = 0, sn = cols, sc = cols, sp = cols;
        const int nn = k + 1 < blocks ? kf_block(k + 1, rows, cols, &on, &sn) : 0;
        const int nc = k >= 0 && k < blocks ? kf_block(k, rows, cols, &oc, &sc) : 0;
        const int np = k >= 1 ? kf_block(k - 1, rows, cols, &op, &sp) : 0;
        const float *xn = x + on * cols, *xc = x + oc * cols;
        float *cur = pair + ((k + 2) & 1) * ROWS * stride, *prev = pair + ((k + 1) & 1) * ROWS * stride;
        float *yp = y + op * cols;
        if (k == blocks) { /* the last block: written alone */
            for (int j = 0; j < np; j++) write_range(x, prev + j * stride, yp + j * sp, 0, cols, 0.0f, f_prev[j]);
            break;
        }
        if (nn == ROWS && nc == ROWS && np == ROWS && aligned)
            kf_stage(ROWS, ROWS, ROWS, 1, xn, xc, cur, prev, yp, cols, stride, sn, sc, sp, m_cur, f_prev, m_next,
                     sums);
        else
            kf_stage(nn, nc, np, aligned, xn, xc, cur, prev, yp, cols, stride, sn, sc, sp, m_cur, f_prev, m_next,
                     sums);
        for (int j = 0; j < nc; j++) f_prev[j] = 1.0f / sums[j];
        for (int j = 0; j < nn; j++) m_cur[j] = m_next[j];
    }
    free(pair);
}
#endif

#if PIPE == 3
/* Floats of ROWS rows above which PIPE 3 takes the chunked pipeline: PIPE 2 keeps 4 x ROWS rows in cache (x's rows
 * of two blocks, two blocks of scratch rows), which then fill more than 32 KiB of a 48 KiB L1. Timed on an AVX-512
 * Xeon (one core, y streamed, x and y in its 260 MiB last-level cache): 256 x 2048 ran 0.82 of a copy chunked, 0.78
 * with ROWS 1 blocks; 512 x 1024 0.78 chunked and 0.87-0.90 with ROWS 2 blocks from two parts of the matrix. */
#define KF_BLOCKED_FLOATS 2048
/* Floats per chunk of the chunked pipeline (4 KiB: two chunks of x and the scratch row's stretch stay in L1), a
 * multiple of every STEP. Not ONLINE's CHUNK, which grows with UNROLL: with UNROLL 1 its chunks are 256 floats, and
 * every chunk ends in a horizontal max and sum (64 x 8192 from the last-level cache with UNROLL 1: 0.58 of a copy in
 * chunks of 256 floats, 0.71 in chunks of 1024). */
#define KF_ROW_CHUNK 1024
/* Chunk c of a row in the chunked pipeline: columns [lo, hi), the first one ends KF_ROW_CHUNK floats after y's
 * aligned head h so that every later chunk starts on a vector boundary of y; *from is where its vector steps
 * start. */
static inline void kf_chunk_span(int64_t c, int64_t h, int64_t cols, int64_t *lo, int64_t *from, int64_t *hi) {
    *lo = c == 0 ? 0 : h + c * KF_ROW_CHUNK;
    *from = c == 0 ? h : *lo;
    *hi = h + (c + 1) * KF_ROW_CHUNK < cols ? h + (c + 1) * KF_ROW_CHUNK : cols;
}

/* One chunk of the chunked pipeline in one loop over its columns: the max of the next chunk xn[0, nlen) (read
 * from memory: this row's next chunk or the next row's first), this row's exponentials exp(xr - m) over [lo, hi)
 * into the scratch row e (cur), whose previous contents, the row before's exponentials of the same columns, are
 * first written to yp scaled by g (prev; streamed where `aligned`). Returns the next chunk's max and the sum of
 * this chunk's exponentials in *s. cur and prev are constants where the caller inlines the steady state. */
static inline __attribute__((always_inline)) float kf_chunk(int cur, int prev, int aligned, const float *restrict xn,
                                                            int64_t nlen, const float *restrict xr, float *restrict e,
                                                            float *restrict yp, int64_t lo, int64_t from, int64_t hi,
                                                            float m, float g, float *s) {
    float mx = nlen > 0 ? xn[0] : 0.0f, sm = 0.0f;
/* One column of this chunk in scalar code (before y's aligned head, and the tail). */
#define KF_CHUNK_COLUMN(i)                                                                                    \
    do {                                                                                                      \
        if (prev) yp[i] = e[i] * g;                                                                           \
        if (cur) {                                                                                            \
            const float v_ = KF_EXP1(xr[i] - m);                                                              \
            e[i] = v_;                                                                                        \
            sm += v_;                                                                                         \
        }                                                                                                     \
    } while (0)
/* One vector of this chunk: the row before's exponentials out (read before they are overwritten), this row's in. */
#define KF_CHUNK_STEP(i, acc, W)                                                                              \
    do {                                                                                                      \
        if (prev) W(yp + (i), KF_LOAD(e + (i)) * vg);                                                         \
        if (cur) {                                                                                            \
            const kf_v v_ = kf_exp(KF_LOAD(xr + (i)) - vm);                                                   \
            KF_STORE(e + (i), v_);                                                                            \
            acc += v_;                                                                                        \
        }                                                                                                     \
    } while (0)
    for (int64_t i = lo; i < from; i++) KF_CHUNK_COLUMN(i);
    const kf_v vm = KF_SPLAT(m), vg = KF_SPLAT(g);
    kf_v am[UNROLL], as[UNROLL];
    for (int u = 0; u < UNROLL; u++) {
        am[u] = KF_SPLAT(mx);
        as[u] = KF_SPLAT(0.0f);
    }
    /* Whole steps of both chunks together, then whatever is left of either. */
    const int64_t steps = (hi - from) / STEP * STEP, next_steps = nlen / STEP * STEP;
    const int64_t both = steps < next_steps ? steps : next_steps;
    int64_t t = 0;
    if (aligned) {
        for (; t < both; t += STEP) {
            KF_PREFETCH_STEP(xn + t);
            for (int u = 0; u < UNROLL; u++) {
                am[u] = kf_max(am[u], KF_LOAD(xn + t + u * LANES));
                KF_CHUNK_STEP(from + t + u * LANES, as[u], KF_PUT);
            }
        }
        for (; t < steps; t += STEP)
            for (int u = 0; u < UNROLL; u++) KF_CHUNK_STEP(from + t + u * LANES, as[u], KF_PUT);
    } else {
        for (; t < both; t += STEP) {
            KF_PREFETCH_STEP(xn + t);
            for (int u = 0; u < UNROLL; u++) {
                am[u] = kf_max(am[u], KF_LOAD(xn + t + u * LANES));
                KF_CHUNK_STEP(from + t + u * LANES, as[u], KF_STORE);
            }
        }
        for (; t < steps; t += STEP)
            for (int u = 0; u < UNROLL; u++) KF_CHUNK_STEP(from + t + u * LANES, as[u], KF_STORE);
    }
    for (int64_t k = both; k < next_steps; k += STEP) {
        KF_PREFETCH_STEP(xn + k);
        for (int u = 0; u < UNROLL; u++) am[u] = kf_max(am[u], KF_LOAD(xn + k + u * LANES));
    }
    int64_t i = from + steps;
    /* Short chunks (the last of a row) end in whole vectors too: a scalar exp costs as much as a vector one. */
    if (aligned)
        for (; i + LANES <= hi; i += LANES) KF_CHUNK_STEP(i, as[0], KF_PUT);
    else
        for (; i + LANES <= hi; i += LANES) KF_CHUNK_STEP(i, as[0], KF_STORE);
    for (; i < hi; i++) KF_CHUNK_COLUMN(i);
#undef KF_CHUNK_STEP
#undef KF_CHUNK_COLUMN
    for (int u = 0; u < UNROLL; u++) {
        const float a = kf_hmax(am[u]);
        mx = a > mx ? a : mx;
    }
    for (int64_t k = next_steps; k < nlen; k++) mx = xn[k] > mx ? xn[k] : mx;
    kf_v total = as[0];
    for (int u = 1; u < UNROLL; u++) total += as[u];
    *s = sm + kf_hsum(total);
    return mx;
}

/* Softmax by the three-stage pipeline over chunks of rows, one scratch row (PIPE 3 on long rows). */
static void kf_chunked(const float *x, float *y, int64_t rows, int64_t cols) {
    /* Iteration r reduces row r chunk by chunk and writes row r - 1 from the scratch row as it goes: r = 0 only
     * reduces, r = rows only writes. Each chunk's max is taken while the chunk before it is reduced. */
    const int aligned = (cols % LANES) == 0; /* every row of y then starts at the same offset from a vector */
    const int64_t h = aligned ? kf_head(y, cols) : 0;
    const int64_t chunks = cols > h ? (cols - h + KF_ROW_CHUNK - 1) / KF_ROW_CHUNK : 1;
    /* The scratch row, then per chunk: its max and sum in the row being reduced, its factor in the row being
     * written. */
    float *scratch = malloc((size_t)(cols + 3 * chunks) * sizeof(float));
    if (scratch == NULL) return; /* out of memory: y stays unwritten and the harness says incorrect */
    float *chunk = scratch + cols;
    float *cmax = chunk, *csum = chunk + chunks, *cfac = chunk + 2 * chunks;
    int64_t lo, from, hi;
    kf_chunk_span(0, h, cols, &lo, &from, &hi);
    float m = max_range(x, 0, hi, x[0]);
    for (int64_t r = 0; r <= rows; r++) {
        const int cur = r < rows, prev = r > 0;
        const float *xr = x + (cur ? r : 0) * cols;
        float *yp = y + (prev ? r - 1 : 0) * cols;
        for (int64_t c = 0; c < chunks; c++) {
            kf_chunk_span(c, h, cols, &lo, &from, &hi);
            /* The next chunk: this row's, or the next row's first. */
            const float *xn = xr;
            int64_t nlen = 0;
            if (cur && c + 1 < chunks) {
                int64_t nlo, nfrom, nhi;
                kf_chunk_span(c + 1, h, cols, &nlo, &nfrom, &nhi);
                xn = xr + nlo;
                nlen = nhi - nlo;
            } else if (cur && r + 1 < rows) {
                int64_t nlo, nfrom, nhi;
                kf_chunk_span(0, h, cols, &nlo, &nfrom, &nhi);
                xn = xr + cols;
                nlen = nhi;
            }
            float s = 0.0f;
            const float mc = m;
            if (cur && prev && aligned)
                m = kf_chunk(1, 1, 1, xn, nlen, xr, scratch, yp, lo, from, hi, mc, cfac[c], &s);
            else
                m = kf_chunk(cur, prev, aligned, xn, nlen, xr, scratch, yp, lo, from, hi, mc, prev ? cfac[c] : 0.0f,
                             &s);
            if (cur) {
                cmax[c] = mc;
                csum[c] = s;
            }
        }
        if (cur) { /* the row's max and sum from its chunks', and each chunk's factor for writing it */
            float big = cmax[0];
            for (int64_t c = 1; c < chunks; c++) big = cmax[c] > big ? cmax[c] : big;
            float total = 0.0f;
            for (int64_t c = 0; c < chunks; c++) {
                cfac[c] = KF_EXP1(cmax[c] - big);
                total += csum[c] * cfac[c];
            }
            const float inv = 1.0f / total;
            for (int64_t c = 0; c < chunks; c++) cfac[c] *= inv;
        }
    }
    free(scratch);
}
#endif

void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    if (cols <= 0 || rows <= 0) return;
    float *scratch = NULL;
#if KEEP && PIPE < 2
    /* The exponentials of the row being reduced (stays in cache for the rows the benchmark uses); PIPE 2 and 3
     * keep them in scratch rows of their own. */
    scratch = malloc((size_t)cols * sizeof(float));
    if (scratch == NULL) return; /* out of memory: y stays unwritten and the harness says incorrect */
#endif
#if ONLINE && KF_STASH && PIPE < 2
    /* Per chunk: the max in force when its exponentials were stored, then its final factor. */
    float *chunk_max = malloc((size_t)(cols / CHUNK + 2) * sizeof(float));
    if (chunk_max == NULL) {
        free(scratch);
        return;
    }
#endif
#if PIPE == 3
    /* Blocks of ROWS rows where 4 x ROWS rows fit L1 (see KF_BLOCKED_FLOATS); longer rows in chunks, with one
     * scratch row. */
    if ((int64_t)ROWS * cols > KF_BLOCKED_FLOATS)
        kf_chunked(x, y, rows, cols);
    else
        kf_blocked(x, y, rows, cols);
#elif PIPE == 2
    kf_blocked(x, y, rows, cols);
#elif PIPE
    /* Row 0's max alone; then each row's sum, and its write fused with the next row's max. */
    float m = max_range(x, 0, cols, x[0]);
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        const float inv = 1.0f / sum_range(xr, scratch, 0, cols, m);
        if (r + 1 < rows)
            m = max_and_write(xr + cols, xr, scratch, yr, cols, m, inv);
        else
            write_range(xr, scratch, yr, 0, cols, m, inv);
    }
#else
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float *e = KEEP ? scratch : yr;
        const int64_t h = kf_head(yr, cols);
#if ONLINE
        /* Chunk b covers [h + (b - 1) CHUNK, h + b CHUNK) (chunk 0 the head), so no aligned vector of the
         * final pass straddles two chunks. */
        float m = xr[0], s = 0.0f;
        int64_t b = 0;
        for (int64_t lo = 0, hi = h; lo < cols; lo = hi, hi = hi + CHUNK < cols ? hi + CHUNK : cols, b++) {
            if (hi == lo) continue; /* an empty head */
            const float cm = max_range(xr, lo, hi, xr[lo]);
            if (cm > m) {
                s *= KF_EXP1(m - cm);
                m = cm;
            }
            s += sum_range(xr, e, lo, hi, m);
#if KF_STASH
            chunk_max[b] = m;
#endif
        }
        const float inv = 1.0f / s;
#if KF_STASH
        b = 0;
        for (int64_t lo = 0, hi = h; lo < cols; lo = hi, hi = hi + CHUNK < cols ? hi + CHUNK : cols, b++) {
            if (hi == lo) continue;
            write_range(xr, e, yr, lo, hi, m, KF_EXP1(chunk_max[b] - m) * inv);
        }
#else
        write_range(xr, e, yr, 0, cols, m, inv);
#endif
#else
        const float m = max_range(xr, 0, cols, xr[0]);
        const float inv = 1.0f / sum_range(xr, e, 0, cols, m);
        (void)h;
        write_range(xr, e, yr, 0, cols, m, inv);
#endif
    }
#endif
#if ONLINE && KF_STASH && PIPE < 2
    free(chunk_max);
#endif
    free(scratch);
#if KF_STREAMS
    _mm_sfence(); /* streaming stores are weakly ordered: make them visible before returning */
#endif
}

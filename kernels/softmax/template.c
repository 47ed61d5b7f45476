/* Softmax template. Parameters (SIMD, FUSED and NT mean what they mean in kernels/rmsnorm/template.c, so
 * that lessons keyed by them transfer within the row-reduction family):
 *   ONLINE  0: the max is its own pass over the row, before the sum of exponentials.
 *           1: blocked online softmax: one pass finds the max and the sum together; for each chunk of
 *           16 * UNROLL elements, the chunk's max rescales the running sum when it grows.
 *   UNROLL  ONLINE 0: independent accumulators of the max pass; ONLINE 1: chunk length in 16s
 *   SIMD    1: vectorise the element loops with omp simd and an inline exp (a Cody-Waite reduction and a
 *           degree-6 Taylor polynomial, relative error ~2e-7) that involves no library call;
 *           0: plain loops calling expf
 *   FUSED   1: the reduction pass also stores its exponentials into y and the final pass scales y in
 *           place (ONLINE 1 stores each chunk relative to the max known then and rescales it to the row's
 *           max in the final pass); 0: the reduction passes store nothing and the final pass reads x
 *           again and writes y = exp(x - max) / sum once (ONLINE 1: two passes; ONLINE 0: three passes:
 *           max, sum, write)
 *   NT      1: the final pass writes y with non-temporal (streaming) stores, which skip reading y's cache
 *           lines from memory first; pays off when y does not fit in cache (AVX/AVX-512 only, plain
 *           stores elsewhere); 0: plain stores
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif

#define ONLINE {{ONLINE}}
#define UNROLL {{UNROLL}}
#define SIMD {{SIMD}}
#define FUSED {{FUSED}}
#define NT {{NT}}

#if SIMD
#define KF_SIMD _Pragma("omp simd")
#define KF_SIMD_SUM _Pragma("omp simd reduction(+:s)")
#define KF_SIMD_MAX_CHUNK _Pragma("omp simd reduction(max:cm)")
#define KF_SIMD_SUM_CHUNK _Pragma("omp simd reduction(+:cs)")

/* exp(x) for x <= 0: x = n ln2 + f with |f| <= ln2/2, exp(f) by Taylor to degree 6, 2^n from the exponent
 * bits. Below -87 the result would not be a normal float; it is then ~1e-38 instead of ~0. */
static inline float kf_exp(float x) {
    x = fmaxf(x, -87.0f);
    float n = rintf(x * 1.44269504f);
    float f = fmaf(n, -0.693359375f, x); /* ln2 split in two so that n * hi is exact */
    f = fmaf(n, 2.12194440e-4f, f);
    float p = 1.0f + f * (1.0f + f * (0.5f + f * (1.0f / 6 + f * (1.0f / 24 + f * (1.0f / 120 + f * (1.0f / 720))))));
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}
#else
#define KF_SIMD
#define KF_SIMD_SUM
#define KF_SIMD_MAX_CHUNK
#define KF_SIMD_SUM_CHUNK
#define kf_exp expf
#endif

#if ONLINE
#define CHUNK (16 * UNROLL)
#endif

/* Streaming stores: one vector register's worth of lanes per store, and, with SIMD, a vector exp written
 * with intrinsics (computing into a stack buffer with the element loop instead cost ~10% of a call). */
#if NT && defined(__AVX512F__)
#define KF_STREAMS 1
#define KF_LANES 16
typedef __m512 kf_vec;
#define kf_set1 _mm512_set1_ps
#define kf_load _mm512_load_ps
#define kf_sub _mm512_sub_ps
#define kf_mul _mm512_mul_ps
#define kf_stream _mm512_stream_ps
#define KF_VEC_EXP SIMD
#elif NT && defined(__AVX__)
#define KF_STREAMS 1
#define KF_LANES 8
typedef __m256 kf_vec;
#define kf_set1 _mm256_set1_ps
#define kf_load _mm256_load_ps
#define kf_sub _mm256_sub_ps
#define kf_mul _mm256_mul_ps
#define kf_stream _mm256_stream_ps
#if defined(__AVX2__) && defined(__FMA__)
#define KF_VEC_EXP SIMD
#else
#define KF_VEC_EXP 0
#endif
#else
#define KF_STREAMS 0
#define KF_VEC_EXP 0
#endif

#if KF_VEC_EXP
/* kf_exp on a vector, the same steps in the same order. */
static inline kf_vec kf_exp_vec(kf_vec x) {
#if KF_LANES == 16
#define KF_FMA _mm512_fmadd_ps
    x = _mm512_max_ps(x, kf_set1(-87.0f));
    kf_vec n = _mm512_roundscale_ps(kf_mul(x, kf_set1(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
#define KF_FMA _mm256_fmadd_ps
    x = _mm256_max_ps(x, kf_set1(-87.0f));
    kf_vec n = _mm256_round_ps(kf_mul(x, kf_set1(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#endif
    kf_vec f = KF_FMA(n, kf_set1(-0.693359375f), x);
    f = KF_FMA(n, kf_set1(2.12194440e-4f), f);
    kf_vec p = KF_FMA(kf_set1(1.0f / 720), f, kf_set1(1.0f / 120));
    p = KF_FMA(p, f, kf_set1(1.0f / 24));
    p = KF_FMA(p, f, kf_set1(1.0f / 6));
    p = KF_FMA(p, f, kf_set1(0.5f));
    p = KF_FMA(p, f, kf_set1(1.0f));
    p = KF_FMA(p, f, kf_set1(1.0f));
#if KF_LANES == 16
    __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return kf_mul(p, _mm512_castsi512_ps(bits));
#else
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return kf_mul(p, _mm256_castsi256_ps(bits));
#endif
#undef KF_FMA
}
#endif

#if KF_STREAMS && FUSED && ONLINE
/* The factors of the vector at c (aligned, so it lies in at most two chunks as their length is a multiple
 * of 16): the first e lanes take chunk b's factor, the rest chunk b + 1's (fac has a spare last entry). */
static inline kf_vec line_factor(const float *fac, int64_t c) {
    const int64_t b = c / CHUNK, e = (b + 1) * CHUNK - c;
    if (e >= KF_LANES) return kf_set1(fac[b]);
#if KF_LANES == 16
    return _mm512_mask_blend_ps((__mmask16)((1u << e) - 1), kf_set1(fac[b + 1]), kf_set1(fac[b]));
#else
    const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_blendv_ps(kf_set1(fac[b]), kf_set1(fac[b + 1]), _mm256_cmp_ps(lane, kf_set1((float)e), _CMP_GE_OQ));
#endif
}
#endif

#if KF_STREAMS && !FUSED && !KF_VEC_EXP
/* Elements computed into a stack buffer by the element loop before they are streamed out: 1 KiB. */
#define KF_NT_BLOCK 256
#endif

#if !ONLINE
static float row_max(const float *xr, int64_t cols) {
    float acc[UNROLL];
    for (int u = 0; u < UNROLL; u++) acc[u] = xr[0];
    int64_t c = 0;
    for (; c + UNROLL <= cols; c += UNROLL)
        for (int u = 0; u < UNROLL; u++) acc[u] = xr[c + u] > acc[u] ? xr[c + u] : acc[u];
    float m = acc[0];
    for (int u = 1; u < UNROLL; u++) m = acc[u] > m ? acc[u] : m;
    for (; c < cols; c++) m = xr[c] > m ? xr[c] : m;
    return m;
}
#endif

/* The reduction passes: the row's max into *max_out, the sum of exp(x - max) returned. When FUSED, the
 * exponentials are also stored into yr (ONLINE 1: relative to the max in force for each chunk, recorded
 * in chunk_max[b] for the final pass). */
static inline float reduce_row(const float *restrict xr, float *restrict yr, int64_t cols, float *max_out,
                               float *restrict chunk_max) {
#if !FUSED
    (void)yr;
#endif
#if ONLINE
#if !FUSED
    (void)chunk_max;
#endif
    float m = xr[0], s = 0.0f;
    for (int64_t c0 = 0, b = 0; c0 < cols; c0 += CHUNK, b++) {
        const int64_t n = cols - c0 < CHUNK ? cols - c0 : CHUNK;
        const float *xc = xr + c0;
        float cm = xc[0];
        KF_SIMD_MAX_CHUNK
        for (int64_t c = 0; c < n; c++) cm = xc[c] > cm ? xc[c] : cm;
        if (cm > m) {
            s *= kf_exp(m - cm);
            m = cm;
        }
        float cs = 0.0f;
#if FUSED
        chunk_max[b] = m;
        float *yc = yr + c0;
        KF_SIMD_SUM_CHUNK
        for (int64_t c = 0; c < n; c++) {
            float e = kf_exp(xc[c] - m);
            yc[c] = e;
            cs += e;
        }
#else
        KF_SIMD_SUM_CHUNK
        for (int64_t c = 0; c < n; c++) cs += kf_exp(xc[c] - m);
#endif
        s += cs;
    }
#else
    (void)chunk_max;
    const float m = row_max(xr, cols);
    float s = 0.0f;
#if FUSED
    KF_SIMD_SUM
    for (int64_t c = 0; c < cols; c++) {
        float e = kf_exp(xr[c] - m);
        yr[c] = e;
        s += e;
    }
#else
    KF_SIMD_SUM
    for (int64_t c = 0; c < cols; c++) s += kf_exp(xr[c] - m);
#endif
#endif
    *max_out = m;
    return s;
}

/* The final pass's value of element c: from x (FUSED 0) or by scaling what the reduction stored in y
 * (FUSED 1; ONLINE 1 scales chunk b by fac[b] = exp(chunk_max[b] - max) / sum). */
#if !FUSED
#define KF_OUT(c) (kf_exp(xr[c] - m) * inv)
#elif !ONLINE
#define KF_OUT(c) (yr[c] * inv)
#else
#define KF_OUT(c) (yr[c] * fac[(c) / CHUNK])
#endif

static inline void write_row(const float *restrict xr, float *restrict yr, int64_t cols, float m, float inv,
                             const float *restrict fac) {
    (void)xr;
    (void)m;
    (void)inv;
    (void)fac;
    int64_t c = 0;
#if KF_STREAMS
    /* Streaming stores need aligned addresses: plain stores up to the first aligned element. */
    for (; c < cols && ((uintptr_t)(yr + c) % (4 * KF_LANES)) != 0; c++) yr[c] = KF_OUT(c);
#if !FUSED && !KF_VEC_EXP
    /* expf (or no intrinsics for kf_exp): blocks of whole vectors computed into an aligned buffer by the
     * element loop, which the compiler vectorises as it does the plain one (with a run-time length; a fixed
     * one may be unrolled into scalar expf calls), then streamed out. */
    while (c + KF_LANES <= cols) {
        float buf[KF_NT_BLOCK] __attribute__((aligned(64)));
        const int64_t whole = (cols - c) / KF_LANES * KF_LANES, n = whole < KF_NT_BLOCK ? whole : KF_NT_BLOCK;
        KF_SIMD
        for (int64_t j = 0; j < n; j++) buf[j] = KF_OUT(c + j);
        for (int64_t j = 0; j < n; j += KF_LANES) kf_stream(yr + c + j, kf_load(buf + j));
        c += n;
    }
#else
    const kf_vec vinv = kf_set1(inv);
#if !FUSED
    const kf_vec vm = kf_set1(m);
#endif
    for (; c + KF_LANES <= cols; c += KF_LANES) {
#if !FUSED
        /* x has y's alignment only when the row pitch allows; an unaligned load costs nothing extra here. */
#if KF_LANES == 16
        const kf_vec xv = _mm512_loadu_ps(xr + c);
#else
        const kf_vec xv = _mm256_loadu_ps(xr + c);
#endif
        kf_stream(yr + c, kf_mul(kf_exp_vec(kf_sub(xv, vm)), vinv));
#elif !ONLINE
        kf_stream(yr + c, kf_mul(kf_load(yr + c), vinv));
#else
        (void)vinv;
        kf_stream(yr + c, kf_mul(kf_load(yr + c), line_factor(fac, c)));
#endif
    }
#endif
#endif
#if FUSED && ONLINE
    /* Chunk by chunk, so that the factor is a constant of the vectorised loop. */
    while (c < cols) {
        const int64_t b = c / CHUNK, end = (b + 1) * CHUNK < cols ? (b + 1) * CHUNK : cols;
        const float f = fac[b];
        KF_SIMD
        for (int64_t i = c; i < end; i++) yr[i] *= f;
        c = end;
    }
#else
    KF_SIMD
    for (int64_t i = c; i < cols; i++) yr[i] = KF_OUT(i);
#endif
}

void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    if (cols <= 0) return;
    float *chunk_max = NULL;
#if FUSED && ONLINE
    /* The max in force when each chunk was written, then (in place) the chunk's final factor; one spare
     * entry for line_factor's look-ahead. */
    chunk_max = malloc((size_t)((cols + CHUNK - 1) / CHUNK + 1) * sizeof(float));
    if (chunk_max == NULL) return; /* out of memory: y stays unwritten and the harness says incorrect */
#endif
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m;
        const float inv = 1.0f / reduce_row(xr, yr, cols, &m, chunk_max);
#if FUSED && ONLINE
        const int64_t chunks = (cols + CHUNK - 1) / CHUNK;
        for (int64_t b = 0; b < chunks; b++) chunk_max[b] = kf_exp(chunk_max[b] - m) * inv;
        chunk_max[chunks] = 0.0f;
#endif
        write_row(xr, yr, cols, m, inv, chunk_max);
    }
    free(chunk_max);
#if KF_STREAMS
    _mm_sfence(); /* streaming stores are weakly ordered: make them visible before returning */
#endif
}

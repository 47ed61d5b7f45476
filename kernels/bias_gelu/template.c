/* Bias + exact GELU template. Parameters:
 *   VEC     0: plain C loops, vectorised by the compiler as it sees fit (with SIMD, omp simd);
 *           256 or 512: explicit vectors of that many bits (GCC vector extensions: AVX2 or AVX-512
 *           registers where the target has them, pairs of narrower registers elsewhere)
 *   ERF     how erf is computed: "libm" 0.5 z (1 + erff(z/sqrt2)); "erfc" 0.5 z erfcf(-z/sqrt2), which
 *           keeps full relative precision in the negative tail (both library calls: VEC 0 only); "poly" an
 *           inline rational-exponential approximation (Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7) with
 *           one division; "cheb" erfc(a) = erfcx(a) exp(-a^2) with erfcx(a) = exp(a^2) erfc(a) a
 *           polynomial of degree DEG on [0, 4], no division; past a = 4 (|z| > 5.66) gelu(z) is z or 0 to
 *           within 5e-8; "table" erfc(a) in 32 pieces on [0, 4), a cubic each, whose coefficients are picked
 *           lane by lane from registers (permutes), with neither exp nor division (VEC > 0 only); "table8"
 *           the same in 8 pieces, a polynomial of degree 6 each: one permute of one register per coefficient
 *           (the 32 pieces take two or four registers, and on AVX2 each two-register permute is two permutes
 *           and a blend): 7 permutes and 6 multiply-adds a vector where "table" has 16 permutes, 12 blends
 *           and 3 multiply-adds (VEC > 0 only)
 *   DEG     degree of the erfcx polynomial of "cheb" (relative error in float32: 11 ~5e-6, 12 ~1.6e-6,
 *           13 ~6e-7, 14 ~2.5e-7; 10, ~2e-5, would break the 1e-5 tolerance)
 *   EXP     exp(-a^2) in "poly" and "cheb": "libm" expf (a vector library call under -ffast-math; VEC 0
 *           only) or "inline4" / "inline5" / "inline6": 2^n from the exponent bits times a polynomial of
 *           that degree for 2^f, f in [-1/2, 1/2] (relative error 3e-6, 2e-7, 1e-7)
 *   SIMD    ask the compiler to vectorise the column loop (omp simd; VEC 0 only)
 *   UNROLL  VEC 0: columns per iteration written out by hand (only without SIMD); VEC > 0: vectors per
 *           iteration, independent chains the core can overlap
 *   NT      1: y is written with non-temporal (streaming) stores, which skip reading y's cache lines from
 *           memory first (x86 only, plain stores elsewhere; needs ALIGN 1 and VEC > 0); an sfence before
 *           returning orders them
 *   PF      software prefetch of x this many bytes ahead of the loads (0: none)
 *   ALIGN   1: scalar steps until y's address is aligned to each row's vector width; 0: start at once
 *   ROWS    rows processed together (VEC > 0): their vector loops are interleaved, so ROWS memory streams
 *           are read at once and more misses are in flight (the hardware prefetcher follows each)
 *   SPLIT   0: the rows processed together are adjacent (short rows: one stream, cut at row ends); 1: they are
 *           rows / ROWS apart (the matrix is split into ROWS parts walked together, left-over rows last)
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE__)
#include <immintrin.h>
#endif

#define KF_ERF_libm 0
#define KF_ERF_erfc 1
#define KF_ERF_poly 2
#define KF_ERF_cheb 3
#define KF_ERF_table 4
#define KF_ERF_table8 5
#define ERF KF_ERF_{{ERF}}
#define DEG {{DEG}}
#define KF_EXP_libm 0
#define KF_EXP_inline4 4
#define KF_EXP_inline5 5
#define KF_EXP_inline6 6
#define EXP KF_EXP_{{EXP}}
#define SIMD {{SIMD}}
#define UNROLL_SET {{UNROLL}}
#define VEC_SET {{VEC}}
#define NT {{NT}}
#define PF {{PF}}
#define ALIGN {{ALIGN}}
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
#else
#define KF_SIMD
#endif

#define KF_SQRT1_2 0.70710678118654752f

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
/* m ? a : b lane by lane, for a mask m of comparison results (all bits set or clear) */
#define KF_SELECT(m, a, b) ((kf_v)(((m) & (kf_vi)(a)) | (~(m) & (kf_vi)(b))))
#define KF_ABS(v) ((kf_v)((kf_vi)(v) & 0x7fffffff))
#define KF_MAX(a, b) KF_SELECT((a) > (b), (a), (b))
#define KF_MIN(a, b) KF_SELECT((a) < (b), (a), (b))
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
#define KF_SELECT(m, a, b) ((m) ? (a) : (b))
#define KF_ABS(v) fabsf(v)
#define KF_MAX(a, b) fmaxf((a), (b))
#define KF_MIN(a, b) fminf((a), (b))
#endif

#if EXP == KF_EXP_libm
#define kf_exp expf
#else
/* exp(x) for x <= 0: t = x log2(e) = n + f with n an integer and f in [-1/2, 1/2], 2^f by a polynomial of
 * degree EXP, 2^n from the exponent bits. Below -87 the result would not be a normal float; gelu only
 * needs it to be tiny there. */
static inline kf_v kf_exp(kf_v x) {
    x = KF_MAX(x, KF_SPLAT(-87.0f));
    const kf_v t = x * 1.44269504f;
    const kf_vi n = KF_TO_INT(t - 0.5f); /* t <= 0: truncation of t - 1/2 rounds t to nearest */
    const kf_v f = t - KF_TO_FLOAT(n);
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
    return p * KF_BITS_TO_FLOAT((n + 127) << 23);
}
#endif

#if ERF == KF_ERF_table
/* erfc(a) / 2 on piece i = floor(8a) of [0, 4) is a cubic in u = 8a - i, u in [0, 1): coefficients (highest
 * power first) fitted to minimise the largest absolute error on each piece (iteratively reweighted least squares
 * on 400 Chebyshev points; gelu's error stays below 0.12 of the tolerance, tests/test_template_spaces.py). The
 * last piece (a >= 31/8, |z| > 5.48) is 0: there erfc(a) < 5e-8 and gelu(z) is z or 0 to within 1.3e-7. The
 * halving saves gelu a multiply. */
#define KF_PIECES 32
static const float kf_erfc_piece[4][KF_PIECES] = {
    {
        3.623893426e-04f, 3.291517787e-04f, 2.677069861e-04f, 1.870570122e-04f,
        9.835164383e-05f, 1.275934028e-05f, -6.044739348e-05f, -1.151846591e-04f,
        -1.490286522e-04f, -1.629017788e-04f, -1.601861004e-04f, -1.455982274e-04f,
        -1.240879647e-04f, -1.000103075e-04f, -7.664703298e-05f, -5.606949344e-05f,
        -3.925746569e-05f, -2.636118006e-05f, -1.700325083e-05f, -1.054766290e-05f,
        -6.298899734e-06f, -3.624145620e-06f, -2.010328899e-06f, -1.075698492e-06f,
        -5.554950917e-07f, -2.769561434e-07f, -1.333624624e-07f, -6.204102476e-08f,
        -2.789085229e-08f, -1.211945211e-08f, -5.091338018e-09f, 0.000000000e+00f,
    },
    {
        4.169156000e-06f, 1.099032117e-03f, 2.092407085e-03f, 2.898898674e-03f,
        3.460625885e-03f, 3.753670957e-03f, 3.788027680e-03f, 3.601725446e-03f,
        3.251057817e-03f, 2.799434355e-03f, 2.307226881e-03f, 1.824390143e-03f,
        1.386479824e-03f, 1.014044159e-03f, 7.144932169e-04f, 4.853943246e-04f,
        3.181522479e-04f, 2.013053017e-04f, 1.230130583e-04f, 7.262518193e-05f,
        4.143835031e-05f, 2.285682058e-05f, 1.219073238e-05f, 6.288300938e-06f,
        3.137646900e-06f, 1.514643373e-06f, 7.074774544e-07f, 3.197896206e-07f,
        1.398986313e-07f, 5.923833868e-08f, 2.428125612e-08f, 0.000000000e+00f,
    },
    {
        -7.052466273e-02f, -6.943327934e-02f, -6.625537574e-02f, -6.127744168e-02f,
        -5.492947996e-02f, -4.772380739e-02f, -4.018729553e-02f, -3.279940784e-02f,
        -2.594574913e-02f, -1.989248022e-02f, -1.478201337e-02f, -1.064632833e-02f,
        -7.431685459e-03f, -5.028002895e-03f, -3.297039540e-03f, -2.095428528e-03f,
        -1.290747547e-03f, -7.706005126e-04f, -4.458990006e-04f, -2.500706178e-04f,
        -1.359275921e-04f, -7.160958194e-05f, -3.656394256e-05f, -1.809477362e-05f,
        -8.679033272e-06f, -4.034664926e-06f, -1.817864018e-06f, -7.938401154e-07f,
        -3.359868685e-07f, -1.378253529e-07f, -5.479657261e-08f, 0.000000000e+00f,
    },
    {
        5.000000596e-01f, 4.298419952e-01f, 3.618369401e-01f, 2.979417145e-01f,
        2.397502363e-01f, 1.883797199e-01f, 1.444223076e-01f, 1.079625562e-01f,
        7.864964753e-02f, 5.580589548e-02f, 3.854991868e-02f, 2.591492608e-02f,
        1.694738120e-02f, 1.077808626e-02f, 6.664121058e-03f, 4.004934337e-03f,
        2.338838531e-03f, 1.326993108e-03f, 7.313430542e-04f, 3.914588888e-04f,
        2.034694335e-04f, 1.026838290e-04f, 5.030857938e-05f, 2.392606984e-05f,
        1.104451349e-05f, 4.947981779e-06f, 2.151195076e-06f, 9.075460525e-07f,
        3.715047967e-07f, 1.475500113e-07f, 5.685485860e-08f, 0.000000000e+00f,
    },
};

/* Coefficient k of each lane's piece i: a permute across the two (VEC 512) or four (VEC 256) registers that
 * hold the 32 values, in place of a table load per lane (a gather). */
static inline kf_v kf_piece(int k, kf_vi i) {
    const float *c = kf_erfc_piece[k];
#if LANES == 16
    return __builtin_shuffle(KF_LOAD(c), KF_LOAD(c + 16), i);
#else
    const kf_v low = __builtin_shuffle(KF_LOAD(c), KF_LOAD(c + 8), i);
    const kf_v high = __builtin_shuffle(KF_LOAD(c + 16), KF_LOAD(c + 24), i);
    return KF_SELECT((i & 16) != 0, high, low);
#endif
}
#endif

#if ERF == KF_ERF_table8
/* erfc(a) / 2 on piece i = floor(2a) of [0, 4) is a polynomial of degree 6 in u = 2a - i, u in [0, 1): coefficients
 * (highest power first, one row per power, a column per piece) fitted to minimise the largest absolute error on each
 * piece (iteratively reweighted least squares on 4001 Chebyshev points; in float32 |z| times the error stays below
 * 4e-8, gelu's below 0.05 of the tolerance, tests/test_template_spaces.py). Past a = 4 (|z| > 5.66) the result is
 * 0 by a mask: there erfc(a) < 1.6e-8 and gelu(z) is z or 0 to within 5e-8. Rows are 16 floats wide so that one
 * load fills a 512-bit register (its upper half unused). */
static const float kf_erfc8[7][16] = {
    {3.062155156e-04f, 2.073966170e-04f, -1.602583216e-04f, -7.077942428e-05f, 2.159549149e-05f, 1.303984391e-05f,
     2.148735120e-06f, 1.630709221e-07f},
    {-2.142235870e-03f, 1.787767251e-04f, 1.211691415e-03f, 1.190606054e-04f, -2.301205532e-04f, -8.327286196e-05f,
     -1.164328205e-05f, -8.049144640e-07f},
    {2.410014131e-04f, -5.933186971e-03f, -2.236880828e-03f, 1.471099094e-03f, 1.090871170e-03f, 2.610825468e-04f,
     2.998949276e-05f, 1.831034865e-06f},
    {2.342783846e-02f, 9.230484255e-03f, -8.625023067e-03f, -8.699004538e-03f, -3.018364543e-03f, -5.189705407e-04f,
     -4.844383875e-05f, -2.551945727e-06f},
    {1.278888431e-05f, 5.491090938e-02f, 5.188497528e-02f, 2.230390906e-02f, 5.167410709e-03f, 6.802320131e-04f,
     5.208020229e-05f, 2.347938789e-06f},
    {-2.820955515e-01f, -2.196948230e-01f, -1.037766784e-01f, -2.973285131e-02f, -5.166784395e-03f, -5.445411662e-04f,
     -3.480484156e-05f, -1.349008585e-06f},
    {5.000000000e-01f, 2.397500575e-01f, 7.864960283e-02f, 1.694742963e-02f, 2.338867867e-03f, 2.034757053e-04f,
     1.104516559e-05f, 3.715409491e-07f},
};

/* Coefficient k of each lane's piece i (0 to 7): one permute of the register that holds the row. */
static inline kf_v kf_piece8(int k, kf_vi i) { return __builtin_shuffle(KF_LOAD(kf_erfc8[k]), i); }
#endif

#if ERF == KF_ERF_cheb
/* erfcx(a) = exp(a^2) erfc(a) on [0, 4] in powers of s = a/2 - 1: fits that minimise the largest relative
 * error (iteratively reweighted least squares on 16001 points), highest power first. */
#if DEG == 11
static const float kf_erfcx[] = {-5.725263152e-03f, 1.198449917e-02f, -5.287844222e-03f, 5.048705265e-03f,
                                 -2.455904521e-02f, 4.285759851e-02f, -5.871196836e-02f, 8.590662479e-02f,
                                 -1.236161143e-01f, 1.673049331e-01f, -2.135978341e-01f, 2.553944588e-01f};
#elif DEG == 12
static const float kf_erfcx[] = {3.170342417e-03f, -6.804276258e-03f, 2.776494948e-03f, -2.396065043e-03f,
                                 1.500832476e-02f, -2.736014314e-02f, 3.793856874e-02f, -5.753486603e-02f,
                                 8.699071407e-02f, -1.238156036e-01f, 1.672191471e-01f, -2.135885358e-01f,
                                 2.553955317e-01f};
#elif DEG == 13
static const float kf_erfcx[] = {-1.710532932e-03f, 3.758163424e-03f, -1.411094214e-03f, 1.054603374e-03f,
                                 -8.898003027e-03f, 1.689034328e-02f, -2.362631448e-02f, 3.699680045e-02f,
                                 -5.856655166e-02f, 8.720178157e-02f, -1.236951426e-01f, 1.672020704e-01f,
                                 -2.135924697e-01f, 2.553957701e-01f};
#else
static const float kf_erfcx[] = {9.005964384e-04f, -2.022761386e-03f, 6.947473739e-04f, -4.186456790e-04f,
                                 5.127836484e-03f, -1.010622829e-02f, 1.422193088e-02f, -2.292412333e-02f,
                                 3.788668290e-02f, -5.876349285e-02f, 8.706203103e-02f, -1.236717030e-01f,
                                 1.672101766e-01f, -2.135932595e-01f, 2.553956807e-01f};
#endif
#endif

/* gelu(z) = 0.5 z (1 + erf(z / sqrt2)), lane by lane. */
static inline kf_v gelu(kf_v z) {
#if ERF == KF_ERF_libm
    return 0.5f * z * (1.0f + erff(z * KF_SQRT1_2));
#elif ERF == KF_ERF_erfc
    return 0.5f * z * erfcf(-z * KF_SQRT1_2);
#elif ERF == KF_ERF_table
    /* Capped below 32 so that a huge or infinite |z| lands in the last piece, not past it. */
    const kf_v s = KF_MIN(KF_ABS(z) * (8.0f * KF_SQRT1_2), KF_SPLAT(31.99f));
    const kf_vi i = KF_TO_INT(s);
    const kf_v u = s - KF_TO_FLOAT(i);
    kf_v half_tail = kf_piece(0, i);
    for (int k = 1; k < 4; k++) half_tail = half_tail * u + kf_piece(k, i);
    /* w = z erfc(|z|/sqrt2) / 2 is gelu(z) for z < 0 (2 Phi(z) without cancellation), z - gelu(z) for z >= 0 */
    const kf_v w = z * half_tail;
    return KF_SELECT(z >= 0.0f, z - w, w);
#elif ERF == KF_ERF_table8
    const kf_v s = KF_ABS(z) * (2.0f * KF_SQRT1_2);
    /* Capped below 8 so that a huge or infinite |z| indexes the last piece; the mask then makes it 0. */
    const kf_vi i = KF_TO_INT(KF_MIN(s, KF_SPLAT(7.99f)));
    const kf_v u = s - KF_TO_FLOAT(i);
    kf_v half_tail = kf_piece8(0, i);
    for (int k = 1; k < 7; k++) half_tail = half_tail * u + kf_piece8(k, i);
    half_tail = KF_SELECT(s < 8.0f, half_tail, KF_SPLAT(0.0f));
    const kf_v w = z * half_tail;
    return KF_SELECT(z >= 0.0f, z - w, w);
#else
    const kf_v a = KF_ABS(z) * KF_SQRT1_2;
#if ERF == KF_ERF_poly
    const kf_v t = 1.0f / (1.0f + 0.3275911f * a);
    const kf_v p = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
#elif ERF == KF_ERF_cheb
    const kf_v s = 0.5f * KF_MIN(a, KF_SPLAT(4.0f)) - 1.0f;
    kf_v p = KF_SPLAT(kf_erfcx[0]);
    for (int k = 1; k <= DEG; k++) p = p * s + kf_erfcx[k];
#endif
    const kf_v tail = p * kf_exp(-a * a);
    /* tail is erfc(|z|/sqrt2): for z < 0 it is 2 Phi(z) without cancellation. */
    return 0.5f * z * KF_SELECT(z >= 0.0f, 2.0f - tail, tail);
#endif
}

#if VEC > 0
#define KF_GELU1(s) (gelu(KF_SPLAT(s))[0])
#else
#define KF_GELU1(s) gelu(s)
#endif

#if PF > 0
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

#if VEC > 0
/* nr rows (ROWS, or 1 for the rows left over) from x, y, rs floats apart: their vector loops are interleaved, so
 * that nr streams are read from memory at once; each row is peeled to its own alignment first. */
static inline void kf_rows(const float *x, const float *b, float *y, int nr, int64_t cols, int64_t rs) {
    const int64_t step = UNROLL * LANES;
    const float *xr[ROWS], *br[ROWS];
    float *yr[ROWS];
    int64_t left[ROWS]; /* columns of each row after its peel */
    int64_t steps = cols / step;
    for (int k = 0; k < nr; k++) {
        int64_t h = 0;
#if ALIGN
        /* scalar steps up to y's vector alignment */
        float *const row = y + k * rs;
        h = (int64_t)(((uintptr_t)(LANES * 4) - (uintptr_t)row % (LANES * 4)) % (LANES * 4)) / 4;
        h = h < cols ? h : cols;
        for (int64_t c = 0; c < h; c++) row[c] = KF_GELU1(x[k * rs + c] + b[c]);
#endif
        xr[k] = x + k * rs + h;
        yr[k] = y + k * rs + h;
        br[k] = b + h;
        left[k] = cols - h;
        steps = left[k] / step < steps ? left[k] / step : steps;
    }
    for (int64_t j = 0; j < steps; j++) {
        const int64_t c = j * step;
        for (int k = 0; k < nr; k++) {
            for (int l = 0; l < (step * 4 + 63) / 64; l++) KF_PREFETCH(xr[k] + c + l * 16);
            for (int u = 0; u < UNROLL; u++)
                KF_PUT(yr[k] + c + u * LANES, gelu(KF_LOAD(xr[k] + c + u * LANES) + KF_LOAD(br[k] + c + u * LANES)));
        }
    }
    for (int k = 0; k < nr; k++) {
        int64_t c = steps * step;
        for (; c + LANES <= left[k]; c += LANES) KF_PUT(yr[k] + c, gelu(KF_LOAD(xr[k] + c) + KF_LOAD(br[k] + c)));
        for (; c < left[k]; c++) yr[k][c] = KF_GELU1(xr[k][c] + br[k][c]);
    }
}
#endif

void bias_gelu(const float *x, const float *b, float *y, int64_t rows, int64_t cols) {
#if VEC > 0
    /* rows / ROWS blocks, then the rows left over one by one. Block k is rows k ROWS .. k ROWS + ROWS - 1, or with
     * SPLIT rows k, k + rows / ROWS, k + 2 rows / ROWS, ... */
    const int64_t blocks = rows / ROWS;
#if SPLIT
    const int64_t rs = blocks * cols, bs = cols; /* floats between a block's rows, and between blocks */
#else
    const int64_t rs = cols, bs = ROWS * cols;
#endif
    for (int64_t k = 0; k < blocks; k++) kf_rows(x + k * bs, b, y + k * bs, ROWS, cols, rs);
    for (int64_t r = blocks * ROWS; r < rows; r++) kf_rows(x + r * cols, b, y + r * cols, 1, cols, cols);
#else
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict xr = x + r * cols;
        float *restrict yr = y + r * cols;
        int64_t c = 0;
#if UNROLL > 1
        for (; c + UNROLL <= cols; c += UNROLL) {
            KF_PREFETCH(xr + c);
            for (int u = 0; u < UNROLL; u++) yr[c + u] = gelu(xr[c + u] + b[c + u]);
        }
#endif
        KF_SIMD
        for (int64_t i = c; i < cols; i++) {
            KF_PREFETCH(xr + i);
            yr[i] = gelu(xr[i] + b[i]);
        }
    }
#endif
#if KF_STREAMS
    _mm_sfence(); /* streaming stores are weakly ordered: make them visible before returning */
#endif
}

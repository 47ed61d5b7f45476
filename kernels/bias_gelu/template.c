/* Bias + exact GELU template. Parameters:
 *   VEC     0: plain C loops, vectorised by the compiler as it sees fit (with SIMD, omp simd);
 *           256 or 512: explicit vectors of that many bits (GCC vector extensions: AVX2 or AVX-512
 *           registers where the target has them, pairs of narrower registers elsewhere)
 *   ERF     how erf is computed: "libm" 0.5 z (1 + erff(z/sqrt2)); "erfc" 0.5 z erfcf(-z/sqrt2), which
 *           keeps full relative precision in the negative tail (both library calls: VEC 0 only); "poly" an
 *           inline rational-exponential approximation (Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7) with
 *           one division; "cheb" erfc(a) = erfcx(a) exp(-a^2) with erfcx(a) = exp(a^2) erfc(a) a
 *           polynomial of degree DEG on [0, 4], no division; past a = 4 (|z| > 5.66) gelu(z) is z or 0 to
 *           within 5e-8
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
 *   ALIGN   1: scalar steps until y's address is aligned to the vector width; 0: start at once
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
#define ERF KF_ERF_{{ERF}}
#define DEG {{DEG}}
#define KF_EXP_libm 0
#define KF_EXP_inline4 4
#define KF_EXP_inline5 5
#define KF_EXP_inline6 6
#define EXP KF_EXP_{{EXP}}
#define SIMD {{SIMD}}
#define UNROLL {{UNROLL}}
#define VEC {{VEC}}
#define NT {{NT}}
#define PF {{PF}}
#define ALIGN {{ALIGN}}

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
#else
    const kf_v a = KF_ABS(z) * KF_SQRT1_2;
#if ERF == KF_ERF_poly
    const kf_v t = 1.0f / (1.0f + 0.3275911f * a);
    const kf_v p = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
#else
    const kf_v s = 0.5f * KF_MIN(a, KF_SPLAT(4.0f)) - 1.0f;
    kf_v p = KF_SPLAT(kf_erfcx[0]);
    for (int k = 1; k <= DEG; k++) p = p * s + kf_erfcx[k];
#endif
    /* p * exp(-a^2) is erfc(|z|/sqrt2): for z < 0 it is 2 Phi(z) without cancellation. */
    const kf_v tail = p * kf_exp(-a * a);
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

void bias_gelu(const float *x, const float *b, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict xr = x + r * cols;
        float *restrict yr = y + r * cols;
        int64_t c = 0;
#if VEC > 0
#if ALIGN
        /* scalar steps up to y's vector alignment */
        const int64_t h = (int64_t)(((uintptr_t)(LANES * 4) - (uintptr_t)yr % (LANES * 4)) % (LANES * 4)) / 4;
        for (; c < h && c < cols; c++) yr[c] = KF_GELU1(xr[c] + b[c]);
#endif
        for (; c + UNROLL * LANES <= cols; c += UNROLL * LANES) {
            for (int l = 0; l < (UNROLL * LANES * 4 + 63) / 64; l++) KF_PREFETCH(xr + c + l * 16);
            for (int u = 0; u < UNROLL; u++)
                KF_PUT(yr + c + u * LANES, gelu(KF_LOAD(xr + c + u * LANES) + KF_LOAD(b + c + u * LANES)));
        }
        for (; c + LANES <= cols; c += LANES) KF_PUT(yr + c, gelu(KF_LOAD(xr + c) + KF_LOAD(b + c)));
        for (; c < cols; c++) yr[c] = KF_GELU1(xr[c] + b[c]);
#else
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
#endif
    }
#if KF_STREAMS
    _mm_sfence(); /* streaming stores are weakly ordered: make them visible before returning */
#endif
}

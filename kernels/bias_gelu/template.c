/* Bias + exact GELU template. Parameters:
 *   ERF     how erf is computed: "libm" 0.5 z (1 + erff(z/sqrt2)); "erfc" 0.5 z erfcf(-z/sqrt2), which
 *           keeps full relative precision in the negative tail; "poly" an inline rational-exponential
 *           approximation (Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7) the compiler can vectorise
 *           with no library call but a division; "cheb" erfc(a) = erfcx(a) exp(-a^2) with erfcx(a) =
 *           exp(a^2) erfc(a) a degree-14 polynomial on [0, 4] (relative error 3.4e-7 in float32), no
 *           division; past a = 4 (|z| > 5.66) gelu(z) is z or 0 to within 5e-8
 *   EXP     exp in "poly" and "cheb": "libm" expf (a vector library call under -ffast-math) or "inline",
 *           a Cody-Waite reduction and a degree-6 Taylor polynomial (relative error ~2e-7) the compiler
 *           can interleave across iterations
 *   SIMD    ask the compiler to vectorise the column loop (omp simd)
 *   UNROLL  columns per iteration written out by hand (only without SIMD)
 *   VEC     preferred vector width in bits for the compiler (256 or 512)
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define KF_ERF_libm 0
#define KF_ERF_erfc 1
#define KF_ERF_poly 2
#define KF_ERF_cheb 3
#define ERF KF_ERF_{{ERF}}
#define KF_EXP_libm 0
#define KF_EXP_inline 1
#define EXP KF_EXP_{{EXP}}
#define SIMD {{SIMD}}
#define UNROLL {{UNROLL}}
#define VEC {{VEC}}

#if VEC == 512
#pragma GCC target("prefer-vector-width=512")
#else
#pragma GCC target("prefer-vector-width=256")
#endif

#if SIMD
#define KF_SIMD _Pragma("omp simd")
#else
#define KF_SIMD
#endif

#define KF_SQRT1_2 0.70710678118654752f

#if EXP == KF_EXP_inline
/* exp(x) for x <= 0: x = n ln2 + f with |f| <= ln2/2, exp(f) by Taylor to degree 6, 2^n from the exponent
 * bits. Below -87 the result would not be a normal float; gelu only needs it to be tiny there. */
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
#define kf_exp expf
#endif

static inline float gelu(float z) {
#if ERF == KF_ERF_libm
    return 0.5f * z * (1.0f + erff(z * KF_SQRT1_2));
#elif ERF == KF_ERF_erfc
    return 0.5f * z * erfcf(-z * KF_SQRT1_2);
#elif ERF == KF_ERF_poly
    float a = fabsf(z) * KF_SQRT1_2;
    float t = 1.0f / (1.0f + 0.3275911f * a);
    float p = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
    /* p * exp(-a^2) is erfc(|z|/sqrt2): for z < 0 it is 2 Phi(z) without cancellation. */
    float tail = p * kf_exp(-a * a);
    return 0.5f * z * (z >= 0.0f ? 2.0f - tail : tail);
#else
    /* Least-squares Chebyshev fit of erfcx on [0, 4] (400 nodes, degree 14), in powers of s = a/2 - 1. */
    float a = fabsf(z) * KF_SQRT1_2;
    float s = 0.5f * fminf(a, 4.0f) - 1.0f;
    float p = 2.553956682e-01f + s * (-2.135934017e-01f + s * (1.672120291e-01f + s * (-1.236675913e-01f +
              s * (8.703082905e-02f + s * (-5.879771298e-02f + s * (3.808180178e-02f + s * (-2.280308024e-02f +
              s * (1.364529784e-02f + s * (-1.031315689e-02f + s * (5.997631935e-03f + s * (-2.495811265e-04f +
              s * (4.702926084e-05f + s * (-2.075710633e-03f + s * 1.089432533e-03f)))))))))))));
    float tail = p * kf_exp(-a * a);
    return 0.5f * z * (z >= 0.0f ? 2.0f - tail : tail);
#endif
}

void bias_gelu(const float *x, const float *b, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict xr = x + r * cols;
        float *restrict yr = y + r * cols;
        int64_t c = 0;
#if UNROLL > 1
        for (; c + UNROLL <= cols; c += UNROLL)
            for (int u = 0; u < UNROLL; u++) yr[c + u] = gelu(xr[c + u] + b[c + u]);
#endif
        KF_SIMD
        for (int64_t i = c; i < cols; i++) yr[i] = gelu(xr[i] + b[i]);
    }
}

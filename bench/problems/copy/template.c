#include <stdint.h>

#define UNROLL {{UNROLL}}

void copy(const float *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + UNROLL <= n; i += UNROLL)
        for (int u = 0; u < UNROLL; u++) y[i + u] = x[i + u];
    for (; i < n; i++) y[i] = x[i];
}

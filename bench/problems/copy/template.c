#include <stdint.h>

#define UNROLL {{UNROLL}}
/* A knob with no effect on the code: it only makes the space big enough for a 1,000-candidate search. */
#define SALT {{SALT}}

void copy(const float *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + UNROLL <= n; i += UNROLL)
        for (int u = 0; u < UNROLL; u++) y[i + u] = x[i + u];
    for (; i < n; i++) y[i] = x[i];
}

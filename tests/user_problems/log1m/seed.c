#include <math.h>
#include <stdint.h>

void log1m(const float *p, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = log1pf(-p[i]);
}

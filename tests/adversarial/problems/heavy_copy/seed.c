#include <stdint.h>
#include <string.h>

void heavy_copy(const float *x, float *y, int64_t n) { memcpy(y, x, (size_t)n * sizeof(float)); }

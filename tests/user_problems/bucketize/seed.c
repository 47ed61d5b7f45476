/* For each x[i], the first edge greater than it, by binary search over the sorted edges. */
#include <stdint.h>

void bucketize(const float *x, const float *edges, int64_t *idx, int64_t n, int64_t m) {
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        int64_t lo = 0, hi = m;
        while (lo < hi) {
            int64_t mid = lo + (hi - lo) / 2;
            if (edges[mid] <= v) lo = mid + 1;
            else hi = mid;
        }
        idx[i] = lo;
    }
}

// expect: incorrect
// stage: benchmark
// check: timed_output
// dedicated: test_a_kernel_that_shortens_the_batch_loop_is_caught
/* Computes every call correctly, but shortens the worker's batch loop (`for index in range(go.calls)` in
 * worker._Bench.batch) by editing the range iterator object in memory: no Python code runs, so no audit event.
 * The parent times Go->Done and divides by go.calls, so a batch that ran 1/4 of its calls read 4x faster (37x
 * numpy where the same loops honestly make 9x). Every output it leaves is correct: what gives it away is that
 * the last call and the kept call are not the calls the parent asked for (the worker's counters are in the
 * kernel's reach; the parent's are not). CPython 3.11's frame layout (the offsets below); dlsym found by
 * walking libc's ELF dynamic symbols from memcpy's address (no forbidden import). */
#include <elf.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "libc_symbol.h"

typedef struct { intptr_t refcnt; void *type; long index, start, step, len; } rangeiter;

static int looked;
static void *rangeiter_type;
static void *(*this_thread_state)(void);
static rangeiter *last;

#ifndef SHRINK
#define SHRINK 4
#endif

static void shorten_batch(void) {
    if (!looked) {
        looked = 1;
        void *(*lookup)(void *, const char *) = (void *(*)(void *, const char *))libc_symbol((const void *)&memcpy, "dlsym");
        if (lookup) {
            rangeiter_type = lookup(0, "PyRangeIter_Type");
            this_thread_state = (void *(*)(void))lookup(0, "PyGILState_GetThisThreadState");
        }
    }
    if (!rangeiter_type || !this_thread_state) return;
    char *tstate = this_thread_state();
    if (!tstate) return;
    char *cframe = *(char **)(tstate + 56);
    if (!cframe) return;
    char *frame = *(char **)(cframe + 8);          /* _call's frame */
    if (!frame) return;
    char *caller = *(char **)(frame + 48);         /* batch's frame */
    if (!caller) return;
    char *code = *(char **)(caller + 32);
    int nlocals = *(int *)(code + 76);
    void **localsplus = (void **)(caller + 72);
    for (int k = 0; k < nlocals + 4; k++) {
        rangeiter *r = localsplus[k];
        if (!r || ((uintptr_t)r & 7)) continue;
        if (k < nlocals) continue;                 /* the value stack starts after the locals */
        if (r->type != rangeiter_type) continue;
        if (r != last && r->step == 1 && r->len >= 2 * SHRINK) {
            last = r;
            r->len = r->len / SHRINK;
        }
        return;
    }
}

void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    shorten_batch();
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        float s = 0.0f;
        for (int64_t c = 0; c < cols; c++) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        for (int64_t c = 0; c < cols; c++) yr[c] = yr[c] / s;
    }
}

// expect: crash
// stage: validate
// dedicated: test_a_worker_that_dies_after_its_last_reply_is_no_verdict_of_ok
/* Correct, but its first call leaves a thread behind (a raw clone, allowed when the candidate may run two
 * threads) that sleeps 0.2 s, then ends the whole process with status 0. Past its last reply only the
 * candidate's code can act in the worker; a judge that did not check how the worker ended would keep the
 * trials' "ok". */
#include "raw.h"
#define LEAVER_FLAGS 0x50f00L /* CLONE_VM | FS | FILES | SIGHAND | THREAD | SYSVSEM */
static long nap[2] = {0, 200L * 1000 * 1000};
static char leaver_stack[1 << 16] __attribute__((aligned(16)));
static int started;
static volatile int asleep;
static void leave_later(void) {
    /* The new thread runs only the instructions after the clone, all system calls: no stack, no TLS. */
    register long tls __asm__("r10") = 0;
    register long child_tid __asm__("r8") = 0;
    long r;
    __asm__ volatile(
        "syscall\n\t"
        "test %%rax, %%rax\n\t"
        "jnz 1f\n\t"
        "movl $1, (%[asleep])\n\t"
        "mov $230, %%eax\n\t" /* clock_nanosleep(CLOCK_MONOTONIC, 0, nap, 0) */
        "mov $1, %%edi\n\t"
        "xor %%esi, %%esi\n\t"
        "mov %[nap], %%rdx\n\t"
        "xor %%r10d, %%r10d\n\t"
        "syscall\n\t"
        "mov $231, %%eax\n\t" /* exit_group(0) */
        "xor %%edi, %%edi\n\t"
        "syscall\n\t"
        "1:\n\t"
        : "=a"(r), "+r"(tls)
        : "a"(56L), "D"(LEAVER_FLAGS), "S"(leaver_stack + sizeof leaver_stack), "d"(0L), "r"(child_tid),
          [nap] "r"(nap), [asleep] "r"(&asleep)
        : "rcx", "r11", "memory");
}
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    if (!started) {
        started = 1;
        leave_later();
        while (!asleep) { /* returns only once the thread is off to sleep: not "running after the return" */
        }
    }
    softmax_rows(x, y, rows, cols);
}

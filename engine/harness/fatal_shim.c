/* Fatal-signal reporter loaded by the harness worker (engine/harness/worker.py) before any candidate.
 *
 * When the candidate dies from SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT or SIGSYS, the handler writes one
 * line to the descriptor given to kf_install_fatal_handlers -- the signal, the fault address and the
 * process's VmSize/VmPeak -- and then dies from the same signal. The parent uses VmPeak to tell "crashed
 * after an allocation failed at the address-space limit" (resource_limit) from an ordinary crash. For a
 * system call the seccomp filter refused (engine/harness/seccomp.py), the line also carries the call's
 * number ("syscall") and the AUDIT_ARCH of its ABI ("syscall_arch").
 *
 * Only async-signal-safe calls are used, and only calls the seccomp filter's run stage allows: pread,
 * write, getpid/gettid/rt_sigprocmask/tgkill (raise). Nothing is opened in the handler -- the filter would
 * refuse the open and the process would die from SIGSYS before reporting -- so /proc/self/status is opened
 * once, when the handlers are installed, and re-read from offset 0 with pread.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#ifndef SYS_SECCOMP
#define SYS_SECCOMP 1 /* si_code of a SIGSYS sent by seccomp; glibc's headers do not define it */
#endif

static int report_fd = -1;
static int status_fd = -1;
static char alt_stack[1 << 16];

static size_t put_str(char *out, size_t at, size_t cap, const char *s) {
    while (*s && at + 1 < cap) out[at++] = *s++;
    return at;
}

static size_t put_uint(char *out, size_t at, size_t cap, uint64_t v, int base) {
    char digits[32];
    int n = 0;
    do {
        digits[n++] = "0123456789abcdef"[v % (uint64_t)base];
        v /= (uint64_t)base;
    } while (v && n < 32);
    while (n > 0 && at + 1 < cap) out[at++] = digits[--n];
    return at;
}

/* Value in kB of a "Name:   1234 kB" line of /proc/self/status, or 0. */
static uint64_t status_kb(const char *text, const char *name) {
    const char *p = strstr(text, name);
    uint64_t v = 0;
    if (!p) return 0;
    p += strlen(name);
    while (*p == ' ' || *p == '\t' || *p == ':') p++;
    while (*p >= '0' && *p <= '9') v = v * 10 + (uint64_t)(*p++ - '0');
    return v;
}

static void on_fatal(int sig, siginfo_t *info, void *context) {
    (void)context;
    char status[4096];
    char line[256];
    size_t at = 0;
    ssize_t n = status_fd >= 0 ? pread(status_fd, status, sizeof status - 1, 0) : 0;
    status[n > 0 ? n : 0] = '\0';
    at = put_str(line, at, sizeof line, "{\"ev\": \"fatal\", \"signal\": ");
    at = put_uint(line, at, sizeof line, (uint64_t)sig, 10);
    at = put_str(line, at, sizeof line, ", \"address\": \"0x");
    at = put_uint(line, at, sizeof line, (uint64_t)(uintptr_t)info->si_addr, 16);
    at = put_str(line, at, sizeof line, "\", \"vm_size_kb\": ");
    at = put_uint(line, at, sizeof line, status_kb(status, "VmSize"), 10);
    at = put_str(line, at, sizeof line, ", \"vm_peak_kb\": ");
    at = put_uint(line, at, sizeof line, status_kb(status, "VmPeak"), 10);
#ifdef si_syscall
    if (sig == SIGSYS && info->si_code == SYS_SECCOMP) {
        /* si_call_addr shares si_addr's place: "address" above is where the system call was made. */
        int64_t number = info->si_syscall; /* negative when a candidate asked for system call -1 */
        at = put_str(line, at, sizeof line, number < 0 ? ", \"syscall\": -" : ", \"syscall\": ");
        at = put_uint(line, at, sizeof line, (uint64_t)(number < 0 ? -number : number), 10);
        at = put_str(line, at, sizeof line, ", \"syscall_arch\": ");
        at = put_uint(line, at, sizeof line, (uint64_t)info->si_arch, 10);
    }
#endif
    at = put_str(line, at, sizeof line, "}\n");
    if (report_fd >= 0) {
        ssize_t ignored = write(report_fd, line, at);
        (void)ignored;
    }
    /* SA_RESETHAND restored the default action: die from the same signal. */
    raise(sig);
}

int kf_install_fatal_handlers(int fd) {
    static const int signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGSYS};
    stack_t ss;
    struct sigaction action;
    report_fd = fd;
    if (status_fd < 0) status_fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    ss.ss_sp = alt_stack;
    ss.ss_size = sizeof alt_stack;
    ss.ss_flags = 0;
    if (sigaltstack(&ss, NULL) != 0) return -1;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_fatal;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < sizeof signals / sizeof signals[0]; i++) {
        if (sigaction(signals[i], &action, NULL) != 0) return -1;
    }
    return 0;
}

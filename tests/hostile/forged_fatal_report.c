// expect: crash
// stage: validate
/* Writes a fatal-signal report of its own into the reporter's pipe -- "killed by SIGKILL", which would read
 * as the machine's failure (never the kernel's verdict, so a search would run it again and again) -- and then
 * simply exits. The reporter's pipe is the newest write-only pipe among its inherited descriptors; fstat,
 * fcntl(F_GETFL), write and exit_group are all calls a kernel may make. The judge must believe how the
 * sandbox saw the worker end (a plain exit: the kernel crashed), not the report. */
#include <sys/stat.h>
#include "raw.h"
#define RAW_FSTAT 5
#define RAW_FCNTL 72
#define RAW_F_GETFL 3
#define RAW_EXIT_GROUP 231
static const char report[] = "{\"ev\": \"fatal\", \"signal\": 9}\n";
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    (void)x, (void)y, (void)rows, (void)cols;
    long newest = -1;
    unsigned long newest_inode = 0;
    for (long fd = 3; fd < 1024; fd++) {
        struct stat st;
        if (raw_syscall(RAW_FSTAT, fd, (long)&st, 0) != 0 || !S_ISFIFO(st.st_mode)) continue;
        long mode = raw_syscall(RAW_FCNTL, fd, RAW_F_GETFL, 0);
        if (mode >= 0 && (mode & 3) == 1 && st.st_ino > newest_inode) newest = fd, newest_inode = st.st_ino;
    }
    if (newest >= 0) raw_syscall(RAW_WRITE, newest, (long)report, sizeof report - 1);
    raw_syscall(RAW_EXIT_GROUP, 0, 0, 0);
}

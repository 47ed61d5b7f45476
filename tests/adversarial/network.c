// expect: forbidden
// stage: compile
// check: symbol
// names: socket
/* Tries to phone home to 127.0.0.1:{{PORT}} (a listener the test owns), then computes correctly. The
 * sandbox's network namespace used to stop it (ok, no connection); the screen now refuses socket at compile
 * time. */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>
static void softmax_ok(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        for (int64_t c = 0; c < cols; c++) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        for (int64_t c = 0; c < cols; c++) yr[c] /= s;
    }
}
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    static int tried;
    if (!tried) {
        tried = 1;
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in to = {0};
        to.sin_family = AF_INET;
        to.sin_port = htons({{PORT}});
        to.sin_addr.s_addr = htonl(0x7f000001);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&to, sizeof to) == 0) {
            ssize_t sent = write(fd, "leak", 4);
            (void)sent;
        }
        if (fd >= 0) close(fd);
    }
    softmax_ok(x, y, rows, cols);
}

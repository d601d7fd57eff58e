/* tests/test-progress.c — the CLI's load progress (src/cli/progress.c) as a terminal and a
 * pipe receive it: on a pseudo-terminal, no bar for a load under half a second, then a bar
 * redrawn in place with \r at most ten times a second (bytes, percent, GB/s, ETA) and
 * replaced by the done line; on a pipe the done line alone; after a failure no done line. */
#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "cli/progress.h"
#include "harness.h"

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Everything readable on fd now (the writes are done), NUL-terminated, into buf. */
static size_t drain(int fd, char *buf, size_t cap) {
    size_t n = 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    while (n + 1 < cap && poll(&p, 1, 100) > 0) {
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r <= 0) break;
        n += (size_t)r;
    }
    buf[n] = '\0';
    return n;
}

static int count(const char *s, const char *what) {
    int k = 0;
    for (const char *p = strstr(s, what); p; p = strstr(p + 1, what)) k++;
    return k;
}

/* A 2 GB load that takes about 0.75 s: four reports, two of them past the half second and
 * a tenth of a second apart, one right after another (not drawn). */
static void slow_load(atlas_cli_progress *p, int ok) {
    const uint64_t G = 1000000000u;
    atlas_cli_progress_begin(p, "big");
    atlas_cli_progress_report(p, "big", 0, 2 * G);
    sleep_s(0.6);
    atlas_cli_progress_report(p, "big", G, 2 * G);
    atlas_cli_progress_report(p, "big", G + G / 10, 2 * G);
    sleep_s(0.15);
    atlas_cli_progress_report(p, "big", 2 * G, 2 * G);
    atlas_cli_progress_end(p, ok, "cuda:0");
}

int main(void) {
    int master, slave;
    if (openpty(&master, &slave, NULL, NULL, NULL) != 0) {
        printf("SKIP: no pseudo-terminal\n");
        return 77;
    }
    struct termios t;
    tcgetattr(slave, &t);
    cfmakeraw(&t); /* bytes as written: no \n -> \r\n */
    tcsetattr(slave, TCSANOW, &t);
    FILE *tty = fdopen(slave, "w");
    static char buf[16384];

    /* a fast load at a terminal: the done line only */
    atlas_cli_progress *p = atlas_cli_progress_new(tty);
    CHECK(p != NULL);
    atlas_cli_progress_begin(p, "small");
    atlas_cli_progress_report(p, "small", 5000000, 13900000);
    atlas_cli_progress_report(p, "small", 13900000, 13900000);
    atlas_cli_progress_end(p, 1, "cpu");
    drain(master, buf, sizeof buf);
    CHECK_MSG(!strchr(buf, '\r') && !strchr(buf, '\033'), "%s", buf);
    CHECK_MSG(!strncmp(buf, "atlas: loaded small: 13.9 MB in 0.", 34) &&
              strstr(buf, " GB/s), cpu\n") && count(buf, "\n") == 1, "%s", buf);

    /* a slow one: two frames of the bar, then the done line in its place */
    slow_load(p, 1);
    drain(master, buf, sizeof buf);
    CHECK_MSG(count(buf, "\ratlas: loading big [") == 2, "%s", buf);
    const char *half = strstr(buf, "[############------------]  50%  1.0 GB / 2.0 GB  ");
    const char *eta = half ? strstr(half, " GB/s  ETA ") : NULL;
    CHECK_MSG(eta && eta[11] >= '1' && eta[11] <= '9' && strstr(eta, " s\033[K"), "%s", buf);
    CHECK_MSG(strstr(buf, "[########################] 100%  2.0 GB / 2.0 GB  ") &&
              strstr(buf, "ETA -\033[K"), "%s", buf);
    const char *done = strstr(buf, "\r\033[Katlas: loaded big: 2.0 GB in ");
    CHECK_MSG(done && strstr(done, " GB/s), cuda:0\n") && !strstr(buf, "1.1 GB"), "%s", buf);

    /* a failed one: the bar goes, no done line */
    slow_load(p, 0);
    drain(master, buf, sizeof buf);
    size_t n = strlen(buf);
    CHECK_MSG(n >= 4 && !strcmp(buf + n - 4, "\r\033[K") && !strstr(buf, "loaded"), "%s", buf);
    atlas_cli_progress_free(p);

    /* a pipe: no bar, one line */
    int fds[2];
    CHECK(pipe(fds) == 0);
    FILE *pipe_out = fdopen(fds[1], "w");
    p = atlas_cli_progress_new(pipe_out);
    slow_load(p, 1);
    fclose(pipe_out);
    drain(fds[0], buf, sizeof buf);
    CHECK_MSG(!strchr(buf, '\r') && !strchr(buf, '\033') && count(buf, "\n") == 1 &&
              !strncmp(buf, "atlas: loaded big: 2.0 GB in ", 29), "%s", buf);
    atlas_cli_progress_free(p);
    close(fds[0]);
    fclose(tty);
    close(master);
    return harness_finish();
}

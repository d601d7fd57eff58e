/* tests/harness.c — see harness.h. */
#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

int harness_failures = 0;
int harness_checks = 0;

const char *harness_data_dir(void) {
    const char *d = getenv("ATLAS_TEST_DATA");
    return d && *d ? d : "tests/data";
}

const char *harness_data_path(const char *rel) {
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/%s", harness_data_dir(), rel);
    return buf;
}

int harness_require_file(const char *path) {
    struct stat st;
    if (stat(path, &st) == 0) return 1;
    fprintf(stderr, "missing %s: run scripts/setup.sh first\n", path);
    harness_failures++; /* a missing fixture is a failure, not a skip: CI must have it */
    return 0;
}

int harness_mkdtemp(char *buf, size_t cap, const char *tag) {
    const char *base = getenv("TMPDIR");
    snprintf(buf, cap, "%s/atlas-%s-XXXXXX", base && *base ? base : "/tmp", tag);
    if (!mkdtemp(buf)) {
        perror("mkdtemp");
        return 0;
    }
    return 1;
}

void harness_rm_rf(const char *path) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", path);
}

double harness_rel_err(const float *a, const float *ref, int n) {
    double maxdiff = 0, maxabs = 0;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)a[i] - ref[i]);
        if (d > maxdiff || isnan(d)) maxdiff = isnan(d) ? INFINITY : d;
        if (fabs(ref[i]) > maxabs) maxabs = fabs(ref[i]);
    }
    return maxabs > 0 ? maxdiff / maxabs : maxdiff;
}

int harness_argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

int harness_run(const char *cmd, char *out, size_t cap) {
    out[0] = '\0';
    FILE *f = popen(cmd, "r");
    if (!f) {
        perror(cmd);
        return -1;
    }
    size_t n = 0, got;
    while (n < cap - 1 && (got = fread(out + n, 1, cap - 1 - n, f)) > 0) n += got;
    out[n] = '\0';
    /* drain the rest: closing the pipe early would kill the command with SIGPIPE */
    char sink[4096];
    size_t dropped = 0;
    while ((got = fread(sink, 1, sizeof sink, f)) > 0) dropped += got;
    if (dropped) fprintf(stderr, "harness_run: dropped %zu bytes of output of %s\n", dropped, cmd);
    int status = pclose(f);
    return status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void harness_in_child(const char *what, void (*fn)(void)) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        fn();
        fflush(stdout);
        fflush(stderr);
        exit(harness_failures ? 1 : 0);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "scenario '%s' failed (status %d)",
              what, status);
}

int harness_finish(void) {
    if (harness_failures) {
        fprintf(stderr, "FAILED: %d of %d checks\n", harness_failures, harness_checks);
        return 1;
    }
    printf("ok: %d checks\n", harness_checks);
    return 0;
}

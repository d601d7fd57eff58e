/* tests/harness.c — see harness.h. */
#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>

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

int harness_finish(void) {
    if (harness_failures) {
        fprintf(stderr, "FAILED: %d of %d checks\n", harness_failures, harness_checks);
        return 1;
    }
    printf("ok: %d checks\n", harness_checks);
    return 0;
}

/* tests/harness.h — a minimal test harness: CHECK records a failure and goes on; a test
 * program returns harness_finish(), non-zero when anything failed. */
#ifndef ATLAS_TEST_HARNESS_H
#define ATLAS_TEST_HARNESS_H

#include <stdio.h>

extern int harness_failures;
extern int harness_checks;

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        harness_checks++;                                                                  \
        if (!(cond)) {                                                                     \
            harness_failures++;                                                            \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);       \
        }                                                                                  \
    } while (0)

#define CHECK_MSG(cond, ...)                                                               \
    do {                                                                                   \
        harness_checks++;                                                                  \
        if (!(cond)) {                                                                     \
            harness_failures++;                                                            \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);       \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fputc('\n', stderr);                                                           \
        }                                                                                  \
    } while (0)

/* CHECK that an atlas call succeeded, printing atlas_last_error() if not. */
#define CHECK_OK(expr)                                                                     \
    do {                                                                                   \
        harness_checks++;                                                                  \
        atlas_status harness_st_ = (expr);                                                 \
        if (harness_st_ != ATLAS_OK) {                                                     \
            harness_failures++;                                                            \
            fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #expr,            \
                    atlas_status_str(harness_st_), atlas_last_error());                    \
        }                                                                                  \
    } while (0)

/* A GPU test's first call found no CUDA device (st ATLAS_ERR_NO_DEVICE): it ends skipped
 * (ctest's SKIP_RETURN_CODE 77), saying why, not as a pass that ran nothing. */
#define HARNESS_SKIP_NO_DEVICE(st)                                                         \
    do {                                                                                   \
        if ((st) == ATLAS_ERR_NO_DEVICE) {                                                 \
            printf("SKIP: no CUDA device: %s\n", atlas_last_error());                      \
            return 77;                                                                     \
        }                                                                                  \
    } while (0)

/* Directory of the test data (tests/data), from ATLAS_TEST_DATA. */
const char *harness_data_dir(void);
/* harness_data_dir()/rel into a static buffer (one at a time). */
const char *harness_data_path(const char *rel);
/* 1 when the file exists; otherwise prints "SKIP: why" and returns 0. Use for the fetched
 * tokenizer.json files, which scripts/setup.sh provides. */
int harness_require_file(const char *path);
/* Makes a fresh directory $TMPDIR/atlas-TAG-XXXXXX (or under /tmp) into buf; 0 on
 * failure (after printing why). */
int harness_mkdtemp(char *buf, size_t cap, const char *tag);
/* Removes a directory made by harness_mkdtemp, with everything in it. */
void harness_rm_rf(const char *path);
/* max |a - ref| / max |ref| over n values (INFINITY if any difference is NaN): the
 * normalised error the issues bound logits with. */
double harness_rel_err(const float *a, const float *ref, int n);
/* Index of the largest of x[n] (the first on ties). */
int harness_argmax(const float *x, int n);
/* Runs cmd with the shell; its stdout (and whatever the command line redirects there, such
 * as 2>&1) goes into out[cap] (cap >= 1), NUL-terminated and cut to fit; the rest is read
 * and dropped, with a note on stderr, so the command still ends normally. Returns the
 * command's exit status, or -1 if it could not run or died on a signal. */
int harness_run(const char *cmd, char *out, size_t cap);
/* Runs fn in a forked child (a scenario that must not touch this process: a driver faked
 * or made to fail, a process-scoped host) and CHECKs that it passed its own checks. The
 * child ends with exit, not _exit, so that LeakSanitizer checks it too. */
void harness_in_child(const char *what, void (*fn)(void));
int harness_finish(void);

#endif

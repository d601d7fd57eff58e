/* bench/tokenizer/tok-bench.c — encode speed of atlas's tokenizer, in MB/s (1 MB = 1e6 bytes).
 *
 *   tok-bench [-t THREADS] [-r REPEATS] [--dump-dir DIR] MODEL_DIR FILE...
 *
 * For each file: "whole" encodes the file as one text on one thread; "lines" encodes each
 * line (split at '\n', newline excluded) as its own text on one thread, like many small
 * requests; "lines-mt" does the same on THREADS threads (default: the CPU count), the
 * counterpart of HF's encode_batch.  The best of REPEATS runs (default 3) is reported.
 * "regex" is the ceiling measured in the same run: only the model's pre-tokenizer regex (the
 * first Split of tokenizer.json) run over the whole file with PCRE2 JIT, no BPE.
 * --dump-dir writes the ids of "whole" to DIR/<file name>.ids (int32 little-endian) so that
 * hf_bench.py can compare them with HF's.  Built by build.sh against build-dir/libatlas.a. */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* CPU time of this thread: on a shared machine it moves less than wall time. */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "atlas/tokenizer.h"

/* The first Split regex of DIR/tokenizer.json, JIT-compiled as atlas does; NULL if none. */
static pcre2_code *model_regex(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    json_t *root = json_load_file(path, 0, NULL);
    json_t *pre = json_object_get(root, "pre_tokenizer");
    json_t *seq = json_object_get(pre, "pretokenizers");
    json_t *first = json_is_array(seq) ? json_array_get(seq, 0) : pre;
    json_t *rx = json_object_get(json_object_get(first, "pattern"), "Regex");
    pcre2_code *re = NULL;
    if (json_is_string(rx)) {
        int err;
        PCRE2_SIZE off;
        re = pcre2_compile((PCRE2_SPTR)json_string_value(rx), json_string_length(rx),
                           PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
        if (re) pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    }
    json_decref(root);
    return re;
}

/* Seconds to find every match of re in text; *n gets the match count. */
static double run_regex(const pcre2_code *re, const char *text, size_t len, size_t *n) {
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    double t0 = now_s();
    size_t at = 0;
    *n = 0;
    while (at < len && pcre2_match(re, (PCRE2_SPTR)text, len, at, PCRE2_NO_UTF_CHECK, md, NULL) >= 0) {
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        at = ov[1] > ov[0] ? ov[1] : ov[1] + 1;
        (*n)++;
    }
    double t = now_s() - t0;
    pcre2_match_data_free(md);
    return t;
}


static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

typedef struct line {
    const char *s;
    size_t len;
} line;

typedef struct worker {
    const atlas_tokenizer *tok;
    const line *lines;
    size_t n_lines, first, step;
    size_t n_ids;
    int failed;
} worker;

static void *encode_lines(void *arg) {
    worker *w = arg;
    for (size_t i = w->first; i < w->n_lines; i += w->step) {
        int32_t *ids;
        size_t n;
        if (atlas_tokenizer_encode(w->tok, w->lines[i].s, w->lines[i].len, false, &ids, &n) != ATLAS_OK) {
            w->failed = 1;
            return NULL;
        }
        w->n_ids += n;
        free(ids);
    }
    return NULL;
}

/* Encodes all lines on `threads` threads (interleaved); returns seconds, or -1. */
static double run_lines(const atlas_tokenizer *tok, const line *lines, size_t n, int threads,
                        size_t *n_ids) {
    worker w[256];
    pthread_t th[256];
    double t0 = now_s();
    for (int i = 0; i < threads; i++) {
        w[i] = (worker){tok, lines, n, (size_t)i, (size_t)threads, 0, 0};
        if (threads > 1) pthread_create(&th[i], NULL, encode_lines, &w[i]);
        else encode_lines(&w[i]);
    }
    *n_ids = 0;
    int failed = 0;
    for (int i = 0; i < threads; i++) {
        if (threads > 1) pthread_join(th[i], NULL);
        *n_ids += w[i].n_ids;
        failed |= w[i].failed;
    }
    return failed ? -1 : now_s() - t0;
}

static int bench_file(const atlas_tokenizer *tok, const pcre2_code *re, const char *path,
                      int threads, int repeats, const char *dump_dir) {
    size_t len;
    char *text = read_file(path, &len);
    if (!text) {
        fprintf(stderr, "tok-bench: cannot read %s\n", path);
        return 1;
    }
    const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    double best = 1e30, best_cpu = 1e30;
    size_t n_ids = 0;
    int32_t *ids = NULL;
    for (int r = 0; r < repeats; r++) {
        free(ids);
        double t0 = now_s(), c0 = cpu_s();
        if (atlas_tokenizer_encode(tok, text, len, false, &ids, &n_ids) != ATLAS_OK) {
            fprintf(stderr, "tok-bench: %s: %s\n", path, atlas_last_error());
            free(text);
            return 1;
        }
        double t = now_s() - t0, tc = cpu_s() - c0;
        if (t < best) best = t;
        if (tc < best_cpu) best_cpu = tc;
    }
    printf("%-12s %-9s %8.2f MB/s  %9zu bytes %8zu ids  %.3f s  (%.2f MB/s of CPU time)\n", name,
           "whole", len / best / 1e6, len, n_ids, best, len / best_cpu / 1e6);
    if (dump_dir) {
        char out[4096];
        snprintf(out, sizeof out, "%s/%s.ids", dump_dir, name);
        FILE *f = fopen(out, "wb");
        if (!f || fwrite(ids, sizeof *ids, n_ids, f) != n_ids) fprintf(stderr, "tok-bench: writing %s failed\n", out);
        if (f) fclose(f);
    }
    free(ids);
    if (re) {
        size_t n_words = 0;
        best = 1e30;
        for (int r = 0; r < repeats; r++) {
            double t = run_regex(re, text, len, &n_words);
            if (t < best) best = t;
        }
        printf("%-12s %-9s %8.2f MB/s  %9zu bytes %8zu words %.3f s  (ceiling: regex only)\n", name,
               "regex", len / best / 1e6, len, n_words, best);
    }

    size_t n_lines = 0, cap = 1024;
    line *lines = malloc(cap * sizeof *lines);
    for (size_t i = 0;;) { /* like Python's str.split('\n'): n newlines make n + 1 lines */
        const char *nl = memchr(text + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - text) : len;
        if (n_lines == cap) lines = realloc(lines, (cap *= 2) * sizeof *lines);
        lines[n_lines++] = (line){text + i, e - i};
        if (!nl) break;
        i = e + 1;
    }
    int modes[2] = {1, threads};
    for (int m = 0; m < (threads > 1 ? 2 : 1); m++) {
        best = 1e30;
        for (int r = 0; r < repeats; r++) {
            double t = run_lines(tok, lines, n_lines, modes[m], &n_ids);
            if (t < 0) {
                fprintf(stderr, "tok-bench: %s: %s\n", path, atlas_last_error());
                return 1;
            }
            if (t < best) best = t;
        }
        char mode[32];
        snprintf(mode, sizeof mode, m ? "lines-%dt" : "lines", modes[m]);
        printf("%-12s %-9s %8.2f MB/s  %9zu bytes %8zu ids  %.3f s  (%zu lines)\n", name, mode,
               (len - n_lines + 1) / best / 1e6, len - n_lines + 1, n_ids, best, n_lines);
    }
    free(lines);
    free(text);
    return 0;
}

int main(int argc, char **argv) {
    int threads = (int)sysconf(_SC_NPROCESSORS_ONLN), repeats = 3, i = 1;
    const char *dump_dir = NULL;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) repeats = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dump-dir") && i + 1 < argc) dump_dir = argv[++i];
        else break;
    }
    if (threads < 1) threads = 1;
    if (threads > 256) threads = 256;
    if (repeats < 1) repeats = 1;
    if (argc - i < 2) {
        fprintf(stderr, "usage: tok-bench [-t THREADS] [-r REPEATS] [--dump-dir DIR] MODEL_DIR FILE...\n");
        return 2;
    }
    atlas_tokenizer *tok;
    double t0 = now_s();
    if (atlas_tokenizer_load(argv[i], &tok) != ATLAS_OK) {
        fprintf(stderr, "tok-bench: %s\n", atlas_last_error());
        return 1;
    }
    printf("%-12s %-9s %8.3f s    (%s)\n", "load", "", now_s() - t0, argv[i]);
    pcre2_code *re = model_regex(argv[i]);
    int rc = 0;
    for (int k = i + 1; k < argc; k++) rc |= bench_file(tok, re, argv[k], threads, repeats, dump_dir);
    pcre2_code_free(re);
    atlas_tokenizer_free(tok);
    return rc;
}

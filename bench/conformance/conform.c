/* bench/conformance/conform.c — atlas against transformers' reference, through the engine.
 *
 *   atlas-conform [--device cpu|cuda] [--kernels native|portable] [--cpu-activations fp32|bf16|int8]
 *                 [--gpu-activations fp32|int8] [--bound B]
 *                 [--kv-cache-dtype auto|bf16|fp8] [--reference FILE]
 *                 [--batch-tokens N] [--parallel N] [--max-len N] [--markdown FILE] DIR...
 *
 * DIR is a model directory holding reference.safetensors (--reference: another file name in
 * it; with --kv-cache-dtype fp8 the default is reference-kvfp8.safetensors, the reference
 * make.py --kv fp8 computes with K and V rounded to e4m3 as the FP8 cache rounds them) as
 * tools/conformance/make.py writes it: for each prompt length L, `L<L>.prompt` (int32 [3]: the LCG seed and the id range
 * [lo, hi) of tools/conformance/shapes.py prompt_ids), `L<L>.forced` (int32 [F]: the
 * reference's greedy tokens), `L<L>.top_ids` / `L<L>.top_lp` (int32 / f32 [F + 1, K]: its top K
 * ids and log-probs at the first generated position and after each forced token).
 * Every length of a model is submitted at once (up to --parallel run together, so chunked
 * prefills run beside other sequences' decodes), with the reference's tokens forced
 * (atlas_request.forced) and top_logprobs 8. At each of the F + 1 positions, each of atlas's
 * top 8 ids must be among the reference's top K with |logprob - reference| <= bound.
 * One line a (model, length); the exit status is 1 when any position fails. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "atlas/engine.h"
#include "format/safetensors.h" /* the reference file */

enum { TOP = 8, MAX_LENGTHS = 16, MAX_POS = 64 };

typedef struct job {
    const char *model;
    int len, n_forced, k;
    int32_t *prompt;
    const int32_t *forced, *ref_ids; /* [n_forced], [(n_forced + 1) * k] */
    const float *ref_lp;
    /* filled by the callback */
    atlas_top_logprob top[MAX_POS][TOP];
    int n_top[MAX_POS], n_pos, done;
    atlas_finish finish;
    char msg[512];
} job;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

static void on_event(const atlas_event *ev, void *user) {
    job *j = user;
    pthread_mutex_lock(&mu);
    if (ev->type == ATLAS_EVENT_TOKEN) {
        if (j->n_pos < MAX_POS) {
            int n = ev->n_top < TOP ? ev->n_top : TOP;
            if (n > 0) memcpy(j->top[j->n_pos], ev->top, (size_t)n * sizeof *ev->top);
            j->n_top[j->n_pos++] = n;
        }
    } else {
        j->finish = ev->finish;
        snprintf(j->msg, sizeof j->msg, "%s", ev->message ? ev->message : "");
        j->done = 1;
        pthread_cond_broadcast(&cv);
    }
    pthread_mutex_unlock(&mu);
}

/* tools/conformance/shapes.py prompt_ids: the LCG of bench/serve/loadgen. */
static int32_t *prompt_ids(int n, long long seed, int lo, int hi) {
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    long long s = seed;
    for (int i = 0; ids && i < n; i++) {
        s = (s * 1103515245LL + 12345) % 2147483648LL;
        ids[i] = (int32_t)(lo + s % (hi - lo));
    }
    return ids;
}

typedef struct opts opts;
static const char *dev_name(const opts *o);

struct opts {
    atlas_device device;
    atlas_kernels kernels;
    atlas_cpu_activations cpu_act;
    atlas_gpu_activations gpu_act;
    atlas_kv_dtype kv;     /* --kv-cache-dtype */
    const char *reference; /* --reference: the file in each DIR (NULL: by the KV type) */
    double bound;
    int batch, parallel, max_len;
    FILE *md;
};

/* The table's device column: "cpu", "cpu-bf16" (--cpu-activations bf16), "cuda",
 * "cuda-int8" (--gpu-activations int8) or "cuda-portable" (--kernels portable). */
static const char *dev_name(const opts *o) {
    if (o->kv == ATLAS_KV_DTYPE_FP8) /* an FP8 KV cache: the device's name, then "-kvfp8" */
        return o->device == ATLAS_DEVICE_CPU ? (o->cpu_act == ATLAS_CPU_ACT_BF16   ? "cpu-bf16-kvfp8"
                                                : o->cpu_act == ATLAS_CPU_ACT_INT8 ? "cpu-int8-kvfp8"
                                                                                   : "cpu-kvfp8")
                                             : "cuda-kvfp8";
    if (o->device == ATLAS_DEVICE_CPU) return o->cpu_act == ATLAS_CPU_ACT_BF16   ? "cpu-bf16"
                                                  : o->cpu_act == ATLAS_CPU_ACT_INT8 ? "cpu-int8"
                                                                                     : "cpu";
    if (o->gpu_act == ATLAS_GPU_ACT_INT8) return "cuda-int8";
    return o->kernels == ATLAS_KERNELS_PORTABLE ? "cuda-portable" : "cuda";
}

/* The worst deviation of job j, or INFINITY when an id of atlas's top 8 is not among the
 * reference's top k; *where: the position of the worst. */
static double deviation(const job *j, int *where) {
    double worst = 0;
    *where = 0;
    for (int p = 0; p <= j->n_forced; p++) {
        if (p >= j->n_pos || j->n_top[p] < TOP) {
            *where = p;
            return INFINITY;
        }
        const int32_t *ids = j->ref_ids + (size_t)p * j->k;
        const float *lp = j->ref_lp + (size_t)p * j->k;
        for (int t = 0; t < TOP; t++) {
            int r = 0;
            while (r < j->k && ids[r] != j->top[p][t].id) r++;
            double d = r < j->k ? fabs((double)j->top[p][t].logprob - lp[r]) : INFINITY;
            if (d > worst) worst = d, *where = p;
        }
    }
    return worst;
}

static int by_len(const void *a, const void *b) {
    return ((const job *)a)->len - ((const job *)b)->len;
}

static const atlas_tensor_view *find(const atlas_st *st, const char *fmt, int len) {
    char key[64];
    snprintf(key, sizeof key, fmt, len);
    return atlas_st_find(st, key);
}

/* Runs every length of the model in dir; returns the number of failing lengths (or 1 when
 * the model cannot be checked at all). */
static int check_model(const opts *o, const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir,
             o->reference ? o->reference
             : o->kv == ATLAS_KV_DTYPE_FP8 ? "reference-kvfp8.safetensors" : "reference.safetensors");
    atlas_st *st = NULL;
    if (atlas_st_open_file(path, &st) != ATLAS_OK) {
        fprintf(stderr, "atlas-conform: %s\n", atlas_last_error());
        return 1;
    }
    const char *name = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;
    job jobs[MAX_LENGTHS];
    int n = 0, max_len = 0;
    for (size_t i = 0; i < atlas_st_count(st) && n < MAX_LENGTHS; i++) {
        const char *tn = atlas_st_at(st, i)->name;
        int len;
        char want[64];
        if (sscanf(tn, "L%d.", &len) != 1) continue;
        snprintf(want, sizeof want, "L%d.prompt", len);
        if (strcmp(tn, want) || (o->max_len && len > o->max_len)) continue;
        const atlas_tensor_view *pr = find(st, "L%d.prompt", len),
                                *fo = find(st, "L%d.forced", len),
                                *ti = find(st, "L%d.top_ids", len),
                                *tl = find(st, "L%d.top_lp", len);
        if (!pr || !fo || !ti || !tl || pr->shape[0] != 3 || ti->n_dims != 2 ||
            ti->shape[0] != fo->shape[0] + 1 || ti->shape[0] > MAX_POS) {
            fprintf(stderr, "atlas-conform: %s: L%d: missing or misshapen tensors\n", path, len);
            atlas_st_free(st);
            return 1;
        }
        const int32_t *p = pr->data;
        job *j = &jobs[n++];
        memset(j, 0, sizeof *j);
        j->model = name;
        j->len = len;
        j->n_forced = (int)fo->shape[0];
        j->k = (int)ti->shape[1];
        j->forced = fo->data;
        j->ref_ids = ti->data;
        j->ref_lp = tl->data;
        j->prompt = prompt_ids(len, p[0], p[1], p[2]);
        if (len + j->n_forced + 1 > max_len) max_len = len + j->n_forced + 1;
    }
    qsort(jobs, (size_t)n, sizeof *jobs, by_len); /* the table's rows by length */
    atlas_engine_model mod = {.name = name, .dir = dir};
    atlas_engine_params ep = atlas_engine_default_params();
    ep.models = &mod;
    ep.n_models = 1;
    ep.device = o->device;
    ep.kernels = o->kernels;
    ep.cpu_activations = o->cpu_act;
    ep.gpu_activations = o->gpu_act;
    ep.kv_dtype = o->kv;
    ep.parallel = o->parallel;
    ep.batch_tokens = o->batch;
    ep.ctx_size = max_len;
    atlas_engine *e = NULL;
    int failed = 0, broken = 0;
    double t0 = 0;
    if (n == 0 || atlas_engine_create(&ep, &e) != ATLAS_OK || atlas_engine_load(e, name) != ATLAS_OK) {
        const char *why = n ? atlas_last_error() : "no lengths";
        fprintf(stderr, "atlas-conform: %s: %s\n", dir, why);
        if (o->md) /* a row all the same: a model that cannot run is a failing cell */
            fprintf(o->md, "| %s | %s | - | %.200s | **fail** |\n", name,
                    dev_name(o), why);
        failed = broken = 1;
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    t0 = ts.tv_sec + ts.tv_nsec * 1e-9;
    for (int i = 0; !broken && i < n; i++) {
        job *j = &jobs[i];
        atlas_request r = {.model = name, .prompt = j->prompt, .n_prompt = (size_t)j->len,
                           .max_tokens = j->n_forced + 1, .top_logprobs = TOP, .logprobs = 1,
                           .ignore_eos = 1, .forced = j->forced, .n_forced = j->n_forced};
        r.sampling = atlas_sampler_default_params();
        r.sampling.temperature = 0;
        if (atlas_engine_submit(e, &r, on_event, j, NULL) != ATLAS_OK) {
            snprintf(j->msg, sizeof j->msg, "submit: %s", atlas_last_error());
            j->finish = ATLAS_FINISH_ERROR;
            j->done = 1;
        }
    }
    pthread_mutex_lock(&mu);
    for (int i = 0; !broken && i < n; i++)
        while (!jobs[i].done) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double dt = ts.tv_sec + ts.tv_nsec * 1e-9 - t0;
    for (int i = 0; !broken && i < n; i++) {
        job *j = &jobs[i];
        int where = 0;
        double d = j->finish == ATLAS_FINISH_ERROR ? INFINITY : deviation(j, &where);
        int ok = d <= o->bound;
        failed += !ok;
        const char *dev = dev_name(o);
        printf("%-20s %-4s %6d tokens: max |dlogprob| %.2e at position %d of %d  %s%s%s\n",
               name, dev, j->len, d, where, j->n_forced + 1, ok ? "pass" : "FAIL",
               j->msg[0] ? ": " : "", j->msg);
        if (o->md)
            fprintf(o->md, "| %s | %s | %d | %.2e | %s |\n", name, dev, j->len, d,
                    ok ? "pass" : "**fail**");
    }
    if (!broken) printf("%-20s %d lengths at once in %.2f s\n", name, n, dt);
    fflush(stdout);
    if (o->md) fflush(o->md); /* the rows so far survive a run stopped by a time limit */
    atlas_engine_free(e);
    for (int i = 0; i < n; i++) free(jobs[i].prompt);
    atlas_st_free(st);
    return failed;
}

static void usage(void) {
    fprintf(stderr, "usage: atlas-conform [--device cpu|cuda] [--kernels native|portable] "
                    "[--cpu-activations fp32|bf16|int8] [--gpu-activations fp32|int8] "
                    "[--bound B] [--kv-cache-dtype "
                    "auto|bf16|fp8] [--reference FILE] [--batch-tokens N] [--parallel N] "
                    "[--max-len N] [--markdown FILE] DIR...\n");
}

int main(int argc, char **argv) {
    opts o = {.device = ATLAS_DEVICE_AUTO, .bound = 5e-2, .batch = 512, .parallel = 8};
    int first = argc, rc = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-') {
            first = i;
            break;
        }
        if (i + 1 >= argc) {
            usage();
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--device"))
            o.device = !strcmp(v, "cpu") ? ATLAS_DEVICE_CPU : !strcmp(v, "cuda") ? ATLAS_DEVICE_CUDA
                                                                                  : ATLAS_DEVICE_AUTO;
        else if (!strcmp(a, "--kernels") && (!strcmp(v, "native") || !strcmp(v, "portable")))
            o.kernels = !strcmp(v, "portable") ? ATLAS_KERNELS_PORTABLE : ATLAS_KERNELS_NATIVE;
        else if (!strcmp(a, "--cpu-activations") && !strcmp(v, "fp32"))
            o.cpu_act = ATLAS_CPU_ACT_FP32;
        else if (!strcmp(a, "--cpu-activations") && !strcmp(v, "bf16"))
            o.cpu_act = ATLAS_CPU_ACT_BF16;
        else if (!strcmp(a, "--cpu-activations") && !strcmp(v, "int8"))
            o.cpu_act = ATLAS_CPU_ACT_INT8;
        else if (!strcmp(a, "--gpu-activations") && (!strcmp(v, "fp32") || !strcmp(v, "int8")))
            o.gpu_act = !strcmp(v, "int8") ? ATLAS_GPU_ACT_INT8 : ATLAS_GPU_ACT_FP32;
        else if (!strcmp(a, "--bound")) o.bound = atof(v);
        else if (!strcmp(a, "--kv-cache-dtype")) {
            if (atlas_model_kv_dtype_parse(v, &o.kv) != ATLAS_OK) {
                fprintf(stderr, "atlas-conform: --kv-cache-dtype: %s\n", atlas_last_error());
                return 2;
            }
        } else if (!strcmp(a, "--reference")) o.reference = v;
        else if (!strcmp(a, "--batch-tokens")) o.batch = atoi(v);
        else if (!strcmp(a, "--parallel")) o.parallel = atoi(v);
        else if (!strcmp(a, "--max-len")) o.max_len = atoi(v);
        else if (!strcmp(a, "--markdown")) {
            if (!(o.md = fopen(v, "a"))) {
                fprintf(stderr, "atlas-conform: %s: %s\n", v, strerror(errno));
                return 1;
            }
        } else {
            usage();
            return 2;
        }
    }
    if (first >= argc || !(o.bound > 0) || o.batch < o.parallel || o.parallel < 1) {
        usage();
        return 2;
    }
    for (int i = first; i < argc; i++) rc |= check_model(&o, argv[i]) != 0;
    if (o.md) fclose(o.md);
    return rc;
}

/* cli/run.c — `atlas run`: generate a continuation of one prompt and stream it.
 *
 * One sequence, driven straight through the model's forward (prefill in chunks of the
 * model's batch size, then one token per step) with blocks 0, 1, 2, ... of the KV cache;
 * sampling from atlas/sampler.h; text from the incremental detokenizer, so a character split
 * over tokens is printed when it is complete. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "atlas/model.h"
#include "atlas/sampler.h"
#include "atlas/tokenizer.h"
#include "cli/cli.h"
#include "model/forward.h"

#define DEFAULT_PROMPT "And it came to pass"

typedef struct run_opts {
    const char *dir, *prompt, *prompt_ids;
    int n, threads, top_logprobs, json, tp;
    atlas_device device;
    atlas_sampler_params sp;
    int set_temp, set_top_k, set_top_p;
} run_opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: atlas run [-m DIR] [-p TEXT | --prompt-ids 1,2,3] [options]\n"
            "  Generates a continuation of the prompt and streams it to stdout; prompt and\n"
            "  generation speed go to stderr at the end. Stops at an end-of-sequence token.\n"
            "  -m, --model DIR      model directory (default %s)\n"
            "  -p, --prompt TEXT    the prompt (default \"" DEFAULT_PROMPT "\")\n"
            "  --prompt-ids LIST    token ids instead of text, comma-separated\n"
            "  -n N                 tokens to generate (default 32)\n"
            "  --temp T             temperature; 0 = greedy (default: generation_config.json's,\n"
            "                       else 0)\n"
            "  --top-k K, --top-p P, --min-p P   sampling filters (default off, or\n"
            "                       generation_config.json's top_k / top_p)\n"
            "  --seed S             random seed (default 0)\n"
            "  --json               one JSON object per generated token: id, text, bytes,\n"
            "                       logprob, top_logprobs\n"
            "  --top-logprobs K     with --json: the K most likely tokens (default 0)\n"
            "  --device cpu|cuda|auto   (default auto: CUDA when usable, else the CPU)\n"
            "  --threads N          CPU threads (default: one per core)\n"
            "  --tensor-parallel N  split the model across N GPUs (default 1; N > 1 needs N\n"
            "                       GPUs and libnccl.so.2, and is not wired yet)\n"
            "  -h, --help           this help\n",
            atlas_cli_default_model());
}

static int parse_long(const char *opt, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "atlas run: %s: '%s' is not an integer in %ld..%ld\n", opt, s, lo, hi);
        return 2;
    }
    *out = v;
    return 0;
}

static int parse_float(const char *opt, const char *s, double lo, double hi, float *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "atlas run: %s: '%s' is not a number in %g..%g\n", opt, s, lo, hi);
        return 2;
    }
    *out = (float)v;
    return 0;
}

/* Returns -1 to go on, else the exit status (help: 0, usage error: 2). */
static int parse_opt(run_opts *o, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(a, "--json")) {
        o->json = 1;
        return -1;
    }
    if (*i + 1 >= argc) {
        fprintf(stderr, "atlas run: %s needs a value (see --help)\n", a);
        return 2;
    }
    const char *v = argv[++*i];
    long l = 0;
    int rc = 0;
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->dir = v;
    else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) o->prompt = v;
    else if (!strcmp(a, "--prompt-ids")) o->prompt_ids = v;
    else if (!strcmp(a, "-n")) rc = parse_long(a, v, 0, 1 << 20, &l), o->n = (int)l;
    else if (!strcmp(a, "--threads")) rc = parse_long(a, v, 1, 1024, &l), o->threads = (int)l;
    else if (!strcmp(a, "--tensor-parallel")) rc = parse_long(a, v, 1, 64, &l), o->tp = (int)l;
    else if (!strcmp(a, "--top-logprobs")) rc = parse_long(a, v, 0, 1000, &l), o->top_logprobs = (int)l;
    else if (!strcmp(a, "--top-k")) rc = parse_long(a, v, 0, 1 << 30, &l), o->sp.top_k = (int)l, o->set_top_k = 1;
    else if (!strcmp(a, "--seed")) {
        char *end;
        errno = 0;
        o->sp.seed = strtoull(v, &end, 10);
        if (errno || end == v || *end || v[0] == '-') {
            fprintf(stderr, "atlas run: --seed: '%s' is not an unsigned integer\n", v);
            return 2;
        }
    } else if (!strcmp(a, "--temp")) rc = parse_float(a, v, 0, 100, &o->sp.temperature), o->set_temp = 1;
    else if (!strcmp(a, "--top-p")) rc = parse_float(a, v, 0, 1, &o->sp.top_p), o->set_top_p = 1;
    else if (!strcmp(a, "--min-p")) rc = parse_float(a, v, 0, 1, &o->sp.min_p);
    else if (!strcmp(a, "--device")) {
        if (!strcmp(v, "cpu")) o->device = ATLAS_DEVICE_CPU;
        else if (!strcmp(v, "cuda")) o->device = ATLAS_DEVICE_CUDA;
        else if (!strcmp(v, "auto")) o->device = ATLAS_DEVICE_AUTO;
        else {
            fprintf(stderr, "atlas run: --device: '%s' (want cpu, cuda or auto)\n", v);
            return 2;
        }
    } else {
        fprintf(stderr, "atlas run: unknown option '%s' (see --help)\n", a);
        return 2;
    }
    return rc ? rc : -1;
}

static int parse_ids(const char *s, int32_t **ids, size_t *n) {
    size_t cap = 16;
    *n = 0;
    *ids = malloc(cap * sizeof **ids);
    while (*ids && *s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (errno || end == s || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "atlas run: --prompt-ids: bad id at '%s' (want 1,2,3)\n", s);
            return 2;
        }
        if (*n == cap) {
            int32_t *g = realloc(*ids, (cap *= 2) * sizeof **ids);
            if (!g) break;
            *ids = g;
        }
        (*ids)[(*n)++] = (int32_t)v;
        s = *end ? end + 1 : end;
    }
    if (!*ids) {
        fprintf(stderr, "atlas run: out of memory\n");
        return 1;
    }
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The sequence being generated: ids[0..n) are in the cache up to ctx. */
typedef struct run_seq {
    atlas_model *m;
    int32_t *ids;
    size_t n, cap;
    int ctx;
    int32_t *table; /* [max_blocks]: 0, 1, 2, ... */
    int max_blocks;
    float *logits;  /* [vocab] of the last token fed */
    int greedy;     /* temperature 0 without --json: the backend's argmax, no logits */
    int32_t next;   /* with greedy: the argmax after the last token fed */
} run_seq;

/* Feeds ids[ctx..n) in chunks of the model's batch size; logits of the last one. */
static atlas_status feed(run_seq *s) {
    int chunk = atlas_model_max_batch_tokens(s->m);
    while ((size_t)s->ctx < s->n) {
        int cnt = (int)(s->n - s->ctx) < chunk ? (int)(s->n - s->ctx) : chunk;
        int32_t pos[cnt], start[2] = {0, cnt}, ctx = s->ctx + cnt, row = cnt - 1;
        for (int i = 0; i < cnt; i++) pos[i] = s->ctx + i;
        atlas_batch b = {.n_tokens = cnt, .tokens = s->ids + s->ctx, .positions = pos,
                         .n_seqs = 1, .seq_start = start, .seq_ctx = &ctx,
                         .block_table = s->table, .max_blocks = s->max_blocks, .n_logits = 1,
                         .logit_rows = &row};
        atlas_status st = s->greedy ? atlas_model_forward_argmax(s->m, &b, &s->next)
                                    : atlas_model_forward(s->m, &b, s->logits);
        if (st != ATLAS_OK) return st;
        s->ctx = ctx;
    }
    return ATLAS_OK;
}

/* {"id":…, "text":…, "bytes":[…], "logprob":…, "top_logprobs":[{"id":…, "logprob":…}, …]} */
static int print_json(const atlas_tokenizer *tok, int32_t id, const char *text, size_t len,
                      float logprob, int n_top, const int32_t *top_ids, const float *top_lp) {
    const char *bytes = "";
    size_t blen = 0;
    if (atlas_tokenizer_token_bytes(tok, id, &bytes, &blen) != ATLAS_OK) blen = 0;
    json_t *o = json_object(), *b = json_array(), *top = json_array();
    for (size_t i = 0; i < blen; i++) json_array_append_new(b, json_integer((unsigned char)bytes[i]));
    for (int i = 0; i < n_top; i++) {
        json_t *e = json_object();
        json_object_set_new(e, "id", json_integer(top_ids[i]));
        json_object_set_new(e, "logprob", json_real(top_lp[i]));
        json_array_append_new(top, e);
    }
    json_object_set_new(o, "id", json_integer(id));
    json_object_set_new(o, "text", json_stringn(text, len));
    json_object_set_new(o, "bytes", b);
    json_object_set_new(o, "logprob", isfinite(logprob) ? json_real(logprob) : json_null());
    json_object_set_new(o, "top_logprobs", top);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) return 1;
    puts(s);
    free(s);
    fflush(stdout);
    return 0;
}

typedef struct run_stats {
    size_t n_prompt, n_gen;
    double t_prompt, t_gen;
} run_stats;

/* Samples, prints and feeds up to o->n tokens after the prompt. */
static int generate(const run_opts *o, run_seq *s, atlas_sampler *smp, atlas_detok *dt,
                    run_stats *stats) {
    const atlas_tokenizer *tok = atlas_model_tokenizer(s->m);
    int V = atlas_model_vocab_size(s->m), k = o->top_logprobs;
    float *raw = malloc(sizeof(float) * V), *top_lp = malloc(sizeof(float) * (k + 1));
    int32_t *top_ids = malloc(sizeof(int32_t) * (k + 1));
    int rc = raw && top_lp && top_ids ? 0 : 1;
    double t0 = now_s();
    for (int step = 0; step < o->n && !rc; step++) {
        float lp = NAN;
        int n_top = 0;
        if (o->json) memcpy(raw, s->logits, sizeof(float) * V);
        int32_t id = s->next;
        atlas_status st = s->greedy ? ATLAS_OK
                                    : atlas_sampler_sample(smp, s->logits, V, s->ids, s->n, &id);
        if (st == ATLAS_OK && o->json)
            st = atlas_sampler_logprobs(raw, V, id, &lp, k, top_ids, top_lp, &n_top);
        const char *text = "";
        size_t len = 0;
        int eos = atlas_model_is_eos(s->m, id);
        if (st == ATLAS_OK && !eos) st = atlas_detok_push(dt, id, &text, &len);
        if (st != ATLAS_OK) {
            fprintf(stderr, "atlas run: step %d: %s\n", step, atlas_last_error());
            rc = 1;
            break;
        }
        stats->n_gen++;
        if (o->json) rc = print_json(tok, id, text, len, lp, n_top, top_ids, top_lp);
        else if (len) {
            fwrite(text, 1, len, stdout);
            fflush(stdout);
        }
        if (eos || step + 1 == o->n) break;
        s->ids[s->n++] = id;
        if (feed(s) != ATLAS_OK) {
            fprintf(stderr, "atlas run: %s\n", atlas_last_error());
            rc = 1;
        }
    }
    stats->t_gen = now_s() - t0;
    const char *text;
    size_t len;
    if (!rc && !o->json && atlas_detok_flush(dt, &text, &len) == ATLAS_OK && len)
        fwrite(text, 1, len, stdout);
    free(raw);
    free(top_lp);
    free(top_ids);
    return rc;
}

/* Queues the forward of the token at s->ctx (tok, or NULL: the argmax of the step queued
 * before, taken on the device) and its argmax, without waiting. */
static atlas_status queue_step(run_seq *s, const int32_t *tok) {
    int32_t pos = s->ctx, start[2] = {0, 1}, ctx = s->ctx + 1, row = 0;
    atlas_batch b = {.n_tokens = 1, .tokens = tok, .positions = &pos, .n_seqs = 1,
                     .seq_start = start, .seq_ctx = &ctx, .block_table = s->table,
                     .max_blocks = s->max_blocks, .n_logits = 1, .logit_rows = &row};
    atlas_status st = atlas_model_forward_argmax_queue(s->m, &b);
    if (st == ATLAS_OK) s->ctx = ctx;
    return st;
}

/* Greedy generation a step ahead of the host (atlas_model_forward_argmax_queue): the forward
 * of token j + 1 is queued before token j is collected, so the GPU runs it while the host
 * prints token j instead of idling between steps (the host's part of a plain step, 7-16 us on
 * an H200 since the staging is in the graph; bench/RESULTS.md, tenth and eleventh sessions,
 * and docs/ARCHITECTURE.md on boards at their power limit).
 * A step queued past an end of text is collected and dropped (its cache row lies past the
 * sequence). s->next: the prompt's argmax. */
static int generate_queued(const run_opts *o, run_seq *s, atlas_detok *dt, run_stats *stats) {
    double t0 = now_s();
    int32_t id = s->next, drop;
    int queued = 0;
    atlas_status st = ATLAS_OK;
    for (int step = 0; step < o->n && st == ATLAS_OK; step++) { /* id: token `step` */
        const char *text = "";
        size_t len = 0;
        int eos = atlas_model_is_eos(s->m, id);
        if (!eos && (st = atlas_detok_push(dt, id, &text, &len)) != ATLAS_OK) break;
        stats->n_gen++;
        if (len) {
            fwrite(text, 1, len, stdout);
            fflush(stdout);
        }
        if (eos || step + 1 == o->n) break;
        s->ids[s->n++] = id;
        if (queued == 0 && (st = queue_step(s, &id)) == ATLAS_OK) queued++; /* the first */
        if (st == ATLAS_OK && step + 2 < o->n && (st = queue_step(s, NULL)) == ATLAS_OK)
            queued++; /* token step + 1's forward, whose argmax is token step + 2 */
        if (st == ATLAS_OK && (st = atlas_model_argmax_collect(s->m, &id, 1)) == ATLAS_OK)
            queued--;
    }
    int rc = 0;
    if (st != ATLAS_OK) {
        fprintf(stderr, "atlas run: %s\n", atlas_last_error());
        rc = 1;
    }
    while (queued > 0 && atlas_model_argmax_collect(s->m, &drop, 1) == ATLAS_OK) queued--;
    stats->t_gen = now_s() - t0;
    const char *text;
    size_t len;
    if (!rc && atlas_detok_flush(dt, &text, &len) == ATLAS_OK && len) fwrite(text, 1, len, stdout);
    return rc;
}

static int prepare_prompt(const run_opts *o, run_seq *s) {
    int32_t *ids = NULL;
    size_t n = 0;
    if (o->prompt_ids) {
        if (parse_ids(o->prompt_ids, &ids, &n)) {
            free(ids);
            return 2;
        }
    } else {
        const char *p = o->prompt ? o->prompt : DEFAULT_PROMPT;
        if (atlas_tokenizer_encode(atlas_model_tokenizer(s->m), p, strlen(p), true, &ids, &n)) {
            fprintf(stderr, "atlas run: prompt: %s\n", atlas_last_error());
            return 1;
        }
    }
    int cap_tokens = atlas_model_kv_blocks(s->m) * atlas_model_kv_block_size(s->m);
    if (n == 0 || n + (size_t)o->n > (size_t)cap_tokens) {
        fprintf(stderr, "atlas run: the prompt has %zu tokens; with -n %d it %s\n", n, o->n,
                n ? "exceeds the KV cache" : "must have at least one");
        free(ids);
        return 1;
    }
    int V = atlas_model_vocab_size(s->m);
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= V) {
            fprintf(stderr, "atlas run: prompt id %d at index %zu: the vocabulary has %d\n",
                    ids[i], i, V);
            free(ids);
            return 1;
        }
    s->cap = n + (size_t)o->n + 1;
    s->ids = malloc(s->cap * sizeof(int32_t));
    s->max_blocks = atlas_model_kv_blocks(s->m);
    s->table = malloc(sizeof(int32_t) * s->max_blocks);
    s->logits = malloc(sizeof(float) * V);
    if (!s->ids || !s->table || !s->logits) {
        free(ids);
        fprintf(stderr, "atlas run: out of memory\n");
        return 1;
    }
    memcpy(s->ids, ids, n * sizeof(int32_t));
    s->n = n;
    for (int i = 0; i < s->max_blocks; i++) s->table[i] = i;
    free(ids);
    return 0;
}

/* Defaults of generation_config.json for what the command line left unset. */
static void sampler_defaults(run_opts *o, const atlas_config *c) {
    if (!o->set_temp) o->sp.temperature = c->gen_temperature > 0 ? (float)c->gen_temperature : 0;
    if (!o->set_top_p && c->gen_top_p > 0 && c->gen_top_p < 1) o->sp.top_p = (float)c->gen_top_p;
    if (!o->set_top_k && c->gen_top_k > 0) o->sp.top_k = c->gen_top_k;
}

static int run_model(run_opts *o, atlas_model *m) {
    run_seq s = {.m = m};
    run_stats stats = {0};
    atlas_sampler *smp = NULL;
    atlas_detok *dt = NULL;
    int rc = prepare_prompt(o, &s);
    sampler_defaults(o, atlas_model_config(m));
    /* greedy: the argmax on the backend (on a GPU no 128k-float download and host pass a
     * token); penalties and logit bias are not options of atlas run */
    s.greedy = o->sp.temperature == 0.0f && !o->json;
    if (!rc && (atlas_sampler_create(&o->sp, &smp) != ATLAS_OK ||
                atlas_detok_create(atlas_model_tokenizer(m), false, &dt) != ATLAS_OK)) {
        fprintf(stderr, "atlas run: %s\n", atlas_last_error());
        rc = 1;
    }
    if (!rc && !o->json && !o->prompt_ids && isatty(1)) {
        /* at a terminal, show the prompt before its continuation (piped output stays the
         * generated text alone) */
        fputs(o->prompt ? o->prompt : DEFAULT_PROMPT, stdout);
        fflush(stdout);
    }
    if (!rc) {
        atlas_sampler_set_prompt_len(smp, s.n);
        stats.n_prompt = s.n;
        double t0 = now_s();
        if (feed(&s) != ATLAS_OK) {
            fprintf(stderr, "atlas run: prompt: %s\n", atlas_last_error());
            rc = 1;
        }
        stats.t_prompt = now_s() - t0;
        /* (queued steps run on one GPU: tensor parallel generation feeds token by token) */
        if (!rc) rc = s.greedy && o->tp == 1 ? generate_queued(o, &s, dt, &stats)
                                             : generate(o, &s, smp, dt, &stats);
        if (!o->json && isatty(1)) putchar('\n');
        fflush(stdout);
    }
    if (!rc) {
        atlas_model_info info;
        atlas_model_get_info(m, &info);
        fprintf(stderr, "prompt: %zu tokens in %.3f s (%.1f tok/s); generation: %zu tokens in "
                "%.3f s (%.1f tok/s) [%s]\n", stats.n_prompt, stats.t_prompt,
                stats.t_prompt > 0 ? stats.n_prompt / stats.t_prompt : 0.0, stats.n_gen,
                stats.t_gen, stats.t_gen > 0 ? stats.n_gen / stats.t_gen : 0.0, info.backend);
    }
    atlas_detok_free(dt);
    atlas_sampler_free(smp);
    free(s.ids);
    free(s.table);
    free(s.logits);
    return rc;
}

int atlas_cli_run(int argc, char **argv) {
    run_opts o = {.n = 32, .tp = 1, .device = ATLAS_DEVICE_AUTO,
                  .sp = atlas_sampler_default_params()};
    for (int i = 1; i < argc; i++) {
        int rc = parse_opt(&o, argc, argv, &i);
        if (rc >= 0) return rc;
    }
    if (atlas_model_tp_preflight(o.tp) != ATLAS_OK) { /* before anything touches a model */
        fprintf(stderr, "atlas run: --tensor-parallel %d: %s\n", o.tp, atlas_last_error());
        return 1;
    }
    if (o.prompt && o.prompt_ids) {
        fprintf(stderr, "atlas run: give -p or --prompt-ids, not both\n");
        return 2;
    }
    if (!o.dir) o.dir = atlas_cli_default_model();
    atlas_model_params p = atlas_model_default_params();
    p.device = o.device;
    p.n_threads = o.threads;
    atlas_model *m = NULL;
    if (atlas_model_load(o.dir, &p, &m) != ATLAS_OK) {
        fprintf(stderr, "atlas run: %s\n", atlas_last_error());
        return 1;
    }
    int rc = run_model(&o, m);
    if (atlas_model_release(m) != ATLAS_OK) {
        fprintf(stderr, "atlas run: %s\n", atlas_last_error());
        rc = 1;
    }
    return rc;
}

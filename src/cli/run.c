/* cli/run.c — `atlas run`: generate a continuation of one prompt and stream it.
 *
 * A client of the engine the server uses (atlas/engine.h), with one model and one sequence:
 * the same chunked prefill against the cache already written, the same context and KV
 * limits, the same sampling and detokenizing, so that what `run` answers is what the server
 * would. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <pthread.h>

#include "atlas/engine.h"
#include "atlas/model.h"
#include "atlas/sampler.h"
#include "atlas/tokenizer.h"
#include "cli/cli.h"
#include "cli/options.h"
#include "cli/progress.h"
#include "atlas/parallel.h"

#define DEFAULT_PROMPT "And it came to pass"

typedef struct run_opts {
    const char *dir, *prompt, *prompt_ids;
    const char *prompt_file; /* -f FILE, or "-" from -p - : read into prompt_buf */
    char *prompt_buf;
    char name[128]; /* the model's name: its directory's last component */
    int n, top_logprobs, json, tp, batch, ignore_eos;
    atlas_cli_device dev; /* --device, --kernels, --threads, --ctx-size */
    atlas_sampler_params sp;
    int set_temp, set_top_k, set_top_p, set_seed;
} run_opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: atlas run [-m DIR] [-p TEXT | --prompt-ids 1,2,3] [options]\n"
            "  Generates a continuation of the prompt and streams it to stdout, ending with a\n"
            "  newline; prompt and generation speed go to stderr at the end. Stops at an\n"
            "  end-of-sequence token (unless --ignore-eos).\n"
            "  -m, --model DIR      model directory (default %s)\n"
            "  -p, --prompt TEXT    the prompt (default \"" DEFAULT_PROMPT "\"); -p - reads it\n"
            "                       from stdin\n"
            "  -f, --file FILE      read the prompt from FILE (also --prompt-file)\n"
            "  --prompt-ids LIST    token ids instead of text, comma-separated\n"
            "  -n N                 tokens to generate (default 32; also --max-tokens,\n"
            "                       --n-predict)\n"
            "  --temp T             temperature (also --temperature); 0 = greedy (default:\n"
            "                       generation_config.json's, else 0)\n"
            "  --top-k K, --top-p P, --min-p P   sampling filters (default off, or\n"
            "                       generation_config.json's top_k / top_p)\n"
            "  --seed S             sampling seed (default: a new one each run, from the OS's\n"
            "                       random source; the last line on stderr shows it)\n"
            "  --json               one JSON object per generated token: id, text, bytes,\n"
            "                       logprob, top_logprobs; then {\"seed\": S, \"finish_reason\"}\n"
            "  --top-logprobs K     with --json: the K most likely tokens (0..20, default 0)\n"
            "  --ignore-eos         generate past end-of-sequence tokens, -n tokens in all\n"
            "  --ctx-size N, --max-model-len N   tokens the sequence may hold, prompt and\n"
            "                       generated (default 0: the model's maximum)\n"
            "  --batch-tokens N     prompt tokens prefilled a step (default 512)\n"
            "  --device cpu|cuda[:N]|auto  (default auto: CUDA when usable, else the CPU; N: the GPU)\n"
            "  --kernels native|portable  GPU code (default native; portable: the compute_80 PTX\n"
            "                       compiled by the driver, with an RTX card's kernel choices)\n"
            "  --threads N          CPU threads (default: one per core)\n"
            ATLAS_CLI_CPU_ACT_HELP
            ATLAS_CLI_GPU_ACT_HELP
            ATLAS_CLI_KV_DTYPE_HELP
            "  --no-memory-check    load even when the weights and KV cache need more memory\n"
            "                       than the GPU or the machine has free (refused by default,\n"
            "                       before any weight is read)\n"
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

static const char *const run_options[] = {
    "-h", "--help", "--json", "-m", "--model", "-p", "--prompt", "-f", "--file", "--prompt-ids",
    "-n", "--threads", "--tensor-parallel", "--top-logprobs", "--ctx-size", "--max-model-len",
    "--batch-tokens", "--top-k", "--seed", "--temp", "--top-p", "--min-p", "--device", "--kernels",
    "--no-memory-check", "--ignore-eos", "--cpu-activations", "--gpu-activations", "--kv-cache-dtype",
    NULL};

/* Returns -1 to go on, else the exit status (help: 0, usage error: 2). */
static int parse_opt(run_opts *o, int argc, char **argv, int *i) {
    const char *a = atlas_cli_resolve_option(argv[*i], run_options);
    if (!atlas_cli_known_option(a, run_options)) return atlas_cli_unknown_option("run", a, run_options);
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(a, "--json")) {
        o->json = 1;
        return -1;
    }
    if (!strcmp(a, "--no-memory-check")) {
        o->dev.no_memory_check = 1;
        return -1;
    }
    if (!strcmp(a, "--ignore-eos")) {
        o->ignore_eos = 1;
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
    else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
        if (!strcmp(v, "-")) o->prompt_file = "-", o->prompt = NULL;
        else o->prompt = v, o->prompt_file = NULL;
    } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) o->prompt_file = v, o->prompt = NULL;
    else if (!strcmp(a, "--prompt-ids")) o->prompt_ids = v;
    else if (!strcmp(a, "-n")) rc = parse_long(a, v, 0, 1 << 20, &l), o->n = (int)l;
    else if (!strcmp(a, "--threads")) rc = parse_long(a, v, 1, 1024, &l), o->dev.threads = (int)l;
    else if (!strcmp(a, "--tensor-parallel")) rc = parse_long(a, v, 1, 64, &l), o->tp = (int)l;
    else if (!strcmp(a, "--top-logprobs"))
        rc = parse_long(a, v, 0, ATLAS_ENGINE_MAX_TOP_LOGPROBS, &l), o->top_logprobs = (int)l;
    else if (!strcmp(a, "--ctx-size") || !strcmp(a, "--max-model-len"))
        rc = parse_long(a, v, 0, INT32_MAX, &l), o->dev.ctx = (int)l;
    else if (!strcmp(a, "--batch-tokens")) rc = parse_long(a, v, 1, 1 << 20, &l), o->batch = (int)l;
    else if (!strcmp(a, "--top-k")) rc = parse_long(a, v, 0, 1 << 30, &l), o->sp.top_k = (int)l, o->set_top_k = 1;
    else if (!strcmp(a, "--seed")) {
        char *end;
        errno = 0;
        o->sp.seed = strtoull(v, &end, 10);
        o->set_seed = 1;
        if (errno || end == v || *end || v[0] == '-') {
            fprintf(stderr, "atlas run: --seed: '%s' is not an unsigned integer\n", v);
            return 2;
        }
    } else if (!strcmp(a, "--temp")) rc = parse_float(a, v, 0, 100, &o->sp.temperature), o->set_temp = 1;
    else if (!strcmp(a, "--top-p")) rc = parse_float(a, v, 0, 1, &o->sp.top_p), o->set_top_p = 1;
    else if (!strcmp(a, "--min-p")) rc = parse_float(a, v, 0, 1, &o->sp.min_p);
    else if (!strcmp(a, "--device")) {
        if (atlas_cli_parse_device(v, &o->dev.device, &o->dev.gpu)) {
            fprintf(stderr, "atlas run: --device: '%s' (want cpu, cuda, cuda:N or auto)\n", v);
            return 2;
        }
    } else if (!strcmp(a, "--kernels")) {
        if (atlas_cli_parse_kernels(v, &o->dev.kernels)) {
            fprintf(stderr, "atlas run: --kernels: '%s' (want native or portable)\n", v);
            return 2;
        }
    } else if (!strcmp(a, "--cpu-activations")) {
        if (atlas_cli_parse_cpu_activations(v, &o->dev.cpu_act)) {
            fprintf(stderr, "atlas run: --cpu-activations: '%s' (want auto, fp32, bf16 or "
                            "int8)\n", v);
            return 2;
        }
    } else if (!strcmp(a, "--gpu-activations")) {
        if (atlas_cli_parse_gpu_activations(v, &o->dev.gpu_act)) {
            fprintf(stderr, "atlas run: --gpu-activations: '%s' (want fp32 or int8)\n", v);
            return 2;
        }
    } else if (!strcmp(a, "--kv-cache-dtype")) {
        if (atlas_cli_parse_kv_dtype("run", v, &o->dev.kv_dtype)) return 2;
    } else {
        fprintf(stderr, "atlas run: unknown option '%s' (see --help)\n", a);
        return 2;
    }
    return rc ? rc : -1;
}

static int parse_ids(const char *s, int32_t **ids, size_t *n) {
    const char *bad = s;
    int rc = atlas_cli_parse_ids(s, ids, n, &bad);
    if (rc < 0) fprintf(stderr, "atlas run: --prompt-ids: bad id at '%s' (want 1,2,3)\n", bad);
    if (rc > 0) fprintf(stderr, "atlas run: out of memory\n");
    return rc < 0 ? 2 : rc;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* {"id":…, "text":…, "bytes":[…], "logprob":…, "top_logprobs":[{"id":…, "logprob":…}, …]} */
static int print_json(const atlas_tokenizer *tok, int32_t id, const char *text, size_t len,
                      float logprob, const atlas_top_logprob *top, int n_top) {
    const char *bytes = "";
    size_t blen = 0;
    if (atlas_tokenizer_token_bytes(tok, id, &bytes, &blen) != ATLAS_OK) blen = 0;
    json_t *o = json_object(), *b = json_array(), *tl = json_array();
    for (size_t i = 0; i < blen; i++) json_array_append_new(b, json_integer((unsigned char)bytes[i]));
    for (int i = 0; i < n_top; i++) {
        json_t *e = json_object();
        json_object_set_new(e, "id", json_integer(top[i].id));
        json_object_set_new(e, "logprob", json_real(top[i].logprob));
        json_array_append_new(tl, e);
    }
    json_object_set_new(o, "id", json_integer(id));
    json_object_set_new(o, "text", json_stringn(text, len));
    json_object_set_new(o, "bytes", b);
    json_object_set_new(o, "logprob", isfinite(logprob) ? json_real(logprob) : json_null());
    json_object_set_new(o, "top_logprobs", tl);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) return 1;
    puts(s);
    free(s);
    fflush(stdout);
    return 0;
}

/* What the engine's callback writes and the main thread waits for. */
typedef struct run_out {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    const run_opts *o;
    const atlas_tokenizer *tok;
    int done, failed, n_gen;
    char last; /* the last byte of text printed, so that the closing newline is not doubled */
    double t_submit, t_first, t_end;
    atlas_event end; /* the END event's fields (its pointers are not kept) */
    char message[512];
} run_out;

/* Called on the engine's thread: prints each token's text (or JSON line) as it comes. */
static void on_event(const atlas_event *ev, void *user) {
    run_out *r = user;
    const run_opts *o = r->o;
    if (ev->type == ATLAS_EVENT_TOKEN) {
        if (r->n_gen++ == 0) r->t_first = now_s();
        if (o->json) r->failed |= print_json(r->tok, ev->id, ev->text, ev->text_len,
                                             ev->logprob, ev->top, ev->n_top);
        else if (ev->text_len) {
            fwrite(ev->text, 1, ev->text_len, stdout), fflush(stdout);
            r->last = ev->text[ev->text_len - 1];
        }
        return;
    }
    if (ev->text_len && !o->json) {
        fwrite(ev->text, 1, ev->text_len, stdout);
        r->last = ev->text[ev->text_len - 1];
    }
    if (ev->stop_id >= 0 && r->n_gen++ == 0) /* the first token ends it: its time is the END's */
        r->t_first = now_s();
    if (ev->stop_id >= 0 && o->json) /* the end-of-sequence token: no text */
        r->failed |= print_json(r->tok, ev->stop_id, "", 0, ev->logprob, ev->top, ev->n_top);
    fflush(stdout);
    pthread_mutex_lock(&r->mu);
    r->end = *ev;
    snprintf(r->message, sizeof r->message, "%s", ev->message ? ev->message : "");
    r->t_end = now_s();
    r->done = 1;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static int prompt_ids(const run_opts *o, const atlas_tokenizer *tok, int32_t **ids, size_t *n) {
    if (o->prompt_ids) return parse_ids(o->prompt_ids, ids, n);
    const char *p = o->prompt ? o->prompt : DEFAULT_PROMPT;
    if (atlas_tokenizer_encode(tok, p, strlen(p), true, ids, n) != ATLAS_OK) {
        fprintf(stderr, "atlas run: prompt: %s\n", atlas_last_error());
        return 1;
    }
    if (*n == 0) {
        fprintf(stderr, "atlas run: the prompt has no tokens\n");
        return 1;
    }
    return 0;
}

/* Defaults of generation_config.json for what the command line left unset. */
static void sampler_defaults(run_opts *o, const atlas_generation_defaults *g) {
    if (!o->set_temp) o->sp.temperature = g->temperature;
    if (!o->set_top_p && g->top_p > 0 && g->top_p < 1) o->sp.top_p = g->top_p;
    if (!o->set_top_k && g->top_k > 0) o->sp.top_k = g->top_k;
}

/* The last line on stderr.  The first token comes out of the prompt's forward pass, so the
 * prompt's time is the time to it, whatever token it is (an end-of-sequence one included),
 * and the generation rate counts the tokens after it over the time after it. */
static void print_speeds(const run_out *r, size_t n, const char *backend) {
    double ttft = (r->n_gen ? r->t_first : r->t_end) - r->t_submit;
    fprintf(stderr, "prompt: %zu tokens, first token after %.3f s (%.1f tok/s); ", n, ttft,
            ttft > 0 ? n / ttft : 0.0);
    double t_gen = r->t_end - r->t_first;
    if (r->n_gen > 1)
        fprintf(stderr, "generation: %d tokens, the %d after the first in %.3f s (%.1f tok/s)",
                r->n_gen, r->n_gen - 1, t_gen, t_gen > 0 ? (r->n_gen - 1) / t_gen : 0.0);
    else
        fprintf(stderr, "generation: %d token%s, no rate (none after the first)", r->n_gen,
                r->n_gen == 1 ? "" : "s");
    fprintf(stderr, " [%s] seed %llu\n", backend, (unsigned long long)r->o->sp.seed);
}

/* Submits the prompt and waits for its END; prints the speeds. */
static int generate(run_opts *o, atlas_engine *e, const atlas_tokenizer *tok, const int32_t *ids,
                    size_t n) {
    run_out r = {.o = o, .tok = tok};
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv, NULL);
    atlas_request req = {.model = o->name, .prompt = ids, .n_prompt = n, .sampling = o->sp,
                         .max_tokens = o->n, .logprobs = o->json,
                         .top_logprobs = o->json ? o->top_logprobs : 0,
                         .ignore_eos = o->ignore_eos};
    int ctx = 0; /* -n beyond the context: until it is full, as llama.cpp's -n does (the API
                  refuses such a request, as vLLM does) */
    if (o->n > 0 && atlas_engine_ctx_size(e, o->name, &ctx) == ATLAS_OK &&
        n + (size_t)o->n > (size_t)ctx) {
        fprintf(stderr, "atlas run: -n %d with a %zu-token prompt is more than the %d-token "
                "context: generating until it is full\n", o->n, n, ctx);
        req.max_tokens = 0;
    }
    if (!o->json && !o->prompt_ids && isatty(1)) {
        /* at a terminal, show the prompt before its continuation (piped output stays the
         * generated text alone) */
        fputs(o->prompt ? o->prompt : DEFAULT_PROMPT, stdout);
        fflush(stdout);
    }
    r.t_submit = now_s();
    int rc = 0, stopped_by_context = 0;
    if (atlas_engine_submit(e, &req, on_event, &r, NULL) != ATLAS_OK) {
        fprintf(stderr, "atlas run: %s\n", atlas_last_error());
        rc = 1;
    } else {
        pthread_mutex_lock(&r.mu);
        while (!r.done) pthread_cond_wait(&r.cv, &r.mu);
        pthread_mutex_unlock(&r.mu);
        if (r.end.finish == ATLAS_FINISH_ERROR) {
            fprintf(stderr, "atlas run: %s\n", r.message);
            rc = 1;
        } else if (r.end.finish == ATLAS_FINISH_LENGTH && req.max_tokens == 0 && o->n > 0) {
            /* fewer tokens than -n asked for: say why, or it looks like a bug */
            stopped_by_context = 1;
        }
        rc |= r.failed;
    }
    /* the text ends with a newline, so that a shell prompt or the next output starts on a
     * line of its own; a text that already ends with one gets no second */
    if (!o->json && r.last != '\n') putchar('\n');
    static const char *const finish[] = {"stop", "length", "cancelled", "error"};
    if (o->json && r.done)
        printf("{\"seed\":%llu,\"finish_reason\":\"%s\"}\n", (unsigned long long)o->sp.seed,
               finish[r.end.finish & 3]);
    fflush(stdout);
    if (stopped_by_context)
        fprintf(stderr, "atlas run: stopped after %d of -n %d tokens: the %d-token context is "
                "full (--ctx-size; prompt and answer share it)\n", r.n_gen, o->n, ctx);
    if (!rc) {
        atlas_engine_model_status ms;
        atlas_engine_models(e, &ms, 1);
        print_speeds(&r, n, ms.backend[0] ? ms.backend : "?");
    }
    pthread_mutex_destroy(&r.mu);
    pthread_cond_destroy(&r.cv);
    return rc;
}

/* Loads the model now, showing its progress and then one line: what, how fast, where. */
static atlas_status load(const run_opts *o, atlas_engine *e, atlas_cli_progress *pg) {
    atlas_cli_progress_begin(pg, o->name);
    atlas_status st = atlas_engine_load(e, o->name);
    char device[32] = "";
    if (st == ATLAS_OK) {
        atlas_engine_model_status ms;
        atlas_engine_models(e, &ms, 1);
        if (!strcmp(ms.backend, "cuda")) snprintf(device, sizeof device, "cuda:%d", o->dev.gpu);
        else snprintf(device, sizeof device, "%s", ms.backend);
    }
    atlas_cli_progress_end(pg, st == ATLAS_OK, device);
    return st;
}

static int run_engine(run_opts *o) {
    atlas_generation_defaults gen;
    if (atlas_model_generation_defaults(o->dir, &gen) != ATLAS_OK) {
        fprintf(stderr, "atlas run: %s\n", atlas_last_error());
        return 1;
    }
    sampler_defaults(o, &gen);
    atlas_engine_model mod = {.name = o->name, .dir = o->dir};
    atlas_engine_params p = atlas_cli_one_model(&mod, &o->dev);
    if (o->batch) p.batch_tokens = o->batch;
    atlas_cli_progress *pg = atlas_cli_progress_new(stderr);
    p.load_progress = atlas_cli_progress_report;
    p.load_progress_user = pg;
    atlas_engine *e = NULL;
    if (atlas_engine_create(&p, &e) != ATLAS_OK) {
        fprintf(stderr, "atlas run: %s\n", atlas_last_error());
        atlas_cli_progress_free(pg);
        return 1;
    }
    atlas_engine_model_status ms;
    atlas_engine_models(e, &ms, 1);
    if (ms.note[0]) fprintf(stderr, "atlas run: %s\n", ms.note);
    const atlas_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = 0;
    if (atlas_engine_tokenizer(e, o->name, &tok) != ATLAS_OK || load(o, e, pg) != ATLAS_OK) {
        fprintf(stderr, "atlas run: %s\n", atlas_last_error());
        atlas_cli_device_hint("run", o->dev.device);
        rc = 1;
    }
    if (!rc) rc = prompt_ids(o, tok, &ids, &n);
    if (!rc && o->n > 0) rc = generate(o, e, tok, ids, n);
    free(ids);
    atlas_engine_free(e);
    atlas_cli_progress_free(pg);
    return rc;
}

/* Reads -f FILE (or stdin for "-") whole into o->prompt_buf and points o->prompt at it. */
static int read_prompt(run_opts *o) {
    int from_stdin = !strcmp(o->prompt_file, "-");
    FILE *f = from_stdin ? stdin : fopen(o->prompt_file, "rb");
    if (!f) {
        fprintf(stderr, "atlas run: -f %s: %s\n", o->prompt_file, strerror(errno));
        return 1;
    }
    size_t n = 0, cap = 4096;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - 1 - n, f);
        if (n < cap - 1) break;
        char *g = cap > ((size_t)1 << 30) ? NULL : realloc(buf, cap *= 2);
        if (!g) free(buf);
        buf = g;
    }
    int err = ferror(f);
    if (!from_stdin) fclose(f);
    if (!buf || err) {
        fprintf(stderr, "atlas run: %s: %s\n", from_stdin ? "stdin" : o->prompt_file,
                buf ? "read error" : "out of memory (or over 1 GiB)");
        free(buf);
        return 1;
    }
    buf[n] = 0;
    if (strlen(buf) != n) {
        fprintf(stderr, "atlas run: %s: the prompt has a NUL byte\n",
                from_stdin ? "stdin" : o->prompt_file);
        free(buf);
        return 1;
    }
    o->prompt_buf = buf;
    o->prompt = buf;
    return 0;
}

int atlas_cli_run(int argc, char **argv) {
    run_opts o = {.n = 32, .tp = 1, .dev.device = ATLAS_DEVICE_AUTO,
                  .dev.cpu_act = ATLAS_CPU_ACT_AUTO,
                  .sp = atlas_sampler_default_params()};
    for (int i = 1; i < argc; i++) {
        int rc = parse_opt(&o, argc, argv, &i);
        if (rc >= 0) return rc;
    }
    if (!o.set_seed) o.sp.seed = atlas_cli_random_seed();
    if (atlas_tp_preflight(o.tp) != ATLAS_OK) { /* before anything touches a model */
        fprintf(stderr, "atlas run: --tensor-parallel %d: %s\n", o.tp, atlas_last_error());
        return 1;
    }
    if ((o.prompt || o.prompt_file) && o.prompt_ids) {
        fprintf(stderr, "atlas run: give -p, -f or --prompt-ids, not two of them\n");
        return 2;
    }
    if (o.prompt_file && read_prompt(&o)) return 1;
    if (!o.dir) o.dir = atlas_cli_default_model();
    if (atlas_cli_check_model("run", o.dir)) {
        free(o.prompt_buf);
        return 1;
    }
    atlas_cli_model_name(o.dir, o.name, sizeof o.name);
    int rc = run_engine(&o);
    free(o.prompt_buf);
    return rc;
}

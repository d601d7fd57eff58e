/* cli/serve.c — `atlas serve`: the OpenAI-compatible HTTP server (src/server) over an engine
 * holding one or more models.  Runs until SIGINT or SIGTERM (the handler only sets a flag),
 * then stops accepting, ends the open requests and frees everything. */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

#include "atlas/engine.h"
#include "atlas/host.h"
#include "atlas/parallel.h"
#include "atlas/server.h"
#include "atlas/toolcall.h"
#include "cli/cli.h"
#include "cli/options.h"
#include "cli/progress.h"
#include "cli/serve_preset.h"
#include "cli/serve_usage.h"
#include "cli/startup.h"

enum { MAX_MODELS = 64 };

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

static int parse_size(const char *s, size_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0) return -1;
    double mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1024.0, end++;
    else if (*end == 'M' || *end == 'm') mul = 1048576.0, end++;
    else if (*end == 'G' || *end == 'g') mul = 1073741824.0, end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end || v * mul > 1e18) return -1;
    *out = (size_t)(v * mul);
    return 0;
}

/* F in (0, 1]. */
static int parse_fraction(const char *opt, const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v > 0 && v <= 1)) {
        fprintf(stderr, "atlas serve: %s: '%s' is not a number in (0, 1]\n", opt, s);
        return -2;
    }
    *out = v;
    return 0;
}

/* S seconds in [0, 86400], fractions allowed, as milliseconds. */
static int parse_ms(const char *opt, const char *s, int *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= 0 && v <= 86400)) {
        fprintf(stderr, "atlas serve: %s: '%s' is not a number of seconds in 0..86400\n", opt, s);
        return -2;
    }
    *out = (int)(v * 1000 + 0.5);
    if (v > 0 && *out == 0) *out = 1; /* a tiny timeout is still one, never "none" */
    return 0;
}

/* A positive number of GiB, as bytes. */
static int parse_gib(const char *opt, const char *s, size_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v > 0 && v < 1e9)) {
        fprintf(stderr, "atlas serve: %s: '%s' is not a positive number of GiB\n", opt, s);
        return -2;
    }
    *out = (size_t)(v * 1073741824.0);
    return 0;
}

static int parse_int(const char *opt, const char *s, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "atlas serve: %s: '%s' is not an integer in %d..%d\n", opt, s, lo, hi);
        return -2; /* reported */
    }
    *out = (int)v;
    return 0;
}

/* N in 1..1024, or auto. */
static int parse_max_resident(const char *v, int *out) {
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (!strcmp(v, "auto")) return *out = ATLAS_MAX_RESIDENT_AUTO, 0;
    if (!errno && end != v && !*end && n >= 1 && n <= 1024) return *out = (int)n, 0;
    fprintf(stderr, "atlas serve: --max-resident: '%s' is neither a count in 1..1024 nor "
            "auto\n", v);
    return -2;
}

static int parse_level(const char *v, atlas_log_level *out) {
    static const char *const names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(v, names[i])) return *out = (atlas_log_level)i, 0;
    return -1;
}

typedef struct serve_args {
    atlas_engine_model models[MAX_MODELS];
    char *owned[MAX_MODELS * 2]; /* strings made here */
    int n_models, n_owned;
    atlas_engine_params ep;
    atlas_server_params sp;
    int tp; /* --tensor-parallel */
    const char *templates[MAX_MODELS], *formats[MAX_MODELS]; /* [NAME=]VALUE, as given */
    int n_templates, n_formats;
    const char *aliases[MAX_MODELS * 2]; /* --alias NAME=MODEL, as given, and the models
                                            file's */
    int load[MAX_MODELS];  /* the models file's "load": 1, 0, or -1 not said */
    serve_preset preset;   /* --models-preset FILE, read */
} serve_args;

static char *keep(serve_args *a, char *s) {
    if (s && a->n_owned < MAX_MODELS * 2) a->owned[a->n_owned++] = s;
    return s;
}

static int add_model(serve_args *a, const char *spec) {
    if (a->n_models == MAX_MODELS) {
        fprintf(stderr, "atlas serve: more than %d models\n", MAX_MODELS);
        return -1;
    }
    const char *eq = strchr(spec, '=');
    const char *dir = eq ? eq + 1 : spec;
    char *name;
    if (eq) {
        name = keep(a, strndup(spec, (size_t)(eq - spec)));
    } else { /* the directory's last component */
        size_t n = strlen(dir);
        while (n > 1 && dir[n - 1] == '/') n--;
        size_t b = n;
        while (b > 0 && dir[b - 1] != '/') b--;
        name = keep(a, strndup(dir + b, n - b));
    }
    if (!name || !*name || !*dir) {
        fprintf(stderr, "atlas serve: --model '%s': expected [NAME=]DIR\n", spec);
        return -1;
    }
    /* the engine's rule, said here with the option that broke it (the message shows the
     * name escaped, not raw) */
    if (atlas_engine_check_name(name) != ATLAS_OK) {
        fprintf(stderr, "atlas serve: --model: %s%s\n", atlas_last_error(),
                eq ? "" : " (DIR's last component; give another with NAME=DIR)");
        return -1;
    }
    for (int i = 0; i < a->n_models; i++)
        if (!strcmp(a->models[i].name, name)) {
            fprintf(stderr, "atlas serve: two models are named '%s'\n", name);
            return -1;
        }
    a->models[a->n_models].name = name;
    a->models[a->n_models].dir = dir;
    a->n_models++;
    return 0;
}

static int add_models_dir(serve_args *a, const char *root) {
    DIR *d = opendir(root);
    if (!d) {
        fprintf(stderr, "atlas serve: --models-dir %s: %s\n", root, strerror(errno));
        return -1;
    }
    struct dirent *de;
    int rc = 0, before = a->n_models, skipped = 0;
    while (rc == 0 && (de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char cfg[4096], spec[4096];
        struct stat st;
        int n = snprintf(cfg, sizeof cfg, "%s/%s/config.json", root, de->d_name);
        if (n < 0 || (size_t)n >= sizeof cfg) continue;
        if (stat(cfg, &st) != 0) {
            /* a GGUF file, .bin weights, a cache entry: a model the user meant to serve,
             * said so rather than skipped without a word */
            cfg[n - sizeof "/config.json" + 1] = '\0';
            if (atlas_model_check_layout(cfg) == ATLAS_ERR_UNSUPPORTED) {
                fprintf(stderr, "atlas serve: --models-dir: skipping %s\n", atlas_last_error());
                skipped++;
            }
            continue;
        }
        /* the name becomes NAME of NAME=DIR (a '=' would split it wrongly) and must keep
         * the rule of every model name; one that breaks it is said and skipped, so that
         * the other models are still served */
        if (strchr(de->d_name, '=')) {
            fprintf(stderr, "atlas serve: --models-dir %s: skipping a directory whose name has "
                            "'='\n", root);
            continue;
        }
        if (atlas_engine_check_name(de->d_name) != ATLAS_OK) {
            fprintf(stderr, "atlas serve: --models-dir %s: skipping a directory: %s\n", root,
                    atlas_last_error());
            continue;
        }
        n = snprintf(spec, sizeof spec, "%s=%s/%s", de->d_name, root, de->d_name);
        if (n < 0 || (size_t)n >= sizeof spec) continue;
        char *s = keep(a, strdup(spec));
        if (!s) fprintf(stderr, "atlas serve: out of memory\n");
        rc = s ? add_model(a, s) : -1;
    }
    closedir(d);
    /* an empty root is a mistake (a wrong path, a mount not there): serving the default
     * model instead would hide it */
    if (rc == 0 && a->n_models == before) {
        fprintf(stderr, "atlas serve: --models-dir %s: no subdirectory with a config.json%s\n",
                root, skipped ? " (what it holds is said above)" : "");
        rc = -1;
    }
    return rc ? -2 : 0; /* reported */
}

/* NAME=MODEL; that MODEL is served is checked when the server starts. */
static int add_alias(serve_args *a, const char *spec) {
    const char *eq = strchr(spec, '=');
    if (!eq || eq == spec || !eq[1]) {
        fprintf(stderr, "atlas serve: --alias '%s': expected NAME=MODEL\n", spec);
        return -2;
    }
    if (a->sp.n_aliases == MAX_MODELS * 2) {
        fprintf(stderr, "atlas serve: more than %d aliases\n", MAX_MODELS * 2);
        return -2;
    }
    a->aliases[a->sp.n_aliases++] = spec;
    a->sp.aliases = a->aliases;
    return 0;
}

static int add_override(const char *opt, const char *spec, const char **list, int *n) {
    if (*n == MAX_MODELS) {
        fprintf(stderr, "atlas serve: %s: given more than %d times\n", opt, MAX_MODELS);
        return -2;
    }
    list[(*n)++] = spec;
    return 0;
}

/* The model [NAME=]VALUE names (NULL: every model, value the whole spec).  A spec whose
 * NAME is not a served model is a FILE with '=' in it, if one exists by that name. */
static atlas_engine_model *override_target(serve_args *a, const char *opt, const char *spec,
                                           const char **value, bool file, int *bad) {
    const char *eq = strchr(spec, '=');
    *value = spec;
    *bad = 0;
    if (!eq) return NULL;
    for (int i = 0; i < a->n_models; i++)
        if (strlen(a->models[i].name) == (size_t)(eq - spec) &&
            !strncmp(a->models[i].name, spec, (size_t)(eq - spec))) {
            *value = eq + 1;
            return &a->models[i];
        }
    struct stat sb;
    if (file && stat(spec, &sb) == 0) return NULL;
    fprintf(stderr, "atlas serve: %s '%s': no served model is named '%.*s'\n", opt, spec,
            (int)(eq - spec), spec);
    *bad = 1;
    return NULL;
}

/* --chat-template and --tool-call-format onto the models, once all are known: a NAME=
 * one wins over one for every model, whatever their order; the models file's own value
 * wins over one for every model too, since the flags are the defaults of what it leaves
 * out. */
static int apply_overrides(serve_args *a) {
    bool own_tmpl[MAX_MODELS], own_fmt[MAX_MODELS]; /* set by the models file */
    for (int j = 0; j < a->n_models; j++) {
        own_tmpl[j] = a->models[j].chat_template != NULL;
        own_fmt[j] = a->models[j].tool_call_format != NULL;
    }
    for (int pass = 0; pass < 2; pass++) {
        bool file = pass == 0;
        const char *opt = file ? "--chat-template" : "--tool-call-format";
        const char **list = file ? a->templates : a->formats;
        int n = file ? a->n_templates : a->n_formats, bad;
        for (int k = 0; k < 2; k++) /* every model first, then NAME= ones over them */
            for (int i = 0; i < n; i++) {
                const char *v;
                atlas_engine_model *m = override_target(a, opt, list[i], &v, file, &bad);
                if (bad) return 2;
                if ((m != NULL) != (k == 1)) continue;
                atlas_toolcall_format f;
                if (!file && atlas_toolcall_format_parse(v, &f) != ATLAS_OK) {
                    fprintf(stderr, "atlas serve: %s: %s\n", opt, atlas_last_error());
                    return 2;
                }
                for (int j = 0; j < a->n_models; j++) {
                    atlas_engine_model *t = m ? m : &a->models[j];
                    if (!m && (file ? own_tmpl[j] : own_fmt[j])) continue;
                    if (file) t->chat_template = v;
                    else t->tool_call_format = v;
                    if (m) break;
                }
            }
    }
    return 0;
}

/* --models-preset FILE: its models, settings and aliases join those of the flags. */
static int add_preset(serve_args *a, const char *path) {
    if (a->preset.n) {
        fprintf(stderr, "atlas serve: --models-preset given twice\n");
        return -2;
    }
    if (serve_preset_read(path, &a->preset)) return -2; /* reported */
    for (int i = 0; i < a->preset.n; i++) {
        const serve_preset_model *pm = &a->preset.models[i];
        if (a->n_models == MAX_MODELS) {
            fprintf(stderr, "atlas serve: more than %d models\n", MAX_MODELS);
            return -2;
        }
        a->load[a->n_models] = pm->load;
        a->models[a->n_models++] = pm->m;
        for (int k = 0; k < pm->n_aliases; k++)
            if (add_alias(a, pm->aliases[k])) return -2;
    }
    return 0;
}

static int parse_keep_alive(const char *v, int64_t *out) {
    if (atlas_engine_parse_keep_alive(v, out) == ATLAS_OK) return 0;
    fprintf(stderr, "atlas serve: --keep-alive: %s\n", atlas_last_error());
    return -2;
}

static const char *const serve_options[] = {
    "-h", "--help", "--model", "-m", "--models-dir", "--alias", "--host", "--port", "--api-key",
    "--max-resident", "--memory-budget", "--drain-timeout", "--gpu-memory-utilization", "--kv-memory",
    "--ctx-size", "--max-model-len", "--parallel", "--queue-limit", "--batch-tokens", "--threads",
    "--tensor-parallel",
    "--timeout", "--header-timeout", "--body-timeout", "--max-connections-per-ip",
    "--ssl-certfile", "--ssl-keyfile", "--max-body", "--max-connections", "--cors-origin",
    "--allowed-hosts", "--reasoning-format", "--device", "--log-format", "--log-level", "--kernels", "--cpu-activations", "--gpu-activations", "--kv-cache-dtype",
    "--step-ahead", "--no-memory-check", "--responses-max", "--responses-ttl", "--chat-template",
    "--tool-call-format", "--models-preset", "--keep-alive", "--host-cache", NULL};

/* Returns 0 to go on, 1 after --help, 2 on a usage error. */
static int parse_args(int argc, char **argv, serve_args *a) {
    for (int i = 1; i < argc; i++) {
        const char *o = atlas_cli_resolve_option(argv[i], serve_options);
        if (!atlas_cli_known_option(o, serve_options))
            return atlas_cli_unknown_option("serve", o, serve_options);
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            atlas_cli_serve_usage(stdout);
            return 1;
        }
        if (!strcmp(o, "--no-memory-check")) {
            a->ep.no_memory_check = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "atlas serve: %s needs a value (see --help)\n", o);
            return 2;
        }
        const char *v = argv[++i];
        int bad = 0;
        if (!strcmp(o, "--model") || !strcmp(o, "-m")) bad = add_model(a, v) ? -2 : 0;
        else if (!strcmp(o, "--models-dir")) bad = add_models_dir(a, v);
        else if (!strcmp(o, "--alias")) bad = add_alias(a, v);
        else if (!strcmp(o, "--chat-template"))
            bad = add_override(o, v, a->templates, &a->n_templates);
        else if (!strcmp(o, "--tool-call-format"))
            bad = add_override(o, v, a->formats, &a->n_formats);
        else if (!strcmp(o, "--models-preset")) bad = add_preset(a, v);
        else if (!strcmp(o, "--keep-alive")) bad = parse_keep_alive(v, &a->ep.keep_alive_ms);
        else if (!strcmp(o, "--host")) a->sp.host = v;
        else if (!strcmp(o, "--port")) bad = parse_int(o, v, 0, 65535, &a->sp.port);
        else if (!strcmp(o, "--api-key")) a->sp.api_key = v;
        else if (!strcmp(o, "--max-resident")) bad = parse_max_resident(v, &a->ep.max_resident);
        else if (!strcmp(o, "--memory-budget")) bad = parse_gib(o, v, &a->ep.gpu_memory);
        else if (!strcmp(o, "--drain-timeout")) bad = parse_ms(o, v, &a->ep.drain_timeout_ms);
        else if (!strcmp(o, "--gpu-memory-utilization"))
            bad = parse_fraction(o, v, &a->ep.gpu_memory_utilization);
        else if (!strcmp(o, "--kv-memory")) bad = parse_gib(o, v, &a->ep.kv_memory);
        else if (!strcmp(o, "--host-cache")) /* 0: keep nothing */
            bad = strcmp(v, "0") ? parse_gib(o, v, &a->ep.host_cache) : 0;
        else if (!strcmp(o, "--ctx-size") || !strcmp(o, "--max-model-len"))
            bad = parse_int(o, v, 0, INT32_MAX, &a->ep.ctx_size);
        else if (!strcmp(o, "--parallel")) bad = parse_int(o, v, 1, 4096, &a->ep.parallel);
        else if (!strcmp(o, "--queue-limit")) bad = parse_int(o, v, 1, 1 << 20, &a->ep.queue_limit);
        else if (!strcmp(o, "--batch-tokens")) bad = parse_int(o, v, 1, 1 << 20, &a->ep.batch_tokens);
        else if (!strcmp(o, "--threads")) bad = parse_int(o, v, 0, 1024, &a->ep.n_threads);
        else if (!strcmp(o, "--tensor-parallel")) bad = parse_int(o, v, 1, 64, &a->tp);
        else if (!strcmp(o, "--timeout")) bad = parse_int(o, v, 1, 86400, &a->sp.timeout_s);
        else if (!strcmp(o, "--header-timeout"))
            bad = parse_int(o, v, 1, 86400, &a->sp.header_timeout_s);
        else if (!strcmp(o, "--body-timeout"))
            bad = parse_int(o, v, 1, 86400, &a->sp.body_timeout_s);
        else if (!strcmp(o, "--max-connections-per-ip"))
            bad = parse_int(o, v, 0, 65536, &a->sp.max_connections_per_ip);
        else if (!strcmp(o, "--ssl-certfile")) a->sp.ssl_certfile = v;
        else if (!strcmp(o, "--ssl-keyfile")) a->sp.ssl_keyfile = v;
        else if (!strcmp(o, "--max-body")) bad = parse_size(v, &a->sp.max_body);
        else if (!strcmp(o, "--max-connections"))
            bad = parse_int(o, v, 1, 65536, &a->sp.max_connections);
        else if (!strcmp(o, "--cors-origin")) a->sp.cors = v;
        else if (!strcmp(o, "--allowed-hosts")) a->sp.allowed_hosts = v;
        else if (!strcmp(o, "--responses-max"))
            bad = parse_int(o, v, 0, 1 << 20, &a->sp.responses_max);
        else if (!strcmp(o, "--responses-ttl"))
            bad = parse_int(o, v, 1, 30 * 86400, &a->sp.responses_ttl_s);
        else if (!strcmp(o, "--reasoning-format")) {
            if (!strcmp(v, "auto")) a->sp.reasoning = true;
            else if (!strcmp(v, "none")) a->sp.reasoning = false;
            else bad = -1;
        } else if (!strcmp(o, "--log-format")) {
            if (!strcmp(v, "text")) a->sp.log_format = ATLAS_LOG_TEXT;
            else if (!strcmp(v, "json")) a->sp.log_format = ATLAS_LOG_JSON;
            else bad = -1;
        } else if (!strcmp(o, "--log-level")) {
            bad = parse_level(v, &a->sp.log_level);
        } else if (!strcmp(o, "--device")) {
            bad = atlas_cli_parse_device(v, &a->ep.device, &a->ep.gpu);
        } else if (!strcmp(o, "--kernels")) {
            bad = atlas_cli_parse_kernels(v, &a->ep.kernels);
        } else if (!strcmp(o, "--cpu-activations")) {
            bad = atlas_cli_parse_cpu_activations(v, &a->ep.cpu_activations);
        } else if (!strcmp(o, "--gpu-activations")) {
            bad = atlas_cli_parse_gpu_activations(v, &a->ep.gpu_activations);
        } else if (!strcmp(o, "--kv-cache-dtype")) {
            bad = atlas_cli_parse_kv_dtype("serve", v, &a->ep.kv_dtype);
        } else if (!strcmp(o, "--step-ahead")) {
            bad = atlas_cli_parse_step_ahead(v, &a->ep.step_ahead);
        } else {
            fprintf(stderr, "atlas serve: unknown option: %s\n", o);
            atlas_cli_serve_usage(stderr);
            return 2;
        }
        if (bad) {
            if (bad != -2) fprintf(stderr, "atlas serve: bad value for %s: '%s'\n", o, v);
            return 2;
        }
    }
    return 0;
}

/* Each open connection is a descriptor (a request being answered, two): the soft limit,
 * often 1,024, would refuse connections well below --max-connections. */
static void raise_fd_limit(int max_connections) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
    rlim_t want = (rlim_t)max_connections * 2 + 256;
    if (rl.rlim_cur >= want) return;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < want)
        fprintf(stderr, "atlas serve: only %llu file descriptors (ulimit -n): fewer than "
                "--max-connections %d may open\n", (unsigned long long)rl.rlim_cur,
                max_connections);
}

/* "cuda:0", "cpu": where a resident model runs. */
static int count_resident(const atlas_engine_model_status *ms, int n) {
    int k = 0;
    for (int i = 0; i < n && i < MAX_MODELS; i++) k += ms[i].resident != 0;
    return k;
}

static void device_name(const serve_args *a, const char *backend, char *out, size_t cap) {
    if (!strcmp(backend, "cuda")) snprintf(out, cap, "cuda:%d", a->ep.gpu);
    else snprintf(out, cap, "%s", backend[0] ? backend : "-");
}

/* Whether model i fits beside those resident now under --max-resident auto: a load at start
 * never evicts one loaded before it. */
static bool fits_now(atlas_engine *engine, int i) {
    atlas_engine_model_status ms[MAX_MODELS];
    int n = atlas_engine_models(engine, ms, MAX_MODELS);
    atlas_engine_metrics em;
    atlas_engine_get_metrics(engine, &em);
    size_t used = ms[i].memory_bytes;
    for (int j = 0; j < n && j < MAX_MODELS; j++) used += ms[j].resident_bytes;
    return em.memory_budget == 0 || used <= em.memory_budget;
}

/* A model's tokenizer and chat template, read while its weights load: the engine reads them
 * on first use, which would otherwise make the first request wait for a parse (a 128k-token
 * tokenizer.json is a few hundred ms).  A failure is left for that request to report. */
typedef struct warm_job {
    atlas_engine *engine;
    const char *name;
    double *done;  /* when both were read (the start's log) */
} warm_job;

static void *warm_main(void *arg) {
    warm_job *w = arg;
    const atlas_tokenizer *tok;
    const atlas_template *tmpl;
    if (atlas_engine_tokenizer(w->engine, w->name, &tok) == ATLAS_OK &&
        atlas_engine_template(w->engine, w->name, &tmpl) == ATLAS_OK)
        *w->done = atlas_cli_now_ms();
    return NULL;
}

/* Whether model i is one load_at_start may load (whether it fits aside): its tokenizer and
 * template are read from the engine's create on (atlas_engine_model.warm). */
static void mark_warm(serve_args *a) {
    bool chosen = false;
    for (int i = 0; i < a->n_models; i++) chosen |= a->load[i] == 1;
    bool by_memory = a->ep.max_resident == ATLAS_MAX_RESIDENT_AUTO;
    for (int i = 0, n = 0; i < a->n_models && (by_memory || n < a->ep.max_resident); i++) {
        if (chosen ? a->load[i] != 1 : a->load[i] == 0) continue;
        a->models[i].warm = 1;
        n++;
    }
}

/* Loads the first models (as many as may be resident) before the server answers, each with
 * its progress and its line, its tokenizer and template read beside it; a model that fails
 * is said and left to load on demand (its requests then get the error, and a later one
 * retries). */
static void load_at_start(serve_args *a, atlas_engine *engine, atlas_cli_progress *pg,
                          atlas_cli_startup *su) {
    bool chosen = false; /* the models file names which: those with "load": true */
    for (int i = 0; i < a->n_models; i++) chosen |= a->load[i] == 1;
    bool by_memory = a->ep.max_resident == ATLAS_MAX_RESIDENT_AUTO;
    for (int i = 0, n = 0; i < a->n_models && (by_memory || n < a->ep.max_resident); i++) {
        if (chosen ? a->load[i] != 1 : a->load[i] == 0) continue;
        if (by_memory && !fits_now(engine, i)) {
            atlas_cli_progress_say(pg, "model %s: not loaded at start: it does not fit the "
                                   "memory budget beside those loaded before it (it loads "
                                   "on its first request)", a->models[i].name);
            continue;
        }
        n++;
        atlas_cli_progress_begin(pg, a->models[i].name);
        warm_job w = {engine, a->models[i].name, &su->tokenizer[i]};
        pthread_t warm;
        bool warming = pthread_create(&warm, NULL, warm_main, &w) == 0;
        atlas_status st = atlas_engine_load(engine, a->models[i].name);
        if (warming) pthread_join(warm, NULL);
        char device[32] = "";
        if (st == ATLAS_OK) {
            atlas_engine_model_status ms[MAX_MODELS];
            atlas_engine_models(engine, ms, MAX_MODELS);
            device_name(a, ms[i].backend, device, sizeof device);
        }
        atlas_cli_progress_end(pg, st == ATLAS_OK, device);
        if (st != ATLAS_OK) {
            atlas_cli_progress_say(pg, "model %s: not loaded: %s", a->models[i].name,
                                   atlas_last_error());
            atlas_cli_device_hint("serve", a->ep.device);
        }
    }
}

/* The engine's residency events go to the server's log; the lock lets the main thread
 * take the server away before it stops it, while the scheduler may still be telling. */
typedef struct residency_log {
    pthread_mutex_t mu;
    atlas_server *server; /* NULL: no longer logged (the server is stopping) */
    atlas_cli_startup *startup; /* the models' first loads' times, for the start's log */
} residency_log;

static void on_residency(void *user, const atlas_residency_event *ev) {
    residency_log *rl = user;
    pthread_mutex_lock(&rl->mu);
    if (rl->startup) atlas_cli_startup_note(rl->startup, ev);
    if (rl->server) atlas_server_log_residency(rl->server, ev);
    pthread_mutex_unlock(&rl->mu);
}

static void residency_log_to(residency_log *rl, atlas_server *server) {
    pthread_mutex_lock(&rl->mu);
    rl->server = server;
    pthread_mutex_unlock(&rl->mu);
}

static void format_params(int64_t n, char *buf, size_t cap) {
    if (n >= 1000000000) snprintf(buf, cap, "%.2fB", n / 1e9);
    else snprintf(buf, cap, "%.1fM", n / 1e6);
}

/* Every model checked as far as it can be without loading it (atlas_model_inspect: its
 * files, headers, architecture, and memory for its weights and the KV pool the engine gave
 * it), one line each, so that a model that cannot load is found at start and not by its
 * first request. */
static void check_models(const serve_args *a, atlas_engine *engine, atlas_server *server) {
    atlas_engine_model_status ms[MAX_MODELS];
    int n = atlas_engine_models(engine, ms, MAX_MODELS);
    atlas_model_params mp = atlas_model_default_params();
    mp.device = a->ep.device;
    mp.gpu = a->ep.gpu;
    /* The GPU's free memory as it was when the host bound (nothing allocated since): asking
     * the driver now (cuMemGetInfo) would wait while atlas_host_start pins the staging pool,
     * about 0.3 s, and the first load, which starts after these checks, with it. */
    atlas_host *host = NULL;
    size_t at_bind = 0;
    if (a->ep.device != ATLAS_DEVICE_CPU && a->tp == 1) {
        if (atlas_host_get(a->ep.gpu, &host) == ATLAS_OK)
            at_bind = atlas_host_properties(host)->free_at_bind;
        atlas_error_clear(); /* no GPU: the models say so on the CPU's figures */
    }
    mp.no_memory_check = at_bind > 0; /* the survey asks the device nothing */
    for (int i = 0; i < n && i < MAX_MODELS; i++) {
        atlas_model_survey sv;
        atlas_status st = atlas_model_inspect(ms[i].dir, &mp, &sv);
        if (st == ATLAS_OK && at_bind) { /* bound: the survey chose the GPU */
            sv.available_bytes = at_bind;
            snprintf(sv.available_what, sizeof sv.available_what, "free memory of cuda:%d at "
                     "start", a->ep.gpu);
        }
        if (st != ATLAS_OK) {
            atlas_server_log(server, ATLAS_LOG_ERROR, "model %s: cannot load: %s", ms[i].name,
                             atlas_last_error());
            continue;
        }
        char params[32];
        format_params(sv.n_params, params, sizeof params);
        size_t need = sv.weight_bytes + ms[i].kv_bytes;
        if (sv.available_what[0] && need > sv.available_bytes && !a->ep.no_memory_check) {
            atlas_server_log(server, ATLAS_LOG_ERROR, "model %s: cannot load: it needs %.2f GiB "
                             "(weights %.2f, KV cache %.2f) and %.2f GiB is available (%s); "
                             "lower --kv-memory or --ctx-size, or pass --no-memory-check",
                             ms[i].name, need / 1073741824.0, sv.weight_bytes / 1073741824.0,
                             ms[i].kv_bytes / 1073741824.0, sv.available_bytes / 1073741824.0,
                             sv.available_what);
            continue;
        }
        atlas_server_log(server, ATLAS_LOG_INFO, "model %s: ok: %s, %s parameters, %s, %.2f GiB "
                         "of weights%s", ms[i].name, sv.architecture, params, sv.dtype,
                         sv.weight_bytes / 1073741824.0,
                         sv.has_tokenizer ? "" : "; no tokenizer.json: its requests will fail");
    }
}

/* The start banner: each model (directory, architecture, parameters, dtype, device, memory,
 * KV capacity, context), the memory of all that is loaded, then the URL. */
static void print_banner(const serve_args *a, atlas_engine *engine, atlas_server *server) {
    atlas_engine_model_status ms[MAX_MODELS];
    int n = atlas_engine_models(engine, ms, MAX_MODELS);
    double total = 0;
    for (int i = 0; i < n && i < MAX_MODELS; i++) {
        const atlas_engine_model_status *m = &ms[i];
        if (!m->resident) {
            atlas_server_log(server, ATLAS_LOG_INFO, "model %s: dir %s, not loaded (loads on "
                             "its first request), kv %ld tokens of %s, context %d tokens",
                             m->name, m->dir, m->kv_tokens, m->kv_dtype, m->ctx_size);
        } else {
            char device[32];
            device_name(a, m->backend, device, sizeof device);
            double gib = (m->weight_bytes + m->kv_bytes) / 1073741824.0;
            total += gib;
            char params[32];
            if (m->n_params >= 1000000000) snprintf(params, sizeof params, "%.2fB", m->n_params / 1e9);
            else snprintf(params, sizeof params, "%.1fM", m->n_params / 1e6);
            atlas_server_log(server, ATLAS_LOG_INFO, "model %s: dir %s, %s, %s parameters, "
                             "%s, device %s, memory %.2f GiB (weights %.2f, kv %.2f), kv %ld "
                             "tokens of %s, context %d tokens (model maximum %d)", m->name,
                             m->dir, m->architecture, params, m->dtype, device, gib,
                             m->weight_bytes / 1073741824.0, m->kv_bytes / 1073741824.0,
                             m->kv_tokens, m->kv_dtype, m->ctx_size, m->max_ctx);
        }
        if (m->note[0]) atlas_server_log(server, ATLAS_LOG_INFO, "model %s: %s", m->name, m->note);
    }
    /* where the loaded models run; with none loaded, what --device asked */
    char dev[32] = "";
    for (int i = 0; i < n && i < MAX_MODELS && !dev[0]; i++)
        if (ms[i].resident) device_name(a, ms[i].backend, dev, sizeof dev);
    if (!dev[0])
        snprintf(dev, sizeof dev, "%s", a->ep.device == ATLAS_DEVICE_CPU ? "cpu"
                                        : a->ep.device == ATLAS_DEVICE_CUDA ? "cuda" : "auto");
    atlas_engine_metrics em;
    atlas_engine_get_metrics(engine, &em);
    char budget[64] = "";
    if (em.memory_budget)
        snprintf(budget, sizeof budget, ", budget %.2f GiB", em.memory_budget / 1073741824.0);
    atlas_server_log(server, ATLAS_LOG_INFO, "device %s; memory used %.2f GiB by %d loaded "
                     "model(s) of %d%s", dev, total, count_resident(ms, n), n, budget);
    const char *addr = atlas_server_address(server);
    bool v6 = strchr(addr, ':') != NULL;
    bool keyed = a->sp.api_key && *a->sp.api_key; /* the server takes "" for none */
    if (!atlas_server_loopback(server) && !keyed)
        atlas_server_log(server, ATLAS_LOG_WARN, "%s is not a loopback address and no API key "
                         "is set: anyone who can reach it can use the models (set --api-key or "
                         "ATLAS_API_KEY, or listen on 127.0.0.1)", a->sp.host);
    char named[300] = "";
    if (strcmp(addr, a->sp.host)) snprintf(named, sizeof named, " (%s)", a->sp.host);
    atlas_server_log(server, ATLAS_LOG_INFO, "listening on %s://%s%s%s:%d%s%s",
                     a->sp.ssl_certfile ? "https" : "http", v6 ? "[" : "", addr, v6 ? "]" : "",
                     atlas_server_port(server), named,
                     keyed ? " (API key required)" : "");
}

static void release_args(serve_args *a) {
    for (int i = 0; i < a->n_owned; i++) free(a->owned[i]);
    serve_preset_free(&a->preset);
}

int atlas_cli_serve(int argc, char **argv) {
    static serve_args a; /* large; one per process */
    static atlas_cli_startup su;
    memset(&a, 0, sizeof a);
    su.t0 = atlas_cli_process_start_ms();
    a.ep = atlas_engine_default_params();
    a.ep.cpu_activations = ATLAS_CPU_ACT_AUTO;
    a.sp = atlas_server_default_params();
    const char *env_key = getenv("ATLAS_API_KEY");
    if (env_key && *env_key) a.sp.api_key = env_key;
    a.tp = 1;
    a.sp.log_fd = 2; /* the log is stderr; stdout stays empty */
    a.ep.keep_alive_ms = 5 * 60 * 1000; /* Ollama's default */
    for (int i = 0; i < MAX_MODELS; i++) a.load[i] = -1;
    int rc = parse_args(argc, argv, &a);
    if (rc == 0 && atlas_tp_preflight(a.tp) != ATLAS_OK) { /* before any model loads */
        fprintf(stderr, "atlas serve: --tensor-parallel %d: %s\n", a.tp, atlas_last_error());
        release_args(&a);
        return 1;
    }
    if (rc == 0 && a.n_models == 0) rc = add_model(&a, atlas_cli_default_model()) ? 2 : 0;
    if (rc == 0) rc = apply_overrides(&a);
    if (rc) {
        release_args(&a);
        return rc == 1 ? 0 : 2;
    }
    a.ep.models = a.models;
    a.ep.n_models = a.n_models;
    mark_warm(&a);
    /* The GPU's set-up (driver, context, staging, cuBLASLt: about half a second) on threads
     * of its own from here, beside the socket, the models' checks and the first load's file
     * work; whatever needs the host waits for it there.  With tensor parallelism the ranks
     * bind their own. */
    if (a.ep.device != ATLAS_DEVICE_CPU && a.tp == 1) atlas_host_start(a.ep.gpu);
    a.sp.start_ms = su.t0;
    su.n_models = a.n_models < ATLAS_CLI_STARTUP_MODELS ? a.n_models : ATLAS_CLI_STARTUP_MODELS;
    for (int i = 0; i < su.n_models; i++) su.names[i] = a.models[i].name;

    raise_fd_limit(a.sp.max_connections);
    /* The socket first: a port in use or a host that does not resolve ends the start at
     * once, before a model is read (an 8B takes a minute on the CPU). */
    atlas_server *server = NULL;
    if (atlas_server_create(&a.sp, &server) != ATLAS_OK) {
        fprintf(stderr, "atlas serve: %s\n", atlas_last_error());
        atlas_host_start_wait(); /* exit only once the set-up's threads are done */
        release_args(&a);
        return 1;
    }
    static residency_log rl = {.mu = PTHREAD_MUTEX_INITIALIZER};
    rl.server = server;
    rl.startup = &su;
    a.ep.on_residency = on_residency;
    a.ep.on_residency_user = &rl;
    atlas_cli_progress *pg = atlas_cli_progress_new(stderr);
    a.ep.load_progress = atlas_cli_progress_report;
    a.ep.load_progress_user = pg;
    if (a.sp.log_format == ATLAS_LOG_JSON) atlas_cli_progress_json(pg);
    atlas_engine *engine = NULL;
    atlas_status st = atlas_engine_create(&a.ep, &engine);
    if (st == ATLAS_OK) {
        check_models(&a, engine, server);
        su.checked = atlas_cli_now_ms();
        load_at_start(&a, engine, pg, &su);
    }
    atlas_cli_progress_mute(pg); /* stderr is the server's log from here on */
    if (st == ATLAS_OK) st = atlas_server_serve(server, engine);
    if (st != ATLAS_OK) {
        fprintf(stderr, "atlas serve: %s\n", atlas_last_error());
        residency_log_to(&rl, NULL);
        atlas_server_stop(server);
        atlas_engine_free(engine);
        atlas_cli_progress_free(pg);
        atlas_host_start_wait();
        release_args(&a);
        return 1;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    double listening = atlas_cli_now_ms();
    print_banner(&a, engine, server);
    pthread_mutex_lock(&rl.mu); /* loads from here on are not the start's */
    rl.startup = NULL;
    pthread_mutex_unlock(&rl.mu);
    atlas_cli_startup_log(&su, server, listening);

    while (!stop_requested) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    atlas_server_log(server, ATLAS_LOG_INFO, "stopping");
    residency_log_to(&rl, NULL);
    atlas_server_stop(server);
    atlas_engine_free(engine);
    atlas_cli_progress_free(pg);
    atlas_host_start_wait(); /* a stop within the set-up's first second */
    release_args(&a);
    if (a.sp.log_format == ATLAS_LOG_TEXT) fprintf(stderr, "atlas serve: stopped\n");
    return 0;
}

/* cli/chat.c — `atlas chat`: a conversation in the terminal, as `ollama run` has it. Each turn
 * is the whole conversation put through the model's own chat template (the user's strings
 * shielded, as the server does, so typed text cannot forge a control token) and answered
 * token by token, either by an engine in this process (-m DIR, the client `atlas run` is)
 * or by a running `atlas serve` over its streamed /v1/chat/completions (--url, through
 * cli/chat_http.c). At a terminal, lines are edited with libedit (history on the up arrow),
 * a line ending in "\" or a block between """ marks spans lines, slash commands change the
 * system prompt, the sampling and the model, and Ctrl-C stops the answer being written,
 * not the program; elsewhere stdin is read line by line without prompts, for scripts. */
#include <errno.h>
#include <histedit.h>
#include <jansson.h>
#include <locale.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>

#include "atlas/engine.h"
#include "atlas/model.h"
#include "atlas/sampler.h"
#include "atlas/shield.h"
#include "atlas/template.h"
#include "atlas/tokenizer.h"
#include "cli/chat_http.h"
#include "cli/cli.h"
#include "cli/options.h"

/* Set by SIGINT (and by a ^C byte read while libedit has the terminal): stops an answer, or
 * abandons the input being typed. */
static volatile sig_atomic_t chat_sigint;
static int chat_line_empty; /* nothing was typed on the line a Ctrl-C abandoned */

static void on_sigint(int sig) {
    (void)sig;
    chat_sigint = 1;
}

typedef struct chat {
    /* the command line */
    const char *model; /* -m: a directory in process, a served model's name with --url */
    const char *url, *api_key;
    atlas_cli_device dev; /* --device, --threads, --ctx-size (in process) */
    /* sampling: what /set (or a flag) gave, over the model's generation_config.json */
    float temp, top_p, min_p;
    int top_k, max_tokens;
    unsigned long long seed;
    int set_temp, set_top_p, set_top_k, set_min_p, set_seed;
    atlas_generation_defaults gen;
    /* the conversation */
    char *system; /* NULL: none */
    json_t *turns; /* the user's and the model's messages, in order */
    int tty;       /* stdin is a terminal: prompts, libedit, a blank line after answers */
    int failed;    /* a turn failed (the exit status of a script) */
    int n_prompt, ctx; /* the last fitted conversation's tokens and the context (0: unknown) */
    /* in process */
    char *dir;
    char local[128]; /* its model's name: the directory's last component */
    atlas_engine *engine;
    const atlas_tokenizer *tok;
    const atlas_template *tmpl;
    /* over HTTP */
    chat_http *http;
    char *name;
    /* line editing */
    EditLine *el;
    History *hist;
} chat;

static const char *chat_prompt = ">>> ";

/* --- output ------------------------------------------------------------------------------- */

/* Notes (a command's answer, an error) go to stdout at a terminal, to stderr in a script so
 * that stdout holds the answers alone. */
static FILE *note_file(const chat *c) {
    return c->tty ? stdout : stderr;
}

static void help(const chat *c) {
    fprintf(note_file(c),
            "  /set temp T        temperature (0: greedy)\n"
            "  /set top_p P       nucleus sampling (1: off)\n"
            "  /set top_k K       keep the K most likely tokens (0: off)\n"
            "  /set min_p P       drop tokens below P times the most likely (0: off)\n"
            "  /set max N         tokens an answer may have (0, or more than the context\n"
            "                     leaves: until the context is full)\n"
            "  /set seed S        sampling seed (random: a new one each answer)\n"
            "  /set               show the settings\n"
            "  /system TEXT       set the system prompt (/system alone removes it)\n"
            "  /clear             forget the conversation (the system prompt stays)\n"
            "  /load %-12s switch to another model\n"
            "  /help              this list\n"
            "  /bye               quit (Ctrl-D too)\n"
            "  A line ending in \\ goes on on the next line; \"\"\" opens and closes a block of\n"
            "  lines. Ctrl-C stops an answer; at an empty prompt, twice, it quits.\n",
            c->http ? "NAME" : "DIR");
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: atlas chat [-m DIR] [options]\n"
            "       atlas chat --url URL [--model NAME] [--api-key KEY] [options]\n"
            "  A conversation with a model in the terminal, through its chat template, the\n"
            "  answer streamed as it is generated. /help inside lists the commands. With stdin\n"
            "  not a terminal, each line (or \\-continued lines, or a \"\"\" block) is one turn\n"
            "  and stdout holds the answers alone, one after the other.\n"
            "  -m, --model DIR      model directory, run in this process (default %s);\n"
            "                       with --url, the name of a model the server serves\n"
            "                       (default: the first it lists)\n"
            "  --url URL            talk to a running `atlas serve` (http://HOST:PORT) instead\n"
            "  --api-key KEY        the server's key (with --url)\n"
            "  --system TEXT        the system prompt\n"
            "  --temp T, --top-p P, --top-k K, --min-p P, --seed S, --max-tokens N\n"
            "                       sampling, as /set sets it (default: the model's\n"
            "                       generation_config.json; a new seed each answer; no limit)\n"
            "  --ctx-size N         tokens the conversation may hold (default: the model's)\n"
            "  --device cpu|cuda[:N]|auto  (default auto: CUDA when usable, else the CPU)\n"
            "  --kernels native|portable  GPU code (default native; see atlas run --help)\n"
            "  --threads N          CPU threads (default: one per core)\n"
            "  --cpu-activations auto|fp32|bf16|int8  the CPU's matmuls (see atlas run --help)\n"
            "  --gpu-activations fp32|int8  a GPU's INT4 decode matmuls (see atlas run --help)\n"
            "  --kv-cache-dtype auto|bf16|fp8  the KV cache's elements (see atlas run --help)\n"
            "  --no-memory-check    load even when the model needs more memory than is free\n"
            "  -h, --help           this help\n",
            atlas_cli_default_model());
}

/* --- settings ------------------------------------------------------------------------------ */

static int parse_num(const char *what, const char *s, double lo, double hi, double *out,
                     const char *who) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "%s: %s: '%s' is not a number in %g..%g\n", who, what, s, lo, hi);
        return 1;
    }
    *out = v;
    return 0;
}

/* Sets one knob by its name (temp, top_p, top_k, min_p, max, seed; the flags' spellings
 * too). 0 done, 1 bad value, 2 unknown knob. */
static int set_knob(chat *c, const char *k, const char *v, const char *who) {
    double d;
    if (!strcmp(k, "temp") || !strcmp(k, "temperature") || !strcmp(k, "--temp")) {
        if (parse_num("temp", v, 0, 100, &d, who)) return 1;
        c->temp = (float)d, c->set_temp = 1;
    } else if (!strcmp(k, "top_p") || !strcmp(k, "--top-p")) {
        if (parse_num("top_p", v, 0, 1, &d, who)) return 1;
        c->top_p = (float)d, c->set_top_p = 1;
    } else if (!strcmp(k, "min_p") || !strcmp(k, "--min-p")) {
        if (parse_num("min_p", v, 0, 1, &d, who)) return 1;
        c->min_p = (float)d, c->set_min_p = 1;
    } else if (!strcmp(k, "top_k") || !strcmp(k, "--top-k")) {
        if (parse_num("top_k", v, 0, 1 << 30, &d, who) || d != floor(d)) return 1;
        c->top_k = (int)d, c->set_top_k = 1;
    } else if (!strcmp(k, "max") || !strcmp(k, "max_tokens") || !strcmp(k, "--max-tokens")) {
        if (parse_num("max", v, 0, 1 << 24, &d, who) || d != floor(d)) return 1;
        c->max_tokens = (int)d;
    } else if (!strcmp(k, "seed") || !strcmp(k, "--seed")) {
        if (!strcmp(v, "random")) {
            c->set_seed = 0;
            return 0;
        }
        char *end;
        errno = 0;
        unsigned long long s = strtoull(v, &end, 10);
        if (errno || end == v || *end || v[0] == '-') {
            fprintf(stderr, "%s: seed: '%s' is not an unsigned integer (or 'random')\n", who, v);
            return 1;
        }
        c->seed = s, c->set_seed = 1;
    } else {
        return 2;
    }
    return 0;
}

static void show_settings(const chat *c) {
    FILE *f = note_file(c);
    fprintf(f, "  model: %s%s%s\n", c->http ? c->name : c->dir, c->http ? " at " : "",
            c->http ? c->url : "");
    if (c->set_temp) fprintf(f, "  temp %g\n", c->temp);
    else fprintf(f, "  temp %s\n", c->http ? "(the server's default)" : "(the model's default)");
    if (c->set_top_p) fprintf(f, "  top_p %g\n", c->top_p);
    if (c->set_top_k) fprintf(f, "  top_k %d\n", c->top_k);
    if (c->set_min_p) fprintf(f, "  min_p %g\n", c->min_p);
    fprintf(f, "  max %d%s\n", c->max_tokens, c->max_tokens ? "" : " (until the context is full)");
    if (c->set_seed) fprintf(f, "  seed %llu\n", c->seed);
    else fprintf(f, "  seed random\n");
    fprintf(f, "  system: %s\n", c->system ? c->system : "(none)");
}

/* The sampler for one in-process answer: generation_config.json's defaults under what was
 * set. */
static atlas_sampler_params sampling(const chat *c) {
    atlas_sampler_params sp = atlas_sampler_default_params();
    sp.temperature = c->set_temp ? c->temp : c->gen.temperature;
    if (c->set_top_p) sp.top_p = c->top_p;
    else if (c->gen.top_p > 0 && c->gen.top_p < 1) sp.top_p = c->gen.top_p;
    if (c->set_top_k) sp.top_k = c->top_k;
    else if (c->gen.top_k > 0) sp.top_k = c->gen.top_k;
    if (c->set_min_p) sp.min_p = c->min_p;
    sp.seed = c->set_seed ? c->seed : atlas_cli_random_seed();
    return sp;
}

/* --- the conversation ---------------------------------------------------------------------- */

/* The messages of the next request: the system prompt, then every turn. New reference. */
static json_t *messages(const chat *c) {
    json_t *m = json_array();
    if (m && c->system)
        json_array_append_new(m, json_pack("{s:s, s:s}", "role", "system", "content", c->system));
    size_t i;
    json_t *t;
    json_array_foreach(c->turns, i, t) json_array_append(m, t);
    return m;
}

static int add_turn(chat *c, const char *role, const char *text, size_t len) {
    json_t *t = json_pack("{s:s, s:s%}", "role", role, "content", text, len);
    return t ? json_array_append_new(c->turns, t) : -1;
}

/* What an answer writes as it comes, kept for the conversation. */
typedef struct answer {
    char *text;
    size_t len, cap, printed;
    int oom, reasoning; /* reasoning: the last piece printed was a thinking model's */
} answer;

static void answer_add(answer *a, const char *s, size_t n) {
    if (a->oom || !n) return;
    if (a->len + n + 1 > a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 256;
        while (cap < a->len + n + 1) cap *= 2;
        char *p = realloc(a->text, cap);
        if (!p) {
            a->oom = 1;
            return;
        }
        a->text = p, a->cap = cap;
    }
    memcpy(a->text + a->len, s, n);
    a->len += n;
    a->text[a->len] = 0;
}

/* Ends the answer's output on a line of its own (and a blank line at a terminal). */
static void answer_end(const chat *c, const answer *a, int printed_any) {
    if (printed_any && (!a->len || a->text[a->len - 1] != '\n')) putchar('\n');
    else if (!printed_any && !a->len) putchar('\n');
    if (c->tty) putchar('\n');
    fflush(stdout);
}

/* --- an answer from the engine in this process --------------------------------------------- */

typedef struct local_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    answer a;
    int done;
    atlas_finish finish;
    char message[512];
} local_wait;

/* On the engine's thread: keep the text for the main thread, which prints it. */
static void local_event(const atlas_event *ev, void *user) {
    local_wait *w = user;
    pthread_mutex_lock(&w->mu);
    answer_add(&w->a, ev->text, ev->text_len);
    if (ev->type == ATLAS_EVENT_END) {
        w->done = 1;
        w->finish = ev->finish;
        snprintf(w->message, sizeof w->message, "%s", ev->message ? ev->message : "");
    }
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* The conversation rendered and tokenized as the server does for /v1/chat/completions. */
static int local_prompt(chat *c, int32_t **ids, size_t *n) {
    json_t *m = messages(c);
    char *text = NULL;
    size_t *cuts = NULL, n_cuts = 0;
    atlas_template_input in = {m, NULL, NULL, true};
    atlas_status st = m ? atlas_shield_json(c->tok, m) : ATLAS_ERR_NOMEM;
    if (st == ATLAS_OK) st = atlas_template_render_pieces(c->tmpl, &in, &text, &cuts, &n_cuts);
    if (st == ATLAS_OK)
        st = atlas_shield_encode_pieces(c->tok, text, strlen(text), cuts, n_cuts, false, ids, n);
    if (st != ATLAS_OK)
        fprintf(stderr, "atlas chat: the chat template of %s: %s\n", c->dir, atlas_last_error());
    free(text);
    free(cuts);
    json_decref(m);
    return st == ATLAS_OK ? 0 : 1;
}

/* Waits for the answer, printing it as it comes; Ctrl-C cancels it. */
static void local_stream(local_wait *w, atlas_request_handle *h) {
    int cancelled = 0;
    char buf[4096];
    for (;;) {
        pthread_mutex_lock(&w->mu);
        while (!w->done && w->a.printed == w->a.len && !(chat_sigint && !cancelled)) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 50 * 1000000;
            if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
            pthread_cond_timedwait(&w->cv, &w->mu, &ts);
        }
        size_t n = w->a.len - w->a.printed;
        if (n > sizeof buf) n = sizeof buf;
        memcpy(buf, w->a.text + w->a.printed, n);
        w->a.printed += n;
        int done = w->done && w->a.printed == w->a.len;
        pthread_mutex_unlock(&w->mu);
        fwrite(buf, 1, n, stdout);
        fflush(stdout);
        if (chat_sigint && !cancelled) atlas_engine_cancel(h), cancelled = 1;
        if (done) break;
    }
}

/* Answers the conversation's last user turn. 0 answered (or stopped by Ctrl-C), 1 failed. */
static int local_answer(chat *c, answer *out) {
    int32_t *ids = NULL;
    size_t n = 0;
    if (local_prompt(c, &ids, &n)) return 1;
    local_wait w = {0};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    /* a limit past what the context leaves is the context's end, not an error */
    int ctx = 0, max = c->max_tokens;
    if (atlas_engine_ctx_size(c->engine, c->local, &ctx) == ATLAS_OK && (size_t)max + n > (size_t)ctx)
        max = 0;
    atlas_request req = {.model = c->local, .prompt = ids, .n_prompt = n,
                         .sampling = sampling(c), .max_tokens = max};
    atlas_request_handle *h = NULL;
    int rc = 0;
    chat_sigint = 0;
    atlas_status st = atlas_engine_submit(c->engine, &req, local_event, &w, &h);
    if (st != ATLAS_OK) {
        fprintf(stderr, "atlas chat: %s%s\n", atlas_last_error(),
                st == ATLAS_ERR_RANGE ? " (/clear forgets the conversation)" : "");
        rc = 1;
    } else {
        local_stream(&w, h);
        atlas_engine_handle_free(h);
        answer_end(c, &w.a, 1);
        if (w.finish == ATLAS_FINISH_ERROR) {
            fprintf(stderr, "atlas chat: %s\n", w.message);
            rc = 1;
        }
        if (w.a.oom) {
            fprintf(stderr, "atlas chat: out of memory keeping the answer\n");
            rc = 1;
        }
    }
    free(ids);
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    *out = w.a;
    return rc;
}

/* Creates an engine for dir and loads its model, tokenizer and template; the old engine
 * is freed first (its memory may be what the new one needs) and made again if the new one
 * fails. SIGINT is blocked in the engine's threads so that it reaches this one. */
static int load_dir(chat *c, const char *dir) {
    if (atlas_cli_check_model("chat", dir)) return 1;
    char name[sizeof c->local];
    atlas_cli_model_name(dir, name, sizeof name);
    atlas_engine_model mod = {.name = name, .dir = dir};
    atlas_engine_params p = atlas_cli_one_model(&mod, &c->dev);
    atlas_generation_defaults gen;
    if (atlas_model_generation_defaults(dir, &gen) != ATLAS_OK) {
        fprintf(stderr, "atlas chat: %s\n", atlas_last_error());
        return 1;
    }
    atlas_engine_free(c->engine); /* its tokenizer and template go with it */
    c->engine = NULL, c->tok = NULL, c->tmpl = NULL;
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    atlas_engine *e = NULL;
    atlas_status st = atlas_engine_create(&p, &e);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    const atlas_tokenizer *tok = NULL;
    const atlas_template *tmpl = NULL;
    if (st == ATLAS_OK) st = atlas_engine_tokenizer(e, name, &tok);
    if (st == ATLAS_OK) st = atlas_engine_template(e, name, &tmpl);
    if (st == ATLAS_ERR_NOT_FOUND)
        fprintf(stderr, "atlas chat: %s has no chat template (atlas run continues a prompt "
                "without one)\n", dir);
    else if (st == ATLAS_OK) st = atlas_engine_load(e, name);
    if (st != ATLAS_OK && st != ATLAS_ERR_NOT_FOUND) {
        fprintf(stderr, "atlas chat: %s\n", atlas_last_error());
        atlas_cli_device_hint("chat", c->dev.device);
    }
    if (st != ATLAS_OK) {
        atlas_engine_free(e);
        if (c->dir && strcmp(c->dir, dir)) load_dir(c, c->dir); /* back to the one we had */
        return 1;
    }
    atlas_engine_model_status ms;
    atlas_engine_models(e, &ms, 1);
    if (ms.note[0]) fprintf(stderr, "atlas chat: %s\n", ms.note);
    char *d = strdup(dir);
    if (!d) {
        atlas_engine_free(e);
        fprintf(stderr, "atlas chat: out of memory\n");
        return 1;
    }
    free(c->dir);
    c->dir = d;
    snprintf(c->local, sizeof c->local, "%s", name);
    c->engine = e, c->tok = tok, c->tmpl = tmpl, c->gen = gen;
    return 0;
}

/* --- an answer from a server ---------------------------------------------------------------- */

static void http_text(void *user, int reasoning, const char *text, size_t len) {
    answer *a = user;
    if (a->reasoning && !reasoning) fputs("\n\n", stdout); /* the thinking, then the answer */
    a->reasoning = reasoning;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    if (!reasoning) answer_add(a, text, len);
}

static int http_answer(chat *c, answer *out) {
    json_t *body = json_pack("{s:s, s:o, s:b}", "model", c->name, "messages", messages(c),
                             "stream", 1);
    if (c->set_temp) json_object_set_new(body, "temperature", json_real(c->temp));
    if (c->set_top_p) json_object_set_new(body, "top_p", json_real(c->top_p));
    if (c->set_top_k) json_object_set_new(body, "top_k", json_integer(c->top_k));
    if (c->set_min_p) json_object_set_new(body, "min_p", json_real(c->min_p));
    if (c->set_seed) json_object_set_new(body, "seed", json_integer((json_int_t)c->seed));
    /* a limit past what the context leaves is the context's end (the server would refuse
     * it) */
    if (c->max_tokens > 0 && (!c->ctx || c->n_prompt + c->max_tokens <= c->ctx))
        json_object_set_new(body, "max_tokens", json_integer(c->max_tokens));
    char *s = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!s) {
        fprintf(stderr, "atlas chat: out of memory\n");
        return 1;
    }
    char err[512] = "";
    answer a = {0};
    chat_sigint = 0;
    int rc = chat_http_stream(c->http, s, http_text, &a, &chat_sigint, err, sizeof err);
    free(s);
    if (rc != 1 || a.len || c->tty) answer_end(c, &a, 1); /* a script's stdout: answers only */
    if (rc == 1) fprintf(stderr, "atlas chat: %s: %s\n", c->url, err);
    *out = a;
    return rc == 1;
}

/* --- fitting the conversation into the context ----------------------------------------------- */

/* The tokens of the conversation as the next request renders it, and the context: 0, 1 on
 * an error (said), 2 when a server cannot say (the request then goes as it is). */
static int count_tokens(chat *c, int *n, int *ctx) {
    if (!c->http) {
        int32_t *ids = NULL;
        size_t len = 0;
        if (local_prompt(c, &ids, &len)) return 1;
        free(ids);
        *n = (int)len;
        return atlas_engine_ctx_size(c->engine, c->local, ctx) == ATLAS_OK ? 0 : 2;
    }
    json_t *body = json_pack("{s:s, s:o}", "model", c->name, "messages", messages(c));
    char *s = body ? json_dumps(body, JSON_COMPACT) : NULL, err[512];
    json_decref(body);
    int rc = s ? chat_http_count(c->http, s, n, ctx, err, sizeof err) : 1;
    free(s);
    return rc ? 2 : 0;
}

/* Room an answer needs beside the prompt: its limit (/set max) when set, else a quarter of
 * the context; at most half of it, so that a long limit does not empty the conversation. */
static int answer_room(const chat *c, int ctx) {
    int room = c->max_tokens > 0 ? c->max_tokens : ctx / 4;
    return room < ctx / 2 ? room : ctx / 2;
}

/* Makes the conversation, its new user turn last, fit the context with room for an answer:
 * the oldest exchanges (a user turn and its answer; the system prompt stays) are dropped,
 * said in one line on stderr.  0 ready (c->n_prompt, c->ctx: its size, 0 when unknown), 1
 * when the new turn alone does not fit (said; the conversation then stays as it was). */
static int fit(chat *c) {
    int n = 0, ctx = 0, dropped = 0, rc;
    c->n_prompt = c->ctx = 0;
    json_t *before = json_copy(c->turns); /* shallow: the same messages */
    if (!before) return fprintf(stderr, "atlas chat: out of memory\n"), 1;
    while ((rc = count_tokens(c, &n, &ctx)) == 0 && n + answer_room(c, ctx) > ctx) {
        if (json_array_size(c->turns) < 3) break; /* the new turn alone */
        json_array_remove(c->turns, 0);
        json_array_remove(c->turns, 0);
        dropped++;
    }
    if (rc == 0 && n >= ctx)
        fprintf(stderr, "atlas chat: this message has %d tokens in the chat template%s; the "
                "context holds %d: not sent\n", n, c->system ? " with the system prompt" : "",
                ctx);
    if (rc == 1 || (rc == 0 && n >= ctx)) {
        json_decref(c->turns);
        c->turns = before;
        return 1;
    }
    json_decref(before);
    if (dropped)
        fprintf(stderr, "atlas chat: dropped the %d oldest turn%s (a message and its answer) to "
                "fit the %d-token context (/clear forgets the conversation)\n", dropped,
                dropped == 1 ? "" : "s", ctx);
    if (rc == 0) c->n_prompt = n, c->ctx = ctx;
    return 0;
}

/* Sends text as the user's turn and streams the answer; the answer joins the conversation
 * (cut where Ctrl-C stopped it); a failed turn leaves the conversation as it was (less the
 * exchanges dropped to fit it into the context). */
static void turn(chat *c, const char *text) {
    if (!c->http && !c->engine) { /* a /load failed, and so did loading the model back */
        fprintf(stderr, "atlas chat: no model is loaded (/load DIR)\n");
        c->failed = 1;
        return;
    }
    if (add_turn(c, "user", text, strlen(text))) {
        fprintf(stderr, "atlas chat: out of memory\n");
        c->failed = 1;
        return;
    }
    if (fit(c)) {
        json_array_remove(c->turns, json_array_size(c->turns) - 1);
        c->failed = 1;
        return;
    }
    answer a = {0};
    int rc = c->http ? http_answer(c, &a) : local_answer(c, &a);
    if (rc || add_turn(c, "assistant", a.text ? a.text : "", a.len)) {
        json_array_remove(c->turns, json_array_size(c->turns) - 1);
        c->failed = 1;
    }
    free(a.text);
}

/* --- commands ------------------------------------------------------------------------------- */

static const char *const commands[] = {"/set", "/system", "/clear", "/load", "/help", "/bye",
                                       "/exit", "/?", NULL};

/* Runs a /command. 1 when it asks to quit, else 0. */
static int command(chat *c, char *line) {
    char *arg = line + strcspn(line, " \t");
    if (*arg) *arg++ = 0;
    arg += strspn(arg, " \t");
    size_t al = strlen(arg);
    while (al && (arg[al - 1] == ' ' || arg[al - 1] == '\t')) arg[--al] = 0;
    FILE *f = note_file(c);
    if (!strcmp(line, "/bye") || !strcmp(line, "/exit")) return 1;
    if (!strcmp(line, "/help") || !strcmp(line, "/?")) {
        help(c);
    } else if (!strcmp(line, "/clear")) {
        json_array_clear(c->turns);
        fprintf(f, "Cleared the conversation.\n");
    } else if (!strcmp(line, "/system")) {
        free(c->system);
        c->system = *arg ? strdup(arg) : NULL;
        fprintf(f, *arg ? "Set the system prompt.\n" : "Removed the system prompt.\n");
    } else if (!strcmp(line, "/set") && !*arg) {
        show_settings(c);
    } else if (!strcmp(line, "/set")) {
        char *v = arg + strcspn(arg, " \t");
        if (*v) *v++ = 0;
        v += strspn(v, " \t");
        int rc = *v ? set_knob(c, arg, v, "/set") : 2;
        if (rc == 2)
            fprintf(stderr, "/set %s: want /set temp|top_p|top_k|min_p|max|seed VALUE\n", arg);
        else if (rc == 0) fprintf(f, "Set %s to %s.\n", arg, v);
    } else if (!strcmp(line, "/load") && !*arg) {
        fprintf(stderr, "/load: want /load %s\n", c->http ? "NAME" : "DIR");
    } else if (!strcmp(line, "/load") && c->http) {
        char *n = strdup(arg);
        if (n) free(c->name), c->name = n;
        fprintf(f, "Talking to %s.\n", c->name);
    } else if (!strcmp(line, "/load")) {
        if (!load_dir(c, arg)) fprintf(f, "Loaded %s.\n", c->dir);
        else c->failed = 1;
    } else {
        const char *near = atlas_cli_nearest_option(line, commands);
        fprintf(stderr, "unknown command '%s'", line);
        if (near) fprintf(stderr, "; did you mean '%s'?\n", near);
        else fprintf(stderr, " (/help lists them)\n");
    }
    fflush(f);
    return 0;
}

/* --- reading input ------------------------------------------------------------------------- */

static char *prompt_fn(EditLine *el) {
    (void)el;
    return (char *)chat_prompt;
}

/* libedit's character reader: poll() so that a Ctrl-C (the signal, or its byte where the
 * terminal passes it on) ends el_gets at once, which libedit's own reader does not. */
static int getc_fn(EditLine *el, wchar_t *wc) {
    static mbstate_t mb;
    for (;;) {
        if (chat_sigint) {
            const LineInfo *li = el_line(el);
            chat_line_empty = li->lastchar == li->buffer;
            memset(&mb, 0, sizeof mb);
            errno = EINTR;
            return -1;
        }
        struct pollfd p = {STDIN_FILENO, POLLIN, 0};
        int n = poll(&p, 1, 200);
        if (n <= 0) {
            if (n < 0 && errno != EINTR) return -1;
            continue;
        }
        char b;
        ssize_t r = read(STDIN_FILENO, &b, 1);
        if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (r <= 0) return (int)r;
        if (b == 3) {
            chat_sigint = 1;
            continue;
        }
        size_t k = mbrtowc(wc, &b, 1, &mb);
        if (k == (size_t)-2) continue; /* more bytes of the character to come */
        if (k == (size_t)-1) {
            memset(&mb, 0, sizeof mb);
            *wc = 0xFFFD;
        }
        return 1;
    }
}

static int editor_start(chat *c) {
    c->el = el_init("atlas", stdin, stdout, stderr);
    c->hist = history_init();
    if (!c->el || !c->hist) {
        fprintf(stderr, "atlas chat: libedit could not start on this terminal\n");
        return 1;
    }
    HistEvent ev;
    history(c->hist, &ev, H_SETSIZE, 1000);
    history(c->hist, &ev, H_SETUNIQUE, 1);
    el_set(c->el, EL_EDITOR, "emacs");
    el_set(c->el, EL_HIST, history, c->hist);
    el_set(c->el, EL_PROMPT, prompt_fn);
    el_set(c->el, EL_GETCFN, getc_fn);
    return 0;
}

/* One line without its newline into *line (malloc'd). 1 a line, 0 end of input, -1 Ctrl-C
 * (with *empty: nothing had been typed on it). */
static int read_line(chat *c, const char *prompt, char **line, int *empty) {
    *line = NULL;
    *empty = 1;
    if (!c->tty) {
        size_t cap = 0;
        ssize_t n = getline(line, &cap, stdin);
        if (n < 0) return free(*line), *line = NULL, 0;
        if (n && (*line)[n - 1] == '\n') (*line)[--n] = 0;
        if (n && (*line)[n - 1] == '\r') (*line)[--n] = 0;
        return 1;
    }
    chat_prompt = prompt;
    chat_sigint = 0;
    int count = 0;
    const char *s = el_gets(c->el, &count);
    if (chat_sigint) {
        chat_sigint = 0;
        *empty = chat_line_empty;
        fputc('\n', stdout);
        return -1;
    }
    if (!s) return 0;
    size_t n = strlen(s);
    if (n && s[n - 1] == '\n') n--;
    if (!(*line = strndup(s, n))) return 0;
    HistEvent ev;
    if (n) history(c->hist, &ev, H_ENTER, *line);
    return 1;
}

static int append(char **buf, size_t *len, const char *s, size_t n) {
    char *p = realloc(*buf, *len + n + 2);
    if (!p) return -1;
    memcpy(p + *len, s, n);
    *len += n;
    p[*len] = 0;
    *buf = p;
    return 0;
}

/* One turn's input: a line, lines joined by a trailing "\", or a """ block. 1 with *text
 * (malloc'd; *single: it was one line, where a /command may be), 0 end of input, -1 Ctrl-C
 * (*empty: at an empty prompt). */
static int read_input(chat *c, char **text, int *single, int *empty) {
    char *line, *buf = NULL;
    size_t len = 0;
    int rc = read_line(c, ">>> ", &line, empty), block = 0, first = 1;
    *single = 1;
    while (rc == 1) {
        const char *s = line;
        size_t n = strlen(s);
        int more = 0;
        if (first && !strncmp(s, "\"\"\"", 3)) block = 1, s += 3, n -= 3;
        if (block) {
            int closes = n >= 3 && !strcmp(s + n - 3, "\"\"\"");
            if (closes) n -= 3;
            more = !closes;
            /* a """ alone on the first line opens the block and adds nothing */
            if (append(&buf, &len, s, n) || (more && !(first && n == 0) &&
                                             append(&buf, &len, "\n", 1)))
                break;
        } else if (n && s[n - 1] == '\\') {
            more = 1;
            if (append(&buf, &len, s, n - 1) || append(&buf, &len, "\n", 1)) break;
        } else if (append(&buf, &len, s, n)) {
            break;
        }
        free(line);
        line = NULL;
        if (!more) break;
        *single = first = 0;
        rc = read_line(c, "... ", &line, empty);
        *empty = 0; /* Ctrl-C in a block abandons the block but does not quit */
        if (rc == 0) rc = 1, line = strdup(""), block = 0; /* the input ended inside */
        if (!line) break;
    }
    free(line);
    if (rc != 1) {
        free(buf);
        return rc;
    }
    if (!buf) buf = strdup("");
    while (buf && !*single && len && buf[len - 1] == '\n') buf[--len] = 0;
    *text = buf;
    return buf ? 1 : 0;
}

/* --- the program ---------------------------------------------------------------------------- */

static const char *const chat_options[] = {
    "-h", "--help", "-m", "--model", "--url", "--api-key", "--system", "--temp", "--top-p",
    "--top-k", "--min-p", "--seed", "--max-tokens", "--ctx-size", "--device", "--threads",
    "--kernels", "--no-memory-check", "--cpu-activations", "--gpu-activations",
    "--kv-cache-dtype", NULL};

/* Returns -1 to go on, else the exit status (help: 0, usage error: 2). */
static int parse_opt(chat *c, int argc, char **argv, int *i) {
    const char *a = atlas_cli_resolve_option(argv[*i], chat_options);
    if (!atlas_cli_known_option(a, chat_options))
        return atlas_cli_unknown_option("chat", a, chat_options);
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(a, "--no-memory-check")) {
        c->dev.no_memory_check = 1;
        return -1;
    }
    if (*i + 1 >= argc) {
        fprintf(stderr, "atlas chat: %s needs a value (see --help)\n", a);
        return 2;
    }
    const char *v = argv[++*i];
    double d;
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) c->model = v;
    else if (!strcmp(a, "--url")) c->url = v;
    else if (!strcmp(a, "--api-key")) c->api_key = v;
    else if (!strcmp(a, "--system")) {
        free(c->system);
        if (!(c->system = strdup(v))) return 1;
    } else if (!strcmp(a, "--ctx-size")) {
        if (parse_num(a, v, 0, INT32_MAX, &d, "atlas chat") || d != floor(d)) return 2;
        c->dev.ctx = (int)d;
    } else if (!strcmp(a, "--threads")) {
        if (parse_num(a, v, 1, 1024, &d, "atlas chat") || d != floor(d)) return 2;
        c->dev.threads = (int)d;
    } else if (!strcmp(a, "--device")) {
        if (atlas_cli_parse_device(v, &c->dev.device, &c->dev.gpu)) {
            fprintf(stderr, "atlas chat: --device: '%s' (want cpu, cuda, cuda:N or auto)\n", v);
            return 2;
        }
    } else if (!strcmp(a, "--kernels")) {
        if (atlas_cli_parse_kernels(v, &c->dev.kernels)) {
            fprintf(stderr, "atlas chat: --kernels: '%s' (want native or portable)\n", v);
            return 2;
        }
    } else if (!strcmp(a, "--cpu-activations")) {
        if (atlas_cli_parse_cpu_activations(v, &c->dev.cpu_act)) {
            fprintf(stderr, "atlas chat: --cpu-activations: '%s' (want auto, fp32, bf16 or "
                            "int8)\n", v);
            return 2;
        }
    } else if (!strcmp(a, "--gpu-activations")) {
        if (atlas_cli_parse_gpu_activations(v, &c->dev.gpu_act)) {
            fprintf(stderr, "atlas chat: --gpu-activations: '%s' (want fp32 or int8)\n", v);
            return 2;
        }
    } else if (!strcmp(a, "--kv-cache-dtype")) {
        if (atlas_cli_parse_kv_dtype("chat", v, &c->dev.kv_dtype)) return 2;
    } else if (set_knob(c, a, v, "atlas chat")) {
        return 2;
    }
    return -1;
}

/* Connects (--url) or loads the model (-m); 0 when ready. */
static int start(chat *c) {
    if (!c->url) return load_dir(c, c->model ? c->model : atlas_cli_default_model());
    char err[512];
    if (chat_http_create(c->url, c->api_key, &c->http, err, sizeof err)) {
        fprintf(stderr, "atlas chat: %s\n", err);
        return 1;
    }
    if (c->model) {
        if (!(c->name = strdup(c->model))) return 1;
    } else if (chat_http_first_model(c->http, &c->name, err, sizeof err)) {
        fprintf(stderr, "atlas chat: %s: %s\n", c->url, err);
        return 1;
    }
    return 0;
}

/* Reads turns and commands until /bye, Ctrl-D, the end of stdin or a second Ctrl-C at an
 * empty prompt. */
static void loop(chat *c) {
    int interrupted = 0; /* the last input was a Ctrl-C at an empty prompt */
    for (;;) {
        char *text = NULL;
        int single, empty;
        int rc = read_input(c, &text, &single, &empty);
        if (rc == 0) break;
        if (rc < 0) {
            if (empty && interrupted) break;
            interrupted = empty;
            if (empty) fprintf(stdout, "(Ctrl-C again, /bye or Ctrl-D to quit)\n");
            continue;
        }
        interrupted = 0;
        int quit = 0;
        if (single && text[0] == '/') quit = command(c, text);
        else if (text[strspn(text, " \t\n")]) turn(c, text);
        free(text);
        if (quit) break;
    }
    fflush(stdout);
}

static void chat_free(chat *c) {
    if (c->el) el_end(c->el);
    if (c->hist) history_end(c->hist);
    atlas_engine_free(c->engine);
    chat_http_free(c->http);
    json_decref(c->turns);
    free(c->system);
    free(c->dir);
    free(c->name);
}

int atlas_cli_chat(int argc, char **argv) {
    chat c = {.dev.device = ATLAS_DEVICE_AUTO, .dev.cpu_act = ATLAS_CPU_ACT_AUTO};
    for (int i = 1; i < argc; i++) {
        int rc = parse_opt(&c, argc, argv, &i);
        if (rc >= 0) {
            free(c.system);
            return rc;
        }
    }
    if (c.url && (c.dev.ctx || c.dev.threads || c.dev.device != ATLAS_DEVICE_AUTO))
        fprintf(stderr, "atlas chat: --ctx-size, --threads and --device are the server's "
                "with --url: ignored\n");
    if (!c.url && c.api_key) fprintf(stderr, "atlas chat: --api-key is for --url: ignored\n");
    /* libedit edits characters of the terminal's encoding: take the locale's, or UTF-8 */
    if (!setlocale(LC_CTYPE, "") || MB_CUR_MAX == 1) setlocale(LC_CTYPE, "C.UTF-8");
    c.tty = isatty(STDIN_FILENO);
    struct sigaction sa = {.sa_handler = on_sigint}; /* no SA_RESTART: reads see EINTR */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    int rc = (c.turns = json_array()) ? start(&c) : 1;
    if (!rc && c.tty) rc = editor_start(&c);
    if (!rc) {
        if (c.tty)
            printf("atlas chat: %s%s%s (/help for the commands, /bye or Ctrl-D to quit)\n",
                   c.http ? c.name : c.dir, c.http ? " at " : "", c.http ? c.url : "");
        loop(&c);
        rc = !c.tty && c.failed;
    }
    chat_free(&c);
    return rc;
}

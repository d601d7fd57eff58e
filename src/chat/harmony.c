/* chat/harmony.c — atlas/harmony.h: Harmony replies read from token ids.
 *
 * The machine has three states: OUT (between messages), HEADER (after <|start|> or
 * <|channel|>, its text gathered in three parts: role, channel, constrain) and BODY.  Every
 * id goes through a detokenizer like the engine's (special tokens dropped), so the bytes
 * counted here are the bytes the engine releases.  Bodies become runs: a reasoning, content
 * or call run with the offset of its first byte in the reply's text; runs are released in
 * order, each up to the released count, a call only once it is closed and all of it is
 * released. */
#include "atlas/harmony.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "atlas/tokenizer.h"
#include "core/error.h"

enum { M_START, M_END, M_MESSAGE, M_CHANNEL, M_CONSTRAIN, M_CALL, M_RETURN, M_N };
static const char *const MARK[M_N] = {"<|start|>",     "<|end|>",  "<|message|>", "<|channel|>",
                                      "<|constrain|>", "<|call|>", "<|return|>"};

typedef enum { H_OUT, H_HEADER, H_BODY } hstate;
typedef enum { K_REASONING, K_CONTENT, K_CALL } hkind;

typedef struct hbuf {
    char *p;
    size_t n, cap;
} hbuf;

typedef struct hrun {
    hkind kind;
    char *name;     /* a call's function */
    hbuf text;
    size_t off;     /* where its first byte is in the reply's text */
    size_t emitted; /* bytes of it released */
    bool closed;
} hrun;

struct atlas_harmony {
    const atlas_tokenizer *tok;
    atlas_detok *d;
    int32_t mark[M_N];
    hstate st;
    int part;       /* HEADER: 0 role, 1 channel, 2 constrain */
    hbuf hdr[3];
    bool silent;    /* reading the prompt: bodies are not the reply's */
    size_t dec;     /* bytes of the reply's text decoded so far */
    hrun *runs;
    size_t n_runs, cap_runs;
    uint64_t rng;
};

static bool put(hbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return false;
        b->p = p, b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

static atlas_status nomem(void) { return atlas_fail(ATLAS_ERR_NOMEM, "harmony parser: out of memory"); }

static void marks(const atlas_tokenizer *tok, int32_t m[M_N]) {
    for (int i = 0; i < M_N; i++) m[i] = atlas_tokenizer_token_id(tok, MARK[i]);
}

bool atlas_harmony_template(const char *src) {
    return src && strstr(src, MARK[M_CHANNEL]) && strstr(src, MARK[M_MESSAGE]);
}

bool atlas_harmony_supported(const atlas_tokenizer *tok) {
    if (!tok) return false;
    int32_t m[M_N];
    marks(tok, m);
    for (int i = 0; i < M_N; i++)
        if (m[i] < 0 && i != M_CONSTRAIN) return false;
    return true;
}

void atlas_harmony_stop_ids(const atlas_tokenizer *tok, int32_t ids[2], int *n) {
    *n = 0;
    int32_t m[M_N];
    if (!tok) return;
    marks(tok, m);
    if (m[M_CALL] >= 0) ids[(*n)++] = m[M_CALL];
    if (m[M_RETURN] >= 0) ids[(*n)++] = m[M_RETURN];
}

static int which_mark(const atlas_harmony *h, int32_t id) {
    for (int i = 0; i < M_N; i++)
        if (h->mark[i] >= 0 && h->mark[i] == id) return i;
    return -1;
}

/* ---- runs ------------------------------------------------------------------------------ */

static hrun *last_run(atlas_harmony *h) { return h->n_runs ? &h->runs[h->n_runs - 1] : NULL; }

static bool new_run(atlas_harmony *h, hkind kind, const char *name) {
    if (h->n_runs == h->cap_runs) {
        size_t cap = h->cap_runs ? h->cap_runs * 2 : 4;
        hrun *r = realloc(h->runs, cap * sizeof *r);
        if (!r) return false;
        h->runs = r, h->cap_runs = cap;
    }
    hrun *r = &h->runs[h->n_runs];
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->off = h->dec;
    if (name && !(r->name = strdup(name))) return false;
    if (!put(&r->text, "", 0)) {
        free(r->name);
        return false;
    }
    h->n_runs++;
    return true;
}

static void close_run(atlas_harmony *h) {
    hrun *r = last_run(h);
    if (r) r->closed = true;
}

static void drop_first_run(atlas_harmony *h) {
    free(h->runs[0].name);
    free(h->runs[0].text.p);
    memmove(h->runs, h->runs + 1, (h->n_runs - 1) * sizeof *h->runs);
    h->n_runs--;
}

/* ---- calls ----------------------------------------------------------------------------- */

static uint64_t next_rand(atlas_harmony *h) { /* xorshift64* */
    h->rng ^= h->rng >> 12;
    h->rng ^= h->rng << 25;
    h->rng ^= h->rng >> 27;
    return h->rng * 2685821657736338717ULL;
}

/* The call of run r into calls, or false when its arguments are not a JSON object. */
static bool make_call(atlas_harmony *h, const hrun *r, json_t *calls, bool *ok) {
    const char *s = r->text.p;
    size_t n = r->text.n;
    while (n && isspace((unsigned char)*s)) s++, n--;
    while (n && isspace((unsigned char)s[n - 1])) n--;
    json_t *v = n ? json_loadb(s, n, 0, NULL) : json_object();
    *ok = json_is_object(v);
    json_decref(v);
    if (!*ok) return true;
    static const char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    char id[32] = "call_";
    for (size_t i = 5; i < 29; i++) id[i] = alnum[next_rand(h) % (sizeof alnum - 1)];
    char *args = n ? strndup(s, n) : strdup("{}");
    json_t *c = args ? json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function",
                                 "function", "name", r->name, "arguments", args)
                     : NULL;
    free(args);
    return c && !json_array_append_new(calls, c);
}

/* Releases the runs in order up to byte `released` of the reply; at_end: what is past it
 * is cut (a stop string ended the reply there). */
static bool release(atlas_harmony *h, size_t released, bool at_end, hbuf *reason, hbuf *content,
                    json_t *calls) {
    while (h->n_runs) {
        hrun *r = &h->runs[0];
        size_t avail = released > r->off ? released - r->off : 0;
        if (avail > r->text.n) avail = r->text.n;
        if (r->kind == K_CALL) {
            if (!r->closed || avail < r->text.n) {
                if (!at_end) return true;
                r->text.n = avail; /* cut by a stop string: not a whole call */
                r->kind = K_CONTENT;
                continue;
            }
            bool ok;
            if (!make_call(h, r, calls, &ok)) return false;
            if (!ok) { /* not a call after all: its text is content */
                r->kind = K_CONTENT;
                continue;
            }
            drop_first_run(h);
            continue;
        }
        if (avail > r->emitted) {
            hbuf *out = r->kind == K_REASONING ? reason : content;
            if (!put(out, r->text.p + r->emitted, avail - r->emitted)) return false;
            r->emitted = avail;
        }
        if (!(at_end || (r->closed && r->emitted == r->text.n))) return true;
        drop_first_run(h);
    }
    return true;
}

/* ---- the machine ----------------------------------------------------------------------- */

static void header_reset(atlas_harmony *h, int part) {
    for (int i = 0; i < 3; i++) h->hdr[i].n = 0;
    h->part = part;
    h->st = H_HEADER;
}

/* The word of s[0..n) after "to=", if any, in out (cap bytes); the first word in first. */
static void header_words(const hbuf *b, char *first, char *to, size_t cap) {
    const char *s = b->p ? b->p : "";
    size_t n = b->n, i = 0;
    bool seen_first = false;
    while (i < n) {
        while (i < n && isspace((unsigned char)s[i])) i++;
        size_t j = i;
        while (j < n && !isspace((unsigned char)s[j])) j++;
        size_t len = j - i;
        if (len > 3 && !strncmp(s + i, "to=", 3)) {
            snprintf(to, cap, "%.*s", (int)(len - 3), s + i + 3);
        } else if (len && !seen_first) {
            snprintf(first, cap, "%.*s", (int)len, s + i);
            seen_first = true;
        }
        i = j;
    }
}

/* <|message|>: the header says what the body is. */
static bool begin_body(atlas_harmony *h) {
    char role[128] = "", channel[128] = "", to[256] = "", to2[256] = "";
    header_words(&h->hdr[0], role, to, sizeof to);
    header_words(&h->hdr[1], channel, to2, sizeof to2);
    if (!*to) memcpy(to, to2, sizeof to);
    hkind kind = K_CONTENT;
    const char *name = NULL;
    if (!strncmp(to, "functions.", 10) && to[10]) kind = K_CALL, name = to + 10;
    else if (*to || !strcmp(channel, "analysis")) kind = K_REASONING;
    h->st = H_BODY;
    if (h->silent) return true;
    return new_run(h, kind, name);
}

/* Bytes decoded from the reply: where the state says. */
static bool take_text(atlas_harmony *h, const char *s, size_t n) {
    if (!n) return true;
    bool ok = true;
    if (h->st == H_HEADER) {
        ok = put(&h->hdr[h->part], s, n);
    } else if (!h->silent) {
        hrun *r = last_run(h);
        if (h->st == H_OUT && (!r || r->closed || r->kind != K_CONTENT)) /* stray text */
            ok = new_run(h, K_CONTENT, NULL);
        if (ok) ok = put(&last_run(h)->text, s, n);
    }
    if (!h->silent) h->dec += n;
    return ok;
}

static bool on_mark(atlas_harmony *h, int m) {
    if (h->st == H_BODY) {
        if (m == M_MESSAGE || m == M_CONSTRAIN) return true; /* out of place: ignored */
        if (!h->silent) close_run(h);
        h->st = H_OUT;
        if (m == M_START) header_reset(h, 0);
        if (m == M_CHANNEL) header_reset(h, 1);
        return true;
    }
    if (h->st == H_HEADER) {
        switch (m) {
        case M_START: header_reset(h, 0); return true;
        case M_CHANNEL: h->part = 1; return true;
        case M_CONSTRAIN: h->part = 2; return true;
        case M_MESSAGE: return begin_body(h);
        default: h->st = H_OUT; return true; /* a header that never got its body */
        }
    }
    if (m == M_START) header_reset(h, 0);
    else if (m == M_CHANNEL) header_reset(h, 1);
    else if (m == M_MESSAGE) {
        header_reset(h, 0);
        return begin_body(h);
    }
    return true;
}

static atlas_status push(atlas_harmony *h, int32_t id) {
    const char *s;
    size_t n;
    ATLAS_TRY(atlas_detok_push(h->d, id, &s, &n));
    if (!take_text(h, s, n)) return nomem();
    int m = which_mark(h, id);
    if (m >= 0 && !on_mark(h, m)) return nomem();
    return ATLAS_OK;
}

/* ---- the API --------------------------------------------------------------------------- */

void atlas_harmony_free(atlas_harmony *h) {
    if (!h) return;
    atlas_detok_free(h->d);
    for (int i = 0; i < 3; i++) free(h->hdr[i].p);
    for (size_t i = 0; i < h->n_runs; i++) {
        free(h->runs[i].name);
        free(h->runs[i].text.p);
    }
    free(h->runs);
    free(h);
}

/* Reads the prompt from its last <|start|> on, so the reply starts where it left off. */
static atlas_status replay_prompt(atlas_harmony *h, const int32_t *prompt, size_t n) {
    size_t from = n;
    while (from > 0 && prompt[from - 1] != h->mark[M_START]) from--;
    if (from == 0) return ATLAS_OK;
    h->silent = true;
    for (size_t i = from - 1; i < n; i++) ATLAS_TRY(push(h, prompt[i]));
    const char *s;
    size_t len;
    ATLAS_TRY(atlas_detok_flush(h->d, &s, &len)); /* the engine decodes the reply afresh */
    if (h->st == H_HEADER && !put(&h->hdr[h->part], s, len)) return nomem();
    h->silent = false;
    if (h->st == H_BODY) { /* the prompt opened the body: its kind, from the header read */
        h->st = H_HEADER;
        if (!begin_body(h)) return nomem();
    }
    return ATLAS_OK;
}

atlas_status atlas_harmony_new(const atlas_tokenizer *tok, const int32_t *prompt, size_t n_prompt,
                               atlas_harmony **out) {
    *out = NULL;
    if (!tok || (n_prompt && !prompt))
        return atlas_fail(ATLAS_ERR_INVALID, "harmony parser: NULL tokenizer or prompt");
    atlas_harmony *h = calloc(1, sizeof *h);
    if (!h) return nomem();
    h->tok = tok;
    marks(tok, h->mark);
    for (int i = 0; i < M_N; i++)
        if (h->mark[i] < 0 && i != M_CONSTRAIN) {
            free(h);
            return atlas_fail(ATLAS_ERR_NOT_FOUND, "harmony parser: the tokenizer has no %s token",
                              MARK[i]);
        }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    h->rng = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ (uint64_t)(uintptr_t)h;
    if (!h->rng) h->rng = 1;
    atlas_status st = atlas_detok_create(tok, true, &h->d);
    if (st == ATLAS_OK) st = replay_prompt(h, prompt, n_prompt);
    if (st != ATLAS_OK) {
        atlas_harmony_free(h);
        return st;
    }
    *out = h;
    return ATLAS_OK;
}

static atlas_status outputs(atlas_harmony *h, size_t released, bool at_end, char **reasoning,
                            char **content, json_t *calls) {
    hbuf a = {0}, b = {0};
    bool ok = put(&a, "", 0) && put(&b, "", 0) && release(h, released, at_end, &a, &b, calls);
    if (!ok) {
        free(a.p);
        free(b.p);
        return nomem();
    }
    *reasoning = a.p;
    *content = b.p;
    return ATLAS_OK;
}

atlas_status atlas_harmony_feed(atlas_harmony *h, int32_t id, size_t released, char **reasoning,
                                char **content, json_t *calls) {
    *reasoning = *content = NULL;
    if (!h || !json_is_array(calls))
        return atlas_fail(ATLAS_ERR_INVALID, "harmony parser: NULL parser or calls not an array");
    ATLAS_TRY(push(h, id));
    return outputs(h, released, false, reasoning, content, calls);
}

atlas_status atlas_harmony_finish(atlas_harmony *h, size_t released, char **reasoning,
                                  char **content, json_t *calls) {
    *reasoning = *content = NULL;
    if (!h || !json_is_array(calls))
        return atlas_fail(ATLAS_ERR_INVALID, "harmony parser: NULL parser or calls not an array");
    const char *s;
    size_t n;
    ATLAS_TRY(atlas_detok_flush(h->d, &s, &n));
    if (!take_text(h, s, n)) return nomem();
    hrun *r = last_run(h);
    if (r && !r->closed && r->kind == K_CALL) r->kind = K_CONTENT; /* never called */
    if (r) r->closed = true;
    h->st = H_OUT;
    return outputs(h, released, true, reasoning, content, calls);
}

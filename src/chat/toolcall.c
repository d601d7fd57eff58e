/* chat/toolcall.c — atlas/toolcall.h: tool calls out of generated text, while it
 * streams.
 *
 * States:
 *   TEXT   scanning for the opening marker (<tool_call>, [TOOL_CALLS], or for Llama 3 a
 *          reply that starts with '{' or <|python_tag|>); the longest tail that could be
 *          the start of a marker is held back, the rest released.
 *   CALL   (Hermes) inside <tool_call>, waiting for </tool_call>.
 *   REST   (Llama 3, Mistral) the rest of the reply is the call(s): held to the end.
 *   PLAIN  (Llama 3) the reply did not start with a call: everything is text.
 * A call that does not parse goes back out as the text it was. */
#include <ctype.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "atlas/harmony.h"
#include "atlas/toolcall.h"
#include "core/error.h"

typedef enum { ST_TEXT, ST_CALL, ST_REST, ST_PLAIN } pstate;

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

struct atlas_toolcall_parser {
    atlas_toolcall_format format;
    pstate state;
    sbuf held;       /* text not yet released (or the body of an open call) */
    uint64_t rng;    /* for call ids */
    bool new_brace;  /* Llama 3: the last piece had a '}' (a JSON object may have closed) */
};

static const char HERMES_OPEN[] = "<tool_call>", HERMES_CLOSE[] = "</tool_call>";
static const char MISTRAL_MARK[] = "[TOOL_CALLS]", MISTRAL_ARGS[] = "[ARGS]";
static const char PYTHON_TAG[] = "<|python_tag|>";

static bool sbuf_put(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return false;
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

static void sbuf_drop(sbuf *b, size_t n) { /* removes the first n bytes */
    if (!n) return;
    memmove(b->p, b->p + n, b->n - n);
    b->n -= n;
    if (b->p) b->p[b->n] = 0;
}

static atlas_status nomem(void) { return atlas_fail(ATLAS_ERR_NOMEM, "tool-call parser: out of memory"); }

/* ---- format choice ------------------------------------------------------------------- */
static bool has_ci(const char *s, const char *needle) { return s && strcasestr(s, needle) != NULL; }

atlas_toolcall_format atlas_toolcall_format_detect(const char *tmpl, const char *family) {
    if (tmpl) {
        if (atlas_harmony_template(tmpl)) return ATLAS_TOOLCALL_HARMONY;
        if (strstr(tmpl, HERMES_OPEN)) return ATLAS_TOOLCALL_HERMES;
        if (strstr(tmpl, MISTRAL_MARK)) return ATLAS_TOOLCALL_MISTRAL;
        if (strstr(tmpl, PYTHON_TAG) || (strstr(tmpl, "\"parameters\"") && strstr(tmpl, "<|start_header_id|>")))
            return ATLAS_TOOLCALL_LLAMA3;
    }
    if (has_ci(family, "gptoss") || has_ci(family, "gpt_oss") || has_ci(family, "gpt-oss"))
        return ATLAS_TOOLCALL_HARMONY;
    if (has_ci(family, "qwen") || has_ci(family, "hermes")) return ATLAS_TOOLCALL_HERMES;
    if (has_ci(family, "mistral") || has_ci(family, "mixtral")) return ATLAS_TOOLCALL_MISTRAL;
    if (has_ci(family, "llama")) return ATLAS_TOOLCALL_LLAMA3;
    return ATLAS_TOOLCALL_NONE;
}

const char *atlas_toolcall_format_name(atlas_toolcall_format f) {
    switch (f) {
    case ATLAS_TOOLCALL_HERMES: return "hermes";
    case ATLAS_TOOLCALL_LLAMA3: return "llama3";
    case ATLAS_TOOLCALL_MISTRAL: return "mistral";
    case ATLAS_TOOLCALL_HARMONY: return "harmony";
    default: return "none";
    }
}

const char *atlas_toolcall_format_names(void) { return "hermes, llama3, mistral, harmony, none"; }

atlas_status atlas_toolcall_format_parse(const char *name, atlas_toolcall_format *out) {
    static const atlas_toolcall_format all[] = {ATLAS_TOOLCALL_HERMES, ATLAS_TOOLCALL_LLAMA3,
                                                ATLAS_TOOLCALL_MISTRAL, ATLAS_TOOLCALL_HARMONY,
                                                ATLAS_TOOLCALL_NONE};
    for (size_t i = 0; name && i < sizeof all / sizeof *all; i++)
        if (!strcmp(name, atlas_toolcall_format_name(all[i]))) return *out = all[i], ATLAS_OK;
    return atlas_fail(ATLAS_ERR_INVALID, "tool-call format '%.100s': not one of %s",
                      name ? name : "(null)", atlas_toolcall_format_names());
}

/* ---- calls --------------------------------------------------------------------------- */
static uint64_t next_rand(atlas_toolcall_parser *p) { /* xorshift64* */
    p->rng ^= p->rng >> 12;
    p->rng ^= p->rng << 25;
    p->rng ^= p->rng >> 27;
    return p->rng * 2685821657736338717ULL;
}

/* OpenAI-style "call_" + 24 alphanumerics; Mistral's templates insist on 9 alphanumerics. */
static void make_id(atlas_toolcall_parser *p, char *id, size_t cap) {
    static const char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    size_t o = 0, n = p->format == ATLAS_TOOLCALL_MISTRAL ? 9 : 24;
    if (p->format != ATLAS_TOOLCALL_MISTRAL) o = (size_t)snprintf(id, cap, "call_");
    for (size_t i = 0; i < n && o + 1 < cap; i++) id[o++] = alnum[next_rand(p) % (sizeof alnum - 1)];
    id[o] = 0;
}

/* {"name": N, "arguments"|"parameters": {...} or "<json>"} -> an OpenAI tool call, or NULL. */
static json_t *to_openai(atlas_toolcall_parser *p, const json_t *obj, const char *name_override) {
    const json_t *name = name_override ? NULL : json_object_get(obj, "name");
    const char *nm = name_override ? name_override : json_string_value(name);
    if (!nm || !*nm) return NULL;
    const json_t *args = name_override ? obj : json_object_get(obj, "arguments");
    if (!args && !name_override) args = json_object_get(obj, "parameters");
    char *text = NULL;
    if (!args || json_is_null(args)) {
        text = strdup("{}");
    } else if (json_is_string(args)) {
        text = strdup(json_string_value(args));
    } else if (json_is_object(args)) {
        text = json_dumps(args, JSON_ENCODE_ANY); /* ", " and ": ", as Python's json.dumps */
    } else {
        return NULL;
    }
    if (!text) return NULL;
    char id[40];
    make_id(p, id, sizeof id);
    json_t *call = json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function", "name", nm,
                             "arguments", text);
    free(text);
    return call;
}

static void trim(const char **s, size_t *n) {
    while (*n && isspace((unsigned char)**s)) {
        (*s)++;
        (*n)--;
    }
    while (*n && isspace((unsigned char)(*s)[*n - 1])) (*n)--;
}

/* One JSON value from s[0..n) (whitespace around allowed); NULL if it is not exactly one. */
static json_t *load_json(const char *s, size_t n) {
    trim(&s, &n);
    if (!n) return NULL;
    return json_loadb(s, n, JSON_DECODE_ANY, NULL);
}

/* Appends to out the calls in a JSON value: an object or an array of objects. All or nothing. */
static bool calls_from_value(atlas_toolcall_parser *p, const json_t *v, json_t *out) {
    json_t *made = json_array();
    if (!made) return false;
    bool ok = true;
    if (json_is_object(v)) {
        json_t *c = to_openai(p, v, NULL);
        ok = c && !json_array_append_new(made, c);
    } else if (json_is_array(v) && json_array_size(v) > 0) {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) {
            json_t *c = json_is_object(x) ? to_openai(p, x, NULL) : NULL;
            if (!c || json_array_append_new(made, c)) {
                ok = false;
                break;
            }
        }
    } else {
        ok = false;
    }
    if (ok) json_array_extend(out, made);
    json_decref(made);
    return ok;
}

/* Llama 3: one or more JSON objects separated by ';' or whitespace, after an optional
 * <|python_tag|>. */
static bool parse_llama3(atlas_toolcall_parser *p, const char *s, size_t n, json_t *out) {
    trim(&s, &n);
    if (n >= sizeof PYTHON_TAG - 1 && !memcmp(s, PYTHON_TAG, sizeof PYTHON_TAG - 1)) {
        s += sizeof PYTHON_TAG - 1;
        n -= sizeof PYTHON_TAG - 1;
    }
    json_t *made = json_array();
    if (!made) return false;
    bool ok = true;
    while (ok) {
        while (n && (isspace((unsigned char)*s) || *s == ';')) {
            s++;
            n--;
        }
        if (!n) break;
        json_error_t err;
        json_t *v = json_loadb(s, n, JSON_DISABLE_EOF_CHECK, &err);
        ok = v && json_is_object(v) && calls_from_value(p, v, made);
        json_decref(v);
        if (ok) {
            s += err.position;
            n -= (size_t)err.position;
        }
    }
    ok = ok && json_array_size(made) > 0;
    if (ok) json_array_extend(out, made);
    json_decref(made);
    return ok;
}

/* Llama 3 while streaming: true when the held text can no longer be calls (a complete
 * object that is not a call, or something other than a call after one), so it can be
 * released as text before the reply ends. */
static bool llama3_hopeless(const char *s, size_t n) {
    trim(&s, &n);
    if (n >= sizeof PYTHON_TAG - 1 && !memcmp(s, PYTHON_TAG, sizeof PYTHON_TAG - 1)) {
        s += sizeof PYTHON_TAG - 1;
        n -= sizeof PYTHON_TAG - 1;
    }
    for (;;) {
        while (n && (isspace((unsigned char)*s) || *s == ';')) {
            s++;
            n--;
        }
        if (!n) return false;
        if (*s != '{') return true;
        json_error_t err;
        json_t *v = json_loadb(s, n, JSON_DISABLE_EOF_CHECK, &err);
        if (!v) return err.position + 1 < (int)n; /* an error before the end: not JSON */
        const json_t *name = json_object_get(v, "name"), *args = json_object_get(v, "parameters");
        if (!args) args = json_object_get(v, "arguments");
        bool call = json_is_object(v) && json_is_string(name) && (!args || json_is_object(args) || json_is_string(args));
        json_decref(v);
        if (!call) return true;
        s += err.position;
        n -= (size_t)err.position;
    }
}

/* Mistral, after the first [TOOL_CALLS]: "[{...}, ...]" or "name[ARGS]{...}", possibly
 * several joined by further [TOOL_CALLS]. */
static bool parse_mistral(atlas_toolcall_parser *p, const char *s, size_t n, json_t *out) {
    json_t *made = json_array();
    if (!made) return false;
    bool ok = true;
    while (ok) {
        const char *next = memmem(s, n, MISTRAL_MARK, sizeof MISTRAL_MARK - 1);
        size_t len = next ? (size_t)(next - s) : n;
        const char *seg = s;
        size_t sl = len;
        trim(&seg, &sl);
        if (sl) {
            const char *args = memmem(seg, sl, MISTRAL_ARGS, sizeof MISTRAL_ARGS - 1);
            if (seg[0] == '[' || seg[0] == '{') {
                json_t *v = load_json(seg, sl);
                ok = v && calls_from_value(p, v, made);
                json_decref(v);
            } else if (args) {
                size_t nl = (size_t)(args - seg);
                char name[256];
                const char *nm = seg;
                trim(&nm, &nl);
                json_t *v = load_json(args + sizeof MISTRAL_ARGS - 1, sl - (size_t)(args - seg) - (sizeof MISTRAL_ARGS - 1));
                ok = v && json_is_object(v) && nl > 0 && nl < sizeof name;
                if (ok) {
                    memcpy(name, nm, nl);
                    name[nl] = 0;
                    json_t *c = to_openai(p, v, name);
                    ok = c && !json_array_append_new(made, c);
                }
                json_decref(v);
            } else {
                ok = false;
            }
        }
        if (!next) break;
        s = next + sizeof MISTRAL_MARK - 1;
        n -= len + sizeof MISTRAL_MARK - 1;
    }
    ok = ok && json_array_size(made) > 0;
    if (ok) json_array_extend(out, made);
    json_decref(made);
    return ok;
}

/* ---- streaming ----------------------------------------------------------------------- */
atlas_status atlas_toolcall_parser_new(atlas_toolcall_format format, atlas_toolcall_parser **out) {
    *out = NULL;
    if (format == ATLAS_TOOLCALL_HARMONY)
        return atlas_fail(ATLAS_ERR_INVALID, "tool-call parser: harmony replies are read from "
                                             "token ids (atlas/harmony.h), not from text");
    if (format < ATLAS_TOOLCALL_NONE || format > ATLAS_TOOLCALL_MISTRAL)
        return atlas_fail(ATLAS_ERR_INVALID, "tool-call parser: unknown format %d", (int)format);
    atlas_toolcall_parser *p = calloc(1, sizeof *p);
    if (!p) return nomem();
    p->format = format;
    if (!sbuf_put(&p->held, "", 0)) { /* held.p is never NULL from here on */
        free(p);
        return nomem();
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    p->rng = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ (uint64_t)(uintptr_t)p ^ 0x9E3779B97F4A7C15ULL;
    if (!p->rng) p->rng = 1;
    *out = p;
    return ATLAS_OK;
}

void atlas_toolcall_parser_free(atlas_toolcall_parser *p) {
    if (!p) return;
    free(p->held.p);
    free(p);
}

/* Length of the longest tail of s[0..n) that is a proper prefix of marker. */
static size_t partial_tail(const char *s, size_t n, const char *marker) {
    size_t m = strlen(marker);
    for (size_t k = m - 1 < n ? m - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, marker, k)) return k;
    return 0;
}

/* Moves the first n held bytes to the released text. */
static bool release(atlas_toolcall_parser *p, sbuf *text, size_t n) {
    if (!sbuf_put(text, p->held.p, n)) return false;
    sbuf_drop(&p->held, n);
    return true;
}

/* Runs the state machine over what is held; at_end: no more text will come. */
static bool advance(atlas_toolcall_parser *p, sbuf *text, json_t *calls, bool at_end) {
    for (;;) {
        sbuf *h = &p->held;
        switch (p->state) {
        case ST_PLAIN: return release(p, text, h->n);
        case ST_TEXT: {
            if (p->format == ATLAS_TOOLCALL_NONE) return release(p, text, h->n);
            if (p->format == ATLAS_TOOLCALL_LLAMA3) {
                size_t ws = 0;
                while (ws < h->n && isspace((unsigned char)h->p[ws])) ws++;
                const char *s = h->p + ws;
                size_t n = h->n - ws;
                if (n && (s[0] == '{' || (n >= sizeof PYTHON_TAG - 1 && !memcmp(s, PYTHON_TAG, sizeof PYTHON_TAG - 1)))) {
                    p->state = ST_REST;
                    continue;
                }
                bool maybe_tag = n && n < sizeof PYTHON_TAG - 1 && !memcmp(s, PYTHON_TAG, n);
                if (!at_end && (n == 0 || maybe_tag)) return true; /* cannot tell yet */
                p->state = ST_PLAIN;
                continue;
            }
            const char *mark = p->format == ATLAS_TOOLCALL_HERMES ? HERMES_OPEN : MISTRAL_MARK;
            size_t ml = strlen(mark);
            const char *f = h->n ? memmem(h->p, h->n, mark, ml) : NULL;
            if (!f) {
                size_t keep = at_end ? 0 : partial_tail(h->p, h->n, mark);
                return release(p, text, h->n - keep);
            }
            if (!release(p, text, (size_t)(f - h->p))) return false;
            sbuf_drop(h, ml);
            p->state = p->format == ATLAS_TOOLCALL_HERMES ? ST_CALL : ST_REST;
            continue;
        }
        case ST_CALL: {
            const char *f = h->n ? memmem(h->p, h->n, HERMES_CLOSE, sizeof HERMES_CLOSE - 1) : NULL;
            if (!f && !at_end) return true;
            size_t body = f ? (size_t)(f - h->p) : h->n;
            json_t *v = load_json(h->p, body);
            bool ok = v && json_is_object(v) && calls_from_value(p, v, calls);
            json_decref(v);
            if (!ok) { /* not a call after all: give back the text as written */
                if (!sbuf_put(text, HERMES_OPEN, sizeof HERMES_OPEN - 1) ||
                    !sbuf_put(text, h->p, f ? body + sizeof HERMES_CLOSE - 1 : body))
                    return false;
            }
            sbuf_drop(h, f ? body + sizeof HERMES_CLOSE - 1 : body);
            p->state = ST_TEXT;
            continue;
        }
        case ST_REST: {
            if (!at_end && p->format == ATLAS_TOOLCALL_LLAMA3 && p->new_brace && llama3_hopeless(h->p, h->n)) {
                p->state = ST_PLAIN;
                continue;
            }
            if (!at_end) return true;
            bool ok = p->format == ATLAS_TOOLCALL_LLAMA3 ? parse_llama3(p, h->p, h->n, calls)
                                                         : parse_mistral(p, h->p, h->n, calls);
            if (ok) {
                h->n = 0;
            } else {
                if (p->format == ATLAS_TOOLCALL_MISTRAL && !sbuf_put(text, MISTRAL_MARK, sizeof MISTRAL_MARK - 1))
                    return false;
                if (!release(p, text, h->n)) return false;
            }
            p->state = ST_PLAIN;
            return true;
        }
        }
    }
}

static atlas_status step(atlas_toolcall_parser *p, const char *piece, size_t len, bool at_end, char **text,
                         json_t *calls) {
    *text = NULL;
    if (!p || !calls || !json_is_array(calls)) return atlas_fail(ATLAS_ERR_INVALID, "tool-call parser: NULL parser or calls not an array");
    if (len && !sbuf_put(&p->held, piece, len)) return nomem();
    p->new_brace = len && memchr(piece, '}', len);
    sbuf out = {0};
    if (!advance(p, &out, calls, at_end) || !sbuf_put(&out, "", 0)) {
        free(out.p);
        return nomem();
    }
    *text = out.p;
    return ATLAS_OK;
}

atlas_status atlas_toolcall_parser_feed(atlas_toolcall_parser *p, const char *piece, size_t len, char **text,
                                        json_t *calls) {
    if (len && !piece) return atlas_fail(ATLAS_ERR_INVALID, "tool-call parser: NULL piece");
    return step(p, piece, len, false, text, calls);
}

atlas_status atlas_toolcall_parser_finish(atlas_toolcall_parser *p, char **text, json_t *calls) {
    return step(p, NULL, 0, true, text, calls);
}

atlas_status atlas_toolcall_parse(atlas_toolcall_format format, const char *text, char **content, json_t **calls) {
    *content = NULL;
    *calls = NULL;
    if (!text) return atlas_fail(ATLAS_ERR_INVALID, "tool-call parser: NULL text");
    atlas_toolcall_parser *p;
    ATLAS_TRY(atlas_toolcall_parser_new(format, &p));
    json_t *arr = json_array();
    char *a = NULL, *b = NULL;
    atlas_status st = arr ? ATLAS_OK : nomem();
    if (st == ATLAS_OK) st = atlas_toolcall_parser_feed(p, text, strlen(text), &a, arr);
    if (st == ATLAS_OK) st = atlas_toolcall_parser_finish(p, &b, arr);
    atlas_toolcall_parser_free(p);
    if (st == ATLAS_OK) {
        size_t la = strlen(a), lb = strlen(b);
        char *all = malloc(la + lb + 1);
        if (!all) st = nomem();
        else {
            memcpy(all, a, la);
            memcpy(all + la, b, lb + 1);
            *content = all;
            *calls = arr;
            arr = NULL;
        }
    }
    free(a);
    free(b);
    json_decref(arr);
    return st;
}

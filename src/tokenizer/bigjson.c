/* tokenizer/bigjson.c — a fast path for the two big parts of tokenizer.json.
 *
 * model.vocab (150k entries) and model.merges (150k-280k) are 95% of an 11 MB file; a DOM
 * of them costs jansson ~0.4 s and ~500k allocations.  This scanner finds their spans,
 * decodes their strings in place (a JSON escape never decodes to more bytes than it
 * takes), and hands jansson the rest of the document with `{}` and `[]` in their place.
 * It accepts only well-formed JSON; on anything else the caller parses the whole file with
 * jansson, whose error names the line and column. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/tokenizer_internal.h"

typedef struct scan {
    char *p, *end;
} scan;

static void ws(scan *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t')) s->p++;
}

static int hex4(const char *p, uint32_t *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return 0;
        *v = *v << 4 | (uint32_t)d;
    }
    return 1;
}

/* Skips the string at s->p (on its opening quote) without changing it; *out and *len: its raw
 * text between the quotes. */
static bool raw_string(scan *s, char **out, size_t *len) {
    if (s->p >= s->end || *s->p != '"') return false;
    char *r = ++s->p;
    *out = r;
    for (;;) {
        while (r < s->end && *r != '"' && *r != '\\' && (unsigned char)*r >= 0x20) r++;
        if (r >= s->end || (unsigned char)*r < 0x20) return false;
        if (*r == '"') break;
        r += 2;
    }
    *len = (size_t)(r - *out);
    s->p = r + 1;
    return true;
}

/* Decodes the string at s->p (on its opening quote) in place; *out and *len: its bytes. */
static bool string(scan *s, char **out, size_t *len) {
    if (s->p >= s->end || *s->p != '"') return false;
    char *r = ++s->p, *w = r;
    *out = w;
    for (;;) {
        /* copy the plain run quickly */
        while (r < s->end && *r != '"' && *r != '\\' && (unsigned char)*r >= 0x20) *w++ = *r++;
        if (r >= s->end || (unsigned char)*r < 0x20) return false;
        if (*r == '"') break;
        if (r + 1 >= s->end) return false;
        char e = r[1];
        r += 2;
        switch (e) {
        case '"': *w++ = '"'; break;
        case '\\': *w++ = '\\'; break;
        case '/': *w++ = '/'; break;
        case 'b': *w++ = '\b'; break;
        case 'f': *w++ = '\f'; break;
        case 'n': *w++ = '\n'; break;
        case 'r': *w++ = '\r'; break;
        case 't': *w++ = '\t'; break;
        case 'u': {
            uint32_t cp, lo;
            if (r + 4 > s->end || !hex4(r, &cp)) return false;
            r += 4;
            if (cp >= 0xdc00 && cp <= 0xdfff) return false;
            if (cp >= 0xd800 && cp <= 0xdbff) {
                if (r + 6 > s->end || r[0] != '\\' || r[1] != 'u' || !hex4(r + 2, &lo) ||
                    lo < 0xdc00 || lo > 0xdfff)
                    return false;
                r += 6;
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            }
            w += tok_utf8_put(w, cp);
            break;
        }
        default: return false;
        }
    }
    *len = (size_t)(w - *out);
    s->p = r + 1;
    return tok_utf8_validate(*out, *len) == *len;
}

static bool skip_value(scan *s, int depth);

static bool skip_container(scan *s, char close, int depth) {
    s->p++;
    ws(s);
    if (s->p < s->end && *s->p == close) {
        s->p++;
        return true;
    }
    for (;;) {
        if (close == '}') {
            char *k;
            size_t kl;
            if (!raw_string(s, &k, &kl)) return false;
            ws(s);
            if (s->p >= s->end || *s->p++ != ':') return false;
        }
        if (!skip_value(s, depth + 1)) return false;
        ws(s);
        if (s->p >= s->end) return false;
        if (*s->p == ',') {
            s->p++;
            ws(s);
            continue;
        }
        if (*s->p++ != close) return false;
        return true;
    }
}

static bool skip_value(scan *s, int depth) {
    ws(s);
    if (s->p >= s->end || depth > 64) return false;
    char c = *s->p;
    if (c == '{') return skip_container(s, '}', depth);
    if (c == '[') return skip_container(s, ']', depth);
    if (c == '"') {
        char *x;
        size_t xl;
        return raw_string(s, &x, &xl);
    }
    /* numbers and literals: the caller's jansson pass checks them */
    char *st = s->p;
    while (s->p < s->end && (strchr("+-.eE", *s->p) || (*s->p >= '0' && *s->p <= '9') ||
                             (*s->p >= 'a' && *s->p <= 'z')))
        s->p++;
    return s->p > st;
}

static bool grow(void **p, size_t *cap, size_t n, size_t elem) {
    if (n < *cap) return true;
    size_t c = *cap ? *cap * 2 : 1024;
    void *q = realloc(*p, c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static bool parse_vocab(scan *s, tok_bigjson *j) {
    s->p++; /* '{' */
    ws(s);
    if (s->p < s->end && *s->p == '}') return s->p++, true;
    for (;;) {
        char *k;
        size_t kl;
        ws(s);
        if (!string(s, &k, &kl)) return false;
        ws(s);
        if (s->p >= s->end || *s->p++ != ':') return false;
        ws(s);
        int64_t v = 0;
        char *st = s->p;
        while (s->p < s->end && *s->p >= '0' && *s->p <= '9' && v < INT32_MAX) v = v * 10 + (*s->p++ - '0');
        if (s->p == st || v >= INT32_MAX || (s->p < s->end && strchr(".eE-", *s->p))) return false;
        if (!grow((void **)&j->vocab, &j->cap_vocab, j->n_vocab, sizeof *j->vocab)) return false;
        j->vocab[j->n_vocab++] = (tok_json_entry){k, (uint32_t)kl, (int32_t)v};
        ws(s);
        if (s->p >= s->end) return false;
        if (*s->p == ',') {
            s->p++;
            continue;
        }
        return *s->p++ == '}';
    }
}

static bool parse_merges(scan *s, tok_bigjson *j) {
    s->p++; /* '[' */
    ws(s);
    if (s->p < s->end && *s->p == ']') return s->p++, true;
    for (;;) {
        char *a, *b;
        size_t la, lb;
        ws(s);
        if (s->p < s->end && *s->p == '"') { /* "a b" */
            char *m;
            size_t ml;
            if (!string(s, &m, &ml)) return false;
            char *sp = memchr(m, ' ', ml);
            if (!sp || memchr(sp + 1, ' ', ml - (size_t)(sp + 1 - m))) {
                a = m, la = ml, b = NULL, lb = 0; /* load.c reports the bad form */
            } else {
                a = m, la = (size_t)(sp - m), b = sp + 1, lb = ml - la - 1;
            }
        } else if (s->p < s->end && *s->p == '[') { /* ["a", "b"] */
            s->p++;
            ws(s);
            if (!string(s, &a, &la)) return false;
            ws(s);
            if (s->p >= s->end || *s->p++ != ',') return false;
            ws(s);
            if (!string(s, &b, &lb)) return false;
            ws(s);
            if (s->p >= s->end || *s->p++ != ']') return false;
        } else {
            return false;
        }
        if (!grow((void **)&j->merges, &j->cap_merges, j->n_merges, sizeof *j->merges)) return false;
        j->merges[j->n_merges++] = (tok_json_merge){a, b, (uint32_t)la, (uint32_t)lb};
        ws(s);
        if (s->p >= s->end) return false;
        if (*s->p == ',') {
            s->p++;
            continue;
        }
        return *s->p++ == ']';
    }
}

/* Walks the keys of the object at s->p (the document when top, else the model object,
 * whose vocab and merges it parses, noting their spans in cut[]). */
static bool walk_object(scan *s, tok_bigjson *j, bool top, char **cut, int *n_cut) {
    if (s->p >= s->end || *s->p != '{') return false;
    s->p++;
    ws(s);
    if (s->p < s->end && *s->p == '}') return s->p++, true;
    for (;;) {
        char *k;
        size_t kl;
        ws(s);
        if (!raw_string(s, &k, &kl)) return false;
        ws(s);
        if (s->p >= s->end || *s->p++ != ':') return false;
        ws(s);
        if (s->p >= s->end) return false;
        bool ok;
        if (top && kl == 5 && !memcmp(k, "model", 5) && *s->p == '{') {
            ok = walk_object(s, j, false, cut, n_cut);
        } else if (!top && kl == 5 && !memcmp(k, "vocab", 5) && *s->p == '{' && !j->have_vocab && *n_cut < 4) {
            cut[(*n_cut)++] = s->p;
            ok = parse_vocab(s, j);
            j->have_vocab = true;
            cut[(*n_cut)++] = s->p;
        } else if (!top && kl == 6 && !memcmp(k, "merges", 6) && *s->p == '[' && !j->have_merges && *n_cut < 4) {
            cut[(*n_cut)++] = s->p;
            ok = parse_merges(s, j);
            j->have_merges = true;
            cut[(*n_cut)++] = s->p;
        } else {
            ok = skip_value(s, 1);
        }
        if (!ok) return false;
        ws(s);
        if (s->p >= s->end) return false;
        if (*s->p == ',') {
            s->p++;
            continue;
        }
        return *s->p++ == '}';
    }
}

atlas_status tok_bigjson_parse(char *buf, size_t len, tok_bigjson *j) {
    memset(j, 0, sizeof *j);
    scan s = {buf, buf + len};
    char *cut[4];
    int n_cut = 0;
    ws(&s);
    bool ok = walk_object(&s, j, true, cut, &n_cut);
    ws(&s);
    if (!ok || s.p != s.end) {
        tok_bigjson_free(j);
        return ATLAS_ERR_FORMAT; /* no message: the caller falls back to jansson */
    }
    /* the rest of the document, with "{}" / "[]" where the big values were */
    j->rest = malloc(len + 1);
    if (!j->rest) {
        tok_bigjson_free(j);
        return atlas_fail(ATLAS_ERR_NOMEM, "tokenizer.json: %zu bytes", len);
    }
    const char *from = buf;
    for (int i = 0; i < n_cut; i += 2) {
        memcpy(j->rest + j->rest_len, from, (size_t)(cut[i] - from));
        j->rest_len += (size_t)(cut[i] - from);
        j->rest[j->rest_len++] = *cut[i];
        j->rest[j->rest_len++] = *cut[i] == '{' ? '}' : ']';
        from = cut[i + 1];
    }
    memcpy(j->rest + j->rest_len, from, (size_t)(buf + len - from));
    j->rest_len += (size_t)(buf + len - from);
    j->rest[j->rest_len] = '\0';
    return ATLAS_OK;
}

void tok_bigjson_free(tok_bigjson *j) {
    free(j->vocab);
    free(j->merges);
    free(j->rest);
    memset(j, 0, sizeof *j);
}

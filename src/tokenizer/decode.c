/* tokenizer/decode.c — ids back to text: the ByteLevel decoder (done at load: each token's
 * bytes are precomputed), UTF-8 helpers, decode and the incremental detokenizer. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/tokenizer_internal.h"

/* ---- the GPT-2 byte <-> char mapping ------------------------------------------------------ */

/* Printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves; the other 68 bytes,
 * in order, are U+0100..U+0143: 0x00..0x20 -> U+0100..U+0120 (the space is 'Ġ'),
 * 0x7F..0xA0 -> U+0121..U+0142, 0xAD -> U+0143. */
static bool byte_is_printable(unsigned b) {
    return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
}

int tok_cp_to_byte(uint32_t cp) {
    if (cp < 0x100) return byte_is_printable(cp) ? (int)cp : -1;
    if (cp <= 0x120) return (int)(cp - 0x100);
    if (cp <= 0x142) return (int)(0x7f + cp - 0x121);
    return cp == 0x143 ? 0xad : -1;
}

/* ---- UTF-8 ------------------------------------------------------------------------------ */

int tok_utf8_next(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned b = s[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    int need;
    unsigned lo = 0x80, hi = 0xbf; /* the range allowed for the second byte */
    if (b >= 0xc2 && b <= 0xdf) {
        need = 1;
    } else if (b >= 0xe0 && b <= 0xef) {
        need = 2;
        if (b == 0xe0) lo = 0xa0;
        if (b == 0xed) hi = 0x9f; /* no surrogates */
    } else if (b >= 0xf0 && b <= 0xf4) {
        need = 3;
        if (b == 0xf0) lo = 0x90;
        if (b == 0xf4) hi = 0x8f;
    } else {
        return -1;
    }
    uint32_t c = b & (0x3f >> need);
    for (int i = 1; i <= need; i++) {
        if ((size_t)i >= n) return 0;
        unsigned x = s[i];
        if (x < lo || x > hi) return -i;
        lo = 0x80;
        hi = 0xbf;
        c = c << 6 | (x & 0x3f);
    }
    *cp = c;
    return need + 1;
}

size_t tok_utf8_put(char *dst, uint32_t cp) {
    unsigned char *d = (unsigned char *)dst;
    if (cp < 0x80) {
        d[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        d[0] = (unsigned char)(0xc0 | cp >> 6);
        d[1] = (unsigned char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        d[0] = (unsigned char)(0xe0 | cp >> 12);
        d[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3f));
        d[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    d[0] = (unsigned char)(0xf0 | cp >> 18);
    d[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3f));
    d[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3f));
    d[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

size_t tok_utf8_validate(const char *str, size_t len) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        /* ASCII fast path, 8 bytes at a time */
        while (i + 8 <= len) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ULL) break;
            i += 8;
        }
        if (i >= len) break;
        uint32_t cp;
        int r = tok_utf8_next(s + i, len - i, &cp);
        if (r <= 0) return i;
        i += (size_t)r;
    }
    return len;
}

/* ---- a growable output buffer ------------------------------------------------------------- */

typedef struct obuf {
    char *p;
    size_t len, cap;
} obuf;

static atlas_status obuf_reserve(obuf *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) return ATLAS_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return atlas_fail(ATLAS_ERR_NOMEM, "tokenizer: decode buffer of %zu bytes", cap);
    b->p = p;
    b->cap = cap;
    return ATLAS_OK;
}

/* Appends the valid UTF-8 of s[0..n) with U+FFFD for each maximal invalid subpart; stops
 * before an incomplete sequence at the end unless final.  Returns the bytes consumed. */
static atlas_status append_lossy(obuf *b, const unsigned char *s, size_t n, bool final,
                                 size_t *used) {
    ATLAS_TRY(obuf_reserve(b, 3 * n));
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        int r = tok_utf8_next(s + i, n - i, &cp);
        if (r > 0) {
            memcpy(b->p + b->len, s + i, (size_t)r);
            b->len += (size_t)r;
            i += (size_t)r;
            continue;
        }
        if (r == 0 && !final) break;
        b->len += tok_utf8_put(b->p + b->len, 0xfffd);
        i += r == 0 ? n - i : (size_t)-r;
    }
    b->p[b->len] = '\0';
    *used = i;
    return ATLAS_OK;
}

/* ---- tokens ------------------------------------------------------------------------------ */

static atlas_status check_id(const atlas_tokenizer *tok, int32_t id) {
    if (id < 0 || (size_t)id >= tok->vocab_size)
        return atlas_fail(ATLAS_ERR_RANGE, "token id %d out of range [0, %zu)", (int)id,
                          tok->vocab_size);
    return ATLAS_OK;
}

atlas_status atlas_tokenizer_token_bytes(const atlas_tokenizer *tok, int32_t id,
                                         const char **bytes, size_t *len) {
    ATLAS_TRY(check_id(tok, id));
    if ((size_t)id >= tok->n_tokens || !(tok->tok_flags[id] & TOK_HAS_STRING)) {
        *bytes = "";
        *len = 0;
        return ATLAS_OK;
    }
    *bytes = tok->arena + tok->tok_off[id];
    *len = tok->tok_len[id];
    return ATLAS_OK;
}

bool atlas_tokenizer_is_special(const atlas_tokenizer *tok, int32_t id) {
    return id >= 0 && (size_t)id < tok->n_tokens && (tok->tok_flags[id] & TOK_SPECIAL);
}

size_t atlas_tokenizer_added_count(const atlas_tokenizer *tok) { return tok->n_added; }

atlas_status atlas_tokenizer_added_token(const atlas_tokenizer *tok, size_t i, const char **text,
                                         size_t *len, int32_t *id, bool *special) {
    if (i >= tok->n_added)
        return atlas_fail(ATLAS_ERR_RANGE, "added token %zu of %zu", i, tok->n_added);
    const tok_added *a = &tok->added[i];
    if (text) *text = a->content;
    if (len) *len = a->len;
    if (id) *id = a->id;
    if (special) *special = a->special;
    return ATLAS_OK;
}

/* The Metaspace decoder drops every metaspace (a space in the token's bytes) of the first
 * token, unless it is a <0xNN> byte; writes what is left to dst.  0 when that rule does not
 * apply (dst untouched). */
static int first_token_spaces(const atlas_tokenizer *tok, int32_t id, const char *b, size_t bl,
                              char *dst, size_t *dst_len) {
    if (!tok->strip_first || (size_t)id >= tok->n_tokens || (tok->tok_flags[id] & TOK_BYTE))
        return 0;
    size_t o = 0;
    for (size_t i = 0; i < bl; i++)
        if (b[i] != ' ') dst[o++] = b[i];
    *dst_len = o;
    return 1;
}

/* A <0xNN> token of a byte-fallback tokenizer: consecutive ones form a run. */
static bool is_byte_token(const atlas_tokenizer *tok, int32_t id) {
    return tok->byte_fallback && (size_t)id < tok->n_tokens && (tok->tok_flags[id] & TOK_BYTE);
}

/* HF's ByteFallback decoder: a run of byte tokens is its bytes when they are valid UTF-8 as a
 * whole, else one U+FFFD per byte.  b->p[from..len) is the run. */
static atlas_status resolve_run(obuf *b, size_t from) {
    size_t k = b->len - from;
    if (tok_utf8_validate(b->p + from, k) == k) return ATLAS_OK;
    ATLAS_TRY(obuf_reserve(b, 2 * k));
    for (size_t i = 0; i < k; i++) memcpy(b->p + from + 3 * i, "\xef\xbf\xbd", 3);
    b->len = from + 3 * k;
    return ATLAS_OK;
}

atlas_status atlas_tokenizer_decode(const atlas_tokenizer *tok, const int32_t *ids, size_t n,
                                    bool skip_special, char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    /* the ByteLevel decoder joins all tokens' bytes, then decodes them lossily */
    obuf raw = {0};
    bool first = true;
    size_t run0 = SIZE_MAX; /* where the current run of byte tokens starts in raw */
    for (size_t i = 0; i < n; i++) {
        const char *b;
        size_t bl;
        atlas_status st = atlas_tokenizer_token_bytes(tok, ids[i], &b, &bl);
        bool skip = st == ATLAS_OK && skip_special && atlas_tokenizer_is_special(tok, ids[i]);
        if (st == ATLAS_OK && !skip && run0 != SIZE_MAX && !is_byte_token(tok, ids[i])) {
            st = resolve_run(&raw, run0);
            run0 = SIZE_MAX;
        }
        if (st == ATLAS_OK && !skip) st = obuf_reserve(&raw, bl);
        if (st != ATLAS_OK) {
            free(raw.p);
            return atlas_fail_wrap(st, "decode: ids[%zu]", i);
        }
        if (skip) continue;
        if (run0 == SIZE_MAX && is_byte_token(tok, ids[i])) run0 = raw.len;
        bool was_first = first;
        first = false;
        if (was_first && first_token_spaces(tok, ids[i], b, bl, raw.p, &raw.len)) continue;
        memcpy(raw.p + raw.len, b, bl);
        raw.len += bl;
    }
    if (run0 != SIZE_MAX && resolve_run(&raw, run0) != ATLAS_OK) {
        free(raw.p);
        return atlas_fail(ATLAS_ERR_NOMEM, "decode: out of memory");
    }
    obuf out = {0};
    size_t used, skip = 0;
    while ((int)skip < tok->strip_lead && skip < raw.len && raw.p[skip] == ' ') skip++;
    /* raw.p is NULL when no token gave a byte (no ids, or all skipped) */
    const unsigned char *from = (const unsigned char *)(raw.p ? raw.p + skip : "");
    atlas_status st = append_lossy(&out, from, raw.len - skip, true, &used);
    free(raw.p);
    if (st == ATLAS_OK && !out.p) st = obuf_reserve(&out, 0);
    if (st != ATLAS_OK) {
        free(out.p);
        return st;
    }
    out.p[out.len] = '\0';
    *text = out.p;
    *len = out.len;
    return ATLAS_OK;
}

/* ---- incremental decoding ----------------------------------------------------------------- */

struct atlas_detok {
    const atlas_tokenizer *tok;
    bool skip_special;
    int lead_left;            /* leading spaces still to strip (tok->strip_lead); 0 once
                                 any other text came */
    bool started;             /* a token was pushed (the first one's metaspaces are dropped) */
    unsigned char pending[8]; /* an incomplete UTF-8 sequence: at most 3 bytes */
    size_t n_pending;
    obuf run;                 /* a run of byte tokens, held until it ends (resolve_run) */
    obuf in, out;
};

atlas_status atlas_detok_create(const atlas_tokenizer *tok, bool skip_special,
                                atlas_detok **out) {
    *out = calloc(1, sizeof **out);
    if (!*out) return atlas_fail(ATLAS_ERR_NOMEM, "detokenizer");
    (*out)->tok = tok;
    (*out)->skip_special = skip_special;
    (*out)->lead_left = tok->strip_lead;
    return ATLAS_OK;
}

void atlas_detok_free(atlas_detok *d) {
    if (!d) return;
    free(d->in.p);
    free(d->out.p);
    free(d->run.p);
    free(d);
}

static atlas_status detok_emit(atlas_detok *d, bool final, const char **text, size_t *len) {
    d->out.len = 0;
    size_t used;
    ATLAS_TRY(append_lossy(&d->out, (const unsigned char *)d->in.p, d->in.len, final, &used));
    d->n_pending = d->in.len - used;
    memcpy(d->pending, d->in.p + used, d->n_pending);
    *text = d->out.p;
    *len = d->out.len;
    while (d->lead_left > 0 && *len > 0 && **text == ' ') (*text)++, (*len)--, d->lead_left--;
    if (*len > 0) d->lead_left = 0;
    return ATLAS_OK;
}

atlas_status atlas_detok_push(atlas_detok *d, int32_t id, const char **text, size_t *len) {
    *text = "";
    *len = 0;
    const char *b;
    size_t bl;
    ATLAS_TRY(atlas_tokenizer_token_bytes(d->tok, id, &b, &bl));
    bool skipped = d->skip_special && atlas_tokenizer_is_special(d->tok, id);
    if (skipped) bl = 0;
    if (!skipped && is_byte_token(d->tok, id)) { /* held: the run's validity decides */
        ATLAS_TRY(obuf_reserve(&d->run, bl));
        memcpy(d->run.p + d->run.len, b, bl);
        d->run.len += bl;
        d->started = true;
        return ATLAS_OK;
    }
    if (!skipped && d->run.len) ATLAS_TRY(resolve_run(&d->run, 0));
    size_t held = skipped ? 0 : d->run.len;
    d->in.len = 0;
    ATLAS_TRY(obuf_reserve(&d->in, d->n_pending + held + bl));
    memcpy(d->in.p, d->pending, d->n_pending);
    if (held) memcpy(d->in.p + d->n_pending, d->run.p, held); /* the run goes out first */
    d->run.len -= held;
    size_t off = d->n_pending + held, put = bl;
    bool first = !d->started && !skipped; /* as decode: the first token not skipped */
    if (!(first && first_token_spaces(d->tok, id, b, bl, d->in.p + off, &put)))
        memcpy(d->in.p + off, b, bl);
    if (!skipped) d->started = true;
    d->in.len = off + put;
    return detok_emit(d, false, text, len);
}

atlas_status atlas_detok_flush(atlas_detok *d, const char **text, size_t *len) {
    *text = "";
    *len = 0;
    if (d->run.len) ATLAS_TRY(resolve_run(&d->run, 0));
    d->in.len = 0;
    ATLAS_TRY(obuf_reserve(&d->in, d->n_pending + d->run.len));
    memcpy(d->in.p, d->pending, d->n_pending);
    if (d->run.len) memcpy(d->in.p + d->n_pending, d->run.p, d->run.len);
    d->in.len = d->n_pending + d->run.len;
    d->run.len = 0;
    return detok_emit(d, true, text, len);
}

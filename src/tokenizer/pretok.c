/* tokenizer/pretok.c — normalizers, added-token splitting and pre-tokenizers (Split regex,
 * ByteLevel), following Hugging Face tokenizers' semantics. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/error.h"
#include "tokenizer/tokenizer_internal.h"

/* ---- normalizers ------------------------------------------------------------------------- */

static bool is_ascii(const char *s, size_t len) {
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] >= 0x80) return false;
    return true;
}

/* True when s is certainly in NFC already, so that utf8proc can be skipped (most text is):
 * no code point decomposes canonically, none has a non-zero combining class (nothing to
 * reorder), none can be the second of a canonical composition (utf8proc's comb_index at
 * 0x8000 and above), and no Hangul vowel or trailing jamo follows a syllable or leading
 * jamo (Hangul composes by arithmetic, not by table).  Then NFD(s) = s and nothing
 * composes, so NFC(s) = s.  A false "no" only costs the utf8proc pass. */
static bool surely_nfc(const char *s, size_t len) {
    for (size_t i = 0; i < len;) {
        if ((unsigned char)s[i] < 0xcc) { /* below U+0300: nothing happens to these */
            i++;
            continue;
        }
        uint32_t cp;
        int r = tok_utf8_next((const unsigned char *)s + i, len - i, &cp);
        if (r <= 0) return false;
        i += (size_t)r;
        if (cp >= 0x1160 && cp <= 0x11ff) return false; /* Hangul V and T jamo */
        const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
        if (p->combining_class != 0) return false;
        if (p->decomp_seqindex != UINT16_MAX && p->decomp_type == 0) return false;
        if (p->comb_index != UINT16_MAX && p->comb_index >= 0x8000) return false;
    }
    return true;
}

static atlas_status norm_unicode(const tok_norm *n, const char *s, size_t len, char **out,
                                 size_t *out_len) {
    utf8proc_option_t opt = UTF8PROC_STABLE;
    switch (n->kind) {
    case TOK_NORM_NFC: opt |= UTF8PROC_COMPOSE; break;
    case TOK_NORM_NFD: opt |= UTF8PROC_DECOMPOSE; break;
    case TOK_NORM_NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    default: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &dst, opt);
    if (r < 0)
        return atlas_fail(r == UTF8PROC_ERROR_NOMEM ? ATLAS_ERR_NOMEM : ATLAS_ERR_INVALID,
                          "normalizer: %s", utf8proc_errmsg(r));
    *out = (char *)dst;
    *out_len = (size_t)r;
    return ATLAS_OK;
}

static atlas_status norm_lowercase(const char *s, size_t len, char **out, size_t *out_len) {
    char *d = malloc(len * 2 + 4); /* a lowercase char takes at most one more byte */
    if (!d) return atlas_fail(ATLAS_ERR_NOMEM, "normalizer: Lowercase of %zu bytes", len);
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int r = tok_utf8_next((const unsigned char *)s + i, len - i, &cp);
        if (r <= 0) {
            free(d);
            return atlas_fail(ATLAS_ERR_INVALID, "normalizer: invalid UTF-8 at byte %zu", i);
        }
        o += tok_utf8_put(d + o, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp));
        i += (size_t)r;
    }
    *out = d;
    *out_len = o;
    return ATLAS_OK;
}

static atlas_status norm_replace(const tok_norm *n, const char *s, size_t len, char **out,
                                 size_t *out_len) {
    size_t cap = len + 1, o = 0;
    if (n->b_len > n->a_len) cap += (len / n->a_len + 1) * (n->b_len - n->a_len);
    char *d = malloc(cap);
    if (!d) return atlas_fail(ATLAS_ERR_NOMEM, "normalizer: Replace of %zu bytes", len);
    for (size_t i = 0; i < len;) {
        if (i + n->a_len <= len && memcmp(s + i, n->a, n->a_len) == 0) {
            memcpy(d + o, n->b, n->b_len);
            o += n->b_len;
            i += n->a_len;
        } else {
            d[o++] = s[i++];
        }
    }
    *out = d;
    *out_len = o;
    return ATLAS_OK;
}

static atlas_status norm_one(const tok_norm *n, const char *s, size_t len, char **out,
                             size_t *out_len) {
    *out = NULL;
    switch (n->kind) {
    case TOK_NORM_NFC:
    case TOK_NORM_NFD:
    case TOK_NORM_NFKC:
    case TOK_NORM_NFKD:
        if (is_ascii(s, len)) return ATLAS_OK; /* ASCII is invariant under every form */
        if (n->kind == TOK_NORM_NFC && surely_nfc(s, len)) return ATLAS_OK;
        return norm_unicode(n, s, len, out, out_len);
    case TOK_NORM_LOWERCASE: return norm_lowercase(s, len, out, out_len);
    case TOK_NORM_PREPEND:
        if (len == 0) return ATLAS_OK; /* HF prepends only to non-empty text */
        *out = malloc(len + n->a_len + 1);
        if (!*out) return atlas_fail(ATLAS_ERR_NOMEM, "normalizer: Prepend");
        memcpy(*out, n->a, n->a_len);
        memcpy(*out + n->a_len, s, len);
        *out_len = len + n->a_len;
        return ATLAS_OK;
    case TOK_NORM_REPLACE: return norm_replace(n, s, len, out, out_len);
    }
    return ATLAS_OK;
}

atlas_status tok_normalize(const atlas_tokenizer *tok, const char *s, size_t len, char **out,
                           size_t *out_len) {
    char *cur = NULL;
    size_t cur_len = len;
    for (size_t i = 0; i < tok->n_norms; i++) {
        char *next = NULL;
        size_t next_len = 0;
        atlas_status st = norm_one(&tok->norms[i], cur ? cur : s, cur_len, &next, &next_len);
        if (st != ATLAS_OK) {
            free(cur);
            return st;
        }
        if (next) {
            free(cur);
            cur = next;
            cur_len = next_len;
        }
    }
    *out = cur;
    *out_len = cur_len;
    return ATLAS_OK;
}

/* ---- added tokens ------------------------------------------------------------------------ */

/* Rust regex's \w, which HF uses for single_word: letters, marks, decimal and letter
 * numbers, connector punctuation ('_'), and the joiners U+200C/U+200D. */
static bool cp_is_word(uint32_t cp) {
    if (cp == 0x200c || cp == 0x200d) return true;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
           (c >= UTF8PROC_CATEGORY_MN && c <= UTF8PROC_CATEGORY_ME) || c == UTF8PROC_CATEGORY_ND ||
           c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_PC;
}

/* Rust's char::is_whitespace (the White_Space property). */
static bool cp_is_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

/* The code point that ends at s[end) (end > 0, valid UTF-8). */
static uint32_t cp_before(const char *s, size_t end, size_t *start) {
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xc0) == 0x80) i--;
    uint32_t cp = 0;
    tok_utf8_next((const unsigned char *)s + i, end - i, &cp);
    *start = i;
    return cp;
}

static uint32_t cp_at(const char *s, size_t len, size_t i, size_t *next) {
    uint32_t cp = 0;
    int r = tok_utf8_next((const unsigned char *)s + i, len - i, &cp);
    *next = i + (size_t)(r > 0 ? r : 1);
    return cp;
}

/* The longest token starting at s[i], or -1. */
static int32_t trie_match(const tok_trie *t, const char *s, size_t len, size_t i, size_t *end) {
    int32_t node = 0, best = -1;
    for (size_t j = i; j < len; j++) {
        int32_t ch = t->nodes[node].first_child;
        while (ch >= 0 && t->nodes[ch].byte != (unsigned char)s[j]) ch = t->nodes[ch].next_sibling;
        if (ch < 0) break;
        node = ch;
        if (t->nodes[node].added >= 0) {
            best = t->nodes[node].added;
            *end = j + 1;
        }
    }
    return best;
}

/* Whether a match of token a at [start, stop) passes single_word; widens it for lstrip and
 * rstrip (HF AddedVocabulary::find_matches). */
static bool added_accept(const tok_added *a, const char *s, size_t len, size_t seg_start,
                         size_t *start, size_t *stop) {
    size_t k;
    if (a->single_word) {
        if (*start > 0 && cp_is_word(cp_before(s, *start, &k))) return false;
        if (*stop < len && cp_is_word(cp_at(s, len, *stop, &k))) return false;
    }
    if (a->lstrip) {
        size_t st = *start;
        while (st > seg_start && cp_is_space(cp_before(s, st, &k))) st = k;
        *start = st;
    }
    if (a->rstrip) {
        size_t e = *stop;
        while (e < len && cp_is_space(cp_at(s, len, e, &k))) e = k;
        *stop = e;
    }
    return true;
}

/* Whether a match at p may not be a special token: p lies in a plain range of the raw text,
 * or (normalized text, whose offsets are not the raw ones) its raw segment overlaps one. */
static bool in_plain(const tok_ctx *c, const tok_trie *t, const char *p) {
    if (t != &c->tok->trie_raw) return c->seg_plain;
    size_t at = (size_t)(p - c->raw0);
    for (size_t i = 0; i < c->n_plain; i++)
        if (at >= c->plain[i].start && at < c->plain[i].end) return true;
    return false;
}

atlas_status tok_split_added(tok_ctx *c, const tok_trie *t, const char *s, size_t len,
                             tok_segment_fn fn, void *user) {
    size_t seg = 0; /* start of the pending plain segment */
    if (t->nodes) {
        for (size_t i = 0; i < len;) {
            unsigned char b = (unsigned char)s[i];
            size_t end = 0;
            int32_t a = -1;
            if (t->first[b >> 3] & (1u << (b & 7))) a = trie_match(t, s, len, i, &end);
            if (a >= 0 && c->n_plain && c->tok->added[a].special && in_plain(c, t, s + i))
                a = -1; /* client text: a special token's spelling stays text */
            if (a < 0) {
                i++;
                continue;
            }
            size_t start = i, stop = end;
            if (!added_accept(&c->tok->added[a], s, len, seg, &start, &stop)) {
                i = end; /* HF's matcher has consumed the match even when it is refused */
                continue;
            }
            if (start > seg) ATLAS_TRY(fn(c, s + seg, start - seg, -1, user));
            ATLAS_TRY(fn(c, s + start, stop - start, a, user));
            seg = stop;
            i = end > stop ? end : stop;
        }
    }
    if (seg < len || len == 0) ATLAS_TRY(fn(c, s + seg, len - seg, -1, user));
    return ATLAS_OK;
}

/* ---- pre-tokenizers ---------------------------------------------------------------------- */

pcre2_code *tok_regex_compile(const char *pattern, size_t len, bool literal, char *err,
                              size_t err_cap) {
    int code;
    PCRE2_SIZE off;
    uint32_t opt = PCRE2_UTF | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, len, opt, &code, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        snprintf(err, err_cap, "regex error at offset %zu: %s", (size_t)off, (char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* best effort: the interpreter also works */
    return re;
}

static atlas_status regex_match(tok_ctx *c, const pcre2_code *re, const char *s, size_t len,
                                size_t at, int *rc) {
    *rc = PCRE2_ERROR_NOMATCH;
    if (!c->md) {
        c->md = pcre2_match_data_create(4, NULL);
        if (!c->md) return atlas_fail(ATLAS_ERR_NOMEM, "tokenizer: regex match data");
    }
    *rc = pcre2_match(re, (PCRE2_SPTR)s, len, at, PCRE2_NO_UTF_CHECK, c->md, c->mctx);
    if (*rc == PCRE2_ERROR_JIT_STACKLIMIT && !c->mctx) {
        /* a long run of spaces can need more than the default 32 KiB JIT stack */
        c->mctx = pcre2_match_context_create(NULL);
        c->jit_stack = pcre2_jit_stack_create(64 * 1024, 256 * 1024 * 1024, NULL);
        if (!c->mctx || !c->jit_stack) return atlas_fail(ATLAS_ERR_NOMEM, "tokenizer: regex stack");
        pcre2_jit_stack_assign(c->mctx, NULL, c->jit_stack);
        *rc = pcre2_match(re, (PCRE2_SPTR)s, len, at, PCRE2_NO_UTF_CHECK, c->md, c->mctx);
    }
    if (*rc < 0 && *rc != PCRE2_ERROR_NOMATCH)
        return atlas_fail(ATLAS_ERR_RANGE, "tokenizer: regex match failed (%d) on a %zu-byte word",
                          *rc, len);
    return ATLAS_OK;
}

/* The words are never collected: each piece a pre-tokenizer makes goes straight through the
 * next ones and into BPE (tok_pretokenize recurses), so that a long text streams through
 * small buffers instead of filling arrays of millions of pieces. */

typedef struct seg_list {
    tok_seg *v;
    size_t n, cap;
} seg_list;

static atlas_status seg_push(seg_list *l, size_t a, size_t b, bool m) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 64;
        tok_seg *q = realloc(l->v, nc * sizeof *q);
        if (!q) return atlas_fail(ATLAS_ERR_NOMEM, "tokenizer: %zu regex matches", nc);
        l->v = q;
        l->cap = nc;
    }
    l->v[l->n++] = (tok_seg){(uint32_t)a, (uint32_t)b, m};
    return ATLAS_OK;
}

/* Calls fn on the segments of HF's Pattern::find_matches over s: the matches (true) and the
 * gaps between them (false), in order.  The match data is read before fn runs, as fn may
 * match again (a later pre-tokenizer). */
typedef atlas_status (*seg_fn)(tok_ctx *c, const tok_pretok *p, size_t k, const char *s,
                               size_t a, size_t b, bool match, void *user);

static atlas_status find_matches(tok_ctx *c, const tok_pretok *p, size_t k, const char *s,
                                 size_t len, seg_fn fn, void *user) {
    size_t prev = 0, at = 0;
    while (at <= len) {
        int rc;
        ATLAS_TRY(regex_match(c, p->re, s, len, at, &rc));
        if (rc < 0) break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t ms = ov[0], me = ov[1];
        if (prev != ms) ATLAS_TRY(fn(c, p, k, s, prev, ms, false, user));
        ATLAS_TRY(fn(c, p, k, s, ms, me, true, user));
        prev = me;
        at = me;
        if (me == ms) { /* step past an empty match by one character */
            if (at == len) break;
            at++;
            while (at < len && ((unsigned char)s[at] & 0xc0) == 0x80) at++;
        }
    }
    if (prev != len) ATLAS_TRY(fn(c, p, k, s, prev, len, false, user));
    return ATLAS_OK;
}

/* Isolated and Removed keep or drop each segment on its own: stream them. */
static atlas_status seg_direct(tok_ctx *c, const tok_pretok *p, size_t k, const char *s,
                               size_t a, size_t b, bool match, void *user) {
    (void)user;
    if (p->invert) match = !match;
    if (match && p->behavior == TOK_SPLIT_REMOVED) return ATLAS_OK;
    return tok_pretokenize(c, k + 1, s + a, b - a);
}

static atlas_status seg_collect(tok_ctx *c, const tok_pretok *p, size_t k, const char *s,
                                size_t a, size_t b, bool match, void *user) {
    (void)c, (void)p, (void)k, (void)s;
    return seg_push(user, a, b, match);
}

/* The merging behaviors (HF SplitDelimiterBehavior folds); returns the new count. */
static size_t fold_segments(tok_seg *g, size_t n, tok_split_behavior behavior) {
    size_t k = 0;
    bool prev_match = false;
    switch (behavior) {
    case TOK_SPLIT_MERGED_WITH_PREVIOUS:
        for (size_t i = 0; i < n; i++) {
            bool m = g[i].match;
            if (m && !prev_match && k > 0) g[k - 1].b = g[i].b;
            else g[k++] = g[i];
            prev_match = m;
        }
        return k;
    case TOK_SPLIT_MERGED_WITH_NEXT: /* the same fold from the right */
        k = n;
        for (size_t i = n; i-- > 0;) {
            bool m = g[i].match;
            if (m && !prev_match && k < n) g[k].a = g[i].a;
            else g[--k] = g[i];
            prev_match = m;
        }
        memmove(g, g + k, (n - k) * sizeof *g);
        return n - k;
    case TOK_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < n; i++) {
            bool m = g[i].match;
            if (m == prev_match && k > 0) g[k - 1].b = g[i].b;
            else g[k++] = g[i];
            prev_match = m;
        }
        return k;
    default: return n;
    }
}

static atlas_status split_piece(tok_ctx *c, const tok_pretok *p, size_t k, const char *s,
                                size_t len) {
    if (p->behavior == TOK_SPLIT_ISOLATED || p->behavior == TOK_SPLIT_REMOVED)
        return find_matches(c, p, k, s, len, seg_direct, NULL);
    seg_list l = {0};
    atlas_status st = find_matches(c, p, k, s, len, seg_collect, &l);
    if (st == ATLAS_OK) {
        for (size_t i = 0; i < l.n; i++) l.v[i].match ^= p->invert;
        size_t n = fold_segments(l.v, l.n, p->behavior);
        for (size_t i = 0; i < n && st == ATLAS_OK; i++)
            st = tok_pretokenize(c, k + 1, s + l.v[i].a, l.v[i].b - l.v[i].a);
    }
    free(l.v);
    return st;
}

/* ByteLevel: a space before each piece that lacks one (add_prefix_space), then the GPT-2
 * regex split (use_regex).  The byte-to-char mapping itself is implicit (see bpe.c). */
static atlas_status bytelevel_piece(tok_ctx *c, const tok_pretok *p, size_t k, const char *s,
                                    size_t len) {
    char *copy = NULL;
    if (p->add_prefix_space && s[0] != ' ') {
        copy = malloc(len + 1);
        if (!copy) return atlas_fail(ATLAS_ERR_NOMEM, "tokenizer: %zu bytes", len + 1);
        copy[0] = ' ';
        memcpy(copy + 1, s, len);
        s = copy;
        len++;
    }
    atlas_status st = p->re ? find_matches(c, p, k, s, len, seg_direct, NULL)
                            : tok_pretokenize(c, k + 1, s, len);
    free(copy);
    return st;
}

/* Metaspace, as HF's: spaces become the replacement; it is prepended (always, or where the
 * text begins) unless the piece already starts with it; with split, each replacement
 * starts a new word (MergedWithNext). */
static atlas_status metaspace_piece(tok_ctx *c, const tok_pretok *p, size_t k, const char *s,
                                    size_t len) {
    size_t spaces = 0;
    for (size_t i = 0; i < len; i++) spaces += s[i] == ' ';
    bool starts = s[0] == ' ' || (len >= p->rep_len && !memcmp(s, p->rep, p->rep_len));
    bool prepend = !starts && (p->prepend == TOK_PREPEND_ALWAYS ||
                               (p->prepend == TOK_PREPEND_FIRST && c->at_start));
    size_t n = len + spaces * (p->rep_len - 1) + (prepend ? p->rep_len : 0);
    char *buf = malloc(n ? n : 1);
    if (!buf) return atlas_fail(ATLAS_ERR_NOMEM, "pre-tokenizer: Metaspace");
    size_t o = 0;
    if (prepend) memcpy(buf, p->rep, p->rep_len), o = p->rep_len;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == ' ') memcpy(buf + o, p->rep, p->rep_len), o += p->rep_len;
        else buf[o++] = s[i];
    }
    atlas_status st = ATLAS_OK;
    if (!p->split) {
        st = tok_pretokenize(c, k + 1, buf, o);
    } else {
        size_t w = 0; /* start of the current word */
        for (size_t i = 1; st == ATLAS_OK && i + p->rep_len <= o; i++)
            if (!memcmp(buf + i, p->rep, p->rep_len)) {
                st = tok_pretokenize(c, k + 1, buf + w, i - w);
                w = i;
            }
        if (st == ATLAS_OK) st = tok_pretokenize(c, k + 1, buf + w, o - w);
    }
    free(buf);
    return st;
}

atlas_status tok_pretokenize(tok_ctx *c, size_t k, const char *s, size_t len) {
    if (len == 0) return ATLAS_OK; /* HF drops empty splits */
    if (k == c->tok->n_pretoks) return tok_bpe_word(c, s, len);
    const tok_pretok *p = &c->tok->pretoks[k];
    if (p->kind == TOK_PRE_SPLIT) return split_piece(c, p, k, s, len);
    if (p->kind == TOK_PRE_METASPACE) return metaspace_piece(c, p, k, s, len);
    return bytelevel_piece(c, p, k, s, len);
}

/* chat/shield.c — special tokens' spellings in client text become sentinels before a chat
 * template renders, and plain text after (see atlas/shield.h).
 *
 * A sentinel is U+E000 followed by two characters U+E100..U+EFFF that give the added token's
 * index in base 0xF00; a client's own U+E000 becomes U+E000 U+E0FF, so every U+E000 in the
 * rendered text is the shield's. */
#include "atlas/shield.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

enum { MARK = 0xE000, LITERAL = 0xE0FF, DIGIT0 = 0xE100, BASE = 0xF00 };

/* The tokenizer's special added tokens, by first byte, for scanning. */
typedef struct specials {
    const atlas_tokenizer *tok;
    size_t n_added;
    size_t longest;          /* bytes of the longest special token */
    unsigned char first[32]; /* bitmap of first bytes */
} specials;

static void specials_init(specials *sp, const atlas_tokenizer *tok) {
    memset(sp, 0, sizeof *sp);
    sp->tok = tok;
    sp->n_added = atlas_tokenizer_added_count(tok);
    for (size_t i = 0; i < sp->n_added; i++) {
        const char *t;
        size_t len;
        bool special;
        if (atlas_tokenizer_added_token(tok, i, &t, &len, NULL, &special) == ATLAS_OK &&
            special && len) {
            unsigned char b = (unsigned char)t[0];
            sp->first[b >> 3] |= (unsigned char)(1u << (b & 7));
            if (len > sp->longest) sp->longest = len;
        }
    }
}

/* The longest special token spelt at s[0..n), as its index; -1 if none. */
static long special_at(const specials *sp, const char *s, size_t n) {
    unsigned char b = (unsigned char)s[0];
    if (!(sp->first[b >> 3] & (1u << (b & 7)))) return -1;
    long best = -1;
    size_t best_len = 0;
    for (size_t i = 0; i < sp->n_added; i++) {
        const char *t;
        size_t len;
        bool special;
        atlas_tokenizer_added_token(sp->tok, i, &t, &len, NULL, &special);
        if (special && len > best_len && len <= n && !memcmp(s, t, len)) best = (long)i, best_len = len;
    }
    return best;
}

static size_t put_cp(char *o, unsigned cp) { /* cp in U+E000..U+EFFF: three bytes */
    o[0] = (char)(0xE0 | (cp >> 12));
    o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
}

/* The private-use character at s (three bytes), or 0. */
static unsigned get_cp(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    if (n < 3 || u[0] != 0xEE || (u[1] & 0xC0) != 0x80 || (u[2] & 0xC0) != 0x80) return 0;
    return 0xE000u | ((u[1] & 0x3Fu) << 6) | (u[2] & 0x3Fu);
}

/* s shielded into *out (malloc'd), or *out NULL when s has nothing to shield. */
static atlas_status shield_string(const specials *sp, const char *s, size_t n, char **out,
                                  size_t *out_len) {
    *out = NULL;
    char *o = NULL;
    size_t len = 0;
    for (size_t i = 0; i < n;) {
        long k = special_at(sp, s + i, n - i);
        bool mark = get_cp(s + i, n - i) == MARK;
        if (k < 0 && !mark) {
            if (o) o[len++] = s[i];
            i++;
            continue;
        }
        if (!o) { /* at most 9 bytes for any token of at least 1 byte, 6 for 3 */
            o = malloc(n * 9 + 1);
            if (!o) return atlas_fail(ATLAS_ERR_NOMEM, "shield: out of memory");
            memcpy(o, s, i);
            len = i;
        }
        len += put_cp(o + len, MARK);
        if (mark) {
            len += put_cp(o + len, LITERAL);
            i += 3;
            continue;
        }
        size_t tl;
        atlas_tokenizer_added_token(sp->tok, (size_t)k, NULL, &tl, NULL, NULL);
        len += put_cp(o + len, DIGIT0 + (unsigned)(k / BASE));
        len += put_cp(o + len, DIGIT0 + (unsigned)(k % BASE));
        i += tl;
    }
    if (o) o[len] = '\0', *out = o, *out_len = len;
    return ATLAS_OK;
}

/* Templates print keys too (tojson of a tool's parameters or a call's arguments, items()):
 * when one spells a special token, the object is rebuilt in the same order with every key
 * shielded. Shielded keys stay distinct, as shielding is one-to-one. */
static atlas_status shield_keys(const specials *sp, json_t *obj) {
    const char *key;
    size_t key_len;
    json_t *e, *copy = NULL;
    atlas_status st = ATLAS_OK;
    json_object_keylen_foreach(obj, key, key_len, e) {
        char *o;
        size_t len;
        if ((st = shield_string(sp, key, key_len, &o, &len)) != ATLAS_OK) break;
        if (!o && !copy) continue;
        if (!copy) { /* the first key to change: copy the keys before it as they are */
            if (!(copy = json_object())) {
                st = atlas_fail(ATLAS_ERR_NOMEM, "shield: out of memory");
                break;
            }
            const char *k2;
            size_t l2;
            json_t *e2;
            json_object_keylen_foreach(obj, k2, l2, e2) {
                if (k2 == key) break;
                if (json_object_setn_nocheck(copy, k2, l2, e2)) st = ATLAS_ERR_NOMEM;
            }
        }
        if (json_object_setn_nocheck(copy, o ? o : key, o ? len : key_len, e)) st = ATLAS_ERR_NOMEM;
        free(o);
        if (st != ATLAS_OK) {
            st = atlas_fail(ATLAS_ERR_NOMEM, "shield: out of memory");
            break;
        }
    }
    if (st == ATLAS_OK && copy) {
        json_object_clear(obj);
        json_object_keylen_foreach(copy, key, key_len, e)
            if (json_object_setn_nocheck(obj, key, key_len, e)) {
                st = atlas_fail(ATLAS_ERR_NOMEM, "shield: out of memory");
                break;
            }
    }
    json_decref(copy);
    return st;
}

static atlas_status shield_value(const specials *sp, json_t *v, int depth) {
    if (depth > 1000) return atlas_fail(ATLAS_ERR_INVALID, "shield: nested deeper than 1000");
    if (json_is_string(v)) {
        char *o;
        size_t len;
        ATLAS_TRY(shield_string(sp, json_string_value(v), json_string_length(v), &o, &len));
        if (o) {
            int rc = json_string_setn_nocheck(v, o, len);
            free(o);
            if (rc) return atlas_fail(ATLAS_ERR_NOMEM, "shield: out of memory");
        }
        return ATLAS_OK;
    }
    if (json_is_array(v)) {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) ATLAS_TRY(shield_value(sp, e, depth + 1));
    } else if (json_is_object(v)) {
        const char *key;
        json_t *e;
        json_object_foreach(v, key, e) ATLAS_TRY(shield_value(sp, e, depth + 1));
        return shield_keys(sp, v);
    }
    return ATLAS_OK;
}

atlas_status atlas_shield_json(const atlas_tokenizer *tok, json_t *v) {
    specials sp;
    specials_init(&sp, tok);
    return shield_value(&sp, v, 0);
}

/* A growing list of ranges. */
typedef struct ranges {
    atlas_text_range *r;
    size_t n, cap;
} ranges;

static bool ranges_add(ranges *g, size_t start, size_t end) {
    if (g->n == g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 8;
        atlas_text_range *r = realloc(g->r, cap * sizeof *r);
        if (!r) return false;
        g->r = r;
        g->cap = cap;
    }
    g->r[g->n++] = (atlas_text_range){start, end};
    return true;
}

/* Spells the sentinels of r back into *text; with rg, records where each special token's
 * spelling went (sorted, disjoint), and maps the n_cuts offsets of r in cuts to the text's
 * (in place). */
static atlas_status unshield(const atlas_tokenizer *tok, const char *r, size_t n, char **text,
                             size_t *text_len, ranges *rg, size_t *cuts, size_t n_cuts) {
    size_t n_added = atlas_tokenizer_added_count(tok), longest = 0;
    for (size_t i = 0; i < n_added; i++) {
        size_t len = 0;
        atlas_tokenizer_added_token(tok, i, NULL, &len, NULL, NULL);
        if (len > longest) longest = len;
    }
    /* a sentinel of 9 bytes becomes at most `longest` bytes */
    size_t cap = n + (longest > 9 ? (n / 9 + 1) * (longest - 9) : 0) + 1, len = 0, c = 0;
    char *o = malloc(cap);
    if (!o) return atlas_fail(ATLAS_ERR_NOMEM, "shield: out of memory");
    for (size_t i = 0; i < n;) {
        for (; c < n_cuts && cuts[c] <= i; c++) cuts[c] = len; /* inside a sentinel: its end */
        if (get_cp(r + i, n - i) != MARK) {
            o[len++] = r[i++];
            continue;
        }
        unsigned c1 = get_cp(r + i + 3, n - i - 3);
        unsigned c2 = c1 >= DIGIT0 ? get_cp(r + i + 6, n - i - 6) : 0;
        if (c1 == LITERAL) {
            len += put_cp(o + len, MARK);
            i += 6;
            continue;
        }
        size_t k = (size_t)(c1 - DIGIT0) * BASE + (c2 - DIGIT0);
        const char *t;
        size_t tl;
        if (c1 < DIGIT0 || c2 < DIGIT0 ||
            atlas_tokenizer_added_token(tok, k, &t, &tl, NULL, NULL) != ATLAS_OK) {
            o[len++] = r[i++]; /* a cut or foreign U+E000: the character it is */
            continue;
        }
        if (rg && !ranges_add(rg, len, len + tl)) {
            free(o);
            return atlas_fail(ATLAS_ERR_NOMEM, "shield: out of memory");
        }
        memcpy(o + len, t, tl);
        len += tl;
        i += 9;
    }
    for (; c < n_cuts; c++) cuts[c] = len;
    o[len] = '\0';
    *text = o;
    *text_len = len;
    return ATLAS_OK;
}

atlas_status atlas_shield_text(const atlas_tokenizer *tok, const char *rendered, size_t len,
                               char **text, size_t *text_len) {
    return unshield(tok, rendered, len, text, text_len, NULL, NULL, 0);
}

static int by_start(const void *a, const void *b) {
    const atlas_text_range *x = a, *y = b;
    return (x->start > y->start) - (x->start < y->start);
}

/* Adds to rg every position before a cut where a special token's spelling starts and runs
 * past the cut (its start made plain, so that the tokenizer does not match it there), then
 * sorts rg and merges what overlaps. */
static atlas_status plain_across(const atlas_tokenizer *tok, const char *text, size_t n,
                                 const size_t *cuts, size_t n_cuts, ranges *rg) {
    specials sp;
    specials_init(&sp, tok);
    size_t longest = sp.longest, sorted = rg->n;
    for (size_t c = 0, done = 0; c < n_cuts && longest > 1; c++) {
        size_t p = cuts[c] > longest - 1 ? cuts[c] - (longest - 1) : 0;
        if (p < done) p = done; /* positions the previous cut looked at */
        for (; p < cuts[c]; p++) {
            long k = special_at(&sp, text + p, n - p);
            size_t tl = 0;
            if (k >= 0) atlas_tokenizer_added_token(tok, (size_t)k, NULL, &tl, NULL, NULL);
            if (k >= 0 && p + tl > cuts[c] && !ranges_add(rg, p, p + 1))
                return atlas_fail(ATLAS_ERR_NOMEM, "shield: out of memory");
        }
        done = cuts[c];
    }
    if (rg->n == sorted) return ATLAS_OK;
    qsort(rg->r, rg->n, sizeof *rg->r, by_start);
    size_t k = 0;
    for (size_t i = 0; i < rg->n; i++) {
        if (k && rg->r[i].start <= rg->r[k - 1].end) {
            if (rg->r[i].end > rg->r[k - 1].end) rg->r[k - 1].end = rg->r[i].end;
        } else {
            rg->r[k++] = rg->r[i];
        }
    }
    rg->n = k;
    return ATLAS_OK;
}

atlas_status atlas_shield_encode_pieces(const atlas_tokenizer *tok, const char *rendered,
                                        size_t len, const size_t *cuts, size_t n_cuts,
                                        bool add_special, int32_t **ids, size_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    for (size_t i = 0; i < n_cuts; i++)
        if (cuts[i] > len || (i && cuts[i] < cuts[i - 1]))
            return atlas_fail(ATLAS_ERR_INVALID, "shield: cut %zu at %zu of %zu bytes: want "
                              "ascending offsets inside the text", i, cuts[i], len);
    size_t *mapped = NULL;
    if (n_cuts && !(mapped = malloc(n_cuts * sizeof *mapped)))
        return atlas_fail(ATLAS_ERR_NOMEM, "shield: out of memory");
    if (n_cuts) memcpy(mapped, cuts, n_cuts * sizeof *mapped);
    char *text = NULL;
    size_t n = 0;
    ranges rg = {0};
    atlas_status st = unshield(tok, rendered, len, &text, &n, &rg, mapped, n_cuts);
    if (st == ATLAS_OK) st = plain_across(tok, text, n, mapped, n_cuts, &rg);
    if (st == ATLAS_OK)
        st = atlas_tokenizer_encode_ranges(tok, text, n, add_special, rg.r, rg.n, ids, n_ids);
    free(text);
    free(rg.r);
    free(mapped);
    return st;
}

atlas_status atlas_shield_encode(const atlas_tokenizer *tok, const char *rendered, size_t len,
                                 bool add_special, int32_t **ids, size_t *n_ids) {
    return atlas_shield_encode_pieces(tok, rendered, len, NULL, 0, add_special, ids, n_ids);
}

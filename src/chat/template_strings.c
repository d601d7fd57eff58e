/* chat/template_strings.c — what jinja2's filters, tests and the Python str / dict /
 * list methods share: their arguments, code points, case, strip / split / replace, and the
 * list a value iterates as (template_filters.c and template_methods.c use them). */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "chat/template_internal.h"
#include "core/error.h"

/* ---- arguments ----------------------------------------------------------------------- */

/* The idx-th positional argument or the keyword kw; NULL when absent. */
const tval *tpl_arg(const fargs *a, size_t idx, const char *kw) {
    for (size_t i = 0; kw && i < a->nkw; i++)
        if (!strcmp(a->kwn[i], kw)) return &a->kwv[i];
    return idx < a->npos ? &a->pos[idx] : NULL;
}

atlas_status tpl_need_str(trender *r, const tnode *at, const char *what, const tval *v) {
    if (v->kind == TV_UNDEF) return tpl_err(r, at, "%s", v->undef_name ? v->undef_name : "undefined value");
    return tpl_err(r, at, "%s expects a string, got '%s'", what, tv_type_name(v));
}

atlas_status tpl_from_buf(trender *r, const tnode *at, tbuf *b, tval *out) {
    atlas_status st = b->oom ? tpl_oom(r, at) : tv_str(r, b->p ? b->p : "", b->n, out);
    free(b->p);
    return st;
}

atlas_status tpl_from_pieces(trender *r, const tnode *at, tbuf *b, tval *out) {
    atlas_status st = b->oom ? tpl_oom(r, at) : tv_str(r, b->p ? b->p : "", b->n, out);
    size_t n = tbuf_inner_cuts(b); /* its edges are the printer's own cuts */
    if (st == ATLAS_OK && n) {
        size_t *c = tpl_alloc_raw(r, n * sizeof *c);
        if (!c) st = tpl_oom(r, at);
        else memcpy(c, b->cuts, n * sizeof *c), out->u.s->cuts = c, out->u.s->n_cuts = n;
    }
    free(b->p);
    free(b->cuts);
    return st;
}

/* ---- unicode helpers ----------------------------------------------------------------- */
bool tpl_is_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Decodes the code point at s[i]; returns its byte length (1 for invalid bytes). */
size_t tpl_cp_at(const char *s, size_t n, size_t i, uint32_t *cp) {
    utf8proc_int32_t c;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &c);
    if (k <= 0) {
        *cp = (unsigned char)s[i];
        return 1;
    }
    *cp = (uint32_t)c;
    return (size_t)k;
}

static void put_cp(tbuf *b, uint32_t cp) {
    utf8proc_uint8_t enc[4];
    utf8proc_ssize_t k = utf8proc_encode_char((utf8proc_int32_t)cp, enc);
    tbuf_put(b, (const char *)enc, (size_t)k);
}

/* mode: 'u' upper, 'l' lower, 'c' capitalize, 't' title */
atlas_status tpl_change_case(trender *r, const tnode *at, const tval *v, char mode, tval *out) {
    const tstr *s = v->u.s;
    tbuf b = {0};
    bool prev_cased = false;
    for (size_t i = 0; i < s->len;) {
        uint32_t cp;
        size_t k = tpl_cp_at(s->s, s->len, i, &cp);
        if (k == 1 && cp >= 0x80) {
            tbuf_put(&b, s->s + i, 1);
            i++;
            continue;
        }
        bool up = mode == 'u' || (mode == 'c' && i == 0) || (mode == 't' && !prev_cased);
        if (up && cp == 0xDF) { /* Python's full case mapping: "ß".upper() == "SS" */
            tbuf_puts(&b, mode == 'u' ? "SS" : "Ss");
            prev_cased = true;
            i += k;
            continue;
        }
        uint32_t o = up ? (uint32_t)utf8proc_toupper((utf8proc_int32_t)cp) : (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
        const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
        prev_cased = p->category == UTF8PROC_CATEGORY_LU || p->category == UTF8PROC_CATEGORY_LL || p->category == UTF8PROC_CATEGORY_LT;
        put_cp(&b, o);
        i += k;
    }
    return tpl_from_buf(r, at, &b, out);
}

/* which: 0 both, 1 left, 2 right. chars: NULL/None -> whitespace */
atlas_status tpl_str_strip(trender *r, const tval *s, const tval *chars, int which, tval *out) {
    const char *p = s->u.s->s;
    size_t a = 0, b = s->u.s->len;
    bool ws = !chars || chars->kind == TV_NONE || chars->kind == TV_UNDEF;
    #define STRIP_MATCH(cp, k, pos)                                                              \
        (ws ? tpl_is_space(cp)                                                                   \
            : (memmem(chars->u.s->s, chars->u.s->len, p + (pos), (k)) != NULL))
    if (which != 2)
        while (a < b) {
            uint32_t cp;
            size_t k = tpl_cp_at(p, b, a, &cp);
            if (!STRIP_MATCH(cp, k, a)) break;
            a += k;
        }
    if (which != 1)
        while (b > a) {
            size_t st = b - 1;
            while (st > a && ((unsigned char)p[st] & 0xC0) == 0x80) st--;
            uint32_t cp;
            size_t k = tpl_cp_at(p, b, st, &cp);
            if (!STRIP_MATCH(cp, k, st)) break;
            b = st;
        }
    #undef STRIP_MATCH
    return tv_str(r, p + a, b - a, out);
}

atlas_status tpl_str_split(trender *r, const tnode *at, const tval *s, const tval *sep, long long maxsplit, tval *out) {
    const char *p = s->u.s->s;
    size_t n = s->u.s->len;
    ATLAS_TRY(tv_list(r, 0, out));
    tval piece;
    if (sep && sep->kind == TV_STR) {
        size_t sl = sep->u.s->len;
        if (!sl) return tpl_err(r, at, "split(): empty separator");
        size_t i = 0;
        for (long long k = 0; maxsplit < 0 || k < maxsplit; k++) {
            const char *f = memmem(p + i, n - i, sep->u.s->s, sl);
            if (!f) break;
            ATLAS_TRY(tv_str(r, p + i, (size_t)(f - (p + i)), &piece));
            ATLAS_TRY(tv_list_push(r, out, piece));
            i = (size_t)(f - p) + sl;
        }
        ATLAS_TRY(tv_str(r, p + i, n - i, &piece));
        return tv_list_push(r, out, piece);
    }
    if (sep && sep->kind != TV_NONE) return tpl_need_str(r, at, "split()", sep);
    size_t i = 0;
    long long k = 0;
    for (;;) {
        uint32_t cp;
        while (i < n && tpl_is_space((tpl_cp_at(p, n, i, &cp), cp))) i += tpl_cp_at(p, n, i, &cp);
        if (i >= n) break;
        if (maxsplit >= 0 && k >= maxsplit) {
            size_t e = n;
            while (e > i && tpl_is_space((unsigned char)p[e - 1])) e--;
            ATLAS_TRY(tv_str(r, p + i, e - i, &piece));
            return tv_list_push(r, out, piece);
        }
        size_t j = i;
        while (j < n && !tpl_is_space((tpl_cp_at(p, n, j, &cp), cp))) j += tpl_cp_at(p, n, j, &cp);
        ATLAS_TRY(tv_str(r, p + i, j - i, &piece));
        ATLAS_TRY(tv_list_push(r, out, piece));
        k++;
        i = j;
    }
    return ATLAS_OK;
}

atlas_status tpl_str_replace(trender *r, const tnode *at, const tval *s, const tval *old, const tval *new_,
                                long long count, tval *out) {
    if (old->kind != TV_STR) return tpl_need_str(r, at, "replace()", old);
    if (new_->kind != TV_STR) return tpl_need_str(r, at, "replace()", new_);
    tbuf b = {0};
    const char *p = s->u.s->s;
    size_t n = s->u.s->len, ol = old->u.s->len, i = 0;
    long long done = 0;
    if (!ol) { /* Python inserts new between every character */
        for (;;) {
            if (count >= 0 && done >= count) break;
            tbuf_put(&b, new_->u.s->s, new_->u.s->len);
            done++;
            if (i >= n) break;
            uint32_t cp;
            size_t k = tpl_cp_at(p, n, i, &cp);
            tbuf_put(&b, p + i, k);
            i += k;
        }
        tbuf_put(&b, p + i, n - i);
        return tpl_from_buf(r, at, &b, out);
    }
    while (count < 0 || done < count) {
        const char *f = memmem(p + i, n - i, old->u.s->s, ol);
        if (!f) break;
        tbuf_put(&b, p + i, (size_t)(f - (p + i)));
        tbuf_put(&b, new_->u.s->s, new_->u.s->len);
        i = (size_t)(f - p) + ol;
        done++;
    }
    tbuf_put(&b, p + i, n - i);
    return tpl_from_buf(r, at, &b, out);
}

bool tpl_affix(const tval *s, const tval *x, bool start) {
    if (x->kind != TV_STR || x->u.s->len > s->u.s->len) return false;
    size_t off = start ? 0 : s->u.s->len - x->u.s->len;
    return !memcmp(s->u.s->s + off, x->u.s->s, x->u.s->len);
}

/* ---- sequences ----------------------------------------------------------------------- */
atlas_status tpl_to_list(trender *r, const tnode *at, const tval *v, tval *out) {
    if (v->kind == TV_LIST) {
        ATLAS_TRY(tv_list(r, v->u.l->n, out));
        for (size_t i = 0; i < v->u.l->n; i++) ATLAS_TRY(tv_list_push(r, out, v->u.l->v[i]));
        return ATLAS_OK;
    }
    if (v->kind == TV_UNDEF) return tv_list(r, 0, out);
    if (v->kind == TV_DICT && !v->u.d->ns) {
        ATLAS_TRY(tv_list(r, v->u.d->n, out));
        for (size_t i = 0; i < v->u.d->n; i++) ATLAS_TRY(tv_list_push(r, out, v->u.d->k[i]));
        return ATLAS_OK;
    }
    if (v->kind == TV_STR) {
        ATLAS_TRY(tv_list(r, 0, out));
        const tstr *s = v->u.s;
        for (size_t i = 0; i < s->len;) {
            uint32_t cp;
            size_t k = tpl_cp_at(s->s, s->len, i, &cp);
            tval c;
            ATLAS_TRY(tv_str(r, s->s + i, k, &c));
            ATLAS_TRY(tv_list_push(r, out, c));
            i += k;
        }
        return ATLAS_OK;
    }
    return tpl_err(r, at, "'%s' object is not iterable", tv_type_name(v));
}

atlas_status tpl_items_of(trender *r, const tnode *at, const tval *v, tval *out) {
    if (v->kind == TV_UNDEF) return tv_list(r, 0, out);
    if (v->kind != TV_DICT) return tpl_err(r, at, "items() needs a mapping, got '%s'", tv_type_name(v));
    ATLAS_TRY(tv_list(r, v->u.d->n, out));
    for (size_t i = 0; i < v->u.d->n; i++) {
        tval pair;
        ATLAS_TRY(tv_list(r, 2, &pair));
        pair.u.l->tuple = true;
        ATLAS_TRY(tv_list_push(r, &pair, v->u.d->k[i]));
        ATLAS_TRY(tv_list_push(r, &pair, v->u.d->v[i]));
        ATLAS_TRY(tv_list_push(r, out, pair));
    }
    return ATLAS_OK;
}

/* Looks up a dotted attribute path ("function.name") for map/selectattr/sort/join. */

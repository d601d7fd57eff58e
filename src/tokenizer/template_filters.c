/* tokenizer/template_filters.c — jinja2's filters and tests, and the Python str / dict /
 * list methods that chat templates call (message.content.strip(), tool.items(), ...).
 * Mutating methods (append, pop, update) are refused, as transformers' immutable sandbox
 * refuses them. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "core/error.h"
#include "tokenizer/template_internal.h"

/* ---- arguments ----------------------------------------------------------------------- */
typedef struct fargs {
    tval *pos;
    size_t npos;
    const char **kwn;
    tval *kwv;
    size_t nkw;
} fargs;

/* The idx-th positional argument or the keyword kw; NULL when absent. */
static const tval *arg(const fargs *a, size_t idx, const char *kw) {
    for (size_t i = 0; kw && i < a->nkw; i++)
        if (!strcmp(a->kwn[i], kw)) return &a->kwv[i];
    return idx < a->npos ? &a->pos[idx] : NULL;
}

static atlas_status need_str(trender *r, const tnode *at, const char *what, const tval *v) {
    if (v->kind == TV_UNDEF) return tpl_err(r, at, "%s", v->undef_name ? v->undef_name : "undefined value");
    return tpl_err(r, at, "%s expects a string, got '%s'", what, tv_type_name(v));
}

static atlas_status from_buf(trender *r, const tnode *at, tbuf *b, tval *out) {
    atlas_status st = b->oom ? tpl_oom(r, at) : tv_str(r, b->p ? b->p : "", b->n, out);
    free(b->p);
    return st;
}

/* ---- unicode helpers ----------------------------------------------------------------- */
bool tpl_is_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Decodes the code point at s[i]; returns its byte length (1 for invalid bytes). */
static size_t cp_at(const char *s, size_t n, size_t i, uint32_t *cp) {
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
static atlas_status change_case(trender *r, const tnode *at, const tval *v, char mode, tval *out) {
    const tstr *s = v->u.s;
    tbuf b = {0};
    bool prev_cased = false;
    for (size_t i = 0; i < s->len;) {
        uint32_t cp;
        size_t k = cp_at(s->s, s->len, i, &cp);
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
    return from_buf(r, at, &b, out);
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
            size_t k = cp_at(p, b, a, &cp);
            if (!STRIP_MATCH(cp, k, a)) break;
            a += k;
        }
    if (which != 1)
        while (b > a) {
            size_t st = b - 1;
            while (st > a && ((unsigned char)p[st] & 0xC0) == 0x80) st--;
            uint32_t cp;
            size_t k = cp_at(p, b, st, &cp);
            if (!STRIP_MATCH(cp, k, st)) break;
            b = st;
        }
    #undef STRIP_MATCH
    return tv_str(r, p + a, b - a, out);
}

static atlas_status str_split(trender *r, const tnode *at, const tval *s, const tval *sep, long long maxsplit, tval *out) {
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
    if (sep && sep->kind != TV_NONE) return need_str(r, at, "split()", sep);
    size_t i = 0;
    long long k = 0;
    for (;;) {
        uint32_t cp;
        while (i < n && tpl_is_space((cp_at(p, n, i, &cp), cp))) i += cp_at(p, n, i, &cp);
        if (i >= n) break;
        if (maxsplit >= 0 && k >= maxsplit) {
            size_t e = n;
            while (e > i && tpl_is_space((unsigned char)p[e - 1])) e--;
            ATLAS_TRY(tv_str(r, p + i, e - i, &piece));
            return tv_list_push(r, out, piece);
        }
        size_t j = i;
        while (j < n && !tpl_is_space((cp_at(p, n, j, &cp), cp))) j += cp_at(p, n, j, &cp);
        ATLAS_TRY(tv_str(r, p + i, j - i, &piece));
        ATLAS_TRY(tv_list_push(r, out, piece));
        k++;
        i = j;
    }
    return ATLAS_OK;
}

static atlas_status str_replace(trender *r, const tnode *at, const tval *s, const tval *old, const tval *new_,
                                long long count, tval *out) {
    if (old->kind != TV_STR) return need_str(r, at, "replace()", old);
    if (new_->kind != TV_STR) return need_str(r, at, "replace()", new_);
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
            size_t k = cp_at(p, n, i, &cp);
            tbuf_put(&b, p + i, k);
            i += k;
        }
        tbuf_put(&b, p + i, n - i);
        return from_buf(r, at, &b, out);
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
    return from_buf(r, at, &b, out);
}

static bool affix(const tval *s, const tval *x, bool start) {
    if (x->kind != TV_STR || x->u.s->len > s->u.s->len) return false;
    size_t off = start ? 0 : s->u.s->len - x->u.s->len;
    return !memcmp(s->u.s->s + off, x->u.s->s, x->u.s->len);
}

/* ---- sequences ----------------------------------------------------------------------- */
static atlas_status to_list(trender *r, const tnode *at, const tval *v, tval *out) {
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
            size_t k = cp_at(s->s, s->len, i, &cp);
            tval c;
            ATLAS_TRY(tv_str(r, s->s + i, k, &c));
            ATLAS_TRY(tv_list_push(r, out, c));
            i += k;
        }
        return ATLAS_OK;
    }
    return tpl_err(r, at, "'%s' object is not iterable", tv_type_name(v));
}

static atlas_status items_of(trender *r, const tnode *at, const tval *v, tval *out) {
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
static tval attr_path(const tval *v, const char *path) {
    tval cur = *v;
    char part[128];
    while (*path) {
        size_t k = strcspn(path, ".");
        if (k >= sizeof part) return tv_undef(NULL);
        memcpy(part, path, k);
        part[k] = 0;
        path += k + (path[k] == '.');
        if (cur.kind == TV_LIST) {
            char *end;
            long idx = strtol(part, &end, 10);
            if (*end || idx < 0 || (size_t)idx >= cur.u.l->n) return tv_undef(NULL);
            cur = cur.u.l->v[idx];
            continue;
        }
        if (cur.kind != TV_DICT) return tv_undef(NULL);
        const tval *x = tv_dict_get(&cur, part);
        if (!x) return tv_undef(NULL);
        cur = *x;
    }
    return cur;
}

static tval casefold_key(trender *r, const tval *v, bool case_sensitive) {
    if (case_sensitive || v->kind != TV_STR) return *v;
    tval out;
    if (change_case(r, NULL, v, 'l', &out) != ATLAS_OK) return *v;
    return out;
}

typedef struct sort_item {
    tval key, val;
} sort_item;

/* Stable merge sort (Python's sort is stable); reports values that cannot be ordered. */
static atlas_status sort_values(trender *r, const tnode *at, sort_item *it, size_t n, bool reverse) {
    sort_item *tmp = tpl_alloc_raw(r, (n + 1) * sizeof *tmp);
    if (!tmp) return tpl_oom(r, at);
    for (size_t width = 1; width < n; width *= 2) {
        ATLAS_TRY(tpl_charge(r, at, n));
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int c = tv_compare(&it[i].key, &it[j].key);
                if (c == -2)
                    return tpl_err(r, at, "cannot sort: '<' not supported between '%s' and '%s'",
                                   tv_type_name(&it[i].key), tv_type_name(&it[j].key));
                bool take_right = reverse ? c < 0 : c > 0;
                tmp[k++] = take_right ? it[j++] : it[i++];
            }
            while (i < mid) tmp[k++] = it[i++];
            while (j < hi) tmp[k++] = it[j++];
        }
        memcpy(it, tmp, n * sizeof *it);
    }
    return ATLAS_OK;
}

static atlas_status filter_sort(trender *r, const tnode *at, const tval *v, const fargs *a, bool dictsort, tval *out) {
    tval items;
    const tval *rev = arg(a, dictsort ? 2 : 0, "reverse"), *cs = arg(a, dictsort ? 0 : 1, "case_sensitive");
    const tval *attr = dictsort ? NULL : arg(a, 2, "attribute"), *by = dictsort ? arg(a, 1, "by") : NULL;
    if (dictsort) ATLAS_TRY(items_of(r, at, v, &items));
    else ATLAS_TRY(to_list(r, at, v, &items));
    size_t n = items.u.l->n;
    sort_item *it = tpl_alloc(r, (n + 1) * sizeof *it);
    if (!it) return tpl_oom(r, at);
    bool by_value = by && by->kind == TV_STR && !strcmp(by->u.s->s, "value");
    for (size_t i = 0; i < n; i++) {
        tval k = items.u.l->v[i];
        if (dictsort) k = k.u.l->v[by_value ? 1 : 0];
        else if (attr && attr->kind == TV_STR) k = attr_path(&k, attr->u.s->s);
        it[i].key = casefold_key(r, &k, cs && tv_truthy(cs));
        it[i].val = items.u.l->v[i];
    }
    ATLAS_TRY(sort_values(r, at, it, n, rev && tv_truthy(rev)));
    ATLAS_TRY(tv_list(r, n, out));
    for (size_t i = 0; i < n; i++) ATLAS_TRY(tv_list_push(r, out, it[i].val));
    return ATLAS_OK;
}

/* select / reject / selectattr / rejectattr */
static atlas_status filter_select(trender *r, const tnode *at, const tval *v, const fargs *a, bool attr, bool keep,
                                  tval *out) {
    tval items;
    ATLAS_TRY(to_list(r, at, v, &items));
    size_t first = attr ? 1 : 0;
    const char *test = NULL;
    if (attr && (a->npos < 1 || a->pos[0].kind != TV_STR)) return tpl_err(r, at, "selectattr/rejectattr need an attribute name");
    if (a->npos > first) {
        if (a->pos[first].kind != TV_STR) return tpl_err(r, at, "the test name must be a string");
        test = a->pos[first].u.s->s;
    }
    ATLAS_TRY(tv_list(r, 0, out));
    for (size_t i = 0; i < items.u.l->n; i++) {
        tval x = items.u.l->v[i];
        if (attr) x = attr_path(&x, a->pos[0].u.s->s);
        bool res;
        if (test) {
            size_t na = a->npos > first + 1 ? a->npos - first - 1 : 0;
            ATLAS_TRY(tpl_test(r, at, test, &x, a->pos + first + 1, na, &res));
        } else {
            res = tv_truthy(&x);
        }
        if (res == keep) ATLAS_TRY(tv_list_push(r, out, items.u.l->v[i]));
    }
    return ATLAS_OK;
}

static atlas_status filter_map(trender *r, tscope *sc, const tnode *at, const tval *v, const fargs *a, tval *out) {
    tval items;
    ATLAS_TRY(to_list(r, at, v, &items));
    const tval *attr = arg(a, (size_t)-1, "attribute"), *def = arg(a, (size_t)-1, "default");
    if (!attr && (a->npos < 1 || a->pos[0].kind != TV_STR)) return tpl_err(r, at, "map() needs a filter name or attribute=");
    ATLAS_TRY(tv_list(r, items.u.l->n, out));
    for (size_t i = 0; i < items.u.l->n; i++) {
        tval x = items.u.l->v[i], y;
        if (attr) {
            if (attr->kind != TV_STR) return tpl_err(r, at, "map(attribute=) needs a string");
            y = attr_path(&x, attr->u.s->s);
            if (y.kind == TV_UNDEF && def) y = *def;
        } else {
            ATLAS_TRY(tpl_filter(r, sc, at, a->pos[0].u.s->s, x, a->pos + 1, a->npos - 1, NULL, NULL, 0, &y));
        }
        ATLAS_TRY(tv_list_push(r, out, y));
    }
    return ATLAS_OK;
}

static atlas_status filter_join(trender *r, const tnode *at, const tval *v, const fargs *a, tval *out) {
    tval items;
    ATLAS_TRY(to_list(r, at, v, &items));
    const tval *sep = arg(a, 0, "d"), *attr = arg(a, 1, "attribute");
    tbuf b = {0};
    for (size_t i = 0; i < items.u.l->n; i++) {
        if (i && sep) tv_to_str(&b, sep, false);
        tval x = items.u.l->v[i];
        if (attr && attr->kind == TV_STR) x = attr_path(&x, attr->u.s->s);
        tv_to_str(&b, &x, false);
    }
    return from_buf(r, at, &b, out);
}

/* transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
static atlas_status filter_tojson(trender *r, const tnode *at, const tval *v, const fargs *a, tval *out) {
    const tval *ascii = arg(a, 0, "ensure_ascii"), *ind = arg(a, 1, "indent"), *seps = arg(a, 2, "separators"),
               *sk = arg(a, 3, "sort_keys");
    tjson_opts o = {.indent = -1, .key_sep = ": ", .sort_keys = sk && tv_truthy(sk), .ascii = ascii && tv_truthy(ascii)};
    if (ind && ind->kind == TV_INT) o.indent = ind->u.i < 0 ? 0 : ind->u.i > 64 ? 64 : (int)ind->u.i;
    else if (ind && ind->kind != TV_NONE) return tpl_err(r, at, "tojson(indent=) needs an integer");
    o.item_sep = o.indent >= 0 ? "," : ", ";
    if (seps && seps->kind == TV_LIST && seps->u.l->n == 2 && seps->u.l->v[0].kind == TV_STR &&
        seps->u.l->v[1].kind == TV_STR) {
        o.item_sep = seps->u.l->v[0].u.s->s;
        o.key_sep = seps->u.l->v[1].u.s->s;
    }
    tbuf b = {0};
    if (!tv_to_json(&b, v, &o, 0)) {
        free(b.p);
        if (v->kind == TV_UNDEF) return tpl_err(r, at, "tojson: %s", v->undef_name ? v->undef_name : "value is undefined");
        return tpl_err(r, at, "tojson: a value of type '%s' is not JSON serializable", tv_type_name(v));
    }
    return from_buf(r, at, &b, out);
}

static atlas_status filter_indent(trender *r, const tnode *at, const tval *v, const fargs *a, tval *out) {
    const tval *w = arg(a, 0, "width"), *first = arg(a, 1, "first"), *blank = arg(a, 2, "blank");
    tbuf pad = {0}, b = {0};
    if (w && w->kind == TV_STR) tbuf_put(&pad, w->u.s->s, w->u.s->len);
    else for (long long i = 0; i < (w && w->kind == TV_INT ? w->u.i : 4) && i < 256; i++) tbuf_putc(&pad, ' ');
    tval s;
    ATLAS_TRY(tv_stringify(r, v, &s));
    const char *p = s.u.s->s, *end = p + s.u.s->len;
    bool first_line = true;
    while (p <= end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        bool is_blank = le == p;
        if (!(first_line && !(first && tv_truthy(first))) && (!is_blank || (blank && tv_truthy(blank))))
            tbuf_put(&b, pad.p ? pad.p : "", pad.n);
        tbuf_put(&b, p, (size_t)(le - p));
        first_line = false;
        if (!nl) break;
        tbuf_putc(&b, '\n');
        p = nl + 1;
    }
    free(pad.p);
    return from_buf(r, at, &b, out);
}

static atlas_status html_escape(trender *r, const tnode *at, const tval *v, tval *out) {
    tval s;
    ATLAS_TRY(tv_stringify(r, v, &s));
    tbuf b = {0};
    for (size_t i = 0; i < s.u.s->len; i++) {
        char c = s.u.s->s[i];
        switch (c) {
        case '&': tbuf_puts(&b, "&amp;"); break;
        case '<': tbuf_puts(&b, "&lt;"); break;
        case '>': tbuf_puts(&b, "&gt;"); break;
        case '"': tbuf_puts(&b, "&#34;"); break;
        case '\'': tbuf_puts(&b, "&#39;"); break;
        default: tbuf_putc(&b, c);
        }
    }
    return from_buf(r, at, &b, out);
}

/* printf-style "%s" % args (the format filter and the % operator on strings) */
atlas_status tpl_percent_format(trender *r, const tnode *at, const tval *fmt, const tval *args, size_t nargs, tval *out) {
    tbuf b = {0};
    size_t k = 0;
    const char *p = fmt->u.s->s;
    for (size_t i = 0; i < fmt->u.s->len; i++) {
        if (p[i] != '%') {
            tbuf_putc(&b, p[i]);
            continue;
        }
        char c = i + 1 < fmt->u.s->len ? p[++i] : 0;
        if (c == '%') {
            tbuf_putc(&b, '%');
            continue;
        }
        if (k >= nargs) {
            free(b.p);
            return tpl_err(r, at, "not enough arguments for format string");
        }
        const tval *x = &args[k++];
        if (c == 's') tv_to_str(&b, x, false);
        else if (c == 'r') tv_to_str(&b, x, true);
        else if (c == 'd' || c == 'i') {
            tval t = x->kind == TV_FLOAT ? tv_int((long long)x->u.f) : *x;
            tv_to_str(&b, &t, false);
        } else {
            free(b.p);
            return tpl_err(r, at, "unsupported format character '%c'", c ? c : '?');
        }
    }
    return from_buf(r, at, &b, out);
}

static atlas_status to_int(trender *r, const tnode *at, const tval *v, const fargs *a, tval *out) {
    const tval *def = arg(a, 0, "default");
    tval d = def ? *def : tv_int(0);
    switch (v->kind) {
    case TV_INT: *out = *v; return ATLAS_OK;
    case TV_BOOL: *out = tv_int(v->u.b); return ATLAS_OK;
    case TV_FLOAT:
        if (!isfinite(v->u.f) || fabs(v->u.f) > 9.2e18) break;
        *out = tv_int((long long)v->u.f);
        return ATLAS_OK;
    case TV_STR: {
        char *end;
        const char *s = v->u.s->s;
        long long i = strtoll(s, &end, 10);
        while (*end && tpl_is_space((unsigned char)*end)) end++;
        if (end != s && !*end) {
            *out = tv_int(i);
            return ATLAS_OK;
        }
        double f = strtod(s, &end);
        while (*end && tpl_is_space((unsigned char)*end)) end++;
        bool decimal = !strpbrk(s, "xXpP"); /* Python's float() takes no hex */
        if (decimal && end != s && !*end && isfinite(f) && fabs(f) < 9.2e18) {
            *out = tv_int((long long)f);
            return ATLAS_OK;
        }
        break;
    }
    default: break;
    }
    (void)r;
    (void)at;
    *out = d;
    return ATLAS_OK;
}

static atlas_status length_of(trender *r, const tnode *at, const tval *v, tval *out) {
    switch (v->kind) {
    case TV_STR: *out = tv_int((long long)tpl_utf8_count(v->u.s->s, v->u.s->len)); return ATLAS_OK;
    case TV_LIST: *out = tv_int((long long)v->u.l->n); return ATLAS_OK;
    case TV_DICT: *out = tv_int((long long)v->u.d->n); return ATLAS_OK;
    case TV_UNDEF: *out = tv_int(0); return ATLAS_OK;
    default: return tpl_err(r, at, "object of type '%s' has no len()", tv_type_name(v));
    }
}

static atlas_status first_last(trender *r, const tnode *at, const tval *v, bool last, tval *out) {
    tval items;
    ATLAS_TRY(to_list(r, at, v, &items));
    if (!items.u.l->n) *out = tv_undef(last ? "last: the sequence is empty" : "first: the sequence is empty");
    else *out = items.u.l->v[last ? items.u.l->n - 1 : 0];
    return ATLAS_OK;
}

static atlas_status min_max_sum(trender *r, const tnode *at, const tval *v, const fargs *a, int which, tval *out) {
    tval items;
    ATLAS_TRY(to_list(r, at, v, &items));
    const tval *attr = arg(a, which == 2 ? 0 : 1, "attribute");
    if (which == 2) {
        const tval *start = arg(a, 1, "start");
        tval acc = start ? *start : tv_int(0);
        for (size_t i = 0; i < items.u.l->n; i++) {
            tval x = items.u.l->v[i];
            if (attr && attr->kind == TV_STR) x = attr_path(&x, attr->u.s->s);
            tbuf dummy = {0};
            (void)dummy;
            if (!((x.kind == TV_INT || x.kind == TV_FLOAT || x.kind == TV_BOOL) &&
                  (acc.kind == TV_INT || acc.kind == TV_FLOAT || acc.kind == TV_BOOL)))
                return tpl_err(r, at, "sum: cannot add '%s' and '%s'", tv_type_name(&acc), tv_type_name(&x));
            if (acc.kind == TV_FLOAT || x.kind == TV_FLOAT)
                acc = tv_float((acc.kind == TV_FLOAT ? acc.u.f : (double)(acc.kind == TV_INT ? acc.u.i : acc.u.b)) +
                               (x.kind == TV_FLOAT ? x.u.f : (double)(x.kind == TV_INT ? x.u.i : x.u.b)));
            else {
                long long s;
                if (__builtin_add_overflow(acc.kind == TV_INT ? acc.u.i : acc.u.b, x.kind == TV_INT ? x.u.i : x.u.b, &s))
                    return tpl_err(r, at, "sum: integer overflow");
                acc = tv_int(s);
            }
        }
        *out = acc;
        return ATLAS_OK;
    }
    if (!items.u.l->n) {
        *out = tv_undef("min/max of an empty sequence");
        return ATLAS_OK;
    }
    *out = items.u.l->v[0];
    for (size_t i = 1; i < items.u.l->n; i++) {
        tval x = items.u.l->v[i], kx = x, ko = *out;
        if (attr && attr->kind == TV_STR) {
            kx = attr_path(&x, attr->u.s->s);
            ko = attr_path(out, attr->u.s->s);
        }
        int c = tv_compare(&kx, &ko);
        if (c == -2) return tpl_err(r, at, "min/max: cannot compare '%s' and '%s'", tv_type_name(&kx), tv_type_name(&ko));
        if (which == 0 ? c < 0 : c > 0) *out = x;
    }
    return ATLAS_OK;
}

static atlas_status filter_default(trender *r, const tnode *at, tval v, const fargs *a, tval *out) {
    const tval *def = arg(a, 0, "default_value"), *boolean = arg(a, 1, "boolean");
    bool use = v.kind == TV_UNDEF || (boolean && tv_truthy(boolean) && !tv_truthy(&v));
    if (use) *out = def ? *def : (tval){.kind = TV_STR, .u.s = NULL};
    if (use && !def) return tv_str(r, "", 0, out);
    if (!use) *out = v;
    return ATLAS_OK;
}

static atlas_status filter_float(trender *r, const tnode *at, tval v, const fargs *a, tval *out) {
    tval i;
    if (v.kind == TV_FLOAT) *out = v;
    else if (v.kind == TV_STR) {
        char *end;
        double f = strtod(v.u.s->s, &end);
        const tval *def = arg(a, 0, "default");
        *out = end != v.u.s->s && !*end ? tv_float(f) : def ? *def : tv_float(0);
    } else {
        ATLAS_TRY(to_int(r, at, &v, a, &i));
        *out = i.kind == TV_INT ? tv_float((double)i.u.i) : i;
    }
    return ATLAS_OK;
}

static atlas_status filter_abs(trender *r, const tnode *at, tval v, const fargs *a, tval *out) {
    if (v.kind == TV_INT && v.u.i != LLONG_MIN) *out = tv_int(v.u.i < 0 ? -v.u.i : v.u.i);
    else if (v.kind == TV_FLOAT) *out = tv_float(fabs(v.u.f));
    else return tpl_err(r, at, "bad operand type for abs(): '%s'", tv_type_name(&v));
    return ATLAS_OK;
}

static atlas_status filter_round(trender *r, const tnode *at, tval v, const fargs *a, tval *out) {
    const tval *prec = arg(a, 0, "precision"), *method = arg(a, 1, "method");
    double f = v.kind == TV_FLOAT ? v.u.f : v.kind == TV_INT ? (double)v.u.i : 0;
    if (v.kind != TV_FLOAT && v.kind != TV_INT) return tpl_err(r, at, "round needs a number");
    double m = pow(10, prec && prec->kind == TV_INT ? (double)prec->u.i : 0);
    const char *how = method && method->kind == TV_STR ? method->u.s->s : "common";
    double y = !strcmp(how, "ceil") ? ceil(f * m) : !strcmp(how, "floor") ? floor(f * m) : round(f * m);
    *out = tv_float(y / m);
    return ATLAS_OK;
}

static atlas_status filter_unique(trender *r, const tnode *at, tval v, const fargs *a, tval *out) {
    tval items;
    ATLAS_TRY(to_list(r, at, &v, &items));
    ATLAS_TRY(tv_list(r, 0, out));
    for (size_t i = 0; i < items.u.l->n; i++) {
        bool seen = false;
        ATLAS_TRY(tpl_charge(r, at, out->u.l->n + 1)); /* quadratic: counted */
        for (size_t k = 0; k < out->u.l->n && !seen; k++) seen = tv_equal(&out->u.l->v[k], &items.u.l->v[i]);
        if (!seen) ATLAS_TRY(tv_list_push(r, out, items.u.l->v[i]));
    }
    return ATLAS_OK;
}

static atlas_status filter_reverse(trender *r, const tnode *at, tval v, const fargs *a, tval *out) {
    tval items;
    if (v.kind == TV_STR) {
        tval step = tv_int(-1);
        (void)step;
        ATLAS_TRY(to_list(r, at, &v, &items));
        tbuf b = {0};
        for (size_t i = items.u.l->n; i-- > 0;) tbuf_put(&b, items.u.l->v[i].u.s->s, items.u.l->v[i].u.s->len);
        return from_buf(r, at, &b, out);
    }
    ATLAS_TRY(to_list(r, at, &v, &items));
    ATLAS_TRY(tv_list(r, items.u.l->n, out));
    for (size_t i = items.u.l->n; i-- > 0;) ATLAS_TRY(tv_list_push(r, out, items.u.l->v[i]));
    return ATLAS_OK;
}

static atlas_status filter_attr(trender *r, const tnode *at, tval v, const fargs *a, tval *out) {
    const tval *x;
    if (!(x = arg(a, 0, "name")) || x->kind != TV_STR) return tpl_err(r, at, "attr() needs a name");
    if (v.kind == TV_DICT && v.u.d->ns && tv_dict_get(&v, x->u.s->s)) *out = *tv_dict_get(&v, x->u.s->s); /* getattr only */
    else *out = tv_undef(NULL);
    return ATLAS_OK;
}

static atlas_status filter_wordcount(trender *r, const tnode *at, tval v, const fargs *a, tval *out) {
    tval s, words;
    ATLAS_TRY(tv_stringify(r, &v, &s));
    ATLAS_TRY(str_split(r, at, &s, NULL, -1, &words));
    *out = tv_int((long long)words.u.l->n);
    return ATLAS_OK;
}

/* ---- filters ------------------------------------------------------------------------- */
atlas_status tpl_filter(trender *r, tscope *sc, const tnode *at, const char *name, tval v,
                        tval *args, size_t nargs, const char **kwn, tval *kwv, size_t nkw,
                        tval *out) {
    fargs a = {args, nargs, kwn, kwv, nkw};
    if (!strcmp(name, "default") || !strcmp(name, "d")) return filter_default(r, at, v, &a, out);
    if (!strcmp(name, "length") || !strcmp(name, "count")) return length_of(r, at, &v, out);
    if (!strcmp(name, "tojson")) return filter_tojson(r, at, &v, &a, out);
    if (!strcmp(name, "items")) return items_of(r, at, &v, out);
    if (!strcmp(name, "list")) return to_list(r, at, &v, out);
    if (!strcmp(name, "string")) return tv_stringify(r, &v, out);
    if (!strcmp(name, "safe")) {
        *out = v;
        return ATLAS_OK;
    }
    if (!strcmp(name, "join")) return filter_join(r, at, &v, &a, out);
    if (!strcmp(name, "first") || !strcmp(name, "last")) return first_last(r, at, &v, name[0] == 'l', out);
    if (!strcmp(name, "map")) return filter_map(r, sc, at, &v, &a, out);
    if (!strcmp(name, "select") || !strcmp(name, "reject")) return filter_select(r, at, &v, &a, false, name[0] == 's', out);
    if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr"))
        return filter_select(r, at, &v, &a, true, name[0] == 's', out);
    if (!strcmp(name, "sort") || !strcmp(name, "dictsort")) return filter_sort(r, at, &v, &a, name[0] == 'd', out);
    if (!strcmp(name, "int")) return to_int(r, at, &v, &a, out);
    if (!strcmp(name, "float")) return filter_float(r, at, v, &a, out);
    if (!strcmp(name, "abs")) return filter_abs(r, at, v, &a, out);
    if (!strcmp(name, "round")) return filter_round(r, at, v, &a, out);
    if (!strcmp(name, "e") || !strcmp(name, "escape") || !strcmp(name, "forceescape")) return html_escape(r, at, &v, out);
    if (!strcmp(name, "unique")) return filter_unique(r, at, v, &a, out);
    if (!strcmp(name, "reverse")) return filter_reverse(r, at, v, &a, out);
    if (!strcmp(name, "indent")) return filter_indent(r, at, &v, &a, out);
    if (!strcmp(name, "min") || !strcmp(name, "max") || !strcmp(name, "sum"))
        return min_max_sum(r, at, &v, &a, name[1] == 'i' ? 0 : name[1] == 'a' ? 1 : 2, out);
    if (!strcmp(name, "attr")) return filter_attr(r, at, v, &a, out);
    if (!strcmp(name, "format")) {
        if (v.kind != TV_STR) return need_str(r, at, "format", &v);
        return tpl_percent_format(r, at, &v, args, nargs, out);
    }
    if (!strcmp(name, "wordcount")) return filter_wordcount(r, at, v, &a, out);
    /* string filters: str() of the value first, as jinja2 does (undefined -> "") */
    static const char *str_filters[] = {"trim", "upper", "lower", "capitalize", "title", "replace", "center", NULL};
    for (int k = 0; str_filters[k]; k++) {
        if (strcmp(name, str_filters[k])) continue;
        tval s;
        ATLAS_TRY(tv_stringify(r, &v, &s));
        switch (k) {
        case 0: return tpl_str_strip(r, &s, arg(&a, 0, "chars"), 0, out);
        case 1: return change_case(r, at, &s, 'u', out);
        case 2: return change_case(r, at, &s, 'l', out);
        case 3: {
            tval low;
            ATLAS_TRY(change_case(r, at, &s, 'l', &low));
            return change_case(r, at, &low, 'c', out);
        }
        case 4: return change_case(r, at, &s, 't', out);
        case 5: {
            const tval *o = arg(&a, 0, "old"), *n = arg(&a, 1, "new"), *c = arg(&a, 2, "count");
            if (!o || !n) return tpl_err(r, at, "replace needs old and new");
            return str_replace(r, at, &s, o, n, c && c->kind == TV_INT ? c->u.i : -1, out);
        }
        default: *out = s; return ATLAS_OK;
        }
    }
    return tpl_err(r, at, "unknown filter '%s'", name);
}

/* ---- tests --------------------------------------------------------------------------- */
atlas_status tpl_test(trender *r, const tnode *at, const char *name, const tval *v, tval *args,
                      size_t nargs, bool *out) {
    const tval *a0 = nargs ? &args[0] : NULL;
    tval_kind k = v->kind;
    if (!strcmp(name, "defined")) *out = k != TV_UNDEF;
    else if (!strcmp(name, "undefined")) *out = k == TV_UNDEF;
    else if (!strcmp(name, "none")) *out = k == TV_NONE;
    else if (!strcmp(name, "string")) *out = k == TV_STR;
    else if (!strcmp(name, "number")) *out = k == TV_INT || k == TV_FLOAT || k == TV_BOOL;
    else if (!strcmp(name, "integer")) *out = k == TV_INT;
    else if (!strcmp(name, "float")) *out = k == TV_FLOAT;
    else if (!strcmp(name, "boolean")) *out = k == TV_BOOL;
    else if (!strcmp(name, "true")) *out = k == TV_BOOL && v->u.b;
    else if (!strcmp(name, "false")) *out = k == TV_BOOL && !v->u.b;
    else if (!strcmp(name, "mapping")) *out = k == TV_DICT && !v->u.d->ns;
    else if (!strcmp(name, "iterable")) *out = k == TV_STR || k == TV_LIST || (k == TV_DICT && !v->u.d->ns) || k == TV_UNDEF;
    else if (!strcmp(name, "sequence")) *out = k == TV_STR || k == TV_LIST || (k == TV_DICT && !v->u.d->ns);
    else if (!strcmp(name, "callable")) *out = k == TV_FUNC;
    else if (!strcmp(name, "escaped")) *out = false;
    else if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        *out = false;
        if (k == TV_STR) {
            tval c;
            ATLAS_TRY(change_case(r, at, v, name[0] == 'l' ? 'l' : 'u', &c));
            *out = tv_equal(&c, v);
        }
    } else if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        if (k != TV_INT) return tpl_err(r, at, "test '%s' needs an integer, got '%s'", name, tv_type_name(v));
        long long d = 2;
        if (name[0] == 'd') {
            if (!a0 || a0->kind != TV_INT || a0->u.i == 0) return tpl_err(r, at, "divisibleby needs a non-zero integer");
            d = a0->u.i;
        }
        long long m = d == -1 ? 0 : v->u.i % d;
        *out = name[0] == 'o' ? m != 0 : m == 0;
    } else if (!strcmp(name, "sameas")) {
        if (!a0) return tpl_err(r, at, "sameas needs an argument");
        *out = a0->kind == k && (k == TV_NONE || k == TV_UNDEF || (k == TV_BOOL && a0->u.b == v->u.b) ||
                                 (k == TV_INT && a0->u.i == v->u.i) ||
                                 ((k == TV_LIST || k == TV_DICT || k == TV_STR || k == TV_FUNC) && a0->u.l == v->u.l));
    } else if (!strcmp(name, "in")) {
        if (!a0) return tpl_err(r, at, "test 'in' needs a sequence");
        if (a0->kind == TV_STR && k == TV_STR) *out = memmem(a0->u.s->s, a0->u.s->len, v->u.s->s, v->u.s->len) || !v->u.s->len;
        else if (a0->kind == TV_LIST) {
            *out = false;
            for (size_t i = 0; i < a0->u.l->n && !*out; i++) *out = tv_equal(&a0->u.l->v[i], v);
        } else if (a0->kind == TV_DICT) *out = tv_dict_find(a0, v) != NULL;
        else return tpl_err(r, at, "test 'in': '%s' is not a container", tv_type_name(a0));
    } else {
        static const char *cmp[][3] = {{"eq", "equalto", "=="}, {"ne", "!=", "!="}, {"lt", "lessthan", "<"},
                                       {"le", "<=", "<="},      {"gt", "greaterthan", ">"}, {"ge", ">=", ">="}};
        for (int c = 0; c < 6; c++) {
            if (strcmp(name, cmp[c][0]) && strcmp(name, cmp[c][1]) && strcmp(name, cmp[c][2])) continue;
            if (!a0) return tpl_err(r, at, "test '%s' needs an argument", name);
            if (c < 2) {
                *out = tv_equal(v, a0) == (c == 0);
                return ATLAS_OK;
            }
            int o = tv_compare(v, a0);
            if (o == -2) return tpl_err(r, at, "test '%s': cannot compare '%s' and '%s'", name, tv_type_name(v), tv_type_name(a0));
            *out = c == 2 ? o < 0 : c == 3 ? o <= 0 : c == 4 ? o > 0 : o >= 0;
            return ATLAS_OK;
        }
        return tpl_err(r, at, "unknown test '%s'", name);
    }
    return ATLAS_OK;
}

/* ---- methods ------------------------------------------------------------------------- */
static atlas_status str_format_method(trender *r, const tnode *at, const tval *fmt, const fargs *a, tval *out) {
    tbuf b = {0};
    const char *p = fmt->u.s->s;
    size_t n = fmt->u.s->len, auto_idx = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '{' && i + 1 < n && p[i + 1] == '{') {
            tbuf_putc(&b, '{');
            i++;
        } else if (p[i] == '}' && i + 1 < n && p[i + 1] == '}') {
            tbuf_putc(&b, '}');
            i++;
        } else if (p[i] == '{') {
            const char *close = memchr(p + i, '}', n - i);
            if (!close) break;
            char field[64];
            size_t fl = (size_t)(close - (p + i + 1));
            if (fl >= sizeof field) fl = sizeof field - 1;
            memcpy(field, p + i + 1, fl);
            field[fl] = 0;
            const tval *x = NULL;
            if (!fl) x = arg(a, auto_idx++, NULL);
            else if (field[0] >= '0' && field[0] <= '9') x = arg(a, (size_t)atoi(field), NULL);
            else x = arg(a, (size_t)-1, field);
            if (!x) {
                free(b.p);
                return tpl_err(r, at, "format(): no argument for '{%s}'", field);
            }
            tv_to_str(&b, x, false);
            i = (size_t)(close - p);
        } else {
            tbuf_putc(&b, p[i]);
        }
    }
    return from_buf(r, at, &b, out);
}

static atlas_status str_find(trender *r, const tnode *at, const tval *v, const char *name, const tval *x, tval *out) {
    if (!x || x->kind != TV_STR) return need_str(r, at, name, x ? x : &(tval){.kind = TV_NONE});
    const char *s = v->u.s->s;
    size_t n = v->u.s->len, xl = x->u.s->len;
    long long pos = -1, cnt = 0;
    for (size_t i = 0; i + xl <= n; i++) {
        if (memcmp(s + i, x->u.s->s, xl)) continue;
        if (pos < 0 || name[0] == 'r') pos = (long long)tpl_utf8_count(s, i);
        cnt++;
        if (xl) i += xl - 1;
        if (name[0] != 'r' && name[0] != 'c') break;
    }
    if (name[0] == 'c') *out = tv_int(cnt);
    else if (name[0] == 'i' && pos < 0) return tpl_err(r, at, "index(): substring not found");
    else *out = tv_int(pos);
    return ATLAS_OK;
}

static atlas_status str_join(trender *r, const tnode *at, const tval *v, const char *name, const tval *x, tval *out) {
    if (!x) return tpl_err(r, at, "join() needs an iterable");
    tval items;
    ATLAS_TRY(to_list(r, at, x, &items));
    tbuf b = {0};
    for (size_t i = 0; i < items.u.l->n; i++) {
        if (items.u.l->v[i].kind != TV_STR) {
            free(b.p);
            return tpl_err(r, at, "join(): item %zu is '%s', not a string", i, tv_type_name(&items.u.l->v[i]));
        }
        if (i) tbuf_put(&b, v->u.s->s, v->u.s->len);
        tbuf_put(&b, items.u.l->v[i].u.s->s, items.u.l->v[i].u.s->len);
    }
    return from_buf(r, at, &b, out);
}

static atlas_status str_splitlines(trender *r, const tnode *at, const tval *v, const char *name, const tval *x, tval *out) {
    ATLAS_TRY(tv_list(r, 0, out));
    const char *s = v->u.s->s, *end = s + v->u.s->len;
    while (s < end) {
        const char *nl = s;
        while (nl < end && *nl != '\n' && *nl != '\r') nl++;
        tval line;
        ATLAS_TRY(tv_str(r, s, (size_t)(nl - s), &line));
        ATLAS_TRY(tv_list_push(r, out, line));
        if (nl < end && *nl == '\r' && nl + 1 < end && nl[1] == '\n') nl++;
        s = nl + 1;
    }
    return ATLAS_OK;
}

/* isdigit, isalpha, ...: ATLAS_ERR_NOT_FOUND when name is none of them */
static atlas_status str_is(const tval *v, const char *name, tval *out) {
    static const char *is_methods[] = {"isdigit", "isalpha", "isalnum", "isspace", "isupper", "islower", NULL};
    for (int k = 0; is_methods[k]; k++) {
        if (strcmp(name, is_methods[k])) continue;
        const char *s = v->u.s->s;
        size_t n = v->u.s->len;
        bool res = n > 0, cased = false;
        for (size_t i = 0; i < n && res;) {
            uint32_t cp;
            i += cp_at(s, n, i, &cp);
            const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
            bool up = p->category == UTF8PROC_CATEGORY_LU, lo = p->category == UTF8PROC_CATEGORY_LL;
            bool alpha = p->category >= UTF8PROC_CATEGORY_LU && p->category <= UTF8PROC_CATEGORY_LO;
            bool digit = p->category == UTF8PROC_CATEGORY_ND;
            switch (k) {
            case 0: res = digit; break;
            case 1: res = alpha; break;
            case 2: res = alpha || digit; break;
            case 3: res = tpl_is_space(cp); break;
            case 4: res = !lo; cased |= up; break;
            case 5: res = !up; cased |= lo; break;
            }
        }
        *out = tv_bool(res && (k < 4 || cased));
        return ATLAS_OK;
    }
    return ATLAS_ERR_NOT_FOUND;
}

static atlas_status str_method(trender *r, const tnode *at, const tval *v, const char *name, const fargs *a, tval *out) {
    const tval *x = arg(a, 0, NULL);
    if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
        if (x && x->kind != TV_STR && x->kind != TV_NONE) return need_str(r, at, name, x);
        return tpl_str_strip(r, v, x, name[0] == 'l' ? 1 : name[0] == 'r' ? 2 : 0, out);
    }
    if (!strcmp(name, "split") || !strcmp(name, "rsplit")) {
        const tval *sep = arg(a, 0, "sep"), *max = arg(a, 1, "maxsplit");
        long long m = max && max->kind == TV_INT ? max->u.i : -1;
        if (name[0] == 'r' && m >= 0) return tpl_err(r, at, "rsplit with maxsplit is not supported");
        return str_split(r, at, v, sep, m, out);
    }
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
        if (!x) return tpl_err(r, at, "%s() needs an argument", name);
        bool start = name[0] == 's', res = false;
        if (x->kind == TV_LIST) {
            for (size_t i = 0; i < x->u.l->n; i++) res |= affix(v, &x->u.l->v[i], start);
        } else if (x->kind == TV_STR) {
            res = affix(v, x, start);
        } else {
            return need_str(r, at, name, x);
        }
        *out = tv_bool(res);
        return ATLAS_OK;
    }
    if (!strcmp(name, "upper")) return change_case(r, at, v, 'u', out);
    if (!strcmp(name, "lower")) return change_case(r, at, v, 'l', out);
    if (!strcmp(name, "title")) return change_case(r, at, v, 't', out);
    if (!strcmp(name, "capitalize")) {
        tval low;
        ATLAS_TRY(change_case(r, at, v, 'l', &low));
        return change_case(r, at, &low, 'c', out);
    }
    if (!strcmp(name, "replace")) {
        const tval *n = arg(a, 1, NULL), *c = arg(a, 2, "count");
        if (!x || !n) return tpl_err(r, at, "replace() needs old and new");
        return str_replace(r, at, v, x, n, c && c->kind == TV_INT ? c->u.i : -1, out);
    }
    if (!strcmp(name, "find") || !strcmp(name, "rfind") || !strcmp(name, "index") || !strcmp(name, "count")) return str_find(r, at, v, name, x, out);
    if (!strcmp(name, "join")) return str_join(r, at, v, name, x, out);
    if (!strcmp(name, "splitlines")) return str_splitlines(r, at, v, name, x, out);
    if (!strcmp(name, "removeprefix") || !strcmp(name, "removesuffix")) {
        if (!x || x->kind != TV_STR) return need_str(r, at, name, x ? x : &(tval){.kind = TV_NONE});
        bool pre = name[6] == 'p';
        if (!affix(v, x, pre)) {
            *out = *v;
            return ATLAS_OK;
        }
        return tv_str(r, v->u.s->s + (pre ? x->u.s->len : 0), v->u.s->len - x->u.s->len, out);
    }
    if (!strcmp(name, "format")) return str_format_method(r, at, v, a, out);
    return str_is(v, name, out);
}

atlas_status tpl_method(trender *r, const tnode *at, const tval *v, const char *name, tval *args,
                        size_t nargs, const char **kwn, tval *kwv, size_t nkw, tval *out) {
    fargs a = {args, nargs, kwn, kwv, nkw};
    if (v->kind == TV_STR) return str_method(r, at, v, name, &a, out);
    if (v->kind == TV_DICT && v->u.d->loop && !strcmp(name, "cycle")) {
        if (!nargs) return tpl_err(r, at, "loop.cycle() needs arguments");
        const tval *i0 = tv_dict_get(v, "index0");
        *out = args[(size_t)i0->u.i % nargs];
        return ATLAS_OK;
    }
    if (v->kind == TV_DICT && !v->u.d->ns && !v->u.d->loop) {
        if (!strcmp(name, "items")) return items_of(r, at, v, out);
        if (!strcmp(name, "keys") || !strcmp(name, "values")) {
            ATLAS_TRY(tv_list(r, v->u.d->n, out));
            for (size_t i = 0; i < v->u.d->n; i++)
                ATLAS_TRY(tv_list_push(r, out, name[0] == 'k' ? v->u.d->k[i] : v->u.d->v[i]));
            return ATLAS_OK;
        }
        if (!strcmp(name, "get")) {
            if (!nargs) return tpl_err(r, at, "get() needs a key");
            const tval *x = tv_dict_find(v, &args[0]);
            *out = x ? *x : nargs > 1 ? args[1] : tv_none();
            return ATLAS_OK;
        }
    }
    if (v->kind == TV_LIST && (!strcmp(name, "index") || !strcmp(name, "count"))) {
        if (!nargs) return tpl_err(r, at, "%s() needs an argument", name);
        long long cnt = 0;
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (!tv_equal(&v->u.l->v[i], &args[0])) continue;
            if (name[0] == 'i') {
                *out = tv_int((long long)i);
                return ATLAS_OK;
            }
            cnt++;
        }
        if (name[0] == 'i') return tpl_err(r, at, "index(): value is not in the list");
        *out = tv_int(cnt);
        return ATLAS_OK;
    }
    static const char *unsafe[] = {"append", "extend", "insert", "pop", "remove", "clear", "update",
                                   "setdefault", "popitem", "sort", "reverse", NULL};
    for (int k = 0; unsafe[k]; k++)
        if (!strcmp(name, unsafe[k]) && (v->kind == TV_LIST || v->kind == TV_DICT))
            return tpl_err(r, at, "'%s.%s()' modifies the object: not allowed in an immutable sandbox (as in transformers)",
                           tv_type_name(v), name);
    return ATLAS_ERR_NOT_FOUND;
}

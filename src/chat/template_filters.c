/* chat/template_filters.c — jinja2's filters (sort, map, join, tojson, ...). Their
 * string helpers are in template_strings.c, the tests they take (select("equalto")) in
 * template_methods.c. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "chat/template_internal.h"
#include "core/error.h"

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
    if (tpl_change_case(r, NULL, v, 'l', &out) != ATLAS_OK) return *v;
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
    const tval *rev = tpl_arg(a, dictsort ? 2 : 0, "reverse"), *cs = tpl_arg(a, dictsort ? 0 : 1, "case_sensitive");
    const tval *attr = dictsort ? NULL : tpl_arg(a, 2, "attribute"), *by = dictsort ? tpl_arg(a, 1, "by") : NULL;
    if (dictsort) ATLAS_TRY(tpl_items_of(r, at, v, &items));
    else ATLAS_TRY(tpl_to_list(r, at, v, &items));
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
    ATLAS_TRY(tpl_to_list(r, at, v, &items));
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
    ATLAS_TRY(tpl_to_list(r, at, v, &items));
    const tval *attr = tpl_arg(a, (size_t)-1, "attribute"), *def = tpl_arg(a, (size_t)-1, "default");
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
    ATLAS_TRY(tpl_to_list(r, at, v, &items));
    const tval *sep = tpl_arg(a, 0, "d"), *attr = tpl_arg(a, 1, "attribute");
    tbuf b = {0};
    for (size_t i = 0; i < items.u.l->n; i++) {
        if (i && sep) tv_to_str(&b, sep, false);
        tval x = items.u.l->v[i];
        if (attr && attr->kind == TV_STR) x = attr_path(&x, attr->u.s->s);
        tv_to_str(&b, &x, false);
    }
    return tpl_from_buf(r, at, &b, out);
}

/* transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
static atlas_status filter_tojson(trender *r, const tnode *at, const tval *v, const fargs *a, tval *out) {
    const tval *ascii = tpl_arg(a, 0, "ensure_ascii"), *ind = tpl_arg(a, 1, "indent"), *seps = tpl_arg(a, 2, "separators"),
               *sk = tpl_arg(a, 3, "sort_keys");
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
    return tpl_from_buf(r, at, &b, out);
}

static atlas_status filter_indent(trender *r, const tnode *at, const tval *v, const fargs *a, tval *out) {
    const tval *w = tpl_arg(a, 0, "width"), *first = tpl_arg(a, 1, "first"), *blank = tpl_arg(a, 2, "blank");
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
    return tpl_from_buf(r, at, &b, out);
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
    return tpl_from_buf(r, at, &b, out);
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
    return tpl_from_buf(r, at, &b, out);
}

static atlas_status to_int(trender *r, const tnode *at, const tval *v, const fargs *a, tval *out) {
    const tval *def = tpl_arg(a, 0, "default");
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
    ATLAS_TRY(tpl_to_list(r, at, v, &items));
    if (!items.u.l->n) *out = tv_undef(last ? "last: the sequence is empty" : "first: the sequence is empty");
    else *out = items.u.l->v[last ? items.u.l->n - 1 : 0];
    return ATLAS_OK;
}

static atlas_status min_max_sum(trender *r, const tnode *at, const tval *v, const fargs *a, int which, tval *out) {
    tval items;
    ATLAS_TRY(tpl_to_list(r, at, v, &items));
    const tval *attr = tpl_arg(a, which == 2 ? 0 : 1, "attribute");
    if (which == 2) {
        const tval *start = tpl_arg(a, 1, "start");
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
    const tval *def = tpl_arg(a, 0, "default_value"), *boolean = tpl_arg(a, 1, "boolean");
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
        const tval *def = tpl_arg(a, 0, "default");
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
    const tval *prec = tpl_arg(a, 0, "precision"), *method = tpl_arg(a, 1, "method");
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
    ATLAS_TRY(tpl_to_list(r, at, &v, &items));
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
        ATLAS_TRY(tpl_to_list(r, at, &v, &items));
        tbuf b = {0};
        for (size_t i = items.u.l->n; i-- > 0;) tbuf_put(&b, items.u.l->v[i].u.s->s, items.u.l->v[i].u.s->len);
        return tpl_from_buf(r, at, &b, out);
    }
    ATLAS_TRY(tpl_to_list(r, at, &v, &items));
    ATLAS_TRY(tv_list(r, items.u.l->n, out));
    for (size_t i = items.u.l->n; i-- > 0;) ATLAS_TRY(tv_list_push(r, out, items.u.l->v[i]));
    return ATLAS_OK;
}

static atlas_status filter_attr(trender *r, const tnode *at, tval v, const fargs *a, tval *out) {
    const tval *x;
    if (!(x = tpl_arg(a, 0, "name")) || x->kind != TV_STR) return tpl_err(r, at, "attr() needs a name");
    if (v.kind == TV_DICT && v.u.d->ns && tv_dict_get(&v, x->u.s->s)) *out = *tv_dict_get(&v, x->u.s->s); /* getattr only */
    else *out = tv_undef(NULL);
    return ATLAS_OK;
}

static atlas_status filter_wordcount(trender *r, const tnode *at, tval v, const fargs *a, tval *out) {
    tval s, words;
    ATLAS_TRY(tv_stringify(r, &v, &s));
    ATLAS_TRY(tpl_str_split(r, at, &s, NULL, -1, &words));
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
    if (!strcmp(name, "items")) return tpl_items_of(r, at, &v, out);
    if (!strcmp(name, "list")) return tpl_to_list(r, at, &v, out);
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
        if (v.kind != TV_STR) return tpl_need_str(r, at, "format", &v);
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
        case 0: return tpl_str_strip(r, &s, tpl_arg(&a, 0, "chars"), 0, out);
        case 1: return tpl_change_case(r, at, &s, 'u', out);
        case 2: return tpl_change_case(r, at, &s, 'l', out);
        case 3: {
            tval low;
            ATLAS_TRY(tpl_change_case(r, at, &s, 'l', &low));
            return tpl_change_case(r, at, &low, 'c', out);
        }
        case 4: return tpl_change_case(r, at, &s, 't', out);
        case 5: {
            const tval *o = tpl_arg(&a, 0, "old"), *n = tpl_arg(&a, 1, "new"), *c = tpl_arg(&a, 2, "count");
            if (!o || !n) return tpl_err(r, at, "replace needs old and new");
            return tpl_str_replace(r, at, &s, o, n, c && c->kind == TV_INT ? c->u.i : -1, out);
        }
        default: *out = s; return ATLAS_OK;
        }
    }
    return tpl_err(r, at, "unknown filter '%s'", name);
}

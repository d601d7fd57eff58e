/* chat/template_methods.c — jinja2's tests (is defined, is string, ...) and the Python
 * str / dict / list methods that chat templates call (message.content.strip(),
 * tool.items(), ...). Mutating methods (append, pop, update) are refused, as transformers'
 * immutable sandbox refuses them. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "chat/template_internal.h"
#include "core/error.h"

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
            ATLAS_TRY(tpl_change_case(r, at, v, name[0] == 'l' ? 'l' : 'u', &c));
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
            if (!fl) x = tpl_arg(a, auto_idx++, NULL);
            else if (field[0] >= '0' && field[0] <= '9') x = tpl_arg(a, (size_t)atoi(field), NULL);
            else x = tpl_arg(a, (size_t)-1, field);
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
    return tpl_from_buf(r, at, &b, out);
}

static atlas_status str_find(trender *r, const tnode *at, const tval *v, const char *name, const tval *x, tval *out) {
    if (!x || x->kind != TV_STR) return tpl_need_str(r, at, name, x ? x : &(tval){.kind = TV_NONE});
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
    ATLAS_TRY(tpl_to_list(r, at, x, &items));
    tbuf b = {0};
    for (size_t i = 0; i < items.u.l->n; i++) {
        if (items.u.l->v[i].kind != TV_STR) {
            free(b.p);
            return tpl_err(r, at, "join(): item %zu is '%s', not a string", i, tv_type_name(&items.u.l->v[i]));
        }
        if (i) tbuf_put(&b, v->u.s->s, v->u.s->len);
        tbuf_put(&b, items.u.l->v[i].u.s->s, items.u.l->v[i].u.s->len);
    }
    return tpl_from_buf(r, at, &b, out);
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
            i += tpl_cp_at(s, n, i, &cp);
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
    const tval *x = tpl_arg(a, 0, NULL);
    if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
        if (x && x->kind != TV_STR && x->kind != TV_NONE) return tpl_need_str(r, at, name, x);
        return tpl_str_strip(r, v, x, name[0] == 'l' ? 1 : name[0] == 'r' ? 2 : 0, out);
    }
    if (!strcmp(name, "split") || !strcmp(name, "rsplit")) {
        const tval *sep = tpl_arg(a, 0, "sep"), *max = tpl_arg(a, 1, "maxsplit");
        long long m = max && max->kind == TV_INT ? max->u.i : -1;
        if (name[0] == 'r' && m >= 0) return tpl_err(r, at, "rsplit with maxsplit is not supported");
        return tpl_str_split(r, at, v, sep, m, out);
    }
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
        if (!x) return tpl_err(r, at, "%s() needs an argument", name);
        bool start = name[0] == 's', res = false;
        if (x->kind == TV_LIST) {
            for (size_t i = 0; i < x->u.l->n; i++) res |= tpl_affix(v, &x->u.l->v[i], start);
        } else if (x->kind == TV_STR) {
            res = tpl_affix(v, x, start);
        } else {
            return tpl_need_str(r, at, name, x);
        }
        *out = tv_bool(res);
        return ATLAS_OK;
    }
    if (!strcmp(name, "upper")) return tpl_change_case(r, at, v, 'u', out);
    if (!strcmp(name, "lower")) return tpl_change_case(r, at, v, 'l', out);
    if (!strcmp(name, "title")) return tpl_change_case(r, at, v, 't', out);
    if (!strcmp(name, "capitalize")) {
        tval low;
        ATLAS_TRY(tpl_change_case(r, at, v, 'l', &low));
        return tpl_change_case(r, at, &low, 'c', out);
    }
    if (!strcmp(name, "replace")) {
        const tval *n = tpl_arg(a, 1, NULL), *c = tpl_arg(a, 2, "count");
        if (!x || !n) return tpl_err(r, at, "replace() needs old and new");
        return tpl_str_replace(r, at, v, x, n, c && c->kind == TV_INT ? c->u.i : -1, out);
    }
    if (!strcmp(name, "find") || !strcmp(name, "rfind") || !strcmp(name, "index") || !strcmp(name, "count")) return str_find(r, at, v, name, x, out);
    if (!strcmp(name, "join")) return str_join(r, at, v, name, x, out);
    if (!strcmp(name, "splitlines")) return str_splitlines(r, at, v, name, x, out);
    if (!strcmp(name, "removeprefix") || !strcmp(name, "removesuffix")) {
        if (!x || x->kind != TV_STR) return tpl_need_str(r, at, name, x ? x : &(tval){.kind = TV_NONE});
        bool pre = name[6] == 'p';
        if (!tpl_affix(v, x, pre)) {
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
        if (!strcmp(name, "items")) return tpl_items_of(r, at, v, out);
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

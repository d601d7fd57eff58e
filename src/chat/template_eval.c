/* chat/template_eval.c — runs the AST: statements write text, expressions yield
 * values. Scoping follows jinja2: a for loop and a macro open a scope (so `set` inside a
 * loop does not leak out; templates use namespace() for that), `if` does not. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat/template_internal.h"
#include "core/error.h"

enum { MAX_MACRO_DEPTH = 64, MAX_RANGE = 1000 * 1000 };

tscope *tpl_scope_new(trender *r, tscope *parent) {
    tscope *s = tpl_alloc(r, sizeof *s);
    if (s) s->parent = parent;
    return s;
}

atlas_status tpl_scope_set(trender *r, tscope *sc, const char *name, tval v) {
    for (size_t i = 0; i < sc->n; i++)
        if (!strcmp(sc->names[i], name)) {
            sc->vals[i] = v;
            return ATLAS_OK;
        }
    if (sc->n == sc->cap) {
        size_t cap = sc->cap ? sc->cap * 2 : 4;
        const char **nm = tpl_alloc(r, cap * sizeof *nm);
        tval *vals = tpl_alloc(r, cap * sizeof *vals);
        if (!nm || !vals) return tpl_oom(r, NULL);
        if (sc->n) {
            memcpy(nm, sc->names, sc->n * sizeof *nm);
            memcpy(vals, sc->vals, sc->n * sizeof *vals);
        }
        sc->names = nm;
        sc->vals = vals;
        sc->cap = cap;
    }
    sc->names[sc->n] = name;
    sc->vals[sc->n] = v;
    sc->n++;
    return ATLAS_OK;
}

static const struct {
    const char *name;
    int id;
} builtins[] = {
    {"range", TF_RANGE},           {"namespace", TF_NAMESPACE},     {"dict", TF_DICT},
    {"raise_exception", TF_RAISE}, {"strftime_now", TF_STRFTIME},
};

bool tpl_is_builtin(const char *name) {
    for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++)
        if (!strcmp(builtins[i].name, name)) return true;
    return false;
}

static const char *undef_hint(trender *r, const char *fmt, const char *a, const char *b) {
    size_t n = strlen(fmt) + strlen(a) + strlen(b) + 1;
    char *s = tpl_alloc(r, n);
    if (s) snprintf(s, n, fmt, a, b);
    return s ? s : "a value is undefined";
}

tval tpl_lookup(trender *r, tscope *sc, const char *name) {
    for (tscope *s = sc; s; s = s->parent)
        for (size_t i = 0; i < s->n; i++)
            if (!strcmp(s->names[i], name)) return s->vals[i];
    for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++) {
        if (strcmp(builtins[i].name, name)) continue;
        tfunc *f = tpl_alloc(r, sizeof *f);
        if (!f) break;
        f->builtin = builtins[i].id;
        return (tval){.kind = TV_FUNC, .u.fn = f};
    }
    return tv_undef(undef_hint(r, "'%s' is undefined%s", name, ""));
}

static atlas_status undefined_error(trender *r, const tnode *at, const tval *v) {
    return tpl_err(r, at, "%s", v->undef_name ? v->undef_name : "a value is undefined");
}

static atlas_status step(trender *r, const tnode *at) {
    return tpl_charge(r, at, 1);
}

/* ---- attribute and item access ------------------------------------------------------- */
/* Python's attributes of dict, str and list objects that are methods. */
static bool has_method(const tval *obj, const char *name) {
    static const char *const dict_m[] = {"items", "keys", "values", "get", "copy", "pop", "popitem", "update",
                                         "setdefault", "clear", "fromkeys", NULL};
    static const char *const list_m[] = {"append", "extend", "insert", "pop", "remove", "clear", "index",
                                         "count", "sort", "reverse", "copy", NULL};
    static const char *const str_m[] = {
        "strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "upper", "lower", "title",
        "capitalize", "replace", "find", "rfind", "index", "rindex", "count", "join", "splitlines", "isdigit",
        "isalpha", "isalnum", "isspace", "isupper", "islower", "removeprefix", "removesuffix", "format",
        "encode", "zfill", "center", "ljust", "rjust", "partition", "rpartition", "casefold", "swapcase",
        "expandtabs", "istitle", "isnumeric", "isdecimal", "isidentifier", "isprintable", "isascii",
        "format_map", "translate", "maketrans", NULL};
    const char *const *m = obj->kind == TV_STR ? str_m
                           : obj->kind == TV_LIST ? list_m
                           : obj->kind == TV_DICT && !obj->u.d->ns && !obj->u.d->loop ? dict_m
                                                                                       : NULL;
    for (size_t i = 0; m && m[i]; i++)
        if (!strcmp(m[i], name)) return true;
    return obj->kind == TV_DICT && obj->u.d->loop && !strcmp(name, "cycle");
}

static atlas_status get_attr(trender *r, const tnode *at, const tval *obj, const char *name, tval *out) {
    if (obj->kind == TV_UNDEF) return undefined_error(r, at, obj);
    if (has_method(obj, name)) {
        tfunc *f = tpl_alloc(r, sizeof *f);
        tval *self = tpl_alloc(r, sizeof *self);
        if (!f || !self) return tpl_oom(r, at);
        *self = *obj;
        f->builtin = TF_METHOD;
        f->self = self;
        f->method = name;
        *out = (tval){.kind = TV_FUNC, .u.fn = f};
        return ATLAS_OK;
    }
    if (obj->kind == TV_DICT) {
        const tval *v = tv_dict_get(obj, name);
        if (v) {
            *out = *v;
            return ATLAS_OK;
        }
    }
    *out = tv_undef(undef_hint(r, "'%s object' has no attribute '%s'", tv_type_name(obj), name));
    return ATLAS_OK;
}

static bool norm_index(long long i, size_t n, size_t *out) {
    if (i < 0) i += (long long)n;
    if (i < 0 || (unsigned long long)i >= n) return false;
    *out = (size_t)i;
    return true;
}

static atlas_status get_item(trender *r, const tnode *at, const tval *obj, const tval *key, tval *out) {
    if (obj->kind == TV_UNDEF) return undefined_error(r, at, obj);
    size_t idx;
    if (obj->kind == TV_DICT) {
        const tval *v = tv_dict_find(obj, key);
        if (v) {
            *out = *v;
            return ATLAS_OK;
        }
    } else if (obj->kind == TV_LIST && (key->kind == TV_INT || key->kind == TV_BOOL)) {
        long long i = key->kind == TV_INT ? key->u.i : key->u.b;
        if (norm_index(i, obj->u.l->n, &idx)) {
            *out = obj->u.l->v[idx];
            return ATLAS_OK;
        }
    } else if (obj->kind == TV_STR && key->kind == TV_INT) {
        const tstr *s = obj->u.s;
        if (norm_index(key->u.i, tpl_utf8_count(s->s, s->len), &idx)) {
            size_t a = tpl_utf8_offset(s->s, s->len, idx), b = tpl_utf8_offset(s->s, s->len, idx + 1);
            return tv_str(r, s->s + a, b - a, out);
        }
    }
    if (key->kind == TV_STR) return get_attr(r, at, obj, key->u.s->s, out);
    tbuf kb = {0};
    tv_to_str(&kb, key, true);
    *out = tv_undef(undef_hint(r, "'%s object' has no item %s", tv_type_name(obj), kb.p ? kb.p : ""));
    free(kb.p);
    return ATLAS_OK;
}

/* Python's slice.indices() */
static void slice_indices(long long n, const tval *sv[3], long long *start, long long *stop, long long *stepv) {
    long long st = sv[2] ? sv[2]->u.i : 1;
    long long lo = st < 0 ? -1 : 0, hi = st < 0 ? n - 1 : n;
    long long a = st < 0 ? hi : lo, b = st < 0 ? lo : hi;
    if (sv[0]) {
        a = sv[0]->u.i;
        if (a < 0) a = a + n < lo ? lo : a + n;
        else if (a > hi) a = hi;
    }
    if (sv[1]) {
        b = sv[1]->u.i;
        if (b < 0) b = b + n < lo ? lo : b + n;
        else if (b > hi) b = hi;
    }
    *start = a;
    *stop = b;
    *stepv = st;
}

static atlas_status eval_slice(trender *r, tscope *sc, const tnode *n, tval *out) {
    tval obj, parts[3];
    const tval *sv[3] = {NULL, NULL, NULL};
    ATLAS_TRY(tpl_eval(r, sc, n->a, &obj));
    for (int k = 0; k < 3; k++) {
        if (!n->kids[k]) continue;
        ATLAS_TRY(tpl_eval(r, sc, n->kids[k], &parts[k]));
        if (parts[k].kind == TV_NONE) continue;
        if (parts[k].kind != TV_INT) return tpl_err(r, n, "slice indices must be integers or None");
        sv[k] = &parts[k];
    }
    if (sv[2] && sv[2]->u.i == 0) return tpl_err(r, n, "slice step cannot be zero");
    if (obj.kind == TV_UNDEF) return undefined_error(r, n, &obj);
    bool is_str = obj.kind == TV_STR;
    if (!is_str && obj.kind != TV_LIST)
        return tpl_err(r, n, "'%s' object is not subscriptable", tv_type_name(&obj));
    long long len = is_str ? (long long)tpl_utf8_count(obj.u.s->s, obj.u.s->len) : (long long)obj.u.l->n;
    long long a, b, s;
    slice_indices(len, sv, &a, &b, &s);
    if (is_str) {
        tbuf buf = {0};
        const tstr *str = obj.u.s;
        if (s == 1) {
            if (b > a) {
                size_t x = tpl_utf8_offset(str->s, str->len, (size_t)a), y = tpl_utf8_offset(str->s, str->len, (size_t)b);
                return tv_str(r, str->s + x, y - x, out);
            }
            return tv_str(r, "", 0, out);
        }
        for (long long i = a; s > 0 ? i < b : i > b; i += s) {
            size_t x = tpl_utf8_offset(str->s, str->len, (size_t)i), y = tpl_utf8_offset(str->s, str->len, (size_t)i + 1);
            tbuf_put(&buf, str->s + x, y - x);
        }
        atlas_status st = buf.oom ? tpl_oom(r, n) : tv_str(r, buf.p ? buf.p : "", buf.n, out);
        free(buf.p);
        return st;
    }
    ATLAS_TRY(tv_list(r, 0, out));
    out->u.l->tuple = obj.u.l->tuple;
    for (long long i = a; s > 0 ? i < b : i > b; i += s) ATLAS_TRY(tv_list_push(r, out, obj.u.l->v[i]));
    return ATLAS_OK;
}

/* ---- operators ----------------------------------------------------------------------- */
static bool is_num(const tval *v) { return v->kind == TV_INT || v->kind == TV_FLOAT || v->kind == TV_BOOL; }
static double as_f(const tval *v) { return v->kind == TV_FLOAT ? v->u.f : v->kind == TV_INT ? (double)v->u.i : v->u.b; }
static long long as_i(const tval *v) { return v->kind == TV_INT ? v->u.i : v->u.b; }

static atlas_status type_error(trender *r, const tnode *at, const char *op, const tval *a, const tval *b) {
    if (a->kind == TV_UNDEF) return undefined_error(r, at, a);
    if (b->kind == TV_UNDEF) return undefined_error(r, at, b);
    return tpl_err(r, at, "unsupported operand type(s) for %s: '%s' and '%s'", op, tv_type_name(a), tv_type_name(b));
}

static atlas_status repeat(trender *r, const tnode *at, const tval *seq, long long times, tval *out) {
    if (times < 0) times = 0;
    size_t unit = seq->kind == TV_STR ? seq->u.s->len : seq->u.l->n;
    if (unit && (unsigned long long)times > (64u << 20) / unit) return tpl_err(r, at, "repetition result too large");
    if (seq->kind == TV_STR) {
        char *p;
        ATLAS_TRY(tv_str_new(r, unit * (size_t)times, out, &p));
        for (long long i = 0; i < times; i++) memcpy(p + (size_t)i * unit, seq->u.s->s, unit);
        return ATLAS_OK;
    }
    ATLAS_TRY(tv_list(r, unit * (size_t)times, out));
    for (long long i = 0; i < times; i++)
        for (size_t k = 0; k < unit; k++) ATLAS_TRY(tv_list_push(r, out, seq->u.l->v[k]));
    return ATLAS_OK;
}

static atlas_status arith(trender *r, const tnode *at, int op, const tval *a, const tval *b, tval *out) {
    static const char *names[] = {"", "+", "-", "*", "/", "//", "%", "**"};
    const char *opn = names[op];
    if (op == TOP_ADD && a->kind == TV_STR && b->kind == TV_STR) {
        char *p;
        ATLAS_TRY(tv_str_new(r, a->u.s->len + b->u.s->len, out, &p));
        memcpy(p, a->u.s->s, a->u.s->len);
        memcpy(p + a->u.s->len, b->u.s->s, b->u.s->len);
        return ATLAS_OK;
    }
    if (op == TOP_ADD && a->kind == TV_LIST && b->kind == TV_LIST) {
        ATLAS_TRY(tv_list(r, a->u.l->n + b->u.l->n, out));
        for (size_t i = 0; i < a->u.l->n; i++) ATLAS_TRY(tv_list_push(r, out, a->u.l->v[i]));
        for (size_t i = 0; i < b->u.l->n; i++) ATLAS_TRY(tv_list_push(r, out, b->u.l->v[i]));
        return ATLAS_OK;
    }
    if (op == TOP_MUL && (a->kind == TV_STR || a->kind == TV_LIST) && (b->kind == TV_INT || b->kind == TV_BOOL))
        return repeat(r, at, a, as_i(b), out);
    if (op == TOP_MUL && (b->kind == TV_STR || b->kind == TV_LIST) && (a->kind == TV_INT || a->kind == TV_BOOL))
        return repeat(r, at, b, as_i(a), out);
    if (!is_num(a) || !is_num(b)) return type_error(r, at, opn, a, b);
    bool ints = a->kind != TV_FLOAT && b->kind != TV_FLOAT;
    if ((op == TOP_DIV || op == TOP_FLOORDIV || op == TOP_MOD) && (ints ? as_i(b) == 0 : as_f(b) == 0.0))
        return tpl_err(r, at, "division by zero");
    if (ints) {
        long long x = as_i(a), y = as_i(b), z = 0;
        bool ovf = false;
        switch (op) {
        case TOP_ADD: ovf = __builtin_add_overflow(x, y, &z); break;
        case TOP_SUB: ovf = __builtin_sub_overflow(x, y, &z); break;
        case TOP_MUL: ovf = __builtin_mul_overflow(x, y, &z); break;
        case TOP_DIV: *out = tv_float((double)x / (double)y); return ATLAS_OK;
        case TOP_FLOORDIV:
        case TOP_MOD:
            if (x == LLONG_MIN && y == -1) {
                ovf = true;
                break;
            }
            z = x / y;
            if ((x % y != 0) && ((x < 0) != (y < 0))) z--;
            if (op == TOP_MOD) z = x - z * y;
            break;
        case TOP_POW:
            if (y < 0) {
                *out = tv_float(pow((double)x, (double)y));
                return ATLAS_OK;
            }
            z = 1;
            for (long long k = 0; k < y && !ovf; k++) {
                ovf = __builtin_mul_overflow(z, x, &z);
                if (z == 0 || z == 1) break;
                if (z == -1 && ((y - k - 1) % 2 == 0)) break;
            }
            break;
        }
        if (ovf) return tpl_err(r, at, "integer overflow in '%s'", opn);
        *out = tv_int(z);
        return ATLAS_OK;
    }
    double x = as_f(a), y = as_f(b), z = 0;
    switch (op) {
    case TOP_ADD: z = x + y; break;
    case TOP_SUB: z = x - y; break;
    case TOP_MUL: z = x * y; break;
    case TOP_DIV: z = x / y; break;
    case TOP_FLOORDIV: z = floor(x / y); break;
    case TOP_MOD:
        z = fmod(x, y);
        if (z != 0 && ((z < 0) != (y < 0))) z += y;
        break;
    case TOP_POW: z = pow(x, y); break;
    }
    *out = tv_float(z);
    return ATLAS_OK;
}

static atlas_status contains(trender *r, const tnode *at, const tval *item, const tval *seq, bool *out) {
    switch (seq->kind) {
    case TV_UNDEF: *out = false; return ATLAS_OK;
    case TV_STR:
        if (item->kind != TV_STR)
            return tpl_err(r, at, "'in <string>' requires string as left operand, not %s", tv_type_name(item));
        *out = item->u.s->len == 0 || memmem(seq->u.s->s, seq->u.s->len, item->u.s->s, item->u.s->len);
        return ATLAS_OK;
    case TV_LIST:
        *out = false;
        for (size_t i = 0; i < seq->u.l->n && !*out; i++) *out = tv_equal(&seq->u.l->v[i], item);
        return ATLAS_OK;
    case TV_DICT: *out = tv_dict_find(seq, item) != NULL; return ATLAS_OK;
    default: return tpl_err(r, at, "argument of type '%s' is not iterable", tv_type_name(seq));
    }
}

/* a + b + c + ...: when every operand is a string, one copy instead of one per '+' (chat
 * templates build each turn this way). Operands are evaluated left to right first. */
static atlas_status eval_add_chain(trender *r, tscope *sc, const tnode *n, tval *out) {
    size_t k = 1;
    for (const tnode *x = n; x->kind == TN_BINARY && x->op == TOP_ADD; x = x->a) k++;
    tval *v = tpl_alloc_raw(r, k * sizeof *v);
    const tnode **at = tpl_alloc_raw(r, k * sizeof *at);
    if (!v || !at) return tpl_oom(r, n);
    size_t i = k;
    const tnode *x = n;
    for (; x->kind == TN_BINARY && x->op == TOP_ADD; x = x->a) at[--i] = x;
    ATLAS_TRY(tpl_eval(r, sc, x, &v[0]));
    size_t len = v[0].kind == TV_STR ? v[0].u.s->len : 0;
    bool strings = v[0].kind == TV_STR;
    for (i = 1; i < k; i++) {
        ATLAS_TRY(tpl_eval(r, sc, at[i]->b, &v[i]));
        strings = strings && v[i].kind == TV_STR;
        if (strings) len += v[i].u.s->len;
    }
    if (!strings) { /* Python's left-to-right folding, with its type errors */
        tval acc = v[0];
        for (i = 1; i < k; i++) {
            tval next;
            ATLAS_TRY(arith(r, at[i], TOP_ADD, &acc, &v[i], &next));
            acc = next;
        }
        *out = acc;
        return ATLAS_OK;
    }
    char *p;
    ATLAS_TRY(tv_str_new(r, len, out, &p));
    for (i = 0; i < k; i++) {
        memcpy(p, v[i].u.s->s, v[i].u.s->len);
        p += v[i].u.s->len;
    }
    return ATLAS_OK;
}

static atlas_status eval_binary(trender *r, tscope *sc, const tnode *n, tval *out) {
    if (n->op == TOP_ADD && n->a->kind == TN_BINARY && n->a->op == TOP_ADD) return eval_add_chain(r, sc, n, out);
    tval a, b;
    ATLAS_TRY(tpl_eval(r, sc, n->a, &a));
    ATLAS_TRY(tpl_eval(r, sc, n->b, &b));
    switch (n->op) {
    case TOP_CONCAT: {
        tbuf buf = {0};
        tv_to_str(&buf, &a, false);
        tv_to_str(&buf, &b, false);
        atlas_status st = buf.oom ? tpl_oom(r, n) : tv_str(r, buf.p ? buf.p : "", buf.n, out);
        free(buf.p);
        return st;
    }
    case TOP_EQ: *out = tv_bool(tv_equal(&a, &b)); return ATLAS_OK;
    case TOP_NE: *out = tv_bool(!tv_equal(&a, &b)); return ATLAS_OK;
    case TOP_LT:
    case TOP_LE:
    case TOP_GT:
    case TOP_GE: {
        static const char *names[] = {"<", "<=", ">", ">="};
        int c = tv_compare(&a, &b);
        if (c == -2) {
            if (a.kind == TV_UNDEF) return undefined_error(r, n, &a);
            if (b.kind == TV_UNDEF) return undefined_error(r, n, &b);
            return tpl_err(r, n, "'%s' not supported between instances of '%s' and '%s'",
                           names[n->op - TOP_LT], tv_type_name(&a), tv_type_name(&b));
        }
        bool v = n->op == TOP_LT ? c < 0 : n->op == TOP_LE ? c <= 0 : n->op == TOP_GT ? c > 0 : c >= 0;
        *out = tv_bool(v);
        return ATLAS_OK;
    }
    case TOP_IN:
    case TOP_NOTIN: {
        bool in = false;
        ATLAS_TRY(contains(r, n, &a, &b, &in));
        *out = tv_bool(n->op == TOP_IN ? in : !in);
        return ATLAS_OK;
    }
    default:
        if (n->op == TOP_MOD && a.kind == TV_STR) { /* "fmt" % value-or-tuple */
            if (b.kind == TV_LIST && b.u.l->tuple) return tpl_percent_format(r, n, &a, b.u.l->v, b.u.l->n, out);
            return tpl_percent_format(r, n, &a, &b, 1, out);
        }
        return arith(r, n, n->op, &a, &b, out);
    }
}

/* a < b <= c: Python's chained comparison, each operand evaluated once */
static atlas_status eval_compare(trender *r, tscope *sc, const tnode *n, tval *out) {
    tval left, right;
    ATLAS_TRY(tpl_eval(r, sc, n->kids[0], &left));
    for (size_t i = 1; i < n->nkids; i++) {
        ATLAS_TRY(tpl_eval(r, sc, n->kids[i], &right));
        tnode pair = *n;
        pair.kind = TN_BINARY;
        pair.op = n->ops[i - 1];
        pair.a = &(tnode){.kind = TN_CONST, .val = left, .line = n->line, .col = n->col};
        pair.b = &(tnode){.kind = TN_CONST, .val = right, .line = n->line, .col = n->col};
        ATLAS_TRY(eval_binary(r, sc, &pair, out));
        if (!tv_truthy(out)) return ATLAS_OK;
        left = right;
    }
    return ATLAS_OK;
}

/* ---- calls --------------------------------------------------------------------------- */
typedef struct targs {
    tval *pos;
    size_t npos;
    const char **kwn;
    tval *kwv;
    size_t nkw;
} targs;

static atlas_status eval_args(trender *r, tscope *sc, const tnode *n, targs *a) {
    a->npos = n->nkids;
    a->nkw = n->nkw;
    a->pos = tpl_alloc(r, (n->nkids + 1) * sizeof *a->pos);
    a->kwv = tpl_alloc(r, (n->nkw + 1) * sizeof *a->kwv);
    a->kwn = tpl_alloc(r, (n->nkw + 1) * sizeof *a->kwn);
    if (!a->pos || !a->kwv || !a->kwn) return tpl_oom(r, n);
    for (size_t i = 0; i < n->nkids; i++) ATLAS_TRY(tpl_eval(r, sc, n->kids[i], &a->pos[i]));
    for (size_t i = 0; i < n->nkw; i++) {
        a->kwn[i] = n->kwnames[i];
        ATLAS_TRY(tpl_eval(r, sc, n->kwvals[i], &a->kwv[i]));
    }
    return ATLAS_OK;
}

static atlas_status call_builtin(trender *r, const tnode *at, int id, tval *args, size_t nargs,
                                 const char **kwn, tval *kwv, size_t nkw, tval *out) {
    switch (id) {
    case TF_RANGE: {
        long long v[3] = {0, 0, 1};
        if (nargs < 1 || nargs > 3) return tpl_err(r, at, "range() takes 1 to 3 arguments");
        for (size_t i = 0; i < nargs; i++) {
            if (args[i].kind != TV_INT && args[i].kind != TV_BOOL)
                return tpl_err(r, at, "range() arguments must be integers, not %s", tv_type_name(&args[i]));
            v[nargs == 1 ? 1 : i] = as_i(&args[i]);
        }
        if (v[2] == 0) return tpl_err(r, at, "range() arg 3 must not be zero");
        double count = ceil(((double)v[1] - (double)v[0]) / (double)v[2]);
        if (count > MAX_RANGE) return tpl_err(r, at, "range() too large (over %d items)", MAX_RANGE);
        ATLAS_TRY(tv_list(r, count > 0 ? (size_t)count : 0, out));
        for (long long i = v[0]; v[2] > 0 ? i < v[1] : i > v[1]; i += v[2]) ATLAS_TRY(tv_list_push(r, out, tv_int(i)));
        return ATLAS_OK;
    }
    case TF_NAMESPACE:
    case TF_DICT: {
        ATLAS_TRY(tv_dict(r, out));
        out->u.d->ns = id == TF_NAMESPACE;
        for (size_t i = 0; i < nargs; i++) {
            if (args[i].kind != TV_DICT) return tpl_err(r, at, "%s() positional arguments must be mappings", id == TF_DICT ? "dict" : "namespace");
            for (size_t k = 0; k < args[i].u.d->n; k++)
                ATLAS_TRY(tv_dict_set(r, out, args[i].u.d->k[k], args[i].u.d->v[k]));
        }
        for (size_t i = 0; i < nkw; i++) {
            tval key;
            ATLAS_TRY(tv_str(r, kwn[i], strlen(kwn[i]), &key));
            ATLAS_TRY(tv_dict_set(r, out, key, kwv[i]));
        }
        return ATLAS_OK;
    }
    case TF_RAISE: {
        tbuf b = {0};
        if (nargs) tv_to_str(&b, &args[0], false);
        atlas_status st = tpl_err(r, at, "raise_exception: %s", b.p ? b.p : "");
        free(b.p);
        return st;
    }
    case TF_STRFTIME: {
        if (nargs != 1 || args[0].kind != TV_STR) return tpl_err(r, at, "strftime_now() takes one string");
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        char buf[256];
        size_t n = strftime(buf, sizeof buf, args[0].u.s->s, &tm);
        return tv_str(r, buf, n, out);
    }
    }
    return tpl_err(r, at, "unknown builtin");
}

static atlas_status call_macro(trender *r, const tnode *at, const tfunc *fn, tval *args, size_t nargs,
                               const char **kwn, tval *kwv, size_t nkw, tval *out) {
    const tnode *m = fn->macro;
    const char *mname = m->kind == TN_MACRO ? m->str : "caller";
    if (r->depth >= MAX_MACRO_DEPTH) return tpl_err(r, at, "macros nested too deeply (over %d calls)", MAX_MACRO_DEPTH);
    if (nargs > m->ntargets) return tpl_err(r, at, "macro '%s' takes at most %zu arguments (%zu given)", mname, m->ntargets, nargs);
    tscope *ms = tpl_scope_new(r, fn->scope);
    if (!ms) return tpl_oom(r, at);
    for (size_t i = 0; i < nkw; i++) {
        bool known = false;
        for (size_t k = 0; k < m->ntargets; k++) known |= !strcmp(m->targets[k], kwn[i]);
        if (!known && strcmp(kwn[i], "caller"))
            return tpl_err(r, at, "macro '%s' takes no keyword argument '%s'", mname, kwn[i]);
    }
    for (size_t k = 0; k < m->ntargets; k++) {
        tval v = tv_undef(undef_hint(r, "'%s' is undefined%s", m->targets[k], ""));
        bool set = false;
        if (k < nargs) {
            v = args[k];
            set = true;
        }
        for (size_t i = 0; i < nkw; i++)
            if (!strcmp(kwn[i], m->targets[k])) {
                v = kwv[i];
                set = true;
            }
        if (!set && m->kids[k]) ATLAS_TRY(tpl_eval(r, ms, m->kids[k], &v));
        ATLAS_TRY(tpl_scope_set(r, ms, m->targets[k], v));
    }
    if (fn->caller) ATLAS_TRY(tpl_scope_set(r, ms, "caller", (tval){.kind = TV_FUNC, .u.fn = fn->caller}));
    tbuf body = {.pieces = r->pieces};
    r->depth++;
    int saved_ctl = r->loop_ctl;
    r->loop_ctl = 0;
    atlas_status st = tpl_exec(r, ms, m->b, &body);
    r->loop_ctl = saved_ctl;
    r->depth--;
    if (st == ATLAS_OK) return tpl_from_pieces(r, at, &body, out);
    free(body.p);
    free(body.cuts);
    return st;
}

atlas_status tpl_call_value(trender *r, tscope *sc, const tnode *at, const tval *fn, tval *args,
                            size_t nargs, const char **kwn, tval *kwv, size_t nkw, tval *out) {
    (void)sc;
    if (fn->kind == TV_UNDEF) return undefined_error(r, at, fn);
    if (fn->kind != TV_FUNC) return tpl_err(r, at, "'%s' object is not callable", tv_type_name(fn));
    if (fn->u.fn->builtin == TF_METHOD) {
        const tfunc *m = fn->u.fn;
        atlas_status st = tpl_method(r, at, m->self, m->method, args, nargs, kwn, kwv, nkw, out);
        if (st == ATLAS_ERR_NOT_FOUND)
            return tpl_err(r, at, "'%s.%s()' is not supported", tv_type_name(m->self), m->method);
        return st;
    }
    if (fn->u.fn->builtin) return call_builtin(r, at, fn->u.fn->builtin, args, nargs, kwn, kwv, nkw, out);
    return call_macro(r, at, fn->u.fn, args, nargs, kwn, kwv, nkw, out);
}

static atlas_status eval_call(trender *r, tscope *sc, const tnode *n, tfunc *caller, tval *out) {
    targs a;
    const tnode *callee = n->a;
    if (callee->kind == TN_GETATTR) {
        tval obj;
        ATLAS_TRY(tpl_eval(r, sc, callee->a, &obj));
        if (obj.kind == TV_UNDEF) return undefined_error(r, callee, &obj);
        ATLAS_TRY(eval_args(r, sc, n, &a));
        atlas_status st = tpl_method(r, n, &obj, callee->str, a.pos, a.npos, a.kwn, a.kwv, a.nkw, out);
        if (st != ATLAS_ERR_NOT_FOUND) return st;
        tval fn;
        ATLAS_TRY(get_attr(r, callee, &obj, callee->str, &fn));
        if (fn.kind == TV_UNDEF)
            return tpl_err(r, callee, "'%s' object has no method '%s'", tv_type_name(&obj), callee->str);
        return tpl_call_value(r, sc, n, &fn, a.pos, a.npos, a.kwn, a.kwv, a.nkw, out);
    }
    tval fn;
    ATLAS_TRY(tpl_eval(r, sc, callee, &fn));
    ATLAS_TRY(eval_args(r, sc, n, &a));
    if (caller && fn.kind == TV_FUNC && !fn.u.fn->builtin) {
        tfunc *f = tpl_alloc(r, sizeof *f);
        if (!f) return tpl_oom(r, n);
        *f = *fn.u.fn;
        f->caller = caller;
        fn.u.fn = f;
    }
    return tpl_call_value(r, sc, n, &fn, a.pos, a.npos, a.kwn, a.kwv, a.nkw, out);
}

static atlas_status eval_unary(trender *r, tscope *sc, const tnode *n, tval *out) {
    tval v;
    ATLAS_TRY(tpl_eval(r, sc, n->a, &v));
    if (n->op == '!') {
        *out = tv_bool(!tv_truthy(&v));
        return ATLAS_OK;
    }
    if (v.kind == TV_UNDEF) return undefined_error(r, n, &v);
    if (!is_num(&v)) return tpl_err(r, n, "bad operand type for unary %c: '%s'", n->op, tv_type_name(&v));
    if (n->op == '+') *out = v.kind == TV_BOOL ? tv_int(v.u.b) : v;
    else if (v.kind == TV_FLOAT) *out = tv_float(-v.u.f);
    else if (as_i(&v) == LLONG_MIN) return tpl_err(r, n, "integer overflow in unary -");
    else *out = tv_int(-as_i(&v));
    return ATLAS_OK;
}

/* [a, b], (a, b) and {k: v} literals */
static atlas_status eval_collection(trender *r, tscope *sc, const tnode *n, tval *out) {
    if (n->kind == TN_DICT) {
        ATLAS_TRY(tv_dict(r, out));
        for (size_t i = 0; i + 1 < n->nkids; i += 2) {
            tval k, v;
            ATLAS_TRY(tpl_eval(r, sc, n->kids[i], &k));
            ATLAS_TRY(tpl_eval(r, sc, n->kids[i + 1], &v));
            if (k.kind == TV_LIST || k.kind == TV_DICT)
                return tpl_err(r, n->kids[i], "unhashable type: '%s'", tv_type_name(&k));
            ATLAS_TRY(tv_dict_set(r, out, k, v));
        }
        return ATLAS_OK;
    }
    ATLAS_TRY(tv_list(r, n->nkids, out));
    out->u.l->tuple = n->kind == TN_TUPLE;
    for (size_t i = 0; i < n->nkids; i++) {
        tval v;
        ATLAS_TRY(tpl_eval(r, sc, n->kids[i], &v));
        ATLAS_TRY(tv_list_push(r, out, v));
    }
    return ATLAS_OK;
}

/* ---- expressions --------------------------------------------------------------------- */
atlas_status tpl_eval(trender *r, tscope *sc, const tnode *n, tval *out) {
    ATLAS_TRY(step(r, n));
    switch (n->kind) {
    case TN_CONST: *out = n->val; return ATLAS_OK;
    case TN_NAME: *out = tpl_lookup(r, sc, n->str); return ATLAS_OK;
    case TN_LIST:
    case TN_TUPLE:
    case TN_DICT: return eval_collection(r, sc, n, out);
    case TN_GETATTR: {
        tval obj;
        ATLAS_TRY(tpl_eval(r, sc, n->a, &obj));
        return get_attr(r, n, &obj, n->str, out);
    }
    case TN_GETITEM: {
        tval obj, key;
        ATLAS_TRY(tpl_eval(r, sc, n->a, &obj));
        ATLAS_TRY(tpl_eval(r, sc, n->b, &key));
        return get_item(r, n, &obj, &key, out);
    }
    case TN_SLICE: return eval_slice(r, sc, n, out);
    case TN_CALL: return eval_call(r, sc, n, NULL, out);
    case TN_FILTER: {
        tval v;
        targs a;
        ATLAS_TRY(tpl_eval(r, sc, n->a, &v));
        ATLAS_TRY(eval_args(r, sc, n, &a));
        return tpl_filter(r, sc, n, n->str, v, a.pos, a.npos, a.kwn, a.kwv, a.nkw, out);
    }
    case TN_TEST: {
        tval v;
        targs a;
        bool res;
        ATLAS_TRY(tpl_eval(r, sc, n->a, &v));
        ATLAS_TRY(eval_args(r, sc, n, &a));
        ATLAS_TRY(tpl_test(r, n, n->str, &v, a.pos, a.npos, &res));
        *out = tv_bool(n->neg ? !res : res);
        return ATLAS_OK;
    }
    case TN_UNARY: return eval_unary(r, sc, n, out);
    case TN_BINARY: return eval_binary(r, sc, n, out);
    case TN_COMPARE: return eval_compare(r, sc, n, out);
    case TN_AND:
    case TN_OR: {
        ATLAS_TRY(tpl_eval(r, sc, n->a, out));
        bool t = tv_truthy(out);
        if (n->kind == TN_AND ? !t : t) return ATLAS_OK;
        return tpl_eval(r, sc, n->b, out);
    }
    case TN_COND: {
        tval c;
        ATLAS_TRY(tpl_eval(r, sc, n->a, &c));
        if (tv_truthy(&c)) return tpl_eval(r, sc, n->b, out);
        if (n->c) return tpl_eval(r, sc, n->c, out);
        *out = tv_undef("the conditional expression had no else");
        return ATLAS_OK;
    }
    default: return tpl_err(r, n, "statement used as an expression");
    }
}

/* ---- statements ---------------------------------------------------------------------- */
static atlas_status assign(trender *r, tscope *sc, const tnode *at, char **targets, size_t nt, const tval *v) {
    if (nt == 1) return tpl_scope_set(r, sc, targets[0], *v);
    if (v->kind != TV_LIST) return tpl_err(r, at, "cannot unpack a '%s' into %zu names", tv_type_name(v), nt);
    if (v->u.l->n != nt) return tpl_err(r, at, "cannot unpack %zu values into %zu names", v->u.l->n, nt);
    for (size_t i = 0; i < nt; i++) ATLAS_TRY(tpl_scope_set(r, sc, targets[i], v->u.l->v[i]));
    return ATLAS_OK;
}

/* The items a for loop walks: list items, dict keys, string characters. */
static atlas_status iter_items(trender *r, const tnode *at, const tval *seq, tval *out) {
    switch (seq->kind) {
    case TV_UNDEF: return tv_list(r, 0, out);
    case TV_LIST: *out = *seq; return ATLAS_OK;
    case TV_DICT:
        if (seq->u.d->ns) break;
        ATLAS_TRY(tv_list(r, seq->u.d->n, out));
        for (size_t i = 0; i < seq->u.d->n; i++) ATLAS_TRY(tv_list_push(r, out, seq->u.d->k[i]));
        return ATLAS_OK;
    case TV_STR: {
        const tstr *s = seq->u.s;
        ATLAS_TRY(tv_list(r, s->len, out));
        for (size_t i = 0; i < s->len;) {
            size_t j = i + 1;
            while (j < s->len && ((unsigned char)s->s[j] & 0xC0) == 0x80) j++;
            tval c;
            ATLAS_TRY(tv_str(r, s->s + i, j - i, &c));
            ATLAS_TRY(tv_list_push(r, out, c));
            i = j;
        }
        return ATLAS_OK;
    }
    default: break;
    }
    return tpl_err(r, at, "'%s' object is not iterable", tv_type_name(seq));
}

static const char *const LOOP_KEYS[] = {"index", "index0", "revindex", "revindex0", "first", "last",
                                        "length", "previtem", "nextitem", "depth", "depth0"};
enum { N_LOOP_KEYS = sizeof LOOP_KEYS / sizeof LOOP_KEYS[0] };

/* The loop object of iteration i: a dict whose keys (made once per loop) are shared. */
static atlas_status loop_object(trender *r, const tval *items, size_t i, tval *keys, tval *out) {
    size_t n = items->u.l->n;
    tval *v = tpl_alloc(r, N_LOOP_KEYS * sizeof *v);
    if (!v) return tpl_oom(r, NULL);
    v[0] = tv_int((long long)i + 1);
    v[1] = tv_int((long long)i);
    v[2] = tv_int((long long)(n - i));
    v[3] = tv_int((long long)(n - i - 1));
    v[4] = tv_bool(i == 0);
    v[5] = tv_bool(i + 1 == n);
    v[6] = tv_int((long long)n);
    v[7] = i > 0 ? items->u.l->v[i - 1] : tv_undef("there is no previous item");
    v[8] = i + 1 < n ? items->u.l->v[i + 1] : tv_undef("there is no next item");
    v[9] = tv_int(1);
    v[10] = tv_int(0);
    ATLAS_TRY(tv_dict(r, out));
    tdict *d = out->u.d;
    d->loop = true;
    d->k = keys;
    d->v = v;
    d->n = d->cap = N_LOOP_KEYS;
    return ATLAS_OK;
}

static atlas_status exec_for(trender *r, tscope *sc, const tnode *n, tbuf *out) {
    tval seq, items;
    ATLAS_TRY(tpl_eval(r, sc, n->a, &seq));
    ATLAS_TRY(iter_items(r, n->a, &seq, &items));
    tscope *ls = tpl_scope_new(r, sc);
    if (!ls) return tpl_oom(r, n);
    if (n->d) { /* for x in xs if cond: filter first, so loop.length counts what is kept */
        tval kept;
        ATLAS_TRY(tv_list(r, items.u.l->n, &kept));
        for (size_t i = 0; i < items.u.l->n; i++) {
            tval c;
            ATLAS_TRY(assign(r, ls, n, n->targets, n->ntargets, &items.u.l->v[i]));
            ATLAS_TRY(tpl_eval(r, ls, n->d, &c));
            if (tv_truthy(&c)) ATLAS_TRY(tv_list_push(r, &kept, items.u.l->v[i]));
        }
        items = kept;
    }
    tval *keys = tpl_alloc(r, N_LOOP_KEYS * sizeof *keys);
    if (!keys) return tpl_oom(r, n);
    for (size_t k = 0; k < N_LOOP_KEYS; k++) ATLAS_TRY(tv_str(r, LOOP_KEYS[k], strlen(LOOP_KEYS[k]), &keys[k]));
    for (size_t i = 0; i < items.u.l->n; i++) {
        tval loop;
        if (!(ls = tpl_scope_new(r, sc))) return tpl_oom(r, n); /* jinja2: a set lasts one iteration */
        ATLAS_TRY(loop_object(r, &items, i, keys, &loop));
        ATLAS_TRY(tpl_scope_set(r, ls, "loop", loop));
        ATLAS_TRY(assign(r, ls, n, n->targets, n->ntargets, &items.u.l->v[i]));
        ATLAS_TRY(tpl_exec(r, ls, n->b, out));
        int ctl = r->loop_ctl;
        r->loop_ctl = 0;
        if (ctl == 1) break;
    }
    if (items.u.l->n == 0 && n->c) return tpl_exec(r, sc, n->c, out);
    return ATLAS_OK;
}

/* Applies the TN_FILTER kids of n (a == NULL) to a string value. */
static atlas_status apply_filters(trender *r, tscope *sc, const tnode *n, tval *v) {
    for (size_t i = 0; i < n->nkids; i++) {
        const tnode *f = n->kids[i];
        targs a;
        ATLAS_TRY(eval_args(r, sc, f, &a));
        ATLAS_TRY(tpl_filter(r, sc, f, f->str, *v, a.pos, a.npos, a.kwn, a.kwv, a.nkw, v));
    }
    return ATLAS_OK;
}

static atlas_status capture(trender *r, tscope *sc, const tnode *body, const tnode *at, tval *out) {
    tbuf b = {.pieces = r->pieces};
    atlas_status st = tpl_exec(r, sc, body, &b);
    if (st == ATLAS_OK) return tpl_from_pieces(r, at, &b, out);
    free(b.p);
    free(b.cuts);
    return st;
}

/* Prints one piece: a text block or a value, with a cut on each side (and a captured
 * string's own cuts) so that the shield knows where a client's string may end. */
static void print_piece(tbuf *out, const tval *v) {
    tbuf_cut(out);
    if (v->kind == TV_STR) tbuf_put_str(out, v->u.s);
    else tv_to_str(out, v, false);
    tbuf_cut(out);
}

static atlas_status exec_set(trender *r, tscope *sc, const tnode *n) {
    tval v;
    if (n->kind == TN_SETBLOCK) {
        ATLAS_TRY(capture(r, sc, n->b, n, &v));
        ATLAS_TRY(apply_filters(r, sc, n, &v));
        return tpl_scope_set(r, sc, n->targets[0], v);
    }
    ATLAS_TRY(tpl_eval(r, sc, n->a, &v));
    if (n->str) { /* set ns.attr = v */
        tval ns = tpl_lookup(r, sc, n->targets[0]);
        if (ns.kind != TV_DICT || !ns.u.d->ns)
            return tpl_err(r, n, "cannot assign attribute '%s' on '%s': not a namespace()", n->str, n->targets[0]);
        tval key;
        ATLAS_TRY(tv_str(r, n->str, strlen(n->str), &key));
        return tv_dict_set(r, &ns, key, v);
    }
    return assign(r, sc, n, n->targets, n->ntargets, &v);
}

atlas_status tpl_exec(trender *r, tscope *sc, const tnode *n, tbuf *out) {
    ATLAS_TRY(step(r, n));
    if (out->oom) return tpl_oom(r, n);
    if (out->n > (256u << 20)) return tpl_err(r, n, "rendered text too large (over 256 MiB)");
    switch (n->kind) {
    case TN_BODY:
        for (size_t i = 0; i < n->nkids && !r->loop_ctl; i++) ATLAS_TRY(tpl_exec(r, sc, n->kids[i], out));
        return ATLAS_OK;
    case TN_TEXT: print_piece(out, &n->val); return ATLAS_OK;
    case TN_OUTPUT: {
        tval v;
        ATLAS_TRY(tpl_eval(r, sc, n->a, &v));
        print_piece(out, &v);
        return ATLAS_OK;
    }
    case TN_IF: {
        tval c;
        ATLAS_TRY(tpl_eval(r, sc, n->a, &c));
        if (tv_truthy(&c)) return tpl_exec(r, sc, n->b, out);
        return n->c ? tpl_exec(r, sc, n->c, out) : ATLAS_OK;
    }
    case TN_FOR: return exec_for(r, sc, n, out);
    case TN_SET:
    case TN_SETBLOCK: return exec_set(r, sc, n);
    case TN_MACRO: {
        tfunc *f = tpl_alloc(r, sizeof *f);
        if (!f) return tpl_oom(r, n);
        f->macro = n;
        f->scope = sc;
        return tpl_scope_set(r, sc, n->str, (tval){.kind = TV_FUNC, .u.fn = f});
    }
    case TN_CALLBLOCK: {
        tfunc *caller = tpl_alloc(r, sizeof *caller);
        if (!caller) return tpl_oom(r, n);
        caller->macro = n;
        caller->scope = sc;
        tval v;
        ATLAS_TRY(eval_call(r, sc, n->a, caller, &v));
        print_piece(out, &v);
        return ATLAS_OK;
    }
    case TN_WITH: {
        tscope *ws = tpl_scope_new(r, sc);
        if (!ws) return tpl_oom(r, n);
        for (size_t i = 0; i < n->nkw; i++) { /* values see the enclosing scope, as in jinja2 */
            tval v;
            ATLAS_TRY(tpl_eval(r, sc, n->kwvals[i], &v));
            ATLAS_TRY(tpl_scope_set(r, ws, n->kwnames[i], v));
        }
        return tpl_exec(r, ws, n->b, out);
    }
    case TN_FILTERBLOCK: {
        tval v;
        ATLAS_TRY(capture(r, sc, n->b, n, &v));
        ATLAS_TRY(apply_filters(r, sc, n, &v));
        print_piece(out, &v);
        return ATLAS_OK;
    }
    case TN_BREAK: r->loop_ctl = 1; return ATLAS_OK;
    case TN_CONTINUE: r->loop_ctl = 2; return ATLAS_OK;
    default: {
        tval v;
        ATLAS_TRY(tpl_eval(r, sc, n, &v));
        print_piece(out, &v);
        return ATLAS_OK;
    }
    }
}

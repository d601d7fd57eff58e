/* chat/template_value.c — template values with Python's semantics: truthiness,
 * equality and ordering, str()/repr() text, transformers' tojson (json.dumps), and the
 * conversion from JSON. Every value of a render lives in the render's arena. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/template_internal.h"
#include "core/error.h"

/* ---- arena --------------------------------------------------------------------------- */
struct tarena_block {
    tarena_block *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

void *tpl_alloc(trender *r, size_t n) {
    void *p = tpl_alloc_raw(r, n);
    if (p) memset(p, 0, n);
    return p;
}

void *tpl_alloc_raw(trender *r, size_t n) {
    tarena *a = &r->arena;
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    if (a->limit && a->used_total + n > a->limit) return NULL;
    tarena_block *b = a->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > (1u << 18) ? n : (1u << 18);
        b = malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->next = a->head;
        b->used = 0;
        b->cap = cap;
        a->head = b;
    }
    void *p = b->data + b->used;
    b->used += n;
    a->used_total += n;
    return p;
}

void tpl_arena_free(tarena *a) {
    tarena_block *b = a->head;
    while (b) {
        tarena_block *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL;
    a->used_total = 0;
}

atlas_status tpl_err(trender *r, const tnode *at, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (at) return atlas_fail(ATLAS_ERR_FORMAT, "%s:%d:%d: %s", r->name, at->line, at->col, msg);
    return atlas_fail(ATLAS_ERR_FORMAT, "%s: %s", r->name, msg);
}

/* The step budget lives with the byte budget (tpl_alloc), below the evaluator and the
 * filters, so that both can charge it without calling each other. */
atlas_status tpl_charge(trender *r, const tnode *at, size_t work) {
    r->steps += work > TPL_MAX_STEPS ? TPL_MAX_STEPS + 1 : (long long)work;
    if (r->steps > TPL_MAX_STEPS) return tpl_err(r, at, "template runs too long (over %d steps)", TPL_MAX_STEPS);
    return ATLAS_OK;
}

atlas_status tpl_oom(trender *r, const tnode *at) {
    atlas_status st = tpl_err(r, at, "out of memory (the render may use at most %zu MiB)",
                              r->arena.limit >> 20);
    return st == ATLAS_ERR_FORMAT ? ATLAS_ERR_NOMEM : st;
}

/* ---- buffers ------------------------------------------------------------------------- */
void tbuf_put(tbuf *b, const char *s, size_t n) {
    if (b->oom || n == 0) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
void tbuf_puts(tbuf *b, const char *s) { tbuf_put(b, s, strlen(s)); }

static void cut_at(tbuf *b, size_t at) {
    if (!b->pieces || b->oom || (b->n_cuts && b->cuts[b->n_cuts - 1] >= at)) return;
    if (b->n_cuts == b->cap_cuts) {
        size_t cap = b->cap_cuts ? b->cap_cuts * 2 : 64;
        size_t *c = realloc(b->cuts, cap * sizeof *c);
        if (!c) {
            b->oom = true;
            return;
        }
        b->cuts = c;
        b->cap_cuts = cap;
    }
    b->cuts[b->n_cuts++] = at;
}

void tbuf_cut(tbuf *b) { cut_at(b, b->n); }

size_t tbuf_inner_cuts(tbuf *b) {
    size_t k = 0;
    for (size_t i = 0; i < b->n_cuts; i++)
        if (b->cuts[i] > 0 && b->cuts[i] < b->n) b->cuts[k++] = b->cuts[i];
    return b->n_cuts = k;
}

void tbuf_put_str(tbuf *b, const tstr *s) {
    size_t at = b->n;
    tbuf_put(b, s->s, s->len);
    for (size_t i = 0; i < s->n_cuts; i++) cut_at(b, at + s->cuts[i]);
}
void tbuf_putc(tbuf *b, char c) { tbuf_put(b, &c, 1); }

/* ---- constructors -------------------------------------------------------------------- */
tval tv_undef(const char *name) {
    tval v = {.kind = TV_UNDEF};
    v.undef_name = name;
    return v;
}
tval tv_none(void) { return (tval){.kind = TV_NONE}; }
tval tv_bool(bool b) { return (tval){.kind = TV_BOOL, .u.b = b}; }
tval tv_int(long long i) { return (tval){.kind = TV_INT, .u.i = i}; }
tval tv_float(double f) { return (tval){.kind = TV_FLOAT, .u.f = f}; }

atlas_status tv_str(trender *r, const char *s, size_t n, tval *out) {
    char *p = NULL;
    ATLAS_TRY(tv_str_new(r, n, out, &p));
    if (n) memcpy(p, s, n);
    return ATLAS_OK;
}

atlas_status tv_str_new(trender *r, size_t n, tval *out, char **buf) {
    if (n > SIZE_MAX / 2) return tpl_oom(r, NULL);
    tstr *t = tpl_alloc_raw(r, sizeof *t + n + 1);
    if (!t) return tpl_oom(r, NULL);
    t->len = n;
    t->cuts = NULL;
    t->n_cuts = 0;
    t->s[n] = 0;
    *out = (tval){.kind = TV_STR, .u.s = t};
    *buf = t->s;
    return ATLAS_OK;
}

atlas_status tv_list(trender *r, size_t cap, tval *out) {
    tlist *l = tpl_alloc(r, sizeof *l);
    if (!l) return tpl_oom(r, NULL);
    if (cap) {
        if (cap > SIZE_MAX / sizeof(tval) || !(l->v = tpl_alloc_raw(r, cap * sizeof(tval))))
            return tpl_oom(r, NULL);
        l->cap = cap;
    }
    *out = (tval){.kind = TV_LIST, .u.l = l};
    return ATLAS_OK;
}

atlas_status tv_list_push(trender *r, tval *list, tval item) {
    tlist *l = list->u.l;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        tval *v = tpl_alloc_raw(r, cap * sizeof *v);
        if (!v) return tpl_oom(r, NULL);
        if (l->n) memcpy(v, l->v, l->n * sizeof *v);
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = item;
    return ATLAS_OK;
}

atlas_status tv_dict(trender *r, tval *out) {
    tdict *d = tpl_alloc(r, sizeof *d);
    if (!d) return tpl_oom(r, NULL);
    *out = (tval){.kind = TV_DICT, .u.d = d};
    return ATLAS_OK;
}

tval *tv_dict_find(const tval *dict, const tval *key) {
    const tdict *d = dict->u.d;
    for (size_t i = 0; i < d->n; i++)
        if (tv_equal(&d->k[i], key)) return &d->v[i];
    return NULL;
}

tval *tv_dict_get(const tval *dict, const char *key) {
    const tdict *d = dict->u.d;
    size_t len = strlen(key);
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].kind == TV_STR && d->k[i].u.s->len == len && !memcmp(d->k[i].u.s->s, key, len))
            return &d->v[i];
    return NULL;
}

atlas_status tv_dict_set(trender *r, tval *dict, tval key, tval val) {
    tval *slot = tv_dict_find(dict, &key);
    if (slot) {
        *slot = val;
        return ATLAS_OK;
    }
    return tv_dict_append(r, dict, key, val);
}

atlas_status tv_dict_append(trender *r, tval *dict, tval key, tval val) {
    tdict *d = dict->u.d;
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        tval *k = tpl_alloc_raw(r, cap * sizeof *k), *v = tpl_alloc_raw(r, cap * sizeof *v);
        if (!k || !v) return tpl_oom(r, NULL);
        if (d->n) {
            memcpy(k, d->k, d->n * sizeof *k);
            memcpy(v, d->v, d->n * sizeof *v);
        }
        d->k = k;
        d->v = v;
        d->cap = cap;
    }
    d->k[d->n] = key;
    d->v[d->n] = val;
    d->n++;
    return ATLAS_OK;
}

/* ---- Python semantics ---------------------------------------------------------------- */
bool tv_truthy(const tval *v) {
    switch (v->kind) {
    case TV_UNDEF:
    case TV_NONE: return false;
    case TV_BOOL: return v->u.b;
    case TV_INT: return v->u.i != 0;
    case TV_FLOAT: return v->u.f != 0.0;
    case TV_STR: return v->u.s->len > 0;
    case TV_LIST: return v->u.l->n > 0;
    case TV_DICT: return v->u.d->ns || v->u.d->n > 0;
    case TV_FUNC: return true;
    }
    return false;
}

static bool is_num(const tval *v) { return v->kind == TV_INT || v->kind == TV_FLOAT || v->kind == TV_BOOL; }
static double num_f(const tval *v) {
    return v->kind == TV_FLOAT ? v->u.f : v->kind == TV_INT ? (double)v->u.i : (double)v->u.b;
}
static long long num_i(const tval *v) { return v->kind == TV_INT ? v->u.i : (long long)v->u.b; }

/* Values nest as deep as a template makes them ({% set x = [x] %} in a loop): recursion
 * stops at MAX_NEST (Python raises RecursionError near there) instead of the C stack. */
enum { MAX_NEST = 400 };

static bool equal_at(const tval *a, const tval *b, int depth);

bool tv_equal(const tval *a, const tval *b) { return equal_at(a, b, 0); }

static bool equal_at(const tval *a, const tval *b, int depth) {
    if (depth > MAX_NEST) return false;
    if (is_num(a) && is_num(b)) {
        if (a->kind == TV_FLOAT || b->kind == TV_FLOAT) return num_f(a) == num_f(b);
        return num_i(a) == num_i(b);
    }
    if (a->kind != b->kind) return false;
    switch (a->kind) {
    case TV_UNDEF:
    case TV_NONE: return true;
    case TV_STR: return a->u.s->len == b->u.s->len && !memcmp(a->u.s->s, b->u.s->s, a->u.s->len);
    case TV_LIST:
        if (a->u.l == b->u.l) return true; /* identity first, as Python's list comparison */
        if (a->u.l->n != b->u.l->n || a->u.l->tuple != b->u.l->tuple) return false;
        for (size_t i = 0; i < a->u.l->n; i++)
            if (!equal_at(&a->u.l->v[i], &b->u.l->v[i], depth + 1)) return false;
        return true;
    case TV_DICT:
        if (a->u.d == b->u.d) return true;
        if (a->u.d->ns || b->u.d->ns || a->u.d->n != b->u.d->n) return false;
        for (size_t i = 0; i < a->u.d->n; i++) {
            const tval *o = tv_dict_find(b, &a->u.d->k[i]);
            if (!o || !equal_at(&a->u.d->v[i], o, depth + 1)) return false;
        }
        return true;
    case TV_FUNC: return a->u.fn == b->u.fn;
    default: return false;
    }
}

static int compare_at(const tval *a, const tval *b, int depth);

int tv_compare(const tval *a, const tval *b) { return compare_at(a, b, 0); }

static int compare_at(const tval *a, const tval *b, int depth) {
    if (depth > MAX_NEST) return -2;
    if (is_num(a) && is_num(b)) {
        if (a->kind == TV_FLOAT || b->kind == TV_FLOAT) {
            double x = num_f(a), y = num_f(b);
            return x < y ? -1 : x > y ? 1 : 0;
        }
        long long x = num_i(a), y = num_i(b);
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a->kind == TV_STR && b->kind == TV_STR) {
        size_t n = a->u.s->len < b->u.s->len ? a->u.s->len : b->u.s->len;
        int c = memcmp(a->u.s->s, b->u.s->s, n);
        if (c) return c < 0 ? -1 : 1;
        return a->u.s->len < b->u.s->len ? -1 : a->u.s->len > b->u.s->len ? 1 : 0;
    }
    if (a->kind == TV_LIST && b->kind == TV_LIST) {
        size_t n = a->u.l->n < b->u.l->n ? a->u.l->n : b->u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (equal_at(&a->u.l->v[i], &b->u.l->v[i], depth + 1)) continue;
            return compare_at(&a->u.l->v[i], &b->u.l->v[i], depth + 1);
        }
        return a->u.l->n < b->u.l->n ? -1 : a->u.l->n > b->u.l->n ? 1 : 0;
    }
    return -2;
}

const char *tv_type_name(const tval *v) {
    switch (v->kind) {
    case TV_UNDEF: return "Undefined";
    case TV_NONE: return "NoneType";
    case TV_BOOL: return "bool";
    case TV_INT: return "int";
    case TV_FLOAT: return "float";
    case TV_STR: return "str";
    case TV_LIST: return v->u.l->tuple ? "tuple" : "list";
    case TV_DICT: return v->u.d->ns ? "Namespace" : v->u.d->loop ? "LoopContext" : "dict";
    case TV_FUNC: return "function";
    }
    return "?";
}

void tv_float_repr(tbuf *b, double f) {
    char buf[64];
    if (isnan(f)) {
        tbuf_puts(b, "nan");
        return;
    }
    if (isinf(f)) {
        tbuf_puts(b, f < 0 ? "-inf" : "inf");
        return;
    }
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* buf: [-]d[.ddd]e[+-]XX -> digits and exponent */
    char digits[32];
    size_t nd = 0;
    const char *p = buf;
    bool neg = *p == '-';
    if (neg) p++;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    if (neg) tbuf_putc(b, '-');
    if (exp >= -4 && exp < 16) { /* Python's repr: fixed for 1e-4 <= |f| < 1e16 */
        if (exp >= 0) {
            for (int i = 0; i <= exp; i++) tbuf_putc(b, (size_t)i < nd ? digits[i] : '0');
            tbuf_putc(b, '.');
            if ((size_t)exp + 1 < nd) tbuf_puts(b, digits + exp + 1);
            else tbuf_putc(b, '0');
        } else {
            tbuf_puts(b, "0.");
            for (int i = 0; i < -exp - 1; i++) tbuf_putc(b, '0');
            tbuf_puts(b, digits);
        }
        return;
    }
    tbuf_putc(b, digits[0]);
    if (nd > 1) {
        tbuf_putc(b, '.');
        tbuf_puts(b, digits + 1);
    }
    snprintf(buf, sizeof buf, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    tbuf_puts(b, buf);
}

static void str_repr(tbuf *b, const tstr *s) {
    bool has_sq = memchr(s->s, '\'', s->len) != NULL, has_dq = memchr(s->s, '"', s->len) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    tbuf_putc(b, q);
    for (size_t i = 0; i < s->len; i++) {
        unsigned char c = (unsigned char)s->s[i];
        char esc[8];
        if (c == '\\' || c == (unsigned char)q) {
            tbuf_putc(b, '\\');
            tbuf_putc(b, (char)c);
        } else if (c == '\n') tbuf_puts(b, "\\n");
        else if (c == '\r') tbuf_puts(b, "\\r");
        else if (c == '\t') tbuf_puts(b, "\\t");
        else if (c < 0x20 || c == 0x7f) {
            snprintf(esc, sizeof esc, "\\x%02x", c);
            tbuf_puts(b, esc);
        } else tbuf_putc(b, (char)c);
    }
    tbuf_putc(b, q);
}

static void to_str_at(tbuf *b, const tval *v, bool repr, int depth);

void tv_to_str(tbuf *b, const tval *v, bool repr) { to_str_at(b, v, repr, 0); }

static void to_str_at(tbuf *b, const tval *v, bool repr, int depth) {
    if (depth > MAX_NEST) {
        tbuf_puts(b, "...");
        return;
    }
    char buf[32];
    switch (v->kind) {
    case TV_UNDEF: break;
    case TV_NONE: tbuf_puts(b, "None"); break;
    case TV_BOOL: tbuf_puts(b, v->u.b ? "True" : "False"); break;
    case TV_INT:
        snprintf(buf, sizeof buf, "%lld", v->u.i);
        tbuf_puts(b, buf);
        break;
    case TV_FLOAT: tv_float_repr(b, v->u.f); break;
    case TV_STR:
        if (repr) str_repr(b, v->u.s);
        else tbuf_put(b, v->u.s->s, v->u.s->len);
        break;
    case TV_LIST: {
        const tlist *l = v->u.l;
        tbuf_putc(b, l->tuple ? '(' : '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i) tbuf_puts(b, ", ");
            to_str_at(b, &l->v[i], true, depth + 1);
        }
        if (l->tuple && l->n == 1) tbuf_putc(b, ',');
        tbuf_putc(b, l->tuple ? ')' : ']');
        break;
    }
    case TV_DICT: {
        const tdict *d = v->u.d;
        if (d->ns) tbuf_puts(b, "<Namespace ");
        tbuf_putc(b, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i) tbuf_puts(b, ", ");
            to_str_at(b, &d->k[i], true, depth + 1);
            tbuf_puts(b, ": ");
            to_str_at(b, &d->v[i], true, depth + 1);
        }
        tbuf_putc(b, '}');
        if (d->ns) tbuf_putc(b, '>');
        break;
    }
    case TV_FUNC:
        if (v->u.fn->builtin == TF_METHOD) {
            tbuf_puts(b, "<built-in method ");
            tbuf_puts(b, v->u.fn->method);
            tbuf_puts(b, " of ");
            tbuf_puts(b, tv_type_name(v->u.fn->self));
            tbuf_puts(b, " object>");
        } else {
            tbuf_puts(b, "<function>");
        }
        break;
    }
}

atlas_status tv_stringify(trender *r, const tval *v, tval *out) {
    if (v->kind == TV_STR) {
        *out = *v;
        return ATLAS_OK;
    }
    tbuf b = {0};
    tv_to_str(&b, v, false);
    if (b.oom) return tpl_oom(r, NULL);
    atlas_status st = tv_str(r, b.p ? b.p : "", b.n, out);
    free(b.p);
    return st;
}

/* ---- JSON ---------------------------------------------------------------------------- */
static void json_str(tbuf *b, const char *s, size_t n, bool ascii) {
    tbuf_putc(b, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[24];
        switch (c) {
        case '"': tbuf_puts(b, "\\\""); break;
        case '\\': tbuf_puts(b, "\\\\"); break;
        case '\n': tbuf_puts(b, "\\n"); break;
        case '\r': tbuf_puts(b, "\\r"); break;
        case '\t': tbuf_puts(b, "\\t"); break;
        case '\b': tbuf_puts(b, "\\b"); break;
        case '\f': tbuf_puts(b, "\\f"); break;
        default:
            if (c < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", c);
                tbuf_puts(b, esc);
            } else if (ascii && c >= 0x80) { /* ensure_ascii: \uXXXX, surrogate pairs above U+FFFF */
                unsigned long cp = 0;
                size_t k = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
                if (i + k > n) k = 1;
                cp = k == 1 ? c : k == 2 ? (c & 0x1Fu) : k == 3 ? (c & 0x0Fu) : (c & 0x07u);
                for (size_t m = 1; m < k; m++) cp = (cp << 6) | ((unsigned char)s[i + m] & 0x3Fu);
                i += k - 1;
                if (cp > 0xFFFF) {
                    cp -= 0x10000;
                    snprintf(esc, sizeof esc, "\\u%04lx", 0xD800 + (cp >> 10));
                    tbuf_puts(b, esc);
                    cp = 0xDC00 + (cp & 0x3FF);
                }
                snprintf(esc, sizeof esc, "\\u%04lx", cp);
                tbuf_puts(b, esc);
            } else {
                tbuf_putc(b, (char)c);
            }
        }
    }
    tbuf_putc(b, '"');
}

static void newline_indent(tbuf *b, int indent, int depth) {
    tbuf_putc(b, '\n');
    for (int i = 0; i < indent * depth; i++) tbuf_putc(b, ' ');
}

static int key_cmp(const void *x, const void *y) {
    const tval *a = *(const tval *const *)x, *b = *(const tval *const *)y;
    int c = tv_compare(a, b);
    return c == -2 ? 0 : c;
}

static bool json_key(tbuf *b, const tval *k, bool ascii) {
    char buf[32];
    switch (k->kind) {
    case TV_STR: json_str(b, k->u.s->s, k->u.s->len, ascii); return true;
    case TV_INT: snprintf(buf, sizeof buf, "\"%lld\"", k->u.i); tbuf_puts(b, buf); return true;
    case TV_BOOL: tbuf_puts(b, k->u.b ? "\"true\"" : "\"false\""); return true;
    case TV_NONE: tbuf_puts(b, "\"null\""); return true;
    case TV_FLOAT:
        tbuf_putc(b, '"');
        tv_float_repr(b, k->u.f);
        tbuf_putc(b, '"');
        return true;
    default: return false;
    }
}

bool tv_to_json(tbuf *b, const tval *v, const tjson_opts *o, int depth) {
    int indent = o->indent;
    char buf[32];
    if (depth > 500) return false; /* Python raises RecursionError near here too */
    switch (v->kind) {
    case TV_NONE: tbuf_puts(b, "null"); return true;
    case TV_BOOL: tbuf_puts(b, v->u.b ? "true" : "false"); return true;
    case TV_INT: snprintf(buf, sizeof buf, "%lld", v->u.i); tbuf_puts(b, buf); return true;
    case TV_FLOAT:
        if (isnan(v->u.f)) tbuf_puts(b, "NaN");
        else if (isinf(v->u.f)) tbuf_puts(b, v->u.f < 0 ? "-Infinity" : "Infinity");
        else tv_float_repr(b, v->u.f);
        return true;
    case TV_STR: json_str(b, v->u.s->s, v->u.s->len, o->ascii); return true;
    case TV_LIST: {
        const tlist *l = v->u.l;
        if (!l->n) {
            tbuf_puts(b, "[]");
            return true;
        }
        tbuf_putc(b, '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i) tbuf_puts(b, o->item_sep);
            if (indent >= 0) newline_indent(b, indent, depth + 1);
            if (!tv_to_json(b, &l->v[i], o, depth + 1)) return false;
        }
        if (indent >= 0) newline_indent(b, indent, depth);
        tbuf_putc(b, ']');
        return true;
    }
    case TV_DICT: {
        const tdict *d = v->u.d;
        if (d->ns || d->loop) return false;
        if (!d->n) {
            tbuf_puts(b, "{}");
            return true;
        }
        const tval **keys = malloc(d->n * sizeof *keys);
        if (!keys) {
            b->oom = true;
            return true;
        }
        for (size_t i = 0; i < d->n; i++) keys[i] = &d->k[i];
        if (o->sort_keys) qsort(keys, d->n, sizeof *keys, key_cmp);
        tbuf_putc(b, '{');
        bool ok = true;
        for (size_t i = 0; i < d->n && ok; i++) {
            if (i) tbuf_puts(b, o->item_sep);
            if (indent >= 0) newline_indent(b, indent, depth + 1);
            ok = json_key(b, keys[i], o->ascii);
            tbuf_puts(b, o->key_sep);
            const tval *val = &d->v[keys[i] - d->k];
            if (ok) ok = tv_to_json(b, val, o, depth + 1);
        }
        free(keys);
        if (!ok) return false;
        if (indent >= 0) newline_indent(b, indent, depth);
        tbuf_putc(b, '}');
        return true;
    }
    default: return false;
    }
}

atlas_status tv_from_json(trender *r, const json_t *j, tval *out) {
    switch (json_typeof(j)) {
    case JSON_NULL: *out = tv_none(); return ATLAS_OK;
    case JSON_TRUE: *out = tv_bool(true); return ATLAS_OK;
    case JSON_FALSE: *out = tv_bool(false); return ATLAS_OK;
    case JSON_INTEGER: *out = tv_int(json_integer_value(j)); return ATLAS_OK;
    case JSON_REAL: *out = tv_float(json_real_value(j)); return ATLAS_OK;
    case JSON_STRING: return tv_str(r, json_string_value(j), json_string_length(j), out);
    case JSON_ARRAY: {
        ATLAS_TRY(tv_list(r, json_array_size(j), out));
        size_t i;
        json_t *x;
        json_array_foreach(j, i, x) {
            tval v;
            ATLAS_TRY(tv_from_json(r, x, &v));
            ATLAS_TRY(tv_list_push(r, out, v));
        }
        return ATLAS_OK;
    }
    case JSON_OBJECT: {
        ATLAS_TRY(tv_dict(r, out));
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)j, k, x) {
            tval kv, v;
            ATLAS_TRY(tv_str(r, k, strlen(k), &kv));
            ATLAS_TRY(tv_from_json(r, x, &v));
            ATLAS_TRY(tv_dict_append(r, out, kv, v)); /* jansson's keys are unique */
        }
        return ATLAS_OK;
    }
    }
    return atlas_fail(ATLAS_ERR_INTERNAL, "%s: unknown JSON type", r->name);
}

/* ---- UTF-8 --------------------------------------------------------------------------- */
size_t tpl_utf8_count(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) c++;
    return c;
}

size_t tpl_utf8_offset(const char *s, size_t n, size_t idx) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) {
        if (((unsigned char)s[i] & 0xC0) != 0x80) {
            if (c == idx) return i;
            c++;
        }
    }
    return n;
}

/* chat/template_internal.h — the Jinja interpreter behind atlas/template.h.  Internal.
 *
 * Pipeline: template_lex.c (source -> tokens, with jinja2's whitespace rules under
 * trim_blocks + lstrip_blocks) -> template_parse.c (statements) and template_expr.c
 * (expressions: tokens -> AST of tnode, template_parser.h) -> template_eval.c (AST +
 * variables -> text), with values in template_value.c, the filters in template_filters.c,
 * the tests and str / dict / list methods in template_methods.c and what they share in
 * template_strings.c. A render allocates every value from
 * one arena freed at the end, so values need no reference counts; the AST is immutable
 * and shared by concurrent renders. */
#ifndef ATLAS_TEMPLATE_INTERNAL_H
#define ATLAS_TEMPLATE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "atlas/status.h"

/* ---- lexer --------------------------------------------------------------------------- */
typedef enum ttok_kind {
    TT_EOF = 0,
    TT_TEXT,        /* literal text between tags (after whitespace control) */
    TT_VAR_BEGIN,   /* {{ */
    TT_VAR_END,     /* }} */
    TT_BLOCK_BEGIN, /* {% */
    TT_BLOCK_END,   /* %} */
    TT_NAME,
    TT_STRING,      /* text holds the decoded value */
    TT_INT,
    TT_FLOAT,
    TT_OP,          /* text holds the operator: + - * / // % ** ~ ( ) [ ] { } , . : | = == != < <= > >= */
} ttok_kind;

typedef struct ttok {
    ttok_kind kind;
    int line, col;
    char *text; /* NUL-terminated (may hold NULs for strings: use len) */
    size_t len;
    long long ival;
    double fval;
} ttok;

typedef struct ttoks {
    ttok *v;
    size_t n, cap;
} ttoks;

/* name is used in error messages. On failure the message has name:line:col. */
atlas_status tpl_lex(const char *src, const char *name, ttoks *out);
void tpl_toks_free(ttoks *t);

/* ---- AST ----------------------------------------------------------------------------- */
typedef enum tnode_kind {
    /* statements */
    TN_BODY,    /* kids: statements */
    TN_TEXT,    /* str */
    TN_OUTPUT,  /* a: expression */
    TN_IF,      /* a: cond, b: then body, c: else (TN_IF for elif, TN_BODY, or NULL) */
    TN_FOR,     /* targets (names), a: iterable, b: body, c: else body, d: filter cond */
    TN_SET,     /* targets, a: value;  str: namespace attribute when ns.attr = */
    TN_SETBLOCK,/* targets[0], b: body, kids: filters (TN_FILTER with a = NULL) */
    TN_MACRO,   /* str: name, params (names), kids: defaults (or NULL), b: body */
    TN_CALLBLOCK,/* a: call expression, b: caller body, params */
    TN_FILTERBLOCK,/* b: body, kids: filters */
    TN_WITH,    /* kwnames = kwvals, then b: body in a new scope */
    TN_BREAK,
    TN_CONTINUE,
    /* expressions */
    TN_CONST,   /* val */
    TN_NAME,    /* str */
    TN_LIST,    /* kids */
    TN_TUPLE,   /* kids */
    TN_DICT,    /* kids: key, value, key, value, ... */
    TN_GETATTR, /* a: object, str: attribute */
    TN_GETITEM, /* a: object, b: index */
    TN_SLICE,   /* a: object, kids[0..2]: start, stop, step (each may be NULL) */
    TN_CALL,    /* a: callee, kids: positional args, kwnames/kwvals: keywords */
    TN_FILTER,  /* a: value, str: filter name, kids: args, kwnames/kwvals */
    TN_TEST,    /* a: value, str: test name, kids: args, neg: "is not" */
    TN_UNARY,   /* op: '-', '+', '!' (not), a */
    TN_BINARY,  /* op (see TOP_*), a, b */
    TN_COMPARE, /* chained comparison a < b < c: kids operands, ops[nkids - 1] */
    TN_AND,
    TN_OR,
    TN_COND,    /* a: cond, b: then, c: else (may be NULL) */
} tnode_kind;

enum {
    TOP_ADD = 1, TOP_SUB, TOP_MUL, TOP_DIV, TOP_FLOORDIV, TOP_MOD, TOP_POW, TOP_CONCAT,
    TOP_EQ, TOP_NE, TOP_LT, TOP_LE, TOP_GT, TOP_GE, TOP_IN, TOP_NOTIN,
};

typedef struct tval tval;
typedef struct tnode tnode;

/* ---- values -------------------------------------------------------------------------- */
typedef enum tval_kind {
    TV_UNDEF = 0, /* jinja2's Undefined: prints "", false, iterates empty */
    TV_NONE,
    TV_BOOL,
    TV_INT,
    TV_FLOAT,
    TV_STR,
    TV_LIST,  /* also tuples (flag) */
    TV_DICT,  /* also namespace() and the loop object (flags) */
    TV_FUNC,  /* a builtin global, a macro or caller() */
} tval_kind;

typedef struct tstr {
    size_t len;
    /* a captured string's own piece boundaries (macro output, set blocks), kept so that
     * printing it whole still tells the shield where its pieces meet; NULL for others */
    const size_t *cuts;
    size_t n_cuts;
    char s[]; /* NUL-terminated */
} tstr;

typedef struct tlist {
    size_t n, cap;
    tval *v;
    bool tuple;
} tlist;

typedef struct tdict {
    size_t n, cap;
    tval *k, *v;
    bool ns;   /* namespace(): attributes may be assigned */
    bool loop; /* the loop object: loop.cycle() */
} tdict;

struct tscope;
typedef struct tfunc {
    int builtin;               /* TF_* or 0 for a macro / caller */
    const tnode *macro;        /* TN_MACRO or TN_CALLBLOCK */
    struct tscope *scope;      /* where it was defined */
    struct tfunc *caller;      /* the caller() passed into a macro called by {% call %} */
    const struct tval *self;   /* TF_METHOD: the object (e.g. the dict of d.items) */
    const char *method;        /* TF_METHOD: its name */
} tfunc;

/* TF_METHOD: a bound method such as d.items (jinja2's getattr finds methods before keys) */
enum { TF_RANGE = 1, TF_NAMESPACE, TF_DICT, TF_RAISE, TF_STRFTIME, TF_METHOD };

struct tval {
    tval_kind kind;
    union {
        bool b;
        long long i;
        double f;
        tstr *s;
        tlist *l;
        tdict *d;
        tfunc *fn;
    } u;
    const char *undef_name; /* for TV_UNDEF: what was missing (error messages), may be NULL */
};

struct tnode {
    tnode_kind kind;
    int line, col;
    int op;
    bool neg;
    char *str;
    tval val;
    tnode *a, *b, *c, *d;
    tnode **kids;
    size_t nkids;
    char **targets; /* TN_FOR / TN_SET / TN_MACRO params */
    size_t ntargets;
    char **kwnames;
    tnode **kwvals;
    size_t nkw;
    int *ops; /* TN_COMPARE */
};

/* Parses src (already lexed inside) into a TN_BODY. Frees with tpl_node_free. */
atlas_status tpl_parse(const char *src, const char *name, tnode **out);
void tpl_node_free(tnode *n);

/* ---- render state -------------------------------------------------------------------- */
typedef struct tarena_block tarena_block;
typedef struct tarena {
    tarena_block *head;
    size_t used_total, limit;
} tarena;

typedef struct tbuf {
    char *p;
    size_t n, cap;
    bool oom;
    bool pieces;  /* record where printed pieces meet (atlas_template_render_pieces) */
    size_t *cuts; /* malloc'd, ascending, no repeats */
    size_t n_cuts, cap_cuts;
} tbuf;

typedef struct tscope {
    struct tscope *parent;
    size_t n, cap;
    const char **names;
    tval *vals;
} tscope;

typedef struct trender {
    tarena arena;
    const char *name; /* template name for messages */
    tscope *root;
    long long steps;  /* guards against templates that never finish */
    int depth;        /* macro call depth */
    int loop_ctl;     /* 1 break, 2 continue */
    bool pieces;      /* captures record their piece boundaries too */
} trender;

/* A render may take this many steps (nodes evaluated, plus the work of filters such as
 * sort and unique): a template that would run for minutes fails instead. */
enum { TPL_MAX_STEPS = 5 * 1000 * 1000 };
atlas_status tpl_charge(trender *r, const tnode *at, size_t work);

void *tpl_alloc(trender *r, size_t n);     /* zeroed; NULL on exhaustion */
void *tpl_alloc_raw(trender *r, size_t n); /* not zeroed */
atlas_status tpl_oom(trender *r, const tnode *at);
atlas_status tpl_err(trender *r, const tnode *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void tpl_arena_free(tarena *a);

/* buffers (malloc'd) */
void tbuf_put(tbuf *b, const char *s, size_t n);
void tbuf_puts(tbuf *b, const char *s);
void tbuf_putc(tbuf *b, char c);
void tbuf_cut(tbuf *b);                   /* a piece ends here (when b records them) */
void tbuf_put_str(tbuf *b, const tstr *s); /* its bytes, and its own cuts when b records */
size_t tbuf_inner_cuts(tbuf *b); /* keeps the cuts inside the text (not at 0 or n): how many */

/* constructors */
tval tv_undef(const char *name);
tval tv_none(void);
tval tv_bool(bool b);
tval tv_int(long long i);
tval tv_float(double f);
atlas_status tv_str(trender *r, const char *s, size_t n, tval *out);
/* a string of n bytes for the caller to fill through *buf (NUL already placed) */
atlas_status tv_str_new(trender *r, size_t n, tval *out, char **buf);
atlas_status tv_list(trender *r, size_t cap, tval *out);
atlas_status tv_list_push(trender *r, tval *list, tval item);
atlas_status tv_dict(trender *r, tval *out);
atlas_status tv_dict_set(trender *r, tval *dict, tval key, tval val);
/* adds a key known to be absent (JSON objects): no search */
atlas_status tv_dict_append(trender *r, tval *dict, tval key, tval val);
/* NULL when absent */
tval *tv_dict_get(const tval *dict, const char *key);
tval *tv_dict_find(const tval *dict, const tval *key);

/* conversions */
bool tv_truthy(const tval *v);
bool tv_equal(const tval *a, const tval *b);
/* -2 when the values cannot be ordered (Python TypeError), else -1/0/1 */
int tv_compare(const tval *a, const tval *b);
const char *tv_type_name(const tval *v);
/* Python str(v) appended to b (undefined -> ""); repr when repr is true */
void tv_to_str(tbuf *b, const tval *v, bool repr);
atlas_status tv_stringify(trender *r, const tval *v, tval *out); /* str(v) as a TV_STR */
/* transformers' tojson: json.dumps(x, ensure_ascii, indent, separators, sort_keys).
 * indent < 0: none. Fails (returns false) on values JSON cannot hold. */
typedef struct tjson_opts {
    int indent;
    const char *item_sep, *key_sep;
    bool sort_keys, ascii;
} tjson_opts;
bool tv_to_json(tbuf *b, const tval *v, const tjson_opts *o, int depth);
atlas_status tv_from_json(trender *r, const json_t *j, tval *out);
void tv_float_repr(tbuf *b, double f); /* Python repr(float) */

/* UTF-8 code point helpers */
size_t tpl_utf8_count(const char *s, size_t n);
/* byte offset of code point index i (i <= count) */
size_t tpl_utf8_offset(const char *s, size_t n, size_t i);

/* ---- eval and filters ---------------------------------------------------------------- */
atlas_status tpl_eval(trender *r, tscope *sc, const tnode *n, tval *out);
atlas_status tpl_exec(trender *r, tscope *sc, const tnode *n, tbuf *out);
/* Whether name is one of the engine's builtin functions (range, namespace, ...). */
bool tpl_is_builtin(const char *name);
tval tpl_lookup(trender *r, tscope *sc, const char *name);
atlas_status tpl_scope_set(trender *r, tscope *sc, const char *name, tval v);
tscope *tpl_scope_new(trender *r, tscope *parent);
atlas_status tpl_call_value(trender *r, tscope *sc, const tnode *at, const tval *fn, tval *args,
                            size_t nargs, const char **kwn, tval *kwv, size_t nkw, tval *out);

/* Applies filter `name` to v with evaluated arguments. */
atlas_status tpl_filter(trender *r, tscope *sc, const tnode *at, const char *name, tval v,
                        tval *args, size_t nargs, const char **kwn, tval *kwv, size_t nkw,
                        tval *out);
/* Evaluates test `name` on v. */
atlas_status tpl_test(trender *r, const tnode *at, const char *name, const tval *v, tval *args,
                      size_t nargs, bool *out);
/* Calls method `name` of v (str / dict / list methods). ATLAS_ERR_NOT_FOUND when v has no
 * such method (then the caller treats it as an attribute). */
atlas_status tpl_method(trender *r, const tnode *at, const tval *v, const char *name, tval *args,
                        size_t nargs, const char **kwn, tval *kwv, size_t nkw, tval *out);
/* "fmt" % args (printf-style, as Python strings) */
atlas_status tpl_percent_format(trender *r, const tnode *at, const tval *fmt, const tval *args, size_t nargs,
                                tval *out);
/* ---- template_strings.c: shared by the filters, tests and methods --------------------- */
/* A call's evaluated arguments: positional, then keyword. */
typedef struct fargs {
    tval *pos;
    size_t npos;
    const char **kwn;
    tval *kwv;
    size_t nkw;
} fargs;
bool tpl_is_space(uint32_t cp);
atlas_status tpl_str_strip(trender *r, const tval *s, const tval *chars, int which, tval *out);
/* The idx-th positional argument or the keyword kw; NULL when absent. */
const tval *tpl_arg(const fargs *a, size_t idx, const char *kw);
atlas_status tpl_need_str(trender *r, const tnode *at, const char *what, const tval *v);
atlas_status tpl_from_buf(trender *r, const tnode *at, tbuf *b, tval *out);
/* A string from what a body printed (b is freed), with b's cuts when it recorded them. */
atlas_status tpl_from_pieces(trender *r, const tnode *at, tbuf *b, tval *out);
/* The code point at byte i of s[0..n) and its length */
size_t tpl_cp_at(const char *s, size_t n, size_t i, uint32_t *cp);
atlas_status tpl_change_case(trender *r, const tnode *at, const tval *v, char mode, tval *out);
/* Python's str.split / str.replace / startswith-endswith, on template strings */
atlas_status tpl_str_split(trender *r, const tnode *at, const tval *s, const tval *sep,
                           long long maxsplit, tval *out);
atlas_status tpl_str_replace(trender *r, const tnode *at, const tval *s, const tval *old,
                             const tval *new_, long long count, tval *out);
bool tpl_affix(const tval *s, const tval *x, bool start);
/* What v iterates as (a list, a dict's keys, a string's characters), and a dict's items */
atlas_status tpl_to_list(trender *r, const tnode *at, const tval *v, tval *out);
atlas_status tpl_items_of(trender *r, const tnode *at, const tval *v, tval *out);

#endif

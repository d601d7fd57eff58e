/* chat/template_expr.c — tokens to expression nodes (jinja2's grammar and precedence:
 * conditional < or < and < not < comparisons/in < + - < ~ < * / // % < ** < unary <
 * primary with postfix . [] () and then | filters and `is` tests), the parser's node helpers,
 * and freeing a tree. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/template_parser.h"
#include "core/error.h"

static const char *tok_desc(const ttok *t) {
    switch (t->kind) {
    case TT_EOF: return "end of template";
    case TT_TEXT: return "text";
    case TT_VAR_BEGIN: return "'{{'";
    case TT_VAR_END: return "'}}'";
    case TT_BLOCK_BEGIN: return "'{%'";
    case TT_BLOCK_END: return "'%}'";
    default: return t->text;
    }
}

atlas_status tpp_perr(parser *p, const ttok *t, const char *what) {
    return atlas_fail(ATLAS_ERR_FORMAT, "%s:%d:%d: %s (at %s%s%s)", p->name, t->line, t->col, what,
                      t->kind >= TT_NAME ? "'" : "", tok_desc(t), t->kind >= TT_NAME ? "'" : "");
}

tnode *tpp_node_new(tnode_kind kind, const ttok *t) {
    tnode *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->kind = kind;
    n->line = t->line;
    n->col = t->col;
    return n;
}

/* The end of every parse_*: hands n to *out on success, frees it on failure. */
atlas_status tpp_node_done(tnode *n, atlas_status st, tnode **out) {
    if (st != ATLAS_OK) {
        tpl_node_free(n);
        return st;
    }
    *out = n;
    return ATLAS_OK;
}

atlas_status tpp_nomem(parser *p) { return atlas_fail(ATLAS_ERR_NOMEM, "%s: out of memory parsing", p->name); }

atlas_status tpp_add_kid(parser *p, tnode *n, tnode *kid) {
    tnode **k = realloc(n->kids, (n->nkids + 1) * sizeof *k);
    if (!k) {
        tpl_node_free(kid);
        return tpp_nomem(p);
    }
    n->kids = k;
    n->kids[n->nkids++] = kid;
    return ATLAS_OK;
}

atlas_status tpp_add_str(parser *p, char ***arr, size_t *n, const char *s) {
    char **a = realloc(*arr, (*n + 1) * sizeof *a);
    if (!a) return tpp_nomem(p);
    *arr = a;
    if (!(a[*n] = strdup(s))) return tpp_nomem(p);
    (*n)++;
    return ATLAS_OK;
}

atlas_status tpp_expect_op(parser *p, const char *op) {
    if (!is_op(cur(p), op)) {
        char msg[64];
        snprintf(msg, sizeof msg, "expected '%s'", op);
        return tpp_perr(p, cur(p), msg);
    }
    adv(p);
    return ATLAS_OK;
}

atlas_status tpp_expect_name(parser *p, const char **out) {
    if (cur(p)->kind != TT_NAME) return tpp_perr(p, cur(p), "expected a name");
    *out = cur(p)->text;
    adv(p);
    return ATLAS_OK;
}

static atlas_status parse_unary(parser *p, bool with_filter, tnode **out);
static atlas_status parse_postfix(parser *p, tnode *n, bool with_filter, tnode **out);

/* Arguments of a call, filter or test after '(' up to ')'. */
atlas_status tpp_parse_args(parser *p, tnode *n) {
    ATLAS_TRY(tpp_expect_op(p, "("));
    while (!is_op(cur(p), ")")) {
        if (n->nkids + n->nkw > 0) ATLAS_TRY(tpp_expect_op(p, ","));
        if (is_op(cur(p), ")")) break; /* trailing comma */
        if (is_op(cur(p), "*") || is_op(cur(p), "**"))
            return tpp_perr(p, cur(p), "*args and **kwargs in calls are not supported");
        if (cur(p)->kind == TT_NAME && is_op(peek(p, 1), "=")) {
            const char *kw = cur(p)->text;
            adv(p);
            adv(p);
            tnode *v;
            ATLAS_TRY(tpp_parse_expr(p, &v));
            tnode **vals = realloc(n->kwvals, (n->nkw + 1) * sizeof *vals);
            if (!vals) {
                tpl_node_free(v);
                return tpp_nomem(p);
            }
            n->kwvals = vals;
            n->kwvals[n->nkw] = v;
            char **names = realloc(n->kwnames, (n->nkw + 1) * sizeof *names);
            if (!names) return tpp_nomem(p);
            n->kwnames = names;
            if (!(names[n->nkw] = strdup(kw))) {
                n->nkw++; /* so the value is freed with n; name is NULL */
                return tpp_nomem(p);
            }
            n->nkw++;
        } else {
            if (n->nkw) return tpp_perr(p, cur(p), "positional argument after a keyword argument");
            tnode *v;
            ATLAS_TRY(tpp_parse_expr(p, &v));
            ATLAS_TRY(tpp_add_kid(p, n, v));
        }
    }
    adv(p);
    return ATLAS_OK;
}

atlas_status tpp_make_const_str(parser *p, const ttok *t, const char *s, size_t len, tnode **out) {
    tnode *n = tpp_node_new(TN_CONST, t);
    tstr *str = malloc(sizeof *str + len + 1);
    if (!n || !str) {
        free(n);
        free(str);
        return tpp_nomem(p);
    }
    str->len = len;
    str->cuts = NULL;
    str->n_cuts = 0;
    memcpy(str->s, s, len);
    str->s[len] = 0;
    n->val.kind = TV_STR;
    n->val.u.s = str;
    *out = n;
    return ATLAS_OK;
}

/* [ ... ], ( ... ) or { ... }: items separated by commas until close. */
static atlas_status parse_seq(parser *p, tnode *n, const char *close, bool dict) {
    while (!is_op(cur(p), close)) {
        if (n->nkids) ATLAS_TRY(tpp_expect_op(p, ","));
        if (is_op(cur(p), close)) break;
        tnode *v;
        ATLAS_TRY(tpp_parse_expr(p, &v));
        ATLAS_TRY(tpp_add_kid(p, n, v));
        if (dict) {
            ATLAS_TRY(tpp_expect_op(p, ":"));
            ATLAS_TRY(tpp_parse_expr(p, &v));
            ATLAS_TRY(tpp_add_kid(p, n, v));
        }
    }
    adv(p);
    return ATLAS_OK;
}

static atlas_status parse_primary(parser *p, tnode **out) {
    ttok *t = cur(p);
    tnode *n = NULL;
    if (t->kind == TT_NAME) {
        static const char *consts[] = {"true", "false", "none", "True", "False", "None"};
        for (int k = 0; k < 6; k++) {
            if (strcmp(t->text, consts[k])) continue;
            if (!(n = tpp_node_new(TN_CONST, t))) return tpp_nomem(p);
            n->val = (k % 3 == 2) ? tv_none() : tv_bool(k % 3 == 0);
            adv(p);
            *out = n;
            return ATLAS_OK;
        }
        if (!(n = tpp_node_new(TN_NAME, t)) || !(n->str = strdup(t->text))) {
            free(n);
            return tpp_nomem(p);
        }
        adv(p);
    } else if (t->kind == TT_STRING) {
        /* adjacent literals join: "a" "b" */
        size_t len = 0, j = p->i;
        while (p->toks.v[j].kind == TT_STRING) len += p->toks.v[j++].len;
        char *buf = malloc(len + 1);
        if (!buf) return tpp_nomem(p);
        size_t o = 0;
        while (cur(p)->kind == TT_STRING) {
            memcpy(buf + o, cur(p)->text, cur(p)->len);
            o += cur(p)->len;
            adv(p);
        }
        atlas_status st = tpp_make_const_str(p, t, buf, o, &n);
        free(buf);
        ATLAS_TRY(st);
    } else if (t->kind == TT_INT || t->kind == TT_FLOAT) {
        if (!(n = tpp_node_new(TN_CONST, t))) return tpp_nomem(p);
        n->val = t->kind == TT_INT ? tv_int(t->ival) : tv_float(t->fval);
        adv(p);
    } else if (is_op(t, "(")) {
        adv(p);
        if (is_op(cur(p), ")")) {
            adv(p);
            if (!(n = tpp_node_new(TN_TUPLE, t))) return tpp_nomem(p);
        } else {
            tnode *first;
            ATLAS_TRY(tpp_parse_expr(p, &first));
            if (is_op(cur(p), ",")) {
                if (!(n = tpp_node_new(TN_TUPLE, t))) {
                    tpl_node_free(first);
                    return tpp_nomem(p);
                }
                atlas_status st = tpp_add_kid(p, n, first);
                if (st == ATLAS_OK) st = parse_seq(p, n, ")", false); /* starts at the ',' */
                if (st != ATLAS_OK) {
                    tpl_node_free(n);
                    return st;
                }
            } else {
                n = first;
                atlas_status st = tpp_expect_op(p, ")");
                if (st != ATLAS_OK) {
                    tpl_node_free(n);
                    return st;
                }
            }
        }
    } else if (is_op(t, "[") || is_op(t, "{")) {
        bool dict = is_op(t, "{");
        if (!(n = tpp_node_new(dict ? TN_DICT : TN_LIST, t))) return tpp_nomem(p);
        adv(p);
        atlas_status st = parse_seq(p, n, dict ? "}" : "]", dict);
        if (st != ATLAS_OK) {
            tpl_node_free(n);
            return st;
        }
    } else {
        return tpp_perr(p, t, "expected an expression");
    }
    *out = n;
    return ATLAS_OK;
}

/* x[...] : an index or a slice */
static atlas_status parse_subscript(parser *p, tnode *obj, tnode **out) {
    ttok *t = cur(p);
    adv(p); /* [ */
    tnode *parts[3] = {NULL, NULL, NULL};
    int nparts = 0;
    bool slice = false;
    atlas_status st = ATLAS_OK;
    for (;;) {
        if (!is_op(cur(p), ":") && !is_op(cur(p), "]")) {
            st = tpp_parse_expr(p, &parts[nparts]);
            if (st != ATLAS_OK) break;
        }
        if (is_op(cur(p), ":") && nparts < 2) {
            slice = true;
            nparts++;
            adv(p);
            continue;
        }
        st = tpp_expect_op(p, "]");
        break;
    }
    tnode *n = NULL;
    if (st == ATLAS_OK && !(n = tpp_node_new(slice ? TN_SLICE : TN_GETITEM, t))) st = tpp_nomem(p);
    if (st != ATLAS_OK) {
        for (int k = 0; k < 3; k++) tpl_node_free(parts[k]);
        tpl_node_free(obj);
        return st;
    }
    n->a = obj;
    if (slice) {
        n->kids = calloc(3, sizeof *n->kids);
        if (!n->kids) {
            for (int k = 0; k < 3; k++) tpl_node_free(parts[k]);
            tpl_node_free(n);
            return tpp_nomem(p);
        }
        n->nkids = 3;
        for (int k = 0; k < 3; k++) n->kids[k] = parts[k];
    } else {
        n->b = parts[0];
        if (!n->b) {
            tpl_node_free(n);
            return tpp_perr(p, t, "empty subscript");
        }
    }
    *out = n;
    return ATLAS_OK;
}

/* x is [not] name [(args) | arg]; takes n (freed on failure) */
static atlas_status parse_test(parser *p, tnode *n, tnode **out) {
    ttok *t = cur(p);
    adv(p); /* is */
    bool neg = false;
    if (is_name(cur(p), "not")) {
        neg = true;
        adv(p);
    }
    const char *tname = NULL;
    tnode *m = NULL;
    atlas_status st = tpp_expect_name(p, &tname);
    if (st == ATLAS_OK && (!(m = tpp_node_new(TN_TEST, t)) || !(m->str = strdup(tname)))) st = tpp_nomem(p);
    if (st != ATLAS_OK) {
        free(m);
        tpl_node_free(n);
        return st;
    }
    m->a = n;
    m->neg = neg;
    ttok *c = cur(p);
    if (is_op(c, "(")) {
        st = tpp_parse_args(p, m);
    } else if ((c->kind == TT_NAME || c->kind == TT_STRING || c->kind == TT_INT || c->kind == TT_FLOAT ||
                is_op(c, "[") || is_op(c, "{")) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        tnode *arg; /* jinja2: one argument without parentheses, `x is divisibleby 3` */
        st = parse_primary(p, &arg);
        if (st == ATLAS_OK) st = parse_postfix(p, arg, false, &arg);
        if (st == ATLAS_OK) st = tpp_add_kid(p, m, arg);
    }
    if (st != ATLAS_OK) {
        tpl_node_free(m);
        return st;
    }
    *out = m;
    return ATLAS_OK;
}

/* Postfix . [] () and, when with_filter, | filters, `is` tests and calls after them. */
static atlas_status parse_postfix(parser *p, tnode *n, bool with_filter, tnode **out) {
    for (int chain = 0;; chain++) {
        ttok *t = cur(p);
        tnode *m = NULL;
        atlas_status st = ATLAS_OK;
        if (chain > MAX_CHAIN) {
            tpl_node_free(n);
            return tpp_perr(p, t, "expression too long");
        }
        if (is_op(t, ".")) {
            adv(p);
            ttok *a = cur(p);
            if (a->kind == TT_NAME) {
                if (!(m = tpp_node_new(TN_GETATTR, t)) || !(m->str = strdup(a->text))) st = tpp_nomem(p);
                else m->a = n;
                adv(p);
            } else if (a->kind == TT_INT) {
                if (!(m = tpp_node_new(TN_GETITEM, t)) || !(m->b = tpp_node_new(TN_CONST, a))) st = tpp_nomem(p);
                else {
                    m->a = n;
                    m->b->val = tv_int(a->ival);
                }
                adv(p);
            } else {
                st = tpp_perr(p, a, "expected an attribute name after '.'");
            }
        } else if (is_op(t, "[")) {
            st = parse_subscript(p, n, &m);
            if (st != ATLAS_OK) return st; /* n already freed */
        } else if (is_op(t, "(")) {
            if (!(m = tpp_node_new(TN_CALL, t))) st = tpp_nomem(p);
            else {
                m->a = n;
                m->line = n->line; /* errors point at the callee, not the '(' */
                m->col = n->col;
                st = tpp_parse_args(p, m);
                if (st != ATLAS_OK) {
                    tpl_node_free(m);
                    return st;
                }
            }
        } else if (with_filter && is_op(t, "|")) {
            adv(p);
            const char *fname = NULL;
            st = tpp_expect_name(p, &fname);
            if (st == ATLAS_OK && (!(m = tpp_node_new(TN_FILTER, t)) || !(m->str = strdup(fname)))) st = tpp_nomem(p);
            if (st == ATLAS_OK) {
                m->a = n;
                if (is_op(cur(p), "(")) {
                    st = tpp_parse_args(p, m);
                    if (st != ATLAS_OK) {
                        tpl_node_free(m);
                        return st;
                    }
                }
            }
        } else if (with_filter && is_name(t, "is")) {
            st = parse_test(p, n, &m);
            if (st != ATLAS_OK) return st; /* n already freed */
        } else {
            *out = n;
            return ATLAS_OK;
        }
        if (st != ATLAS_OK) {
            if (m && m->a == n) {
                tpl_node_free(m);
            } else {
                tpl_node_free(n);
                tpl_node_free(m);
            }
            return st;
        }
        n = m;
    }
}

static atlas_status parse_unary(parser *p, bool with_filter, tnode **out) {
    ttok *t = cur(p);
    if (++p->depth > MAX_DEPTH) return tpp_perr(p, t, "expression nested too deeply");
    tnode *n = NULL;
    atlas_status st;
    if (is_op(t, "-") || is_op(t, "+")) {
        adv(p);
        tnode *arg;
        st = parse_unary(p, false, &arg);
        if (st != ATLAS_OK) {
            p->depth--;
            return st;
        }
        if (!(n = tpp_node_new(TN_UNARY, t))) {
            tpl_node_free(arg);
            p->depth--;
            return tpp_nomem(p);
        }
        n->op = t->text[0];
        n->a = arg;
    } else {
        st = parse_primary(p, &n);
        if (st != ATLAS_OK) {
            p->depth--;
            return st;
        }
    }
    st = parse_postfix(p, n, with_filter, out);
    p->depth--;
    return st;
}

typedef struct binop {
    const char *tok;
    int op;
} binop;

/* *left = kind(*left, right) at t, the right side parsed with status st: on st's failure, or
 * no memory, both sides are freed (*left NULL) and the error returned. */
static atlas_status join(parser *p, tnode_kind kind, const ttok *t, atlas_status st,
                         tnode **left, tnode *right) {
    tnode *n = st == ATLAS_OK ? tpp_node_new(kind, t) : NULL;
    if (st == ATLAS_OK && !n) {
        tpl_node_free(right);
        st = tpp_nomem(p);
    }
    if (st != ATLAS_OK) {
        tpl_node_free(*left);
        *left = NULL;
        return st;
    }
    n->a = *left;
    n->b = right;
    *left = n;
    return ATLAS_OK;
}

static atlas_status parse_level(parser *p, int level, tnode **out);

/* Left-associative binary levels: 1 + -, 2 ~, 3 * / // %, 4 ** (comparisons: parse_compare) */
static atlas_status parse_level(parser *p, int level, tnode **out) {
    static const binop ops[5][5] = {
        {{0, 0}},
        {{"+", TOP_ADD}, {"-", TOP_SUB}, {0, 0}},
        {{"~", TOP_CONCAT}, {0, 0}},
        {{"*", TOP_MUL}, {"/", TOP_DIV}, {"//", TOP_FLOORDIV}, {"%", TOP_MOD}, {0, 0}},
        {{"**", TOP_POW}, {0, 0}},
    };
    tnode *left;
    if (level == 5) return parse_unary(p, true, out);
    ATLAS_TRY(parse_level(p, level + 1, &left));
    for (int chain = 0;; chain++) {
        ttok *t = cur(p);
        int op = 0;
        if (chain > MAX_CHAIN) {
            tpl_node_free(left);
            return tpp_perr(p, t, "expression too long");
        }
        for (int k = 0; ops[level][k].tok; k++)
            if (is_op(t, ops[level][k].tok)) op = ops[level][k].op;
        if (!op) break;
        adv(p);
        tnode *right = NULL;
        atlas_status st = parse_level(p, level + 1, &right);
        ATLAS_TRY(join(p, TN_BINARY, t, st, &left, right));
        left->op = op;
    }
    *out = left;
    return ATLAS_OK;
}

/* Comparisons chain as in Python: a < b < c means a < b and b < c. */
static int compare_op(parser *p, size_t *skip) {
    static const binop ops[] = {{"==", TOP_EQ}, {"!=", TOP_NE}, {"<", TOP_LT}, {"<=", TOP_LE}, {">", TOP_GT}, {">=", TOP_GE}};
    ttok *t = cur(p);
    *skip = 1;
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++)
        if (is_op(t, ops[k].tok)) return ops[k].op;
    if (is_name(t, "in")) return TOP_IN;
    if (is_name(t, "not") && is_name(peek(p, 1), "in")) {
        *skip = 2;
        return TOP_NOTIN;
    }
    return 0;
}

static atlas_status parse_compare(parser *p, tnode **out) {
    tnode *first;
    size_t skip;
    ATLAS_TRY(parse_level(p, 1, &first));
    int op = compare_op(p, &skip);
    if (!op) {
        *out = first;
        return ATLAS_OK;
    }
    tnode *n = tpp_node_new(TN_COMPARE, cur(p));
    if (!n) {
        tpl_node_free(first);
        return tpp_nomem(p);
    }
    atlas_status st = tpp_add_kid(p, n, first);
    while (st == ATLAS_OK && op) {
        if (n->nkids > MAX_CHAIN) {
            st = tpp_perr(p, cur(p), "expression too long");
            break;
        }
        int *ops = realloc(n->ops, n->nkids * sizeof *ops);
        if (!ops) {
            st = tpp_nomem(p);
            break;
        }
        n->ops = ops;
        ops[n->nkids - 1] = op;
        for (size_t k = 0; k < skip; k++) adv(p);
        tnode *right;
        st = parse_level(p, 1, &right);
        if (st == ATLAS_OK) st = tpp_add_kid(p, n, right);
        if (st == ATLAS_OK) op = compare_op(p, &skip);
    }
    if (st != ATLAS_OK) {
        tpl_node_free(n);
        return st;
    }
    if (n->nkids == 2) { /* the common case: a plain binary node */
        n->kind = TN_BINARY;
        n->op = n->ops[0];
        n->a = n->kids[0];
        n->b = n->kids[1];
        free(n->kids);
        n->kids = NULL;
        n->nkids = 0;
    }
    *out = n;
    return ATLAS_OK;
}

static atlas_status parse_not(parser *p, tnode **out) {
    ttok *t = cur(p);
    if (is_name(t, "not")) {
        if (++p->depth > MAX_DEPTH) return tpp_perr(p, t, "expression nested too deeply");
        adv(p);
        tnode *a;
        atlas_status st = parse_not(p, &a);
        p->depth--;
        ATLAS_TRY(st);
        tnode *n = tpp_node_new(TN_UNARY, t);
        if (!n) {
            tpl_node_free(a);
            return tpp_nomem(p);
        }
        n->op = '!';
        n->a = a;
        *out = n;
        return ATLAS_OK;
    }
    return parse_compare(p, out);
}

static atlas_status parse_bool(parser *p, bool is_or, tnode **out) {
    tnode *left = NULL;
    ATLAS_TRY(is_or ? parse_bool(p, false, &left) : parse_not(p, &left));
    for (int chain = 0; is_name(cur(p), is_or ? "or" : "and"); chain++) {
        ttok *t = cur(p);
        if (chain > MAX_CHAIN) {
            tpl_node_free(left);
            return tpp_perr(p, t, "expression too long");
        }
        adv(p);
        tnode *right = NULL;
        atlas_status st = is_or ? parse_bool(p, false, &right) : parse_not(p, &right);
        ATLAS_TRY(join(p, is_or ? TN_OR : TN_AND, t, st, &left, right));
    }
    *out = left;
    return ATLAS_OK;
}

atlas_status tpp_parse_or(parser *p, tnode **out) { return parse_bool(p, true, out); }

atlas_status tpp_parse_expr(parser *p, tnode **out) {
    if (++p->depth > MAX_DEPTH) return tpp_perr(p, cur(p), "expression nested too deeply");
    tnode *n = NULL;
    atlas_status st = tpp_parse_or(p, &n);
    for (int chain = 0; st == ATLAS_OK && is_name(cur(p), "if"); chain++) {
        ttok *t = cur(p);
        if (chain > MAX_CHAIN) {
            st = tpp_perr(p, t, "expression too long");
            break;
        }
        adv(p);
        tnode *c = tpp_node_new(TN_COND, t);
        if (!c) {
            st = tpp_nomem(p);
            break;
        }
        c->b = n;
        n = c;
        st = tpp_parse_or(p, &c->a);
        if (st == ATLAS_OK && is_name(cur(p), "else")) {
            adv(p);
            st = tpp_parse_expr(p, &c->c);
        }
    }
    p->depth--;
    return tpp_node_done(n, st, out);
}

/* expr or a bare tuple "a, b" (for set and {{ }}) */
atlas_status tpp_parse_tuple_expr(parser *p, tnode **out) {
    ttok *t = cur(p);
    tnode *first;
    ATLAS_TRY(tpp_parse_expr(p, &first));
    if (!is_op(cur(p), ",")) {
        *out = first;
        return ATLAS_OK;
    }
    tnode *n = tpp_node_new(TN_TUPLE, t);
    if (!n) {
        tpl_node_free(first);
        return tpp_nomem(p);
    }
    atlas_status st = tpp_add_kid(p, n, first);
    while (st == ATLAS_OK && is_op(cur(p), ",")) {
        adv(p);
        if (cur(p)->kind == TT_VAR_END || cur(p)->kind == TT_BLOCK_END) break;
        tnode *v;
        st = tpp_parse_expr(p, &v);
        if (st == ATLAS_OK) st = tpp_add_kid(p, n, v);
    }
    return tpp_node_done(n, st, out);
}

void tpl_node_free(tnode *n) {
    if (!n) return;
    tpl_node_free(n->a);
    tpl_node_free(n->b);
    tpl_node_free(n->c);
    tpl_node_free(n->d);
    for (size_t i = 0; i < n->nkids; i++) tpl_node_free(n->kids[i]);
    free(n->kids);
    for (size_t i = 0; i < n->ntargets; i++) free(n->targets[i]);
    free(n->targets);
    for (size_t i = 0; i < n->nkw; i++) {
        free(n->kwnames[i]);
        tpl_node_free(n->kwvals[i]);
    }
    free(n->kwnames);
    free(n->kwvals);
    free(n->str);
    free(n->ops);
    if ((n->kind == TN_CONST || n->kind == TN_TEXT) && n->val.kind == TV_STR) free(n->val.u.s);
    free(n);
}

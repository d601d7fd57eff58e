/* chat/template_parser.h — the template parser's state and the helpers its two halves
 * share: template_expr.c (expressions: jinja2's grammar and precedence) and
 * template_parse.c (statements: if, for, set, macro, ... and tpl_parse).  Internal to them. */
#ifndef ATLAS_TOKENIZER_TEMPLATE_PARSER_H
#define ATLAS_TOKENIZER_TEMPLATE_PARSER_H

#include <stdbool.h>
#include <string.h>

#include "chat/template_internal.h"

/* Nesting depth, and the length of one chain (a + b + ..., x | f | g ..., a.b.c ...):
 * chains build left-deep trees that evaluation and freeing walk recursively. */
enum { MAX_DEPTH = 200, MAX_CHAIN = 1000 };

typedef struct parser {
    ttoks toks;
    size_t i;
    const char *name;
    int depth;
} parser;

static inline ttok *cur(parser *p) { return &p->toks.v[p->i]; }
static inline ttok *peek(parser *p, size_t k) {
    size_t j = p->i + k;
    return &p->toks.v[j < p->toks.n ? j : p->toks.n - 1];
}
static inline void adv(parser *p) {
    if (p->i + 1 < p->toks.n) p->i++;
}
static inline bool is_op(const ttok *t, const char *op) {
    return t->kind == TT_OP && !strcmp(t->text, op);
}
static inline bool is_name(const ttok *t, const char *nm) {
    return t->kind == TT_NAME && !strcmp(t->text, nm);
}

/* The helpers both halves use (template_expr.c): a syntax error at token t naming the
 * template, line and column; a node; handing a parsed node out or freeing it on failure;
 * out of memory; appending a child or a string; expecting an operator or a name; a call's
 * arguments; a string constant; an expression, an `or` chain, or a bare tuple "a, b". */
atlas_status tpp_perr(parser *p, const ttok *t, const char *what);
tnode *tpp_node_new(tnode_kind kind, const ttok *t);
atlas_status tpp_node_done(tnode *n, atlas_status st, tnode **out);
atlas_status tpp_nomem(parser *p);
atlas_status tpp_add_kid(parser *p, tnode *n, tnode *kid);
atlas_status tpp_add_str(parser *p, char ***arr, size_t *n, const char *s);
atlas_status tpp_expect_op(parser *p, const char *op);
atlas_status tpp_expect_name(parser *p, const char **out);
atlas_status tpp_parse_args(parser *p, tnode *n);
atlas_status tpp_make_const_str(parser *p, const ttok *t, const char *s, size_t len, tnode **out);
atlas_status tpp_parse_expr(parser *p, tnode **out);
atlas_status tpp_parse_or(parser *p, tnode **out);
atlas_status tpp_parse_tuple_expr(parser *p, tnode **out);

#endif

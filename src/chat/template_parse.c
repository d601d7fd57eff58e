/* chat/template_parse.c — a template's statements ({% if %}, {% for %}, {% set %},
 * {% macro %}, {% call %}, {% with %}, {% filter %}, ...) around its expressions
 * (template_expr.c), and tpl_parse. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/template_parser.h"
#include "core/error.h"

/* ---- statements ---------------------------------------------------------------------- */
static atlas_status parse_body(parser *p, const char *const *ends, tnode **out);

static atlas_status expect_block_end(parser *p) {
    if (cur(p)->kind != TT_BLOCK_END) return tpp_perr(p, cur(p), "expected '%}'");
    adv(p);
    return ATLAS_OK;
}

/* after a body stopped at `{% endX`: consume the name and '%}' */
static atlas_status end_tag(parser *p) {
    adv(p);
    return expect_block_end(p);
}

static atlas_status parse_if(parser *p, const ttok *t, tnode **out) {
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    static const char *const endif[] = {"endif", NULL};
    tnode *n = tpp_node_new(TN_IF, t);
    if (!n) return tpp_nomem(p);
    atlas_status st = tpp_parse_tuple_expr(p, &n->a);
    if (st == ATLAS_OK) st = expect_block_end(p);
    if (st == ATLAS_OK) st = parse_body(p, ends, &n->b);
    if (st == ATLAS_OK) {
        ttok *e = cur(p);
        if (is_name(e, "elif")) {
            adv(p);
            st = parse_if(p, e, &n->c);
            if (st != ATLAS_OK) {
                tpl_node_free(n);
                return st;
            }
            *out = n;
            return ATLAS_OK; /* the elif chain consumed endif */
        }
        if (is_name(e, "else")) {
            adv(p);
            st = expect_block_end(p);
            if (st == ATLAS_OK) st = parse_body(p, endif, &n->c);
        }
        if (st == ATLAS_OK) st = end_tag(p);
    }
    return tpp_node_done(n, st, out);
}

static atlas_status parse_for(parser *p, const ttok *t, tnode **out) {
    static const char *const ends[] = {"else", "endfor", NULL};
    static const char *const endfor[] = {"endfor", NULL};
    tnode *n = tpp_node_new(TN_FOR, t);
    if (!n) return tpp_nomem(p);
    atlas_status st = ATLAS_OK;
    bool paren = is_op(cur(p), "(");
    if (paren) adv(p);
    do {
        if (n->ntargets) adv(p); /* , */
        const char *nm = NULL;
        st = tpp_expect_name(p, &nm);
        if (st == ATLAS_OK) st = tpp_add_str(p, &n->targets, &n->ntargets, nm);
    } while (st == ATLAS_OK && is_op(cur(p), ","));
    if (st == ATLAS_OK && paren) st = tpp_expect_op(p, ")");
    if (st == ATLAS_OK && !is_name(cur(p), "in")) st = tpp_perr(p, cur(p), "expected 'in'");
    if (st == ATLAS_OK) {
        adv(p);
        st = tpp_parse_or(p, &n->a);
    }
    if (st == ATLAS_OK && is_name(cur(p), "if")) {
        adv(p);
        st = tpp_parse_or(p, &n->d);
    }
    if (st == ATLAS_OK && is_name(cur(p), "recursive")) st = tpp_perr(p, cur(p), "recursive loops are not supported");
    if (st == ATLAS_OK) st = expect_block_end(p);
    if (st == ATLAS_OK) st = parse_body(p, ends, &n->b);
    if (st == ATLAS_OK && is_name(cur(p), "else")) {
        adv(p);
        st = expect_block_end(p);
        if (st == ATLAS_OK) st = parse_body(p, endfor, &n->c);
    }
    if (st == ATLAS_OK) st = end_tag(p);
    return tpp_node_done(n, st, out);
}

/* filters after {% set x | f %} or {% filter f %}: TN_FILTER nodes with a = NULL */
static atlas_status parse_filter_chain(parser *p, tnode *n, bool need_pipe) {
    bool first = true;
    while (is_op(cur(p), "|") || (first && !need_pipe)) {
        if (is_op(cur(p), "|")) adv(p);
        first = false;
        ttok *t = cur(p);
        const char *fname = NULL;
        ATLAS_TRY(tpp_expect_name(p, &fname));
        tnode *f = tpp_node_new(TN_FILTER, t);
        if (!f || !(f->str = strdup(fname))) {
            free(f);
            return tpp_nomem(p);
        }
        ATLAS_TRY(tpp_add_kid(p, n, f));
        if (is_op(cur(p), "(")) ATLAS_TRY(tpp_parse_args(p, f));
    }
    return ATLAS_OK;
}

static atlas_status parse_set(parser *p, const ttok *t, tnode **out) {
    static const char *const endset[] = {"endset", NULL};
    tnode *n = tpp_node_new(TN_SET, t);
    if (!n) return tpp_nomem(p);
    atlas_status st;
    do {
        if (n->ntargets) adv(p);
        const char *nm = NULL;
        st = tpp_expect_name(p, &nm);
        if (st == ATLAS_OK) st = tpp_add_str(p, &n->targets, &n->ntargets, nm);
        if (st == ATLAS_OK && is_op(cur(p), ".") && n->ntargets == 1) {
            adv(p);
            st = tpp_expect_name(p, &nm);
            if (st == ATLAS_OK && !(n->str = strdup(nm))) st = tpp_nomem(p);
            break;
        }
    } while (st == ATLAS_OK && is_op(cur(p), ","));
    if (st == ATLAS_OK && is_op(cur(p), "=")) {
        adv(p);
        st = tpp_parse_tuple_expr(p, &n->a);
        if (st == ATLAS_OK) st = expect_block_end(p);
    } else if (st == ATLAS_OK) {
        if (n->ntargets != 1 || n->str) st = tpp_perr(p, cur(p), "expected '='");
        n->kind = TN_SETBLOCK;
        if (st == ATLAS_OK) st = parse_filter_chain(p, n, true);
        if (st == ATLAS_OK) st = expect_block_end(p);
        if (st == ATLAS_OK) st = parse_body(p, endset, &n->b);
        if (st == ATLAS_OK) st = end_tag(p);
    }
    return tpp_node_done(n, st, out);
}

/* (a, b=default, ...) for macro and call blocks */
static atlas_status parse_params(parser *p, tnode *n) {
    ATLAS_TRY(tpp_expect_op(p, "("));
    while (!is_op(cur(p), ")")) {
        if (n->ntargets) ATLAS_TRY(tpp_expect_op(p, ","));
        const char *nm = NULL;
        ATLAS_TRY(tpp_expect_name(p, &nm));
        ATLAS_TRY(tpp_add_str(p, &n->targets, &n->ntargets, nm));
        tnode *def = NULL;
        if (is_op(cur(p), "=")) {
            adv(p);
            ATLAS_TRY(tpp_parse_expr(p, &def));
        }
        tnode **k = realloc(n->kids, (n->nkids + 1) * sizeof *k);
        if (!k) {
            tpl_node_free(def);
            return tpp_nomem(p);
        }
        n->kids = k;
        n->kids[n->nkids++] = def;
    }
    adv(p);
    return ATLAS_OK;
}

static atlas_status parse_macro(parser *p, const ttok *t, bool call, tnode **out) {
    static const char *const endmacro[] = {"endmacro", NULL};
    static const char *const endcall[] = {"endcall", NULL};
    tnode *n = tpp_node_new(call ? TN_CALLBLOCK : TN_MACRO, t);
    if (!n) return tpp_nomem(p);
    atlas_status st = ATLAS_OK;
    if (call) {
        if (is_op(cur(p), "(")) st = parse_params(p, n);
        if (st == ATLAS_OK) st = tpp_parse_expr(p, &n->a);
        if (st == ATLAS_OK && n->a->kind != TN_CALL) st = tpp_perr(p, t, "{% call %} needs a macro call");
    } else {
        const char *nm = NULL;
        st = tpp_expect_name(p, &nm);
        if (st == ATLAS_OK && !(n->str = strdup(nm))) st = tpp_nomem(p);
        if (st == ATLAS_OK) st = parse_params(p, n);
    }
    if (st == ATLAS_OK) st = expect_block_end(p);
    if (st == ATLAS_OK) st = parse_body(p, call ? endcall : endmacro, &n->b);
    if (st == ATLAS_OK) st = end_tag(p);
    return tpp_node_done(n, st, out);
}

/* {% with a = 1, b = x %} ... {% endwith %} */
static atlas_status parse_with(parser *p, const ttok *t, tnode **out) {
    static const char *const endwith[] = {"endwith", NULL};
    tnode *n = tpp_node_new(TN_WITH, t);
    if (!n) return tpp_nomem(p);
    atlas_status st = ATLAS_OK;
    while (st == ATLAS_OK && cur(p)->kind != TT_BLOCK_END) {
        if (n->nkw) st = tpp_expect_op(p, ",");
        const char *nm = NULL;
        tnode *v = NULL;
        if (st == ATLAS_OK) st = tpp_expect_name(p, &nm);
        if (st == ATLAS_OK) st = tpp_expect_op(p, "=");
        if (st == ATLAS_OK) st = tpp_parse_expr(p, &v);
        if (st != ATLAS_OK) break;
        tnode **vals = realloc(n->kwvals, (n->nkw + 1) * sizeof *vals);
        char **names = vals ? realloc(n->kwnames, (n->nkw + 1) * sizeof *names) : NULL;
        if (vals) n->kwvals = vals;
        if (names) n->kwnames = names;
        if (!vals || !names || !(names[n->nkw] = strdup(nm))) {
            tpl_node_free(v);
            st = tpp_nomem(p);
            break;
        }
        vals[n->nkw++] = v;
    }
    if (st == ATLAS_OK) st = expect_block_end(p);
    if (st == ATLAS_OK) st = parse_body(p, endwith, &n->b);
    if (st == ATLAS_OK) st = end_tag(p);
    return tpp_node_done(n, st, out);
}

static atlas_status parse_statement(parser *p, tnode **out) {
    static const char *const endfilter[] = {"endfilter", NULL};
    static const char *const endgen[] = {"endgeneration", NULL};
    ttok *t = cur(p);
    if (t->kind != TT_NAME) return tpp_perr(p, t, "expected a tag name");
    adv(p);
    if (!strcmp(t->text, "if")) return parse_if(p, t, out);
    if (!strcmp(t->text, "for")) return parse_for(p, t, out);
    if (!strcmp(t->text, "set")) return parse_set(p, t, out);
    if (!strcmp(t->text, "macro")) return parse_macro(p, t, false, out);
    if (!strcmp(t->text, "call")) return parse_macro(p, t, true, out);
    if (!strcmp(t->text, "break") || !strcmp(t->text, "continue")) {
        ATLAS_TRY(expect_block_end(p));
        if (!(*out = tpp_node_new(t->text[0] == 'b' ? TN_BREAK : TN_CONTINUE, t))) return tpp_nomem(p);
        return ATLAS_OK;
    }
    if (!strcmp(t->text, "generation")) { /* transformers' AssistantTracker: just the body */
        ATLAS_TRY(expect_block_end(p));
        ATLAS_TRY(parse_body(p, endgen, out));
        atlas_status st = end_tag(p);
        if (st != ATLAS_OK) {
            tpl_node_free(*out);
            *out = NULL;
        }
        return st;
    }
    if (!strcmp(t->text, "with")) return parse_with(p, t, out);
    if (!strcmp(t->text, "filter")) {
        tnode *n = tpp_node_new(TN_FILTERBLOCK, t);
        if (!n) return tpp_nomem(p);
        atlas_status st = parse_filter_chain(p, n, false);
        if (st == ATLAS_OK) st = expect_block_end(p);
        if (st == ATLAS_OK) st = parse_body(p, endfilter, &n->b);
        if (st == ATLAS_OK) st = end_tag(p);
        if (st != ATLAS_OK) {
            tpl_node_free(n);
            return st;
        }
        *out = n;
        return ATLAS_OK;
    }
    char msg[96];
    snprintf(msg, sizeof msg, "unknown or unsupported tag '%.40s'", t->text);
    return tpp_perr(p, t, msg);
}

/* Statements until `{% <one of ends>` (left at that name) or, when ends is NULL, EOF. */
static atlas_status parse_body(parser *p, const char *const *ends, tnode **out) {
    ttok *t0 = cur(p);
    if (++p->depth > MAX_DEPTH) return tpp_perr(p, t0, "blocks nested too deeply");
    tnode *body = tpp_node_new(TN_BODY, t0);
    if (!body) return tpp_nomem(p);
    atlas_status st = ATLAS_OK;
    for (;;) {
        ttok *t = cur(p);
        tnode *n = NULL;
        if (t->kind == TT_EOF) {
            if (ends) {
                char msg[96];
                snprintf(msg, sizeof msg, "unexpected end of template: missing '{%% %s %%}'", ends[0]);
                if (!strcmp(ends[0], "elif")) snprintf(msg, sizeof msg, "unexpected end of template: missing '{%% endif %%}'");
                if (!strcmp(ends[0], "else")) snprintf(msg, sizeof msg, "unexpected end of template: missing '{%% endfor %%}'");
                st = tpp_perr(p, t, msg);
            }
            break;
        } else if (t->kind == TT_TEXT) {
            st = tpp_make_const_str(p, t, t->text, t->len, &n);
            if (st == ATLAS_OK) n->kind = TN_TEXT;
            adv(p);
        } else if (t->kind == TT_VAR_BEGIN) {
            adv(p);
            if (!(n = tpp_node_new(TN_OUTPUT, t))) st = tpp_nomem(p);
            if (st == ATLAS_OK) st = tpp_parse_tuple_expr(p, &n->a);
            if (st == ATLAS_OK && cur(p)->kind != TT_VAR_END) st = tpp_perr(p, cur(p), "expected '}}'");
            adv(p);
        } else if (t->kind == TT_BLOCK_BEGIN) {
            ttok *nm = peek(p, 1);
            bool is_end = false;
            for (size_t k = 0; ends && ends[k]; k++)
                if (is_name(nm, ends[k])) is_end = true;
            if (is_end) {
                adv(p);
                break;
            }
            adv(p);
            st = parse_statement(p, &n);
        } else {
            st = tpp_perr(p, t, "unexpected token");
        }
        if (st == ATLAS_OK) st = tpp_add_kid(p, body, n);
        else tpl_node_free(n);
        if (st != ATLAS_OK) break;
    }
    p->depth--;
    if (st != ATLAS_OK) {
        tpl_node_free(body);
        return st;
    }
    *out = body;
    return ATLAS_OK;
}

atlas_status tpl_parse(const char *src, const char *name, tnode **out) {
    parser p = {.name = name};
    *out = NULL;
    ATLAS_TRY(tpl_lex(src, name, &p.toks));
    tnode *body = NULL;
    atlas_status st = parse_body(&p, NULL, &body);
    if (st == ATLAS_OK && cur(&p)->kind != TT_EOF) {
        tpl_node_free(body);
        st = tpp_perr(&p, cur(&p), "unexpected tag here (no open block to end)");
    }
    /* an end tag with no open block stops parse_body(NULL) only at EOF, so check strays */
    tpl_toks_free(&p.toks);
    if (st == ATLAS_OK) *out = body;
    return st;
}

/* engine/constraint_program.c — building constraint programs (atlas/constraint.h): segments
 * appended one by one, alternatives laid out flat after the segment that chooses among them
 * (constraint_internal.h), and the checks that keep matching deterministic. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "engine/constraint_internal.h"

static void seg_clear(seg *s) {
    free(s->lit);
    for (int i = 0; i < s->n_opt; i++) free(s->opt[i]);
    free(s->opt);
    free(s->opt_len);
    free(s->target);
    memset(s, 0, sizeof *s);
}

/* A deep copy of src whose segment indices (targets, jumps) are moved by off. */
static atlas_status seg_dup(const seg *src, int off, seg *dst) {
    *dst = *src;
    dst->lit = NULL, dst->opt = NULL, dst->opt_len = NULL, dst->target = NULL;
    dst->n_opt = 0;
    if (src->kind == SEG_JUMP) dst->jump = src->jump + off;
    if (src->lit && !(dst->lit = malloc(src->len ? src->len : 1))) goto nomem;
    if (src->lit) memcpy(dst->lit, src->lit, src->len);
    if (src->n_opt) {
        dst->opt = calloc((size_t)src->n_opt, sizeof *dst->opt);
        dst->opt_len = malloc((size_t)src->n_opt * sizeof *dst->opt_len);
        if (!dst->opt || !dst->opt_len) goto nomem;
        memcpy(dst->opt_len, src->opt_len, (size_t)src->n_opt * sizeof *dst->opt_len);
        for (; dst->n_opt < src->n_opt; dst->n_opt++)
            if (!(dst->opt[dst->n_opt] = strdup(src->opt[dst->n_opt]))) goto nomem;
    }
    if (src->target) {
        if (!(dst->target = malloc((size_t)src->n_opt * sizeof *dst->target))) goto nomem;
        for (int i = 0; i < src->n_opt; i++) dst->target[i] = src->target[i] + off;
    }
    return ATLAS_OK;
nomem:
    seg_clear(dst);
    return atlas_fail(ATLAS_ERR_NOMEM, "constraint: out of memory");
}

atlas_status atlas_constraint_new(atlas_constraint **out) {
    *out = calloc(1, sizeof **out);
    if (!*out) return atlas_fail(ATLAS_ERR_NOMEM, "constraint: out of memory");
    return ATLAS_OK;
}

void atlas_constraint_free(atlas_constraint *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) seg_clear(&c->segs[i]);
    free(c->segs);
    free(c);
}

int atlas_constraint_n_segments(const atlas_constraint *c) { return c->n; }

/* The bytes next may start with into set; 0 when it may start with any. */
static int first_bytes(const seg *next, uint8_t set[32]) {
    memset(set, 0, 32);
    if (!next) return 0;
    if (next->kind == SEG_LITERAL) {
        unsigned b = (unsigned char)next->lit[0];
        set[b >> 3] |= (uint8_t)(1u << (b & 7));
        return 1;
    }
    if (next->kind != SEG_SWITCH) return 0;
    for (int i = 0; i < next->n_opt; i++) {
        unsigned b = (unsigned char)next->opt[i][0];
        set[b >> 3] |= (uint8_t)(1u << (b & 7));
    }
    return 1;
}

/* What may follow the last segment (next: the segment to add, NULL at the end): a CHOICE
 * whose options are prefixes of one another needs literals whose first byte no longer
 * option could take there, and a value that may be a number literals whose first byte
 * cannot continue a number (see the header). */
static atlas_status check_after(const atlas_constraint *c, const seg *next) {
    if (c->n == 0) return ATLAS_OK;
    const seg *prev = &c->segs[c->n - 1];
    uint8_t first[32];
    int known = first_bytes(next, first);
    int clash = 0;
    if (prev->kind == SEG_CHOICE && prev->has_prefix) {
        for (int i = 0; i < 32; i++) clash |= first[i] & prev->cont[i];
        if (!known || clash)
            return atlas_fail(ATLAS_ERR_INVALID, "constraint: segment %d: a choice whose "
                              "options are prefixes of one another must be followed by a "
                              "literal that tells them apart", c->n - 1);
    }
    int numeric = prev->jkind == ATLAS_CONSTRAINT_JSON_ANY ||
                  prev->jkind == ATLAS_CONSTRAINT_JSON_NUMBER ||
                  prev->jkind == ATLAS_CONSTRAINT_JSON_INTEGER;
    if (prev->kind == SEG_JSON && numeric) {
        for (const char *p = "0123456789.eE+-"; *p; p++) clash |= constraint_bit(first, *p);
        if (!known || clash)
            return atlas_fail(ATLAS_ERR_INVALID, "constraint: segment %d: a value that may be "
                              "a number must be followed by a literal that cannot continue "
                              "it", c->n - 1);
    }
    return ATLAS_OK;
}

atlas_status constraint_check_end(const atlas_constraint *c) { return check_after(c, NULL); }

static atlas_status check_open(const atlas_constraint *c) {
    if (c->closed)
        return atlas_fail(ATLAS_ERR_INVALID, "constraint: nothing may follow free text (it "
                          "goes on until the sequence ends)");
    return ATLAS_OK;
}

/* Appends *s (taking its memory on success; clearing it on failure). */
static atlas_status push_seg(atlas_constraint *c, seg *s) {
    atlas_status st = check_open(c);
    if (st == ATLAS_OK && c->n >= ATLAS_CONSTRAINT_MAX_SEGMENTS)
        st = atlas_fail(ATLAS_ERR_RANGE, "constraint: more than %d segments",
                        ATLAS_CONSTRAINT_MAX_SEGMENTS);
    if (st == ATLAS_OK) st = check_after(c, s);
    const seg *prev = c->n ? &c->segs[c->n - 1] : NULL;
    if (s->kind == SEG_JSON && prev && prev->kind == SEG_LITERAL &&
        prev->lit[prev->len - 1] && strchr(" \t\n", prev->lit[prev->len - 1]))
        s->tight = 1; /* ": " then a value: no more space before it */
    seg *segs = st == ATLAS_OK ? realloc(c->segs, (size_t)(c->n + 1) * sizeof *segs) : NULL;
    if (st == ATLAS_OK && !segs) st = atlas_fail(ATLAS_ERR_NOMEM, "constraint: out of memory");
    if (st != ATLAS_OK) {
        seg_clear(s);
        return st;
    }
    c->segs = segs;
    c->segs[c->n++] = *s;
    return ATLAS_OK;
}

atlas_status atlas_constraint_add_literal(atlas_constraint *c, const char *text, size_t len) {
    if (len == 0) return ATLAS_OK;
    ATLAS_TRY(check_open(c));
    seg *last = c->n > 0 ? &c->segs[c->n - 1] : NULL;
    size_t have = last && last->kind == SEG_LITERAL ? last->len : 0;
    if (len > ATLAS_CONSTRAINT_MAX_BYTES - have)
        return atlas_fail(ATLAS_ERR_RANGE, "constraint: a literal of %zu bytes (at most %d)",
                          have + len, ATLAS_CONSTRAINT_MAX_BYTES);
    if (have) { /* merged into the literal before: nothing new to check */
        char *lit = realloc(last->lit, have + len);
        if (!lit) return atlas_fail(ATLAS_ERR_NOMEM, "constraint: out of memory");
        memcpy(lit + have, text, len);
        last->lit = lit;
        last->len = have + len;
        return ATLAS_OK;
    }
    seg s = {.kind = SEG_LITERAL, .len = len, .lit = malloc(len)};
    if (!s.lit) return atlas_fail(ATLAS_ERR_NOMEM, "constraint: out of memory");
    memcpy(s.lit, text, len);
    return push_seg(c, &s);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorts and dedups the options, then finds which are prefixes of others. */
static void choice_index(seg *s) {
    qsort(s->opt, (size_t)s->n_opt, sizeof *s->opt, cmp_str);
    int n = 0;
    for (int i = 0; i < s->n_opt; i++) {
        if (n > 0 && !strcmp(s->opt[n - 1], s->opt[i])) {
            free(s->opt[i]);
            continue;
        }
        s->opt[n++] = s->opt[i];
    }
    s->n_opt = n;
    for (int i = 0; i < n; i++) s->opt_len[i] = strlen(s->opt[i]);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < j; i++) /* a prefix sorts before what it prefixes */
            if (s->opt_len[i] < s->opt_len[j] && !memcmp(s->opt[i], s->opt[j], s->opt_len[i])) {
                unsigned b = (unsigned char)s->opt[j][s->opt_len[i]];
                s->has_prefix = 1;
                s->cont[b >> 3] |= (uint8_t)(1u << (b & 7));
            }
}

atlas_status atlas_constraint_add_choice(atlas_constraint *c, const char *const *options, int n) {
    if (n < 1 || n > ATLAS_CONSTRAINT_MAX_OPTIONS || !options)
        return atlas_fail(ATLAS_ERR_RANGE, "constraint: a choice of %d strings (1 to %d)", n,
                          ATLAS_CONSTRAINT_MAX_OPTIONS);
    for (int i = 0; i < n; i++)
        if (!options[i] || strlen(options[i]) > ATLAS_CONSTRAINT_MAX_BYTES)
            return atlas_fail(ATLAS_ERR_RANGE, "constraint: choice option %d is NULL or longer "
                              "than %d bytes", i, ATLAS_CONSTRAINT_MAX_BYTES);
    seg s = {.kind = SEG_CHOICE};
    s.opt = calloc((size_t)n, sizeof *s.opt);
    s.opt_len = calloc((size_t)n, sizeof *s.opt_len);
    if (!s.opt || !s.opt_len) {
        seg_clear(&s);
        return atlas_fail(ATLAS_ERR_NOMEM, "constraint: out of memory");
    }
    for (; s.n_opt < n; s.n_opt++)
        if (!(s.opt[s.n_opt] = strdup(options[s.n_opt]))) {
            seg_clear(&s);
            return atlas_fail(ATLAS_ERR_NOMEM, "constraint: out of memory");
        }
    choice_index(&s);
    return push_seg(c, &s);
}

atlas_status atlas_constraint_add_json_value(atlas_constraint *c, int kind) {
    int base = kind & ~ATLAS_CONSTRAINT_JSON_NULLABLE;
    if (base < 0 || base > ATLAS_CONSTRAINT_JSON_ARRAY_OF_BOOLEAN)
        return atlas_fail(ATLAS_ERR_RANGE, "constraint: JSON value kind %d", kind);
    seg s = {.kind = SEG_JSON, .jkind = (atlas_constraint_json_kind)base,
             .nullable = (kind & ATLAS_CONSTRAINT_JSON_NULLABLE) != 0};
    return push_seg(c, &s);
}

atlas_status atlas_constraint_add_json_object(atlas_constraint *c) {
    return atlas_constraint_add_json_value(c, ATLAS_CONSTRAINT_JSON_OBJECT);
}

atlas_status atlas_constraint_copy(const atlas_constraint *c, atlas_constraint **out) {
    *out = NULL;
    atlas_constraint *d;
    ATLAS_TRY(atlas_constraint_new(&d));
    atlas_status st = ATLAS_OK;
    if (c->n && !(d->segs = calloc((size_t)c->n, sizeof *d->segs)))
        st = atlas_fail(ATLAS_ERR_NOMEM, "constraint: out of memory");
    for (int i = 0; st == ATLAS_OK && i < c->n; i++, d->n++)
        st = seg_dup(&c->segs[i], 0, &d->segs[i]);
    d->closed = c->closed;
    if (st != ATLAS_OK) {
        atlas_constraint_free(d);
        return st;
    }
    *out = d;
    return ATLAS_OK;
}

/* ---- alternatives ----------------------------------------------------------------------- */

typedef struct key {
    const char *p;
    size_t len;
    int alt;
} key;

static int cmp_keys(const void *a, const void *b) {
    const key *x = a, *y = b;
    int r = memcmp(x->p, y->p, x->len < y->len ? x->len : y->len);
    if (r) return r;
    return x->len < y->len ? -1 : x->len > y->len;
}

/* Each key is a non-empty string and the keys, sorted, are prefix-free; each program has no
 * free text and ends where its last byte says so. */
static atlas_status check_alternatives(const char *const *keys_in,
                                       const atlas_constraint *const *rest, int n, key *keys,
                                       size_t *total) {
    *total = 1;
    for (int i = 0; i < n; i++) {
        const atlas_constraint *a = rest ? rest[i] : NULL;
        size_t len = keys_in[i] ? strlen(keys_in[i]) : 0;
        if (len == 0 || len > ATLAS_CONSTRAINT_MAX_BYTES)
            return atlas_fail(ATLAS_ERR_INVALID, "constraint: key %d is NULL, empty or longer "
                              "than %d bytes", i, ATLAS_CONSTRAINT_MAX_BYTES);
        if (a && a->closed)
            return atlas_fail(ATLAS_ERR_INVALID, "constraint: alternative %d has free text", i);
        atlas_status st = a ? check_after(a, NULL) : ATLAS_OK;
        if (st != ATLAS_OK) return atlas_fail_wrap(st, "constraint: alternative %d", i);
        keys[i] = (key){keys_in[i], len, i};
        *total += (size_t)(a ? a->n : 0) + 1;
    }
    qsort(keys, (size_t)n, sizeof *keys, cmp_keys);
    for (int k = 0; k + 1 < n; k++) /* a prefix sorts just before what it prefixes */
        if (keys[k].len <= keys[k + 1].len && !memcmp(keys[k].p, keys[k + 1].p, keys[k].len))
            return atlas_fail(ATLAS_ERR_INVALID, "constraint: keys %d and %d: one begins the "
                              "other", keys[k].alt, keys[k + 1].alt);
    return ATLAS_OK;
}

/* The choosing segment: the sorted keys (targets are set while laying out). */
static atlas_status key_segment(seg_kind kind, const key *keys, int n, seg *s) {
    *s = (seg){.kind = kind};
    s->opt = calloc((size_t)n, sizeof *s->opt);
    s->opt_len = calloc((size_t)n, sizeof *s->opt_len);
    s->target = calloc((size_t)n, sizeof *s->target);
    if (!s->opt || !s->opt_len || !s->target) goto nomem;
    for (; s->n_opt < n; s->n_opt++) {
        const key *k = &keys[s->n_opt];
        if (!(s->opt[s->n_opt] = strndup(k->p, k->len))) goto nomem;
        s->opt_len[s->n_opt] = k->len;
        unsigned b = (unsigned char)k->p[0];
        s->cont[b >> 3] |= (uint8_t)(1u << (b & 7));
    }
    return ATLAS_OK;
nomem:
    seg_clear(s);
    return atlas_fail(ATLAS_ERR_NOMEM, "constraint: out of memory");
}

/* Lays out each alternative's segments after its key, then a JUMP: to after them all
 * (SWITCH) or back to the free text (FREE).  c->segs has room for them. */
static atlas_status lay_out(atlas_constraint *c, seg_kind kind, int at,
                            const atlas_constraint *const *rest, const key *keys, int n) {
    int *jumps = malloc((size_t)n * sizeof *jumps);
    if (!jumps) return atlas_fail(ATLAS_ERR_NOMEM, "constraint: out of memory");
    atlas_status st = ATLAS_OK;
    for (int k = 0; st == ATLAS_OK && k < n; k++) {
        const atlas_constraint *a = rest ? rest[keys[k].alt] : NULL;
        int base = c->n;
        c->segs[at].target[k] = base;
        for (int j = 0; st == ATLAS_OK && a && j < a->n; j++) {
            st = seg_dup(&a->segs[j], base, &c->segs[c->n]);
            if (st == ATLAS_OK) c->n++;
        }
        if (st != ATLAS_OK) break;
        jumps[k] = c->n;
        c->segs[c->n++] = (seg){.kind = SEG_JUMP, .jump = at};
    }
    for (int k = 0; st == ATLAS_OK && kind == SEG_SWITCH && k < n; k++)
        c->segs[jumps[k]].jump = c->n;
    free(jumps);
    return st;
}

static atlas_status add_branches(atlas_constraint *c, seg_kind kind, const char *const *keys_in,
                                 const atlas_constraint *const *rest, int n) {
    ATLAS_TRY(check_open(c));
    if (n < 1 || n > ATLAS_CONSTRAINT_MAX_OPTIONS || !keys_in)
        return atlas_fail(ATLAS_ERR_RANGE, "constraint: %d alternatives (1 to %d)", n,
                          ATLAS_CONSTRAINT_MAX_OPTIONS);
    key *keys = malloc((size_t)n * sizeof *keys);
    if (!keys) return atlas_fail(ATLAS_ERR_NOMEM, "constraint: out of memory");
    size_t total = 0;
    seg s = {0};
    atlas_status st = check_alternatives(keys_in, rest, n, keys, &total);
    if (st == ATLAS_OK && (size_t)c->n + total > ATLAS_CONSTRAINT_MAX_SEGMENTS)
        st = atlas_fail(ATLAS_ERR_RANGE, "constraint: more than %d segments",
                        ATLAS_CONSTRAINT_MAX_SEGMENTS);
    if (st == ATLAS_OK) st = key_segment(kind, keys, n, &s);
    if (st == ATLAS_OK && (st = check_after(c, &s)) != ATLAS_OK) seg_clear(&s);
    seg *segs = st == ATLAS_OK ? realloc(c->segs, ((size_t)c->n + total) * sizeof *segs) : NULL;
    if (st == ATLAS_OK && !segs) {
        seg_clear(&s);
        st = atlas_fail(ATLAS_ERR_NOMEM, "constraint: out of memory");
    }
    if (st == ATLAS_OK) {
        int at = c->n;
        c->segs = segs;
        c->segs[c->n++] = s;
        st = lay_out(c, kind, at, rest, keys, n);
        if (st != ATLAS_OK) { /* as it was */
            while (c->n > at) seg_clear(&c->segs[--c->n]);
        } else if (kind == SEG_FREE) {
            c->closed = 1;
        }
    }
    free(keys);
    return st;
}

atlas_status atlas_constraint_add_alternatives(atlas_constraint *c, const char *const *keys,
                                               const atlas_constraint *const *rest, int n) {
    return add_branches(c, SEG_SWITCH, keys, rest, n);
}

atlas_status atlas_constraint_add_free_text(atlas_constraint *c, const char *const *triggers,
                                            const atlas_constraint *const *rest, int n) {
    return add_branches(c, SEG_FREE, triggers, rest, n);
}

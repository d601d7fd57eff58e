/* engine/constraint.c — sorted token vocabularies and the matcher (atlas/constraint.h);
 * programs are built by constraint_program.c.
 *
 * The matcher is a byte automaton: one small state struct (which segment, where in it, and
 * for JSON the grammar state, a bit stack of open containers and a few counters), advanced
 * one byte at a time by step().  Masking walks the vocabulary in byte order: consecutive
 * tokens share a prefix (lcp), the states after each prefix byte are kept on a stack, so a
 * token only walks the bytes it does not share with the one before; a token whose shared
 * prefix was already refused is skipped in O(1). */
#include "atlas/constraint.h"

#include <stdlib.h>
#include <string.h>

#include "atlas/tokenizer.h"
#include "core/error.h"
#include "engine/constraint_internal.h"

/* ---- vocabularies ----------------------------------------------------------------------- */

struct atlas_constraint_vocab {
    int n;              /* ids 0 .. n */
    char *blob;         /* every token's bytes */
    size_t *off;        /* [n + 1]: id i is blob[off[i] .. off[i + 1]) */
    /* the ids with bytes, sorted by them, their bytes copied in that order too, so that a
     * mask reads memory front to back */
    struct sorted_tok {
        uint32_t off, len; /* in sblob */
        uint32_t lcp;      /* bytes shared with the previous one */
        int32_t id;
    } *sorted;          /* [n_sorted] */
    char *sblob;
    int n_sorted;
    size_t max_len;
};

/* A token being sorted (qsort has no context argument, so each entry carries its bytes). */
typedef struct sort_entry {
    const char *p;
    size_t len;
    int32_t id;
} sort_entry;

static int cmp_entries(const void *a, const void *b) {
    const sort_entry *x = a, *y = b;
    int r = memcmp(x->p, y->p, x->len < y->len ? x->len : y->len);
    if (r) return r;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

void atlas_constraint_vocab_free(atlas_constraint_vocab *v) {
    if (!v) return;
    free(v->blob);
    free(v->off);
    free(v->sorted);
    free(v->sblob);
    free(v);
}

int atlas_constraint_vocab_size(const atlas_constraint_vocab *v) { return v->n; }

/* Sorts the ids that have bytes and computes the shared prefixes. */
static atlas_status vocab_index(atlas_constraint_vocab *v) {
    sort_entry *e = malloc(((size_t)v->n + 1) * sizeof *e);
    v->sorted = malloc(((size_t)v->n + 1) * sizeof *v->sorted);
    v->sblob = malloc(v->off[v->n] + 1);
    if (!e || !v->sorted || !v->sblob) {
        free(e);
        return atlas_fail(ATLAS_ERR_NOMEM, "constraint vocabulary");
    }
    v->n_sorted = 0;
    v->max_len = 0;
    for (int i = 0; i < v->n; i++) {
        size_t len = v->off[i + 1] - v->off[i];
        if (len == 0) continue;
        e[v->n_sorted++] = (sort_entry){v->blob + v->off[i], len, i};
        if (len > v->max_len) v->max_len = len;
    }
    qsort(e, (size_t)v->n_sorted, sizeof *e, cmp_entries);
    size_t o = 0;
    for (int k = 0; k < v->n_sorted; k++) {
        size_t l = 0;
        if (k > 0)
            while (l < e[k - 1].len && l < e[k].len && e[k - 1].p[l] == e[k].p[l]) l++;
        memcpy(v->sblob + o, e[k].p, e[k].len);
        v->sorted[k] = (struct sorted_tok){(uint32_t)o, (uint32_t)e[k].len, (uint32_t)l, e[k].id};
        o += e[k].len;
    }
    free(e);
    return ATLAS_OK;
}

atlas_status atlas_constraint_vocab_new(const char *const *bytes, const size_t *lens, int n,
                                        atlas_constraint_vocab **out) {
    *out = NULL;
    if (n < 0) return atlas_fail(ATLAS_ERR_RANGE, "constraint vocabulary: %d tokens", n);
    atlas_constraint_vocab *v = calloc(1, sizeof *v);
    if (!v) return atlas_fail(ATLAS_ERR_NOMEM, "constraint vocabulary");
    v->n = n;
    v->off = malloc(((size_t)n + 1) * sizeof *v->off);
    size_t total = 0;
    for (int i = 0; i < n && total <= UINT32_MAX; i++) total += bytes[i] ? lens[i] : 0;
    atlas_status st = ATLAS_OK;
    if (total > UINT32_MAX) /* offsets are 32-bit */
        st = atlas_fail(ATLAS_ERR_RANGE, "constraint vocabulary: more than 4 GiB of tokens");
    v->blob = st == ATLAS_OK ? malloc(total + 1) : NULL;
    if (st == ATLAS_OK && (!v->off || !v->blob))
        st = atlas_fail(ATLAS_ERR_NOMEM, "constraint vocabulary");
    if (st == ATLAS_OK) {
        size_t o = 0;
        for (int i = 0; i < n; i++) {
            v->off[i] = o;
            size_t len = bytes[i] ? lens[i] : 0;
            if (len) memcpy(v->blob + o, bytes[i], len);
            o += len;
        }
        v->off[n] = o;
        st = vocab_index(v);
    }
    if (st != ATLAS_OK) {
        atlas_constraint_vocab_free(v);
        return st;
    }
    *out = v;
    return ATLAS_OK;
}

atlas_status atlas_constraint_vocab_from_tokenizer(const atlas_tokenizer *tok, bool skip_special,
                                                   atlas_constraint_vocab **out) {
    *out = NULL;
    size_t n = atlas_tokenizer_vocab_size(tok);
    if (n > INT32_MAX) return atlas_fail(ATLAS_ERR_RANGE, "constraint vocabulary: %zu", n);
    const char **bytes = calloc(n + 1, sizeof *bytes);
    size_t *lens = calloc(n + 1, sizeof *lens);
    atlas_status st = bytes && lens ? ATLAS_OK
                                    : atlas_fail(ATLAS_ERR_NOMEM, "constraint vocabulary");
    for (size_t i = 0; st == ATLAS_OK && i < n; i++) {
        st = atlas_tokenizer_token_bytes(tok, (int32_t)i, &bytes[i], &lens[i]);
        if (skip_special && atlas_tokenizer_is_special(tok, (int32_t)i)) lens[i] = 0;
    }
    if (st == ATLAS_OK) st = atlas_constraint_vocab_new(bytes, lens, (int)n, out);
    free(bytes);
    free(lens);
    return st;
}

/* ---- the byte automaton ----------------------------------------------------------------- */

/* JSON grammar states.  A value inside a container ends in J_AFTER; the top-level value's
 * last byte ends the segment.  Numbers end at the first byte that is not theirs, which is
 * then read in J_AFTER, or at the top level by the next segment (a literal, see
 * check_after). */
enum {
    J_START = 0,  /* ws or '{' (JSON_OBJECT) */
    J_START_ARR,  /* ws or '[' (JSON_ARRAY) */
    J_START_STR,  /* ws or '"' (JSON_STRING) */
    J_START_NUM,  /* ws, '-' or a digit (JSON_NUMBER, JSON_INTEGER) */
    J_START_BOOL, /* ws, 't' or 'f' (JSON_BOOLEAN) */
    J_OBJ_OPEN,   /* after '{': ws, '"' or '}' */
    J_OBJ_KEY,    /* after ',' in an object: ws or '"' */
    J_COLON,      /* after a key: ws or ':' */
    J_VALUE,      /* after ':' or ',' in an array: ws or a value */
    J_ARR_OPEN,   /* after '[': ws, a value or ']' */
    J_AFTER,      /* after a value: ws, ',' or the container's closer */
    J_STR,        /* in a string (key says which kind) */
    J_ESC,        /* after '\' */
    J_HEX,        /* in \uXXXX: nhex digits read, value hex */
    J_LOW_BS,     /* after a high surrogate: its low half's '\' */
    J_LOW_U,      /* ... its 'u' */
    J_LOW_HEX,    /* ... its 4 digits */
    J_NUM_MINUS, J_NUM_ZERO, J_NUM_INT, J_NUM_DOT, J_NUM_FRAC, J_NUM_E, J_NUM_ESIGN, J_NUM_EXP,
    J_LIT,        /* in true / false / null */
};

enum { MAX_INT_DIGITS = 18, MAX_EXP_DIGITS = 2 };

static const char *const LITS[3] = {"true", "false", "null"};

typedef struct cstate {
    int32_t seg;      /* segment index; == n: complete */
    uint32_t pos;     /* LITERAL / CHOICE: bytes matched; J_LIT: of LITS[lit] */
    uint16_t lo, hi;  /* CHOICE: options [lo, hi) still possible */
    uint8_t js;       /* JSON state */
    uint8_t depth;    /* containers open */
    uint8_t ws;       /* whitespace before the next token: 0 none, 1 a space, 2 + k a newline
                         and k spaces or tabs */
    uint8_t nlen;     /* digits in the number part being read */
    uint8_t u8need;   /* UTF-8 continuation bytes still due */
    uint8_t u8lo, u8hi; /* range of the next one */
    uint8_t key;      /* the string being read is a key */
    uint8_t nhex;
    uint8_t lit;
    uint16_t hex;
    uint32_t stack;   /* bit d: the container at depth d + 1 is an array */
} cstate;

/* No padding: states are compared with memcmp (the mask cache below). */
_Static_assert(sizeof(cstate) == 28, "cstate has padding");

/* Enters segment i (or completion), following jumps and skipping a CHOICE whose only
 * option is "". */
static void enter(const atlas_constraint *c, cstate *s, int i) {
    for (;; i++) {
        memset(s, 0, sizeof *s);
        s->seg = i;
        if (i >= c->n) return;
        const seg *g = &c->segs[i];
        if (g->kind == SEG_JUMP) {
            i = g->jump - 1;
            continue;
        }
        if (g->kind == SEG_JSON) {
            static const uint8_t start[] = {
                [ATLAS_CONSTRAINT_JSON_OBJECT] = J_START, [ATLAS_CONSTRAINT_JSON_ANY] = J_VALUE,
                [ATLAS_CONSTRAINT_JSON_ARRAY] = J_START_ARR,
                [ATLAS_CONSTRAINT_JSON_STRING] = J_START_STR,
                [ATLAS_CONSTRAINT_JSON_NUMBER] = J_START_NUM,
                [ATLAS_CONSTRAINT_JSON_INTEGER] = J_START_NUM,
                [ATLAS_CONSTRAINT_JSON_BOOLEAN] = J_START_BOOL,
                [ATLAS_CONSTRAINT_JSON_ARRAY_OF_STRING] = J_START_ARR,
                [ATLAS_CONSTRAINT_JSON_ARRAY_OF_NUMBER] = J_START_ARR,
                [ATLAS_CONSTRAINT_JSON_ARRAY_OF_INTEGER] = J_START_ARR,
                [ATLAS_CONSTRAINT_JSON_ARRAY_OF_BOOLEAN] = J_START_ARR};
            s->js = start[g->jkind];
            s->ws = g->tight ? 1 : 0; /* as if its one space had been read */
        }
        if (g->kind == SEG_LITERAL || g->kind == SEG_JSON) return;
        s->hi = (uint16_t)g->n_opt;
        if (!(g->kind == SEG_CHOICE && g->n_opt == 1 && g->opt_len[0] == 0)) return;
    }
}

static int is_ws(unsigned b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }

/* Whitespace outside strings, as llama.cpp's JSON grammar allows it: none, one space, or
 * one newline and at most ATLAS_CONSTRAINT_MAX_INDENT spaces or tabs (a line of
 * pretty-printed JSON), so that a model cannot pad its JSON without end. */
static int json_ws(cstate *s, unsigned b) {
    if (b == '\n' && s->ws == 0) s->ws = 2;
    else if (b == ' ' && s->ws == 0) s->ws = 1;
    else if ((b == ' ' || b == '\t') && s->ws >= 2 && s->ws < 2 + ATLAS_CONSTRAINT_MAX_INDENT)
        s->ws++;
    else return 0;
    return 1;
}

static int hexval(unsigned b) {
    if (b >= '0' && b <= '9') return (int)(b - '0');
    if (b >= 'a' && b <= 'f') return (int)(b - 'a' + 10);
    if (b >= 'A' && b <= 'F') return (int)(b - 'A' + 10);
    return -1;
}

/* A value (string, number, literal, closed container) has ended. */
static void json_value_done(const atlas_constraint *c, cstate *s) {
    if (s->depth == 0) enter(c, s, s->seg + 1);
    else s->js = J_AFTER;
}

static int json_close(const atlas_constraint *c, cstate *s, int array) {
    if (s->depth == 0 || (int)(s->stack >> (s->depth - 1) & 1) != array) return 0;
    s->depth--;
    s->stack &= ~(1u << s->depth);
    json_value_done(c, s);
    return 1;
}

static int json_open(cstate *s, int array) {
    if (s->depth >= ATLAS_CONSTRAINT_MAX_DEPTH) return 0;
    if (array) s->stack |= 1u << s->depth;
    s->depth++;
    s->js = array ? J_ARR_OPEN : J_OBJ_OPEN;
    return 1;
}

/* The first byte of a value (in an array-of segment, of an element of its kind). */
static int json_value_start(const atlas_constraint *c, cstate *s, unsigned b) {
    if (s->depth == 1) {
        int digit = b >= '0' && b <= '9';
        switch (c->segs[s->seg].jkind) {
        case ATLAS_CONSTRAINT_JSON_ARRAY_OF_STRING:
            if (b != '"') return 0;
            break;
        case ATLAS_CONSTRAINT_JSON_ARRAY_OF_NUMBER:
        case ATLAS_CONSTRAINT_JSON_ARRAY_OF_INTEGER:
            if (b != '-' && !digit) return 0;
            break;
        case ATLAS_CONSTRAINT_JSON_ARRAY_OF_BOOLEAN:
            if (b != 't' && b != 'f') return 0;
            break;
        default: break;
        }
    }
    switch (b) {
    case '{': return json_open(s, 0);
    case '[': return json_open(s, 1);
    case '"': s->js = J_STR, s->key = 0; return 1;
    case '-': s->js = J_NUM_MINUS; return 1;
    case '0': s->js = J_NUM_ZERO; return 1;
    case 't': s->js = J_LIT, s->lit = 0, s->pos = 1; return 1;
    case 'f': s->js = J_LIT, s->lit = 1, s->pos = 1; return 1;
    case 'n': s->js = J_LIT, s->lit = 2, s->pos = 1; return 1;
    }
    if (b >= '1' && b <= '9') {
        s->js = J_NUM_INT, s->nlen = 1;
        return 1;
    }
    return 0;
}

/* A byte outside strings, numbers and literals. */
static int json_structural(const atlas_constraint *c, cstate *s, unsigned b) {
    if (is_ws(b)) return json_ws(s, b);
    s->ws = 0;
    switch (s->js) {
    case J_START:
        if (b == 'n' && c->segs[s->seg].nullable) return json_value_start(c, s, b);
        if (b != '{') return 0;
        return json_open(s, 0);
    case J_START_ARR:
        if (b == 'n' && c->segs[s->seg].nullable) return json_value_start(c, s, b);
        if (b != '[') return 0;
        return json_open(s, 1);
    case J_START_STR:
        if (b == 'n' && c->segs[s->seg].nullable) return json_value_start(c, s, b);
        if (b != '"') return 0;
        s->js = J_STR, s->key = 0;
        return 1;
    case J_START_NUM:
        if (b == 'n' && c->segs[s->seg].nullable) return json_value_start(c, s, b);
        if (b != '-' && (b < '0' || b > '9')) return 0;
        return json_value_start(c, s, b);
    case J_START_BOOL:
        if (b != 't' && b != 'f' && !(b == 'n' && c->segs[s->seg].nullable)) return 0;
        return json_value_start(c, s, b);
    case J_OBJ_OPEN:
        if (b == '}') return json_close(c, s, 0);
        /* fall through */
    case J_OBJ_KEY:
        if (b != '"') return 0;
        s->js = J_STR, s->key = 1;
        return 1;
    case J_COLON:
        if (b != ':') return 0;
        s->js = J_VALUE;
        return 1;
    case J_ARR_OPEN:
        if (b == ']') return json_close(c, s, 1);
        /* fall through */
    case J_VALUE: return json_value_start(c, s, b);
    case J_AFTER:
        if (b == '}') return json_close(c, s, 0);
        if (b == ']') return json_close(c, s, 1);
        if (b != ',') return 0;
        s->js = s->stack >> (s->depth - 1) & 1 ? J_VALUE : J_OBJ_KEY;
        return 1;
    }
    return 0;
}

/* The first byte of a UTF-8 sequence inside a string (RFC 3629 table 3.7). */
static int utf8_lead(cstate *s, unsigned b) {
    s->u8lo = 0x80, s->u8hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) s->u8need = 1;
    else if (b >= 0xE0 && b <= 0xEF) s->u8need = 2;
    else if (b >= 0xF0 && b <= 0xF4) s->u8need = 3;
    else return 0;
    if (b == 0xE0) s->u8lo = 0xA0;
    if (b == 0xED) s->u8hi = 0x9F; /* no surrogates */
    if (b == 0xF0) s->u8lo = 0x90;
    if (b == 0xF4) s->u8hi = 0x8F; /* nothing above U+10FFFF */
    return 1;
}

static int json_string(const atlas_constraint *c, cstate *s, unsigned b) {
    if (s->u8need) {
        if (b < s->u8lo || b > s->u8hi) return 0;
        s->u8need--;
        s->u8lo = 0x80, s->u8hi = 0xBF;
        return 1;
    }
    if (b == '"') {
        if (s->key) s->js = J_COLON;
        else json_value_done(c, s);
        return 1;
    }
    if (b == '\\') {
        s->js = J_ESC;
        return 1;
    }
    if (b < 0x20) return 0;
    if (b < 0x80) return 1;
    return utf8_lead(s, b);
}

/* \uXXXX digits.  Lone low surrogates and \u0000 are refused (jansson refuses both). */
static int json_hex(cstate *s, unsigned b, int low) {
    int v = hexval(b);
    if (v < 0) return 0;
    s->hex = (uint16_t)(s->hex << 4 | (unsigned)v);
    s->nhex++;
    if (low) {
        if (s->nhex == 1 && s->hex != 0xD) return 0;
        if (s->nhex == 2 && (s->hex < 0xDC || s->hex > 0xDF)) return 0;
    } else if (s->nhex == 2 && s->hex >= 0xDC && s->hex <= 0xDF) {
        return 0;
    }
    if (s->nhex < 4) return 1;
    if (low) s->js = J_STR;
    else if (s->hex == 0) return 0;
    else s->js = s->hex >= 0xD800 && s->hex <= 0xDBFF ? J_LOW_BS : J_STR;
    return 1;
}

static int step(const atlas_constraint *c, cstate *s, unsigned b);

/* A byte in a number; one that ends it is read again as structure, or at the top level by
 * the next segment. */
static int json_number(const atlas_constraint *c, cstate *s, unsigned b) {
    int digit = b >= '0' && b <= '9';
    if ((b == '.' || b == 'e' || b == 'E') && (s->js == J_NUM_INT || s->js == J_NUM_ZERO)) {
        atlas_constraint_json_kind k = c->segs[s->seg].jkind;
        if (s->depth == 0 && k == ATLAS_CONSTRAINT_JSON_INTEGER) {
            enter(c, s, s->seg + 1); /* no fraction or exponent: the number ends here */
            return step(c, s, b);
        }
        if (s->depth == 1 && k == ATLAS_CONSTRAINT_JSON_ARRAY_OF_INTEGER) return 0;
    }
    switch (s->js) {
    case J_NUM_MINUS:
        if (!digit) return 0;
        s->js = b == '0' ? J_NUM_ZERO : J_NUM_INT;
        s->nlen = 1;
        return 1;
    case J_NUM_INT:
        if (digit) {
            if (s->nlen >= MAX_INT_DIGITS) return 0;
            s->nlen++;
            return 1;
        }
        /* fall through */
    case J_NUM_ZERO:
        if (b == '.') return (s->js = J_NUM_DOT), 1;
        if (b == 'e' || b == 'E') return (s->js = J_NUM_E), 1;
        break;
    case J_NUM_DOT:
        if (!digit) return 0;
        s->js = J_NUM_FRAC;
        return 1;
    case J_NUM_FRAC:
        if (digit) return 1;
        if (b == 'e' || b == 'E') return (s->js = J_NUM_E), 1;
        break;
    case J_NUM_E:
        if (b == '+' || b == '-') return (s->js = J_NUM_ESIGN), 1;
        /* fall through */
    case J_NUM_ESIGN:
        if (!digit) return 0;
        s->js = J_NUM_EXP, s->nlen = 1;
        return 1;
    case J_NUM_EXP:
        if (digit) {
            if (s->nlen >= MAX_EXP_DIGITS) return 0;
            s->nlen++;
            return 1;
        }
        break;
    }
    if (s->depth == 0) {
        enter(c, s, s->seg + 1);
        return step(c, s, b);
    }
    s->js = J_AFTER;
    return json_structural(c, s, b);
}

static int step_json(const atlas_constraint *c, cstate *s, unsigned b) {
    switch (s->js) {
    case J_STR: return json_string(c, s, b);
    case J_ESC:
        if (b == 'u') {
            s->js = J_HEX, s->nhex = 0, s->hex = 0;
            return 1;
        }
        if (!strchr("\"\\/bfnrt", (int)b) || b == 0) return 0;
        s->js = J_STR;
        return 1;
    case J_HEX: return json_hex(s, b, 0);
    case J_LOW_BS:
        if (b != '\\') return 0;
        s->js = J_LOW_U;
        return 1;
    case J_LOW_U:
        if (b != 'u') return 0;
        s->js = J_LOW_HEX, s->nhex = 0, s->hex = 0;
        return 1;
    case J_LOW_HEX: return json_hex(s, b, 1);
    case J_LIT:
        if (b != (unsigned char)LITS[s->lit][s->pos]) return 0;
        if (LITS[s->lit][++s->pos] == 0) json_value_done(c, s);
        return 1;
    case J_NUM_MINUS: case J_NUM_ZERO: case J_NUM_INT: case J_NUM_DOT: case J_NUM_FRAC:
    case J_NUM_E: case J_NUM_ESIGN: case J_NUM_EXP:
        return json_number(c, s, b);
    default: return json_structural(c, s, b);
    }
}

static int step_choice(const atlas_constraint *c, cstate *s, const seg *g, unsigned b);
static int step_keys(const atlas_constraint *c, cstate *s, const seg *g, unsigned b);

/* Advances s by one byte; 0 (s then undefined) when the byte is refused. */
static int step(const atlas_constraint *c, cstate *s, unsigned b) {
    if (s->seg >= c->n) return 0;
    const seg *g = &c->segs[s->seg];
    switch (g->kind) {
    case SEG_LITERAL:
        if ((unsigned char)g->lit[s->pos] != b) return 0;
        if (++s->pos == g->len) enter(c, s, s->seg + 1);
        return 1;
    case SEG_CHOICE: return step_choice(c, s, g, b);
    case SEG_JSON: return step_json(c, s, b);
    case SEG_SWITCH: case SEG_FREE: return step_keys(c, s, g, b);
    case SEG_JUMP: break; /* enter() never stops at one */
    }
    return 0;
}

/* Narrows the options [lo, hi), which share pos bytes and are sorted, to those with b
 * next; 0 when none has. */
static int narrow(const seg *g, cstate *s, unsigned b) {
    int a = s->lo, z;
    while (a < s->hi && (g->opt_len[a] <= s->pos || (unsigned char)g->opt[a][s->pos] < b)) a++;
    for (z = a; z < s->hi && g->opt_len[z] > s->pos && (unsigned char)g->opt[z][s->pos] == b;)
        z++;
    if (z == a) return 0;
    s->lo = (uint16_t)a, s->hi = (uint16_t)z;
    s->pos++;
    return 1;
}

/* Free text that failed to go on with a trigger: the text read of it, t[0 .. pos) then b,
 * may still end in the start of one; the longest such end is kept. */
static void free_restart(const seg *g, cstate *s, unsigned b) {
    const char *t = g->opt[s->lo];
    uint32_t pos = s->pos;
    for (uint32_t k = 1; k <= pos; k++) {
        unsigned lead = k < pos ? (unsigned char)t[k] : b;
        if (!constraint_bit(g->cont, lead)) continue;
        size_t len = pos - k; /* t[k .. pos), then b */
        int a = 0;
        while (a < g->n_opt && !(g->opt_len[a] > len && !memcmp(g->opt[a], t + k, len) &&
                                 (unsigned char)g->opt[a][len] == b))
            a++;
        if (a == g->n_opt) continue;
        int z = a;
        while (z < g->n_opt && g->opt_len[z] > len && !memcmp(g->opt[z], t + k, len) &&
               (unsigned char)g->opt[z][len] == b)
            z++;
        s->lo = (uint16_t)a, s->hi = (uint16_t)z, s->pos = (uint32_t)len + 1;
        return;
    }
    s->lo = 0, s->hi = (uint16_t)g->n_opt, s->pos = 0;
}

/* SWITCH: b must go on with a key; FREE: any b, which may go on with a trigger.  A complete
 * key (none is a prefix of another) goes on with its alternative. */
static int step_keys(const atlas_constraint *c, cstate *s, const seg *g, unsigned b) {
    if (!narrow(g, s, b)) {
        if (g->kind == SEG_SWITCH) return 0;
        free_restart(g, s, b);
    }
    if (s->pos && s->hi - s->lo == 1 && g->opt_len[s->lo] == s->pos)
        enter(c, s, g->target[s->lo]);
    return 1;
}

static int step_choice(const atlas_constraint *c, cstate *s, const seg *g, unsigned b) {
    int lo = s->lo;
    if (narrow(g, s, b)) {
        if (s->hi - s->lo == 1 && g->opt_len[s->lo] == s->pos) enter(c, s, s->seg + 1);
        return 1;
    }
    if (g->opt_len[lo] != s->pos) return 0;
    enter(c, s, s->seg + 1); /* the shortest option is complete: b is the next segment's */
    return step(c, s, b);
}

/* ---- matchers --------------------------------------------------------------------------- */

/* The last mask is kept with the state it was computed in: inside a JSON string most tokens
 * leave the state exactly as it was, and the next mask is then a copy. */
struct atlas_constraint_matcher {
    atlas_constraint *c;
    const atlas_constraint_vocab *v;
    cstate s;
    cstate *stack;   /* [v->max_len + 1]: states along the token being walked */
    uint8_t *cache;  /* [v->n]: the mask of cache_s */
    cstate cache_s;
    int cache_count; /* -1: no mask cached */
};

atlas_status atlas_constraint_matcher_new(const atlas_constraint *c,
                                          const atlas_constraint_vocab *v,
                                          atlas_constraint_matcher **out) {
    *out = NULL;
    ATLAS_TRY(constraint_check_end(c));
    atlas_constraint_matcher *m = calloc(1, sizeof *m);
    if (!m) return atlas_fail(ATLAS_ERR_NOMEM, "constraint matcher");
    atlas_status st = atlas_constraint_copy(c, &m->c);
    m->v = v;
    if (st == ATLAS_OK && v) {
        m->stack = malloc((v->max_len + 1) * sizeof *m->stack);
        m->cache = malloc((size_t)v->n + 1);
        if (!m->stack || !m->cache) st = atlas_fail(ATLAS_ERR_NOMEM, "constraint matcher");
    }
    if (st != ATLAS_OK) {
        atlas_constraint_matcher_free(m);
        return st;
    }
    enter(m->c, &m->s, 0);
    m->cache_count = -1;
    *out = m;
    return ATLAS_OK;
}

void atlas_constraint_matcher_free(atlas_constraint_matcher *m) {
    if (!m) return;
    atlas_constraint_free(m->c);
    free(m->stack);
    free(m->cache);
    free(m);
}

bool atlas_constraint_matcher_done(const atlas_constraint_matcher *m) {
    return m->s.seg >= m->c->n;
}

static bool in_free(const atlas_constraint_matcher *m) {
    return m->s.seg < m->c->n && m->c->segs[m->s.seg].kind == SEG_FREE;
}

bool atlas_constraint_matcher_can_end(const atlas_constraint_matcher *m) {
    return atlas_constraint_matcher_done(m) || in_free(m);
}

int atlas_constraint_matcher_allowed(atlas_constraint_matcher *m, uint8_t *allowed, int n) {
    memset(allowed, 0, n > 0 ? (size_t)n : 0);
    const atlas_constraint_vocab *v = m->v;
    if (!v || atlas_constraint_matcher_done(m)) return 0;
    int nv = n < v->n ? n : v->n;
    if (m->cache_count >= 0 && n >= v->n && !memcmp(&m->cache_s, &m->s, sizeof m->s)) {
        memcpy(allowed, m->cache, (size_t)nv);
        return m->cache_count;
    }
    const atlas_constraint *c = m->c;
    cstate *st = m->stack;
    st[0] = m->s;
    size_t valid = 0; /* st[0 .. valid] hold the states after the previous token's prefix */
    int count = 0;
    for (int k = 0; k < v->n_sorted; k++) {
        const struct sorted_tok *t = &v->sorted[k];
        size_t l = t->lcp, len = t->len;
        int32_t id = t->id;
        const unsigned char *p = (const unsigned char *)v->sblob + t->off;
        if (l > valid) continue; /* it shares a prefix that was refused */
        size_t d = l;
        for (; d < len; d++) {
            st[d + 1] = st[d];
            /* inside a JSON string, printable ASCII other than '"' and '\' changes nothing:
             * most of the vocabulary, walked without a call */
            if (st[d].js == J_STR && st[d].u8need == 0 && p[d] >= 0x20 && p[d] < 0x7F &&
                p[d] != '"' && p[d] != '\\' && c->segs[st[d].seg].kind == SEG_JSON)
                continue;
            /* free text that no trigger starts at: the same, for every byte but a trigger's
             * first */
            if (st[d].pos == 0 && st[d].seg < c->n && c->segs[st[d].seg].kind == SEG_FREE &&
                !constraint_bit(c->segs[st[d].seg].cont, p[d]))
                continue;
            if (!step(c, &st[d + 1], p[d])) break;
        }
        valid = d;
        if (d == len && id < n) {
            allowed[id] = 1;
            count++;
        }
    }
    if (in_free(m)) /* tokens without bytes (special ones) leave the text as it was */
        for (int id = 0; id < nv; id++)
            if (v->off[id + 1] == v->off[id]) allowed[id] = 1, count++;
    if (nv == v->n) { /* a full mask: keep it */
        memcpy(m->cache, allowed, (size_t)nv);
        m->cache_s = m->s;
        m->cache_count = count;
    }
    return count;
}

atlas_status atlas_constraint_matcher_accept_bytes(atlas_constraint_matcher *m,
                                                   const char *bytes, size_t len) {
    cstate s = m->s;
    for (size_t i = 0; i < len; i++)
        if (!step(m->c, &s, (unsigned char)bytes[i]))
            return atlas_fail(ATLAS_ERR_INVALID, "constraint: byte %zu (0x%02x) is not allowed "
                              "in segment %d", i, (unsigned char)bytes[i], m->s.seg);
    m->s = s;
    return ATLAS_OK;
}

atlas_status atlas_constraint_matcher_accept(atlas_constraint_matcher *m, int32_t id) {
    if (!m->v || id < 0 || id >= m->v->n)
        return atlas_fail(ATLAS_ERR_RANGE, "constraint: token %d outside the vocabulary",
                          (int)id);
    size_t len = m->v->off[id + 1] - m->v->off[id];
    if (len == 0 && in_free(m)) return ATLAS_OK;
    if (len == 0)
        return atlas_fail(ATLAS_ERR_INVALID, "constraint: token %d has no bytes", (int)id);
    atlas_status st = atlas_constraint_matcher_accept_bytes(m, m->v->blob + m->v->off[id], len);
    if (st != ATLAS_OK) return atlas_fail_wrap(st, "token %d", (int)id);
    return ATLAS_OK;
}

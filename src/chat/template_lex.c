/* chat/template_lex.c — Jinja source to tokens, with jinja2's whitespace rules as
 * transformers configures them: trim_blocks (a block or comment tag eats the one newline
 * after it), lstrip_blocks (spaces and tabs before a block or comment tag at the start of a
 * line go), `-` on a tag strips all whitespace on that side, `+` turns lstrip/trim off for
 * that tag, and one trailing newline of the template is dropped (keep_trailing_newline
 * is off). Newlines are normalised to "\n" first, as jinja2 does. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "chat/template_internal.h"
#include "core/error.h"

typedef struct lexer {
    const char *src; /* normalised source */
    size_t n, pos;
    const char *name;
    ttoks *out;
    int depth; /* ( [ { nesting inside a tag: end markers only count at depth 0 */
    size_t cpos; /* line/col of offset cpos, counted incrementally */
    int cline, ccol;
} lexer;

static void pos_of(lexer *lx, size_t at, int *line, int *col) {
    if (at < lx->cpos) { /* rare: restart the incremental count */
        lx->cpos = 0;
        lx->cline = 1;
        lx->ccol = 1;
    }
    for (size_t i = lx->cpos; i < at && i < lx->n; i++) {
        if (lx->src[i] == '\n') {
            lx->cline++;
            lx->ccol = 1;
        } else if (((unsigned char)lx->src[i] & 0xC0) != 0x80) {
            lx->ccol++;
        }
    }
    lx->cpos = at < lx->n ? at : lx->n;
    *line = lx->cline;
    *col = lx->ccol;
}

static atlas_status lex_error(lexer *lx, size_t at, const char *what) {
    int line, col;
    pos_of(lx, at, &line, &col);
    return atlas_fail(ATLAS_ERR_FORMAT, "%s:%d:%d: %s", lx->name, line, col, what);
}

static atlas_status push(lexer *lx, ttok_kind kind, size_t at, const char *text, size_t len,
                         ttok **made) {
    ttoks *t = lx->out;
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        ttok *v = realloc(t->v, cap * sizeof *v);
        if (!v) return atlas_fail(ATLAS_ERR_NOMEM, "%s: out of memory lexing", lx->name);
        t->v = v;
        t->cap = cap;
    }
    ttok *k = &t->v[t->n];
    memset(k, 0, sizeof *k);
    k->kind = kind;
    pos_of(lx, at, &k->line, &k->col);
    k->text = malloc(len + 1);
    if (!k->text) return atlas_fail(ATLAS_ERR_NOMEM, "%s: out of memory lexing", lx->name);
    if (len) memcpy(k->text, text, len);
    k->text[len] = 0;
    k->len = len;
    t->n++;
    if (made) *made = k;
    return ATLAS_OK;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static size_t put_utf8(char *o, unsigned long cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A string literal at lx->pos (a quote). Decodes Python's unicode-escape sequences. */
static atlas_status lex_string(lexer *lx) {
    size_t start = lx->pos;
    char q = lx->src[lx->pos++];
    char *buf = malloc(lx->n - start + 8);
    if (!buf) return atlas_fail(ATLAS_ERR_NOMEM, "%s: out of memory lexing", lx->name);
    size_t o = 0;
    while (lx->pos < lx->n && lx->src[lx->pos] != q) {
        char c = lx->src[lx->pos++];
        if (c != '\\' || lx->pos >= lx->n) {
            buf[o++] = c;
            continue;
        }
        char e = lx->src[lx->pos++];
        int ndig = 0;
        switch (e) {
        case 'n': buf[o++] = '\n'; break;
        case 't': buf[o++] = '\t'; break;
        case 'r': buf[o++] = '\r'; break;
        case '\\': buf[o++] = '\\'; break;
        case '\'': buf[o++] = '\''; break;
        case '"': buf[o++] = '"'; break;
        case 'a': buf[o++] = '\a'; break;
        case 'b': buf[o++] = '\b'; break;
        case 'f': buf[o++] = '\f'; break;
        case 'v': buf[o++] = '\v'; break;
        case '\n': break; /* line continuation */
        case 'x': ndig = 2; break;
        case 'u': ndig = 4; break;
        case 'U': ndig = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                unsigned long v = (unsigned long)(e - '0');
                for (int k = 0; k < 2 && lx->pos < lx->n && lx->src[lx->pos] >= '0' &&
                                lx->src[lx->pos] <= '7';
                     k++)
                    v = v * 8 + (unsigned long)(lx->src[lx->pos++] - '0');
                o += put_utf8(buf + o, v);
            } else { /* unknown escapes stay as written */
                buf[o++] = '\\';
                buf[o++] = e;
            }
        }
        if (ndig) {
            unsigned long v = 0;
            for (int k = 0; k < ndig; k++) {
                int h = lx->pos < lx->n ? hexval(lx->src[lx->pos]) : -1;
                if (h < 0) {
                    free(buf);
                    return lex_error(lx, lx->pos, "truncated \\x/\\u escape in a string");
                }
                v = v * 16 + (unsigned long)h;
                lx->pos++;
            }
            if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
                free(buf);
                return lex_error(lx, lx->pos, "escape is not a valid code point");
            }
            o += put_utf8(buf + o, v);
        }
    }
    if (lx->pos >= lx->n) {
        free(buf);
        return lex_error(lx, start, "unterminated string");
    }
    lx->pos++;
    atlas_status st = push(lx, TT_STRING, start, buf, o, NULL);
    free(buf);
    return st;
}

/* Appends c to a number literal's digits when there is room; *cut records that there was not. */
static void digit_put(char *digits, size_t cap, size_t *o, char c, bool *cut) {
    if (*o < cap - 1) digits[(*o)++] = c;
    else *cut = true;
}

static atlas_status lex_number(lexer *lx) {
    size_t start = lx->pos;
    const char *s = lx->src;
    char digits[128];
    size_t o = 0;
    bool is_float = false, cut = false;
    while (lx->pos < lx->n && (isdigit((unsigned char)s[lx->pos]) || s[lx->pos] == '_')) {
        if (s[lx->pos] != '_') digit_put(digits, sizeof digits, &o, s[lx->pos], &cut);
        lx->pos++;
    }
    if (lx->pos + 1 < lx->n && s[lx->pos] == '.' && isdigit((unsigned char)s[lx->pos + 1])) {
        is_float = true;
        digit_put(digits, sizeof digits, &o, s[lx->pos++], &cut);
        while (lx->pos < lx->n && isdigit((unsigned char)s[lx->pos]))
            digit_put(digits, sizeof digits, &o, s[lx->pos++], &cut);
    }
    if (lx->pos < lx->n && (s[lx->pos] == 'e' || s[lx->pos] == 'E')) {
        size_t p = lx->pos + 1;
        if (p < lx->n && (s[p] == '+' || s[p] == '-')) p++;
        if (p < lx->n && isdigit((unsigned char)s[p])) {
            is_float = true;
            while (lx->pos < p) digit_put(digits, sizeof digits, &o, s[lx->pos++], &cut);
            while (lx->pos < lx->n && isdigit((unsigned char)s[lx->pos]))
                digit_put(digits, sizeof digits, &o, s[lx->pos++], &cut);
        }
    }
    /* (the fuzzer's 127 digits then ".444..." wrote past the buffer) */
    if (cut && is_float) return lex_error(lx, start, "number literal too long");
    digits[o] = 0;
    ttok *t = NULL;
    ATLAS_TRY(push(lx, is_float ? TT_FLOAT : TT_INT, start, digits, o, &t));
    if (is_float) {
        t->fval = strtod(digits, NULL);
    } else {
        errno = 0;
        t->ival = strtoll(digits, NULL, 10);
        if (errno == ERANGE || o >= sizeof digits - 1) return lex_error(lx, start, "integer literal too large");
    }
    return ATLAS_OK;
}

/* Tokens inside {{ }} or {% %} up to the end marker; sets *ws_after to what the end
 * marker does to the following text: 0 nothing, 1 eat one newline, 2 eat all whitespace. */
static atlas_status lex_tag(lexer *lx, bool block, int *ws_after) {
    static const char *ops2[] = {"//", "**", "==", "!=", "<=", ">="};
    const char *s = lx->src;
    size_t tag_start = lx->pos;
    lx->depth = 0;
    for (;;) {
        while (lx->pos < lx->n && isspace((unsigned char)s[lx->pos])) lx->pos++;
        if (lx->pos >= lx->n)
            return lex_error(lx, tag_start, block ? "unclosed '{%' tag" : "unclosed '{{' tag");
        char c = s[lx->pos];
        const char *end = block ? "%}" : "}}";
        if (lx->depth == 0) {
            size_t p = lx->pos;
            int mode = block ? 1 : 0;
            if ((c == '-' || c == '+') && p + 2 < lx->n + 0 && !strncmp(s + p + 1, end, 2)) {
                mode = c == '-' ? 2 : 0;
                p++;
            }
            if (p + 1 < lx->n && !strncmp(s + p, end, 2)) {
                ATLAS_TRY(push(lx, block ? TT_BLOCK_END : TT_VAR_END, lx->pos, end, 2, NULL));
                lx->pos = p + 2;
                *ws_after = mode;
                return ATLAS_OK;
            }
        }
        if (c == '\'' || c == '"') {
            ATLAS_TRY(lex_string(lx));
            continue;
        }
        if (isdigit((unsigned char)c)) {
            ATLAS_TRY(lex_number(lx));
            continue;
        }
        if (isalpha((unsigned char)c) || c == '_') {
            size_t st = lx->pos;
            while (lx->pos < lx->n && (isalnum((unsigned char)s[lx->pos]) || s[lx->pos] == '_'))
                lx->pos++;
            ATLAS_TRY(push(lx, TT_NAME, st, s + st, lx->pos - st, NULL));
            continue;
        }
        size_t oplen = 0;
        for (size_t k = 0; k < sizeof ops2 / sizeof ops2[0]; k++)
            if (lx->pos + 1 < lx->n && !strncmp(s + lx->pos, ops2[k], 2)) oplen = 2;
        if (!oplen && strchr("+-*/%~()[]{},.:|=<>", c)) oplen = 1;
        if (!oplen) {
            char msg[64];
            snprintf(msg, sizeof msg, "unexpected character '%c'", isprint((unsigned char)c) ? c : '?');
            return lex_error(lx, lx->pos, msg);
        }
        if (c == '(' || c == '[' || c == '{') lx->depth++;
        if ((c == ')' || c == ']' || c == '}') && lx->depth > 0) lx->depth--;
        ATLAS_TRY(push(lx, TT_OP, lx->pos, s + lx->pos, oplen, NULL));
        lx->pos += oplen;
    }
}

/* Finds the next tag opener at or after from; returns its offset or n. */
static size_t next_tag(lexer *lx, size_t from) {
    for (size_t i = from; i + 1 < lx->n; i++)
        if (lx->src[i] == '{' &&
            (lx->src[i + 1] == '{' || lx->src[i + 1] == '%' || lx->src[i + 1] == '#'))
            return i;
    return lx->n;
}

/* {% raw %} ... {% endraw %}: returns true (and consumes it) when the block tag at pos is
 * a raw block; the body becomes one text token. */
static atlas_status try_raw(lexer *lx, size_t tag, bool *was_raw, bool *line_starting) {
    const char *s = lx->src;
    size_t p = tag + 2;
    *was_raw = false;
    if (p < lx->n && (s[p] == '-' || s[p] == '+')) p++;
    while (p < lx->n && isspace((unsigned char)s[p])) p++;
    if (strncmp(s + p, "raw", 3) || (p + 3 < lx->n && (isalnum((unsigned char)s[p + 3]) || s[p + 3] == '_')))
        return ATLAS_OK;
    p += 3;
    while (p < lx->n && isspace((unsigned char)s[p])) p++;
    bool strip_after = p < lx->n && s[p] == '-';
    if (strip_after) p++;
    if (strncmp(s + p, "%}", 2)) return ATLAS_OK;
    p += 2;
    if (strip_after) while (p < lx->n && isspace((unsigned char)s[p])) p++;
    else if (p < lx->n && s[p] == '\n') p++;
    size_t body = p;
    for (size_t q = body; q + 1 < lx->n; q++) {
        if (s[q] != '{' || s[q + 1] != '%') continue;
        size_t r = q + 2;
        bool strip_before = r < lx->n && s[r] == '-';
        if (strip_before || (r < lx->n && s[r] == '+')) r++;
        while (r < lx->n && isspace((unsigned char)s[r])) r++;
        if (strncmp(s + r, "endraw", 6)) continue;
        r += 6;
        while (r < lx->n && isspace((unsigned char)s[r])) r++;
        bool strip_end = r < lx->n && s[r] == '-';
        if (strip_end) r++;
        if (strncmp(s + r, "%}", 2)) continue;
        size_t body_end = q;
        if (strip_before)
            while (body_end > body && isspace((unsigned char)s[body_end - 1])) body_end--;
        if (body_end > body) ATLAS_TRY(push(lx, TT_TEXT, body, s + body, body_end - body, NULL));
        r += 2;
        if (strip_end) while (r < lx->n && isspace((unsigned char)s[r])) r++;
        else if (r < lx->n && s[r] == '\n') r++;
        *line_starting = r > 0 && s[r - 1] == '\n';
        lx->pos = r;
        *was_raw = true;
        return ATLAS_OK;
    }
    return lex_error(lx, tag, "unclosed '{% raw %}' (missing '{% endraw %}')");
}

static atlas_status lex_all(lexer *lx) {
    const char *s = lx->src;
    bool line_starting = true;
    while (lx->pos < lx->n) {
        size_t tag = next_tag(lx, lx->pos);
        size_t text_end = tag;
        if (tag < lx->n) {
            char kind = s[tag + 1];
            char sign = tag + 2 < lx->n ? s[tag + 2] : 0;
            if (sign == '-') {
                while (text_end > lx->pos && isspace((unsigned char)s[text_end - 1])) text_end--;
            } else if (sign != '+' && kind != '{') {
                size_t l = text_end;
                while (l > lx->pos && s[l - 1] != '\n') l--;
                bool blank = true;
                for (size_t k = l; k < text_end; k++)
                    if (s[k] != ' ' && s[k] != '\t') blank = false;
                /* jinja2: only at the start of a line (a newline in the text, or the previous
                 * tag ended one) */
                if ((l > lx->pos || line_starting) && blank) text_end = l;
            }
        }
        if (text_end > lx->pos) ATLAS_TRY(push(lx, TT_TEXT, lx->pos, s + lx->pos, text_end - lx->pos, NULL));
        if (tag >= lx->n) break;
        char kind = s[tag + 1];
        size_t after = tag + 2;
        if (after < lx->n && (s[after] == '-' || s[after] == '+')) after++;
        int ws = 0;
        if (kind == '#') {
            size_t e = after;
            while (e + 1 < lx->n && !(s[e] == '#' && s[e + 1] == '}')) e++;
            if (e + 1 >= lx->n) return lex_error(lx, tag, "unclosed comment '{#'");
            ws = (e > after && s[e - 1] == '-') ? 2 : (e > after && s[e - 1] == '+') ? 0 : 1;
            lx->pos = e + 2;
        } else if (kind == '%') {
            bool raw;
            ATLAS_TRY(try_raw(lx, tag, &raw, &line_starting));
            if (raw) continue;
            ATLAS_TRY(push(lx, TT_BLOCK_BEGIN, tag, "{%", 2, NULL));
            lx->pos = after;
            ATLAS_TRY(lex_tag(lx, true, &ws));
        } else {
            ATLAS_TRY(push(lx, TT_VAR_BEGIN, tag, "{{", 2, NULL));
            lx->pos = after;
            ATLAS_TRY(lex_tag(lx, false, &ws));
        }
        if (ws == 2)
            while (lx->pos < lx->n && isspace((unsigned char)s[lx->pos])) lx->pos++;
        else if (ws == 1 && lx->pos < lx->n && s[lx->pos] == '\n')
            lx->pos++;
        line_starting = lx->pos > 0 && s[lx->pos - 1] == '\n';
    }
    return push(lx, TT_EOF, lx->n, "", 0, NULL);
}

atlas_status tpl_lex(const char *src, const char *name, ttoks *out) {
    memset(out, 0, sizeof *out);
    size_t n = strlen(src);
    char *norm = malloc(n + 1);
    if (!norm) return atlas_fail(ATLAS_ERR_NOMEM, "%s: out of memory lexing", name);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (src[i] == '\r') {
            norm[o++] = '\n';
            if (i + 1 < n && src[i + 1] == '\n') i++;
        } else {
            norm[o++] = src[i];
        }
    }
    if (o > 0 && norm[o - 1] == '\n') o--; /* keep_trailing_newline=False */
    norm[o] = 0;
    lexer lx = {.src = norm, .n = o, .name = name, .out = out, .cline = 1, .ccol = 1};
    atlas_status st = lex_all(&lx);
    free(norm);
    if (st != ATLAS_OK) tpl_toks_free(out);
    return st;
}

void tpl_toks_free(ttoks *t) {
    if (!t) return;
    for (size_t i = 0; i < t->n; i++) free(t->v[i].text);
    free(t->v);
    memset(t, 0, sizeof *t);
}

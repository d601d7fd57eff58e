/* tokenizer/load.c — reading tokenizer.json (and tokenizer_config.json) into an
 * atlas_tokenizer.  Every error names the file and the JSON path. */
#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/file.h"
#include "tokenizer/tokenizer_internal.h"

/* The GPT-2 pre-tokenizer regex, used by ByteLevel when use_regex is true. */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

typedef struct loader {
    atlas_tokenizer *tok;
    const char *file; /* for messages */
    tok_bigjson big;  /* model.vocab and model.merges */
    const char *unk;  /* model.unk_token, or NULL */
} loader;

/* ---- JSON helpers ------------------------------------------------------------------------ */

static atlas_status load_json(const char *path, size_t flags, json_t **out) {
    char *buf;
    size_t len;
    ATLAS_TRY(atlas_file_read(path, &buf, &len));
    json_error_t err;
    *out = json_loadb(buf, len, JSON_ALLOW_NUL | flags, &err);
    free(buf);
    if (!*out)
        return atlas_fail(ATLAS_ERR_FORMAT, "%s:%d:%d: %s", path, err.line, err.column, err.text);
    return ATLAS_OK;
}

static atlas_status get_bool(loader *L, json_t *obj, const char *path, const char *key,
                             bool dflt, bool *out) {
    json_t *v = json_object_get(obj, key);
    *out = dflt;
    if (!v || json_is_null(v)) return ATLAS_OK;
    if (!json_is_boolean(v))
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: %s.%s: expected a boolean", L->file, path, key);
    *out = json_is_true(v);
    return ATLAS_OK;
}

static atlas_status get_string(loader *L, json_t *obj, const char *path, const char *key,
                               json_t **out) {
    *out = json_object_get(obj, key);
    if (!*out || !json_is_string(*out))
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: %s.%s: expected a string", L->file, path, key);
    return ATLAS_OK;
}

static const char *type_of(json_t *obj) {
    json_t *t = json_object_get(obj, "type");
    return json_is_string(t) ? json_string_value(t) : NULL;
}

static atlas_status arena_add(atlas_tokenizer *tok, const char *s, size_t len, uint32_t *off) {
    if (tok->arena_len + len + 1 > tok->arena_cap) {
        size_t cap = tok->arena_cap ? tok->arena_cap * 2 : 4096;
        while (cap < tok->arena_len + len + 1) cap *= 2;
        if (cap > UINT32_MAX) return atlas_fail(ATLAS_ERR_RANGE, "tokenizer: strings over 4 GiB");
        char *a = realloc(tok->arena, cap);
        if (!a) return atlas_fail(ATLAS_ERR_NOMEM, "tokenizer: %zu bytes of strings", cap);
        tok->arena = a;
        tok->arena_cap = cap;
    }
    memcpy(tok->arena + tok->arena_len, s, len);
    tok->arena[tok->arena_len + len] = '\0';
    *off = (uint32_t)tok->arena_len;
    tok->arena_len += len + 1;
    return ATLAS_OK;
}

/* What the ByteLevel decoder makes of a token string: each char mapped back to its byte,
 * or, when some char is not one of the 256, the string's own UTF-8 (as HF does).  Writes
 * at most len bytes to dst; returns whether the string was pure byte-level. */
static bool bytelevel_decode(const char *s, size_t len, char *dst, size_t *dst_len) {
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int r = tok_utf8_next((const unsigned char *)s + i, len - i, &cp);
        int b = r > 0 ? tok_cp_to_byte(cp) : -1;
        if (b < 0) {
            memcpy(dst, s, len);
            *dst_len = len;
            return false;
        }
        dst[o++] = (char)b;
        i += (size_t)r;
    }
    *dst_len = o;
    return true;
}

/* What a SentencePiece-style decoder makes of a token string: <0xNN> (with byte_fallback)
 * is that byte, and the metaspace becomes a space (never longer than the string).  Returns
 * whether it was a byte token. */
static bool spm_decode(const atlas_tokenizer *tok, const char *s, size_t len, char *dst,
                       size_t *dst_len) {
    unsigned v;
    char tail;
    if (tok->byte_fallback && len == 6 && sscanf(s, "<0x%2X%c", &v, &tail) == 2 && tail == '>' &&
        isxdigit((unsigned char)s[3]) && isxdigit((unsigned char)s[4])) {
        dst[0] = (char)v;
        *dst_len = 1;
        return true;
    }
    size_t o = 0, r = tok->spm_rep_len;
    for (size_t i = 0; i < len;) {
        if (r && i + r <= len && !memcmp(s + i, tok->spm_rep, r)) {
            dst[o++] = ' ';
            i += r;
        } else {
            dst[o++] = s[i++];
        }
    }
    *dst_len = o;
    return false;
}

/* ---- the model ---------------------------------------------------------------------------- */

static atlas_status check_id(loader *L, json_t *v, const char *what, size_t *max_id) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= INT32_MAX)
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: %s: id must be an integer in [0, 2^31-1)",
                          L->file, what);
    if ((size_t)json_integer_value(v) + 1 > *max_id) *max_id = (size_t)json_integer_value(v) + 1;
    return ATLAS_OK;
}

/* Sets token id's bytes (an added token overrides a vocab entry, as HF's id_to_token
 * looks in the added vocabulary first); *str points at the string's copy in the arena, which
 * was sized up front and never moves. */
static atlas_status set_token(loader *L, int32_t id, const char *s, size_t len, bool *pure,
                              const char **str) {
    atlas_tokenizer *tok = L->tok;
    uint32_t str_off, b_off;
    ATLAS_TRY(arena_add(tok, s, len, &str_off));
    ATLAS_TRY(arena_add(tok, s, len, &b_off)); /* reserves len bytes, overwritten below */
    size_t blen;
    if (tok->spm) {
        if (spm_decode(tok, tok->arena + str_off, len, tok->arena + b_off, &blen))
            tok->tok_flags[id] |= TOK_BYTE;
        *pure = false;
    } else
        *pure = bytelevel_decode(tok->arena + str_off, len, tok->arena + b_off, &blen);
    tok->tok_off[id] = b_off;
    tok->tok_len[id] = (uint32_t)blen;
    tok->tok_flags[id] |= TOK_HAS_STRING;
    *str = tok->arena + str_off;
    return ATLAS_OK;
}

static atlas_status parse_vocab(loader *L) {
    atlas_tokenizer *tok = L->tok;
    for (size_t i = 0; i < L->big.n_vocab; i++) {
        const tok_json_entry *e = &L->big.vocab[i];
        bool pure;
        const char *str;
        ATLAS_TRY(set_token(L, e->id, e->p, e->len, &pure, &str));
        ATLAS_TRY(tok_strmap_put(&tok->by_str, str, e->len, e->id));
        /* only byte-level strings can come out of BPE over bytes */
        if (pure && !tok->spm) ATLAS_TRY(tok_strmap_put(&tok->by_bytes, tok->arena + tok->tok_off[e->id],
                                           tok->tok_len[e->id], e->id));
    }
    return ATLAS_OK;
}

static atlas_status parse_merges(loader *L) {
    atlas_tokenizer *tok = L->tok;
    size_t n = L->big.n_merges;
    ATLAS_TRY(tok_mergemap_init(&tok->merges, n));
    char buf[1024];
    for (size_t i = 0; i < n; i++) {
        const tok_json_merge *m = &L->big.merges[i];
        if (!m->b)
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: model.merges[%zu]: expected \"a b\"", L->file, i);
        if (m->la + m->lb >= sizeof buf)
            return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: model.merges[%zu]: token too long", L->file, i);
        int32_t ia = tok_strmap_get(&tok->by_str, m->a, m->la);
        int32_t ib = tok_strmap_get(&tok->by_str, m->b, m->lb);
        memcpy(buf, m->a, m->la);
        memcpy(buf + m->la, m->b, m->lb);
        int32_t im = tok_strmap_get(&tok->by_str, buf, m->la + m->lb);
        if (ia < 0 || ib < 0 || im < 0) {
            const char *bad = ia < 0 ? m->a : ib < 0 ? m->b : buf;
            int bl = (int)(ia < 0 ? m->la : ib < 0 ? m->lb : m->la + m->lb);
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: model.merges[%zu]: token '%.*s' is not in the vocab",
                              L->file, i, bl, bad);
        }
        tok_mergemap_put(&tok->merges, ia, ib, (uint32_t)i, im);
    }
    return ATLAS_OK;
}

static atlas_status check_model_options(loader *L, json_t *model) {
    const char *t = type_of(model);
    if (!t || strcmp(t, "BPE"))
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: model.type '%s': only BPE is supported",
                          L->file, t ? t : "(none)");
    ATLAS_TRY(get_bool(L, model, "model", "byte_fallback", false, &L->tok->byte_fallback));
    ATLAS_TRY(get_bool(L, model, "model", "fuse_unk", false, &L->tok->fuse_unk));
    ATLAS_TRY(get_bool(L, model, "model", "ignore_merges", false, &L->tok->ignore_merges));
    json_t *unk = json_object_get(model, "unk_token");
    if (unk && !json_is_null(unk) && !json_is_string(unk))
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: model.unk_token: expected a string", L->file);
    L->unk = json_is_string(unk) ? json_string_value(unk) : NULL;
    static const char *const empty_only[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < 2; i++) {
        json_t *v = json_object_get(model, empty_only[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
            return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: model.%s: not supported", L->file,
                              empty_only[i]);
    }
    json_t *d = json_object_get(model, "dropout");
    if (d && !json_is_null(d) && !(json_is_number(d) && json_number_value(d) == 0.0))
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: model.dropout: not supported", L->file);
    if (!L->big.have_vocab)
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: model.vocab: expected an object", L->file);
    if (!L->big.have_merges)
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: model.merges: expected an array", L->file);
    return ATLAS_OK;
}

/* ---- added tokens -------------------------------------------------------------------------- */

static atlas_status parse_added_one(loader *L, json_t *a, const char *path, tok_added *out) {
    json_t *c;
    ATLAS_TRY(get_string(L, a, path, "content", &c));
    json_t *id = json_object_get(a, "id");
    size_t dummy = 0;
    if (id) ATLAS_TRY(check_id(L, id, path, &dummy));
    out->id = id ? (int32_t)json_integer_value(id) : -1;
    out->len = json_string_length(c);
    out->content = malloc(out->len + 1);
    if (!out->content) return atlas_fail(ATLAS_ERR_NOMEM, "added token");
    memcpy(out->content, json_string_value(c), out->len + 1);
    ATLAS_TRY(get_bool(L, a, path, "special", false, &out->special));
    ATLAS_TRY(get_bool(L, a, path, "lstrip", false, &out->lstrip));
    ATLAS_TRY(get_bool(L, a, path, "rstrip", false, &out->rstrip));
    ATLAS_TRY(get_bool(L, a, path, "single_word", false, &out->single_word));
    ATLAS_TRY(get_bool(L, a, path, "normalized", !out->special, &out->normalized));
    return ATLAS_OK;
}

static atlas_status parse_added(loader *L, json_t *arr) {
    atlas_tokenizer *tok = L->tok;
    if (!arr || json_is_null(arr)) return ATLAS_OK;
    if (!json_is_array(arr))
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: added_tokens: expected an array", L->file);
    size_t n = json_array_size(arr);
    tok->added = calloc(n ? n : 1, sizeof *tok->added);
    if (!tok->added) return atlas_fail(ATLAS_ERR_NOMEM, "added tokens");
    for (size_t i = 0; i < n; i++) {
        char path[48];
        snprintf(path, sizeof path, "added_tokens[%zu]", i);
        json_t *a = json_array_get(arr, i);
        if (!json_is_object(a))
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: %s: expected an object", L->file, path);
        tok_added *t = &tok->added[tok->n_added++];
        ATLAS_TRY(parse_added_one(L, a, path, t));
        if (t->id < 0) return atlas_fail(ATLAS_ERR_FORMAT, "%s: %s.id: missing", L->file, path);
    }
    return ATLAS_OK;
}

/* ---- normalizers, pre-tokenizers, post-processor, decoder ----------------------------------- */

static atlas_status add_norm(loader *L, tok_norm n) {
    atlas_tokenizer *tok = L->tok;
    tok_norm *p = realloc(tok->norms, (tok->n_norms + 1) * sizeof *p);
    if (!p) return atlas_fail(ATLAS_ERR_NOMEM, "normalizers");
    tok->norms = p;
    tok->norms[tok->n_norms++] = n;
    return ATLAS_OK;
}

static atlas_status dup_string(json_t *s, char **out, size_t *len) {
    *len = json_string_length(s);
    *out = malloc(*len + 1);
    if (!*out) return atlas_fail(ATLAS_ERR_NOMEM, "tokenizer string");
    memcpy(*out, json_string_value(s), *len + 1);
    return ATLAS_OK;
}

static atlas_status parse_normalizer(loader *L, json_t *n, const char *path) {
    if (!n || json_is_null(n)) return ATLAS_OK;
    const char *t = type_of(n);
    if (!t) return atlas_fail(ATLAS_ERR_FORMAT, "%s: %s.type: missing", L->file, path);
    static const struct { const char *name; tok_norm_kind kind; } simple[] = {
        {"NFC", TOK_NORM_NFC}, {"NFD", TOK_NORM_NFD}, {"NFKC", TOK_NORM_NFKC},
        {"NFKD", TOK_NORM_NFKD}, {"Lowercase", TOK_NORM_LOWERCASE}};
    for (size_t i = 0; i < sizeof simple / sizeof simple[0]; i++)
        if (!strcmp(t, simple[i].name)) return add_norm(L, (tok_norm){.kind = simple[i].kind});
    if (!strcmp(t, "Sequence")) {
        json_t *arr = json_object_get(n, "normalizers");
        if (!json_is_array(arr))
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: %s.normalizers: expected an array", L->file, path);
        for (size_t i = 0; i < json_array_size(arr); i++) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s.normalizers[%zu]", path, i);
            ATLAS_TRY(parse_normalizer(L, json_array_get(arr, i), sub));
        }
        return ATLAS_OK;
    }
    tok_norm nn = {0};
    json_t *s;
    if (!strcmp(t, "Prepend")) {
        ATLAS_TRY(get_string(L, n, path, "prepend", &s));
        nn.kind = TOK_NORM_PREPEND;
        ATLAS_TRY(dup_string(s, &nn.a, &nn.a_len));
        return add_norm(L, nn);
    }
    if (!strcmp(t, "Replace")) {
        json_t *pat = json_object_get(n, "pattern");
        json_t *ps = json_is_object(pat) ? json_object_get(pat, "String") : NULL;
        if (!json_is_string(ps) || json_string_length(ps) == 0)
            return atlas_fail(ATLAS_ERR_UNSUPPORTED,
                              "%s: %s.pattern: only a non-empty String pattern is supported",
                              L->file, path);
        ATLAS_TRY(get_string(L, n, path, "content", &s));
        nn.kind = TOK_NORM_REPLACE;
        ATLAS_TRY(dup_string(ps, &nn.a, &nn.a_len));
        atlas_status st = dup_string(s, &nn.b, &nn.b_len);
        if (st == ATLAS_OK) st = add_norm(L, nn);
        if (st != ATLAS_OK) free(nn.a), free(nn.b);
        return st;
    }
    return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: %s.type '%s': normalizer not supported",
                      L->file, path, t);
}

static atlas_status add_pretok(loader *L, tok_pretok p) {
    atlas_tokenizer *tok = L->tok;
    tok_pretok *q = realloc(tok->pretoks, (tok->n_pretoks + 1) * sizeof *q);
    if (!q) {
        pcre2_code_free(p.re);
        return atlas_fail(ATLAS_ERR_NOMEM, "pre-tokenizers");
    }
    tok->pretoks = q;
    tok->pretoks[tok->n_pretoks++] = p;
    return ATLAS_OK;
}

static atlas_status parse_split(loader *L, json_t *n, const char *path) {
    tok_pretok p = {.kind = TOK_PRE_SPLIT};
    json_t *pat = json_object_get(n, "pattern");
    json_t *rx = json_is_object(pat) ? json_object_get(pat, "Regex") : NULL;
    json_t *str = json_is_object(pat) ? json_object_get(pat, "String") : NULL;
    json_t *src = json_is_string(rx) ? rx : str;
    if (!json_is_string(src))
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: %s.pattern: expected {\"Regex\"} or {\"String\"}",
                          L->file, path);
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious",
                                        "MergedWithNext", "Contiguous"};
    json_t *b;
    ATLAS_TRY(get_string(L, n, path, "behavior", &b));
    size_t k = 0;
    while (k < 5 && strcmp(names[k], json_string_value(b))) k++;
    if (k == 5)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: %s.behavior '%s': not supported", L->file,
                          path, json_string_value(b));
    p.behavior = (tok_split_behavior)k;
    ATLAS_TRY(get_bool(L, n, path, "invert", false, &p.invert));
    char err[320];
    p.re = tok_regex_compile(json_string_value(src), json_string_length(src), src == str, err,
                             sizeof err);
    if (!p.re)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: %s.pattern: %s", L->file, path, err);
    return add_pretok(L, p);
}

static atlas_status parse_pretok(loader *L, json_t *n, const char *path, bool *bytelevel) {
    if (!n || json_is_null(n)) return ATLAS_OK;
    const char *t = type_of(n);
    if (!t) return atlas_fail(ATLAS_ERR_FORMAT, "%s: %s.type: missing", L->file, path);
    if (!strcmp(t, "Sequence")) {
        json_t *arr = json_object_get(n, "pretokenizers");
        if (!json_is_array(arr))
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: %s.pretokenizers: expected an array", L->file, path);
        for (size_t i = 0; i < json_array_size(arr); i++) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", path, i);
            ATLAS_TRY(parse_pretok(L, json_array_get(arr, i), sub, bytelevel));
        }
        return ATLAS_OK;
    }
    if (!strcmp(t, "Split")) return parse_split(L, n, path);
    if (!strcmp(t, "Digits")) {
        /* HF splits on char::is_numeric one char at a time: Isolated keeps each digit
         * alone, Contiguous joins runs; the same as a Split on \p{N} */
        bool individual;
        ATLAS_TRY(get_bool(L, n, path, "individual_digits", false, &individual));
        tok_pretok p = {.kind = TOK_PRE_SPLIT,
                        .behavior = individual ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS};
        char err[320];
        p.re = tok_regex_compile("\\p{N}", 5, false, err, sizeof err);
        if (!p.re) return atlas_fail(ATLAS_ERR_INTERNAL, "Digits regex: %s", err);
        return add_pretok(L, p);
    }
    if (!strcmp(t, "Metaspace")) {
        tok_pretok p = {.kind = TOK_PRE_METASPACE, .prepend = TOK_PREPEND_ALWAYS, .split = true};
        json_t *r = json_object_get(n, "replacement"), *ps = json_object_get(n, "prepend_scheme");
        if (!json_is_string(r) || json_string_length(r) == 0 || json_string_length(r) >= 8)
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: %s.replacement: expected a character",
                              L->file, path);
        p.rep_len = json_string_length(r);
        memcpy(p.rep, json_string_value(r), p.rep_len);
        ATLAS_TRY(get_bool(L, n, path, "split", true, &p.split));
        if (json_is_string(ps)) {
            static const char *const names[] = {"never", "first", "always"};
            size_t k = 0;
            while (k < 3 && strcmp(names[k], json_string_value(ps))) k++;
            if (k == 3)
                return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: %s.prepend_scheme '%s': not "
                                  "supported", L->file, path, json_string_value(ps));
            p.prepend = (tok_prepend)k;
        } else { /* older files: add_prefix_space */
            bool add;
            ATLAS_TRY(get_bool(L, n, path, "add_prefix_space", true, &add));
            p.prepend = add ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
        }
        return add_pretok(L, p);
    }
    if (!strcmp(t, "ByteLevel")) {
        tok_pretok p = {.kind = TOK_PRE_BYTELEVEL, .behavior = TOK_SPLIT_ISOLATED};
        bool use_regex;
        ATLAS_TRY(get_bool(L, n, path, "add_prefix_space", true, &p.add_prefix_space));
        ATLAS_TRY(get_bool(L, n, path, "use_regex", true, &use_regex));
        if (use_regex) {
            char err[320];
            p.re = tok_regex_compile(GPT2_PATTERN, sizeof GPT2_PATTERN - 1, false, err, sizeof err);
            if (!p.re) return atlas_fail(ATLAS_ERR_INTERNAL, "GPT-2 regex: %s", err);
        }
        *bytelevel = true;
        return add_pretok(L, p);
    }
    return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: %s.type '%s': pre-tokenizer not supported",
                      L->file, path, t);
}

/* TemplateProcessing: the special tokens of "single" before $A go in front, those after
 * at the end. */
static atlas_status parse_template(loader *L, json_t *n, const char *path) {
    atlas_tokenizer *tok = L->tok;
    json_t *single = json_object_get(n, "single"), *specials = json_object_get(n, "special_tokens");
    if (!json_is_array(single))
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: %s.single: expected an array", L->file, path);
    bool after = false;
    for (size_t i = 0; i < json_array_size(single); i++) {
        json_t *it = json_array_get(single, i);
        json_t *seq = json_object_get(it, "Sequence"), *sp = json_object_get(it, "SpecialToken");
        if (json_is_object(seq)) {
            json_t *id = json_object_get(seq, "id");
            if (!json_is_string(id) || strcmp(json_string_value(id), "A"))
                return atlas_fail(ATLAS_ERR_FORMAT, "%s: %s.single[%zu]: only sequence A is allowed",
                                  L->file, path, i);
            after = true;
            continue;
        }
        json_t *name = json_is_object(sp) ? json_object_get(sp, "id") : NULL;
        json_t *def = json_is_string(name) ? json_object_get(specials, json_string_value(name)) : NULL;
        json_t *ids = json_object_get(def, "ids");
        if (!json_is_array(ids))
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: %s.single[%zu]: special token not in special_tokens",
                              L->file, path, i);
        for (size_t k = 0; k < json_array_size(ids); k++) {
            json_t *v = json_array_get(ids, k);
            size_t dummy = 0;
            ATLAS_TRY(check_id(L, v, "post_processor special_tokens ids", &dummy));
            int32_t **arr = after ? &tok->suffix : &tok->prefix;
            size_t *cnt = after ? &tok->n_suffix : &tok->n_prefix;
            int32_t *p = realloc(*arr, (*cnt + 1) * sizeof *p);
            if (!p) return atlas_fail(ATLAS_ERR_NOMEM, "post-processor");
            *arr = p;
            p[(*cnt)++] = (int32_t)json_integer_value(v);
        }
    }
    return ATLAS_OK;
}

static atlas_status parse_post(loader *L, json_t *n, const char *path) {
    if (!n || json_is_null(n)) return ATLAS_OK;
    const char *t = type_of(n);
    if (t && !strcmp(t, "ByteLevel")) return ATLAS_OK; /* only trims offsets */
    if (t && !strcmp(t, "TemplateProcessing")) return parse_template(L, n, path);
    if (t && !strcmp(t, "Sequence")) {
        json_t *arr = json_object_get(n, "processors");
        if (!json_is_array(arr))
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: %s.processors: expected an array", L->file, path);
        for (size_t i = 0; i < json_array_size(arr); i++) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s.processors[%zu]", path, i);
            ATLAS_TRY(parse_post(L, json_array_get(arr, i), sub));
        }
        return ATLAS_OK;
    }
    return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: %s.type '%s': post-processor not supported",
                      L->file, path, t ? t : "(none)");
}

/* The decoder: ByteLevel, or a SentencePiece-style chain (Replace of the metaspace by a
 * space, ByteFallback, Fuse, Strip of leading spaces; or Metaspace), which makes the
 * tokenizer's BPE one of characters (tok->spm). */
static atlas_status parse_decoder(loader *L, json_t *n, const char *path) {
    atlas_tokenizer *tok = L->tok;
    const char *t = n ? type_of(n) : NULL;
    if (t && !strcmp(t, "ByteLevel")) return ATLAS_OK;
    if (t && !strcmp(t, "Sequence")) {
        json_t *arr = json_object_get(n, "decoders");
        if (!json_is_array(arr) || json_array_size(arr) == 0)
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: %s.decoders: expected an array", L->file, path);
        for (size_t i = 0; i < json_array_size(arr); i++) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s.decoders[%zu]", path, i);
            ATLAS_TRY(parse_decoder(L, json_array_get(arr, i), sub));
        }
        return ATLAS_OK;
    }
    if (t && (!strcmp(t, "ByteFallback") || !strcmp(t, "Fuse"))) {
        tok->spm = true;
        return ATLAS_OK;
    }
    json_t *s = NULL;
    if (t && !strcmp(t, "Replace")) { /* the metaspace back to a space */
        json_t *pat = json_object_get(n, "pattern");
        s = json_is_object(pat) ? json_object_get(pat, "String") : NULL;
        json_t *c = json_object_get(n, "content");
        if (!json_is_string(s) || json_string_length(s) == 0 || json_string_length(s) >= 8 ||
            !json_is_string(c) || strcmp(json_string_value(c), " "))
            return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: %s: only a Replace of one string by "
                              "\" \" is supported", L->file, path);
    } else if (t && !strcmp(t, "Metaspace")) {
        s = json_object_get(n, "replacement");
        json_t *ps = json_object_get(n, "prepend_scheme");
        if (!json_is_string(s) || json_string_length(s) == 0 || json_string_length(s) >= 8)
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: %s.replacement: expected a character",
                              L->file, path);
        tok->strip_first = !(json_is_string(ps) && !strcmp(json_string_value(ps), "never"));
    } else if (t && !strcmp(t, "Strip")) {
        json_t *c = json_object_get(n, "content"), *a = json_object_get(n, "start"),
               *b = json_object_get(n, "stop");
        if (!json_is_string(c) || strcmp(json_string_value(c), " ") || !json_is_integer(a) ||
            json_integer_value(a) < 0 || json_integer_value(a) > 64 ||
            (b && !(json_is_integer(b) && json_integer_value(b) == 0)))
            return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: %s: only a Strip of leading \" \" is "
                              "supported", L->file, path);
        tok->strip_lead = (int)json_integer_value(a);
        tok->spm = true;
        return ATLAS_OK;
    } else {
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: %s.type '%s': decoder not supported "
                          "(ByteLevel, and Replace, ByteFallback, Fuse, Strip, Metaspace are)",
                          L->file, path, t ? t : "(none)");
    }
    tok->spm = true;
    tok->spm_rep_len = json_string_length(s);
    memcpy(tok->spm_rep, json_string_value(s), tok->spm_rep_len);
    return ATLAS_OK;
}

/* ---- tokenizer_config.json ---------------------------------------------------------------- */

/* Adds the added_tokens_decoder entries that tokenizer.json lacks. */
static atlas_status config_added(loader *L, json_t *cfg, const char *cfg_file) {
    atlas_tokenizer *tok = L->tok;
    json_t *dec = json_object_get(cfg, "added_tokens_decoder");
    if (!dec || json_is_null(dec)) return ATLAS_OK;
    if (!json_is_object(dec))
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: added_tokens_decoder: expected an object", cfg_file);
    const char *key;
    json_t *v;
    json_object_foreach(dec, key, v) {
        char *end;
        long id = strtol(key, &end, 10);
        if (*end || end == key || id < 0 || id >= INT32_MAX || !json_is_object(v))
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: added_tokens_decoder.%s: bad entry", cfg_file, key);
        bool known = false;
        for (size_t i = 0; i < tok->n_added && !known; i++) known = tok->added[i].id == id;
        if (known) continue;
        tok_added *p = realloc(tok->added, (tok->n_added + 1) * sizeof *p);
        if (!p) return atlas_fail(ATLAS_ERR_NOMEM, "added tokens");
        tok->added = p;
        tok_added *t = &tok->added[tok->n_added++];
        memset(t, 0, sizeof *t);
        char path[96];
        snprintf(path, sizeof path, "added_tokens_decoder.%s", key);
        const char *file = L->file;
        L->file = cfg_file;
        atlas_status st = parse_added_one(L, v, path, t);
        L->file = file;
        t->id = (int32_t)id;
        ATLAS_TRY(st);
    }
    return ATLAS_OK;
}

/* bos_token / eos_token: a string, {"content": ...} or null. */
static atlas_status config_special(loader *L, json_t *cfg, const char *cfg_file, const char *key,
                                   char **tok_out, int32_t *id_out) {
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!v || json_is_null(v)) return ATLAS_OK;
    if (!json_is_string(v))
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: %s: expected a string", cfg_file, key);
    int32_t id = atlas_tokenizer_token_id(L->tok, json_string_value(v));
    if (id < 0)
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: %s '%s' is not a token", cfg_file, key,
                          json_string_value(v));
    size_t len;
    ATLAS_TRY(dup_string(v, tok_out, &len));
    *id_out = id;
    return ATLAS_OK;
}

/* ---- reading tokenizer.json --------------------------------------------------------------- */

/* The slow path, for files the fast scanner refuses: vocab and merges from jansson's DOM
 * (the entries point into root, which must outlive them). */
static atlas_status big_from_dom(loader *L, json_t *root) {
    tok_bigjson *j = &L->big;
    json_t *model = json_object_get(root, "model");
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    if (json_is_object(vocab)) {
        j->have_vocab = true;
        j->vocab = malloc((json_object_size(vocab) + 1) * sizeof *j->vocab);
        if (!j->vocab) return atlas_fail(ATLAS_ERR_NOMEM, "vocab");
        const char *key;
        json_t *v;
        json_object_foreach(vocab, key, v) {
            size_t dummy = 0;
            if (!json_is_integer(v))
                return atlas_fail(ATLAS_ERR_FORMAT, "%s: model.vocab.%s: expected an integer id", L->file, key);
            ATLAS_TRY(check_id(L, v, "model.vocab", &dummy));
            j->vocab[j->n_vocab++] = (tok_json_entry){(char *)key, (uint32_t)strlen(key), (int32_t)json_integer_value(v)};
        }
    }
    if (!json_is_array(merges)) return ATLAS_OK;
    j->have_merges = true;
    j->merges = malloc((json_array_size(merges) + 1) * sizeof *j->merges);
    if (!j->merges) return atlas_fail(ATLAS_ERR_NOMEM, "merges");
    for (size_t i = 0; i < json_array_size(merges); i++) {
        json_t *m = json_array_get(merges, i), *a = json_array_get(m, 0), *b = json_array_get(m, 1);
        tok_json_merge *o = &j->merges[j->n_merges++];
        if (json_is_string(m)) {
            char *s = (char *)json_string_value(m), *sp = strchr(s, ' ');
            *o = (tok_json_merge){s, NULL, (uint32_t)json_string_length(m), 0};
            if (sp && !strchr(sp + 1, ' '))
                *o = (tok_json_merge){s, sp + 1, (uint32_t)(sp - s), (uint32_t)strlen(sp + 1)};
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(a) && json_is_string(b)) {
            *o = (tok_json_merge){(char *)json_string_value(a), (char *)json_string_value(b),
                                  (uint32_t)json_string_length(a), (uint32_t)json_string_length(b)};
        } else {
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"]",
                              L->file, i);
        }
    }
    return ATLAS_OK;
}

/* *buf holds the file (vocab and merges strings point into it) until the load ends. */
static atlas_status read_tokenizer_json(loader *L, json_t **root, char **buf) {
    size_t len;
    json_error_t err;
    ATLAS_TRY(atlas_file_read(L->file, buf, &len));
    if (tok_bigjson_parse(*buf, len, &L->big) == ATLAS_OK) {
        *root = json_loadb(L->big.rest, L->big.rest_len, JSON_ALLOW_NUL, &err);
        if (!*root)
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: %s (outside model.vocab and model.merges)",
                              L->file, err.text);
        return ATLAS_OK;
    }
    free(*buf); /* partly decoded in place: parse a fresh copy for a precise error */
    *buf = NULL;
    ATLAS_TRY(load_json(L->file, 0, root));
    return big_from_dom(L, *root);
}

/* add_bos_token / add_eos_token (DeepSeek-V3 and other LlamaTokenizerFast checkpoints):
 * transformers adds the BOS/EOS itself when tokenizer.json's post-processor does not. */
static atlas_status config_add_bos_eos(loader *L, json_t *cfg, const char *cfg_file) {
    atlas_tokenizer *tok = L->tok;
    static const char *const keys[] = {"add_bos_token", "add_eos_token"};
    for (int k = 0; k < 2; k++) {
        json_t *v = json_object_get(cfg, keys[k]);
        if (!json_is_true(v)) continue;
        int32_t id = k == 0 ? tok->bos_id : tok->eos_id;
        if (id < 0)
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: %s is true but there is no %s", cfg_file,
                              keys[k], k == 0 ? "bos_token" : "eos_token");
        int32_t **arr = k == 0 ? &tok->prefix : &tok->suffix;
        size_t *n = k == 0 ? &tok->n_prefix : &tok->n_suffix;
        if (*n > 0) continue; /* the post-processor already adds special tokens there */
        *arr = malloc(sizeof **arr);
        if (!*arr) return atlas_fail(ATLAS_ERR_NOMEM, "post-processor");
        (*arr)[0] = id;
        *n = 1;
    }
    return ATLAS_OK;
}

/* ---- putting it together ------------------------------------------------------------------ */

static atlas_status size_tables(loader *L) {
    atlas_tokenizer *tok = L->tok;
    size_t max_id = 0, bytes = 0;
    for (size_t i = 0; i < L->big.n_vocab; i++) {
        if ((size_t)L->big.vocab[i].id + 1 > max_id) max_id = (size_t)L->big.vocab[i].id + 1;
        bytes += 2 * ((size_t)L->big.vocab[i].len + 1);
    }
    for (size_t i = 0; i < tok->n_added; i++) {
        if ((size_t)tok->added[i].id + 1 > max_id) max_id = (size_t)tok->added[i].id + 1;
        bytes += 2 * (tok->added[i].len + 1);
    }
    tok->n_tokens = tok->vocab_size = max_id;
    tok->tok_off = calloc(max_id ? max_id : 1, sizeof *tok->tok_off);
    tok->tok_len = calloc(max_id ? max_id : 1, sizeof *tok->tok_len);
    tok->tok_flags = calloc(max_id ? max_id : 1, 1);
    tok->arena_cap = bytes + 1;
    tok->arena = malloc(tok->arena_cap);
    if (!tok->tok_off || !tok->tok_len || !tok->tok_flags || !tok->arena)
        return atlas_fail(ATLAS_ERR_NOMEM, "tokenizer: tables for %zu tokens", max_id);
    size_t n = L->big.n_vocab + tok->n_added;
    ATLAS_TRY(tok_strmap_init(&tok->by_str, n));
    tok->wcache = aligned_alloc(64, TOK_WCACHE_SLOTS * sizeof *tok->wcache);
    if (!tok->wcache) return atlas_fail(ATLAS_ERR_NOMEM, "tokenizer: word cache");
    memset(tok->wcache, 0, TOK_WCACHE_SLOTS * sizeof *tok->wcache);
    ATLAS_TRY(tok_strmap_init(&tok->by_bytes, n));
    return ATLAS_OK;
}

/* The added tokens' ids, flags, strings and the two tries that find them in text. */
static atlas_status setup_added(loader *L) {
    atlas_tokenizer *tok = L->tok;
    for (size_t i = 0; i < tok->n_added; i++) {
        tok_added *a = &tok->added[i];
        bool pure;
        const char *str;
        ATLAS_TRY(set_token(L, a->id, a->content, a->len, &pure, &str));
        tok->tok_flags[a->id] |= TOK_ADDED | (a->special ? TOK_SPECIAL : 0);
        ATLAS_TRY(tok_strmap_put(&tok->by_str, str, a->len, a->id));
        if (a->normalized) {
            ATLAS_TRY(tok_normalize(tok, a->content, a->len, &a->match, &a->match_len));
            if (!a->match) a->match_len = a->len;
        }
        const char *m = a->match ? a->match : a->content;
        ATLAS_TRY(tok_trie_add(a->normalized ? &tok->trie_norm : &tok->trie_raw, m,
                               a->match ? a->match_len : a->len, (int32_t)i));
    }
    return ATLAS_OK;
}

static atlas_status load_all(loader *L, json_t *root, json_t *cfg, const char *cfg_file) {
    atlas_tokenizer *tok = L->tok;
    if (!json_is_object(root))
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: expected a JSON object", L->file);
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model))
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: model: expected an object", L->file);
    ATLAS_TRY(check_model_options(L, model));
    ATLAS_TRY(parse_decoder(L, json_object_get(root, "decoder"), "decoder"));
    ATLAS_TRY(parse_added(L, json_object_get(root, "added_tokens")));
    if (cfg) ATLAS_TRY(config_added(L, cfg, cfg_file));
    ATLAS_TRY(size_tables(L));
    ATLAS_TRY(parse_vocab(L));
    ATLAS_TRY(parse_merges(L));
    for (int b = 0; b < 256; b++) {
        char c = (char)b, hex[8];
        tok->byte_id[b] = tok->spm ? (b < 0x80 ? tok_strmap_get(&tok->by_str, &c, 1) : -1)
                                   : tok_strmap_get(&tok->by_bytes, &c, 1);
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        tok->fallback_id[b] = tok->byte_fallback ? tok_strmap_get(&tok->by_str, hex, 6) : -1;
    }
    tok->unk_id = L->unk ? tok_strmap_get(&tok->by_str, L->unk, strlen(L->unk)) : -1;
    if (L->unk && tok->unk_id < 0)
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: model.unk_token '%s' is not in the vocab",
                          L->file, L->unk);
    ATLAS_TRY(parse_normalizer(L, json_object_get(root, "normalizer"), "normalizer"));
    bool bytelevel = false;
    ATLAS_TRY(parse_pretok(L, json_object_get(root, "pre_tokenizer"), "pre_tokenizer", &bytelevel));
    if (!bytelevel && !tok->spm)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED,
                          "%s: pre_tokenizer: no ByteLevel step, and the decoder is not "
                          "SentencePiece's (byte-level BPE or SentencePiece-style BPE are "
                          "supported)", L->file);
    if (bytelevel && tok->spm)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: a ByteLevel pre-tokenizer with a "
                          "SentencePiece-style decoder", L->file);
    ATLAS_TRY(parse_post(L, json_object_get(root, "post_processor"), "post_processor"));
    ATLAS_TRY(setup_added(L));
    if (cfg) {
        ATLAS_TRY(config_special(L, cfg, cfg_file, "bos_token", &tok->bos_token, &tok->bos_id));
        ATLAS_TRY(config_special(L, cfg, cfg_file, "eos_token", &tok->eos_token, &tok->eos_id));
        ATLAS_TRY(config_add_bos_eos(L, cfg, cfg_file));
    }
    if (tok->bos_id < 0 && tok->n_prefix > 0) { /* the BOS the post-processor adds */
        const char *b;
        size_t bl;
        tok->bos_id = tok->prefix[0];
        if (atlas_tokenizer_token_bytes(tok, tok->bos_id, &b, &bl) == ATLAS_OK) {
            tok->bos_token = strndup(b, bl);
            if (!tok->bos_token) return atlas_fail(ATLAS_ERR_NOMEM, "bos token");
        }
    }
    for (size_t i = 0; i < tok->n_prefix + tok->n_suffix; i++) {
        int32_t id = i < tok->n_prefix ? tok->prefix[i] : tok->suffix[i - tok->n_prefix];
        if ((size_t)id >= tok->n_tokens)
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: post_processor: special token id %d is not in the vocab",
                              L->file, (int)id);
    }
    return ATLAS_OK;
}

atlas_status atlas_tokenizer_load_files(const char *tokenizer_json, const char *config_json,
                                        atlas_tokenizer **out) {
    *out = NULL;
    json_t *root = NULL, *cfg = NULL;
    char *buf = NULL;
    loader L = {NULL, tokenizer_json, {0}, NULL};
    atlas_status st = read_tokenizer_json(&L, &root, &buf);
    if (st == ATLAS_OK && config_json) {
        /* model_max_length can be 1e30 written as an integer */
        st = load_json(config_json, JSON_DECODE_INT_AS_REAL, &cfg);
        if (st == ATLAS_OK && !json_is_object(cfg))
            st = atlas_fail(ATLAS_ERR_FORMAT, "%s: expected a JSON object", config_json);
    }
    atlas_tokenizer *tok = calloc(1, sizeof *tok);
    if (st == ATLAS_OK && !tok) st = atlas_fail(ATLAS_ERR_NOMEM, "tokenizer");
    if (st == ATLAS_OK) {
        tok->bos_id = tok->eos_id = -1;
        L.tok = tok;
        st = load_all(&L, root, cfg, config_json);
    }
    tok_bigjson_free(&L.big);
    free(buf);
    json_decref(root);
    json_decref(cfg);
    if (st != ATLAS_OK) {
        atlas_tokenizer_free(tok);
        return st;
    }
    *out = tok;
    return ATLAS_OK;
}

atlas_status atlas_tokenizer_load(const char *dir, atlas_tokenizer **out) {
    char tj[4096], cj[4096];
    *out = NULL;
    ATLAS_TRY(atlas_path_join(tj, sizeof tj, dir, "tokenizer.json"));
    ATLAS_TRY(atlas_path_join(cj, sizeof cj, dir, "tokenizer_config.json"));
    return atlas_tokenizer_load_files(tj, atlas_file_exists(cj) ? cj : NULL, out);
}

void atlas_tokenizer_free(atlas_tokenizer *tok) {
    if (!tok) return;
    free(tok->tok_off);
    free(tok->tok_len);
    free(tok->tok_flags);
    free(tok->arena);
    free(tok->wcache);
    tok_strmap_free(&tok->by_bytes);
    tok_strmap_free(&tok->by_str);
    tok_mergemap_free(&tok->merges);
    for (size_t i = 0; i < tok->n_norms; i++) free(tok->norms[i].a), free(tok->norms[i].b);
    free(tok->norms);
    for (size_t i = 0; i < tok->n_pretoks; i++) pcre2_code_free(tok->pretoks[i].re);
    free(tok->pretoks);
    for (size_t i = 0; i < tok->n_added; i++) free(tok->added[i].content), free(tok->added[i].match);
    free(tok->added);
    tok_trie_free(&tok->trie_raw);
    tok_trie_free(&tok->trie_norm);
    free(tok->prefix);
    free(tok->suffix);
    free(tok->bos_token);
    free(tok->eos_token);
    free(tok);
}

/* ---- small accessors --------------------------------------------------------------------- */

atlas_status atlas_tokenizer_set_vocab_size(atlas_tokenizer *tok, size_t vocab_size) {
    if (vocab_size < 1 || vocab_size > INT32_MAX)
        return atlas_fail(ATLAS_ERR_RANGE, "tokenizer: vocab_size %zu out of range", vocab_size);
    tok->vocab_size = vocab_size;
    return ATLAS_OK;
}

int32_t atlas_tokenizer_token_id(const atlas_tokenizer *tok, const char *token) {
    return tok_strmap_get(&tok->by_str, token, strlen(token));
}

size_t atlas_tokenizer_n_tokens(const atlas_tokenizer *tok) { return tok->n_tokens; }
size_t atlas_tokenizer_vocab_size(const atlas_tokenizer *tok) { return tok->vocab_size; }
int32_t atlas_tokenizer_bos_id(const atlas_tokenizer *tok) { return tok->bos_id; }
int32_t atlas_tokenizer_eos_id(const atlas_tokenizer *tok) { return tok->eos_id; }
const char *atlas_tokenizer_bos_token(const atlas_tokenizer *tok) { return tok->bos_token; }
const char *atlas_tokenizer_eos_token(const atlas_tokenizer *tok) { return tok->eos_token; }

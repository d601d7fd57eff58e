/* tokenizer/encode.c — the encoding pipeline (see tokenizer_internal.h), the top of it:
 * added tokens, normalizers and pre-tokenizers are pretok.c's, BPE and the per-call state
 * bpe.c's.  Each call owns its tok_ctx; the only shared mutable state is the word cache
 * (bpe.c), whose slots are try-locked. */
#include <stdlib.h>

#include "core/error.h"
#include "tokenizer/tokenizer_internal.h"

/* A segment of normalized text with no added token in it: pre-tokenize, then BPE. */
static atlas_status encode_plain(tok_ctx *c, const char *s, size_t len) {
    return tok_pretokenize(c, 0, s, len);
}

static atlas_status on_normalized_segment(tok_ctx *c, const char *s, size_t len, int32_t added,
                                          void *user) {
    (void)user;
    if (added >= 0) return tok_ctx_push_id(c, c->tok->added[added].id);
    c->at_start = c->raw_at_start && s == c->norm0;
    return encode_plain(c, s, len);
}

/* Whether raw bytes [at, at + len) overlap a plain range. */
static bool overlaps_plain(const tok_ctx *c, size_t at, size_t len) {
    for (size_t i = 0; i < c->n_plain; i++)
        if (c->plain[i].start < at + len && at < c->plain[i].end) return true;
    return false;
}

static atlas_status on_raw_segment(tok_ctx *c, const char *s, size_t len, int32_t added,
                                   void *user) {
    const atlas_tokenizer *tok = c->tok;
    if (added >= 0) return tok_ctx_push_id(c, tok->added[added].id);
    if (len == 0) return ATLAS_OK;
    c->seg_plain = c->n_plain && overlaps_plain(c, (size_t)(s - c->raw0), len);
    char *norm = NULL;
    size_t norm_len = len;
    ATLAS_TRY(tok_normalize(tok, s, len, &norm, &norm_len));
    const char *t = norm ? norm : s;
    atlas_status st;
    c->raw_at_start = c->at_start = s == c->raw0;
    c->norm0 = t;
    if (tok->trie_norm.nodes)
        st = tok_split_added(c, &tok->trie_norm, t, norm_len, on_normalized_segment, user);
    else
        st = encode_plain(c, t, norm_len);
    free(norm);
    return st;
}

atlas_status atlas_tokenizer_encode(const atlas_tokenizer *tok, const char *text, size_t len,
                                    bool add_special, int32_t **ids, size_t *n_ids) {
    return atlas_tokenizer_encode_ranges(tok, text, len, add_special, NULL, 0, ids, n_ids);
}

atlas_status atlas_tokenizer_encode_ranges(const atlas_tokenizer *tok, const char *text,
                                           size_t len, bool add_special,
                                           const atlas_text_range *plain, size_t n_plain,
                                           int32_t **ids, size_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    for (size_t i = 0; i < n_plain; i++)
        if (plain[i].start > plain[i].end || plain[i].end > len ||
            (i && plain[i].start < plain[i - 1].end))
            return atlas_fail(ATLAS_ERR_INVALID, "encode: plain range %zu [%zu, %zu) of %zu "
                              "bytes: want sorted, disjoint ranges inside the text", i,
                              plain[i].start, plain[i].end, len);
    if (!text && len) return atlas_fail(ATLAS_ERR_INVALID, "encode: text is NULL");
    if (len > UINT32_MAX / 2) return atlas_fail(ATLAS_ERR_RANGE, "encode: %zu bytes of text", len);
    size_t bad = tok_utf8_validate(text, len);
    if (bad != len) return atlas_fail(ATLAS_ERR_INVALID, "encode: invalid UTF-8 at byte %zu", bad);
    tok_ctx c;
    tok_ctx_init(&c, tok);
    c.raw0 = text;
    c.plain = plain;
    c.n_plain = n_plain;
    atlas_status st = ATLAS_OK;
    for (size_t i = 0; add_special && st == ATLAS_OK && i < tok->n_prefix; i++)
        st = tok_ctx_push_id(&c, tok->prefix[i]);
    if (st == ATLAS_OK && len)
        st = tok_split_added(&c, &tok->trie_raw, text, len, on_raw_segment, NULL);
    for (size_t i = 0; add_special && st == ATLAS_OK && i < tok->n_suffix; i++)
        st = tok_ctx_push_id(&c, tok->suffix[i]);
    tok_ctx_free(&c);
    if (st != ATLAS_OK) {
        free(c.ids);
        return atlas_fail_wrap(st, "encode");
    }
    *ids = c.ids;
    *n_ids = c.n_ids;
    return ATLAS_OK;
}

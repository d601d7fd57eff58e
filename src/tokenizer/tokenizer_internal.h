/* tokenizer/tokenizer_internal.h — the loaded tokenizer and the pieces of its pipeline.
 * Internal to src/tokenizer/ (load.c, bigjson.c, bpe.c, pretok.c, encode.c, decode.c).
 *
 * Encoding, as Hugging Face tokenizers does it:
 *   text -> split on added tokens matched on the raw text (normalized: false)
 *        -> normalize each remaining segment -> split on added tokens matched on the
 *           normalized text (normalized: true)
 *        -> pre-tokenize each segment into words (Split regex, ByteLevel)
 *        -> BPE each word -> post-process (TemplateProcessing adds BOS/EOS).
 * Words stay raw bytes throughout: the vocabulary's byte-level strings ("Ġhello") are
 * mapped back to bytes (" hello") at load, so the byte-level step costs nothing. */
#ifndef ATLAS_TOKENIZER_INTERNAL_H
#define ATLAS_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "atlas/tokenizer.h"

/* ---- hash maps --------------------------------------------------------------------------- */

/* Bytes -> int32 id, open addressing with linear probing; keys point into memory owned by
 * someone else.  A slot holds the key's pointer, length and value, so a lookup touches one
 * slot line and, on a length match, the key's bytes. */
typedef struct tok_strmap_slot {
    const char *key; /* NULL: empty */
    uint32_t len;
    int32_t val;
} tok_strmap_slot;

typedef struct tok_strmap {
    tok_strmap_slot *slots;
    size_t cap, n; /* cap is a power of two */
} tok_strmap;

atlas_status tok_strmap_init(tok_strmap *m, size_t expected);
void tok_strmap_free(tok_strmap *m);
/* Inserts or overwrites (the key's memory must outlive the map). */
atlas_status tok_strmap_put(tok_strmap *m, const char *key, size_t len, int32_t val);
int32_t tok_strmap_get(const tok_strmap *m, const char *key, size_t len); /* -1 absent */

/* (left id, right id) -> (rank, merged id). */
typedef struct tok_merge {
    uint64_t key; /* left << 32 | right; UINT64_MAX = empty */
    uint32_t rank;
    int32_t id;
} tok_merge;

typedef struct tok_mergemap {
    tok_merge *slots;
    size_t cap, n;
} tok_mergemap;

uint64_t tok_hash_bytes(const void *p, size_t len);

/* ---- pipeline components ----------------------------------------------------------------- */

typedef enum tok_norm_kind {
    TOK_NORM_NFC,
    TOK_NORM_NFD,
    TOK_NORM_NFKC,
    TOK_NORM_NFKD,
    TOK_NORM_LOWERCASE,
    TOK_NORM_PREPEND,
    TOK_NORM_REPLACE, /* literal string pattern */
} tok_norm_kind;

typedef struct tok_norm {
    tok_norm_kind kind;
    char *a, *b; /* PREPEND: a = prefix; REPLACE: a = pattern, b = content */
    size_t a_len, b_len;
} tok_norm;

typedef enum tok_split_behavior {
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_MERGED_WITH_PREVIOUS,
    TOK_SPLIT_MERGED_WITH_NEXT,
    TOK_SPLIT_CONTIGUOUS,
} tok_split_behavior;

typedef enum tok_pretok_kind { TOK_PRE_SPLIT, TOK_PRE_BYTELEVEL, TOK_PRE_METASPACE } tok_pretok_kind;

/* Metaspace's prepend_scheme: never, only where the text begins, or every segment. */
typedef enum tok_prepend { TOK_PREPEND_NEVER, TOK_PREPEND_FIRST, TOK_PREPEND_ALWAYS } tok_prepend;

typedef struct tok_pretok {
    tok_pretok_kind kind;
    pcre2_code *re; /* SPLIT, or BYTELEVEL with use_regex (the GPT-2 pattern) */
    tok_split_behavior behavior;
    bool invert;
    bool add_prefix_space; /* BYTELEVEL */
    char rep[8];           /* METASPACE: the replacement character (UTF-8), e.g. U+2581 */
    size_t rep_len;
    tok_prepend prepend;   /* METASPACE */
    bool split;            /* METASPACE: words begin at each replacement */
} tok_pretok;

typedef struct tok_added {
    char *content; /* as written in tokenizer.json */
    size_t len;
    char *match;   /* what is searched for: content, normalized when `normalized` */
    size_t match_len;
    int32_t id;
    bool special, lstrip, rstrip, single_word, normalized;
} tok_added;

/* A byte trie over added tokens' match strings, for leftmost-longest matching. */
typedef struct tok_trie_node {
    int32_t first_child, next_sibling;
    int32_t added; /* index into tok->added, -1 if no token ends here */
    unsigned char byte;
} tok_trie_node;

typedef struct tok_trie {
    tok_trie_node *nodes; /* node 0 is the root */
    size_t n, cap;
    uint8_t first[32]; /* bitmap of the bytes that start some token */
} tok_trie;

/* ---- the word cache ---------------------------------------------------------------------- */

/* One cache line: a word (raw bytes) and its ids.  The cache is direct-mapped and shared by
 * all threads, as a seqlock per slot: readers only load (a hot word's line stays shared
 * between cores), check that the sequence number is even and unchanged, and else treat it
 * as a miss; a writer that finds the slot busy skips caching, so nobody waits.  The payload
 * is relaxed atomics, which keeps the racing reads defined in C11.  Words longer than
 * TOK_WCACHE_KEY bytes or with more than TOK_WCACHE_IDS ids are not cached. */
enum { TOK_WCACHE_KEY = 22, TOK_WCACHE_IDS = 8, TOK_WCACHE_SLOTS = 1 << 16, TOK_WCACHE_WORDS = 7 };

typedef struct tok_wcache_slot {
    _Alignas(64) _Atomic uint64_t seq; /* odd while a writer fills the slot */
    /* key_len (1 byte, 0 = empty), n_ids (1), key (22), ids (8 x int32) */
    _Atomic uint64_t data[TOK_WCACHE_WORDS];
} tok_wcache_slot;

/* ---- the tokenizer ----------------------------------------------------------------------- */

enum { TOK_HAS_STRING = 1, TOK_SPECIAL = 2, TOK_ADDED = 4, TOK_BYTE = 8 /* <0xNN> */ };

struct atlas_tokenizer {
    size_t n_tokens;   /* max id with a string + 1 */
    size_t vocab_size; /* >= n_tokens: padded ids decode to "" */
    /* per id, [n_tokens]: the token's bytes after the byte-level decoder */
    uint32_t *tok_off, *tok_len;
    uint8_t *tok_flags;
    char *arena; /* all token bytes and strings */
    size_t arena_len, arena_cap;

    tok_strmap by_bytes; /* model vocab, raw bytes -> id (entries that are byte-level) */
    tok_strmap by_str;   /* vocab strings and added tokens' contents -> id */
    tok_mergemap merges;
    int32_t byte_id[256]; /* the id of each single byte, -1 if none */
    /* SentencePiece-style BPE (Llama 2, Mistral, Gemma): the vocabulary is of characters,
     * not bytes; a word's symbols are its characters, a character without a token becomes
     * its bytes' <0xNN> tokens (byte_fallback) or the unknown token (consecutive ones fused
     * into one with fuse_unk); token strings are decoded by replacing the metaspace with a
     * space and <0xNN> with its byte, and strip_lead spaces are dropped from the start of
     * the decoded text (the Strip decoder, or Metaspace's). */
    bool spm, byte_fallback, fuse_unk;
    int32_t unk_id;
    int32_t fallback_id[256]; /* the id of <0xNN>, -1 if none */
    char spm_rep[8];          /* what the decoder turns into a space (U+2581) */
    size_t spm_rep_len;
    int strip_lead;
    bool strip_first;
    tok_wcache_slot *wcache; /* [TOK_WCACHE_SLOTS]; mutable even in a const tokenizer */
    bool ignore_merges;

    tok_norm *norms;
    size_t n_norms;
    tok_pretok *pretoks;
    size_t n_pretoks;

    tok_added *added;
    size_t n_added;
    tok_trie trie_raw;  /* added tokens with normalized: false, matched on the raw text */
    tok_trie trie_norm; /* normalized: true, matched on the normalized text */

    int32_t *prefix, *suffix; /* TemplateProcessing "single" around $A, when add_special */
    size_t n_prefix, n_suffix;

    int32_t bos_id, eos_id;
    char *bos_token, *eos_token;
};

/* load.c parses JSON into the fields above; these build the lookup structures. */
atlas_status tok_mergemap_init(tok_mergemap *m, size_t expected);
void tok_mergemap_free(tok_mergemap *m);
void tok_mergemap_put(tok_mergemap *m, int32_t left, int32_t right, uint32_t rank, int32_t id);
const tok_merge *tok_mergemap_get(const tok_mergemap *m, int32_t left, int32_t right);

atlas_status tok_trie_add(tok_trie *t, const char *s, size_t len, int32_t added_index);
void tok_trie_free(tok_trie *t);

/* The GPT-2 byte <- char mapping used by ByteLevel: the byte a char stands for, or -1 if cp
 * is not one of the 256 chars. */
int tok_cp_to_byte(uint32_t cp);

/* UTF-8.  Decodes one character at s[0..n): returns its length (1..4) and sets *cp, or 0
 * when s starts with an incomplete but so far valid sequence, or -k when the first k bytes
 * are a maximal invalid subpart (to replace with one U+FFFD, as Rust's from_utf8_lossy). */
int tok_utf8_next(const unsigned char *s, size_t n, uint32_t *cp);
size_t tok_utf8_put(char *dst, uint32_t cp); /* writes 1..4 bytes */
/* Offset of the first invalid byte, or len when text is valid UTF-8. */
size_t tok_utf8_validate(const char *s, size_t len);

/* ---- bigjson.c: model.vocab and model.merges without a DOM ------------------------------- */

typedef struct tok_json_entry {
    char *p; /* decoded in place in the file's buffer; not NUL-terminated */
    uint32_t len;
    int32_t id;
} tok_json_entry;

typedef struct tok_json_merge {
    char *a, *b; /* b is NULL for a string merge without exactly one space */
    uint32_t la, lb;
} tok_json_merge;

typedef struct tok_bigjson {
    tok_json_entry *vocab;
    size_t n_vocab, cap_vocab;
    tok_json_merge *merges;
    size_t n_merges, cap_merges;
    bool have_vocab, have_merges;
    char *rest; /* the document with {} and [] in place of vocab and merges, for jansson */
    size_t rest_len;
} tok_bigjson;

/* Scans buf (modified: strings of vocab and merges are decoded in place).  Returns
 * ATLAS_ERR_FORMAT without a message when buf is not well-formed JSON (the caller then
 * parses it with jansson for a precise error). */
atlas_status tok_bigjson_parse(char *buf, size_t len, tok_bigjson *j);
void tok_bigjson_free(tok_bigjson *j);

/* ---- per-call encoding state (no locks: each encode call owns one) -------------------------- */

typedef struct tok_seg {
    uint32_t a, b; /* [a, b) in the piece being split; b - a < 4 GiB (encode checks) */
    bool match;
} tok_seg;

typedef struct tok_ctx {
    const atlas_tokenizer *tok;
    /* output */
    int32_t *ids;
    size_t n_ids, cap_ids;
    /* regex */
    pcre2_match_data *md;
    pcre2_match_context *mctx; /* only once a match needed a bigger JIT stack */
    pcre2_jit_stack *jit_stack;
    /* where the segment being encoded lies: at the start of the text (Metaspace "first") */
    const char *raw0, *norm0;
    bool raw_at_start, at_start;
    /* byte ranges of the raw text where no special added token may start
     * (atlas_tokenizer_encode_ranges), and whether the raw segment being normalized
     * overlaps one (its normalized offsets no longer map to raw ones) */
    const atlas_text_range *plain;
    size_t n_plain;
    bool seg_plain;
    /* BPE scratch, per word */
    struct tok_sym *syms;
    size_t cap_syms;
    struct tok_heap_item *heap;
    size_t cap_heap;
} tok_ctx;

/* bpe.c, the bottom of the pipeline: the state BPE appends ids to. */
void tok_ctx_init(tok_ctx *c, const atlas_tokenizer *tok);
void tok_ctx_free(tok_ctx *c); /* frees everything except c->ids */

atlas_status tok_ctx_push_id(tok_ctx *c, int32_t id);

/* bpe.c: appends the ids of one word (raw bytes) to c->ids. */
atlas_status tok_bpe_word(tok_ctx *c, const char *word, size_t len);

/* pretok.c */
/* Normalizes s[0..len) through the normalizer chain into a malloc'd buffer (NULL with
 * *out_len = len when nothing changes). */
atlas_status tok_normalize(const atlas_tokenizer *tok, const char *s, size_t len, char **out,
                           size_t *out_len);
/* Runs pre-tokenizers k.. over s[0..len) and BPE on each word they make (appending ids). */
atlas_status tok_pretokenize(tok_ctx *c, size_t k, const char *s, size_t len);
/* Finds added tokens in s[0..len) with trie t: calls fn for each plain segment and each
 * token (added index >= 0), in order. */
typedef atlas_status (*tok_segment_fn)(tok_ctx *c, const char *s, size_t len, int32_t added,
                                       void *user);
atlas_status tok_split_added(tok_ctx *c, const tok_trie *t, const char *s, size_t len,
                             tok_segment_fn fn, void *user);
pcre2_code *tok_regex_compile(const char *pattern, size_t len, bool literal, char *err,
                              size_t err_cap);

#endif

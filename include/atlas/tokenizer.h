/* atlas/tokenizer.h — Hugging Face tokenizer.json (byte-level BPE) and incremental decoding.
 *
 * Supported: BPE models with byte-level pre-tokenization (Llama 3, Qwen2/3, Mistral-Nemo,
 * DeepSeek, GPT-OSS, GPT-2 style): normalizers NFC/NFD/NFKC/NFKD/Lowercase/Prepend/
 * Replace(string)/Sequence, pre-tokenizers Split (regex or string, every behavior) /
 * ByteLevel / Digits / Sequence, added tokens (special or not, with their lstrip/rstrip/
 * single_word/normalized flags), post-processors ByteLevel / TemplateProcessing / Sequence
 * (and tokenizer_config.json's add_bos_token / add_eos_token when tokenizer.json adds
 * none), decoder ByteLevel.  Anything else fails to load with ATLAS_ERR_UNSUPPORTED naming
 * the JSON path.
 *
 * Threads: a loaded tokenizer is immutable and thread-safe: any number of threads may call
 * the functions that take a const atlas_tokenizer at once (the per-word cache is internally
 * locked); atlas_tokenizer_set_vocab_size and atlas_tokenizer_free only while no other
 * thread uses it.  A detokenizer belongs to one thread at a time.
 * Ownership: load and detok_create return objects the caller frees (atlas_tokenizer_free,
 * atlas_detok_free); encode and decode return malloc'd arrays the caller free()s; strings
 * the other getters return belong to the tokenizer (valid while it lives); arguments are
 * borrowed for the call. */
#ifndef ATLAS_TOKENIZER_H
#define ATLAS_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "atlas/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct atlas_tokenizer atlas_tokenizer;

/* Loads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json (bos_token,
 * eos_token, added-token flags).  *out is owned by the caller: atlas_tokenizer_free(). */
ATLAS_API atlas_status atlas_tokenizer_load(const char *dir, atlas_tokenizer **out);

/* The same from explicit paths; config_json may be NULL. */
ATLAS_API atlas_status atlas_tokenizer_load_files(const char *tokenizer_json,
                                                  const char *config_json, atlas_tokenizer **out);

/* Tells the tokenizer the model's vocab_size (config.json): ids in [n_tokens, vocab_size)
 * are valid and decode to "" (padded embedding rows).  Call before sharing the tokenizer
 * between threads.  Fails with ATLAS_ERR_RANGE if vocab_size < 1. */
ATLAS_API atlas_status atlas_tokenizer_set_vocab_size(atlas_tokenizer *tok, size_t vocab_size);

ATLAS_API void atlas_tokenizer_free(atlas_tokenizer *tok); /* NULL is a no-op */

/* Encodes len bytes of UTF-8 text (need not be NUL-terminated).  add_special applies the
 * post-processor's special tokens (TemplateProcessing BOS/EOS); special added tokens in the
 * text ("<|eot_id|>") are always matched as such, as HF tokenizers does.  *ids is malloc'd,
 * the caller free()s it (it may be NULL when *n_ids is 0).  Invalid UTF-8 fails with
 * ATLAS_ERR_INVALID naming the byte offset. */
ATLAS_API atlas_status atlas_tokenizer_encode(const atlas_tokenizer *tok, const char *text,
                                              size_t len, bool add_special, int32_t **ids,
                                              size_t *n_ids);

/* A byte range [start, end) of a text. */
typedef struct atlas_text_range {
    size_t start, end;
} atlas_text_range;

/* As atlas_tokenizer_encode, but a special added token whose match would start inside one
 * of the ranges (sorted by start, not overlapping) is not matched there: those bytes are
 * tokenized as plain text, as HF tokenizers does with split_special_tokens. For text a
 * client wrote, which must not become control tokens (atlas/shield.h). Threads and
 * ownership as atlas_tokenizer_encode; ranges are borrowed for the call. */
ATLAS_API atlas_status atlas_tokenizer_encode_ranges(const atlas_tokenizer *tok, const char *text,
                                                     size_t len, bool add_special,
                                                     const atlas_text_range *plain,
                                                     size_t n_plain, int32_t **ids,
                                                     size_t *n_ids);

/* The tokenizer's added tokens (tokenizer.json "added_tokens"), in file order: their count,
 * and the i-th's text as written (the tokenizer's, valid while it is), its id and whether it
 * is special. ATLAS_ERR_RANGE for i >= the count. Any thread. */
ATLAS_API size_t atlas_tokenizer_added_count(const atlas_tokenizer *tok);
ATLAS_API atlas_status atlas_tokenizer_added_token(const atlas_tokenizer *tok, size_t i,
                                                   const char **text, size_t *len,
                                                   int32_t *id, bool *special);

/* Decodes ids to text (NUL-terminated; *len excludes the NUL; the caller free()s *text).
 * skip_special drops special tokens.  Byte sequences that are not valid UTF-8 become
 * U+FFFD, like HF's decode.  Ids out of range fail with ATLAS_ERR_RANGE. */
ATLAS_API atlas_status atlas_tokenizer_decode(const atlas_tokenizer *tok, const int32_t *ids,
                                              size_t n, bool skip_special, char **text,
                                              size_t *len);

/* The token's own bytes (after the byte-level decoder; not necessarily valid UTF-8); ""
 * for padded ids without a string.  ATLAS_ERR_RANGE for id < 0 or id >= the vocab size
 * (set_vocab_size, else n_tokens).  *bytes lives as long as the tokenizer. */
ATLAS_API atlas_status atlas_tokenizer_token_bytes(const atlas_tokenizer *tok, int32_t id,
                                                   const char **bytes, size_t *len);

/* The id of a token by its vocabulary string (byte-level form, e.g. "Ġhello", or an added
 * token's content, e.g. "<|eot_id|>"); -1 when absent. */
ATLAS_API int32_t atlas_tokenizer_token_id(const atlas_tokenizer *tok, const char *token);

/* The max id with a string + 1; the vocab size (set_vocab_size, else n_tokens). */
ATLAS_API size_t atlas_tokenizer_n_tokens(const atlas_tokenizer *tok);
ATLAS_API size_t atlas_tokenizer_vocab_size(const atlas_tokenizer *tok);

ATLAS_API int32_t atlas_tokenizer_bos_id(const atlas_tokenizer *tok);        /* -1 when none */
ATLAS_API int32_t atlas_tokenizer_eos_id(const atlas_tokenizer *tok);        /* -1 when none */
/* The tokens' strings, the tokenizer's (valid while it lives); NULL when none. */
ATLAS_API const char *atlas_tokenizer_bos_token(const atlas_tokenizer *tok);
ATLAS_API const char *atlas_tokenizer_eos_token(const atlas_tokenizer *tok);

/* True for added tokens marked "special" (false for out-of-range ids). */
ATLAS_API bool atlas_tokenizer_is_special(const atlas_tokenizer *tok, int32_t id);

/* Incremental decoding, for streaming: each pushed token yields the text it completes,
 * never a broken UTF-8 sequence (bytes of an incomplete character wait for the next
 * token).  Invalid sequences become U+FFFD as soon as they are known to be invalid.
 * The concatenation of all pieces plus flush equals atlas_tokenizer_decode of all ids. */
typedef struct atlas_detok atlas_detok;

/* A detokenizer in *out, the caller's (atlas_detok_free); tok is borrowed and must outlive
 * it. */
ATLAS_API atlas_status atlas_detok_create(const atlas_tokenizer *tok, bool skip_special,
                                          atlas_detok **out);
/* *text (maybe "" with *len 0) is valid until the next call on d. */
ATLAS_API atlas_status atlas_detok_push(atlas_detok *d, int32_t id, const char **text, size_t *len);
/* Leftover bytes of an incomplete character, as U+FFFD; then d starts afresh. */
ATLAS_API atlas_status atlas_detok_flush(atlas_detok *d, const char **text, size_t *len);
ATLAS_API void atlas_detok_free(atlas_detok *d); /* NULL is a no-op */

#ifdef __cplusplus
}
#endif
#endif

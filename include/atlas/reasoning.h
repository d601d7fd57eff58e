/* atlas/reasoning.h — splitting a thinking model's "<think>...</think>" out of the reply, as
 * llama.cpp's server (--reasoning-format auto) and vLLM's reasoning parsers do: the chat API
 * answers it as "reasoning_content" beside "content".
 *
 * The reply either opens with "<think>" (Qwen3 with thinking on, after optional whitespace),
 * or starts inside the block because the template already wrote "<think>" at the end of the
 * prompt (DeepSeek-R1, Qwen3 thinking-only models).  Whitespace just inside the tags and
 * just after "</think>" is dropped.  A block never closed (max_tokens reached) is all
 * reasoning.  Text that does not open with "<think>" is plain content, untouched.
 *
 * Streaming: feed pieces as they are decoded; text that may still be the start of a tag,
 * or whitespace that may come just before one, is held back until it can be told.
 *
 * Threads: a splitter belongs to one thread at a time (one per reply); the two checks at
 * the end keep no state and may be called from any thread. */
#ifndef ATLAS_REASONING_H
#define ATLAS_REASONING_H

#include <stdbool.h>
#include <stddef.h>

#include "atlas/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct atlas_reasoning atlas_reasoning;

/* A new splitter in *out (the caller owns it; free with atlas_reasoning_free). inside: the
 * prompt already opened the block (atlas_reasoning_prompt_open). Thread-safe. */
ATLAS_API atlas_status atlas_reasoning_new(bool inside, atlas_reasoning **out);

/* Frees r and what it holds back; NULL is a no-op. Not while another thread feeds r. */
ATLAS_API void atlas_reasoning_free(atlas_reasoning *r);

/* Feeds len bytes of piece (borrowed for the call; end: the last piece, then everything
 * held is released). Sets *reasoning and *content to what can be released now (malloc'd,
 * NUL-terminated, possibly ""; the caller frees both; both NULL on error). One thread at a
 * time per splitter. */
ATLAS_API atlas_status atlas_reasoning_feed(atlas_reasoning *r, const char *piece, size_t len,
                                            bool end, char **reasoning, char **content);

/* Whether a chat template writes thinking blocks (its source, borrowed, mentions "<think>";
 * NULL: false). Pure: any thread. */
ATLAS_API bool atlas_reasoning_template_thinks(const char *template_source);

/* Whether a rendered prompt (borrowed; NULL: false) ends inside an open block: its last tag
 * is "<think>", followed by whitespace only. Pure: any thread. */
ATLAS_API bool atlas_reasoning_prompt_open(const char *prompt);

#ifdef __cplusplus
}
#endif
#endif

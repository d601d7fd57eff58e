/* atlas/harmony.h — gpt-oss's Harmony chat format, read back from the generated token ids.
 *
 * A Harmony reply is a run of messages, each `<|start|>HEADER<|message|>BODY` and an end
 * token: `<|end|>` (another message may follow), `<|call|>` (a tool call: the reply stops
 * there) or `<|return|>` (the reply is done).  The header is the role ("assistant"), then
 * `<|channel|>NAME`, a recipient `to=functions.NAME` (before or after the channel) and an
 * optional `<|constrain|>json`.  The markers are special tokens, which the detokenizer drops,
 * so this parser reads ids, and decodes the text of the other tokens itself.  Bodies go:
 *   channel analysis                       -> reasoning (OpenAI's reasoning_content);
 *   channel final                          -> content;
 *   channel commentary, to=functions.NAME  -> a tool call {name NAME, arguments BODY},
 *                                             complete at `<|call|>` (or `<|end|>`);
 *   commentary without a recipient (a preamble to the user), no channel or one unknown
 *                                          -> content;
 *   a recipient outside functions (a built-in tool such as browser or python, which atlas
 *   does not run)                          -> reasoning, never a call.
 * Arguments that are not one JSON value, or a call the reply left open (max_tokens), go back
 * as content, as atlas/toolcall.h gives back a malformed call.  Text outside any message and
 * markers out of place are taken as they come (a stray `<|message|>` or `<|constrain|>` in a
 * body is ignored; `<|start|>` or `<|channel|>` there ends the message): nothing is an error.
 *
 * The prompt sets where the reply starts: a template that ends with `<|start|>assistant`
 * (gpt-oss's) leaves the parser in a header, one that ends with
 * `<|start|>assistant<|channel|>final<|message|>` in the final body.
 *
 * Text is released only up to a byte count the caller gives (the text the engine released
 * so far, after its stop strings): what the engine holds back, this holds back too, and a
 * stop string cuts the reply at the same byte.
 *
 * Threads: a parser belongs to one thread at a time (one per reply); atlas_harmony_supported
 * may be called from any thread.  Ownership: text is returned malloc'd, calls are appended
 * to the caller's jansson array; the tokenizer is borrowed and must outlive the parser. */
#ifndef ATLAS_HARMONY_H
#define ATLAS_HARMONY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "atlas/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct json_t; /* jansson's */
typedef struct atlas_tokenizer atlas_tokenizer;
typedef struct atlas_harmony atlas_harmony;

/* Whether a chat template (its source, borrowed; NULL: false) writes Harmony: it has both
 * "<|channel|>" and "<|message|>".  Pure: any thread. */
ATLAS_API bool atlas_harmony_template(const char *template_source);

/* Whether tok has the Harmony markers (<|start|>, <|end|>, <|message|>, <|channel|>,
 * <|call|>, <|return|>; <|constrain|> is optional).  Pure: any thread. */
ATLAS_API bool atlas_harmony_supported(const atlas_tokenizer *tok);

/* The ids that end a Harmony reply, <|call|> and <|return|>, in ids[0..2) (*n: how many the
 * tokenizer has, 0 to 2).  Pure: any thread. */
ATLAS_API void atlas_harmony_stop_ids(const atlas_tokenizer *tok, int32_t ids[2], int *n);

/* A parser in *out (the caller's; atlas_harmony_free) for a reply to prompt[0..n_prompt)
 * (borrowed for the call; NULL with 0 for none).  ATLAS_ERR_NOT_FOUND naming the first
 * marker tok lacks. */
ATLAS_API atlas_status atlas_harmony_new(const atlas_tokenizer *tok, const int32_t *prompt,
                                         size_t n_prompt, atlas_harmony **out);
ATLAS_API void atlas_harmony_free(atlas_harmony *h); /* NULL is a no-op */

/* One generated token.  released: the bytes of text (special tokens left out) the caller
 * may show so far, counted from the start of the reply.  Sets *reasoning and *content to
 * what can be released now (malloc'd, NUL-terminated, possibly ""; the caller frees both;
 * both NULL on error) and appends each completed call to calls (OpenAI's shape: {"id",
 * "type": "function", "function": {"name", "arguments": "<JSON text>"}}). */
ATLAS_API atlas_status atlas_harmony_feed(atlas_harmony *h, int32_t id, size_t released,
                                          char **reasoning, char **content,
                                          struct json_t *calls);

/* The end of the reply: releases what is held up to released and closes what is open (a
 * call never closed is content).  Same outputs as feed.  Feed nothing after it. */
ATLAS_API atlas_status atlas_harmony_finish(atlas_harmony *h, size_t released,
                                            char **reasoning, char **content,
                                            struct json_t *calls);

#ifdef __cplusplus
}
#endif
#endif

/* atlas/toolcall.h — finding tool calls in generated text, also while it streams.
 *
 * Formats:
 *   HERMES  (Qwen 2.5/3, Hermes, ...): <tool_call>{"name": N, "arguments": {...}}</tool_call>,
 *           anywhere in the text, any number of them;
 *   LLAMA3  (Llama 3.1-3.3): the whole reply is JSON {"name": N, "parameters": {...}} (or
 *           "arguments"), possibly after <|python_tag|>; several joined by ';' or newlines;
 *   MISTRAL: [TOOL_CALLS][{"name": N, "arguments": {...}}, ...], or the newer
 *           [TOOL_CALLS]N[ARGS]{...} form;
 *   HARMONY (gpt-oss): calls on the commentary channel to=functions.N, ending at <|call|>.
 *           Its markers are special tokens the text leaves out, so it is read from token
 *           ids by atlas/harmony.h; the text parser below refuses it.
 * Each completed call becomes an OpenAI tool call:
 *   {"id": "call_...", "type": "function", "function": {"name": N, "arguments": "<JSON text>"}}
 * A malformed call (bad JSON, no name) is given back as plain text, never an error.
 *
 * Streaming: feed pieces as they are decoded; the parser releases plain text at once except
 * what may still be the start of a tool call, which it holds until it can tell.
 *
 * Threads: a parser belongs to one thread at a time (one per reply); the other functions
 * keep no state and may be called from any thread.  Ownership: text is returned malloc'd
 * (the caller frees it), calls are appended to the caller's jansson array or returned as a
 * new one (the caller decrefs it); inputs are borrowed for the call. */
#ifndef ATLAS_TOOLCALL_H
#define ATLAS_TOOLCALL_H

#include <stddef.h>

#include "atlas/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct json_t; /* jansson's */

typedef enum atlas_toolcall_format {
    ATLAS_TOOLCALL_NONE = 0, /* no tool calls: everything is text */
    ATLAS_TOOLCALL_HERMES,
    ATLAS_TOOLCALL_LLAMA3,
    ATLAS_TOOLCALL_MISTRAL,
    ATLAS_TOOLCALL_HARMONY,
} atlas_toolcall_format;

/* Chooses the format from a chat template's source text (e.g. it mentions "<tool_call>", or
 * Harmony's "<|channel|>"), else from a model family / architecture name ("qwen3",
 * "LlamaForCausalLM", "mistral", "GptOssForCausalLM"),
 * either may be NULL. ATLAS_TOOLCALL_NONE when nothing matches. */
ATLAS_API atlas_toolcall_format atlas_toolcall_format_detect(const char *template_source,
                                                             const char *family);
/* "hermes", "llama3", ...: a static string. */
ATLAS_API const char *atlas_toolcall_format_name(atlas_toolcall_format format);

/* The names atlas_toolcall_format_parse knows, comma-separated: "hermes, llama3, mistral,
 * harmony, none" (a static string, for usage messages). */
ATLAS_API const char *atlas_toolcall_format_names(void);

/* The format named name (as atlas_toolcall_format_name spells it) in *out;
 * ATLAS_ERR_INVALID naming it and the known names otherwise. */
ATLAS_API atlas_status atlas_toolcall_format_parse(const char *name, atlas_toolcall_format *out);

typedef struct atlas_toolcall_parser atlas_toolcall_parser;

/* A streaming parser in *out, the caller's until atlas_toolcall_parser_free.  HARMONY is
 * ATLAS_ERR_INVALID (atlas/harmony.h reads it from token ids). */
ATLAS_API atlas_status atlas_toolcall_parser_new(atlas_toolcall_format format,
                                                 atlas_toolcall_parser **out);
ATLAS_API void atlas_toolcall_parser_free(atlas_toolcall_parser *p); /* NULL is a no-op */

/* Feeds len bytes of generated text. Sets *text to the plain text that can be released now
 * (malloc'd, NUL-terminated, possibly ""; the caller frees it) and appends each completed
 * call to calls (a jansson array owned by the caller). */
ATLAS_API atlas_status atlas_toolcall_parser_feed(atlas_toolcall_parser *p, const char *piece,
                                                  size_t len, char **text, struct json_t *calls);

/* End of generation: releases everything held back (a call left open is text) and any
 * call completed by the end. Same outputs as feed. The parser can then be freed. */
ATLAS_API atlas_status atlas_toolcall_parser_finish(atlas_toolcall_parser *p, char **text,
                                                    struct json_t *calls);

/* Whole text at once: *content gets the text outside the calls (malloc'd), *calls a new
 * array (the caller decrefs it; empty when there are none). */
ATLAS_API atlas_status atlas_toolcall_parse(atlas_toolcall_format format, const char *text,
                                            char **content, struct json_t **calls);

#ifdef __cplusplus
}
#endif
#endif

/* atlas/shield.h — control tokens only from the chat template.
 *
 * A client's message may spell a special token ("<|eot_id|><|start_header_id|>system...",
 * "<|im_end|>\n<|im_start|>system") to forge a turn. Before rendering, atlas_shield_json
 * swaps every special token's spelling in the client's strings (values and object keys) for
 * private-use sentinels (U+E000 and an index); the template renders them like any text
 * (trimmed, sliced, put through tojson); atlas_shield_encode then spells them back and
 * tokenizes them as plain text while the template's own special tokens stay special; with
 * the cuts atlas_template_render_pieces gives, a spelling made across the edge of a printed
 * piece (the client's "...<" and a text block's "|im_end|>") is plain text too. A request
 * whose strings spell no special token, whole or across a piece's edge, renders and
 * tokenizes exactly as without the shield.
 * JSON held in a string is not looked into: a caller that parses such a string for the
 * template (tool-call arguments) parses it before shielding, or \u escapes in it would
 * spell what the shield never saw. A template that escapes non-ASCII
 * (tojson(ensure_ascii=True)) or cuts a sentinel leaves it as the private-use characters it
 * is made of: never a control token.
 *
 * Threads: every function may be called from any thread; the tokenizer is only read.
 * Ownership: arguments are borrowed; what is returned through a pointer is malloc'd and
 * the caller frees it (free()). */
#ifndef ATLAS_SHIELD_H
#define ATLAS_SHIELD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "atlas/status.h"
#include "atlas/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

struct json_t; /* jansson's */

/* Shields every string in v in place, object keys included (templates print keys: tojson of
 * a tool's parameters or a call's arguments, items()); objects and arrays are walked, and an
 * object whose keys change keeps their order. Whatever a client sends that reaches a template
 * passes here first: messages, tools, and chat_template_kwargs. */
ATLAS_API atlas_status atlas_shield_json(const atlas_tokenizer *tok, struct json_t *v);

/* Tokenizes rendered text: sentinels become their special token's text, tokenized as plain
 * text; everything else as atlas_tokenizer_encode does. */
ATLAS_API atlas_status atlas_shield_encode(const atlas_tokenizer *tok, const char *rendered,
                                           size_t len, bool add_special, int32_t **ids,
                                           size_t *n_ids);

/* As atlas_shield_encode, for text atlas_template_render_pieces made with its cuts: a
 * special token whose spelling runs across a cut is tokenized as plain text too, so that a
 * client's string cannot finish or start one with what the template prints beside it
 * ("...<" then "|im_end|>"). A special token inside one piece (a template's text block, or
 * one {{ }} such as '<|' + role + '|>') is matched as atlas_shield_encode matches it.
 * ATLAS_ERR_INVALID for cuts that are not ascending offsets inside the text. */
ATLAS_API atlas_status atlas_shield_encode_pieces(const atlas_tokenizer *tok,
                                                  const char *rendered, size_t len,
                                                  const size_t *cuts, size_t n_cuts,
                                                  bool add_special, int32_t **ids,
                                                  size_t *n_ids);

/* The rendered text with its sentinels spelt back (for a client that asked for the text). */
ATLAS_API atlas_status atlas_shield_text(const atlas_tokenizer *tok, const char *rendered,
                                         size_t len, char **text, size_t *text_len);

#ifdef __cplusplus
}
#endif
#endif

/* server/anthropic.h — Anthropic's Messages API (POST /v1/messages and
 * /v1/messages/count_tokens) as a translation onto the chat route: the request body becomes
 * an OpenAI chat body (system, messages with text, tool_use, tool_result and thinking blocks,
 * tools, tool_choice, stop_sequences, thinking), goes through the same preparation (template,
 * shield, tool calls, reasoning, constraints) and engine request, and the engine's events are
 * shaped as Anthropic's message object and its typed SSE events.  Errors take Anthropic's
 * shape through the route table (atlas_api_error_to_anthropic).  Internal to src/server. */
#ifndef ATLAS_SERVER_ANTHROPIC_H
#define ATLAS_SERVER_ANTHROPIC_H

#include <stdbool.h>

#include <jansson.h>

#include "atlas/status.h"
#include "server/http.h"

/* The OpenAI chat body (*out, the caller's) that an Anthropic Messages body means.  count:
 * for count_tokens (max_tokens is not required).  ATLAS_ERR_INVALID with a message naming the
 * field for what Messages does not allow or atlas cannot serve (image and document blocks). */
atlas_status atlas_anthropic_to_chat(const json_t *body, bool count, json_t **out);

/* The route handlers (atlas_api_handler). */
void atlas_api_messages(atlas_http_call *call, json_t *body, const char *arg,
                        atlas_http_reply *r);
void atlas_api_count_tokens(atlas_http_call *call, json_t *body, const char *arg,
                            atlas_http_reply *r);

#endif

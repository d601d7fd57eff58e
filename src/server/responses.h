/* server/responses.h — OpenAI's Responses API, translated onto the chat route: POST
 * /v1/responses becomes a chat request (responses.c: input items, instructions, tools,
 * text.format, previous_response_id -> messages and settings), run and read as chat is
 * (template, tool calls, reasoning, constraints), and its answer is told back as a response
 * object or the typed stream events (responses_out.c).  Responses are kept for
 * previous_response_id and GET in the server's store (respstore.h).  Internal to
 * src/server. */
#ifndef ATLAS_SERVER_RESPONSES_H
#define ATLAS_SERVER_RESPONSES_H

#include <jansson.h>

#include "server/gen.h"
#include "server/http.h"

typedef struct atlas_respstore atlas_respstore;

/* The route handlers (api.h's atlas_api_handler); arg is the response id. */
void atlas_responses_create(atlas_http_call *call, json_t *body, const char *arg,
                            atlas_http_reply *r);
void atlas_responses_get(atlas_http_call *call, json_t *body, const char *arg,
                         atlas_http_reply *r);
void atlas_responses_delete(atlas_http_call *call, json_t *body, const char *arg,
                            atlas_http_reply *r);
void atlas_responses_input_items(atlas_http_call *call, json_t *body, const char *arg,
                                 atlas_http_reply *r);

/* responses_out.c: sets o's dialect to tell a chat answer as response id's object (whole)
 * or events (streamed).  echo holds the request's fields the response object repeats; input
 * the request's input items, history the conversation before them (all three taken, even
 * after a failure); store NULL: the response is not kept. */
atlas_status atlas_responses_dialect(atlas_respstore *store, const char *id, json_t *echo,
                                     json_t *input, json_t *history, atlas_gen_opts *o);

#endif

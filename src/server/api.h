/* server/api.h — the endpoints: generation (api.c), and models, health, metrics, tokenize,
 * detokenize and apply-template (api_misc.c), with the helpers they share.  The route table
 * in server.c calls the handlers.  Internal to src/server. */
#ifndef ATLAS_SERVER_API_H
#define ATLAS_SERVER_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "server/gen.h"
#include "server/http.h"
#include "server/params.h"
#include "server/state.h"

typedef struct atlas_template atlas_template;
typedef struct atlas_tokenizer atlas_tokenizer;

/* The model a request names: name_or_null, else body's "model" (a served name, else an
 * alias's model), else the first configured model.  ATLAS_ERR_NOT_FOUND (param "model") for
 * an unknown one.  *name stays valid while the engine lives. */
atlas_status atlas_api_model(atlas_server *s, const json_t *body, const char *name_or_null,
                             const char **name, const char **param);

/* The model an alias (atlas_server_params.aliases) names for name, NULL when none does. */
const char *atlas_api_alias(const atlas_server *s, const char *name);

/* Renders body's "messages" (and "tools" when tools_ok; "add_generation_prompt",
 * "chat_template_kwargs") with the model's chat template into *prompt (malloc'd), and
 * where its pieces meet into *cuts (malloc'd; cuts NULL: not asked). The client's strings
 * are shielded (atlas/shield.h): tokenize *prompt with atlas_shield_encode_pieces and the
 * cuts, or spell it out with atlas_shield_text. */
atlas_status atlas_api_render_chat(atlas_server *s, const char *model, const json_t *body,
                                   bool tools_ok, char **prompt, size_t **cuts, size_t *n_cuts,
                                   const atlas_template **tmpl, bool *parse_tools,
                                   const char **param);

/* The same with a given template, no engine needed (what the fuzzers drive). model names
 * the template in errors; shield: the tokenizer whose special tokens the client's strings
 * may not spell (NULL: no shield). */
atlas_status atlas_api_render_template(const atlas_template *tmpl, const char *model,
                                       const atlas_tokenizer *shield, const json_t *body,
                                       bool tools_ok, char **prompt, size_t **cuts,
                                       size_t *n_cuts, bool *parse_tools, const char **param);

/* A chat request (OpenAI's chat/completions body) made ready for the engine: the model, its
 * tokenizer, the generation parameters (with the constraint a forced tool call needs), the
 * rendered and shielded prompt and its ids, and the formatting options (tool-call format,
 * thinking).  Every dialect's chat route translates its body into this one and comes through
 * here: prepare, set o.dialect (and o.dialect_ctx, which q then owns), start. */
typedef struct atlas_api_chat_req {
    const char *model;
    const atlas_tokenizer *tok;
    atlas_gen_params gp;
    char *prompt;
    int32_t *ids;
    size_t n;
    atlas_gen_opts o;
} atlas_api_chat_req;

/* Fills *q from body; free it with atlas_api_chat_req_free, even after a failure. */
atlas_status atlas_api_chat_prepare(atlas_server *s, const json_t *body, atlas_api_chat_req *q,
                                    const char **param);
/* Frees q's strings and its dialect's context if no gen has taken it. */
void atlas_api_chat_req_free(atlas_api_chat_req *q);
/* Starts q in the engine and answers r with it (whole or streamed, in q->o's dialect; "n"
 * choices for OpenAI's only); the gen takes q->o.dialect_ctx. */
void atlas_api_chat_start(atlas_http_call *call, atlas_api_chat_req *q, atlas_http_reply *r);

enum { ATLAS_API_MAX_PROMPTS = 16 }; /* prompts in one /v1/completions request */

/* /v1/completions "prompt": one prompt or an array of them (strings, or arrays of token ids
 * checked against tok's vocabulary) into ids[i][n[i]] (malloc'd), i < *count <=
 * ATLAS_API_MAX_PROMPTS.  The caller frees ids[0..*count) even after a failure. */
atlas_status atlas_api_completion_prompts(const json_t *body, const atlas_tokenizer *tok,
                                          int32_t **ids, size_t *n, int *count,
                                          const char **param);

/* /detokenize "tokens": an array of token ids in tok's vocabulary (may be empty) into *ids
 * (malloc'd, freed by the caller even after a failure). */
atlas_status atlas_api_token_ids(const json_t *arr, const atlas_tokenizer *tok, int32_t **ids,
                                 size_t *n, const char **param);

/* Endpoint handlers: call->ctx is the atlas_server; body is the parsed JSON body (NULL for
 * GET), arg the route's "{}" segment ("" when it has none).  Each answers into r. */
typedef void (*atlas_api_handler)(atlas_http_call *call, json_t *body, const char *arg,
                                  atlas_http_reply *r);
void atlas_api_chat(atlas_http_call *call, json_t *body, const char *arg, atlas_http_reply *r);
void atlas_api_completions(atlas_http_call *call, json_t *body, const char *arg,
                           atlas_http_reply *r);

/* The completion route's work on an OpenAI-shaped body, answered in dialect d's shape
 * (NULL: OpenAI's): what another dialect's route calls once it has translated its request
 * (one prompt, one choice: d's hooks know no "n").  Chat goes through atlas_api_chat_prepare
 * and atlas_api_chat_start instead. */
void atlas_api_completions_run(atlas_http_call *call, const json_t *body,
                               const atlas_gen_dialect *d, atlas_http_reply *r);
void atlas_api_models(atlas_http_call *call, json_t *body, const char *arg, atlas_http_reply *r);
void atlas_api_model_get(atlas_http_call *call, json_t *body, const char *arg,
                         atlas_http_reply *r);
void atlas_api_model_load(atlas_http_call *call, json_t *body, const char *arg,
                          atlas_http_reply *r);
void atlas_api_model_unload(atlas_http_call *call, json_t *body, const char *arg,
                            atlas_http_reply *r);
void atlas_api_health(atlas_http_call *call, json_t *body, const char *arg, atlas_http_reply *r);
void atlas_api_metrics(atlas_http_call *call, json_t *body, const char *arg, atlas_http_reply *r);
void atlas_api_tokenize(atlas_http_call *call, json_t *body, const char *arg,
                        atlas_http_reply *r);
void atlas_api_detokenize(atlas_http_call *call, json_t *body, const char *arg,
                          atlas_http_reply *r);
void atlas_api_apply_template(atlas_http_call *call, json_t *body, const char *arg,
                              atlas_http_reply *r);

#endif

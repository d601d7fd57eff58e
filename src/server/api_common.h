/* server/api_common.h — helpers shared by the endpoint files (api.c, api_misc.c).
 * Internal to src/server. */
#ifndef ATLAS_SERVER_API_COMMON_H
#define ATLAS_SERVER_API_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "server/http.h"
#include "server/params.h"

typedef struct atlas_template atlas_template;
typedef struct atlas_tokenizer atlas_tokenizer;

/* The model a request names: name_or_null, else body's "model", else the first configured
 * model.  ATLAS_ERR_NOT_FOUND (param "model") for an unknown one.  *name stays valid while
 * the engine lives. */
atlas_status atlas_api_model(atlas_server *s, const json_t *body, const char *name_or_null,
                             const char **name, const char **param);

/* Renders body's "messages" (and "tools" when tools_ok; "add_generation_prompt",
 * "chat_template_kwargs") with the model's chat template into *prompt (malloc'd). */
atlas_status atlas_api_render_chat(atlas_server *s, const char *model, const json_t *body,
                                   bool tools_ok, char **prompt, const atlas_template **tmpl,
                                   bool *parse_tools, const char **param);

/* The same with a given template, no engine needed (what the fuzzers drive). model names
 * the template in errors. */
atlas_status atlas_api_render_template(const atlas_template *tmpl, const char *model,
                                       const json_t *body, bool tools_ok, char **prompt,
                                       bool *parse_tools, const char **param);

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

#endif

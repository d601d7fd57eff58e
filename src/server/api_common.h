/* server/api_common.h — helpers shared by the endpoint files (api.c, api_misc.c).
 * Internal to src/server. */
#ifndef ATLAS_SERVER_API_COMMON_H
#define ATLAS_SERVER_API_COMMON_H

#include <stdbool.h>

#include <jansson.h>

#include "server/http.h"
#include "server/params.h"

typedef struct atlas_template atlas_template;

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

#endif

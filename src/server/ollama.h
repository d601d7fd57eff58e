/* server/ollama.h — Ollama's API: /api/chat and /api/generate translated into the OpenAI
 * bodies that the chat and completion routes run (api.c) and answered as Ollama's JSON or
 * NDJSON stream (ollama.c), and the routes about models and the server (ollama_models.c):
 * /api/tags, /api/ps, /api/show, /api/version, GET /.  Errors are Ollama's
 * {"error": "..."} with the status the OpenAI routes give the same failure.  Internal to
 * src/server. */
#ifndef ATLAS_SERVER_OLLAMA_H
#define ATLAS_SERVER_OLLAMA_H

#include <jansson.h>

#include "server/http.h"
#include "server/state.h"

/* The version of Ollama whose API these routes follow (what /api/version answers). */
#define ATLAS_OLLAMA_VERSION "0.12.0"

void atlas_ollama_chat(atlas_http_call *call, json_t *body, const char *arg, atlas_http_reply *r);
void atlas_ollama_generate(atlas_http_call *call, json_t *body, const char *arg,
                           atlas_http_reply *r);
void atlas_ollama_tags(atlas_http_call *call, json_t *body, const char *arg, atlas_http_reply *r);
void atlas_ollama_ps(atlas_http_call *call, json_t *body, const char *arg, atlas_http_reply *r);
void atlas_ollama_show(atlas_http_call *call, json_t *body, const char *arg, atlas_http_reply *r);
void atlas_ollama_version(atlas_http_call *call, json_t *body, const char *arg,
                          atlas_http_reply *r);
void atlas_ollama_root(atlas_http_call *call, json_t *body, const char *arg, atlas_http_reply *r);
void atlas_ollama_embed(atlas_http_call *call, json_t *body, const char *arg, atlas_http_reply *r);

/* The model a request names: exactly, or without a ":latest" tag (Ollama's default tag);
 * ATLAS_ERR_NOT_FOUND otherwise.  *name stays valid while the engine lives. */
atlas_status atlas_ollama_model(atlas_server *s, const char *want, const char **name);

/* An error in OpenAI's shape rewritten into Ollama's {"error": "..."}, its status kept;
 * other replies are left as they are.  server.c applies it to every answer on Ollama's
 * paths ("/", "/api/..."), whichever layer made it (the API key, the body limit, an
 * unknown route, a handler). */
void atlas_ollama_error_reshape(atlas_http_reply *r);

#endif

/* server/embed.h — embeddings: one request model for OpenAI's POST /v1/embeddings (this
 * module's own answer) and Ollama's /api/embed and /api/embeddings (ollama_models.c): the
 * inputs tokenized as the model's tokenizer post-processes them (Qwen3-Embedding's appends
 * its eos), each input one engine sequence, run together in the engine's batches, and the
 * vectors cut to a Matryoshka width when asked.  Internal to src/server. */
#ifndef ATLAS_SERVER_EMBED_H
#define ATLAS_SERVER_EMBED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "server/http.h"
#include "server/state.h"

/* Inputs one request may carry (OpenAI's limit). */
enum { ATLAS_EMBED_MAX_INPUTS = 2048 };

typedef struct atlas_embed_req {
    const char *model;    /* a served name (valid while the engine lives) */
    int32_t **ids;        /* [count][n[i]] token ids, malloc'd */
    size_t *n;
    int count;
    int dims;             /* the vectors' width: the model's, or the "dimensions" asked */
    bool normalize;       /* the model L2-normalises: a cut vector is normalised again */
    bool truncate;        /* an input longer than the context is cut to it (else a 400) */
    int64_t keep_alive_ms;
} atlas_embed_req;

/* body[key] (OpenAI's "input", Ollama's "input" or "prompt"): a string, an array of strings,
 * an array of token ids or an array of such arrays, into q->ids (strings tokenized with the
 * special tokens the tokenizer's post-processor adds).  q->model must be set. */
atlas_status atlas_embed_inputs(atlas_server *s, const json_t *body, const char *key,
                                atlas_embed_req *q, const char **param);

/* body["dimensions"] into q->dims: absent, the model's width; else a width the model
 * declares (its Matryoshka sizes), or a 400 that says the model has none. q->model set. */
atlas_status atlas_embed_dimensions(atlas_server *s, const json_t *body, atlas_embed_req *q,
                                    const char **param);

/* How a run ended when it did not finish: the client left, or the server stops. */
typedef enum atlas_embed_end { ATLAS_EMBED_DONE = 0, ATLAS_EMBED_GONE, ATLAS_EMBED_STOPPING }
    atlas_embed_end;

/* Runs q: *vecs[count * q->dims] (malloc'd, the caller's) in input order, *tokens the
 * inputs' tokens (after truncation).  Waits for the engine, and cancels what it runs when
 * the client leaves or the server stops (*end says which; the status is then ATLAS_OK and
 * *vecs NULL).  Answers the failure of a check or of the engine with its *param. */
atlas_status atlas_embed_run(atlas_server *s, atlas_http_call *call, atlas_embed_req *q,
                             float **vecs, long *tokens, atlas_embed_end *end,
                             const char **param);

/* Answers r with the failure of atlas_embed_inputs / _dimensions / _run (or *end). */
void atlas_embed_fail(atlas_http_reply *r, atlas_status st, atlas_embed_end end,
                      const char *param);

void atlas_embed_req_free(atlas_embed_req *q);

/* v[n] as a JSON array of numbers; NULL for want of memory. */
json_t *atlas_embed_floats(const float *v, int n);

/* POST /v1/embeddings */
void atlas_api_embeddings(atlas_http_call *call, json_t *body, const char *arg,
                          atlas_http_reply *r);

#endif

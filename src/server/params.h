/* server/params.h — reading and checking the fields of an OpenAI request body.  Internal to
 * src/server.  Every failure is ATLAS_ERR_INVALID (or RANGE) with a message naming the field,
 * and *param set to the field's name for the error JSON's "param". */
#ifndef ATLAS_SERVER_PARAMS_H
#define ATLAS_SERVER_PARAMS_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "atlas/engine.h"
#include "atlas/sampler.h"
#include "atlas/status.h"

typedef struct atlas_tokenizer atlas_tokenizer;
typedef struct atlas_constraint atlas_constraint;

/* Optional fields: absent or null leaves *out unchanged and *present false (present may be
 * NULL).  Numbers given as JSON reals must be integral for the integer getters. */
atlas_status atlas_param_number(const json_t *o, const char *key, double lo, double hi,
                                double *out, bool *present, const char **param);
atlas_status atlas_param_int(const json_t *o, const char *key, int64_t lo, int64_t hi,
                             int64_t *out, bool *present, const char **param);
atlas_status atlas_param_bool(const json_t *o, const char *key, bool *out, const char **param);
/* *out points into o (valid while o lives). */
atlas_status atlas_param_string(const json_t *o, const char *key, const char **out,
                                const char **param);

/* The generation settings shared by /v1/chat/completions and /v1/completions. */
typedef struct atlas_gen_params {
    const char *model;          /* NULL: the server's first model; points into the body */
    atlas_sampler_params sp;    /* sp.logit_bias points to bias below */
    atlas_logit_bias *bias;     /* [sp.n_logit_bias], malloc'd */
    int64_t max_tokens;         /* 0: until the context is full */
    bool max_tokens_default;    /* max_tokens is generation_config.json's max_new_tokens: cut
                                   to the context's room, never a reason to refuse */
    const char **stop;          /* [n_stop], strings point into the body */
    int n_stop;
    int32_t stop_ids[2];        /* ids that end the reply beside the model's eos (set by
                                   api.c: Harmony's <|call|> and <|return|>) */
    int n_stop_ids;
    bool stream;
    bool include_usage;         /* stream_options.include_usage */
    bool logprobs;
    int top_logprobs;           /* 0..20 */
    bool ignore_eos;            /* vLLM's extension */
    bool tokens_as_ids;         /* vLLM's return_tokens_as_token_ids: logprobs name tokens
                                   "token_id:N" (unambiguous, unlike their text) */
    bool echo;                  /* /v1/completions: prepend the prompt */
    int n;                      /* choices per prompt (OpenAI's "n"), 1..ATLAS_MAX_CHOICES;
                                   choice i samples with seed sp.seed + i */
    atlas_constraint *constraint; /* response_format json_object, or (chat, set by api.c) the
                                     forced tool call; NULL: none; owned, freed by _free */
    const char *cache_salt;     /* vLLM's: prefix-cache blocks are shared only within one
                                   salt; NULL: none; points into the body */
    int64_t keep_alive_ms;      /* Ollama's "keep_alive" (atlas_request.keep_alive_ms); 0:
                                   the model's */
    /* A thinking budget (atlas_request.think_budget, set by a dialect that has one, e.g.
     * Messages' budget_tokens; 0: none) with its tags' ids and whether the prompt opened a
     * block */
    int think_budget;
    int32_t think_open[ATLAS_ENGINE_MAX_THINK_IDS], think_close[ATLAS_ENGINE_MAX_THINK_IDS];
    int n_think_open, n_think_close;
    bool think_inside;
} atlas_gen_params;

/* "keep_alive" of body, as Ollama takes it: seconds, or a duration such as "5m"; negative is
 * forever, 0 releases the model once the request has ended.  Absent or null: *out_ms 0 (the
 * model's own).  Else ATLAS_ERR_INVALID with *param "keep_alive". */
atlas_status atlas_param_keep_alive(const json_t *body, int64_t *out_ms, const char **param);

/* Limits on what one request may ask for (each refused with a message naming it). */
enum {
    ATLAS_MAX_STOP = 16,          /* "stop" strings */
    ATLAS_MAX_STOP_BYTES = 512,   /* bytes of one stop string (NUL excluded) */
    ATLAS_MAX_LOGIT_BIAS = 4096,  /* "logit_bias" entries */
    ATLAS_MAX_CHOICES = 16,       /* choices of one request: "n" x prompts */
};

typedef enum atlas_api_kind { ATLAS_API_CHAT, ATLAS_API_COMPLETION } atlas_api_kind;

/* Reads the common fields of body.  tok (may be NULL) checks logit_bias ids against the
 * vocabulary.  gen (may be NULL): the model's generation_config.json defaults, for the
 * sampling fields the body leaves out.  Free with atlas_gen_params_free even after a
 * failure. */
atlas_status atlas_gen_params_parse(const json_t *body, atlas_api_kind kind,
                                    const atlas_tokenizer *tok,
                                    const atlas_generation_defaults *gen, atlas_gen_params *out,
                                    const char **param);
void atlas_gen_params_free(atlas_gen_params *p);

/* A JSON string from len bytes that may not be valid UTF-8 (invalid bytes become U+FFFD). */
json_t *atlas_json_text(const char *s, size_t len);

#endif

/* atlas/sampler.h — turning one row of logits into a token id.
 *
 * A sampler belongs to one sequence: it owns that sequence's random-number generator
 * (seeded from the params, no global state), so the same seed and the same logits give
 * the same tokens on any thread.  atlas_sampler_sample_at draws from a counter-based
 * stream instead (Philox-4x32-10 keyed by the seed, the counter the token's position), which
 * the engine uses: a draw then depends on the seed and the position only, never on what
 * was drawn before or beside it.  The GPU's sample op uses the same uniform, but orders its
 * candidates otherwise, so the CPU and the GPU pick different tokens for one seed (each
 * from the same distribution).
 *
 * Threads: a sampler belongs to one thread at a time; atlas_sampler_default_params and
 * atlas_sampler_logprobs are pure and may be called from any thread.  Ownership: create
 * returns a sampler the caller frees (atlas_sampler_free) and copies the params (logit_bias
 * included); the arrays passed to the other calls are borrowed for the call.
 *
 * Order of the transforms (that of Hugging Face transformers' generate):
 *   logit_bias (added, as OpenAI) -> repetition penalty (HF: divide a positive logit,
 *   multiply a negative one, once per distinct token) -> presence and frequency penalties
 *   (OpenAI: logit -= presence * [count > 0] + frequency * count) -> temperature 0: argmax
 *   (lowest id on ties), else logit / temperature -> top-k -> top-p -> min-p -> draw. */
#ifndef ATLAS_SAMPLER_H
#define ATLAS_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "atlas/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct atlas_sampler atlas_sampler;

typedef struct atlas_logit_bias {
    int32_t id;
    float bias; /* added to the token's logit; OpenAI allows -100 .. 100 */
} atlas_logit_bias;

typedef struct atlas_sampler_params {
    float temperature;        /* 0: greedy (argmax); default 1 */
    int top_k;                /* keep the k most likely; 0: off */
    float top_p;              /* keep the smallest set with mass >= top_p; 1: off */
    float min_p;              /* keep p >= min_p * p_max; 0: off */
    float repetition_penalty; /* HF; 1: off; must be > 0 */
    float presence_penalty;   /* OpenAI; 0: off; -2 .. 2 */
    float frequency_penalty;  /* OpenAI; 0: off; -2 .. 2 */
    uint64_t seed;            /* the RNG's seed; callers wanting variety pass their own */
    const atlas_logit_bias *logit_bias; /* [n_logit_bias]; copied by atlas_sampler_create */
    int n_logit_bias;
} atlas_sampler_params;

/* temperature 1, top_k 0, top_p 1, min_p 0, penalties neutral, seed 0, no bias. */
ATLAS_API atlas_sampler_params atlas_sampler_default_params(void);

/* Validates params (ATLAS_ERR_INVALID naming the field) and creates a sampler. */
ATLAS_API atlas_status atlas_sampler_create(const atlas_sampler_params *params,
                                            atlas_sampler **out);
ATLAS_API void atlas_sampler_free(atlas_sampler *s); /* NULL: no-op */

/* Gives s new params (checked as create does; its prompt length back to 0), keeping its
 * scratch buffers: one sampler may serve many rows of different params in turn. On an
 * error s is unchanged. */
ATLAS_API atlas_status atlas_sampler_reset(atlas_sampler *s, const atlas_sampler_params *params);

/* Tells the sampler that the first n tokens of every history passed to sample are the
 * prompt: they count for the repetition penalty (as HF and vLLM do) but not for presence
 * and frequency (OpenAI counts generated tokens only). Default 0. */
ATLAS_API void atlas_sampler_set_prompt_len(atlas_sampler *s, size_t n);

/* Picks the next token from logits[vocab], which it overwrites (the transforms are applied
 * in place: compute logprobs first if you want them of the raw logits). history[n_history]
 * is the sequence so far (prompt first, see set_prompt_len); may be NULL when n_history is
 * 0. ATLAS_ERR_RANGE when a history or logit_bias id is outside [0, vocab). */
ATLAS_API atlas_status atlas_sampler_sample(atlas_sampler *s, float *logits, int vocab,
                                            const int32_t *history, size_t n_history,
                                            int32_t *out_id);

/* As atlas_sampler_sample, but the draw's uniform is atlas_sampler_uniform(seed, counter)
 * (the sampler's own stream is left alone): the engine passes the position of the token
 * drawn, so that a sequence's tokens depend on its seed, never on its batch-mates. */
ATLAS_API atlas_status atlas_sampler_sample_at(atlas_sampler *s, float *logits, int vocab,
                                               const int32_t *history, size_t n_history,
                                               uint64_t counter, int32_t *out_id);

/* The counter-based stream: ctr[4] becomes Philox-4x32-10 of (ctr, key[2]) (Random123's
 * philox4x32 with 10 rounds); and the uniform in [0, 1) that the samplers draw with, from
 * the output of counter (counter's low and high words, 0, 0) under the key (seed's low and
 * high words): (x0 * 2^21 ^ x1 / 2^11) / 2^53.  Pure; any thread. */
ATLAS_API void atlas_sampler_philox(uint32_t ctr[4], const uint32_t key[2]);
ATLAS_API double atlas_sampler_uniform(uint64_t seed, uint64_t counter);

/* Log-softmax of the raw logits[vocab]: *logprob of id (pass NULL to skip), and the n_top
 * most likely ids with their logprobs, most likely first (ties: lower id first), into
 * top_ids[n_top] / top_logprobs[n_top] (may be NULL when n_top is 0). Returns the number
 * written (min(n_top, vocab)); ATLAS_ERR_RANGE if id is outside [0, vocab) and logprob is
 * wanted. Does not modify logits. */
ATLAS_API atlas_status atlas_sampler_logprobs(const float *logits, int vocab, int32_t id,
                                              float *logprob, int n_top, int32_t *top_ids,
                                              float *top_logprobs, int *n_written);

#ifdef __cplusplus
}
#endif
#endif

/* model/forward.h — the forward pass, for the engine.  Internal.
 *
 * One model definition (forward.c) written against the op table of backend/backend.h; the
 * CPU and CUDA backends run the same code. */
#ifndef ATLAS_MODEL_FORWARD_H
#define ATLAS_MODEL_FORWARD_H

#include "atlas/model.h"
#include "backend/backend.h"
#include "model/config.h"

/* Runs one batch (see atlas_batch in backend/backend.h): writes the K/V of every token into
 * the cache slots its sequence's block table names, and the logits of the tokens listed in
 * b->logit_rows into logits[b->n_logits, vocab] (host memory, fp32).
 * Limits: 1 <= n_tokens <= atlas_model_max_batch_tokens(m); block ids < kv_blocks; token ids
 * < vocab; every sequence's tokens are at consecutive positions ending at seq_ctx - 1.
 * Violations return ATLAS_ERR_RANGE / ATLAS_ERR_INVALID naming the field. */
atlas_status atlas_model_forward(atlas_model *m, const atlas_batch *b, float *logits);

/* As atlas_model_forward, but only the argmax id of each logit row (greedy; no download of
 * the full logits). ids[b->n_logits]. */
atlas_status atlas_model_forward_argmax(atlas_model *m, const atlas_batch *b, int32_t *ids);

/* The parsed config.json / generation_config.json (sampling defaults). Valid while m is. */
const atlas_config *atlas_model_config(const atlas_model *m);

/* The backend the model runs on. Valid while m is. */
atlas_backend *atlas_model_backend(atlas_model *m);

#endif

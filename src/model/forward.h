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
/* With b->hidden (an embedding model, which has no head), atlas_model_forward writes the
 * final-norm hidden states of the logit rows instead: logits[b->n_logits, hidden]. */

/* As atlas_model_forward, but only the argmax id of each logit row (greedy; no download of
 * the full logits). ids[b->n_logits]. */
atlas_status atlas_model_forward_argmax(atlas_model *m, const atlas_batch *b, int32_t *ids);

/* The rows of a forward sampled on the backend (the sample op, backend.h): rows[n_logits]
 * their parameters, with adj[n_adj] their adjustments, and out[n_logits] what each drew.
 * A row flagged ATLAS_SAMPLE_SKIP is not sampled: its raw logits go to host[k * vocab], k
 * its index among the skipped rows (host NULL when none is; the caller samples it). */
typedef struct atlas_model_sampling {
    const atlas_sample_row *rows;
    const atlas_sample_adj *adj;
    int n_adj;
    atlas_sample_out *out;
    float *host;
} atlas_model_sampling;

/* As atlas_model_forward, but the logit rows are sampled on the backend and only the ids
 * and logprobs come back (and the skipped rows' logits). */
atlas_status atlas_model_forward_sample(atlas_model *m, const atlas_batch *b,
                                        const atlas_model_sampling *smp);

/* Greedy decoding a step ahead of the host: queues b's forward and the argmax of its logit
 * rows and returns without waiting for them, so that the next step is queued while this one
 * runs and the GPU never idles between steps. A token ATLAS_BATCH_PREV(r) of b is the id of
 * logit row r of the step queued just before, taken on the device. At most 2 steps are
 * queued; atlas_model_argmax_collect waits for the oldest and writes its
 * ids[n] (n = its n_logits). The usual loop: queue(1); queue(2); collect(1); queue(3);
 * collect(2); ... A step whose ids turn out unwanted (an end of text) is collected and
 * dropped. While steps are queued, the other forwards fail (ATLAS_ERR_BUSY). One thread
 * queues and collects (the ring is not locked). Backends without the device path (the CPU)
 * compute each step at once and keep its ids. */
atlas_status atlas_model_forward_argmax_queue(atlas_model *m, const atlas_batch *b);
/* The same with each logit row r's id drawn as atlas_model_forward_sample draws it for
 * rows[r] (the uniform at rows[r].counter: the caller counts the steps ahead), for rows
 * that ask for ids only: no adjustments, logprobs or top ids (penalties and logit_bias need
 * the tokens drawn before). Temperature 0 is the argmax, so greedy and sampled sequences
 * share a step. Queued and collected with the greedy steps. */
atlas_status atlas_model_forward_sample_queue(atlas_model *m, const atlas_batch *b,
                                              const atlas_sample_row *rows);
atlas_status atlas_model_argmax_collect(atlas_model *m, int32_t *ids, int n);
/* Whether collecting the oldest queued step would not wait for it (true when none is
 * queued, and on a backend that computes queued steps at once). */
bool atlas_model_queued_ready(atlas_model *m);
/* Whether atlas_model_forward_sample_queue can queue on m's backend (one that queues greedy
 * steps on the device also has the sampled op; one that computes steps at once does both). */
bool atlas_model_queues_samples(const atlas_model *m);

/* Tensor parallelism (tp_size > 1 in atlas_model_params): sums x[count] (the partial
 * outputs of the attention and MLP projections, backend memory in its activation type)
 * over all ranks, in place. Called twice per layer on every rank, in the same order; on
 * GPUs it wraps NCCL's all-reduce on the backend's stream; tests plug in a stand-in. */
typedef atlas_status (*atlas_all_reduce_fn)(void *ctx, atlas_backend *be, void *x,
                                            size_t count);
/* Sets the model's all-reduce (NULL: the backend's all_reduce op). Never called at
 * tp_size 1. Set it before the first forward. */
void atlas_model_set_all_reduce(atlas_model *m, atlas_all_reduce_fn fn, void *ctx);

/* A non-lead rank's forward (tp_rank > 0): the layers only, which meet the other ranks in
 * the all-reduces; no logits (rank 0 has lm_head and samples). Any rank may call it. */
atlas_status atlas_model_forward_layers(atlas_model *m, const atlas_batch *b);

/* The parsed config.json / generation_config.json (sampling defaults). Valid while m is. */
const atlas_config *atlas_model_config(const atlas_model *m);

/* Bytes of one KV block's image in host memory: every layer's K and V of block_size tokens,
 * in the cache's element type (kv_bytes / kv_blocks).  0 when the backend cannot copy blocks
 * out and back (kv_save / kv_restore absent) or the model is split over ranks. */
size_t atlas_model_kv_block_bytes(const atlas_model *m);
/* Copies KV blocks ids[n] out to the images host[n] (each atlas_model_kv_block_bytes), and
 * back in: restore writes the blocks before the next forward reads them.  The images are only
 * for a model loaded the same way (same files, backend, KV element type and block size).
 * ATLAS_ERR_UNSUPPORTED where atlas_model_kv_block_bytes is 0; ATLAS_ERR_RANGE for a block
 * id out of the cache.  Not beside a forward (it takes the forward's lock). */
atlas_status atlas_model_kv_save(atlas_model *m, const int32_t *ids, int n, void *const *host);
atlas_status atlas_model_kv_restore(atlas_model *m, const int32_t *ids, int n,
                                    const void *const *host);

/* The backend the model runs on. Valid while m is. */
atlas_backend *atlas_model_backend(atlas_model *m);

/* atlas_model_load with the CUDA backend made with opts (NULL: the defaults; opts->gpu is
 * ignored, p->gpu names the GPU): the diagnostics that `atlas bench` and the tests turn off
 * (backend/backend.h atlas_backend_options), kept out of the public params. */
atlas_status atlas_model_load_opts(const char *dir, const atlas_model_params *p,
                                   const atlas_backend_options *opts, atlas_model **out);

#endif

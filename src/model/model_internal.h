/* model/model_internal.h — the atlas_model struct, shared by model.c (load, handles, info)
 * and forward.c (the forward pass).  Internal to src/model. */
#ifndef ATLAS_MODEL_INTERNAL_H
#define ATLAS_MODEL_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "atlas/model.h"
#include "backend/backend.h"
#include "model/config.h"
#include "model/forward.h"
#include "format/safetensors.h"
#include "model/weights.h"

/* Activation buffers of one forward, in backend memory, for up to T = max_batch_tokens
 * (C = mlp_chunk rows for the MLP's). */
typedef struct atlas_acts {
    /* Widths are the backend geometry's: with tensor parallelism the rank's local heads
     * (H, K) and MLP columns (f). */
    void *x;       /* [T, d] the residual stream */
    void *h;       /* [T, d] normed */
    void *qkv;     /* [T, (H + 2K) * hd] */
    void *att;     /* [T, H * hd] */
    void *o;       /* [T, d] projections back to d */
    void *gate_up; /* [C, 2f] */
    void *act;     /* [C, f]; qkv's memory when it fits (then not freed on its own) */
    void *rows;    /* [T, d] the rows whose logits are wanted; gate_up's memory when it fits */
    void *logits;  /* [logit_chunk, vocab]; in gate_up's memory after rows when it fits */
    int32_t *moe_ids; /* [T, k] a mixture-of-experts layer's routing (NULL: a dense model) */
    float *moe_wts;   /* [T, k] float32 */
} atlas_acts;

/* Logit rows computed at once when they have a buffer of their own (gate_up too small). */
enum { ATLAS_LOGIT_CHUNK = 16 };

struct atlas_model {
    atomic_int handles;
    pthread_mutex_t forward_mu; /* one forward at a time */
    char *dir;
    atlas_config cfg;
    atlas_st *st;
    atlas_tokenizer *tok;
    atlas_backend *be;
    char backend_why[512];
    char quant_str[96];   /* atlas_model_info.quantization */
    char formats[480];    /* atlas_model_info.formats */
    char kv_note[128];    /* atlas_model_info.kv_scales */
    const char *load_source; /* atlas_model_info.load_source (static text) */
    size_t load_cached;   /* atlas_model_info.load_cached_bytes */
    const char *tier_off; /* atlas_model_info.host_tier (static text) */
    atlas_model_load_times times; /* atlas_model_info.times */
    atlas_model_weights w;
    atlas_kv *kv;
    int kv_blocks, kv_block_size, max_batch_tokens, n_threads;
    int mlp_chunk; /* rows of the MLP buffers: min(mlp_chunk_tokens, max_batch_tokens) */
    int logit_chunk; /* logit rows computed at once (each chunk reads all of lm_head) */
    bool logits_in_gate_up; /* acts.logits points into acts.gate_up (not freed on its own) */
    size_t kv_bytes;
    atlas_acts acts;
    int32_t eos[ATLAS_MAX_EOS];
    int n_eos;
    int tp_rank, tp_size;          /* tensor parallelism; 0 / 1: the whole model */
    atlas_all_reduce_fn all_reduce; /* sums a->o over the ranks; NULL: the backend's op */
    void *all_reduce_ctx;
    /* steps queued by atlas_model_forward_argmax_queue or _sample_queue, not yet
     * collected: q_n of them from ring slot q_head, q_rows ids each; q_ids
     * [2][max_batch_tokens] holds them where the backend has no argmax_queue (computed at
     * once), and q_tok [max_batch_tokens] such a step's tokens with the step before's ids
     * put in */
    int q_head, q_n, q_rows[2];
    int32_t *q_ids, *q_tok;
};

/* Before the weights load (model/load_source.c): asks the backend for the host tier
 * (p->host_cache, the files' identity; expect: the weights' bytes) and sets m->load_source
 * (host, page_cache or disk: whether every page of the files was cached) and m->tier_off. */
atlas_status atlas_model_load_source(atlas_model *m, const atlas_model_params *p,
                                     size_t expect);

#endif

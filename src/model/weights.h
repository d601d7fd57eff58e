/* model/weights.h — binding a checkpoint's tensors to the forward pass's weights.  Internal.
 *
 * Names are those of Hugging Face's Llama/Mistral/Qwen2/Qwen3 (model.layers.N.self_attn.
 * q_proj.weight, ...); Gemma3ForConditionalGeneration's text model is under
 * language_model.model. (as published) or model.language_model. (as newer transformers save
 * it), found by its embedding. A Gemma norm is loaded as 1 + w (the source's offset). A
 * mixture-of-experts layer binds its router and its experts' per-expert tensors as two
 * stacked weights (docs/MODELS.md); gpt-oss's stacked expert tensors become the same parts
 * (model/experts_oss.h), with its router's and experts' biases and its attention sinks.
 * q|k|v are fused into one qkv weight [(H + 2K) * hd, d] and gate|up into one gate_up weight
 * [2f, d] through the backend's weight_load, their biases likewise.
 * Every tensor's shape and dtype is checked, and an error names the tensor.
 *
 * Every tensor of the checkpoint is accounted for before anything loads: bound, or matched
 * by a row of the ignore table in weights.c (tensors a family's checkpoints may carry that
 * mean nothing to the forward: a saved RoPE table, lm_head.weight beside tied embeddings).
 * Any other tensor fails the load, named: ignoring it would compute another model than the
 * checkpoint's (a bias the config does not call for, a family atlas does not know). The
 * check covers the whole model on every tensor-parallel rank, whatever the rank holds. */
#ifndef ATLAS_MODEL_WEIGHTS_H
#define ATLAS_MODEL_WEIGHTS_H

#include <stdint.h>

#include "backend/backend.h"
#include "model/config.h"
#include "format/safetensors.h"

typedef struct atlas_layer_weights {
    atlas_weight *attn_norm; /* [d] input_layernorm */
    atlas_weight *qkv;       /* [(H + 2K) * hd, d] */
    atlas_weight *qkv_bias;  /* [(H + 2K) * hd] or NULL */
    atlas_weight *q_norm;    /* [hd] or NULL (Qwen3) */
    atlas_weight *k_norm;    /* [hd] or NULL (Qwen3) */
    atlas_weight *o;         /* [d, H * hd] */
    atlas_weight *o_bias;    /* [d] or NULL (tensor parallel: rank 0's only) */
    atlas_weight *mlp_norm;  /* [d] post_attention_layernorm (Gemma 3: pre_feedforward_layernorm) */
    atlas_weight *attn_out_norm; /* [d] Gemma 3's post_attention_layernorm, or NULL */
    atlas_weight *mlp_out_norm;  /* [d] Gemma 3's post_feedforward_layernorm, or NULL */
    atlas_weight *gate_up;   /* [2f, d] */
    atlas_weight *gate_up_bias; /* [2f] or NULL (Llama's mlp_bias) */
    atlas_weight *down;      /* [d, f] */
    atlas_weight *down_bias; /* [d] or NULL (tensor parallel: rank 0's only) */
    /* a mixture-of-experts layer (gate_up and down NULL; backend.h's moe ops): */
    atlas_weight *router;          /* [E, d] mlp.gate (Mixtral: block_sparse_moe.gate;
                                      gpt-oss: mlp.router) */
    atlas_weight *router_bias;     /* [E] or NULL (gpt-oss) */
    atlas_weight *experts_gate_up; /* [E * 2f, d]: expert e's gate rows then its up rows */
    atlas_weight *experts_gate_up_bias; /* [E * 2f] or NULL (gpt-oss) */
    atlas_weight *experts_down;    /* [E * d, f] */
    atlas_weight *experts_down_bias;    /* [E * d] or NULL (gpt-oss) */
    atlas_weight *sinks;           /* [H] self_attn.sinks or NULL (gpt-oss) */
} atlas_layer_weights;

/* The weight groups `atlas info` reports a format and bytes for. */
typedef enum atlas_wgroup { /* MLP: the dense MLPs and the MoE routers */
    ATLAS_WG_EMBED, ATLAS_WG_ATTN, ATLAS_WG_MLP, ATLAS_WG_EXPERTS, ATLAS_WG_NORM, ATLAS_WG_HEAD,
    ATLAS_WG_COUNT
} atlas_wgroup;

typedef struct atlas_wgroup_info {
    char format[48]; /* "BF16", "FP8 e4m3 block 128x128", "INT4 group 128", "mixed"; "" none */
    size_t bytes;    /* in the files: packed weights, scales, zero points and indices */
} atlas_wgroup_info;

typedef struct atlas_model_weights {
    atlas_weight *embed;         /* [vocab, d] */
    atlas_weight *norm;          /* [d] */
    atlas_weight *lm_head;       /* [vocab, d]; == embed when tied */
    int n_layers;
    atlas_layer_weights *layers; /* [n_layers] */
    int64_t n_params;            /* elements of the tensors bound (tied counted once) */
    size_t n_bytes;              /* their bytes in the files */
    atlas_dtype dtype;           /* of the big matrices; ATLAS_DTYPE_COUNT when mixed */
    atlas_wgroup_info groups[ATLAS_WG_COUNT]; /* tied: lm_head is the embedding's */
    void **owned;                /* tensor parallel: gathered column bands the backend's
                                    weights may point into (o_proj, down_proj) */
    int n_owned, cap_owned;
    double repack_ms;            /* spent in atlas_quant_bind reading and repacking the
                                    quantized weights (model.h atlas_model_load_times) */
} atlas_model_weights;

/* Binds every weight the config calls for. On failure nothing stays loaded. */
atlas_status atlas_weights_load(atlas_backend *be, const atlas_st *st, const atlas_config *cfg,
                                atlas_model_weights *out);
/* As atlas_weights_load, but only this rank's part of each tensor (model/shard.h):
 * q/k/v and gate/up rows, o_proj/down_proj columns, lm_head on rank 0 only (NULL on the
 * others unless tied). plan NULL: the whole model, exactly as atlas_weights_load. Sizes in
 * n_params / n_bytes are this rank's. progress (NULL, or fn NULL: none) is told of the bytes
 * read (model/weight_read.h); its total is set here, its fn, user and mutex are the
 * caller's. */
struct atlas_shard_plan;
struct atlas_load_progress;
atlas_status atlas_weights_load_shard(atlas_backend *be, const atlas_st *st,
                                      const atlas_config *cfg,
                                      const struct atlas_shard_plan *plan,
                                      struct atlas_load_progress *progress,
                                      atlas_model_weights *out);
/* What the binding would read, found from the headers alone (no tensor data): every
 * tensor the config calls for is looked up and its shape and dtype checked, as a load
 * does, with the same errors.  n_params counts every tensor bound (tied: once), n_bytes
 * what this rank reads (plan NULL: the whole model), dtype that of the big matrices
 * (ATLAS_DTYPE_COUNT: mixed). */
typedef struct atlas_weights_sum {
    int64_t n_params;
    size_t n_bytes;
    atlas_dtype dtype;
    atlas_wgroup_info groups[ATLAS_WG_COUNT]; /* as atlas_model_weights.groups after a load */
} atlas_weights_sum;
atlas_status atlas_weights_survey(const atlas_st *st, const atlas_config *cfg,
                                  const struct atlas_shard_plan *plan, atlas_weights_sum *out);
/* "embedding BF16 1.0 MiB; attention INT4 group 128 2.0 MiB; ...; lm_head tied" of
 * groups (a load's or a survey's), into buf[cap]. */
void atlas_weights_formats(const atlas_wgroup_info *groups, const atlas_config *c, char *buf,
                           size_t cap);
/* The weight bytes a decode token reads: the layers' tensors as stored (packed weights with
 * their scales, zero points and indices; norms too), of a mixture-of-experts layer's experts
 * only the k a token is routed to (k / E of them, the routers whole), the output head as
 * stored (the embedding when tied) and one row of the embedding. */
size_t atlas_weights_token_bytes(const atlas_wgroup_info *groups, const atlas_config *c);
/* Frees what atlas_weights_load bound; a zeroed struct is fine. */
void atlas_weights_free(atlas_backend *be, atlas_model_weights *w);

#endif

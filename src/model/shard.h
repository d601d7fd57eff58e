/* model/shard.h — how a Llama-family model (Llama, Mistral, Qwen2, Qwen3) is split across
 * the N ranks of tensor parallelism, Megatron-style.  Internal.
 *
 * Every rank holds the whole residual stream x[n, d]; per layer it owns
 *   - H/N query heads and their K/V heads: the rows of q_proj, k_proj, v_proj (and of their
 *     biases) for those heads: Megatron's "column-parallel" linear (split output features);
 *   - the matching H/N * hd input columns of o_proj: "row-parallel" (split input features),
 *     whose partial outputs the first all-reduce sums;
 *   - f/N columns of the MLP: those rows of gate_proj and up_proj, the same input columns of
 *     down_proj, summed by the second all-reduce;
 *   - its K/V heads' part of the paged KV cache.
 * Norms, q_norm/k_norm and the embedding are replicated (every rank needs all of x); lm_head
 * and the biases of o_proj/down_proj live on rank 0 only (logits and sampling are rank 0's;
 * a row-parallel bias must be added once, before the sum).
 *
 * K/V heads: with N <= K each rank owns K/N of them (K % N == 0). With N > K (e.g. 8 KV
 * heads on 16 ranks) each KV head is replicated on N/K consecutive ranks, as vLLM does
 * (N % K == 0): rank r holds KV head r / (N/K), which is the head of all its q heads since
 * H/N divides the GQA group H/K. Impossible splits (H % N, f % N, K vs N) are errors that say
 * which count does not divide.
 *
 * Weights are [out, in] row-major (torch's nn.Linear.weight). A rank's part of a tensor is a
 * rectangle rows [row0, row0 + n_rows) x cols [col0, col0 + n_cols), which in the file is
 * n_chunks byte ranges of `chunk` bytes, the first at `offset`, each next `stride` further:
 * one range for a row split, one per row for a column split. */
#ifndef ATLAS_PARALLEL_SHARD_H
#define ATLAS_PARALLEL_SHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "atlas/status.h"
#include "core/dtype.h"
#include "model/config.h"
#include "format/safetensors.h"

/* The model dimensions sharding depends on (a subset of atlas_config). */
typedef struct atlas_shard_geom {
    int hidden;       /* d */
    int n_heads;      /* H */
    int n_kv_heads;   /* K */
    int head_dim;     /* hd */
    int intermediate; /* f */
    int vocab_size;   /* V */
    int n_layers;
    bool tie_embeddings; /* no lm_head.weight in the checkpoint */
    bool qkv_bias;       /* q/k/v_proj.bias */
    bool o_bias;         /* o_proj.bias */
    bool mlp_bias;       /* gate/up/down_proj.bias */
    bool qk_norm;        /* q_norm/k_norm.weight (Qwen3) */
    bool fused_proj;     /* qkv_proj and gate_up_proj (Phi3): split as the tensors they join */
    bool post_norms;     /* pre_ and post_feedforward_layernorm (Gemma 3) */
} atlas_shard_geom;

void atlas_shard_geom_from_config(const atlas_config *cfg, atlas_shard_geom *out);

/* What one rank owns. */
typedef struct atlas_shard_plan {
    atlas_shard_geom g;
    int world, rank;
    int q_head0, n_q_heads;   /* q heads [q_head0, q_head0 + n_q_heads): H/N of them */
    int kv_head0, n_kv_heads; /* KV heads: max(K/N, 1) of them */
    int kv_replicas;          /* ranks that hold each KV head: 1, or N/K when N > K */
    int mlp0, n_mlp;          /* intermediate columns [mlp0, mlp0 + n_mlp): f/N of them */
} atlas_shard_plan;

/* The plan of `rank` among `world` ranks. ATLAS_ERR_INVALID for a world < 1 or a rank
 * outside it; ATLAS_ERR_UNSUPPORTED, naming the count, for a split that does not divide. */
atlas_status atlas_shard_plan_make(const atlas_shard_geom *g, int world, int rank,
                                   atlas_shard_plan *out);

/* Bytes of KV cache one token takes on this rank (all layers, K and V), elem bytes each. */
size_t atlas_shard_kv_token_bytes(const atlas_shard_plan *p, size_t elem);

typedef enum atlas_shard_kind {
    ATLAS_SHARD_REPLICATED = 0, /* every rank holds all of it */
    ATLAS_SHARD_ROWS,           /* split along dim 0 (output features): column-parallel */
    ATLAS_SHARD_COLS,           /* split along dim 1 (input features): row-parallel */
    ATLAS_SHARD_LEAD,           /* rank 0 holds all of it, the others none */
} atlas_shard_kind;

/* One rank's part of one tensor (see the header comment). A 1-D tensor has cols 1. */
typedef struct atlas_shard_slice {
    atlas_shard_kind kind;
    bool present;          /* false when this rank holds none of it (LEAD, rank > 0) */
    int64_t rows, cols;    /* the full tensor [rows, cols] */
    int64_t row0, n_rows;  /* this rank's rectangle */
    int64_t col0, n_cols;
    size_t elem;           /* bytes per element */
    size_t offset;         /* byte offset of the first range in the full tensor */
    size_t chunk;          /* bytes in each range */
    size_t stride;         /* bytes from one range's start to the next's */
    int64_t n_chunks;      /* ranges; 0 when not present */
} atlas_shard_slice;

/* This rank's part of the checkpoint tensor `name` (Hugging Face's names: model.embed_tokens.
 * weight, model.layers.N.self_attn.q_proj.weight, ...), after checking that its shape is
 * what the geometry calls for. Errors name the tensor: ATLAS_ERR_FORMAT for a wrong shape
 * or a layer index out of range, ATLAS_ERR_UNSUPPORTED for a tensor sharding knows nothing
 * of, ATLAS_ERR_INVALID for a dtype of no fixed size. */
atlas_status atlas_shard_tensor(const atlas_shard_plan *p, const char *name, int ndim,
                                const int64_t *shape, atlas_dtype dtype, atlas_shard_slice *out);

/* Copies the slice's bytes out of the full tensor `src` into dst (n_rows * n_cols * elem
 * bytes, row-major [n_rows, n_cols]). Nothing when not present. */
void atlas_shard_slice_copy(const atlas_shard_slice *s, const void *src, void *dst);

/* This rank's part of a checkpoint tensor as a view, for a source of the backend's
 * weight_load (model/weight_read.h): a row split points into the mapping and into the file
 * (fd, file_offset: no copy); a column band is gathered into *owned (malloc'd, the caller
 * frees it once the weight is loaded; NULL when nothing was copied; fd -1). *present is
 * false, and *out untouched, when this rank holds none of it. out->name and out->file are
 * full's. Errors as atlas_shard_tensor's, and ATLAS_ERR_NOMEM. */
atlas_status atlas_shard_view(const atlas_shard_plan *p, const atlas_tensor_view *full,
                              atlas_tensor_view *out, void **owned, bool *present);

/* The tensors the geometry calls for, in checkpoint order: how many, and the name and shape
 * of the i-th (shape[1] = 1 and *ndim = 1 for a vector). Used by tests and loaders to go
 * through every weight. */
int atlas_shard_tensor_count(const atlas_shard_geom *g);
void atlas_shard_tensor_info(const atlas_shard_geom *g, int i, char *name, size_t cap,
                             int *ndim, int64_t shape[2]);

#endif

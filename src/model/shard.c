/* model/shard.c — Megatron split arithmetic; see shard.h. */
#include "model/shard.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

void atlas_shard_geom_from_config(const atlas_config *cfg, atlas_shard_geom *out) {
    memset(out, 0, sizeof *out);
    out->hidden = cfg->hidden;
    out->n_heads = cfg->n_heads;
    out->n_kv_heads = cfg->n_kv_heads;
    out->head_dim = cfg->head_dim;
    out->intermediate = cfg->intermediate;
    out->vocab_size = cfg->vocab_size;
    out->n_layers = cfg->n_layers;
    out->tie_embeddings = cfg->tie_embeddings;
    out->qkv_bias = cfg->qkv_bias;
    out->o_bias = cfg->o_bias;
    out->mlp_bias = cfg->mlp_bias;
    out->qk_norm = cfg->qk_norm;
    out->fused_proj = cfg->fused_proj;
    out->post_norms = cfg->post_norms;
}

static atlas_status check_geom(const atlas_shard_geom *g) {
    if (g->hidden < 1 || g->n_heads < 1 || g->n_kv_heads < 1 || g->head_dim < 1 ||
        g->intermediate < 1 || g->vocab_size < 1 || g->n_layers < 1)
        return atlas_fail(ATLAS_ERR_INVALID, "shard: geometry has a count < 1 (hidden %d, "
                          "heads %d, kv heads %d, head_dim %d, intermediate %d, vocab %d, "
                          "layers %d)", g->hidden, g->n_heads, g->n_kv_heads, g->head_dim,
                          g->intermediate, g->vocab_size, g->n_layers);
    if (g->n_heads % g->n_kv_heads)
        return atlas_fail(ATLAS_ERR_INVALID, "shard: %d KV heads do not divide %d attention "
                          "heads", g->n_kv_heads, g->n_heads);
    return ATLAS_OK;
}

atlas_status atlas_shard_plan_make(const atlas_shard_geom *g, int world, int rank,
                                   atlas_shard_plan *out) {
    memset(out, 0, sizeof *out);
    if (world < 1) return atlas_fail(ATLAS_ERR_INVALID, "tensor parallel size %d < 1", world);
    if (rank < 0 || rank >= world)
        return atlas_fail(ATLAS_ERR_INVALID, "rank %d outside 0..%d", rank, world - 1);
    ATLAS_TRY(check_geom(g));
    int H = g->n_heads, K = g->n_kv_heads, f = g->intermediate;
    if (H % world)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "tensor parallel size %d does not divide the "
                          "%d attention heads (num_attention_heads)", world, H);
    if (world <= K && K % world)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "tensor parallel size %d does not divide the "
                          "%d KV heads (num_key_value_heads)", world, K);
    if (world > K && world % K)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "tensor parallel size %d is above the %d KV "
                          "heads (num_key_value_heads) and not a multiple of them: KV heads "
                          "cannot be replicated evenly", world, K);
    if (f % world)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "tensor parallel size %d does not divide the "
                          "%d MLP columns (intermediate_size)", world, f);
    out->g = *g;
    out->world = world;
    out->rank = rank;
    out->n_q_heads = H / world;
    out->q_head0 = rank * out->n_q_heads;
    if (world <= K) {
        out->kv_replicas = 1;
        out->n_kv_heads = K / world;
        out->kv_head0 = rank * out->n_kv_heads;
    } else {
        out->kv_replicas = world / K;
        out->n_kv_heads = 1;
        out->kv_head0 = rank / out->kv_replicas;
    }
    /* every q head of this rank attends with a KV head this rank holds */
    assert(out->q_head0 / (H / K) == out->kv_head0);
    out->n_mlp = f / world;
    out->mlp0 = rank * out->n_mlp;
    return ATLAS_OK;
}

size_t atlas_shard_kv_token_bytes(const atlas_shard_plan *p, size_t elem) {
    return (size_t)p->g.n_layers * 2 * (size_t)p->n_kv_heads * (size_t)p->g.head_dim * elem;
}

/* --- the tensors and their rules ------------------------------------------------------------ */

typedef enum split_what { SPLIT_NONE, SPLIT_Q, SPLIT_KV, SPLIT_MLP } split_what;
typedef enum dim_id { DIM_ONE, DIM_D, DIM_Q, DIM_KV, DIM_F, DIM_V, DIM_HD, DIM_QKV, DIM_2F } dim_id;
typedef enum flag_id {
    F_ALWAYS, F_QKV_BIAS, F_O_BIAS, F_MLP_BIAS, F_QK_NORM, F_UNTIED,
    F_SPLIT, /* q/k/v_proj and gate/up_proj as separate tensors */
    F_FUSED, /* Phi3's qkv_proj and gate_up_proj */
    F_POST_NORMS, /* Gemma 3's norms around the MLP */
} flag_id;

typedef struct tensor_rule {
    const char *name;  /* after "model.layers.N." for layer tensors */
    atlas_shard_kind kind;
    split_what split;
    dim_id rows, cols; /* cols DIM_ONE: a vector */
    flag_id flag;      /* when the geometry calls for it */
} tensor_rule;

static const tensor_rule layer_rules[] = {
    {"input_layernorm.weight", ATLAS_SHARD_REPLICATED, SPLIT_NONE, DIM_D, DIM_ONE, F_ALWAYS},
    {"self_attn.q_proj.weight", ATLAS_SHARD_ROWS, SPLIT_Q, DIM_Q, DIM_D, F_SPLIT},
    {"self_attn.q_proj.bias", ATLAS_SHARD_ROWS, SPLIT_Q, DIM_Q, DIM_ONE, F_QKV_BIAS},
    {"self_attn.k_proj.weight", ATLAS_SHARD_ROWS, SPLIT_KV, DIM_KV, DIM_D, F_SPLIT},
    {"self_attn.k_proj.bias", ATLAS_SHARD_ROWS, SPLIT_KV, DIM_KV, DIM_ONE, F_QKV_BIAS},
    {"self_attn.v_proj.weight", ATLAS_SHARD_ROWS, SPLIT_KV, DIM_KV, DIM_D, F_SPLIT},
    {"self_attn.v_proj.bias", ATLAS_SHARD_ROWS, SPLIT_KV, DIM_KV, DIM_ONE, F_QKV_BIAS},
    {"self_attn.qkv_proj.weight", ATLAS_SHARD_ROWS, SPLIT_NONE, DIM_QKV, DIM_D, F_FUSED},
    {"self_attn.q_norm.weight", ATLAS_SHARD_REPLICATED, SPLIT_NONE, DIM_HD, DIM_ONE, F_QK_NORM},
    {"self_attn.k_norm.weight", ATLAS_SHARD_REPLICATED, SPLIT_NONE, DIM_HD, DIM_ONE, F_QK_NORM},
    {"self_attn.o_proj.weight", ATLAS_SHARD_COLS, SPLIT_Q, DIM_D, DIM_Q, F_ALWAYS},
    {"self_attn.o_proj.bias", ATLAS_SHARD_LEAD, SPLIT_NONE, DIM_D, DIM_ONE, F_O_BIAS},
    {"post_attention_layernorm.weight", ATLAS_SHARD_REPLICATED, SPLIT_NONE, DIM_D, DIM_ONE,
     F_ALWAYS},
    {"pre_feedforward_layernorm.weight", ATLAS_SHARD_REPLICATED, SPLIT_NONE, DIM_D, DIM_ONE,
     F_POST_NORMS},
    {"post_feedforward_layernorm.weight", ATLAS_SHARD_REPLICATED, SPLIT_NONE, DIM_D, DIM_ONE,
     F_POST_NORMS},
    {"mlp.gate_proj.weight", ATLAS_SHARD_ROWS, SPLIT_MLP, DIM_F, DIM_D, F_SPLIT},
    {"mlp.gate_proj.bias", ATLAS_SHARD_ROWS, SPLIT_MLP, DIM_F, DIM_ONE, F_MLP_BIAS},
    {"mlp.up_proj.weight", ATLAS_SHARD_ROWS, SPLIT_MLP, DIM_F, DIM_D, F_SPLIT},
    {"mlp.up_proj.bias", ATLAS_SHARD_ROWS, SPLIT_MLP, DIM_F, DIM_ONE, F_MLP_BIAS},
    {"mlp.gate_up_proj.weight", ATLAS_SHARD_ROWS, SPLIT_NONE, DIM_2F, DIM_D, F_FUSED},
    {"mlp.down_proj.weight", ATLAS_SHARD_COLS, SPLIT_MLP, DIM_D, DIM_F, F_ALWAYS},
    {"mlp.down_proj.bias", ATLAS_SHARD_LEAD, SPLIT_NONE, DIM_D, DIM_ONE, F_MLP_BIAS},
};
enum { N_LAYER_RULES = (int)(sizeof layer_rules / sizeof layer_rules[0]) };

static const tensor_rule embed_rule = {"model.embed_tokens.weight", ATLAS_SHARD_REPLICATED,
                                       SPLIT_NONE, DIM_V, DIM_D, F_ALWAYS};
static const tensor_rule norm_rule = {"model.norm.weight", ATLAS_SHARD_REPLICATED, SPLIT_NONE,
                                      DIM_D, DIM_ONE, F_ALWAYS};
static const tensor_rule head_rule = {"lm_head.weight", ATLAS_SHARD_LEAD, SPLIT_NONE, DIM_V,
                                      DIM_D, F_UNTIED};

static int64_t dim_value(const atlas_shard_geom *g, dim_id d) {
    switch (d) {
    case DIM_D: return g->hidden;
    case DIM_Q: return (int64_t)g->n_heads * g->head_dim;
    case DIM_KV: return (int64_t)g->n_kv_heads * g->head_dim;
    case DIM_F: return g->intermediate;
    case DIM_V: return g->vocab_size;
    case DIM_HD: return g->head_dim;
    case DIM_QKV: return (int64_t)(g->n_heads + 2 * g->n_kv_heads) * g->head_dim;
    case DIM_2F: return 2 * (int64_t)g->intermediate;
    case DIM_ONE: return 1;
    }
    return 0;
}

static bool flag_on(const atlas_shard_geom *g, flag_id f) {
    switch (f) {
    case F_ALWAYS: return true;
    case F_QKV_BIAS: return g->qkv_bias;
    case F_O_BIAS: return g->o_bias;
    case F_MLP_BIAS: return g->mlp_bias;
    case F_QK_NORM: return g->qk_norm;
    case F_UNTIED: return !g->tie_embeddings;
    case F_SPLIT: return !g->fused_proj;
    case F_FUSED: return g->fused_proj;
    case F_POST_NORMS: return g->post_norms;
    }
    return false;
}

/* Finds the rule of a checkpoint name; *layer gets the layer index (-1 for global ones). */
static atlas_status find_rule(const atlas_shard_plan *p, const char *name,
                              const tensor_rule **out) {
    static const char prefix[] = "model.layers.";
    if (strncmp(name, prefix, sizeof prefix - 1) == 0) {
        const char *s = name + sizeof prefix - 1;
        char *end = NULL;
        long layer = strtol(s, &end, 10);
        if (end == s || *end != '.' || (*s < '0' || *s > '9'))
            return atlas_fail(ATLAS_ERR_UNSUPPORTED, "shard: %s: no layer index", name);
        if (layer >= p->g.n_layers)
            return atlas_fail(ATLAS_ERR_FORMAT, "shard: %s: layer %ld, the model has %d", name,
                              layer, p->g.n_layers);
        for (int i = 0; i < N_LAYER_RULES; i++)
            if (strcmp(end + 1, layer_rules[i].name) == 0) {
                *out = &layer_rules[i];
                return ATLAS_OK;
            }
    } else {
        const tensor_rule *globals[] = {&embed_rule, &norm_rule, &head_rule};
        for (int i = 0; i < 3; i++)
            if (strcmp(name, globals[i]->name) == 0) {
                *out = globals[i];
                return ATLAS_OK;
            }
    }
    return atlas_fail(ATLAS_ERR_UNSUPPORTED, "shard: %s: not a tensor of a Llama-family model: "
                      "do not know how to split it", name);
}

static atlas_status check_shape(const tensor_rule *r, const atlas_shard_geom *g,
                                const char *name, int ndim, const int64_t *shape) {
    int want_ndim = r->cols == DIM_ONE ? 1 : 2;
    int64_t rows = dim_value(g, r->rows), cols = dim_value(g, r->cols);
    bool ok = ndim == want_ndim && shape[0] == rows && (ndim == 1 || shape[1] == cols);
    if (ok) return ATLAS_OK;
    char got[64];
    if (ndim == 1) snprintf(got, sizeof got, "[%lld]", (long long)shape[0]);
    else if (ndim == 2)
        snprintf(got, sizeof got, "[%lld, %lld]", (long long)shape[0], (long long)shape[1]);
    else snprintf(got, sizeof got, "%d dimensions", ndim);
    if (want_ndim == 1)
        return atlas_fail(ATLAS_ERR_FORMAT, "shard: %s: shape %s, want [%lld]", name, got,
                          (long long)rows);
    return atlas_fail(ATLAS_ERR_FORMAT, "shard: %s: shape %s, want [%lld, %lld]", name, got,
                      (long long)rows, (long long)cols);
}

/* The part [first, first + count) of the split dimension this rank owns. */
static void split_range(const atlas_shard_plan *p, split_what w, int64_t *first, int64_t *count) {
    int64_t hd = p->g.head_dim;
    switch (w) {
    case SPLIT_Q: *first = p->q_head0 * hd; *count = p->n_q_heads * hd; return;
    case SPLIT_KV: *first = p->kv_head0 * hd; *count = p->n_kv_heads * hd; return;
    case SPLIT_MLP: *first = p->mlp0; *count = p->n_mlp; return;
    case SPLIT_NONE: break;
    }
    *first = 0;
    *count = 0;
}

atlas_status atlas_shard_tensor(const atlas_shard_plan *p, const char *name, int ndim,
                                const int64_t *shape, atlas_dtype dtype, atlas_shard_slice *out) {
    memset(out, 0, sizeof *out);
    const tensor_rule *r = NULL;
    ATLAS_TRY(find_rule(p, name, &r));
    ATLAS_TRY(check_shape(r, &p->g, name, ndim, shape));
    size_t elem = atlas_dtype_size(dtype);
    if (elem == 0)
        return atlas_fail(ATLAS_ERR_INVALID, "shard: %s: dtype %d has no element size", name,
                          (int)dtype);
    atlas_shard_slice *s = out;
    s->kind = r->kind;
    s->elem = elem;
    s->rows = shape[0];
    s->cols = ndim == 2 ? shape[1] : 1;
    s->present = r->kind != ATLAS_SHARD_LEAD || p->rank == 0;
    if (!s->present) return ATLAS_OK;
    s->n_rows = s->rows;
    s->n_cols = s->cols;
    if (r->kind == ATLAS_SHARD_ROWS) split_range(p, r->split, &s->row0, &s->n_rows);
    if (r->kind == ATLAS_SHARD_COLS) split_range(p, r->split, &s->col0, &s->n_cols);
    size_t row_bytes = (size_t)s->cols * elem;
    if (s->n_cols == s->cols) { /* whole rows: one contiguous range */
        s->offset = (size_t)s->row0 * row_bytes;
        s->chunk = (size_t)s->n_rows * row_bytes;
        s->stride = s->chunk;
        s->n_chunks = 1;
    } else { /* a column band: one range per row */
        s->offset = (size_t)s->row0 * row_bytes + (size_t)s->col0 * elem;
        s->chunk = (size_t)s->n_cols * elem;
        s->stride = row_bytes;
        s->n_chunks = s->n_rows;
    }
    return ATLAS_OK;
}

void atlas_shard_slice_copy(const atlas_shard_slice *s, const void *src, void *dst) {
    const char *from = (const char *)src + s->offset;
    char *to = dst;
    for (int64_t i = 0; i < s->n_chunks; i++)
        memcpy(to + (size_t)i * s->chunk, from + (size_t)i * s->stride, s->chunk);
}

atlas_status atlas_shard_view(const atlas_shard_plan *p, const atlas_tensor_view *full,
                              atlas_tensor_view *out, void **owned, bool *present) {
    *owned = NULL;
    *present = false;
    atlas_shard_slice s;
    ATLAS_TRY(atlas_shard_tensor(p, full->name, full->n_dims, full->shape, full->dtype, &s));
    if (!s.present) return ATLAS_OK;
    if ((size_t)(s.rows * s.cols) * s.elem != full->nbytes)
        return atlas_fail(ATLAS_ERR_FORMAT, "shard: %s: %zu bytes for %lld elements of %s",
                          full->name, full->nbytes, (long long)(s.rows * s.cols),
                          atlas_dtype_name(full->dtype));
    *out = *full;
    out->shape[0] = s.n_rows;
    if (full->n_dims == 2) out->shape[1] = s.n_cols;
    out->nbytes = (size_t)(s.n_rows * s.n_cols) * s.elem;
    if (s.n_chunks == 1) {
        out->data = (const char *)full->data + s.offset;
        out->file_offset = full->file_offset + s.offset; /* read there: model/weight_read.h */
    } else {
        void *copy = malloc(out->nbytes);
        if (!copy)
            return atlas_fail(ATLAS_ERR_NOMEM, "shard: %s: %zu bytes", full->name, out->nbytes);
        atlas_shard_slice_copy(&s, full->data, copy);
        out->data = copy;
        out->fd = -1; /* in memory now: not in the file at any one offset */
        out->file_offset = 0;
        *owned = copy;
    }
    *present = true;
    return ATLAS_OK;
}

/* --- enumeration ---------------------------------------------------------------------------- */

/* The i-th tensor the geometry calls for: its rule and layer (-1: global). 0 when i is past
 * the end. Walks the rules: a model has at most a few thousand tensors. */
static int nth_tensor(const atlas_shard_geom *g, int i, const tensor_rule **rule, int *layer) {
    int k = 0;
    if (k++ == i) { *rule = &embed_rule; *layer = -1; return 1; }
    for (int l = 0; l < g->n_layers; l++)
        for (int j = 0; j < N_LAYER_RULES; j++)
            if (flag_on(g, layer_rules[j].flag) && k++ == i) {
                *rule = &layer_rules[j];
                *layer = l;
                return 1;
            }
    if (k++ == i) { *rule = &norm_rule; *layer = -1; return 1; }
    if (flag_on(g, head_rule.flag) && k++ == i) { *rule = &head_rule; *layer = -1; return 1; }
    return 0;
}

int atlas_shard_tensor_count(const atlas_shard_geom *g) {
    int per_layer = 0;
    for (int j = 0; j < N_LAYER_RULES; j++) per_layer += flag_on(g, layer_rules[j].flag);
    return 2 + g->n_layers * per_layer + (flag_on(g, head_rule.flag) ? 1 : 0);
}

void atlas_shard_tensor_info(const atlas_shard_geom *g, int i, char *name, size_t cap,
                             int *ndim, int64_t shape[2]) {
    const tensor_rule *r = NULL;
    int layer = -1;
    if (!nth_tensor(g, i, &r, &layer)) {
        if (cap) name[0] = '\0';
        *ndim = 0;
        shape[0] = shape[1] = 0;
        return;
    }
    if (layer >= 0) snprintf(name, cap, "model.layers.%d.%s", layer, r->name);
    else snprintf(name, cap, "%s", r->name);
    *ndim = r->cols == DIM_ONE ? 1 : 2;
    shape[0] = dim_value(g, r->rows);
    shape[1] = dim_value(g, r->cols);
}

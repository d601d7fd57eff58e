/* backend/cpu/cpu_attention.c — causal attention of the batch's q heads over the paged KV
 * cache (GQA, optional sliding window, optional sinks), fp32.
 *
 * One work item is one (token, q head). Softmax is computed online (running maximum and
 * rescaled sum), so no score buffer of context length is needed. A sink (gpt-oss) is one
 * more logit with no value: the running maximum starts at it and the sum at its exp(0). */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "core/error.h"

typedef struct attn_job {
    cpu_backend *cb;
    int window;          /* this layer's sliding window; 0: none */
    float *out;          /* [n, H*hd] */
    const float *qkv;    /* [n, (H+2K)*hd] */
    const float *k, *v;  /* this layer's pools [slots, K, hd] */
    const float *sinks;  /* [H] or NULL */
} attn_job;

static void attn_range(void *ctx, int64_t begin, int64_t end, int thread) {
    attn_job *j = ctx;
    cpu_backend *cb = j->cb;
    const atlas_backend_geom *g = &cb->base.geom;
    int H = g->n_heads, K = g->n_kv_heads, hd = g->head_dim;
    int group = H / K, bs = cb->block_size;
    float scale = atlas_geom_attn_scale(g);
    float *acc = cb->scratch + (size_t)thread * cb->scratch_floats; /* [hd] */
    for (int64_t item = begin; item < end; item++) {
        int t = (int)(item / H), h = (int)(item % H), kvh = h / group;
        int s = cb->tok_seq[t], pos = cb->positions[t];
        const float *q = j->qkv + (size_t)t * (H + 2 * K) * hd + (size_t)h * hd;
        const int32_t *table = cb->block_table + (size_t)s * cb->max_blocks;
        int start = 0;
        if (j->window > 0 && pos - j->window + 1 > 0) start = pos - j->window + 1;
        float mx = j->sinks ? j->sinks[h] : -INFINITY, sum = j->sinks ? 1.0f : 0.0f;
        memset(acc, 0, (size_t)hd * sizeof *acc);
        for (int p = start; p <= pos; p++) {
            size_t slot = (size_t)table[p / bs] * bs + p % bs;
            size_t off = (slot * K + kvh) * hd;
            float score = cpu_dot(q, j->k + off, hd) * scale;
            const float *vv = j->v + off;
            if (score > mx) {
                float c = expf(mx - score); /* rescale what was summed so far */
                sum *= c;
                for (int i = 0; i < hd; i++) acc[i] *= c;
                mx = score;
            }
            float e = expf(score - mx);
            sum += e;
            for (int i = 0; i < hd; i++) acc[i] += e * vv[i];
        }
        float *o = j->out + (size_t)t * H * hd + (size_t)h * hd;
        float inv = 1.0f / sum;
        for (int i = 0; i < hd; i++) o[i] = acc[i] * inv;
    }
}

atlas_status cpu_attention(atlas_backend *be, void *out, const void *qkv, const atlas_kv *kv,
                           int layer, const atlas_weight *sinks) {
    cpu_backend *cb = (cpu_backend *)be;
    if (layer < 0 || layer >= kv->n_layers)
        return atlas_fail(ATLAS_ERR_INTERNAL, "cpu attention: layer %d of %d", layer,
                          kv->n_layers);
    if (sinks && (sinks->n_dims != 1 || sinks->cols != be->geom.n_heads))
        return atlas_fail(ATLAS_ERR_INTERNAL, "cpu attention: %lld sinks for %d heads",
                          (long long)sinks->cols, be->geom.n_heads);
    int window = atlas_geom_window(&be->geom, layer);
    attn_job j = {cb, window, out, qkv, kv->k + layer * kv->layer_floats,
                  kv->v + layer * kv->layer_floats, sinks ? sinks->vec : NULL};
    /* An item costs about 2 * context * hd multiply-adds: split only 32k or more a thread. */
    int64_t max_pos = 0;
    for (int t = 0; t < cb->n_tokens; t++)
        if (cb->positions[t] > max_pos) max_pos = cb->positions[t];
    int64_t min_items = 32768 / (2 * (max_pos + 1) * be->geom.head_dim) + 1;
    atlas_threadpool_for(cb->pool, (int64_t)cb->n_tokens * be->geom.n_heads, min_items,
                         attn_range, &j);
    return ATLAS_OK;
}

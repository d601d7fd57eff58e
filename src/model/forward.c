/* model/forward.c — the forward pass of every family (Llama, Mistral, Qwen2, Qwen3, Phi3,
 * Gemma 3, Qwen3-MoE, Mixtral, gpt-oss), written once against the op table; the CPU and
 * CUDA backends both run it.
 *
 *   x = embed(tokens)                                   x[n, d]: the residual stream
 *   h = rmsnorm(x) * attn_norm[0]
 *   per layer l:
 *     qkv = h @ Wqkv^T (+ bias)                         [n, (H + 2K) * hd]
 *     qkv = q/k rmsnorm (Qwen3); rope(q, k); cache <- k, v
 *     att = attention(q, cache)                         [n, H * hd]
 *     x += att @ Wo^T (+ bias);   h = rmsnorm(x) * mlp_norm[l]
 *     x += swiglu(h @ Wgate_up^T (+ bias)) @ Wdown^T (+ bias);
 *                                 h = rmsnorm(x) * (attn_norm[l+1] or norm)
 *       (the MLP over mlp_chunk rows at a time: its [rows, 3f] buffers are the largest)
 *   logits = h[logit_rows] @ lm_head^T                  [n_logits, vocab]
 *     (an embedding model, batch.hidden: h[logit_rows] itself, [n_logits, d], for pooling)
 *
 * A mixture-of-experts layer (Qwen3-MoE, Mixtral, gpt-oss; lw->router set) replaces the MLP
 *     h = rmsnorm(x) * mlp_norm[l];  ids, wts = moe_route(h, router)   (top k of E, [n, k])
 *     x += moe_experts(h, experts_gate_up, experts_down, ids, wts)
 * ops of their own that each backend runs its way (backend.h); its dense layers
 * (mlp_only_layers, decoder_sparse_step) keep the MLP above. gpt-oss adds biases to the
 * router and the experts (the ops' bias arguments), routes and gates as the geometry says,
 * and gives attention each layer's sinks.
 *
 * Gemma 3 (post_norms) norms each projection's output before its residual add,
 *     x += rmsnorm(att @ Wo^T) * attn_out_norm[l];  x += rmsnorm(mlp) * mlp_out_norm[l]
 * (mlp_norm is its pre_feedforward_layernorm), gates with GeLU-tanh (the GLU epilogue), and
 * its embedding scale, per-layer windows and RoPE sets and attention scale are the backend
 * geometry's: data, not ops. Its norm weights arrive as 1 + w (model/weights.c).
 *
 * The fusions are said, not guessed: each norm goes with the matmul after it (rmsnorm_matmul,
 * whose epilogue does rope + KV store of qkv, or swiglu of gate_up), each projection back to
 * d with its residual add (matmul_residual), which is deferred into the next norm of x
 * (backend.h's hand-off); a backend without those kernels runs them as the plain ops
 * (backend/expand.c), with the results of the plain ops. A projection back to d with a bias
 * (Llama's attention_bias and mlp_bias, Qwen3's attention_bias) runs as the plain matmul with
 * its bias and the add: the ops every backend has, their bias the one the q/k/v biases take.
 *
 * Tensor parallelism (tp_size N > 1, docs/TENSOR_PARALLEL.md): the backend geometry holds
 * the rank's H/N heads, its KV heads and f/N MLP columns, so qkv, att, gate_up and act are
 * the rank's slices and the two projections back to d give partial sums; the all-reduce
 * after each adds them up over the ranks, which leaves x identical on every rank. Their
 * biases are rank 0's only (model/shard.h), added once before the sum. Only rank 0 computes
 * logits. At N = 1 nothing here differs from the plain forward.
 */
#include "model/forward.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/expand.h"
#include "core/error.h"
#include "model/model_internal.h"

/* Bad batches come from the engine (or a client's token ids): errors, not assertions. */
static atlas_status check_batch(const atlas_model *m, const atlas_batch *b, int prev) {
    if (b->n_tokens < 1 || b->n_tokens > m->max_batch_tokens)
        return atlas_fail(ATLAS_ERR_RANGE, "batch: n_tokens %d outside 1..%d", b->n_tokens,
                          m->max_batch_tokens);
    if (b->n_seqs < 1 || b->n_seqs > b->n_tokens)
        return atlas_fail(ATLAS_ERR_INVALID, "batch: n_seqs %d for %d tokens", b->n_seqs,
                          b->n_tokens);
    if (b->n_logits < 0 || b->n_logits > b->n_tokens)
        return atlas_fail(ATLAS_ERR_RANGE, "batch: n_logits %d for %d tokens", b->n_logits,
                          b->n_tokens);
    if (b->max_blocks < 1)
        return atlas_fail(ATLAS_ERR_INVALID, "batch: max_blocks %d", b->max_blocks);
    if (!b->tokens) return atlas_fail(ATLAS_ERR_INVALID, "batch: no tokens");
    /* prev: the logit rows of the step queued before, which a queued step's v < 0 names */
    for (int t = 0; t < b->n_tokens; t++) {
        int32_t v = b->tokens[t];
        if (v >= m->cfg.vocab_size || (v < 0 && -1 - (int64_t)v >= prev))
            return atlas_fail(ATLAS_ERR_RANGE, "batch: tokens[%d] = %d outside the vocabulary "
                              "(0..%d)%s", t, v, m->cfg.vocab_size - 1,
                              v >= 0 ? ""
                              : prev ? " and the rows of the step queued before"
                                     : " (an id of the step queued before: a queued step's "
                                       "only, with one queued)");
    }
    for (int i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= b->n_tokens)
            return atlas_fail(ATLAS_ERR_RANGE, "batch: logit_rows[%d] = %d outside 0..%d", i,
                              b->logit_rows[i], b->n_tokens - 1);
    if (b->seq_start[0] != 0 || b->seq_start[b->n_seqs] != b->n_tokens)
        return atlas_fail(ATLAS_ERR_INVALID, "batch: seq_start must run from 0 to n_tokens %d",
                          b->n_tokens);
    int bs = m->kv_block_size;
    for (int s = 0; s < b->n_seqs; s++) {
        int first = b->seq_start[s], end = b->seq_start[s + 1], ctx = b->seq_ctx[s];
        if (end <= first)
            return atlas_fail(ATLAS_ERR_INVALID, "batch: sequence %d has no tokens", s);
        if (ctx < end - first || ctx > b->max_blocks * bs)
            return atlas_fail(ATLAS_ERR_RANGE, "batch: seq_ctx[%d] = %d (its %d tokens, %d "
                              "blocks of %d)", s, ctx, end - first, b->max_blocks, bs);
        for (int t = first; t < end; t++)
            if (b->positions[t] != ctx - (end - t))
                return atlas_fail(ATLAS_ERR_INVALID, "batch: positions[%d] = %d, want %d "
                                  "(consecutive, ending at seq_ctx[%d] - 1)", t, b->positions[t],
                                  ctx - (end - t), s);
        const int32_t *table = b->block_table + (size_t)s * b->max_blocks;
        for (int i = 0; i < (ctx + bs - 1) / bs; i++)
            if (table[i] < 0 || table[i] >= m->kv_blocks)
                return atlas_fail(ATLAS_ERR_RANGE, "batch: block_table[%d][%d] = %d outside "
                                  "0..%d", s, i, table[i], m->kv_blocks - 1);
    }
    return ATLAS_OK;
}

/* The sum over ranks of a->o[n, d] (partial outputs of o_proj or down_proj). */
static atlas_status all_reduce(atlas_model *m, int n, int d) {
    size_t count = (size_t)n * d;
    if (m->all_reduce) return m->all_reduce(m->all_reduce_ctx, m->be, m->acts.o, count);
    if (m->be->ops->all_reduce) return m->be->ops->all_reduce(m->be, m->acts.o, count);
    return atlas_fail(ATLAS_ERR_UNSUPPORTED, "tensor parallel rank %d of %d: no all-reduce "
                      "(the %s backend has none and none was set)", m->tp_rank, m->tp_size,
                      m->be->ops->name);
}

/* x += delta_in @ w^T (+ bias), after all_reduce has summed it over the ranks (tp_size > 1);
 * else by the matmul itself (matmul_residual), or with a bias by matmul and add. */
static atlas_status project_residual(atlas_model *m, void *delta_in, const atlas_weight *w,
                                     const atlas_weight *bias, int n, int d) {
    atlas_backend *be = m->be;
    atlas_acts *a = &m->acts;
    if (m->tp_size == 1 && !bias)
        return atlas_op_matmul_residual(be, a->x, a->o, delta_in, w, n, d);
    ATLAS_TRY(be->ops->matmul(be, a->o, delta_in, w, bias, n));
    if (m->tp_size > 1) ATLAS_TRY(all_reduce(m, n, d));
    return be->ops->add(be, a->x, a->o, n, d);
}

/* x += rmsnorm(delta_in @ w^T (+ bias)) * norm (Gemma 3's post-norms): the sum over ranks
 * comes before the norm. The add's delta is h, which the next norm writes: a backend that
 * defers the add into that norm must read each row's delta before writing its h (the CPU
 * adds at once; the CUDA backend's norm kernel reads a row before it writes it). */
static atlas_status normed_residual(atlas_model *m, void *delta_in, const atlas_weight *w,
                                   const atlas_weight *bias, const atlas_weight *norm, int n,
                                   int d) {
    atlas_backend *be = m->be;
    atlas_acts *a = &m->acts;
    if (delta_in) ATLAS_TRY(be->ops->matmul(be, a->o, delta_in, w, bias, n));
    if (m->tp_size > 1) ATLAS_TRY(all_reduce(m, n, d));
    ATLAS_TRY(be->ops->rmsnorm(be, a->h, a->o, norm, n, d));
    return be->ops->add(be, a->x, a->h, n, d);
}

/* A mixture-of-experts MLP: the norm of x (which takes the attention's deferred add), the
 * routing, the experts into o, and o's add, which the next norm of x follows. */
static atlas_status moe_layer(atlas_model *m, const atlas_layer_weights *lw, int n, int d) {
    atlas_backend *be = m->be;
    atlas_acts *a = &m->acts;
    ATLAS_TRY(be->ops->rmsnorm(be, a->h, a->x, lw->mlp_norm, n, d));
    ATLAS_TRY(be->ops->moe_route(be, a->moe_ids, a->moe_wts, a->h, lw->router, lw->router_bias,
                                 n));
    ATLAS_TRY(be->ops->moe_experts(be, a->o, a->h, lw->experts_gate_up, lw->experts_gate_up_bias,
                                   lw->experts_down, lw->experts_down_bias, a->moe_ids,
                                   a->moe_wts, n));
    return be->ops->add(be, a->x, a->o, n, d);
}

/* Every residual add (matmul_residual, add) is followed by a norm of x over the same rows,
 * and every swiglu epilogue by the down matmul of its act, as backend.h's hand-off wants. */
static atlas_status run_layers(atlas_model *m, int n) {
    atlas_backend *be = m->be;
    const atlas_backend_ops *op = be->ops;
    const atlas_config *c = &m->cfg;
    atlas_acts *a = &m->acts;
    int d = c->hidden, f = be->geom.intermediate; /* f: the rank's MLP columns */
    ATLAS_TRY(op->embed(be, a->x, m->w.embed));
    for (int l = 0; l < c->n_layers; l++) {
        const atlas_layer_weights *lw = &m->w.layers[l];
        /* h = norm(x) (+= the last layer's MLP output), qkv = h @ Wqkv^T; rope, KV store */
        atlas_epilogue qkv_epi = {.kind = ATLAS_EPI_ROPE_KV, .kv = m->kv, .layer = l};
        if (lw->q_norm) qkv_epi.kind = ATLAS_EPI_NONE; /* q/k norm goes before rope */
        ATLAS_TRY(atlas_op_rmsnorm_matmul(be, a->qkv, a->h, a->x, lw->attn_norm, lw->qkv,
                                          lw->qkv_bias, n, d, 0, &qkv_epi));
        if (lw->q_norm) {
            ATLAS_TRY(op->qk_norm(be, a->qkv, lw->q_norm, lw->k_norm, n));
            ATLAS_TRY(atlas_op_rope_kv_store(be, a->qkv, m->kv, l, n));
        }
        ATLAS_TRY(op->attention(be, a->att, a->qkv, m->kv, l, lw->sinks));
        if (lw->attn_out_norm)
            ATLAS_TRY(normed_residual(m, a->att, lw->o, lw->o_bias, lw->attn_out_norm, n, d));
        else
            ATLAS_TRY(project_residual(m, a->att, lw->o, lw->o_bias, n, d));
        if (lw->router) {
            ATLAS_TRY(moe_layer(m, lw, n, d));
            continue;
        }
        atlas_epilogue glu = {.kind = c->act == ATLAS_ACT_SILU ? ATLAS_EPI_SWIGLU : ATLAS_EPI_GLU,
                              .act = a->act, .f = f};
        if (n <= m->mlp_chunk) {
            ATLAS_TRY(atlas_op_rmsnorm_matmul(be, a->gate_up, a->h, a->x, lw->mlp_norm,
                                              lw->gate_up, lw->gate_up_bias, n, d, 0, &glu));
            if (lw->mlp_out_norm)
                ATLAS_TRY(normed_residual(m, a->act, lw->down, lw->down_bias, lw->mlp_out_norm,
                                          n, d));
            else
                ATLAS_TRY(project_residual(m, a->act, lw->down, lw->down_bias, n, d));
            continue;
        }
        /* rows are independent in the MLP: mlp_chunk of them at a time bounds its buffers */
        ATLAS_TRY(op->rmsnorm(be, a->h, a->x, lw->mlp_norm, n, d));
        for (int r0 = 0; r0 < n; r0 += m->mlp_chunk) {
            int nr = n - r0 < m->mlp_chunk ? n - r0 : m->mlp_chunk;
            size_t off = (size_t)r0 * d * be->act_size;
            ATLAS_TRY(atlas_op_rmsnorm_matmul(be, a->gate_up, a->h, NULL, NULL, lw->gate_up,
                                              lw->gate_up_bias, nr, d, r0, &glu));
            ATLAS_TRY(op->matmul(be, (char *)a->o + off, a->act, lw->down, lw->down_bias, nr));
        }
        if (lw->mlp_out_norm) {
            ATLAS_TRY(normed_residual(m, NULL, NULL, NULL, lw->mlp_out_norm, n, d));
            continue;
        }
        if (m->tp_size > 1) ATLAS_TRY(all_reduce(m, n, d));
        ATLAS_TRY(op->add(be, a->x, a->o, n, d));
    }
    return op->rmsnorm(be, a->h, a->x, m->w.norm, n, d);
}

/* What a forward gives back of its logit rows: logits downloaded, argmax ids, or the rows
 * sampled on the backend (smp, with the raw logits of its skipped rows downloaded). */
typedef struct fwd_out {
    float *logits;
    int32_t *ids;
    const atlas_model_sampling *smp;
} fwd_out;

/* A chunk's sampled rows (the skipped ones downloaded first: the op transforms in place). */
static atlas_status sample_chunk(atlas_model *m, const atlas_model_sampling *smp, int r0,
                                 int nr, int *n_host) {
    atlas_backend *be = m->be;
    int V = m->cfg.vocab_size;
    for (int r = r0; r < r0 + nr; r++) {
        if (!(smp->rows[r].flags & ATLAS_SAMPLE_SKIP)) continue;
        const char *src = (const char *)m->acts.logits + (size_t)(r - r0) * V * be->act_size;
        ATLAS_TRY(be->ops->download(be, smp->host + (size_t)(*n_host)++ * V, src, (size_t)V));
    }
    return be->ops->sample(be, smp->out + r0, m->acts.logits, nr, V, smp->rows + r0, smp->adj,
                           smp->n_adj);
}

/* Logits of the batch's logit rows, logit_chunk rows at a time (a [T, vocab] buffer would be
 * hundreds of MB for a 150k vocabulary; model.c alloc_acts); downloaded, reduced to argmax
 * or sampled. */
static atlas_status run_logits(atlas_model *m, const atlas_batch *b, const fwd_out *o) {
    atlas_backend *be = m->be;
    const atlas_backend_ops *op = be->ops;
    int d = m->cfg.hidden, V = m->cfg.vocab_size, n_host = 0;
    /* a chunk of a long prompt that is not its last wants no logits (and a kernel of no
     * rows is no launch: CUDA refuses a grid of 0) */
    if (b->n_logits == 0) return op->sync(be);
    ATLAS_TRY(op->gather_rows(be, m->acts.rows, m->acts.h, d));
    for (int r0 = 0; r0 < b->n_logits; r0 += m->logit_chunk) {
        int nr = b->n_logits - r0 < m->logit_chunk ? b->n_logits - r0 : m->logit_chunk;
        const char *rows = (const char *)m->acts.rows + (size_t)r0 * d * be->act_size;
        ATLAS_TRY(op->matmul(be, m->acts.logits, rows, m->w.lm_head, NULL, nr));
        if (o->logits)
            ATLAS_TRY(op->download(be, o->logits + (size_t)r0 * V, m->acts.logits,
                                   (size_t)nr * V));
        else if (o->smp)
            ATLAS_TRY(sample_chunk(m, o->smp, r0, nr, &n_host));
        else
            ATLAS_TRY(op->argmax(be, o->ids + r0, m->acts.logits, nr, V));
    }
    return op->sync(be);
}

/* An embedding model's rows: the final-norm hidden states of the batch's logit rows,
 * gathered and downloaded (the ops every backend has), hidden[n_logits, d]. */
static atlas_status run_hidden(atlas_model *m, const atlas_batch *b, float *hidden) {
    atlas_backend *be = m->be;
    int d = m->cfg.hidden;
    if (b->n_logits == 0) return be->ops->sync(be);
    ATLAS_TRY(be->ops->gather_rows(be, m->acts.rows, m->acts.h, d));
    ATLAS_TRY(be->ops->download(be, hidden, m->acts.rows, (size_t)b->n_logits * d));
    return be->ops->sync(be);
}

/* Which outputs a batch may ask of the model: hidden rows one buffer of the whole width
 * (one rank), logits the output head (which an embedding model has not; rank 0 of
 * tensor parallelism holds it). */
static atlas_status check_outputs(const atlas_model *m, const atlas_batch *b, const fwd_out *o) {
    if (b->hidden && (!o->logits || o->ids || o->smp || m->tp_size > 1))
        return atlas_fail(ATLAS_ERR_INVALID, "forward (%s): hidden-state rows go to one buffer "
                          "(no argmax), on one rank", m->dir);
    if (b->hidden || !(o->logits || o->ids || o->smp)) return ATLAS_OK;
    if (m->tp_rank == 0 && !m->w.lm_head)
        return atlas_fail(ATLAS_ERR_INVALID, "forward (%s): an embedding model has no output "
                          "head: ask for hidden-state rows (atlas_batch.hidden)", m->dir);
    if (m->tp_rank > 0)
        return atlas_fail(ATLAS_ERR_INVALID, "forward (%s): tensor parallel rank %d has no "
                          "lm_head (rank 0 computes the logits): use the layers-only forward",
                          m->dir, m->tp_rank);
    return ATLAS_OK;
}

/* logits and ids NULL: the layers only (a non-lead rank of tensor parallelism). With
 * b->hidden, logits receives the hidden-state rows instead. */
static atlas_status forward(atlas_model *m, const atlas_batch *b, const fwd_out *o) {
    ATLAS_TRY(check_batch(m, b, 0));
    ATLAS_TRY(check_outputs(m, b, o));
    pthread_mutex_lock(&m->forward_mu);
    atlas_status st = m->be->ops->begin_batch(m->be, b, m->kv_block_size);
    if (st == ATLAS_OK) st = run_layers(m, b->n_tokens);
    if (st == ATLAS_OK && b->hidden) st = run_hidden(m, b, o->logits);
    else if (st == ATLAS_OK)
        st = o->logits || o->ids || o->smp ? run_logits(m, b, o) : m->be->ops->sync(m->be);
    pthread_mutex_unlock(&m->forward_mu);
    if (st != ATLAS_OK) return atlas_fail_wrap(st, "forward (%s)", m->dir);
    return ATLAS_OK;
}

static atlas_status not_queued(const atlas_model *m) {
    if (m->q_n == 0) return ATLAS_OK;
    return atlas_fail(ATLAS_ERR_BUSY, "forward (%s): %d step(s) queued: collect them first "
                      "(atlas_model_argmax_collect)", m->dir, m->q_n);
}

atlas_status atlas_model_forward(atlas_model *m, const atlas_batch *b, float *logits) {
    ATLAS_TRY(not_queued(m));
    return forward(m, b, &(fwd_out){.logits = logits});
}

atlas_status atlas_model_forward_argmax(atlas_model *m, const atlas_batch *b, int32_t *ids) {
    ATLAS_TRY(not_queued(m));
    return forward(m, b, &(fwd_out){.ids = ids});
}

atlas_status atlas_model_forward_sample(atlas_model *m, const atlas_batch *b,
                                        const atlas_model_sampling *smp) {
    ATLAS_TRY(not_queued(m));
    if (!smp || !smp->rows || !smp->out || b->hidden)
        return atlas_fail(ATLAS_ERR_INVALID, "forward (%s): sampling wants its rows and out, "
                          "and logits (not hidden states)", m->dir);
    for (int r = 0; r < b->n_logits; r++)
        if ((smp->rows[r].flags & ATLAS_SAMPLE_SKIP) && !smp->host)
            return atlas_fail(ATLAS_ERR_INVALID, "forward (%s): logit row %d is skipped and "
                              "there is no host buffer for its logits", m->dir, r);
    return forward(m, b, &(fwd_out){.smp = smp});
}

atlas_status atlas_model_forward_layers(atlas_model *m, const atlas_batch *b) {
    ATLAS_TRY(not_queued(m));
    return forward(m, b, &(fwd_out){0});
}

/* The backend's device path: the forward and the argmax (rows NULL) or the draws queued,
 * nothing waited for. */
static atlas_status queue_on_device(atlas_model *m, const atlas_batch *b,
                                    const atlas_sample_row *rows) {
    atlas_backend *be = m->be;
    const atlas_backend_ops *op = be->ops;
    int d = m->cfg.hidden;
    if (rows && !op->sample_queue)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "backend %s queues greedy steps only",
                          op->name);
    pthread_mutex_lock(&m->forward_mu);
    atlas_status st = op->begin_batch(be, b, m->kv_block_size);
    if (st == ATLAS_OK) st = run_layers(m, b->n_tokens);
    if (st == ATLAS_OK) st = op->gather_rows(be, m->acts.rows, m->acts.h, d);
    /* logit_chunk rows at a time, as run_logits computes them: one queued step either way */
    int queued = 0; /* rows the backend holds of this step */
    for (int r0 = 0; st == ATLAS_OK && r0 < b->n_logits; r0 += m->logit_chunk) {
        int nr = b->n_logits - r0 < m->logit_chunk ? b->n_logits - r0 : m->logit_chunk;
        const char *x = (const char *)m->acts.rows + (size_t)r0 * d * be->act_size;
        st = op->matmul(be, m->acts.logits, x, m->w.lm_head, NULL, nr);
        if (st == ATLAS_OK && rows)
            st = op->sample_queue(be, m->acts.logits, r0, nr, m->cfg.vocab_size, rows + r0);
        else if (st == ATLAS_OK)
            st = op->argmax_queue(be, m->acts.logits, r0, nr, m->cfg.vocab_size);
        if (st == ATLAS_OK) queued = r0 + nr;
    }
    /* a step the backend holds in part is collected and dropped, so that its queue and the
     * model's stay in step (the failure's message kept) */
    if (st != ATLAS_OK && queued > 0) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", atlas_last_error());
        int32_t *drop = malloc((size_t)queued * sizeof *drop);
        if (drop) (void)op->argmax_collect(be, drop, queued);
        free(drop);
        st = atlas_fail(st, "%s", msg);
    }
    pthread_mutex_unlock(&m->forward_mu);
    return st;
}

/* Without the device path: computed at once, the ids kept in the next ring slot. */
static atlas_status queue_on_host(atlas_model *m, const atlas_batch *b, int slot,
                                  const atlas_sample_row *rows) {
    size_t cap = (size_t)m->max_batch_tokens;
    if (!m->q_ids && !(m->q_ids = malloc(2 * cap * sizeof *m->q_ids)))
        return atlas_fail(ATLAS_ERR_NOMEM, "forward (%s): out of memory", m->dir);
    if (!m->q_tok && !(m->q_tok = malloc(cap * sizeof *m->q_tok)))
        return atlas_fail(ATLAS_ERR_NOMEM, "forward (%s): out of memory", m->dir);
    const int32_t *before = m->q_ids + (size_t)(1 - slot) * cap; /* the step before's ids */
    for (int t = 0; t < b->n_tokens; t++)
        m->q_tok[t] = b->tokens[t] >= 0 ? b->tokens[t] : before[-1 - b->tokens[t]];
    atlas_batch bb = *b;
    bb.tokens = m->q_tok;
    int32_t *ids = m->q_ids + (size_t)slot * cap;
    if (!rows) return forward(m, &bb, &(fwd_out){.ids = ids});
    atlas_sample_out *out = malloc((size_t)b->n_logits * sizeof *out);
    if (!out) return atlas_fail(ATLAS_ERR_NOMEM, "forward (%s): out of memory", m->dir);
    atlas_model_sampling smp = {.rows = rows, .out = out};
    atlas_status st = forward(m, &bb, &(fwd_out){.smp = &smp});
    for (int r = 0; st == ATLAS_OK && r < b->n_logits; r++) ids[r] = out[r].id;
    free(out);
    return st;
}

static atlas_status queue_step(atlas_model *m, const atlas_batch *b,
                               const atlas_sample_row *rows) {
    if (m->q_n == 2)
        return atlas_fail(ATLAS_ERR_BUSY, "forward (%s): 2 steps queued already: collect one "
                          "first", m->dir);
    int slot = (m->q_head + m->q_n) % 2, last = 1 - slot; /* last: the step queued before */
    atlas_status cst = check_batch(m, b, m->q_n > 0 ? m->q_rows[last] : 0);
    if (cst != ATLAS_OK) return atlas_fail_wrap(cst, "forward (%s): queuing a step", m->dir);
    if (b->n_logits < 1)
        return atlas_fail(ATLAS_ERR_RANGE, "forward (%s): a queued step wants a logit row at "
                          "least", m->dir);
    if (m->tp_size > 1 || !m->w.lm_head || b->hidden)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "forward (%s): queued steps run on one GPU "
                          "only (tensor parallel size %d), with an output head", m->dir,
                          m->tp_size);
    if (rows) {
        atlas_status st = atlas_sample_check_queued(rows, b->n_logits, m->cfg.vocab_size);
        if (st != ATLAS_OK) return atlas_fail_wrap(st, "forward (%s)", m->dir);
    }
    atlas_status st = m->be->ops->argmax_queue ? queue_on_device(m, b, rows)
                                               : queue_on_host(m, b, slot, rows);
    if (st != ATLAS_OK)
        return atlas_fail_wrap(st, "forward (%s): queuing a %s step", m->dir,
                               rows ? "sampled" : "greedy");
    m->q_rows[slot] = b->n_logits;
    m->q_n++;
    return ATLAS_OK;
}

atlas_status atlas_model_forward_argmax_queue(atlas_model *m, const atlas_batch *b) {
    return queue_step(m, b, NULL);
}

atlas_status atlas_model_forward_sample_queue(atlas_model *m, const atlas_batch *b,
                                              const atlas_sample_row *rows) {
    if (!rows)
        return atlas_fail(ATLAS_ERR_INVALID, "forward (%s): a queued sampled step without "
                          "its rows", m->dir);
    return queue_step(m, b, rows);
}

bool atlas_model_queued_ready(atlas_model *m) {
    if (m->q_n == 0 || !m->be->ops->argmax_ready) return true;
    return m->be->ops->argmax_ready(m->be) != 0;
}

bool atlas_model_queues_samples(const atlas_model *m) {
    return !m->be->ops->argmax_queue || m->be->ops->sample_queue;
}

atlas_status atlas_model_argmax_collect(atlas_model *m, int32_t *ids, int n) {
    if (m->q_n == 0)
        return atlas_fail(ATLAS_ERR_INVALID, "forward (%s): no step queued to collect", m->dir);
    int slot = m->q_head;
    if (n != m->q_rows[slot])
        return atlas_fail(ATLAS_ERR_RANGE, "forward (%s): collecting %d ids of a step with %d "
                          "logit rows", m->dir, n, m->q_rows[slot]);
    atlas_status st = ATLAS_OK;
    if (m->be->ops->argmax_collect) {
        pthread_mutex_lock(&m->forward_mu);
        st = m->be->ops->argmax_collect(m->be, ids, n);
        pthread_mutex_unlock(&m->forward_mu);
    } else {
        memcpy(ids, m->q_ids + (size_t)slot * m->max_batch_tokens, (size_t)n * sizeof *ids);
    }
    m->q_head = (slot + 1) % 2;
    m->q_n--;
    if (st != ATLAS_OK)
        return atlas_fail_wrap(st, "forward (%s): collecting a queued step", m->dir);
    return ATLAS_OK;
}

void atlas_model_set_all_reduce(atlas_model *m, atlas_all_reduce_fn fn, void *ctx) {
    m->all_reduce = fn;
    m->all_reduce_ctx = ctx;
}

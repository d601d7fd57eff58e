/* backend/cuda/backend_cuda.c — the op table on the GPU: memory, weight upload, the paged
 * KV cache, batch staging, the command queue with CUDA-graph replay of decode steps.
 * See cuda_backend.h for the layout of the state and the command scheme. */
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/weight_fill.h"
#include "core/dtype.h"
#include "core/error.h"

static cuda_backend *cuda_of(atlas_backend *be) { return (cuda_backend *)be; }

/* --- memory --------------------------------------------------------------------------------- */

static atlas_status cuda_alloc(atlas_backend *be, size_t bytes, void **out) {
    CUdeviceptr p = 0;
    *out = NULL;
    ATLAS_TRY(atlas_registry_alloc(cuda_of(be)->reg, bytes, "activations", &p));
    *out = (void *)(uintptr_t)p;
    return ATLAS_OK;
}

static void cuda_free(atlas_backend *be, void *p) {
    if (p) (void)atlas_registry_free(cuda_of(be)->reg, CUDA_PTR(p));
}

/* Frees *p (if set) and allocates `bytes` there. */
static atlas_status cuda_realloc(cuda_backend *cb, CUdeviceptr *p, size_t bytes, const char *what) {
    if (*p) ATLAS_TRY(atlas_registry_free(cb->reg, *p));
    *p = 0;
    return atlas_registry_alloc(cb->reg, bytes, what, p);
}

/* --- weights -------------------------------------------------------------------------------
 * Every weight goes through the host's pinned staging pool: weight_load queues it for the
 * host's loader threads, which read (pread) and convert each piece to bf16 into a pinned
 * buffer and copy it on (host.h); weights_done waits for them. (Copying bf16 straight out of
 * the registered file mapping by the copy engine, alone or mixed with staging, measured
 * slower on the H200 and was removed: bench/RESULTS.md.) */

/* A queued upload's context (atlas_host_upload_queue copies it): the views themselves, as
 * the caller's may live on its stack. */
typedef struct queued_fill {
    atlas_tensor_view views[CUDA_FUSE_MAX];
    int n;
} queued_fill;

static void fill_queued(void *dst, size_t offset, size_t bytes, void *user) {
    const queued_fill *q = user;
    const atlas_tensor_view *v[CUDA_FUSE_MAX];
    for (int i = 0; i < q->n; i++) v[i] = &q->views[i];
    atlas_cuda_fill_weight(v, q->n, dst, offset, offset, offset + bytes);
}

/* Queues views (n of them, fused; bytes of bf16 in all) for the host's loader threads, to
 * land at dst. */
static atlas_status stage_views(cuda_backend *cb, CUdeviceptr dst, size_t bytes,
                                const atlas_tensor_view *const *views, int n) {
    if (n > CUDA_FUSE_MAX) /* the model fuses at most qkv's 3 */
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: a weight fused from %d views (at most "
                          "%d)", n, CUDA_FUSE_MAX);
    queued_fill q = {.n = n};
    for (int i = 0; i < n; i++) q.views[i] = *views[i];
    cb->load.staged_bytes += bytes;
    return atlas_host_upload_queue(cb->host, dst, bytes, fill_queued, &q, sizeof q);
}

static atlas_status cuda_weight_load(atlas_backend *be, const atlas_tensor_view *const *views,
                                     int n, atlas_weight **out) {
    cuda_backend *cb = cuda_of(be);
    *out = NULL;
    if (n < 1) return atlas_fail(ATLAS_ERR_INVALID, "cuda: weight_load of %d views", n);
    int dims = views[0]->n_dims;
    int64_t rows = 0, cols = dims == 2 ? views[0]->shape[1] : 0;
    for (int i = 0; i < n; i++) {
        const atlas_tensor_view *v = views[i];
        /* 2-D views stack their rows (same columns); 1-D views (biases, norms) concatenate
         * whatever their lengths: q|k|v biases of H*hd, K*hd and K*hd under GQA */
        if (v->n_dims != dims || (dims != 1 && dims != 2) || (dims == 2 && v->shape[1] != cols))
            return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: weight %s: shape does not fuse with %s",
                              v->name, views[0]->name);
        if (v->dtype != ATLAS_DTYPE_BF16 && v->dtype != ATLAS_DTYPE_F16 &&
            v->dtype != ATLAS_DTYPE_F32)
            return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: weight %s: dtype %s", v->name,
                              atlas_dtype_name(v->dtype));
        if (dims == 2) rows += v->shape[0];
        else cols += v->shape[0];
    }
    if (dims == 1) rows = 1; /* one row of all the views' elements */
    if (dims == 2 && cols % 8)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: weight %s: %lld columns, want a multiple "
                          "of 8", views[0]->name, (long long)cols);
    atlas_weight *w = calloc(1, sizeof *w);
    if (!w) return atlas_fail(ATLAS_ERR_NOMEM, "cuda: out of memory");
    w->rows = rows;
    w->cols = cols;
    size_t bytes = (size_t)rows * cols * 2;
    atlas_status st = atlas_registry_alloc(cb->reg, bytes, views[0]->name, &w->ptr);
    if (st == ATLAS_OK) {
        cb->load.pending = true;
        st = stage_views(cb, w->ptr, bytes, views, n); /* the fused weight at once */
    }
    if (st != ATLAS_OK) {
        (void)atlas_registry_free(cb->reg, w->ptr);
        free(w);
        return atlas_fail_wrap(st, "cuda: loading weight %s", views[0]->name);
    }
    cb->weight_bytes += bytes;
    *out = w;
    return ATLAS_OK;
}

static void cuda_weight_free(atlas_backend *be, atlas_weight *w) {
    if (!w) return;
    cuda_load *ld = &cuda_of(be)->load;
    /* a failed load: the loader threads may still be writing to it */
    if (ld->pending) (void)atlas_host_upload_wait(cuda_of(be)->host);
    cuda_of(be)->weight_bytes -= (size_t)w->rows * w->cols * 2;
    (void)atlas_registry_free(cuda_of(be)->reg, w->ptr);
    free(w);
}

/* Waits for the queued uploads: the weights are on the device (also called by every
 * begin_batch, for weights loaded without a weights_done: at once when nothing was loaded
 * since). */
static atlas_status cuda_weights_done(atlas_backend *be) {
    cuda_backend *cb = cuda_of(be);
    cuda_load *ld = &cb->load;
    if (cb->ready && !ld->pending) return ATLAS_OK;
    ATLAS_TRY(atlas_host_make_current(cb->host));
    ATLAS_TRY(cuda_ready(cb)); /* made at create already: returns at once */
    ld->pending = false;
    return atlas_host_upload_wait(cb->host);
}

/* --- KV cache --------------------------------------------------------------------------------- */

static atlas_status cuda_kv_create(atlas_backend *be, int n_blocks, int block_size, atlas_kv **out) {
    cuda_backend *cb = cuda_of(be);
    const atlas_backend_geom *g = &be->geom;
    *out = NULL;
    if (n_blocks < 1 || block_size < 1)
        return atlas_fail(ATLAS_ERR_INVALID, "cuda: kv cache of %d blocks of %d", n_blocks,
                          block_size);
    atlas_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return atlas_fail(ATLAS_ERR_NOMEM, "cuda: out of memory");
    kv->n_blocks = n_blocks;
    kv->block_size = block_size;
    kv->layer_elems = (size_t)n_blocks * block_size * g->n_kv_heads * g->head_dim;
    size_t bytes = kv->layer_elems * 2 * 2 * (size_t)g->n_layers;
    atlas_status st = atlas_registry_alloc(cb->reg, bytes, "kv cache", &kv->base);
    if (st == ATLAS_OK) st = ATLAS_CU(cuMemsetD8, kv->base, 0, bytes);
    if (st != ATLAS_OK) {
        (void)atlas_registry_free(cb->reg, kv->base);
        free(kv);
        return st;
    }
    cb->kv_bytes += bytes;
    *out = kv;
    return ATLAS_OK;
}

static void cuda_kv_free(atlas_backend *be, atlas_kv *kv) {
    if (!kv) return;
    cuda_of(be)->kv_bytes -= kv->layer_elems * 2 * 2 * (size_t)be->geom.n_layers;
    (void)atlas_registry_free(cuda_of(be)->reg, kv->base);
    free(kv);
}

/* --- graphs ----------------------------------------------------------------------------------- */

static void drop_graphs(cuda_backend *cb) {
    const atlas_driver *d = atlas_driver_get();
    for (int i = 0; i < CUDA_MAX_GRAPHS; i++) {
        if (cb->graphs[i].exec) d->cuGraphExecDestroy(cb->graphs[i].exec);
        free(cb->graphs[i].cmds);
        memset(&cb->graphs[i], 0, sizeof cb->graphs[i]);
    }
}

static atlas_status capture(cuda_backend *cb, cuda_graph *slot) {
    const atlas_driver *d = atlas_driver_get();
    ATLAS_CU_TRY(cuStreamBeginCapture, cb->stream, ATLAS_CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    atlas_status st = cuda_exec_list(cb, cb->queue, cb->n_queue);
    CUgraph graph = NULL;
    atlas_status end = ATLAS_CU(cuStreamEndCapture, cb->stream, &graph);
    if (st == ATLAS_OK) st = end;
    if (st == ATLAS_OK) st = ATLAS_CU(cuGraphInstantiateWithFlags, &slot->exec, graph, 0);
    if (graph) d->cuGraphDestroy(graph);
    if (st != ATLAS_OK) return atlas_fail_wrap(st, "cuda: capturing a decode step");
    slot->cmds = malloc((size_t)cb->n_queue * sizeof *slot->cmds);
    if (!slot->cmds) {
        d->cuGraphExecDestroy(slot->exec);
        slot->exec = NULL;
        return atlas_fail(ATLAS_ERR_NOMEM, "cuda: out of memory");
    }
    memcpy(slot->cmds, cb->queue, (size_t)cb->n_queue * sizeof *slot->cmds);
    slot->n_cmds = cb->n_queue;
    cb->graph_captures++;
    return ATLAS_OK;
}

/* Runs the queued commands: a prefill's as they are, a decode step's as the graph recorded
 * for the same list, or a new one. */
static atlas_status flush(cuda_backend *cb) {
    if (cb->n_queue == 0) return ATLAS_OK;
    if (!cb->graphing) {
        int n = cb->n_queue;
        cb->n_queue = 0;
        return cuda_exec_list(cb, cb->queue, n);
    }
    cuda_graph *hit = NULL, *lru = &cb->graphs[0];
    for (int i = 0; i < CUDA_MAX_GRAPHS; i++) {
        cuda_graph *g = &cb->graphs[i];
        if (g->exec && g->n_cmds == cb->n_queue &&
            !memcmp(g->cmds, cb->queue, (size_t)cb->n_queue * sizeof *cb->queue)) {
            hit = g;
            break;
        }
        if (!g->exec || (lru->exec && g->last_use < lru->last_use)) lru = g;
    }
    if (!hit) {
        if (lru->exec) atlas_driver_get()->cuGraphExecDestroy(lru->exec);
        free(lru->cmds);
        memset(lru, 0, sizeof *lru);
        atlas_status st = capture(cb, lru);
        if (st != ATLAS_OK) {
            cb->n_queue = 0;
            return st;
        }
        hit = lru;
    } else {
        cb->graph_replays++;
    }
    hit->last_use = ++cb->clock;
    cb->n_queue = 0;
    return ATLAS_CU(cuGraphLaunch, hit->exec, cb->stream);
}

static atlas_status submit(cuda_backend *cb, const cuda_cmd *c) {
    if (!cb->deferring) return cuda_exec(cb, c);
    if (cb->n_queue == cb->cap_queue) {
        int cap = cb->cap_queue ? cb->cap_queue * 2 : 256;
        cuda_cmd *q = realloc(cb->queue, (size_t)cap * sizeof *q);
        if (!q) return atlas_fail(ATLAS_ERR_NOMEM, "cuda: out of memory");
        cb->queue = q;
        cb->cap_queue = cap;
    }
    cb->queue[cb->n_queue++] = *c;
    return ATLAS_OK;
}

/* --- the batch -------------------------------------------------------------------------------- */

/* Waits for everything queued: no staging buffer is read any more. */
static atlas_status stream_wait(cuda_backend *cb) {
    ATLAS_CU_TRY(cuStreamSynchronize, cb->stream);
    cb->stage_busy[0] = cb->stage_busy[1] = false;
    return ATLAS_OK;
}

/* h_ids' slots (cuda_backend.h): 0 and 1 the queued steps', IDS_PLAIN a plain argmax's; the
 * host's view and the mapped address the argmax kernel writes. */
enum { IDS_PLAIN = 2 };
static int32_t *ids_host(const cuda_backend *cb, int slot) {
    return cb->h_ids + (size_t)slot * cb->ids_cap;
}
static const void *ids_mapped(const cuda_backend *cb, int slot) {
    return (const void *)(uintptr_t)(cb->m_ids + (size_t)slot * cb->ids_cap * sizeof(int32_t));
}

/* Before batch buffers are made again: the graphs go (they hold the old addresses), after
 * the queued steps that may still run them or use the buffers (their ids stay in h_ids). */
static atlas_status graphs_release(cuda_backend *cb) {
    if (cb->aq_n) ATLAS_TRY(stream_wait(cb));
    drop_graphs(cb);
    return ATLAS_OK;
}

/* Pinned host memory that kernels address too (h_ids, h_stage) at *host and *dev. */
static atlas_status mapped_alloc(size_t bytes, int32_t **host, CUdeviceptr *dev) {
    void *p = NULL;
    ATLAS_CU_TRY(cuMemHostAlloc, &p, bytes, ATLAS_CU_MEMHOSTALLOC_DEVICEMAP);
    atlas_status st = ATLAS_CU(cuMemHostGetDevicePointer, dev, p, 0);
    if (st != ATLAS_OK) {
        atlas_driver_get()->cuMemFreeHost(p);
        return st;
    }
    *host = p;
    return ATLAS_OK;
}

/* The pinned host buffers of ct tokens and `words` staged ints: h_ids (the queued slots' ids
 * kept; the stream is idle: graphs_release) and both h_stage buffers (after the batches that
 * read them: the stream is waited for); their events made once. */
static atlas_status pinned_grow(cuda_backend *cb, int ct, size_t words) {
    const atlas_driver *d = atlas_driver_get();
    for (int s = 0; s < 2; s++) {
        if (!cb->aq_done[s])
            ATLAS_CU_TRY(cuEventCreate, &cb->aq_done[s], ATLAS_CU_EVENT_DISABLE_TIMING);
        if (!cb->stage_sent[s])
            ATLAS_CU_TRY(cuEventCreate, &cb->stage_sent[s], ATLAS_CU_EVENT_DISABLE_TIMING);
    }
    int32_t *h = NULL;
    CUdeviceptr m = 0;
    ATLAS_TRY(mapped_alloc((size_t)3 * ct * sizeof(int32_t), &h, &m));
    if (cb->h_ids) {
        for (int s = 0; s < 2; s++)
            memcpy(h + (size_t)s * ct, ids_host(cb, s), (size_t)cb->ids_cap * sizeof *h);
        d->cuMemFreeHost(cb->h_ids);
    }
    cb->h_ids = h;
    cb->m_ids = m;
    cb->ids_cap = ct;
    if (cb->stage_busy[0] || cb->stage_busy[1]) ATLAS_TRY(stream_wait(cb));
    for (int s = 0; s < 2; s++) {
        if (cb->h_stage[s]) d->cuMemFreeHost(cb->h_stage[s]);
        cb->h_stage[s] = NULL;
        cb->m_stage[s] = 0;
        ATLAS_TRY(mapped_alloc(words * sizeof(int32_t), &cb->h_stage[s], &cb->m_stage[s]));
    }
    return ATLAS_OK;
}

static atlas_status stage_grow(cuda_backend *cb, int n_tokens, int table) {
    if (n_tokens <= cb->cap_tok && table <= cb->cap_table) return ATLAS_OK;
    ATLAS_TRY(graphs_release(cb));
    int ct = n_tokens > cb->cap_tok ? n_tokens : cb->cap_tok;
    if (ct < 64) ct = 64;
    int cbt = table > cb->cap_table ? table : cb->cap_table;
    ATLAS_TRY(pinned_grow(cb, ct, (size_t)(7 * ct + cbt)));
    ATLAS_TRY(cuda_realloc(cb, &cb->d_stage, (size_t)(7 * ct + cbt) * 4, "batch"));
    /* argmax ids [ct], then atlas_argmax_wide's best [ct] (u64) and count [ct], zero */
    ATLAS_TRY(cuda_realloc(cb, &cb->d_ids, cuda_ids_bytes(ct), "argmax ids"));
    ATLAS_CU_TRY(cuMemsetD8, cb->d_ids, 0, cuda_ids_bytes(ct));
    size_t rope = (size_t)ct * (cb->base.geom.head_dim / 2) * 2 * sizeof(float);
    ATLAS_TRY(cuda_realloc(cb, &cb->d_rope, rope, "rope cos/sin"));
    cb->cap_tok = ct;
    cb->cap_table = cbt;
    return ATLAS_OK;
}

static atlas_status cmd4(atlas_backend *be, int op, int n, int d, int layer, const void *p0,
                         const void *p1, const void *p2, const void *p3);

static atlas_status cuda_begin_batch(atlas_backend *be, const atlas_batch *b, int block_size) {
    cuda_backend *cb = cuda_of(be);
    const atlas_backend_geom *g = &be->geom;
    ATLAS_TRY(atlas_host_make_current(cb->host));
    ATLAS_TRY(cuda_weights_done(be)); /* weights are on the device before use */
    cb->n_queue = 0; /* commands of an abandoned batch never ran */
    /* the staged block table's row length: the batch's rounded up to a power of two, so that
     * a decode graph (keyed by it) is replayed while sequences grow instead of captured again
     * every block_size tokens; splits past a sequence's context exit at once */
    int mb = 16;
    while (mb < b->max_blocks) mb *= 2;
    int n = b->n_tokens, table = b->n_seqs * mb;
    if (!b->tokens && !(cb->aq_n > 0 && cb->ids_queued))
        return atlas_fail(ATLAS_ERR_INVALID, "cuda: a batch whose tokens are the ids of a "
                          "queued argmax, and none is queued");
    int cap0 = cb->cap_tok, table0 = cb->cap_table;
    ATLAS_TRY(stage_grow(cb, n > b->n_logits ? n : b->n_logits, table));
    /* the last batch's buffer when the stream was waited for since (a plain step); else the
     * last batch may not have read its own yet (a queued step): its end is marked, and the
     * other buffer is taken once its batch, marked so when this one began, has ended */
    int k = cb->stage_cur;
    if (cb->stage_busy[k]) {
        ATLAS_CU_TRY(cuEventRecord, cb->stage_sent[k], cb->stream);
        k ^= 1;
        if (cb->stage_busy[k]) ATLAS_CU_TRY(cuEventSynchronize, cb->stage_sent[k]);
    }
    cb->stage_cur = k;
    int32_t *h = cb->h_stage[k], stride = (n + 15) & ~15; /* cb->stage_stride */
    if (stride > cb->cap_tok) stride = cb->cap_tok;
    cb->stage_stride = stride;
    cb->tok_src = 0;
    if (b->tokens) {
        memcpy(h, b->tokens, (size_t)n * 4);
    } else { /* the last queued step's ids, read on the device */
        int last = (cb->aq_head + cb->aq_n - 1) % 2;
        if (cb->aq_rows[last] != n)
            return atlas_fail(ATLAS_ERR_INVALID, "cuda: a batch of %d tokens from a queued "
                              "argmax of %d rows", n, cb->aq_rows[last]);
        if (cap0 != cb->cap_tok || table0 != cb->cap_table) /* d_ids made again: stage_grow */
            memcpy(h, ids_host(cb, last), (size_t)n * 4); /* waited for */
        else
            cb->tok_src = cb->d_ids;
    }
    memcpy(h + stride, b->positions, (size_t)n * 4);
    for (int s = 0; s < b->n_seqs; s++) {
        const int32_t *bt = b->block_table + (size_t)s * b->max_blocks;
        for (int t = b->seq_start[s]; t < b->seq_start[s + 1]; t++) {
            int p = b->positions[t];
            h[2 * stride + t] = bt[p / block_size] * block_size + p % block_size;
            h[3 * stride + t] = s;
        }
    }
    memcpy(h + 4 * stride, b->logit_rows, (size_t)b->n_logits * 4);
    int tiles = 0; /* prefill attention: up to 64 consecutive tokens of one sequence */
    for (int s = 0; s < b->n_seqs; s++)
        for (int t = b->seq_start[s]; t < b->seq_start[s + 1]; t += 64, tiles++) {
            h[5 * stride + 2 * tiles] = t;
            int left = b->seq_start[s + 1] - t;
            h[5 * stride + 2 * tiles + 1] = left < 64 ? left : 64;
        }
    cb->n_tiles = tiles;
    for (int s = 0; s < b->n_seqs; s++) {
        int32_t *row = h + 7 * stride + (size_t)s * mb;
        memcpy(row, b->block_table + (size_t)s * b->max_blocks, (size_t)b->max_blocks * 4);
        memset(row + b->max_blocks, 0, (size_t)(mb - b->max_blocks) * 4);
    }
    cb->n_tokens = n;
    cb->n_seqs = b->n_seqs;
    cb->n_logits = b->n_logits;
    cb->max_blocks = mb;
    cb->block_size = block_size;

    int n_split, chunk;
    bool partials = cuda_attn_split_plan(cb, n, mb * block_size, &n_split, &chunk);
    /* (at 2,048 tokens x 8 splits they would be 268 MB that the cluster kernel never uses) */
    size_t need = partials ? (size_t)n * g->n_heads * n_split * (g->head_dim + 2) * 4 : 0;
    if (need > cb->part_bytes) {
        ATLAS_TRY(graphs_release(cb));
        ATLAS_TRY(cuda_realloc(cb, &cb->part_o, (size_t)n * g->n_heads * n_split * g->head_dim * 4,
                               "attention partials"));
        ATLAS_TRY(cuda_realloc(cb, &cb->part_ml, (size_t)n * g->n_heads * n_split * 2 * 4,
                               "attention partials"));
        cb->part_bytes = need;
    }
    if (n > cb->counter_cap) {
        ATLAS_TRY(graphs_release(cb));
        /* a counter a (token, kv head) for the decode kernels, a (token, block of heads)
         * for the split kernel: at most H */
        ATLAS_TRY(cuda_realloc(cb, &cb->attn_counters, (size_t)n * g->n_heads * 4,
                               "attention counters"));
        ATLAS_CU_TRY(cuMemsetD32Async, cb->attn_counters, 0, (size_t)n * g->n_heads, cb->stream);
        cb->counter_cap = n;
    }
    cb->n_split = n_split;
    cb->chunk = chunk;
    /* prefill's bf16 copy of a norm's output for the next matmul (ops_cuda.c) */
    if (cb->lt && n >= 64 && (size_t)n * g->hidden * 2 > cb->lt_h_bytes) {
        ATLAS_TRY(graphs_release(cb));
        ATLAS_TRY(cuda_realloc(cb, &cb->lt_h, (size_t)n * g->hidden * 2, "cublaslt norm input"));
        cb->lt_h_bytes = (size_t)n * g->hidden * 2;
    }
    cb->deferring = 1;
    cb->graphing = cb->use_graphs && n == b->n_seqs && n <= CUDA_GRAPH_MAX_TOKENS;
    if (cb->graphing) { /* the launch shapes that are not in the commands */
        cuda_cmd key;
        memset(&key, 0, sizeof key);
        key.n = mb;
        key.d = n_split;
        key.layer = chunk;
        ATLAS_TRY(submit(cb, &key));
    }
    /* the staged ints to the device and the rope table, as the list's first kernel (a graph's
     * first node: no copy or launch of their own a step) */
    cb->stage_busy[k] = true;
    return cmd4(be, CUDA_OP_STAGE, n, 7 * stride + table, CUDA_STAGE_POS * stride,
                (const void *)(uintptr_t)cb->m_stage[k], NULL, NULL, NULL);
}

/* --- ops: recorded as commands ---------------------------------------------------------------- */

static atlas_status cmd4(atlas_backend *be, int op, int n, int d, int layer, const void *p0,
                         const void *p1, const void *p2, const void *p3) {
    cuda_cmd c;
    memset(&c, 0, sizeof c);
    c.op = op;
    c.n = n;
    c.d = d;
    c.layer = layer;
    c.p[0] = p0; c.p[1] = p1; c.p[2] = p2; c.p[3] = p3;
    return submit(cuda_of(be), &c);
}

static atlas_status cuda_embed(atlas_backend *be, void *x, const atlas_weight *table) {
    cuda_backend *cb = cuda_of(be); /* p[2]: the tokens when they are a queued argmax's ids */
    return cmd4(be, CUDA_OP_EMBED, cb->n_tokens, 0, 0, x, table,
                (const void *)(uintptr_t)cb->tok_src, NULL);
}

static atlas_status cuda_rmsnorm(atlas_backend *be, void *out, const void *x, const atlas_weight *w,
                                 int rows, int d) {
    return cmd4(be, CUDA_OP_ADD_RMSNORM, rows, d, 0, x, NULL, out, w);
}

static atlas_status cuda_add_rmsnorm(atlas_backend *be, void *resid, const void *delta, void *out,
                                     const atlas_weight *w, int n, int d) {
    return cmd4(be, CUDA_OP_ADD_RMSNORM, n, d, 0, resid, delta, out, w);
}

static atlas_status cuda_matmul(atlas_backend *be, void *out, const void *x, const atlas_weight *w,
                                const atlas_weight *bias, int n) {
    return cmd4(be, CUDA_OP_MATMUL, n, 0, 0, out, x, w, bias);
}

static atlas_status cuda_qk_norm(atlas_backend *be, void *qkv, const atlas_weight *q_norm,
                                 const atlas_weight *k_norm, int n) {
    return cmd4(be, CUDA_OP_QK_NORM, n, 0, 0, qkv, q_norm, k_norm, NULL);
}

static atlas_status cuda_rope(atlas_backend *be, void *qkv, int n) {
    return cmd4(be, CUDA_OP_ROPE, n, 0, 0, qkv, NULL, NULL, NULL);
}

static atlas_status cuda_kv_store(atlas_backend *be, const void *qkv, atlas_kv *kv, int layer) {
    return cmd4(be, CUDA_OP_KV_STORE, cuda_of(be)->n_tokens, 0, layer, qkv, kv, NULL, NULL);
}

static atlas_status cuda_attention(atlas_backend *be, void *out, const void *qkv, const atlas_kv *kv,
                                   int layer) {
    return cmd4(be, CUDA_OP_ATTENTION, cuda_of(be)->n_tokens, 0, layer, out, qkv, kv, NULL);
}

static atlas_status cuda_swiglu(atlas_backend *be, void *out, const void *gate_up, int n, int f) {
    return cmd4(be, CUDA_OP_SWIGLU, n, f, 0, out, gate_up, NULL, NULL);
}

static atlas_status cuda_gather_rows(atlas_backend *be, void *out, const void *x, int d) {
    return cmd4(be, CUDA_OP_GATHER, cuda_of(be)->n_logits, d, 0, out, x, NULL, NULL);
}

static atlas_status cuda_download(atlas_backend *be, float *host, const void *x, size_t count) {
    cuda_backend *cb = cuda_of(be);
    ATLAS_TRY(flush(cb));
    ATLAS_CU_TRY(cuMemcpyDtoHAsync, host, CUDA_PTR(x), count * 4, cb->stream);
    return stream_wait(cb);
}

/* The argmax command (ids to d_ids and to h_ids' slot), and the batch's commands run. */
static atlas_status argmax_run(atlas_backend *be, const void *logits, int rows, int vocab,
                               int slot) {
    cuda_backend *cb = cuda_of(be);
    ATLAS_TRY(cmd4(be, CUDA_OP_ARGMAX, rows, vocab, 0, (void *)(uintptr_t)cb->d_ids, logits,
                   ids_mapped(cb, slot), NULL));
    return flush(cb);
}

static atlas_status cuda_argmax(atlas_backend *be, int32_t *ids, const void *logits, int rows,
                                int vocab) {
    cuda_backend *cb = cuda_of(be);
    ATLAS_TRY(cuda_ready(cb));
    if (rows > cb->cap_tok)
        return atlas_fail(ATLAS_ERR_RANGE, "cuda: argmax of %d rows (at most %d)", rows, cb->cap_tok);
    ATLAS_TRY(argmax_run(be, logits, rows, vocab, IDS_PLAIN));
    cb->ids_queued = false;
    ATLAS_TRY(stream_wait(cb));
    memcpy(ids, ids_host(cb, IDS_PLAIN), (size_t)rows * 4);
    return ATLAS_OK;
}

static atlas_status cuda_argmax_queue(atlas_backend *be, const void *logits, int rows,
                                      int vocab) {
    cuda_backend *cb = cuda_of(be);
    ATLAS_TRY(cuda_ready(cb));
    if (rows < 1 || rows > cb->cap_tok)
        return atlas_fail(ATLAS_ERR_RANGE, "cuda: argmax of %d rows (1..%d)", rows, cb->cap_tok);
    if (cb->aq_n == 2)
        return atlas_fail(ATLAS_ERR_BUSY, "cuda: 2 argmax steps queued already");
    int slot = (cb->aq_head + cb->aq_n) % 2;
    ATLAS_TRY(argmax_run(be, logits, rows, vocab, slot));
    ATLAS_CU_TRY(cuEventRecord, cb->aq_done[slot], cb->stream);
    cb->aq_rows[slot] = rows;
    cb->aq_n++;
    cb->ids_queued = true;
    return ATLAS_OK;
}

static atlas_status cuda_argmax_collect(atlas_backend *be, int32_t *ids, int rows) {
    cuda_backend *cb = cuda_of(be);
    if (cb->aq_n == 0) return atlas_fail(ATLAS_ERR_INVALID, "cuda: no argmax queued to collect");
    int slot = cb->aq_head;
    cb->aq_head = (slot + 1) % 2;
    cb->aq_n--;
    if (rows != cb->aq_rows[slot])
        return atlas_fail(ATLAS_ERR_RANGE, "cuda: collecting %d ids of an argmax of %d rows",
                          rows, cb->aq_rows[slot]);
    ATLAS_TRY(atlas_host_make_current(cb->host));
    ATLAS_CU_TRY(cuEventSynchronize, cb->aq_done[slot]);
    memcpy(ids, ids_host(cb, slot), (size_t)rows * 4);
    return ATLAS_OK;
}

static atlas_status cuda_sync(atlas_backend *be) {
    cuda_backend *cb = cuda_of(be);
    ATLAS_TRY(flush(cb));
    return stream_wait(cb);
}

/* --- create / destroy ------------------------------------------------------------------------- */

static void cuda_destroy(atlas_backend *be) {
    cuda_backend *cb = cuda_of(be);
    if (!cb) return;
    if (cb->host) (void)atlas_host_make_current(cb->host);
    if (cb->reg) drop_graphs(cb);
    free(cb->queue);
    cuda_lt_free(cb->lt);
    const atlas_driver *d = atlas_driver_get();
    if (cb->h_ids) d->cuMemFreeHost(cb->h_ids);
    for (int s = 0; s < 2; s++) {
        if (cb->h_stage[s]) d->cuMemFreeHost(cb->h_stage[s]);
        if (cb->aq_done[s]) d->cuEventDestroy(cb->aq_done[s]);
        if (cb->stage_sent[s]) d->cuEventDestroy(cb->stage_sent[s]);
    }
    free(cb->inv_freq);
    (void)atlas_registry_release(cb->reg); /* frees every allocation left */
    free(cb);
}

static const atlas_backend_ops cuda_ops = {
    .name = "cuda",
    .alloc = cuda_alloc,
    .free = cuda_free,
    .weight_load = cuda_weight_load,
    .weight_free = cuda_weight_free,
    .weights_done = cuda_weights_done,
    .kv_create = cuda_kv_create,
    .kv_free = cuda_kv_free,
    .begin_batch = cuda_begin_batch,
    .embed = cuda_embed,
    .rmsnorm = cuda_rmsnorm,
    .add_rmsnorm = cuda_add_rmsnorm,
    .matmul = cuda_matmul,
    .qk_norm = cuda_qk_norm,
    .rope = cuda_rope,
    .kv_store = cuda_kv_store,
    .attention = cuda_attention,
    .swiglu = cuda_swiglu,
    .gather_rows = cuda_gather_rows,
    .download = cuda_download,
    .argmax = cuda_argmax,
    .argmax_queue = cuda_argmax_queue,
    .argmax_collect = cuda_argmax_collect,
    .sync = cuda_sync,
    .destroy = cuda_destroy,
};

/* The shapes the kernels take; a model the CPU runs and these refuse fails its load with the
 * limit named. Every tuned kernel falls back to a general one inside them (ops_cuda.c): the
 * tiled prefill attention (head_dim 64/80/96/128) to the split kernel, the cluster decode
 * attention (64/128, <= 8 heads a kv head, <= 4096 slots) to the warp kernel (64/128/256,
 * <= 8 heads) and that to the split kernel, which takes any group in blocks of heads. */
static atlas_status check_geom(const atlas_backend_geom *g) {
    if (g->n_kv_heads < 1 || g->n_heads < 1 || g->n_heads % g->n_kv_heads)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: %d query heads for %d kv heads: want "
                          "whole groups", g->n_heads, g->n_kv_heads);
    /* K/V rows, weight rows and activations move 8 bf16 (16 bytes) at a time; the rope table
     * is made from a stack copy of hd/2 <= 512 frequencies (cuda_setup) */
    if (g->head_dim % 8 || g->head_dim < 8 || g->head_dim > 1024)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: head_dim %d: the kernels take multiples "
                          "of 8 from 8 to 1024", g->head_dim);
    if (g->hidden % 8 || g->intermediate % 8)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: hidden %d, intermediate %d: the kernels "
                          "take multiples of 8", g->hidden, g->intermediate);
    int G = g->n_heads / g->n_kv_heads;
    if (cuda_attn_split_heads(G, g->head_dim) < 1)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: head_dim %d: one query head of the split "
                          "attention kernel needs more than its 43 KiB of shared memory",
                          g->head_dim);
    return ATLAS_OK;
}

/* ATLAS_SKIP_* (backend.h) as bits of cuda_op. */
static unsigned skip_bits(unsigned skip) {
    static const struct { unsigned bit; int op; } ops[] = {
        {ATLAS_SKIP_NORM, CUDA_OP_ADD_RMSNORM}, {ATLAS_SKIP_MATMUL, CUDA_OP_MATMUL},
        {ATLAS_SKIP_ROPE, CUDA_OP_ROPE}, {ATLAS_SKIP_KV_STORE, CUDA_OP_KV_STORE},
        {ATLAS_SKIP_ATTENTION, CUDA_OP_ATTENTION}, {ATLAS_SKIP_SWIGLU, CUDA_OP_SWIGLU}};
    unsigned out = 0;
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
        if (skip & ops[i].bit) out |= 1u << ops[i].op;
    return out;
}

static atlas_status cuda_setup(cuda_backend *cb, const atlas_backend_options *o) {
    const atlas_backend_geom *g = &cb->base.geom;
    ATLAS_TRY(atlas_registry_create(cb->host, &cb->reg));
    cb->stream = atlas_host_stream(cb->host);
    int half = g->head_dim / 2;
    cb->inv_freq = malloc((size_t)half * sizeof(double));
    if (!cb->inv_freq) return atlas_fail(ATLAS_ERR_NOMEM, "cuda: out of memory");
    memcpy(cb->inv_freq, g->rope_inv_freq, (size_t)half * sizeof(double));
    cb->base.geom.rope_inv_freq = cb->inv_freq; /* the caller's array is not kept */
    float inv_f[512];
    if (half > 512) return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: head_dim %d", g->head_dim);
    for (int i = 0; i < half; i++) inv_f[i] = (float)cb->inv_freq[i];
    ATLAS_TRY(atlas_registry_alloc(cb->reg, (size_t)half * sizeof(float), "rope", &cb->d_inv_freq));
    ATLAS_CU_TRY(cuMemcpyHtoD, cb->d_inv_freq, inv_f, (size_t)half * sizeof(float));
    cb->use_graphs = !o->no_graphs;
    /* Programmatic dependent launch (Hopper and later; kernels/common.cuh): each kernel's
     * launch and first weight loads overlap the previous kernel's tail. On the H200 8B shape
     * it took decode from 178 to 200 tok/s (827b480; it had lost 3% while the slow attention
     * and swiglu-GEMV kernels dominated). */
    bool hopper = atlas_host_properties(cb->host)->cc_major >= 9;
    if (!o->no_pdl && hopper) cb->launch_ex = cuda_pdl_resolve();
    if (hopper) cb->cluster_ex = cuda_pdl_resolve(); /* the cluster attention kernels */
    cb->skip_ops = skip_bits(o->skip_ops);
    cb->want_lt = !o->no_cublaslt; /* read by cuda_ready */
    /* the kernels and cuBLASLt are made here, before any weight is queued: 3-4 ms alone,
     * where made while the loader threads read they took 80-227 ms of a core the loaders
     * wanted; swaps 34.5-35.8 GB/s against 33.1-34.7 on the same machine (bench/RESULTS.md,
     * 2026-12-03) */
    return cuda_ready(cb);
}

/* The kernel modules and cuBLASLt, made once, at the backend's creation. 3-4 ms on the H200
 * machine since cuBLASLt stays open; kernels and cuBLASLt together held the first weight
 * back 62-83 ms when it was opened in every load: bench/RESULTS.md. */
atlas_status cuda_ready(cuda_backend *cb) {
    if (cb->ready) return ATLAS_OK;
    ATLAS_TRY(atlas_host_make_current(cb->host));
    ATLAS_TRY(cuda_load_kernels(cb));
    if (cb->want_lt && cuda_lt_create(&cb->lt) == ATLAS_OK) {
        cb->lt_a_bytes = (size_t)64 << 20;
        cb->lt_ws_bytes = (size_t)32 << 20;
        if (atlas_registry_alloc(cb->reg, cb->lt_a_bytes, "cublaslt input", &cb->lt_a) != ATLAS_OK ||
            atlas_registry_alloc(cb->reg, cb->lt_ws_bytes, "cublaslt workspace", &cb->lt_ws) !=
                ATLAS_OK) {
            cuda_lt_free(cb->lt);
            cb->lt = NULL;
            cb->lt_a_bytes = cb->lt_ws_bytes = 0;
        }
    }
    atlas_error_clear();
    cb->ready = true;
    return ATLAS_OK;
}

atlas_status atlas_backend_cuda_create(const atlas_backend_geom *geom,
                                       const atlas_backend_options *opts, atlas_backend **out) {
    *out = NULL;
    const atlas_backend_options defaults = {0};
    const atlas_backend_options *o = opts ? opts : &defaults;
    ATLAS_TRY(check_geom(geom));
    atlas_host *host = NULL;
    ATLAS_TRY(atlas_host_get(o->gpu, &host));
    ATLAS_TRY(atlas_host_make_current(host));
    cuda_backend *cb = calloc(1, sizeof *cb);
    if (!cb) return atlas_fail(ATLAS_ERR_NOMEM, "cuda: out of memory");
    cb->base.ops = &cuda_ops;
    cb->base.geom = *geom;
    cb->base.act_size = sizeof(float);
    cb->host = host;
    atlas_status st = cuda_setup(cb, o);
    if (st != ATLAS_OK) {
        cuda_destroy(&cb->base);
        return atlas_fail_wrap(st, "cuda backend");
    }
    *out = &cb->base;
    return ATLAS_OK;
}

/* backend/cuda/stage.c — the batch in and its results out: the workspace (grown for the
 * largest batch), begin_batch's staging, the argmax id ring, download and sync; the state is
 * cuda_backend.ws and cuda_backend.batch (cuda_backend.h). */
#include <stdbool.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "core/fault.h"

/* Frees *p (if set) and allocates `bytes` there. */
static atlas_status cuda_realloc(cuda_backend *cb, CUdeviceptr *p, size_t bytes,
                                 const char *what) {
    if (*p) ATLAS_TRY(atlas_registry_free(cb->mod.reg, *p));
    *p = 0;
    return atlas_registry_alloc(cb->mod.reg, bytes, what, p);
}

/* Waits for everything queued: no staging buffer is read any more. */
static atlas_status stream_wait(cuda_backend *cb) {
    ATLAS_CU_TRY(cuStreamSynchronize, cb->dev.stream);
    cb->batch.stage_busy[0] = cb->batch.stage_busy[1] = false;
    return ATLAS_OK;
}

/* h_ids' slots (cuda_backend.h): 0 and 1 the queued steps', IDS_PLAIN a plain argmax's; the
 * host's view and the mapped address the argmax kernel writes. */
enum { IDS_PLAIN = 2 };
static int32_t *ids_host(const cuda_backend *cb, int slot) {
    return cb->ws.h_ids + (size_t)slot * cb->ws.ids_cap;
}
static const void *ids_mapped(const cuda_backend *cb, int slot) {
    return (const void *)(uintptr_t)(cb->ws.m_ids +
                                     (size_t)slot * cb->ws.ids_cap * sizeof(int32_t));
}

/* Before batch buffers are made again: the graphs go (they hold the old addresses), after
 * the queued steps that may still run them or use the buffers (their ids stay in h_ids). */
static atlas_status graphs_release(cuda_backend *cb) {
    if (cb->batch.aq_n) ATLAS_TRY(stream_wait(cb));
    cuda_plan_drop_graphs(cb);
    return ATLAS_OK;
}

/* Pinned host memory that kernels address too (h_ids, h_stage) at *host and *dev. */
static atlas_status mapped_alloc(size_t bytes, int32_t **host, CUdeviceptr *dev) {
    void *p = NULL;
    if (ATLAS_FAULT_HERE()) /* a fault site (core/fault.h), before asking the driver */
        return atlas_cu_check(ATLAS_CUDA_ERROR_OUT_OF_MEMORY, "cuMemHostAlloc (injected fault)",
                              __FILE__, __LINE__);
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
 * kept; the stream is idle: graphs_release), h_sq and both h_stage buffers (after the
 * batches that read them: the stream is waited for); their events made once. */
static atlas_status pinned_grow(cuda_backend *cb, int ct, size_t words) {
    for (int s = 0; s < 2; s++) {
        if (!cb->ws.aq_done[s])
            ATLAS_CU_TRY(cuEventCreate, &cb->ws.aq_done[s], ATLAS_CU_EVENT_DISABLE_TIMING);
        if (!cb->ws.stage_sent[s])
            ATLAS_CU_TRY(cuEventCreate, &cb->ws.stage_sent[s], ATLAS_CU_EVENT_DISABLE_TIMING);
    }
    int32_t *h = NULL;
    CUdeviceptr m = 0;
    ATLAS_TRY(mapped_alloc((size_t)3 * ct * sizeof(int32_t), &h, &m));
    if (cb->ws.h_ids) {
        for (int s = 0; s < 2; s++)
            memcpy(h + (size_t)s * ct, ids_host(cb, s), (size_t)cb->ws.ids_cap * sizeof *h);
        ATLAS_REGISTRY_KEEP(cb->mod.reg, "argmax ids (pinned)", cuMemFreeHost, cb->ws.h_ids);
    }
    cb->ws.h_ids = h;
    cb->ws.m_ids = m;
    cb->ws.ids_cap = ct;
    /* the queued sampled steps' rows: read by their kernels only, so nothing to keep */
    if (cb->ws.h_sq)
        ATLAS_REGISTRY_KEEP(cb->mod.reg, "queued sampling rows (pinned)", cuMemFreeHost,
                            cb->ws.h_sq);
    cb->ws.h_sq = NULL;
    cb->ws.sq_cap = 0;
    ATLAS_TRY(mapped_alloc((size_t)2 * ct * sizeof(atlas_sample_row), &h, &m));
    cb->ws.h_sq = h;
    cb->ws.m_sq = m;
    cb->ws.sq_cap = ct;
    if (cb->batch.stage_busy[0] || cb->batch.stage_busy[1]) ATLAS_TRY(stream_wait(cb));
    for (int s = 0; s < 2; s++) {
        if (cb->ws.h_stage[s])
            ATLAS_REGISTRY_KEEP(cb->mod.reg, "batch staging (pinned)", cuMemFreeHost,
                                cb->ws.h_stage[s]);
        cb->ws.h_stage[s] = NULL;
        cb->ws.m_stage[s] = 0;
        ATLAS_TRY(mapped_alloc(words * sizeof(int32_t), &cb->ws.h_stage[s], &cb->ws.m_stage[s]));
    }
    return ATLAS_OK;
}

static atlas_status stage_grow(cuda_backend *cb, int n_tokens, int table) {
    if (n_tokens <= cb->ws.cap_tok && table <= cb->ws.cap_table) return ATLAS_OK;
    ATLAS_TRY(graphs_release(cb));
    int ct = n_tokens > cb->ws.cap_tok ? n_tokens : cb->ws.cap_tok;
    if (ct < 64) ct = 64;
    int cbt = table > cb->ws.cap_table ? table : cb->ws.cap_table;
    ATLAS_TRY(pinned_grow(cb, ct, (size_t)CUDA_STAGE_TABLE * ct + cbt));
    ATLAS_TRY(cuda_realloc(cb, &cb->ws.d_stage, ((size_t)CUDA_STAGE_TABLE * ct + cbt) * 4,
                           "batch"));
    /* argmax ids [ct], then atlas_argmax_wide's best [ct] (u64) and count [ct], zero */
    ATLAS_TRY(cuda_realloc(cb, &cb->ws.d_ids, cuda_ids_bytes(ct), "argmax ids"));
    ATLAS_CU_TRY(cuMemsetD8Async, cb->ws.d_ids, 0, cuda_ids_bytes(ct), cb->dev.stream);
    size_t rope = (size_t)(1 + cb->base.geom.n_rope_sets) * ct *
                  (cb->base.geom.head_dim / 2) * 2 * sizeof(float); /* a table a set */
    ATLAS_TRY(cuda_realloc(cb, &cb->ws.d_rope, rope, "rope cos/sin"));
    cb->ws.cap_tok = ct;
    cb->ws.cap_table = cbt;
    return ATLAS_OK;
}

/* The batch's positions, slots, sequences, logit rows, prefill tiles, longrope's choices and
 * block table (rows of mb ints) into the host mirror h, in regions of stride ints (the tokens
 * are the caller's). longrope, as the CPU backend: the long set for every token of a sequence
 * whose length (seq_ctx, or seq_rope_len when larger) is past rope_long_after. */
static void stage_write(cuda_backend *cb, const atlas_batch *b, int block_size, int32_t *h,
                        int stride, int mb) {
    int n = b->n_tokens;
    memcpy(h + stride, b->positions, (size_t)n * 4);
    const atlas_backend_geom *g = &cb->base.geom;
    for (int s = 0; s < b->n_seqs; s++) {
        const int32_t *bt = b->block_table + (size_t)s * b->max_blocks;
        int len = b->seq_rope_len && b->seq_rope_len[s] > b->seq_ctx[s] ? b->seq_rope_len[s]
                                                                        : b->seq_ctx[s];
        int use_long = g->rope_inv_freq_long && len > g->rope_long_after;
        for (int t = b->seq_start[s]; t < b->seq_start[s + 1]; t++) {
            int p = b->positions[t];
            h[2 * stride + t] = bt[p / block_size] * block_size + p % block_size;
            h[3 * stride + t] = s;
            h[CUDA_STAGE_LONG * stride + t] = use_long;
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
    cb->batch.n_tiles = tiles;
    for (int s = 0; s < b->n_seqs; s++) {
        int32_t *row = h + CUDA_STAGE_TABLE * stride + (size_t)s * mb;
        memcpy(row, b->block_table + (size_t)s * b->max_blocks, (size_t)b->max_blocks * 4);
        memset(row + b->max_blocks, 0, (size_t)(mb - b->max_blocks) * 4);
    }
}

/* The attention split-K plan of n tokens over cap positions, and its workspace grown (the
 * graphs released first) when the batch needs more. */
static atlas_status attn_grow(cuda_backend *cb, int n, int cap, int *n_split_out,
                              int *chunk_out) {
    const atlas_backend_geom *g = &cb->base.geom;
    int n_split, chunk;
    bool partials = cuda_attn_split_plan(cb, n, cap, &n_split, &chunk);
    /* (at 2,048 tokens x 8 splits they would be 268 MB that the cluster kernel never uses) */
    size_t need = partials ? (size_t)n * g->n_heads * n_split * (g->head_dim + 2) * 4 : 0;
    if (need > cb->ws.part_bytes) {
        ATLAS_TRY(graphs_release(cb));
        ATLAS_TRY(cuda_realloc(cb, &cb->ws.part_o,
                               (size_t)n * g->n_heads * n_split * g->head_dim * 4,
                               "attention partials"));
        ATLAS_TRY(cuda_realloc(cb, &cb->ws.part_ml, (size_t)n * g->n_heads * n_split * 2 * 4,
                               "attention partials"));
        cb->ws.part_bytes = need;
    }
    if (n > cb->ws.counter_cap) {
        ATLAS_TRY(graphs_release(cb));
        /* a counter a (token, kv head) for the decode kernels, a (token, block of heads)
         * for the split kernel: at most H */
        ATLAS_TRY(cuda_realloc(cb, &cb->ws.attn_counters, (size_t)n * g->n_heads * 4,
                               "attention counters"));
        ATLAS_CU_TRY(cuMemsetD32Async, cb->ws.attn_counters, 0, (size_t)n * g->n_heads,
                     cb->dev.stream);
        cb->ws.counter_cap = n;
    }
    *n_split_out = n_split;
    *chunk_out = chunk;
    return ATLAS_OK;
}

atlas_status cuda_deq_reserve(cuda_backend *cb) {
    if (cb->wt.deq_need <= cb->ws.deq_bytes) return ATLAS_OK;
    ATLAS_TRY(graphs_release(cb));
    ATLAS_TRY(cuda_realloc(cb, &cb->ws.deq, cb->wt.deq_need, "dequantized weight"));
    cb->ws.deq_bytes = cb->wt.deq_need;
    return ATLAS_OK;
}

atlas_status cuda_begin_batch(atlas_backend *be, const atlas_batch *b, int block_size) {
    cuda_backend *cb = cuda_of(be);
    const atlas_backend_geom *g = &be->geom;
    ATLAS_TRY(atlas_host_make_current(cb->dev.host));
    ATLAS_TRY(cuda_weights_done(be)); /* weights are on the device before use */
    ATLAS_TRY(cuda_serving(cb));
    cb->plan.n_queue = 0; /* commands of an abandoned batch never ran */
    /* the staged block table's row length: the batch's rounded up to a power of two, so that
     * a decode graph (keyed by it) is replayed while sequences grow instead of captured again
     * every block_size tokens; splits past a sequence's context exit at once */
    int mb = 16;
    while (mb < b->max_blocks) mb *= 2;
    int n = b->n_tokens, table = b->n_seqs * mb;
    int prev = 0, last = (cb->batch.aq_head + cb->batch.aq_n - 1 + 2) % 2; /* the step before */
    for (int t = 0; t < n; t++) {
        if (b->tokens[t] >= 0) continue;
        if (!(cb->batch.aq_n > 0 && cb->batch.ids_queued))
            return atlas_fail(ATLAS_ERR_INVALID, "cuda: a batch whose tokens are the ids of a "
                              "queued step, and none is queued");
        if (-1 - (int64_t)b->tokens[t] >= cb->batch.aq_rows[last])
            return atlas_fail(ATLAS_ERR_RANGE, "cuda: token %d is row %lld of the step queued "
                              "before, which has %d", t, -1 - (long long)b->tokens[t],
                              cb->batch.aq_rows[last]);
        prev = 1;
    }
    int cap0 = cb->ws.cap_tok, table0 = cb->ws.cap_table;
    ATLAS_TRY(stage_grow(cb, n > b->n_logits ? n : b->n_logits, table));
    /* the last batch's buffer when the stream was waited for since (a plain step); else the
     * last batch may not have read its own yet (a queued step): its end is marked, and the
     * other buffer is taken once its batch, marked so when this one began, has ended */
    int k = cb->batch.stage_cur;
    if (cb->batch.stage_busy[k]) {
        ATLAS_CU_TRY(cuEventRecord, cb->ws.stage_sent[k], cb->dev.stream);
        k ^= 1;
        if (cb->batch.stage_busy[k]) ATLAS_CU_TRY(cuEventSynchronize, cb->ws.stage_sent[k]);
    }
    cb->batch.stage_cur = k;
    int32_t *h = cb->ws.h_stage[k], stride = (n + 15) & ~15; /* cb->batch.stage_stride */
    if (stride > cb->ws.cap_tok) stride = cb->ws.cap_tok;
    cb->batch.stage_stride = stride;
    memcpy(h, b->tokens, (size_t)n * 4);
    cb->batch.tok_ids = 0;
    if (prev && (cap0 != cb->ws.cap_tok || table0 != cb->ws.cap_table)) {
        const int32_t *ids = ids_host(cb, last); /* d_ids made again (stage_grow): waited for */
        for (int t = 0; t < n; t++)
            if (h[t] < 0) h[t] = ids[-1 - h[t]];
    } else if (prev) { /* the embedding kernel reads them on the device */
        cb->batch.tok_ids = cb->ws.d_ids;
    }
    stage_write(cb, b, block_size, h, stride, mb);
    cb->batch.n_tokens = n;
    cb->batch.n_seqs = b->n_seqs;
    cb->batch.n_logits = b->n_logits;
    cb->batch.max_blocks = mb;
    cb->batch.block_size = block_size;

    int n_split, chunk;
    ATLAS_TRY(attn_grow(cb, n, mb * block_size, &n_split, &chunk));
    cb->batch.n_split = n_split;
    cb->batch.chunk = chunk;
    /* prefill's bf16 copy of a norm's output for the next matmul (ops_cuda.c) */
    if (cb->mod.lt && n >= 64 && (size_t)n * g->hidden * 2 > cb->ws.lt_h_bytes) {
        ATLAS_TRY(graphs_release(cb));
        ATLAS_TRY(cuda_realloc(cb, &cb->ws.lt_h, (size_t)n * g->hidden * 2,
                               "cublaslt norm input"));
        cb->ws.lt_h_bytes = (size_t)n * g->hidden * 2;
    }
    ATLAS_TRY(cuda_deq_reserve(cb));
    size_t moe = cuda_moe_ws_bytes(cb, n); /* the experts' buffers (ops_moe.c) */
    if (moe > cb->ws.moe_bytes) {
        ATLAS_TRY(graphs_release(cb));
        ATLAS_TRY(cuda_realloc(cb, &cb->ws.moe, moe, "mixture-of-experts buffers"));
        cb->ws.moe_bytes = moe;
    }
    cb->plan.deferring = 1;
    cb->plan.graphing = cb->plan.use_graphs && n == b->n_seqs && n <= CUDA_GRAPH_MAX_TOKENS;
    if (cb->plan.graphing) { /* the launch shapes that are not in the commands */
        cuda_cmd key;
        memset(&key, 0, sizeof key);
        key.n = mb;
        key.d = n_split;
        key.layer = chunk;
        ATLAS_TRY(cuda_submit(cb, &key));
    }
    /* the staged ints to the device and the rope tables, as the list's first kernel (a graph's
     * first node: no copy or launch of their own a step) */
    cb->batch.stage_busy[k] = true;
    return cuda_cmd4(cb, CUDA_OP_STAGE, n, CUDA_STAGE_TABLE * stride + table, stride,
                     (const void *)(uintptr_t)cb->ws.m_stage[k], NULL, NULL, NULL);
}

/* --- results ---------------------------------------------------------------------------------- */

atlas_status cuda_download(atlas_backend *be, float *host, const void *x, size_t count) {
    cuda_backend *cb = cuda_of(be);
    ATLAS_TRY(cuda_flush(cb));
    ATLAS_CU_TRY(cuMemcpyDtoHAsync, host, CUDA_PTR(x), count * 4, cb->dev.stream);
    return stream_wait(cb);
}

/* The argmax command (ids of rows row0.. to d_ids and to h_ids' slot), and the batch's
 * commands run. */
static atlas_status argmax_run(atlas_backend *be, const void *logits, int row0, int rows,
                               int vocab, int slot) {
    cuda_backend *cb = cuda_of(be);
    size_t off = (size_t)row0 * sizeof(int32_t);
    ATLAS_TRY(cuda_cmd4(cb, CUDA_OP_ARGMAX, rows, vocab, 0,
                        (void *)(uintptr_t)(cb->ws.d_ids + off), logits,
                        (const char *)ids_mapped(cb, slot) + off, NULL));
    return cuda_flush(cb);
}

atlas_status cuda_argmax(atlas_backend *be, int32_t *ids, const void *logits, int rows,
                         int vocab) {
    cuda_backend *cb = cuda_of(be);
    ATLAS_TRY(cuda_ready(cb));
    if (rows > cb->ws.cap_tok)
        return atlas_fail(ATLAS_ERR_RANGE, "cuda: argmax of %d rows (at most %d)", rows,
                          cb->ws.cap_tok);
    ATLAS_TRY(argmax_run(be, logits, 0, rows, vocab, IDS_PLAIN));
    cb->batch.ids_queued = false;
    ATLAS_TRY(stream_wait(cb));
    memcpy(ids, ids_host(cb, IDS_PLAIN), (size_t)rows * 4);
    return ATLAS_OK;
}

/* The slot of a queued step's rows row0..row0 + rows (row0 0: a new step). */
static atlas_status queue_slot(cuda_backend *cb, int row0, int rows, const char *what,
                               int *slot) {
    if (row0 < 0 || rows < 1 || rows > cb->ws.cap_tok - row0)
        return atlas_fail(ATLAS_ERR_RANGE, "cuda: %s of rows %d..%d (at most %d)", what, row0,
                          row0 + rows - 1, cb->ws.cap_tok);
    if (row0 == 0) {
        if (cb->batch.aq_n == 2)
            return atlas_fail(ATLAS_ERR_BUSY, "cuda: 2 steps queued already");
        *slot = (cb->batch.aq_head + cb->batch.aq_n) % 2;
        return ATLAS_OK;
    }
    *slot = (cb->batch.aq_head + cb->batch.aq_n + 1) % 2; /* more rows of the step queued last */
    if (cb->batch.aq_n == 0 || cb->batch.aq_rows[*slot] != row0)
        return atlas_fail(ATLAS_ERR_INVALID, "cuda: %s rows from %d, but the step queued last "
                          "has %d", what, row0, cb->batch.aq_n ? cb->batch.aq_rows[*slot] : 0);
    return ATLAS_OK;
}

/* After a queued step's kernel: its event (recorded again after each chunk: collect waits
 * for the last) and its rows. */
static atlas_status queue_mark(cuda_backend *cb, int slot, int row0, int rows) {
    ATLAS_CU_TRY(cuEventRecord, cb->ws.aq_done[slot], cb->dev.stream);
    cb->batch.aq_rows[slot] = row0 + rows;
    if (row0 == 0) cb->batch.aq_n++;
    cb->batch.ids_queued = true;
    return ATLAS_OK;
}

atlas_status cuda_argmax_queue(atlas_backend *be, const void *logits, int row0, int rows,
                               int vocab) {
    cuda_backend *cb = cuda_of(be);
    ATLAS_TRY(cuda_ready(cb));
    int slot = 0;
    ATLAS_TRY(queue_slot(cb, row0, rows, "argmax", &slot));
    ATLAS_TRY(argmax_run(be, logits, row0, rows, vocab, slot));
    return queue_mark(cb, slot, row0, rows);
}

atlas_status cuda_sample_queue(atlas_backend *be, const void *logits, int row0, int rows,
                               int vocab, const atlas_sample_row *p) {
    cuda_backend *cb = cuda_of(be);
    ATLAS_TRY(atlas_sample_check_queued(p, rows, vocab));
    ATLAS_TRY(cuda_ready(cb));
    ATLAS_TRY(cuda_sample_ready(cb));
    int slot = 0;
    ATLAS_TRY(queue_slot(cb, row0, rows, "queued sampling", &slot));
    ATLAS_TRY(cuda_flush(cb)); /* the batch's commands: the logits */
    /* the slot's last reader was collected (its event waited for) before the slot came back */
    size_t off = ((size_t)slot * cb->ws.sq_cap + (size_t)row0) * sizeof(atlas_sample_row);
    memcpy((char *)cb->ws.h_sq + off, p, (size_t)rows * sizeof *p);
    CUdeviceptr d_ids = cb->ws.d_ids + (size_t)row0 * sizeof(int32_t), d_rows = cb->ws.m_sq + off;
    CUdeviceptr h_ids = (CUdeviceptr)(uintptr_t)ids_mapped(cb, slot) + (size_t)row0 * 4;
    CUdeviceptr d_logits = CUDA_PTR(logits);
    void *args[] = {&d_ids, &h_ids, &d_logits, &vocab, &d_rows};
    cb->plan.pdl_fence = true; /* outside the batch's commands: a plain launch */
    ATLAS_TRY(cuda_launch(cb, cb->mod.fn.sample_ids, (unsigned)rows, 1, 1, CUDA_SAMPLE_THREADS,
                          0, args));
    return queue_mark(cb, slot, row0, rows);
}

atlas_status cuda_argmax_collect(atlas_backend *be, int32_t *ids, int rows) {
    cuda_backend *cb = cuda_of(be);
    if (cb->batch.aq_n == 0)
        return atlas_fail(ATLAS_ERR_INVALID, "cuda: no argmax queued to collect");
    int slot = cb->batch.aq_head;
    cb->batch.aq_head = (slot + 1) % 2;
    cb->batch.aq_n--;
    if (rows != cb->batch.aq_rows[slot])
        return atlas_fail(ATLAS_ERR_RANGE, "cuda: collecting %d ids of an argmax of %d rows",
                          rows, cb->batch.aq_rows[slot]);
    ATLAS_TRY(atlas_host_make_current(cb->dev.host));
    ATLAS_CU_TRY(cuEventSynchronize, cb->ws.aq_done[slot]);
    memcpy(ids, ids_host(cb, slot), (size_t)rows * 4);
    return ATLAS_OK;
}

int cuda_argmax_ready(atlas_backend *be) {
    cuda_backend *cb = cuda_of(be);
    if (cb->batch.aq_n == 0 || atlas_host_make_current(cb->dev.host) != ATLAS_OK) return 1;
    return atlas_driver_get()->cuEventQuery(cb->ws.aq_done[cb->batch.aq_head]) !=
           ATLAS_CUDA_ERROR_NOT_READY;
}

atlas_status cuda_sync(atlas_backend *be) {
    cuda_backend *cb = cuda_of(be);
    ATLAS_TRY(cuda_flush(cb));
    return stream_wait(cb);
}

void cuda_workspace_release(cuda_backend *cb) {
    atlas_registry *r = cb->mod.reg; /* keeps each failure for its release's report */
    if (cb->ws.h_ids) ATLAS_REGISTRY_KEEP(r, "argmax ids (pinned)", cuMemFreeHost, cb->ws.h_ids);
    if (cb->ws.h_smp) ATLAS_REGISTRY_KEEP(r, "sampling (pinned)", cuMemFreeHost, cb->ws.h_smp);
    if (cb->ws.h_sq)
        ATLAS_REGISTRY_KEEP(r, "queued sampling rows (pinned)", cuMemFreeHost, cb->ws.h_sq);
    for (int s = 0; s < 2; s++) {
        if (cb->ws.h_stage[s])
            ATLAS_REGISTRY_KEEP(r, "batch staging (pinned)", cuMemFreeHost, cb->ws.h_stage[s]);
        if (cb->ws.aq_done[s])
            ATLAS_REGISTRY_KEEP(r, "argmax event", cuEventDestroy, cb->ws.aq_done[s]);
        if (cb->ws.stage_sent[s])
            ATLAS_REGISTRY_KEEP(r, "staging event", cuEventDestroy, cb->ws.stage_sent[s]);
    }
}

/* model/model.c — loading a model directory onto a backend, counted handles, release, and
 * the accessors of include/atlas/model.h. */
#include "atlas/model.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "atlas/tokenizer.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/meminfo.h"
#include "format/layout.h"
#include "model/forward.h"
#include "model/inspect.h"
#include "model/kv_scale.h"
#include "model/model_internal.h"
#include "model/rope.h"
#include "model/shard.h"
#include "model/weight_read.h"

atlas_model_params atlas_model_default_params(void) {
    return (atlas_model_params){.device = ATLAS_DEVICE_AUTO,
                                .n_threads = 0,
                                .kv_blocks = 0,
                                .kv_block_size = 16,
                                .kv_tokens = 0,
                                .max_batch_tokens = 512,
                                .mlp_chunk_tokens = 2048,
                                .load_tokenizer = 1,
                                .tp_rank = 0,
                                .tp_size = 1};
}

static atlas_status check_params(const atlas_model_params *p) {
    if (p->device < ATLAS_DEVICE_AUTO || p->device > ATLAS_DEVICE_CUDA)
        return atlas_fail(ATLAS_ERR_INVALID, "model params: device %d", (int)p->device);
    if (p->kernels < ATLAS_KERNELS_NATIVE || p->kernels > ATLAS_KERNELS_PORTABLE)
        return atlas_fail(ATLAS_ERR_INVALID, "model params: kernels %d", (int)p->kernels);
    if (p->kv_dtype < ATLAS_KV_DTYPE_AUTO || p->kv_dtype > ATLAS_KV_DTYPE_FP8)
        return atlas_fail(ATLAS_ERR_INVALID, "model params: kv_dtype %d", (int)p->kv_dtype);
    if (p->cpu_activations < ATLAS_CPU_ACT_FP32 || p->cpu_activations > ATLAS_CPU_ACT_AUTO)
        return atlas_fail(ATLAS_ERR_INVALID, "model params: cpu_activations %d",
                          (int)p->cpu_activations);
    if (p->gpu_activations < ATLAS_GPU_ACT_FP32 || p->gpu_activations > ATLAS_GPU_ACT_INT8)
        return atlas_fail(ATLAS_ERR_INVALID, "model params: gpu_activations %d",
                          (int)p->gpu_activations);
    if (p->n_threads < 0 || p->n_threads > 1024)
        return atlas_fail(ATLAS_ERR_INVALID, "model params: n_threads %d", p->n_threads);
    if (p->kv_blocks < 0 || p->kv_tokens < 0)
        return atlas_fail(ATLAS_ERR_INVALID, "model params: kv_blocks %d, kv_tokens %d",
                          p->kv_blocks, p->kv_tokens);
    if (p->kv_block_size < 1 || p->kv_block_size > 4096)
        return atlas_fail(ATLAS_ERR_INVALID, "model params: kv_block_size %d (1..4096)",
                          p->kv_block_size);
    if (p->tp_size < 1 || p->tp_size > 64 || p->tp_rank < 0 || p->tp_rank >= p->tp_size)
        return atlas_fail(ATLAS_ERR_INVALID, "model params: tp_rank %d, tp_size %d (1..64 "
                          "ranks, rank below it)", p->tp_rank, p->tp_size);
    if (p->max_batch_tokens < 1 || p->max_batch_tokens > 65536)
        return atlas_fail(ATLAS_ERR_INVALID, "model params: max_batch_tokens %d (1..65536)",
                          p->max_batch_tokens);
    if (p->mlp_chunk_tokens < 1 || p->mlp_chunk_tokens > 65536)
        return atlas_fail(ATLAS_ERR_INVALID, "model params: mlp_chunk_tokens %d (1..65536)",
                          p->mlp_chunk_tokens);
    return ATLAS_OK;
}

/* device AUTO: CUDA when it can be created, else the CPU with the reason kept for info.
 * opts: the CUDA backend's (NULL: the defaults); p->gpu names the GPU either way. */
static atlas_status pick_backend(atlas_model *m, const atlas_model_params *p,
                                 const atlas_backend_options *opts,
                                 const atlas_backend_geom *g) {
    if (p->device != ATLAS_DEVICE_CPU) {
        atlas_backend_options o = opts ? *opts : (atlas_backend_options){0};
        o.gpu = p->gpu;
        o.portable = o.portable || p->kernels == ATLAS_KERNELS_PORTABLE;
        o.int8_x = o.int8_x || p->gpu_activations == ATLAS_GPU_ACT_INT8;
        o.load = 1; /* load_weights ends with the op `loaded` */
        atlas_status st = atlas_backend_cuda_create(g, &o, &m->be);
        if (st == ATLAS_OK) {
            snprintf(m->backend_why, sizeof m->backend_why, "%s",
                     p->device == ATLAS_DEVICE_CUDA ? "requested" : "a CUDA device is usable");
            return ATLAS_OK;
        }
        if (p->device == ATLAS_DEVICE_CUDA) return st;
        snprintf(m->backend_why, sizeof m->backend_why, "CUDA not usable (%s: %s)",
                 atlas_status_str(st), atlas_last_error());
    } else {
        snprintf(m->backend_why, sizeof m->backend_why, "requested");
    }
    ATLAS_TRY(atlas_backend_cpu_create(g, p->n_threads, &m->be));
    ATLAS_TRY(atlas_backend_cpu_set_activations(m->be, atlas_model_cpu_act(p->cpu_activations)));
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    m->n_threads = p->n_threads ? p->n_threads : (cores > 0 ? (int)(cores < 256 ? cores : 256) : 1);
    return ATLAS_OK;
}

/* The MLP's buffers hold mlp_chunk rows, not T. After the last layer gate_up is free: the
 * logit rows (gathered h) and as many rows of logits as fit behind them live there when
 * they fit, which is the usual case. Each chunk of logit rows reads all of lm_head, so the
 * more rows a chunk the better: 16 a chunk made the lm_head 11 of a 25 ms step of 256
 * sequences on the H200 (bench/RESULTS.md). On the CPU the MLP's act lives in qkv's memory
 * when it fits (a small model's MLP, such as Qwen3-0.6B's: 6 MiB at 512 tokens): qkv is dead
 * from the attention's end to the next layer's qkv projection, and the MLP runs in between. */
static atlas_status alloc_acts(atlas_model *m) {
    const atlas_backend_geom *c = &m->be->geom; /* the rank's local widths */
    size_t T = (size_t)m->max_batch_tokens, C = (size_t)m->mlp_chunk, e = m->be->act_size;
    size_t d = c->hidden, hd = c->head_dim, H = c->n_heads, K = c->n_kv_heads,
           f = c->intermediate, V = c->vocab_size;
    size_t G = C * 2 * f;
    bool rows_in_gate_up = G >= T * d;
    size_t fit = rows_in_gate_up ? (G - T * d) / V : 0; /* logit rows that fit behind them */
    bool logits_in_gate_up = fit >= ATLAS_LOGIT_CHUNK;
    m->logits_in_gate_up = logits_in_gate_up;
    m->logit_chunk = logits_in_gate_up ? (int)(fit < T ? fit : T) : ATLAS_LOGIT_CHUNK;
    /* where the backend takes it (the CPU: measured on its peak RSS); a device keeps the
     * layout its kernels were checked with */
    bool act_in_qkv = m->be->act_in_qkv && C * f <= T * (H + 2 * K) * hd;
    struct { void **p; size_t n; } bufs[] = {
        {&m->acts.x, T * d}, {&m->acts.h, T * d}, {&m->acts.qkv, T * (H + 2 * K) * hd},
        {&m->acts.att, T * H * hd}, {&m->acts.o, T * d}, {&m->acts.gate_up, G},
        {&m->acts.act, act_in_qkv ? 0 : C * f},
        {&m->acts.logits, logits_in_gate_up ? 0 : ATLAS_LOGIT_CHUNK * V},
        {&m->acts.rows, rows_in_gate_up ? 0 : T * d},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i].n) ATLAS_TRY(m->be->ops->alloc(m->be, bufs[i].n * e, bufs[i].p));
    if (c->n_experts) { /* the routing: int32 ids and float32 weights, whatever e is */
        size_t routes = T * (size_t)c->n_experts_used;
        ATLAS_TRY(m->be->ops->alloc(m->be, routes * sizeof(int32_t), (void **)&m->acts.moe_ids));
        ATLAS_TRY(m->be->ops->alloc(m->be, routes * sizeof(float), (void **)&m->acts.moe_wts));
    }
    if (rows_in_gate_up) m->acts.rows = m->acts.gate_up;
    if (act_in_qkv) m->acts.act = m->acts.qkv;
    if (logits_in_gate_up) m->acts.logits = (char *)m->acts.gate_up + T * d * e;
    return ATLAS_OK;
}

/* The tokenizer loads in a thread of its own while the weights load: parsing Llama 3's 9 MB
 * tokenizer.json takes 0.15-0.27 s, which a model swap would otherwise wait for on top of the
 * weight upload. The thread touches only its job (the config is read-only while it runs); the
 * eos id it finds joins the config after the join. */
typedef struct tok_job {
    const char *dir;
    size_t vocab_size;
    atlas_tokenizer *tok; /* NULL after a failure */
    int32_t eos;
    atlas_status st;
    double done_ms;       /* atlas_now_ms when parsed */
    char msg[1024]; /* the failure's message: atlas_last_error() is per thread */
} tok_job;

static void *tok_job_run(void *arg) {
    tok_job *j = arg;
    j->st = atlas_tokenizer_load(j->dir, &j->tok);
    if (j->st == ATLAS_OK) j->st = atlas_tokenizer_set_vocab_size(j->tok, j->vocab_size);
    if (j->st == ATLAS_OK) {
        j->done_ms = atlas_now_ms();
        j->eos = atlas_tokenizer_eos_id(j->tok);
    } else {
        snprintf(j->msg, sizeof j->msg, "%s", atlas_last_error());
        atlas_tokenizer_free(j->tok);
        j->tok = NULL;
    }
    return NULL;
}

static atlas_status load_kv(atlas_model *m, const atlas_model_params *p) {
    m->kv_block_size = p->kv_block_size;
    m->kv_blocks = atlas_model_kv_blocks_for(&m->cfg, p);
    m->kv_bytes = atlas_model_kv_bytes_for(&m->cfg, m->be->geom.n_kv_heads, m->kv_blocks,
                                           m->kv_block_size, m->be->kv_size);
    return m->be->ops->kv_create(m->be, m->kv_blocks, m->kv_block_size, &m->kv);
}

/* The per-layer part of the geometry: each layer's window and RoPE set, as the config says
 * (inv_local[hd/2], window[n_layers] and set[n_layers] are the caller's). */
static void layer_geom(const atlas_config *c, atlas_backend_geom *g, double *inv_local,
                       int32_t *window, uint8_t *set) {
    for (int l = 0; l < c->n_layers; l++) {
        window[l] = atlas_config_layer_sliding(c, l) ? c->sliding_window : 0;
        set[l] = (uint8_t)atlas_config_layer_rope_set(c, l);
    }
    g->layer_window = window;
    double attn = 1.0;
    if (atlas_rope_inv_freq_local(c, inv_local, &attn)) {
        g->n_rope_sets = 1;
        g->rope_sets[0] = (atlas_rope_set){.inv_freq = inv_local, .attn_factor = attn};
        g->layer_rope_set = set;
    }
    g->attn_scale = (float)c->attn_scale;
    g->embed_scale = (float)c->embed_scale;
    g->glu = c->act == ATLAS_ACT_GELU_TANH      ? ATLAS_GLU_GELU_TANH
             : c->act == ATLAS_ACT_SWIGLU_CLAMP ? ATLAS_GLU_SWIGLU_CLAMP
                                                : ATLAS_GLU_SILU;
    g->glu_alpha = (float)c->swiglu_alpha;
    g->glu_limit = (float)c->swiglu_limit;
    g->attn_sinks = c->attn_sinks;
    g->post_norms = c->post_norms;
    g->n_experts = c->n_experts;
    g->n_experts_used = c->n_experts_used;
    g->expert_ffn = c->expert_ffn;
    g->moe_norm_topk = c->moe_norm_topk;
    g->moe_route = c->moe_topk_softmax ? ATLAS_ROUTE_TOPK_SOFTMAX : ATLAS_ROUTE_SOFTMAX_TOPK;
}

/* The checkpoint's FP8 KV scales into scales[2 * n_layers] and the geometry (the backend
 * copies them); m->kv_note says what became of them. */
static atlas_status read_kv_scales(atlas_model *m, const atlas_model_params *p, float *scales,
                                   atlas_backend_geom *g) {
    int found = 0;
    ATLAS_TRY(atlas_kv_scales_read(m->st, m->cfg.n_layers, scales, &found));
    g->kv_scales = scales;
    bool fp8 = p->kv_dtype == ATLAS_KV_DTYPE_FP8;
    if (found)
        snprintf(m->kv_note, sizeof m->kv_note, "%d K/V scale tensors of the checkpoint, %s",
                 found, fp8 ? "used (1.0 for any layer without)"
                            : "unused: the cache is not FP8 (--kv-cache-dtype fp8 uses them)");
    else if (fp8)
        snprintf(m->kv_note, sizeof m->kv_note, "scales 1.0 (the checkpoint has no k_scale / "
                 "v_scale)");
    return ATLAS_OK;
}

/* The KV cache type p asks for, on the backend just made: a type it does not have is
 * refused now, before any weight is read, by making (and freeing) a one-block cache. */
static atlas_status set_kv_dtype(atlas_model *m, const atlas_model_params *p) {
    if (p->kv_dtype == ATLAS_KV_DTYPE_AUTO) return ATLAS_OK;
    m->be->kv_size = p->kv_dtype == ATLAS_KV_DTYPE_FP8 ? 1 : sizeof(uint16_t);
    atlas_kv *probe = NULL;
    atlas_status st = m->be->ops->kv_create(m->be, 1, p->kv_block_size, &probe);
    if (st != ATLAS_OK)
        return atlas_fail_wrap(st, "%s: --kv-cache-dtype %s", m->dir,
                               atlas_model_kv_dtype_name(p->kv_dtype));
    m->be->ops->kv_free(m->be, probe);
    return ATLAS_OK;
}

/* Everything but the config and the tokenizer; reads neither m->tok nor the eos set. */
static atlas_status load_weights(atlas_model *m, const atlas_model_params *p,
                                 const atlas_backend_options *opts) {
    ATLAS_TRY(atlas_st_open_dir(m->dir, &m->st));
    m->times.files = atlas_now_ms();
    const atlas_config *c = &m->cfg;
    double inv_freq[1024], inv_long[1024], inv_local[1024], attn_factor = 1.0;
    if (c->head_dim < 2 || c->head_dim / 2 > 1024)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "config.json: head_dim %d", c->head_dim);
    if (p->tp_size > 1 && (c->post_norms || c->nested_text || c->n_experts))
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: tensor parallelism is not supported for "
                          "%s yet; run it on one device", m->dir, c->architecture);
    atlas_rope_inv_freq(c, inv_freq, &attn_factor);
    bool longrope = atlas_rope_inv_freq_long(c, inv_long);
    atlas_backend_geom g = {
        .hidden = c->hidden, .n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads,
        .head_dim = c->head_dim, .intermediate = c->intermediate, .vocab_size = c->vocab_size,
        .n_layers = c->n_layers, .rms_eps = (float)c->rms_eps, .rope_inv_freq = inv_freq,
        .rope_attn_factor = attn_factor, .max_position = c->max_position,
        .rope_dim = c->rope_dim, .rope_inv_freq_long = longrope ? inv_long : NULL,
        .rope_long_after = c->rope.original_max_position,
        .sliding_window = c->sliding_window, .sliding_from_layer = c->sliding_from_layer,
    };
    atlas_shard_plan plan;
    m->tp_rank = p->tp_rank;
    m->tp_size = p->tp_size;
    if (p->tp_size > 1) { /* the backend sees only this rank's heads and MLP columns */
        atlas_shard_geom sg;
        atlas_shard_geom_from_config(c, &sg);
        ATLAS_TRY(atlas_shard_plan_make(&sg, p->tp_size, p->tp_rank, &plan));
        g.n_heads = plan.n_q_heads;
        g.n_kv_heads = plan.n_kv_heads;
        g.intermediate = plan.n_mlp;
    }
    int32_t *window = malloc((size_t)c->n_layers * sizeof *window);
    uint8_t *set = malloc((size_t)c->n_layers);
    if (!window || !set) {
        free(window);
        free(set);
        return atlas_fail(ATLAS_ERR_NOMEM, "%s: out of memory", m->dir);
    }
    layer_geom(c, &g, inv_local, window, set);
    float *kv_scales = malloc((size_t)2 * c->n_layers * sizeof *kv_scales);
    atlas_status picked = kv_scales ? read_kv_scales(m, p, kv_scales, &g)
                                    : atlas_fail(ATLAS_ERR_NOMEM, "%s: out of memory", m->dir);
    if (picked == ATLAS_OK) picked = pick_backend(m, p, opts, &g);
    free(window); /* the backend keeps copies */
    free(set);
    free(kv_scales);
    ATLAS_TRY(picked);
    ATLAS_TRY(set_kv_dtype(m, p));
    m->times.backend = atlas_now_ms();
    if (c->n_experts && (!m->be->ops->moe_route || !m->be->ops->moe_experts))
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: mixture-of-experts layers: not on the %s "
                          "backend yet; run with --device cpu", m->dir, m->be->ops->name);
    /* Before any weight is read: a checkpoint larger than the memory would otherwise be
     * copied in until the OOM killer (or a failed allocation, much later) ends it. */
    atlas_weights_sum sum;
    ATLAS_TRY(atlas_weights_survey(m->st, c, p->tp_size > 1 ? &plan : NULL, &sum));
    bool cuda = strcmp(m->be->ops->name, "cpu") != 0;
    size_t kv = atlas_model_kv_bytes_for(c, g.n_kv_heads, atlas_model_kv_blocks_for(c, p),
                                         p->kv_block_size, m->be->kv_size);
    ATLAS_TRY(atlas_model_memory_check(cuda, p->gpu, sum.n_bytes, kv, p->no_memory_check));
    ATLAS_TRY(atlas_model_load_source(m, p, sum.n_bytes));
    atlas_load_progress progress = {.fn = p->progress, .user = p->progress_user};
    pthread_mutex_init(&progress.mu, NULL);
    atlas_status st = atlas_weights_load_shard(m->be, m->st, c, p->tp_size > 1 ? &plan : NULL,
                                               &progress, &m->w);
    pthread_mutex_destroy(&progress.mu);
    ATLAS_TRY(st);
    m->times.weights = atlas_now_ms();
    m->times.repack_ms = m->w.repack_ms;
    m->cfg.quant.kv_fp8_on = m->be->kv_size == 1;
    atlas_quant_config_str(&m->cfg.quant, m->quant_str, sizeof m->quant_str);
    atlas_weights_formats(m->w.groups, &m->cfg, m->formats, sizeof m->formats);
    /* The weights are the backend's own copies now: the files are closed and unmapped, so a
     * checkpoint rewritten or truncated on disk (a re-download, a sync) cannot reach a model
     * being served (a read of a truncated mapping is SIGBUS, for the whole process). */
    atlas_st_free(m->st);
    m->st = NULL;
    m->max_batch_tokens = p->max_batch_tokens;
    m->mlp_chunk = p->mlp_chunk_tokens < p->max_batch_tokens ? p->mlp_chunk_tokens
                                                             : p->max_batch_tokens;
    ATLAS_TRY(load_kv(m, p));
    m->times.kv = atlas_now_ms();
    ATLAS_TRY(alloc_acts(m));
    return m->be->ops->loaded ? m->be->ops->loaded(m->be) : ATLAS_OK;
}

static atlas_status load_all(atlas_model *m, const atlas_model_params *p,
                             const atlas_backend_options *opts) {
    m->times.begin = atlas_now_ms();
    ATLAS_TRY(atlas_config_load(m->dir, &m->cfg));
    m->times.config = atlas_now_ms();
    tok_job job = {.dir = m->dir, .vocab_size = (size_t)m->cfg.vocab_size, .eos = -1};
    pthread_t th;
    bool threaded = p->load_tokenizer && pthread_create(&th, NULL, tok_job_run, &job) == 0;
    if (p->load_tokenizer && !threaded) tok_job_run(&job); /* no thread: load it here */
    atlas_status st = ATLAS_OK;
    if (threaded || job.st == ATLAS_OK) st = load_weights(m, p, opts); /* job.st: not while it runs */
    if (threaded) pthread_join(th, NULL);
    m->tok = job.tok; /* unload frees it when the weights failed */
    m->times.tokenizer = job.done_ms;
    /* both failed: the tokenizer's error, as when it loaded first */
    if (job.st != ATLAS_OK) return atlas_fail(job.st, "%s", job.msg);
    if (st != ATLAS_OK) return st;
    if (job.eos >= 0) atlas_config_add_eos(&m->cfg, job.eos);
    m->n_eos = m->cfg.n_eos;
    for (int i = 0; i < m->n_eos; i++) m->eos[i] = m->cfg.eos_ids[i];
    m->times.end = atlas_now_ms();
    return ATLAS_OK;
}

/* One failure of unload: the first one's status is kept, each one's message is listed. */
typedef struct unload_report {
    char text[900];
    size_t used;
    int count;
    atlas_status first;
} unload_report;

static void unload_add(unload_report *rep, atlas_status st, const char *step) {
    if (st == ATLAS_OK) return;
    if (rep->count++ == 0) rep->first = st;
    if (rep->used < sizeof rep->text)
        rep->used += (size_t)snprintf(rep->text + rep->used, sizeof rep->text - rep->used,
                                      "%s%s: %s", rep->used ? "; " : "", step,
                                      atlas_last_error());
}

/* Frees everything, going on past every failure (one failed free must not leak the rest).
 * Returns the first failure with all of them in the message: the backend's destroy lists
 * every failed free of its memory (backend.h), the weights' and the KV cache's included. */
static atlas_status unload(atlas_model *m) {
    unload_report rep = {.first = ATLAS_OK};
    if (m->be) {
        unload_add(&rep, m->be->ops->sync(m->be), "sync");
        atlas_acts *a = &m->acts;
        void *bufs[] = {a->x, a->h, a->qkv, a->att, a->o, a->gate_up,
                        a->act != a->qkv ? a->act : NULL,
                        m->logits_in_gate_up ? NULL : a->logits,
                        a->rows != a->gate_up ? a->rows : NULL, a->moe_ids, a->moe_wts};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) m->be->ops->free(m->be, bufs[i]);
        m->be->ops->kv_free(m->be, m->kv);
        atlas_weights_free(m->be, &m->w);
        unload_add(&rep, m->be->ops->destroy(m->be), "freeing its memory");
    }
    atlas_st_free(m->st);
    atlas_tokenizer_free(m->tok);
    free(m->q_ids);
    free(m->q_tok);
    pthread_mutex_destroy(&m->forward_mu);
    char dir[256];
    snprintf(dir, sizeof dir, "%s", m->dir ? m->dir : "?");
    free(m->dir);
    free(m);
    /* a model loaded on another thread (the engine's loader) has its smaller buffers in that
     * thread's malloc arena, which glibc keeps after they are freed: give them back, so that
     * host memory is at its baseline after a release */
    atlas_mem_trim();
    if (rep.count == 0) return ATLAS_OK;
    /* the model is gone: never BUSY, which would tell the caller that nothing was unloaded */
    atlas_status st = rep.first == ATLAS_ERR_BUSY ? ATLAS_ERR_INTERNAL : rep.first;
    return atlas_fail(st, "releasing model %s (it is unloaded all the same): %s", dir, rep.text);
}

atlas_status atlas_model_load(const char *dir, const atlas_model_params *p, atlas_model **out) {
    return atlas_model_load_opts(dir, p, NULL, out);
}

atlas_status atlas_model_load_opts(const char *dir, const atlas_model_params *p,
                                   const atlas_backend_options *opts, atlas_model **out) {
    *out = NULL;
    atlas_model_params defaults = atlas_model_default_params();
    if (!p) p = &defaults;
    if (!dir || !*dir) return atlas_fail(ATLAS_ERR_INVALID, "model load: no directory given");
    ATLAS_TRY(check_params(p));
    /* a GGUF file, .bin weights, a cache entry: named as such, before anything is read */
    ATLAS_TRY(atlas_layout_check(dir));
    atlas_model *m = calloc(1, sizeof *m);
    if (!m) return atlas_fail(ATLAS_ERR_NOMEM, "model %s: out of memory", dir);
    atomic_init(&m->handles, 1);
    pthread_mutex_init(&m->forward_mu, NULL);
    m->dir = strdup(dir);
    atlas_status st = m->dir ? load_all(m, p, opts) : atlas_fail(ATLAS_ERR_NOMEM, "out of memory");
    if (st != ATLAS_OK) {
        /* the load's error is the status; what unloading the rest failed to free follows it */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", atlas_last_error());
        if (unload(m) != ATLAS_OK) {
            char un[400]; /* a copy: atlas_fail writes the buffer atlas_last_error reads */
            snprintf(un, sizeof un, "%s", atlas_last_error());
            return atlas_fail(st, "loading model %s: %.600s; and then %s", dir, msg, un);
        }
        return atlas_fail(st, "loading model %s: %s", dir, msg);
    }
    *out = m;
    return ATLAS_OK;
}

atlas_status atlas_model_check_layout(const char *dir) { return atlas_layout_check(dir); }

atlas_status atlas_model_inspect(const char *dir, const atlas_model_params *p,
                                 atlas_model_survey *out) {
    atlas_model_params defaults = atlas_model_default_params();
    return atlas_model_survey_dir(dir, p ? p : &defaults, out);
}

void atlas_model_start_tier_fill(atlas_model *m) {
    if (m && m->be && m->be->ops->tier_fill) m->be->ops->tier_fill(m->be);
}

atlas_model *atlas_model_ref(atlas_model *m) {
    if (m) atomic_fetch_add(&m->handles, 1);
    return m;
}

void atlas_model_unref(atlas_model *m) {
    if (!m) return;
    int before = atomic_fetch_sub(&m->handles, 1);
    /* The owner's handle keeps the count >= 1; dropping it is release's job. An unref
     * without its ref is a caller's bug: caught in debug builds, undone otherwise. */
    assert(before > 1);
    if (before <= 1) atomic_fetch_add(&m->handles, 1);
}

int atlas_model_handles(const atlas_model *m) {
    return m ? atomic_load(&((atlas_model *)m)->handles) : 0;
}

atlas_status atlas_model_release(atlas_model *m) {
    if (!m) return ATLAS_OK;
    int expect = 1;
    if (!atomic_compare_exchange_strong(&m->handles, &expect, 0))
        return atlas_fail(ATLAS_ERR_BUSY, "releasing model %s: %d other handle(s) still live; "
                          "nothing unloaded", m->dir, expect - 1);
    return unload(m);
}

static const char *dtype_str(atlas_dtype t) {
    return t == ATLAS_DTYPE_COUNT ? "mixed" : atlas_dtype_name(t);
}

void atlas_model_get_info(const atlas_model *m, atlas_model_info *info) {
    const atlas_config *c = &m->cfg;
    *info = (atlas_model_info){
        .dir = m->dir, .architecture = c->architecture, .vocab_size = c->vocab_size,
        .hidden = c->hidden, .n_layers = c->n_layers, .n_heads = c->n_heads,
        .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim, .intermediate = c->intermediate,
        .max_position = c->max_position, .tied_embeddings = c->tie_embeddings,
        .n_params = m->w.n_params, .dtype = dtype_str(m->w.dtype), .backend = m->be->ops->name,
        .backend_why = m->backend_why, .weight_bytes = m->w.n_bytes, .kv_bytes = m->kv_bytes,
        .kernels = m->be->kernels,
        .kv_blocks = m->kv_blocks, .kv_block_size = m->kv_block_size,
        .max_batch_tokens = m->max_batch_tokens,
        .queue_overlaps = m->be->ops->argmax_queue != NULL,
    };
    if (!strcmp(m->be->ops->name, "cpu")) info->n_threads = m->n_threads;
    info->quantization = m->quant_str;
    info->formats = m->formats;
    info->token_weight_bytes = atlas_weights_token_bytes(m->w.groups, c);
    size_t tokens = (size_t)m->kv_blocks * (size_t)m->kv_block_size;
    info->kv_token_bytes = tokens ? m->kv_bytes / tokens : 0;
    info->kv_dtype = m->be->kv_size == 1 ? "fp8" : m->be->kv_size == 2 ? "bf16" : "f32";
    info->kv_scales = m->kv_note;
    info->load_source = m->load_source ? m->load_source : "";
    info->load_cached_bytes = m->load_cached;
    info->host_tier = m->tier_off ? m->tier_off : "";
    info->times = m->times;
}

const atlas_tokenizer *atlas_model_tokenizer(const atlas_model *m) { return m->tok; }

int atlas_model_eos(const atlas_model *m, const int32_t **ids) {
    *ids = m->eos;
    return m->n_eos;
}

int atlas_model_is_eos(const atlas_model *m, int32_t id) {
    for (int i = 0; i < m->n_eos; i++)
        if (m->eos[i] == id) return 1;
    return 0;
}

int atlas_model_vocab_size(const atlas_model *m) { return m->cfg.vocab_size; }
int atlas_model_kv_blocks(const atlas_model *m) { return m->kv_blocks; }
int atlas_model_kv_block_size(const atlas_model *m) { return m->kv_block_size; }
int atlas_model_max_batch_tokens(const atlas_model *m) { return m->max_batch_tokens; }
const atlas_config *atlas_model_config(const atlas_model *m) { return &m->cfg; }
atlas_backend *atlas_model_backend(atlas_model *m) { return m->be; }

size_t atlas_model_kv_block_bytes(const atlas_model *m) {
    if (!m->be->ops->kv_save || !m->be->ops->kv_restore || m->tp_size > 1 || !m->kv_blocks)
        return 0;
    return m->kv_bytes / (size_t)m->kv_blocks;
}

/* save: host written from the cache; else the cache from host. */
static atlas_status kv_copy(atlas_model *m, const int32_t *ids, int n, void *const *out,
                            const void *const *in) {
    if (!atlas_model_kv_block_bytes(m))
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "model: the %s backend cannot copy KV blocks "
                          "to host memory", m->be->ops->name);
    pthread_mutex_lock(&m->forward_mu);
    atlas_status st = out ? m->be->ops->kv_save(m->be, m->kv, ids, n, out)
                          : m->be->ops->kv_restore(m->be, m->kv, ids, n, in);
    pthread_mutex_unlock(&m->forward_mu);
    return st;
}

atlas_status atlas_model_kv_save(atlas_model *m, const int32_t *ids, int n, void *const *host) {
    return kv_copy(m, ids, n, host, NULL);
}

atlas_status atlas_model_kv_restore(atlas_model *m, const int32_t *ids, int n,
                                    const void *const *host) {
    return kv_copy(m, ids, n, NULL, host);
}

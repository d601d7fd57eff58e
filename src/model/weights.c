/* model/weights.c — see weights.h. */
#include "model/weights.h"

#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/meminfo.h"
#include "model/experts_oss.h"
#include "model/kv_scale.h"
#include "model/quant.h"
#include "model/shard.h"
#include "model/weight_read.h"

enum { REPACK_THREADS = 16 }; /* at most, for a quantized checkpoint's reads and repacks */

typedef struct binder {
    atlas_backend *be;
    const atlas_st *st;
    atlas_model_weights *w;
    const atlas_shard_plan *plan; /* NULL: the whole model (world size 1) */
    /* The readers' contexts of the sources handed to weight_load, read by the backend (the
     * CUDA loader threads) until weights_done returns: one per tensor bound at most. */
    atlas_weight_file *files;
    size_t n_files, cap_files;
    atlas_load_progress *progress; /* NULL: no progress reported */
    bool count_only;               /* the first pass: finds every tensor (and sums the bytes
                                      to load when progress is reported), loads nothing */
    bool *used;                    /* [atlas_st_count]: found by the first pass */
    const atlas_quant_config *quant;
    bool bare; /* the tensors are named without "model." (embed_tokens.weight, layers.0...) */
    /* quantized weights handed to weight_load: read until weights_done, freed after */
    atlas_qweight *qw;
    size_t n_qw, cap_qw;
    atlas_threadpool *pool; /* reads and repacks the quantized ones (NULL: this thread) */
    /* where the text model's tensors are: "model." and "lm_head.weight", or a vision-language
     * checkpoint's (text_prefix) */
    const char *pre, *head;
    char embed[96];
    float offset; /* of the 1-D weights being bound (norm_plus_one's norms) */
    /* gpt-oss's experts, copied at load: read until weights_done, freed after (at once by a
     * backend without weights_done, which has read them when weight_load returns) */
    atlas_oss_experts *oss;
    int n_oss, cap_oss;
} binder;

/* Finds name and checks its shape ([rows] when cols is 0, else [rows, cols]) and dtype. */
static atlas_status find(binder *b, const char *name, int64_t rows, int64_t cols,
                         const atlas_tensor_view **out) {
    const atlas_tensor_view *v = atlas_st_find(b->st, name);
    /* Qwen3-Embedding saves its Qwen3Model without the "model." prefix (as vLLM maps it) */
    if (!v && !strncmp(name, "model.", 6) && b->bare) v = atlas_st_find(b->st, name + 6);
    *out = NULL;
    if (!v) return atlas_fail(ATLAS_ERR_NOT_FOUND, "tensor %s: missing from the checkpoint", name);
    size_t i = atlas_st_index(b->st, v);
    if (b->used && i < atlas_st_count(b->st)) b->used[i] = true;
    const char *file = v->file ? v->file : "?";
    if (v->dtype != ATLAS_DTYPE_BF16 && v->dtype != ATLAS_DTYPE_F16 && v->dtype != ATLAS_DTYPE_F32)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: tensor %s: dtype %s (want BF16, F16 or F32)",
                          file, name, atlas_dtype_name(v->dtype));
    int want_dims = cols ? 2 : 1;
    if (v->n_dims != want_dims || v->shape[0] != rows || (cols && v->shape[1] != cols)) {
        char got[96] = "[";
        for (int i = 0; i < v->n_dims && i < 4; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "",
                     (long long)v->shape[i]);
        strncat(got, "]", sizeof got - strlen(got) - 1);
        if (cols)
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: tensor %s: shape %s, want [%lld, %lld]",
                              file, name, got, (long long)rows, (long long)cols);
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: tensor %s: shape %s, want [%lld]", file, name,
                          got, (long long)rows);
    }
    *out = v;
    return ATLAS_OK;
}

static atlas_wgroup group_of(const char *name) {
    if (strstr(name, "embed_tokens")) return ATLAS_WG_EMBED;
    if (strstr(name, "lm_head")) return ATLAS_WG_HEAD;
    if (strstr(name, "self_attn.") && !strstr(name, "_norm")) return ATLAS_WG_ATTN;
    if (strstr(name, ".experts.")) return ATLAS_WG_EXPERTS;
    if (strstr(name, "mlp.") || strstr(name, "block_sparse_moe.")) return ATLAS_WG_MLP;
    return ATLAS_WG_NORM;
}

static void group_add(binder *b, const char *name, const char *format, size_t bytes) {
    atlas_wgroup_info *g = &b->w->groups[group_of(name)];
    if (!g->format[0]) snprintf(g->format, sizeof g->format, "%s", format);
    else if (strcmp(g->format, format)) snprintf(g->format, sizeof g->format, "mixed");
    g->bytes += bytes;
}

/* bytes: what this rank holds of v (all of it without a shard plan). */
static void account(binder *b, const atlas_tensor_view *v, size_t bytes, int is_matrix) {
    group_add(b, v->name, atlas_dtype_name(v->dtype), bytes);
    int64_t n = 1;
    for (int i = 0; i < v->n_dims; i++) n *= v->shape[i];
    b->w->n_params += n;
    b->w->n_bytes += bytes;
    if (!is_matrix) return;
    if (b->w->dtype == ATLAS_DTYPE_I32) b->w->dtype = v->dtype; /* I32: none seen yet */
    else if (b->w->dtype != v->dtype) b->w->dtype = ATLAS_DTYPE_COUNT;
}

/* Loads the n named tensors fused along dim 0; each has rows[i] rows (and cols columns). */
static atlas_status keep_owned(atlas_model_weights *w, void *p) {
    if (w->n_owned == w->cap_owned) {
        int cap = w->cap_owned ? 2 * w->cap_owned : 16;
        void **grown = realloc(w->owned, (size_t)cap * sizeof *grown);
        if (!grown) return ATLAS_ERR_NOMEM;
        w->owned = grown;
        w->cap_owned = cap;
    }
    w->owned[w->n_owned++] = p;
    return ATLAS_OK;
}

/* With a shard plan: this rank's parts of the n views (row splits point into the mapping,
 * column bands are copied into owned[i]). *present is false when the rank holds none of
 * them (lm_head off rank 0); a fused weight's parts are all present or all absent. */
static atlas_status shard_views(binder *b, const atlas_tensor_view **views, int n,
                                atlas_tensor_view *parts, void **owned, bool *present) {
    for (int i = 0; i < n; i++) {
        ATLAS_TRY(atlas_shard_view(b->plan, views[i], &parts[i], &owned[i], present));
        if (!*present) return ATLAS_OK;
        views[i] = &parts[i];
    }
    return ATLAS_OK;
}

/* The count pass: accounts the n views and adds the bytes this rank will read of them to
 * the progress total (weight groups hold this rank's bytes, as after a load). */
static atlas_status count_views(binder *b, const atlas_tensor_view **views, int n, int is_matrix) {
    for (int i = 0; i < n; i++) {
        const atlas_tensor_view *v = views[i];
        size_t bytes = v->nbytes;
        if (b->plan) {
            atlas_shard_slice s;
            ATLAS_TRY(atlas_shard_tensor(b->plan, v->name, v->n_dims, v->shape, v->dtype, &s));
            bytes = s.present ? (size_t)(s.n_rows * s.n_cols) * s.elem : 0;
        }
        if (b->progress) b->progress->total += bytes;
        account(b, v, bytes, is_matrix);
    }
    return ATLAS_OK;
}

/* "FP8 e4m3 block 128x128", "INT4 group 128 act-order", ... */
static void qformat(const atlas_qweight *q, const atlas_quant_config *qc, char *buf, size_t cap) {
    const atlas_wquant *w = &q->q;
    if (w->format == ATLAS_WFMT_INT4 && qc->group == 0)
        snprintf(buf, cap, "INT4 one group a row");
    else if (w->format == ATLAS_WFMT_INT4)
        snprintf(buf, cap, "INT4 group %d%s", w->block_cols, q->act_order ? " act-order" : "");
    else if (w->format == ATLAS_WFMT_FP4_E2M1)
        snprintf(buf, cap, "%s e2m1 group %d", qc->method == ATLAS_QM_MXFP4 ? "MXFP4" : "NVFP4",
                 w->block_cols);
    else if (w->block_rows == q->rows && w->block_cols == q->cols)
        snprintf(buf, cap, "FP8 e4m3 per-tensor");
    else if (w->block_rows == 1 && w->block_cols == q->cols)
        snprintf(buf, cap, "FP8 e4m3 per-channel");
    else
        snprintf(buf, cap, "FP8 e4m3 block %dx%d", w->block_rows, w->block_cols);
}

/* A quantized weight counts at its stored size: packed codes, scales, zeros, indices. */
static void account_quant(binder *b, const char *name, const atlas_qweight *q, const char *fmt) {
    b->w->n_params += q->rows * q->cols;
    b->w->n_bytes += q->file_bytes;
    b->w->dtype = ATLAS_DTYPE_COUNT;
    group_add(b, name, fmt, q->file_bytes);
}

/* The per-part arrays of a weight of n parts (a stacked MoE layer's: two an expert). */
typedef struct part_bufs {
    char (*fmts)[48];
    atlas_weight_src *srcs;
    const atlas_weight_src **sp;
    atlas_tensor_view *parts;
    void **owned;
} part_bufs;

static void part_bufs_free(part_bufs *p) {
    free(p->fmts), free(p->srcs), free(p->sp), free(p->parts), free(p->owned);
}

static atlas_status part_bufs_make(int n, const char *name, part_bufs *p) {
    size_t m = n > 0 ? (size_t)n : 1;
    *p = (part_bufs){calloc(m, sizeof *p->fmts), calloc(m, sizeof *p->srcs),
                     calloc(m, sizeof *p->sp), calloc(m, sizeof *p->parts),
                     calloc(m, sizeof *p->owned)};
    if (p->fmts && p->srcs && p->sp && p->parts && p->owned) return ATLAS_OK;
    part_bufs_free(p);
    return atlas_fail(ATLAS_ERR_NOMEM, "binding %s: out of memory", name);
}

static atlas_status bind_quant_with(binder *b, const char *const *names, atlas_qweight *qw,
                                    int n, atlas_weight **out, part_bufs *pb);

/* A linear layer stored quantized (model/quant.h): its n parts as weight sources of the
 * backend's formats. The parts stay with the binder until the weights are loaded. */
static atlas_status bind_quant(binder *b, const char *const *names, atlas_qweight *qw, int n,
                               atlas_weight **out) {
    if (b->plan) /* refused by the count pass too, so that a survey says it */
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "binding %s: quantized weights with tensor "
                          "parallelism are not supported yet", names[0]);
    part_bufs pb;
    ATLAS_TRY(part_bufs_make(n, names[0], &pb));
    atlas_status st = bind_quant_with(b, names, qw, n, out, &pb);
    part_bufs_free(&pb);
    return st;
}

static atlas_status bind_quant_with(binder *b, const char *const *names, atlas_qweight *qw,
                                    int n, atlas_weight **out, part_bufs *pb) {
    char (*fmts)[48] = pb->fmts; /* as the checkpoint stores them, before the fusion's changes */
    for (int i = 0; i < n; i++) qformat(&qw[i], b->quant, fmts[i], sizeof fmts[i]);
    if (b->count_only) {
        for (int i = 0; i < n; i++) {
            if (b->progress) b->progress->total += qw[i].file_bytes;
            account_quant(b, names[i], &qw[i], fmts[i]);
        }
        return ATLAS_OK;
    }
    if (b->cap_qw - b->n_qw < (size_t)n)
        return atlas_fail(ATLAS_ERR_INTERNAL, "binding %s: more quantized weights than the "
                          "checkpoint's tensors", names[0]);
    ATLAS_TRY(atlas_quant_fuse(qw, n));
    atlas_weight_src *srcs = pb->srcs;
    const atlas_weight_src **sp = pb->sp;
    for (int i = 0; i < n; i++) {
        atlas_qweight *q = &b->qw[b->n_qw++];
        *q = qw[i];
        memset(&qw[i], 0, sizeof qw[i]); /* the binder's now */
        if (q->codes) {
            atlas_weight_src_of_view_counted(q->codes, &b->files[b->n_files], b->progress,
                                             &srcs[i]);
            if (srcs[i].read) b->n_files++;
            /* the codes' tensor may be packed ([rows, cols/2]) or blocked ([rows, cols/32,
             * 16]): the source is the weight's [rows, cols] */
            srcs[i].n_dims = 2;
            srcs[i].shape[0] = q->rows;
            srcs[i].shape[1] = q->cols;
            /* compressed-tensors' int32 words read as atlas's packed bytes */
            if (q->q.format == ATLAS_WFMT_INT4 && q->q.order == ATLAS_INT4_PACKED)
                srcs[i].dtype = ATLAS_DTYPE_U8;
            for (int k = 0; q->stored_scales && k < 2; k++) { /* INT4 as stored: its grids */
                atlas_weight_src_of_view_counted(k ? q->stored_zeros : q->stored_scales,
                                                 &b->files[b->n_files], b->progress,
                                                 &q->stored_src[k]);
                if (q->stored_src[k].read) b->n_files++;
            }
            if (q->stored_scales) {
                q->q.stored_scales = &q->stored_src[0];
                q->q.stored_zeros = &q->stored_src[1];
            }
        } else {
            srcs[i] = (atlas_weight_src){.name = names[i], .dtype = ATLAS_DTYPE_U8, .n_dims = 2,
                                         .shape = {q->rows, q->cols}, .nbytes = q->packed_bytes,
                                         .data = q->packed};
        }
        srcs[i].quant = &q->q;
        sp[i] = &srcs[i];
    }
    atlas_status st = b->be->ops->weight_load(b->be, sp, n, out);
    if (st != ATLAS_OK) return atlas_fail_wrap(st, "binding %s", names[0]);
    for (int i = 0; i < n; i++) {
        const atlas_qweight *q = &b->qw[b->n_qw - n + i];
        /* the readers counted the codes (and stored grids); the rest was read here */
        size_t counted = srcs[i].read ? srcs[i].nbytes : 0;
        for (int k = 0; q->stored_scales && k < 2; k++)
            counted += q->stored_src[k].read ? q->stored_src[k].nbytes : 0;
        atlas_load_progress_add(b->progress, q->file_bytes - counted);
        account_quant(b, names[i], q, fmts[i]);
    }
    if (b->be->copies_at_load) { /* the backend has its own copies: the repacked bytes go now */
        for (int i = 0; i < n; i++) atlas_qweight_free(&b->qw[b->n_qw - n + i]);
        b->n_qw -= (size_t)n;
    }
    return ATLAS_OK;
}

/* Whether the linear layers names[n] (module.weight) are stored quantized: then they are
 * bound through bind_quant and *done is set. */
static atlas_status try_quant(binder *b, const char *const *names, const int64_t *rows, int n,
                              int64_t cols, atlas_weight **out, bool *done) {
    atlas_qweight *qw = calloc((size_t)n, sizeof *qw);
    int quantized = 0;
    *done = false;
    if (!qw) return atlas_fail(ATLAS_ERR_NOMEM, "binding %s: out of memory", names[0]);
    atlas_status st = ATLAS_OK;
    for (int i = 0; i < n && st == ATLAS_OK; i++) {
        char module[128];
        size_t len = strlen(names[i]) - strlen(".weight");
        snprintf(module, sizeof module, "%.*s", (int)len, names[i]);
        double t0 = atlas_now_ms();
        st = atlas_quant_bind(b->st, b->quant, module, rows[i], cols, !b->count_only,
                              b->be && b->be->int4_stored, b->used, b->pool, &qw[i]);
        if (qw[i].quantized) b->w->repack_ms += atlas_now_ms() - t0;
        quantized += qw[i].quantized;
    }
    if (st == ATLAS_OK && quantized && quantized != n)
        st = atlas_fail(ATLAS_ERR_FORMAT, "%s: %d of the %d weights it is fused with are "
                        "quantized (one format a fused weight)", names[0], quantized, n);
    if (st == ATLAS_OK && quantized) {
        *done = true;
        st = bind_quant(b, names, qw, n, out);
    }
    for (int i = 0; i < n; i++) atlas_qweight_free(&qw[i]);
    free(qw);
    return st;
}

/* Loads the n views (found and checked) as one weight, this rank's parts of them with a
 * shard plan. src_name (NULL: the views' own) names the sources for the backend. */
static atlas_status bind_views_with(binder *b, const char *const *names,
                                    const atlas_tensor_view **views, int n, int64_t cols,
                                    const char *src_name, atlas_weight **out, part_bufs *pb);

static atlas_status bind_views(binder *b, const char *const *names, const atlas_tensor_view **views,
                               int n, int64_t cols, const char *src_name, atlas_weight **out) {
    if (b->count_only) return count_views(b, views, n, cols != 0);
    part_bufs pb;
    ATLAS_TRY(part_bufs_make(n, names[0], &pb));
    atlas_status st = bind_views_with(b, names, views, n, cols, src_name, out, &pb);
    part_bufs_free(&pb);
    return st;
}

static atlas_status bind_views_with(binder *b, const char *const *names,
                                    const atlas_tensor_view **views, int n, int64_t cols,
                                    const char *src_name, atlas_weight **out, part_bufs *pb) {
    atlas_tensor_view *parts = pb->parts;
    void **owned = pb->owned;
    bool present = true;
    atlas_status st = b->plan ? shard_views(b, views, n, parts, owned, &present) : ATLAS_OK;
    for (int i = 0; src_name && st == ATLAS_OK && present && i < n; i++) {
        parts[i] = *views[i]; /* shard_views pointed views at parts (or left them whole) */
        parts[i].name = src_name;
        views[i] = &parts[i];
    }
    if (st == ATLAS_OK && present) {
        atlas_weight_src *srcs = pb->srcs;
        const atlas_weight_src **sp = pb->sp;
        for (int i = 0; i < n && st == ATLAS_OK; i++) {
            if (b->n_files == b->cap_files) { /* each tensor is bound once: cannot happen */
                st = atlas_fail(ATLAS_ERR_INTERNAL, "binding %s: more tensors than the "
                                "checkpoint's %zu", names[i], b->cap_files);
                break;
            }
            atlas_weight_src_of_view_counted(views[i], &b->files[b->n_files], b->progress,
                                             &srcs[i]);
            if (srcs[i].read) b->n_files++; /* the entry is its reader's context now */
            if (!cols) srcs[i].offset = b->offset;
            sp[i] = &srcs[i];
        }
        if (st == ATLAS_OK) st = b->be->ops->weight_load(b->be, sp, n, out);
        if (st != ATLAS_OK) st = atlas_fail_wrap(st, "binding %s", names[0]);
        for (int i = 0; i < n && st == ATLAS_OK; i++) /* no reader: copied from memory */
            if (!srcs[i].read) atlas_load_progress_add(b->progress, srcs[i].nbytes);
    }
    /* A gathered column band is read until weights_done (by the CUDA loader threads): it
     * is kept with the weights and freed by atlas_weights_free. */
    for (int i = 0; i < n; i++)
        if (owned[i] && (st != ATLAS_OK || keep_owned(b->w, owned[i]) != ATLAS_OK)) {
            free(owned[i]);
            if (st == ATLAS_OK)
                st = atlas_fail(ATLAS_ERR_NOMEM, "binding %s: out of memory", names[0]);
        }
    if (st != ATLAS_OK || !present) return st;
    for (int i = 0; i < n; i++) account(b, views[i], views[i]->nbytes, cols != 0);
    return ATLAS_OK;
}

static atlas_status bind(binder *b, const char *const *names, const int64_t *rows, int n,
                         int64_t cols, atlas_weight **out) {
    if (cols && b->quant && b->quant->method != ATLAS_QM_NONE && strcmp(names[0], b->embed)) {
        bool done;
        ATLAS_TRY(try_quant(b, names, rows, n, cols, out, &done));
        if (done) return ATLAS_OK;
    }
    const atlas_tensor_view **views = calloc((size_t)n, sizeof *views);
    if (!views) return atlas_fail(ATLAS_ERR_NOMEM, "binding %s: out of memory", names[0]);
    atlas_status st = ATLAS_OK;
    for (int i = 0; i < n && st == ATLAS_OK; i++) st = find(b, names[i], rows[i], cols, &views[i]);
    if (st == ATLAS_OK) st = bind_views(b, names, views, n, cols, NULL, out);
    free(views);
    return st;
}

/* A fused tensor (Phi3's qkv_proj, gate_up_proj) that joins the n tensors parts[i] of
 * rows[i] rows each, in the order the backend fuses them: bound as it is on one rank; with
 * tensor parallelism as the views of those parts into its bytes, each split by its own
 * rule (a rank's q, k and v heads are three bands of qkv_proj). */
static atlas_status bind_fused(binder *b, const char *fused, const char *const *parts,
                               const int64_t *rows, int n, int64_t cols, atlas_weight **out) {
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += rows[i];
    if (!b->plan || b->plan->world == 1) return bind(b, &fused, &total, 1, cols, out);
    if (b->quant && b->quant->method != ATLAS_QM_NONE)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "tensor %s: a quantized fused tensor is not "
                          "split across tensor-parallel ranks yet; run it on one GPU", fused);
    const atlas_tensor_view *v;
    ATLAS_TRY(find(b, fused, total, cols, &v));
    atlas_tensor_view sub[4];
    const atlas_tensor_view *views[4];
    size_t row_bytes = (size_t)cols * atlas_dtype_size(v->dtype);
    int64_t r0 = 0;
    for (int i = 0; i < n; i++) {
        sub[i] = *v;
        sub[i].name = parts[i];
        sub[i].shape[0] = rows[i];
        sub[i].data = (const char *)v->data + (size_t)r0 * row_bytes;
        sub[i].nbytes = (size_t)rows[i] * row_bytes;
        sub[i].file_offset = v->file_offset + (uint64_t)r0 * row_bytes;
        views[i] = &sub[i];
        r0 += rows[i];
    }
    return bind_views(b, parts, views, n, cols, v->name, out);
}

static atlas_status bind1(binder *b, const char *name, int64_t rows, int64_t cols,
                          atlas_weight **out) {
    return bind(b, &name, &rows, 1, cols, out);
}

/* A norm's weight: 1 + w where the family says so (Gemma). */
static atlas_status bind_norm(binder *b, const atlas_config *c, const char *name, int64_t rows,
                              atlas_weight **out) {
    b->offset = c->norm_plus_one ? 1.0f : 0.0f;
    atlas_status st = bind1(b, name, rows, 0, out);
    b->offset = 0;
    return st;
}

static atlas_status bind_attn(binder *b, const atlas_config *c, int l, atlas_layer_weights *lw) {
    char n[4][160];
    int64_t d = c->hidden, hd = c->head_dim, H = c->n_heads, K = c->n_kv_heads;
    const char *proj[3] = {"q_proj", "k_proj", "v_proj"}, *pre = b->pre;
    int64_t qkv_rows[3] = {H * hd, K * hd, K * hd};
    const char *names[3];
#define NAME(i, ...) (snprintf(n[i], sizeof n[i], __VA_ARGS__), n[i])
    for (int i = 0; i < 3; i++)
        names[i] = NAME(i, "%slayers.%d.self_attn.%s.weight", pre, l, proj[i]);
    if (c->fused_proj) /* Phi3 */
        ATLAS_TRY(bind_fused(b, NAME(3, "%slayers.%d.self_attn.qkv_proj.weight", pre, l), names,
                             qkv_rows, 3, d, &lw->qkv));
    else
        ATLAS_TRY(bind(b, names, qkv_rows, 3, d, &lw->qkv));
    if (c->qkv_bias) {
        for (int i = 0; i < 3; i++)
            names[i] = NAME(i, "%slayers.%d.self_attn.%s.bias", pre, l, proj[i]);
        ATLAS_TRY(bind(b, names, qkv_rows, 3, 0, &lw->qkv_bias));
    }
    if (c->qk_norm) {
        ATLAS_TRY(bind_norm(b, c, NAME(0, "%slayers.%d.self_attn.q_norm.weight", pre, l), hd,
                            &lw->q_norm));
        ATLAS_TRY(bind_norm(b, c, NAME(0, "%slayers.%d.self_attn.k_norm.weight", pre, l), hd,
                            &lw->k_norm));
    }
    ATLAS_TRY(bind1(b, NAME(0, "%slayers.%d.self_attn.o_proj.weight", pre, l), d, H * hd,
                    &lw->o));
    if (c->o_bias)
        ATLAS_TRY(bind1(b, NAME(0, "%slayers.%d.self_attn.o_proj.bias", pre, l), d, 0,
                        &lw->o_bias));
    if (c->attn_sinks)
        ATLAS_TRY(bind1(b, NAME(0, "%slayers.%d.self_attn.sinks", pre, l), H, 0, &lw->sinks));
#undef NAME
    return ATLAS_OK;
}

/* gpt-oss's experts counted at their stored size (MXFP4: codes and scales); the group's
 * format is its matrices' (its biases' bytes count, their dtype does not make it "mixed"). */
static void account_oss(binder *b, const atlas_oss_experts *x) {
    for (int p = 0; p < ATLAS_OSS_N; p++) {
        b->w->n_params += x->params[p];
        b->w->n_bytes += x->file_bytes[p];
        if (p != ATLAS_OSS_GATE_UP && p != ATLAS_OSS_DOWN) {
            b->w->groups[ATLAS_WG_EXPERTS].bytes += x->file_bytes[p];
            continue;
        }
        group_add(b, x->v[p]->name, x->format[p], x->file_bytes[p]);
        if (x->mxfp4 || (b->w->dtype != ATLAS_DTYPE_I32 && b->w->dtype != x->v[p]->dtype))
            b->w->dtype = ATLAS_DTYPE_COUNT;
        else if (b->w->dtype == ATLAS_DTYPE_I32) b->w->dtype = x->v[p]->dtype;
    }
}

/* gpt-oss: mlp.router's weight and bias, and the four stacked expert tensors of
 * model/experts_oss.h, each loaded as one weight of E parts. */
static atlas_status bind_oss_moe(binder *b, const atlas_config *c, int l,
                                 atlas_layer_weights *lw) {
    char name[160];
    int E = c->n_experts;
    snprintf(name, sizeof name, "%slayers.%d.mlp.router.weight", b->pre, l);
    ATLAS_TRY(bind1(b, name, E, c->hidden, &lw->router));
    snprintf(name, sizeof name, "%slayers.%d.mlp.router.bias", b->pre, l);
    ATLAS_TRY(bind1(b, name, E, 0, &lw->router_bias));
    atlas_oss_experts x;
    atlas_status st = atlas_oss_experts_find(b->st, c, b->pre, l, b->used, &x);
    if (st != ATLAS_OK || b->count_only) {
        for (int p = 0; st == ATLAS_OK && p < ATLAS_OSS_N && b->progress; p++)
            b->progress->total += x.file_bytes[p];
        if (st == ATLAS_OK) account_oss(b, &x);
        return st;
    }
    if (b->n_oss == b->cap_oss)
        return atlas_fail(ATLAS_ERR_INTERNAL, "binding %s: more MoE layers than layers", name);
    st = atlas_oss_experts_read(&x);
    atlas_weight **outs[ATLAS_OSS_N] = {&lw->experts_gate_up, &lw->experts_gate_up_bias,
                                        &lw->experts_down, &lw->experts_down_bias};
    for (int p = 0; st == ATLAS_OK && p < ATLAS_OSS_N; p++) {
        st = b->be->ops->weight_load(b->be, x.sp + p * E, E, outs[p]);
        if (st != ATLAS_OK) st = atlas_fail_wrap(st, "binding %s", x.v[p]->name);
        else atlas_load_progress_add(b->progress, x.file_bytes[p]);
    }
    if (st == ATLAS_OK) account_oss(b, &x);
    if (st == ATLAS_OK && b->be->ops->weights_done) b->oss[b->n_oss++] = x;
    else atlas_oss_experts_free(&x);
    return st;
}

/* A mixture-of-experts layer: the router [E, d], and the experts as two stacked weights of
 * one part a tensor, expert after expert (backend.h's moe_experts): gate_up [E * 2f, d]
 * (gate_proj then up_proj of each; Mixtral's w1 then w3) and down [E * d, f] (down_proj,
 * Mixtral's w2). */
static atlas_status bind_moe(binder *b, const atlas_config *c, int l, atlas_layer_weights *lw) {
    int E = c->n_experts;
    int64_t d = c->hidden, f = c->expert_ffn;
    bool mixtral = c->arch == ATLAS_ARCH_MIXTRAL;
    const char *block = mixtral ? "block_sparse_moe" : "mlp";
    const char *proj[3] = {mixtral ? "w1" : "gate_proj", mixtral ? "w3" : "up_proj",
                           mixtral ? "w2" : "down_proj"};
    char router[160];
    snprintf(router, sizeof router, "%slayers.%d.%s.gate.weight", b->pre, l, block);
    if (b->plan && b->plan->world > 1)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "binding %s: mixture-of-experts layers are not "
                          "split across tensor-parallel ranks yet; run on one device", router);
    if (c->arch == ATLAS_ARCH_GPT_OSS) return bind_oss_moe(b, c, l, lw);
    ATLAS_TRY(bind1(b, router, E, d, &lw->router));
    char (*nm)[160] = calloc((size_t)2 * E, sizeof *nm);
    const char **names = calloc((size_t)2 * E, sizeof *names);
    int64_t *rows = calloc((size_t)2 * E, sizeof *rows);
    atlas_status st = nm && names && rows ? ATLAS_OK
                                          : atlas_fail(ATLAS_ERR_NOMEM, "binding %s: out of "
                                                       "memory", router);
    for (int i = 0; st == ATLAS_OK && i < 2 * E; i++) {
        snprintf(nm[i], sizeof nm[i], "%slayers.%d.%s.experts.%d.%s.weight", b->pre, l, block,
                 i / 2, proj[i % 2]);
        names[i] = nm[i];
        rows[i] = f;
    }
    if (st == ATLAS_OK) st = bind(b, names, rows, 2 * E, d, &lw->experts_gate_up);
    for (int e = 0; st == ATLAS_OK && e < E; e++) {
        snprintf(nm[e], sizeof nm[e], "%slayers.%d.%s.experts.%d.%s.weight", b->pre, l, block,
                 e, proj[2]);
        names[e] = nm[e];
        rows[e] = d;
    }
    if (st == ATLAS_OK) st = bind(b, names, rows, E, f, &lw->experts_down);
    free(nm), free(names), free(rows);
    return st;
}

static atlas_status bind_layer(binder *b, const atlas_config *c, int l, atlas_layer_weights *lw) {
    char n[4][160];
    int64_t d = c->hidden;
    const char *pre = b->pre, *names[2];
#define NAME(i, ...) (snprintf(n[i], sizeof n[i], __VA_ARGS__), n[i])
    ATLAS_TRY(bind_norm(b, c, NAME(0, "%slayers.%d.input_layernorm.weight", pre, l), d,
                        &lw->attn_norm));
    ATLAS_TRY(bind_attn(b, c, l, lw));
    /* Gemma 3: post_attention_layernorm norms the attention's output, and
     * pre_feedforward_layernorm the MLP's input */
    if (c->post_norms) {
        ATLAS_TRY(bind_norm(b, c, NAME(0, "%slayers.%d.post_attention_layernorm.weight", pre, l),
                            d, &lw->attn_out_norm));
        ATLAS_TRY(bind_norm(b, c, NAME(0, "%slayers.%d.pre_feedforward_layernorm.weight", pre,
                                       l), d, &lw->mlp_norm));
        ATLAS_TRY(bind_norm(b, c, NAME(0, "%slayers.%d.post_feedforward_layernorm.weight", pre,
                                       l), d, &lw->mlp_out_norm));
    } else {
        ATLAS_TRY(bind_norm(b, c, NAME(0, "%slayers.%d.post_attention_layernorm.weight", pre, l),
                            d, &lw->mlp_norm));
    }
    if (atlas_config_layer_moe(c, l)) return bind_moe(b, c, l, lw);
    int64_t gu_rows[2] = {c->intermediate, c->intermediate};
    const char *gu[2] = {"gate_proj", "up_proj"};
    for (int i = 0; i < 2; i++) names[i] = NAME(i, "%slayers.%d.mlp.%s.weight", pre, l, gu[i]);
    if (c->fused_proj)
        ATLAS_TRY(bind_fused(b, NAME(3, "%slayers.%d.mlp.gate_up_proj.weight", pre, l), names,
                             gu_rows, 2, d, &lw->gate_up));
    else
        ATLAS_TRY(bind(b, names, gu_rows, 2, d, &lw->gate_up));
    if (c->mlp_bias) {
        for (int i = 0; i < 2; i++) names[i] = NAME(i, "%slayers.%d.mlp.%s.bias", pre, l, gu[i]);
        ATLAS_TRY(bind(b, names, gu_rows, 2, 0, &lw->gate_up_bias));
    }
    ATLAS_TRY(bind1(b, NAME(0, "%slayers.%d.mlp.down_proj.weight", pre, l), d, c->intermediate,
                    &lw->down));
    if (c->mlp_bias)
        ATLAS_TRY(bind1(b, NAME(0, "%slayers.%d.mlp.down_proj.bias", pre, l), d, 0,
                        &lw->down_bias));
#undef NAME
    return ATLAS_OK;
}

/* Where the text model's tensors are: a vision-language checkpoint (Gemma3ForConditional-
 * Generation) keeps them under language_model.model. as published, under
 * model.language_model. as transformers has saved it since; found by the embedding. */
static atlas_status text_prefix(binder *b, const atlas_config *c) {
    b->pre = "model.";
    b->head = "lm_head.weight";
    if (c->nested_text) {
        if (atlas_st_find(b->st, "model.language_model.embed_tokens.weight")) {
            b->pre = "model.language_model.";
        } else if (atlas_st_find(b->st, "language_model.model.embed_tokens.weight")) {
            b->pre = "language_model.model.";
            b->head = "language_model.lm_head.weight";
        } else {
            return atlas_fail(ATLAS_ERR_NOT_FOUND, "%s: neither "
                              "language_model.model.embed_tokens.weight nor "
                              "model.language_model.embed_tokens.weight is in the checkpoint: "
                              "where is its text model?", c->architecture);
        }
    }
    snprintf(b->embed, sizeof b->embed, "%sembed_tokens.weight", b->pre);
    return ATLAS_OK;
}

static atlas_status bind_all(binder *b, const atlas_config *c) {
    atlas_model_weights *w = b->w;
    char norm[96];
    ATLAS_TRY(text_prefix(b, c));
    snprintf(norm, sizeof norm, "%snorm.weight", b->pre);
    ATLAS_TRY(bind1(b, b->embed, c->vocab_size, c->hidden, &w->embed));
    ATLAS_TRY(bind_norm(b, c, norm, c->hidden, &w->norm));
    /* A checkpoint that says tied may still carry lm_head.weight (some exports do): the
     * config decides, as in transformers. An embedding model has no head (Qwen3-Embedding
     * ships none whatever its config says): its vectors come from the final norm. */
    if (c->pooling != ATLAS_POOL_NONE)
        w->lm_head = NULL;
    else if (c->tie_embeddings)
        w->lm_head = w->embed;
    else
        ATLAS_TRY(bind1(b, b->head, c->vocab_size, c->hidden, &w->lm_head));
    w->layers = calloc((size_t)c->n_layers, sizeof *w->layers);
    if (!w->layers) return atlas_fail(ATLAS_ERR_NOMEM, "weights: out of memory");
    w->n_layers = c->n_layers;
    for (int l = 0; l < c->n_layers; l++) ATLAS_TRY(bind_layer(b, c, l, &w->layers[l]));
    return ATLAS_OK;
}

atlas_status atlas_weights_load(atlas_backend *be, const atlas_st *st, const atlas_config *cfg,
                                atlas_model_weights *out) {
    return atlas_weights_load_shard(be, st, cfg, NULL, NULL, out);
}

/* ---- every tensor accounted for -------------------------------------------------------
 * The tensors a checkpoint may carry that the forward does not use, on purpose. Any other
 * tensor that bind_all does not find fails the load: a family or format added later adds
 * its rows here (CONTRIBUTING.md, "How to add an architecture"). Patterns are fnmatch(3)'s,
 * '*' matching dots too. */
#define ALL_ARCHS (~0u)
#define ARCH(a) (1u << (a))

typedef enum ignore_when {
    IGNORE_ALWAYS,
    IGNORE_WHEN_TIED,      /* only with tie_word_embeddings */
    IGNORE_WHEN_EMBEDDING, /* only in an embedding model (config.pooling) */
    IGNORE_WHEN_NESTED,    /* only in a vision-language checkpoint (its text model runs) */
} ignore_when;

static const struct ignore_rule {
    unsigned archs; /* ARCH() bits */
    const char *pattern;
    ignore_when when;
} IGNORED[] = {
    /* an embedding model's vectors come from the final norm: a head it carries is unused */
    {ALL_ARCHS, "lm_head.weight", IGNORE_WHEN_EMBEDDING},
    /* the RoPE table, a buffer older transformers saved (and ColossalAI's cos/sin caches,
     * as vLLM skips them): atlas computes it from config.json */
    {ALL_ARCHS, "model.layers.*.self_attn.rotary_emb.inv_freq", IGNORE_ALWAYS},
    {ALL_ARCHS, "model.rotary_emb.inv_freq", IGNORE_ALWAYS},
    {ALL_ARCHS, "model.layers.*.self_attn.rotary_emb.cos_cached", IGNORE_ALWAYS},
    {ALL_ARCHS, "model.layers.*.self_attn.rotary_emb.sin_cached", IGNORE_ALWAYS},
    /* tied: the embedding is the output head, whatever copy an export kept (transformers
     * ties it over the file's) */
    {ALL_ARCHS, "lm_head.weight", IGNORE_WHEN_TIED},
    {ARCH(ATLAS_ARCH_GEMMA3), "language_model.lm_head.weight", IGNORE_WHEN_TIED},
    /* Gemma3ForConditionalGeneration's image encoder and projector, in both spellings: atlas
     * runs the text model (image input is refused by the server) */
    {ARCH(ATLAS_ARCH_GEMMA3), "vision_tower.*", IGNORE_WHEN_NESTED},
    {ARCH(ATLAS_ARCH_GEMMA3), "multi_modal_projector.*", IGNORE_WHEN_NESTED},
    {ARCH(ATLAS_ARCH_GEMMA3), "model.vision_tower.*", IGNORE_WHEN_NESTED},
    {ARCH(ATLAS_ARCH_GEMMA3), "model.multi_modal_projector.*", IGNORE_WHEN_NESTED},
};

static bool ignored(const atlas_config *c, const char *name) {
    /* an FP8 KV cache's scales: read by model/kv_scale.c (used by an FP8 cache, unused by
     * another), never bound as weights */
    if (atlas_kv_scale_name(name, c->n_layers)) return true;
    for (size_t i = 0; i < sizeof IGNORED / sizeof IGNORED[0]; i++) {
        const struct ignore_rule *r = &IGNORED[i];
        if (!(r->archs & ARCH(c->arch)) || (r->when == IGNORE_WHEN_TIED && !c->tie_embeddings) ||
            (r->when == IGNORE_WHEN_EMBEDDING && c->pooling == ATLAS_POOL_NONE) ||
            (r->when == IGNORE_WHEN_NESTED && !c->nested_text))
            continue;
        if (fnmatch(r->pattern, name, 0) == 0) return true;
    }
    return false;
}

/* A tensor neither found nor ignored fails the load, the first one named, the rest counted. */
static atlas_status check_unused(const atlas_st *st, const atlas_config *c, const bool *used) {
    size_t n = atlas_st_count(st), strays = 0;
    const atlas_tensor_view *first = NULL;
    for (size_t i = 0; i < n; i++) {
        const atlas_tensor_view *v = atlas_st_at(st, i);
        if (used[i] || ignored(c, v->name)) continue;
        if (!first) first = v;
        strays++;
    }
    if (!first) return ATLAS_OK;
    char more[48] = "";
    if (strays > 1) snprintf(more, sizeof more, " (and %zu more)", strays - 1);
    return atlas_fail(ATLAS_ERR_UNSUPPORTED,
                      "%s: tensor %s%s: %s as config.json describes it has no such tensor, "
                      "and it is not one atlas may ignore (left unused, the model computed "
                      "would not be the checkpoint's)", first->file ? first->file : "?",
                      first->name, more, c->architecture);
}

/* Whether the checkpoint names its tensors without "model." (a Qwen3Model's export). */
static bool bare_names(const atlas_st *st) {
    return !atlas_st_find(st, "model.embed_tokens.weight") && atlas_st_find(st, "embed_tokens.weight");
}

/* The first pass, before anything loads: finds every tensor the config calls for (shape and
 * dtype checked) over the whole model, whatever this rank holds, checks that nothing else is
 * in the checkpoint, and sets progress->total to the bytes this rank will read (so that the
 * first report already knows it) when progress is reported. */
static atlas_status check_all(const atlas_st *st, const atlas_config *cfg,
                              const atlas_shard_plan *plan, atlas_load_progress *progress,
                              atlas_model_weights *sum) {
    atlas_model_weights scratch;
    memset(&scratch, 0, sizeof scratch);
    scratch.dtype = ATLAS_DTYPE_I32; /* marks "no matrix seen yet" */
    size_t n = atlas_st_count(st);
    bool *used = calloc(n ? n : 1, sizeof *used);
    if (!used) return atlas_fail(ATLAS_ERR_NOMEM, "weights: out of memory");
    binder b = {.st = st, .w = &scratch, .plan = plan, .progress = progress, .count_only = true,
                .used = used, .quant = &cfg->quant, .bare = bare_names(st)};
    if (progress) progress->total = 0;
    atlas_status s = bind_all(&b, cfg);
    if (s == ATLAS_OK) s = check_unused(st, cfg, used);
    free(scratch.layers);
    free(used);
    if (sum) *sum = scratch, sum->layers = NULL;
    return s;
}

atlas_status atlas_weights_survey(const atlas_st *st, const atlas_config *cfg,
                                  const atlas_shard_plan *plan, atlas_weights_sum *out) {
    memset(out, 0, sizeof *out);
    atlas_load_progress progress;
    memset(&progress, 0, sizeof progress);
    atlas_model_weights sum;
    ATLAS_TRY(check_all(st, cfg, plan, &progress, &sum));
    out->n_params = sum.n_params;
    out->n_bytes = (size_t)progress.total;
    out->dtype = sum.dtype;
    memcpy(out->groups, sum.groups, sizeof out->groups);
    return ATLAS_OK;
}

void atlas_weights_formats(const atlas_wgroup_info *groups, const atlas_config *c, char *buf,
                           size_t cap) {
    static const char *const names[ATLAS_WG_COUNT] = {"embedding", "attention", "mlp",
                                                       "experts", "norms", "lm_head"};
    size_t n = 0;
    if (cap) buf[0] = '\0';
    for (int g = 0; g < ATLAS_WG_COUNT && n < cap; g++) {
        const atlas_wgroup_info *w = &groups[g];
        if (!w->format[0]) {
            if (g == ATLAS_WG_HEAD && c->tie_embeddings)
                n += (size_t)snprintf(buf + n, cap - n, "%slm_head tied", n ? "; " : "");
            continue;
        }
        n += (size_t)snprintf(buf + n, cap - n, "%s%s %s %.1f MiB", n ? "; " : "", names[g],
                              w->format, (double)w->bytes / 1048576.0);
    }
}

size_t atlas_weights_token_bytes(const atlas_wgroup_info *g, const atlas_config *c) {
    size_t head = c->tie_embeddings ? g[ATLAS_WG_EMBED].bytes : g[ATLAS_WG_HEAD].bytes;
    size_t row = c->vocab_size > 0 ? g[ATLAS_WG_EMBED].bytes / (size_t)c->vocab_size : 0;
    /* every MoE layer's experts are alike: a token reads k of each layer's E */
    size_t experts = c->n_experts > 0 ? (size_t)((double)g[ATLAS_WG_EXPERTS].bytes *
                                                 c->n_experts_used / c->n_experts) : 0;
    return g[ATLAS_WG_ATTN].bytes + g[ATLAS_WG_MLP].bytes + g[ATLAS_WG_NORM].bytes + head + row +
           experts;
}

atlas_status atlas_weights_load_shard(atlas_backend *be, const atlas_st *st,
                                      const atlas_config *cfg, const atlas_shard_plan *plan,
                                      atlas_load_progress *progress, atlas_model_weights *out) {
    memset(out, 0, sizeof *out);
    out->dtype = ATLAS_DTYPE_I32; /* marks "no matrix seen yet" */
    if (progress && !progress->fn) progress = NULL;
    ATLAS_TRY(check_all(st, cfg, plan, progress, NULL));
    /* a tensor is one source, a fused one split over ranks up to three (bind_fused) */
    binder b = {.be = be, .st = st, .w = out, .plan = plan,
                .cap_files = 3 * atlas_st_count(st), .progress = progress,
                .quant = &cfg->quant, .cap_qw = atlas_st_count(st), .bare = bare_names(st)};
    b.files = calloc(b.cap_files ? b.cap_files : 1, sizeof *b.files);
    b.qw = calloc(b.cap_qw ? b.cap_qw : 1, sizeof *b.qw);
    b.cap_oss = cfg->arch == ATLAS_ARCH_GPT_OSS ? cfg->n_layers : 0;
    b.oss = calloc(b.cap_oss ? (size_t)b.cap_oss : 1, sizeof *b.oss);
    /* a quantized checkpoint's codes are read and repacked here, not by the backend's
     * loaders: on the cores a load may take (atlas_cores_spare); without a pool (threads not
     * made) the same work runs on this thread, only slower */
    int threads = cfg->quant.method != ATLAS_QM_NONE ? atlas_cores_spare(REPACK_THREADS) : 1;
    if (threads > 1 && atlas_threadpool_create(threads, &b.pool) != ATLAS_OK) b.pool = NULL;
    atlas_status s = b.files && b.qw && b.oss ? bind_all(&b, cfg)
                                              : atlas_fail(ATLAS_ERR_NOMEM, "weights: out of "
                                                           "memory");
    if (s == ATLAS_OK && be->ops->weights_done) {
        s = be->ops->weights_done(be);
        if (s != ATLAS_OK) s = atlas_fail_wrap(s, "loading the weights");
    }
    if (s == ATLAS_OK) atlas_load_progress_finish(progress);
    /* freeing a weight waits for its queued reads: the readers' contexts go after */
    if (s != ATLAS_OK) atlas_weights_free(be, out);
    free(b.files);
    for (size_t i = 0; i < b.n_qw; i++) atlas_qweight_free(&b.qw[i]);
    free(b.qw);
    for (int i = 0; i < b.n_oss; i++) atlas_oss_experts_free(&b.oss[i]);
    free(b.oss);
    atlas_threadpool_free(b.pool);
    /* the repacked codes the backend copied and the formats' read buffers, freed between
     * weights that stay, held about a third of a 4-bit model's size in the heap */
    atlas_mem_trim();
    return s;
}

void atlas_weights_free(atlas_backend *be, atlas_model_weights *w) {
    if (!w) return;
    void (*wf)(atlas_backend *, atlas_weight *) = be ? be->ops->weight_free : NULL;
    if (wf) {
        for (int l = 0; l < w->n_layers; l++) {
            atlas_layer_weights *lw = &w->layers[l];
            atlas_weight *all[] = {lw->attn_norm, lw->qkv,      lw->qkv_bias, lw->q_norm,
                                   lw->k_norm,    lw->o,        lw->o_bias,   lw->mlp_norm,
                                   lw->gate_up,   lw->gate_up_bias, lw->down, lw->down_bias,
                                   lw->attn_out_norm, lw->mlp_out_norm, lw->router,
                                   lw->experts_gate_up, lw->experts_down, lw->router_bias,
                                   lw->experts_gate_up_bias, lw->experts_down_bias, lw->sinks};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) wf(be, all[i]);
        }
        if (w->lm_head != w->embed) wf(be, w->lm_head);
        wf(be, w->embed);
        wf(be, w->norm);
    }
    free(w->layers);
    for (int i = 0; i < w->n_owned; i++) free(w->owned[i]);
    free(w->owned);
    memset(w, 0, sizeof *w);
}

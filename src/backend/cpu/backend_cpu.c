/* backend/cpu/backend_cpu.c — the CPU implementation of the op table (backend/backend.h):
 * memory, weights, the paged KV cache, batch staging and the element-wise ops. Matmul and
 * attention live in cpu_matmul.c and cpu_attention.c. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend/cpu/cpu.h"
#include "core/error.h"

/* ---- memory ------------------------------------------------------------------------------ */

enum { CPU_HUGE = 2 << 20, CPU_PAGE = 4096 };

static char *map_huge(size_t len);

/* Activations of 2 MiB or more lie in huge pages: a fresh process's first request would
 * otherwise fault them in 4 KiB at a time (on this kind of VM ~15 us a page, in the
 * request's time), and the matmuls that stream them miss the TLB less. What is never
 * touched stays unbacked, as before. They are mappings of their own, not heap memory: advice
 * on the heap would outlive the buffer, and khugepaged would fill the free arena around it
 * with huge pages that no free or malloc_trim gives back. */
static atlas_status cpu_alloc(atlas_backend *be, size_t bytes, void **out) {
    cpu_backend *cb = (cpu_backend *)be;
    size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded < CPU_HUGE) {
        *out = aligned_alloc(64, rounded ? rounded : 64);
        if (!*out) return atlas_fail(ATLAS_ERR_NOMEM, "cpu backend: allocating %zu bytes", bytes);
        return ATLAS_OK;
    }
    rounded = (rounded + CPU_HUGE - 1) / CPU_HUGE * CPU_HUGE;
    *out = NULL;
    if (cb->n_maps == cb->cap_maps) {
        int cap = cb->cap_maps ? 2 * cb->cap_maps : 8;
        cpu_mapping *m = realloc(cb->maps, (size_t)cap * sizeof *m);
        if (!m) return atlas_fail(ATLAS_ERR_NOMEM, "cpu backend: a list of %d buffers", cap);
        cb->maps = m, cb->cap_maps = cap;
    }
    char *p = map_huge(rounded);
    if (!p) return atlas_fail(ATLAS_ERR_NOMEM, "cpu backend: mapping %zu bytes: %s", bytes,
                              strerror(errno));
    cb->maps[cb->n_maps++] = (cpu_mapping){p, rounded};
    *out = p;
    return ATLAS_OK;
}

/* len bytes (a whole number of pages) of zeroed memory at a 2 MiB boundary, advised as
 * transparent huge pages; NULL when the mapping fails. */
static char *map_huge(size_t len) {
    char *raw = mmap(NULL, len + CPU_HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
    if (raw == MAP_FAILED) return NULL;
    char *p = (char *)(((uintptr_t)raw + CPU_HUGE - 1) & ~(uintptr_t)(CPU_HUGE - 1));
    if (p > raw) munmap(raw, (size_t)(p - raw));
    munmap(p + len, (size_t)(raw + CPU_HUGE - p));
#ifdef MADV_HUGEPAGE
    (void)madvise(p, len, MADV_HUGEPAGE); /* advice: without THP, 4 KiB pages as before */
#endif
    return p;
}

static void cpu_free(atlas_backend *be, void *p) {
    cpu_backend *cb = (cpu_backend *)be;
    for (int i = 0; p && i < cb->n_maps; i++)
        if (cb->maps[i].p == p) {
            munmap(p, cb->maps[i].len);
            cb->maps[i] = cb->maps[--cb->n_maps];
            return;
        }
    free(p);
}

/* ---- weights ----------------------------------------------------------------------------- */

static atlas_status check_src(const atlas_weight_src *v, const atlas_weight_src *first) {
    if ((v->quant != NULL) != (first->quant != NULL) ||
        (v->quant && v->quant->format != first->quant->format))
        return atlas_fail(ATLAS_ERR_INTERNAL, "%s: format differs from %s's in one fused weight",
                          v->name, first->name);
    if (v->quant) {
        if (v->n_dims != 2 || v->shape[1] != first->shape[1] || (!v->data && v->nbytes))
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: a quantized weight is a matrix with the "
                              "columns of %s", v->name, first->name);
        return ATLAS_OK; /* sizes: cpu_quant_load */
    }
    if (v->dtype != ATLAS_DTYPE_F32 && v->dtype != ATLAS_DTYPE_F16 && v->dtype != ATLAS_DTYPE_BF16)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: dtype %s (want BF16, F16 or F32)", v->name,
                          atlas_dtype_name(v->dtype));
    if (v->n_dims != 1 && v->n_dims != 2)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: %d dimensions (want 1 or 2)", v->name,
                          v->n_dims);
    if (v->n_dims != first->n_dims || (v->n_dims == 2 && v->shape[1] != first->shape[1]))
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: shape does not concatenate with %s", v->name,
                          first->name);
    int64_t elems = 1;
    for (int d = 0; d < v->n_dims; d++) elems *= v->shape[d];
    if (v->nbytes != (size_t)elems * atlas_dtype_size(v->dtype) || (!v->data && v->nbytes))
        return atlas_fail(ATLAS_ERR_INVALID, "%s: %zu bytes at %p for %lld elements of %s",
                          v->name, v->nbytes, v->data, (long long)elems,
                          atlas_dtype_name(v->dtype));
    return ATLAS_OK;
}

/* Memory for a weight's bytes.  One of 2 MiB or more goes into a 2 MiB-aligned mapping
 * advised as transparent huge pages.  The kernel fills it (pread), and a page the kernel
 * filled can cost the process a fault of its own at the first touch from user space: under
 * a hypervisor that shadows page tables several microseconds a 4 KiB page, in no fault
 * count, which a fresh process's first request paid inside its matmuls (a 190 MiB model's
 * first prefill took twice the CPU time of the next for the same instructions).  With huge
 * pages that is one a 2 MiB, the read into them is quicker too, and the matmuls miss the
 * TLB less.  The tail past the last whole 2 MiB, and smaller weights, keep 4 KiB pages,
 * touched here from user space before the read fills them: the load pays their first
 * touch instead of the first request. */
static void touch_pages(char *p, size_t from, size_t to) {
    for (size_t o = from; o < to; o += CPU_PAGE) ((volatile char *)p)[o] = 0;
}

static void *weight_bytes(size_t bytes, size_t *mapped) {
    *mapped = 0;
    if (bytes < CPU_HUGE) {
        char *p = malloc(bytes ? bytes : 1);
        if (p) touch_pages(p, 0, bytes);
        return p;
    }
    size_t len = (bytes + CPU_PAGE - 1) / CPU_PAGE * CPU_PAGE;
    char *p = map_huge(len);
    if (!p) return NULL;
    touch_pages(p, len / CPU_HUGE * CPU_HUGE, len);
    *mapped = len;
    return p;
}

static void weight_bytes_free(void *p, size_t mapped) {
    if (mapped) munmap(p, mapped);
    else free(p);
}

static void cpu_weight_free(atlas_backend *be, atlas_weight *w) {
    if (!w) return;
    cpu_read_cancel((cpu_backend *)be, w);
    for (int i = 0; i < w->n_parts; i++) {
        weight_bytes_free(w->parts[i].copy, w->parts[i].mapped);
        free(w->parts[i].owned);
    }
    free(w->parts);
    free(w->vec);
    free(w);
}

/* Copies each source into memory the weight owns, through the source's reader when it has
 * one (the model's pread). Reading the checkpoint's mapping in place would tie the served
 * model to files another process may truncate or rewrite (a re-download, a sync), and a
 * read past a truncated mapping's end is SIGBUS: the whole server. A matrix's reads are
 * queued for weights_done, which runs them on every thread (cpu_read.c); a vector is read
 * here, as it is converted to fp32 at once. */
static atlas_status cpu_weight_load(atlas_backend *be, const atlas_weight_src *const *srcs,
                                    int n, atlas_weight **out) {
    *out = NULL;
    if (n < 1 || n > CPU_MAX_PARTS)
        return atlas_fail(ATLAS_ERR_INTERNAL, "cpu weight_load: %d tensors (1..%d)", n,
                          CPU_MAX_PARTS);
    for (int i = 0; i < n; i++) ATLAS_TRY(check_src(srcs[i], srcs[0]));
    atlas_weight *w = calloc(1, sizeof *w);
    if (!w) return atlas_fail(ATLAS_ERR_NOMEM, "%s: out of memory", srcs[0]->name);
    w->n_dims = srcs[0]->n_dims;
    w->parts = calloc((size_t)n, sizeof *w->parts);
    if (!w->parts) {
        free(w);
        return atlas_fail(ATLAS_ERR_NOMEM, "%s: out of memory", srcs[0]->name);
    }
    w->n_parts = n;
    int64_t rows = 0;
    for (int i = 0; i < n; i++) {
        const atlas_weight_src *v = srcs[i];
        int64_t r = v->shape[0];
        size_t mapped = 0;
        void *copy = weight_bytes(v->nbytes, &mapped);
        w->parts[i] = (cpu_part){.copy = copy, .dtype = v->dtype, .row0 = rows, .rows = r,
                                 .mapped = mapped};
        rows += r;
        atlas_status st = w->parts[i].copy ? ATLAS_OK
                                           : atlas_fail(ATLAS_ERR_NOMEM, "out of memory");
        if (st == ATLAS_OK && v->quant) st = cpu_quant_load(v, &w->parts[i]);
        if (st == ATLAS_OK && v->read && w->n_dims == 2)
            st = cpu_read_queue((cpu_backend *)be, w, v, w->parts[i].copy);
        else if (st == ATLAS_OK && v->read)
            st = v->read(v->ctx, w->parts[i].copy, 0, v->nbytes);
        else if (st == ATLAS_OK) memcpy(w->parts[i].copy, v->data, v->nbytes);
        if (st != ATLAS_OK) {
            cpu_weight_free(be, w);
            return atlas_fail_wrap(st, "reading weight %s", v->name);
        }
        w->parts[i].data = w->parts[i].copy;
    }
    if (w->n_dims == 2) {
        w->rows = rows;
        w->cols = srcs[0]->shape[1];
        *out = w;
        return ATLAS_OK;
    }
    /* 1-D: concatenated into one fp32 vector, read as a single row of `rows` columns. */
    w->rows = 1;
    w->cols = rows;
    w->vec = malloc((size_t)(rows ? rows : 1) * sizeof(float));
    if (!w->vec) {
        cpu_weight_free(be, w);
        return atlas_fail(ATLAS_ERR_NOMEM, "%s: out of memory", srcs[0]->name);
    }
    atlas_weight tmp = *w;
    cpu_part one;
    for (int i = 0; i < n; i++) {
        tmp.cols = srcs[i]->shape[0];
        tmp.n_parts = 1;
        tmp.parts = &one;
        one = (cpu_part){.data = w->parts[i].data, .dtype = srcs[i]->dtype, .rows = 1};
        cpu_weight_row(&tmp, 0, w->vec + w->parts[i].row0);
        for (int64_t j = 0; srcs[i]->offset != 0 && j < tmp.cols; j++)
            w->vec[w->parts[i].row0 + j] += srcs[i]->offset;
    }
    *out = w;
    return ATLAS_OK;
}

/* ---- KV cache ---------------------------------------------------------------------------- */

/* The cache is mapped, not calloc'd: its pages are zero on first touch, so a pool sized for
 * every sequence costs nothing until used, and unmapping returns it at once. calloc put a
 * pool under glibc's (dynamic, up to 32 MiB) mmap threshold on the heap and zeroed all of it
 * at every load: +100 ms to each swap back to tiny-llama3 with --parallel 64. In huge pages
 * (the layout keeps a sequence's blocks together, cpu.h): in 4 KiB pages a fresh process's
 * first prefill faulted ~7,000 of them at 128 tokens, and the attention, whose keys lie 4 KiB
 * apart, missed the TLB at every key. */
static float *kv_map(size_t bytes) {
    return (float *)map_huge((bytes + CPU_PAGE - 1) / CPU_PAGE * CPU_PAGE);
}

static void cpu_kv_free(atlas_backend *be, atlas_kv *kv) {
    if (!kv) return;
    if (kv->k) munmap(kv->k, kv->bytes);
    if (kv->v) munmap(kv->v, kv->bytes);
    free(kv->scales);
    free(kv);
}

static atlas_status cpu_kv_create(atlas_backend *be, int n_blocks, int block_size,
                                  atlas_kv **out) {
    const atlas_backend_geom *g = &be->geom;
    *out = NULL;
    if (n_blocks < 1 || block_size < 1)
        return atlas_fail(ATLAS_ERR_INVALID, "kv cache: %d blocks of %d tokens", n_blocks,
                          block_size);
    atlas_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return atlas_fail(ATLAS_ERR_NOMEM, "kv cache: out of memory");
    kv->n_blocks = n_blocks;
    kv->block_size = block_size;
    kv->n_layers = g->n_layers;
    if (be->kv_size != 1 && be->kv_size != sizeof(uint16_t) && be->kv_size != sizeof(float)) {
        free(kv);
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "kv cache: %zu-byte elements (the CPU has "
                          "fp32, bf16 and FP8 e4m3)", be->kv_size);
    }
    kv->bf16 = be->kv_size == sizeof(uint16_t); /* set_activations or the model chose it */
    kv->fp8 = be->kv_size == 1;
    if (kv->fp8) {
        if (!(kv->scales = malloc((size_t)2 * g->n_layers * sizeof *kv->scales))) {
            free(kv);
            return atlas_fail(ATLAS_ERR_NOMEM, "kv cache: out of memory");
        }
        for (int i = 0; i < 2 * g->n_layers; i++)
            kv->scales[i] = g->kv_scales ? g->kv_scales[i] : 1.0f;
    }
    kv->block_floats = (size_t)block_size * g->n_kv_heads * g->head_dim;
    kv->stride = kv->block_floats * g->n_layers;
    size_t bytes = kv->stride * n_blocks * cpu_kv_es(kv);
    kv->bytes = bytes;
    kv->k = kv_map(bytes);
    kv->v = kv_map(bytes);
    if (!kv->k || !kv->v) {
        cpu_kv_free(be, kv);
        return atlas_fail(ATLAS_ERR_NOMEM, "kv cache: allocating 2 x %zu bytes", bytes);
    }
    *out = kv;
    return ATLAS_OK;
}

/* A block's image is its K (every layer's share, as the cache lays it out: one run) then its
 * V, so each block is two copies. */
static atlas_status cpu_kv_save(atlas_backend *be, const atlas_kv *kv, const int32_t *ids,
                                int n, void *const *host) {
    (void)be;
    size_t b = kv->bytes / (size_t)kv->n_blocks;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= kv->n_blocks)
            return atlas_fail(ATLAS_ERR_RANGE, "kv save: block %d of %d", ids[i], kv->n_blocks);
        memcpy(host[i], (const char *)kv->k + (size_t)ids[i] * b, b);
        memcpy((char *)host[i] + b, (const char *)kv->v + (size_t)ids[i] * b, b);
    }
    return ATLAS_OK;
}

static atlas_status cpu_kv_restore(atlas_backend *be, atlas_kv *kv, const int32_t *ids, int n,
                                   const void *const *host) {
    (void)be;
    size_t b = kv->bytes / (size_t)kv->n_blocks;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= kv->n_blocks)
            return atlas_fail(ATLAS_ERR_RANGE, "kv restore: block %d of %d", ids[i],
                              kv->n_blocks);
        memcpy((char *)kv->k + (size_t)ids[i] * b, host[i], b);
        memcpy((char *)kv->v + (size_t)ids[i] * b, (const char *)host[i] + b, b);
    }
    return ATLAS_OK;
}

/* ---- batch staging ----------------------------------------------------------------------- */

static atlas_status grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return ATLAS_OK;
    void *q = realloc(*p, (size_t)need * elem);
    if (!q) return atlas_fail(ATLAS_ERR_NOMEM, "cpu backend: staging a batch of %d", need);
    *p = q;
    *cap = need;
    return ATLAS_OK;
}

static atlas_status grow_tokens(cpu_backend *cb, int n) {
    if (n <= cb->cap_tokens) return ATLAS_OK;
    int half = cb->base.geom.head_dim / 2;
    void **arrays[] = {(void **)&cb->tokens, (void **)&cb->positions, (void **)&cb->slots,
                       (void **)&cb->tok_seq};
    for (size_t i = 0; i < 4; i++) {
        void *q = realloc(*arrays[i], (size_t)n * sizeof(int32_t));
        if (!q) return atlas_fail(ATLAS_ERR_NOMEM, "cpu backend: staging %d tokens", n);
        *arrays[i] = q;
    }
    size_t table = (size_t)cb->n_sets * n * half * sizeof(float);
    float *c = realloc(cb->rope_cos, table);
    if (c) cb->rope_cos = c;
    float *s = realloc(cb->rope_sin, table);
    if (s) cb->rope_sin = s;
    if (!c || !s) return atlas_fail(ATLAS_ERR_NOMEM, "cpu backend: staging %d tokens", n);
    cb->cap_tokens = n;
    return ATLAS_OK;
}

/* cos/sin of every token's position, for each RoPE set; the angle in fp32 as transformers
 * computes it. longrope: the long frequencies for a sequence whose context is past
 * rope_long_after (set 0's). */
static void stage_rope(cpu_backend *cb) {
    const atlas_backend_geom *g = &cb->base.geom;
    int half = g->head_dim / 2, rot = g->rope_dim / 2;
    for (int set = 0; set < cb->n_sets; set++) {
        size_t base = (size_t)set * cb->cap_tokens * half;
        float f = (float)(set ? g->rope_sets[set - 1].attn_factor : g->rope_attn_factor);
        for (int t = 0; t < cb->n_tokens; t++) {
            const double *inv = cb->inv_freq + (size_t)(set ? set + 1 : 0) * half;
            if (!set && cb->inv_freq_long && cb->seq_rope[cb->tok_seq[t]] > g->rope_long_after)
                inv = cb->inv_freq_long;
            float *c = cb->rope_cos + base + (size_t)t * half, *s = cb->rope_sin + base + (size_t)t * half;
            for (int i = 0; i < rot; i++) {
                float angle = (float)inv[i] * (float)cb->positions[t];
                c[i] = (float)cos((double)angle) * f;
                s[i] = (float)sin((double)angle) * f;
            }
        }
    }
}

/* memcpy with NULL is undefined even for 0 bytes (a batch may want no logits). */
static void copy_i32(int32_t *dst, const int32_t *src, size_t n) {
    if (n) memcpy(dst, src, n * sizeof(int32_t));
}

static atlas_status cpu_weights_done(atlas_backend *be) {
    return cpu_read_run((cpu_backend *)be);
}

static atlas_status cpu_begin_batch(atlas_backend *be, const atlas_batch *b, int block_size) {
    cpu_backend *cb = (cpu_backend *)be;
    ATLAS_TRY(cpu_read_run(cb)); /* weights loaded after weights_done (backend.h) */
    ATLAS_TRY(grow_tokens(cb, b->n_tokens));
    int cap_seqs = cb->cap_seqs;
    ATLAS_TRY(grow((void **)&cb->seq_rope, &cap_seqs, b->n_seqs, sizeof(int32_t)));
    ATLAS_TRY(grow((void **)&cb->seq_ctx, &cb->cap_seqs, b->n_seqs, sizeof(int32_t)));
    ATLAS_TRY(grow((void **)&cb->logit_rows, &cb->cap_logits, b->n_logits, sizeof(int32_t)));
    size_t table = (size_t)b->n_seqs * b->max_blocks;
    if (table > cb->cap_table) {
        int32_t *q = realloc(cb->block_table, table * sizeof(int32_t));
        if (!q) return atlas_fail(ATLAS_ERR_NOMEM, "cpu backend: staging a block table");
        cb->block_table = q;
        cb->cap_table = table;
    }
    cb->n_tokens = b->n_tokens;
    cb->n_seqs = b->n_seqs;
    cb->n_logits = b->n_logits;
    cb->block_size = block_size;
    cb->max_blocks = b->max_blocks;
    copy_i32(cb->tokens, b->tokens, (size_t)b->n_tokens);
    copy_i32(cb->positions, b->positions, (size_t)b->n_tokens);
    copy_i32(cb->seq_ctx, b->seq_ctx, (size_t)b->n_seqs);
    for (int s = 0; s < b->n_seqs; s++)
        cb->seq_rope[s] = b->seq_rope_len && b->seq_rope_len[s] > b->seq_ctx[s]
                              ? b->seq_rope_len[s] : b->seq_ctx[s];
    copy_i32(cb->logit_rows, b->logit_rows, (size_t)b->n_logits);
    copy_i32(cb->block_table, b->block_table, table);
    for (int s = 0; s < b->n_seqs; s++)
        for (int t = b->seq_start[s]; t < b->seq_start[s + 1]; t++) {
            int p = b->positions[t];
            cb->tok_seq[t] = s;
            cb->slots[t] = cb->block_table[(size_t)s * b->max_blocks + p / block_size] *
                               block_size + p % block_size;
        }
    stage_rope(cb);
    return ATLAS_OK;
}

/* ---- element-wise ops -------------------------------------------------------------------- */

static atlas_status cpu_embed(atlas_backend *be, void *x, const atlas_weight *table) {
    cpu_backend *cb = (cpu_backend *)be;
    float scale = be->geom.embed_scale;
    for (int t = 0; t < cb->n_tokens; t++) {
        float *row = (float *)x + (size_t)t * table->cols;
        cpu_weight_row(table, cb->tokens[t], row);
        for (int64_t i = 0; scale != 0 && i < table->cols; i++) row[i] *= scale;
    }
    return ATLAS_OK;
}

static void rmsnorm_row(float *out, const float *x, const float *w, int d, float eps) {
    double ss = 0.0;
    for (int i = 0; i < d; i++) ss += (double)x[i] * x[i];
    float r = 1.0f / sqrtf((float)(ss / d) + eps);
    for (int i = 0; i < d; i++) out[i] = w[i] * (x[i] * r);
}

typedef struct norm_job {
    float *out, *resid;
    const float *x, *delta, *w;
    int d;
    float eps;
} norm_job;

static void norm_range(void *ctx, int64_t begin, int64_t end, int thread) {
    norm_job *j = ctx;
    for (int64_t r = begin; r < end; r++) {
        const float *x = j->x + r * j->d;
        if (j->resid) {
            float *res = j->resid + r * j->d;
            const float *dl = j->delta + r * j->d;
            for (int i = 0; i < j->d; i++) res[i] += dl[i];
            x = res;
        }
        rmsnorm_row(j->out + r * j->d, x, j->w, j->d, j->eps);
    }
}

static atlas_status cpu_rmsnorm(atlas_backend *be, void *out, const void *x,
                                const atlas_weight *w, int rows, int d) {
    cpu_backend *cb = (cpu_backend *)be;
    norm_job j = {out, NULL, x, NULL, w->vec, d, be->geom.rms_eps};
    atlas_threadpool_for(cb->pool, rows, 8, norm_range, &j);
    return ATLAS_OK;
}

static atlas_status cpu_add_rmsnorm(atlas_backend *be, void *resid, const void *delta,
                                    void *out, const atlas_weight *w, int n, int d) {
    cpu_backend *cb = (cpu_backend *)be;
    norm_job j = {out, resid, resid, delta, w->vec, d, be->geom.rms_eps};
    atlas_threadpool_for(cb->pool, n, 8, norm_range, &j);
    return ATLAS_OK;
}

typedef struct add_job {
    float *resid;
    const float *delta;
    int d;
} add_job;

static void add_range(void *ctx, int64_t begin, int64_t end, int thread) {
    add_job *j = ctx;
    for (int64_t r = begin; r < end; r++) {
        float *res = j->resid + r * j->d;
        const float *dl = j->delta + r * j->d;
        for (int i = 0; i < j->d; i++) res[i] += dl[i];
    }
}

/* The add of add_rmsnorm alone: add then rmsnorm gives add_rmsnorm's bits (expand.c). */
static atlas_status cpu_add(atlas_backend *be, void *resid, const void *delta, int n, int d) {
    cpu_backend *cb = (cpu_backend *)be;
    add_job j = {resid, delta, d};
    atlas_threadpool_for(cb->pool, n, 8, add_range, &j);
    return ATLAS_OK;
}

static atlas_status cpu_qk_norm(atlas_backend *be, void *qkv, const atlas_weight *q_norm,
                                const atlas_weight *k_norm, int n) {
    const atlas_backend_geom *g = &be->geom;
    int H = g->n_heads, K = g->n_kv_heads, hd = g->head_dim;
    for (int t = 0; t < n; t++) {
        float *row = (float *)qkv + (size_t)t * (H + 2 * K) * hd;
        for (int h = 0; h < H + K; h++)
            rmsnorm_row(row + h * hd, row + h * hd, h < H ? q_norm->vec : k_norm->vec, hd,
                        g->rms_eps);
    }
    return ATLAS_OK;
}

/* Rotate-half over the first rope_dim dims of each head (partial rotary: the rest stay),
 * with the layer's RoPE set. */
static atlas_status cpu_rope(atlas_backend *be, void *qkv, int n, int layer) {
    cpu_backend *cb = (cpu_backend *)be;
    const atlas_backend_geom *g = &be->geom;
    int H = g->n_heads, K = g->n_kv_heads, hd = g->head_dim, half = g->rope_dim / 2;
    int stride = hd / 2; /* of the cos/sin rows */
    if (layer < 0 || layer >= g->n_layers)
        return atlas_fail(ATLAS_ERR_INTERNAL, "cpu rope: layer %d of %d", layer, g->n_layers);
    size_t base = (size_t)(cb->layer_rope_set ? cb->layer_rope_set[layer] : 0) *
                  cb->cap_tokens * stride;
    for (int t = 0; t < n; t++) {
        float *row = (float *)qkv + (size_t)t * (H + 2 * K) * hd;
        const float *c = cb->rope_cos + base + (size_t)t * stride;
        const float *s = cb->rope_sin + base + (size_t)t * stride;
        for (int h = 0; h < H + K; h++) {
            float *x = row + h * hd;
            for (int i = 0; i < half; i++) {
                float x1 = x[i], x2 = x[i + half];
                x[i] = x1 * c[i] - x2 * s[i];
                x[i + half] = x2 * c[i] + x1 * s[i];
            }
        }
    }
    return ATLAS_OK;
}

static atlas_status cpu_kv_store(atlas_backend *be, const void *qkv, atlas_kv *kv, int layer) {
    cpu_backend *cb = (cpu_backend *)be;
    const atlas_backend_geom *g = &be->geom;
    int H = g->n_heads, K = g->n_kv_heads, hd = g->head_dim;
    void *kl = cpu_kv_layer(kv, kv->k, layer), *vl = cpu_kv_layer(kv, kv->v, layer);
    for (int t = 0; t < cb->n_tokens; t++) {
        const float *row = (const float *)qkv + (size_t)t * (H + 2 * K) * hd;
        for (int h = 0; h < K; h++) {
            size_t at = cpu_kv_at(kv, (size_t)cb->slots[t], (size_t)h, (size_t)hd);
            const float *ks = row + (size_t)(H + h) * hd, *vs = row + (size_t)(H + K + h) * hd;
            if (kv->fp8) { /* as vLLM: x / scale in fp32, then the nearest code */
                uint8_t *kd = (uint8_t *)kl + at, *vd = (uint8_t *)vl + at;
                float ks_ = kv->scales[2 * layer], vs_ = kv->scales[2 * layer + 1];
                for (int d = 0; d < hd; d++) {
                    kd[d] = atlas_f32_to_e4m3(ks[d] / ks_);
                    vd[d] = atlas_f32_to_e4m3(vs[d] / vs_);
                }
            } else if (kv->bf16) {
                uint16_t *kd = (uint16_t *)kl + at, *vd = (uint16_t *)vl + at;
                for (int d = 0; d < hd; d++) {
                    kd[d] = atlas_f32_to_bf16(ks[d]);
                    vd[d] = atlas_f32_to_bf16(vs[d]);
                }
            } else {
                memcpy((float *)kl + at, ks, (size_t)hd * sizeof(float));
                memcpy((float *)vl + at, vs, (size_t)hd * sizeof(float));
            }
        }
    }
    return ATLAS_OK;
}

static atlas_status cpu_gather_rows(atlas_backend *be, void *out, const void *x, int d) {
    cpu_backend *cb = (cpu_backend *)be;
    for (int i = 0; i < cb->n_logits; i++)
        memcpy((float *)out + (size_t)i * d, (const float *)x + (size_t)cb->logit_rows[i] * d,
               (size_t)d * sizeof(float));
    return ATLAS_OK;
}

static atlas_status cpu_download(atlas_backend *be, float *host, const void *x, size_t count) {
    memcpy(host, x, count * sizeof(float));
    return ATLAS_OK;
}

static atlas_status cpu_argmax(atlas_backend *be, int32_t *ids, const void *logits, int rows,
                               int vocab) {
    for (int r = 0; r < rows; r++) {
        const float *l = (const float *)logits + (size_t)r * vocab;
        int best = 0;
        for (int i = 1; i < vocab; i++)
            if (l[i] > l[best]) best = i;
        ids[r] = best;
    }
    return ATLAS_OK;
}

static atlas_status cpu_sync(atlas_backend *be) { return ATLAS_OK; }

/* Host memory and threads: nothing here can fail to be freed. */
static atlas_status cpu_destroy(atlas_backend *be) {
    cpu_backend *cb = (cpu_backend *)be;
    if (!cb) return ATLAS_OK;
    atlas_threadpool_free(cb->pool);
    for (int i = 0; i < cb->n_maps; i++) munmap(cb->maps[i].p, cb->maps[i].len);
    free(cb->maps);
    free(cb->scratch);
    free(cb->inv_freq);
    free(cb->layer_window);
    free(cb->layer_rope_set);
    free(cb->kv_scales);
    free(cb->tokens);
    free(cb->positions);
    free(cb->slots);
    free(cb->tok_seq);
    free(cb->seq_ctx);
    free(cb->logit_rows);
    free(cb->seq_rope);
    free(cb->rope_cos);
    free(cb->rope_sin);
    free(cb->block_table);
    free(cb->moe_buf);
    free(cb->xpack);
    free(cb->xround);
    free(cb->moe_list);
    free(cb->attn_blocks);
    free(cb->attn_buf);
    free(cb->reads);
    free(cb);
    return ATLAS_OK;
}

static const atlas_backend_ops cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .weight_load = cpu_weight_load,
    .weight_free = cpu_weight_free,
    .weights_done = cpu_weights_done,
    .kv_create = cpu_kv_create,
    .kv_save = cpu_kv_save,
    .kv_restore = cpu_kv_restore,
    .kv_free = cpu_kv_free,
    .begin_batch = cpu_begin_batch,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .add_rmsnorm = cpu_add_rmsnorm,
    .add = cpu_add, /* the fused ops are NULL: expand.c runs them as plain ops */
    .matmul = cpu_matmul,
    .qk_norm = cpu_qk_norm,
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .swiglu = cpu_swiglu,
    .glu = cpu_glu,
    .moe_route = cpu_moe_route,
    .moe_experts = cpu_moe_experts,
    .gather_rows = cpu_gather_rows,
    .download = cpu_download,
    .argmax = cpu_argmax,
    .sample = cpu_sample,
    .sync = cpu_sync,
    .destroy = cpu_destroy,
};

/* The geometry's per-layer arrays, copied (the caller's are not kept). */
static atlas_status copy_layers(cpu_backend *cb, const atlas_backend_geom *g) {
    size_t n = (size_t)g->n_layers;
    if (g->layer_window) {
        if (!(cb->layer_window = malloc(n * sizeof *cb->layer_window))) return ATLAS_ERR_NOMEM;
        memcpy(cb->layer_window, g->layer_window, n * sizeof *cb->layer_window);
    }
    if (g->layer_rope_set) {
        if (!(cb->layer_rope_set = malloc(n))) return ATLAS_ERR_NOMEM;
        memcpy(cb->layer_rope_set, g->layer_rope_set, n);
    }
    if (g->kv_scales) {
        if (!(cb->kv_scales = malloc(2 * n * sizeof *cb->kv_scales))) return ATLAS_ERR_NOMEM;
        memcpy(cb->kv_scales, g->kv_scales, 2 * n * sizeof *cb->kv_scales);
    }
    cb->base.geom.layer_window = cb->layer_window;
    cb->base.geom.layer_rope_set = cb->layer_rope_set;
    cb->base.geom.kv_scales = cb->kv_scales;
    return ATLAS_OK;
}

atlas_status atlas_backend_cpu_create(const atlas_backend_geom *geom, int n_threads,
                                      atlas_backend **out) {
    *out = NULL;
    const atlas_backend_geom *g = geom;
    if (g->hidden < 1 || g->n_heads < 1 || g->n_kv_heads < 1 || g->n_heads % g->n_kv_heads ||
        g->head_dim < 2 || g->head_dim % 2 || g->intermediate < 1 || g->vocab_size < 1 ||
        g->n_layers < 1 || g->rope_dim < 0 || g->rope_dim > g->head_dim || g->rope_dim % 2 ||
        g->n_rope_sets < 0 || g->n_rope_sets >= ATLAS_MAX_ROPE_SETS ||
        (g->n_experts && (g->n_experts < 1 || g->n_experts_used < 1 ||
                          g->n_experts_used > g->n_experts || g->expert_ffn < 1)))
        return atlas_fail(ATLAS_ERR_INVALID, "cpu backend: bad geometry (hidden %d, heads %d/%d, "
                          "head_dim %d (rope_dim %d), intermediate %d, vocab %d, layers %d, "
                          "experts %d (top %d, ffn %d))", g->hidden,
                          g->n_heads, g->n_kv_heads, g->head_dim, g->rope_dim, g->intermediate,
                          g->vocab_size, g->n_layers, g->n_experts, g->n_experts_used,
                          g->expert_ffn);
    for (int l = 0; g->layer_rope_set && l < g->n_layers; l++)
        if (g->layer_rope_set[l] > g->n_rope_sets)
            return atlas_fail(ATLAS_ERR_INVALID, "cpu backend: layer %d rotates with RoPE set "
                              "%d of %d", l, g->layer_rope_set[l], 1 + g->n_rope_sets);
    cpu_backend *cb = calloc(1, sizeof *cb);
    if (!cb) return atlas_fail(ATLAS_ERR_NOMEM, "cpu backend: out of memory");
    cb->base.ops = &cpu_ops;
    cb->base.geom = *g;
    cb->base.act_size = sizeof(float);
    cb->base.act_in_qkv = 1;
    atlas_status st = atlas_threadpool_create(n_threads, &cb->pool);
    if (st != ATLAS_OK) {
        cpu_destroy(&cb->base);
        return st;
    }
    cb->n_threads = atlas_threadpool_size(cb->pool);
    cb->bf16 = cpu_bf16_best();
    cb->attn = cpu_attn_best();
    cb->attn_rows = 64; /* a tile's q, output and key block stay in L2 at head_dim 128 */
    size_t k = (size_t)g->hidden;
    if ((size_t)g->n_heads * g->head_dim > k) k = (size_t)g->n_heads * g->head_dim;
    if ((size_t)g->intermediate > k) k = (size_t)g->intermediate;
    if ((size_t)g->expert_ffn > k) k = (size_t)g->expert_ffn;
    cb->scratch_floats = (CPU_ROWS * k + 15) / 16 * 16;
    cb->scratch = malloc(cb->scratch_floats * cb->n_threads * sizeof(float));
    cb->n_sets = 1 + g->n_rope_sets;
    /* set 0, longrope's long set, then the further sets */
    cb->inv_freq = malloc((size_t)(cb->n_sets + 1) * g->head_dim / 2 * sizeof(double));
    if (!cb->scratch || !cb->inv_freq || copy_layers(cb, g) != ATLAS_OK) {
        cpu_destroy(&cb->base);
        return atlas_fail(ATLAS_ERR_NOMEM, "cpu backend: out of memory");
    }
    int half = g->head_dim / 2;
    if (!g->rope_dim) cb->base.geom.rope_dim = g->head_dim;
    for (int i = 0; i < cb->base.geom.rope_dim / 2; i++) {
        cb->inv_freq[i] = g->rope_inv_freq[i];
        if (g->rope_inv_freq_long) cb->inv_freq[half + i] = g->rope_inv_freq_long[i];
        for (int s = 1; s < cb->n_sets; s++)
            cb->inv_freq[(size_t)(s + 1) * half + i] = g->rope_sets[s - 1].inv_freq[i];
    }
    cb->base.geom.rope_inv_freq = cb->inv_freq;
    cb->inv_freq_long = g->rope_inv_freq_long ? cb->inv_freq + half : NULL;
    cb->base.geom.rope_inv_freq_long = cb->inv_freq_long;
    for (int s = 1; s < cb->n_sets; s++)
        cb->base.geom.rope_sets[s - 1].inv_freq = cb->inv_freq + (size_t)(s + 1) * half;
    cb->base.copies_at_load = 1;
    cb->base.kv_size = sizeof(float);
    *out = &cb->base;
    return ATLAS_OK;
}

int atlas_backend_cpu_bf16_dot(void) { return cpu_bf16_kind_supported(CPU_BF16_DOT); }
int atlas_backend_cpu_int8_dot(void) {
    cpu_q8_kind k = cpu_q8_best();
    return k != CPU_Q8_PLAIN && k != CPU_Q8_OFF;
}

atlas_status atlas_backend_cpu_set_activations(atlas_backend *be, int act) {
    if (strcmp(be->ops->name, "cpu"))
        return atlas_fail(ATLAS_ERR_INTERNAL, "cpu activations: the backend is %s", be->ops->name);
    if (act < 0 || act > 2)
        return atlas_fail(ATLAS_ERR_INVALID, "cpu activations: mode %d", act);
    cpu_backend *cb = (cpu_backend *)be;
    int bf16 = act != 0, dot = cpu_bf16_kind_supported(CPU_BF16_DOT);
    /* INT8 rounds a bf16 weight's activations only for the bf16 dot products: without them
     * the fp32 kernels run either way, and the rounding would cost accuracy for nothing */
    cb->round_x = act == 1 || (act == 2 && dot);
    cb->bf16 = bf16 && dot ? CPU_BF16_DOT : cpu_bf16_best();
    cb->q8 = act == 2 ? cpu_q8_best() : CPU_Q8_OFF;
    be->kv_size = bf16 ? sizeof(uint16_t) : sizeof(float); /* the KV caches kv_create makes */
    static const char *q8_name[] = {"", "plain C", "AVX2", "AVX512-VNNI", "NEON dot-product"};
    if (!bf16)
        be->kernels[0] = 0;
    else
        snprintf(be->kernels, sizeof be->kernels, "%s%s%s%s; KV cache bf16",
                 cb->bf16 == CPU_BF16_DOT
                     ? "bf16 weights: activations rounded to bf16, AVX512_BF16 dot products"
                 : cb->round_x ? "bf16 weights: activations rounded to bf16 (no bf16 dot "
                                 "products on this CPU: the fp32 kernels)"
                               : "bf16 weights: fp32 activations (no bf16 dot products on "
                                 "this CPU)",
                 cb->q8 != CPU_Q8_OFF ? "; INT4 weights: int8 activations, " : "",
                 q8_name[cb->q8], cb->q8 != CPU_Q8_OFF ? " integer dot products" : "");
    return ATLAS_OK;
}

/* tests/test-shard.c — the tensor-parallel split arithmetic (model/shard.h):
 *   - real shapes (Llama-3-8B, Llama-3-70B, Qwen3-8B, Qwen3-32B, Qwen2-7B) at N = 1, 2, 4, 8:
 *     the heads and columns each rank owns, and that the byte ranges of all ranks tile every
 *     split tensor exactly once;
 *   - a small model with every optional tensor: each rank's slice copied out element by
 *     element, and each element held by exactly the ranks it should be;
 *   - the sharded attention and MLP blocks computed on the CPU from the slices, summed over
 *     ranks as the all-reduce will, against the unsharded computation;
 *   - the real tiny checkpoints of tests/data: every tensor cut by atlas_shard_view and put
 *     back byte for byte, and a float32 forward run from the ranks' views, the partial
 *     outputs summed where the two all-reduces go, against transformers' logits;
 *   - errors for impossible splits and wrong tensors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/file.h"
#include "harness.h"
#include "model/config.h"
#include "model/rope.h"
#include "format/safetensors.h"
#include "model/shard.h"

typedef struct model_shape {
    const char *name;
    atlas_shard_geom g;
} model_shape;

/* From the models' config.json files on the Hugging Face hub. */
static const model_shape models[] = {
    {"Llama-3-8B", {.hidden = 4096, .n_heads = 32, .n_kv_heads = 8, .head_dim = 128,
                    .intermediate = 14336, .vocab_size = 128256, .n_layers = 32}},
    {"Llama-3-70B", {.hidden = 8192, .n_heads = 64, .n_kv_heads = 8, .head_dim = 128,
                     .intermediate = 28672, .vocab_size = 128256, .n_layers = 80}},
    {"Qwen3-8B", {.hidden = 4096, .n_heads = 32, .n_kv_heads = 8, .head_dim = 128,
                  .intermediate = 12288, .vocab_size = 151936, .n_layers = 36, .qk_norm = true}},
    {"Qwen3-32B", {.hidden = 5120, .n_heads = 64, .n_kv_heads = 8, .head_dim = 128,
                   .intermediate = 25600, .vocab_size = 151936, .n_layers = 64, .qk_norm = true}},
};

typedef struct range { size_t start, len; } range;

static int cmp_range(const void *a, const void *b) {
    size_t x = ((const range *)a)->start, y = ((const range *)b)->start;
    return x < y ? -1 : x > y;
}

/* The byte ranges of the ranks that hold distinct parts (one rank per KV replica group for
 * K/V tensors) must tile [0, bytes) exactly; replicas must hold the same slice. */
static void check_tiling(const atlas_shard_geom *g, int world, const char *name, int ndim,
                         const int64_t *shape) {
    size_t bytes = (size_t)shape[0] * (ndim == 2 ? (size_t)shape[1] : 1) * 2;
    size_t cap = 0, n = 0;
    range *r = NULL;
    size_t held = 0; /* bytes over all ranks, replicas included */
    atlas_shard_slice first = {0};
    for (int rank = 0; rank < world; rank++) {
        atlas_shard_plan p;
        atlas_shard_slice s;
        CHECK_OK(atlas_shard_plan_make(g, world, rank, &p));
        CHECK_OK(atlas_shard_tensor(&p, name, ndim, shape, ATLAS_DTYPE_BF16, &s));
        if (s.present) held += (size_t)s.n_chunks * s.chunk;
        if (rank == 0) first = s;
        bool kv = strstr(name, "k_proj") || strstr(name, "v_proj");
        bool split = s.kind == ATLAS_SHARD_ROWS || s.kind == ATLAS_SHARD_COLS;
        bool distinct = split ? !kv || rank % p.kv_replicas == 0 : rank == 0;
        if (!distinct) continue;
        if (n + (size_t)s.n_chunks > cap) {
            cap = (n + (size_t)s.n_chunks) * 2;
            r = realloc(r, cap * sizeof *r);
        }
        for (int64_t i = 0; i < s.n_chunks; i++)
            r[n++] = (range){s.offset + (size_t)i * s.stride, s.chunk};
    }
    qsort(r, n, sizeof *r, cmp_range);
    size_t at = 0;
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        if (r[i].start != at) ok = 0;
        at += r[i].len;
    }
    CHECK_MSG(ok && at == bytes, "%s at N=%d: ranges do not tile %zu bytes (end %zu)", name,
              world, bytes, at);
    /* what each rank holds: a split tensor once (times its KV replicas), a replicated one on
     * every rank, rank 0's alone once */
    size_t want = first.kind == ATLAS_SHARD_REPLICATED ? bytes * (size_t)world : bytes;
    if (strstr(name, "k_proj") || strstr(name, "v_proj")) {
        atlas_shard_plan p;
        CHECK_OK(atlas_shard_plan_make(g, world, 0, &p));
        want = bytes * (size_t)p.kv_replicas;
    }
    CHECK_MSG(held == want, "%s at N=%d: ranks hold %zu bytes, want %zu", name, world, held, want);
    free(r);
}

static void test_real_shapes(void) {
    for (size_t m = 0; m < sizeof models / sizeof models[0]; m++) {
        const atlas_shard_geom *g = &models[m].g;
        for (int world = 1; world <= 8; world *= 2) {
            atlas_shard_plan p;
            size_t rank_bytes[8] = {0};
            for (int rank = 0; rank < world; rank++) {
                CHECK_OK(atlas_shard_plan_make(g, world, rank, &p));
                CHECK(p.n_q_heads == g->n_heads / world && p.q_head0 == rank * p.n_q_heads);
                CHECK(p.n_kv_heads == g->n_kv_heads / world && p.kv_replicas == 1);
                CHECK(p.kv_head0 == rank * p.n_kv_heads);
                CHECK(p.n_mlp == g->intermediate / world && p.mlp0 == rank * p.n_mlp);
                /* every tensor of the model has a slice */
                int count = atlas_shard_tensor_count(g);
                for (int i = 0; i < count; i++) {
                    char name[128];
                    int ndim;
                    int64_t shape[2];
                    atlas_shard_slice s;
                    atlas_shard_tensor_info(g, i, name, sizeof name, &ndim, shape);
                    CHECK_OK(atlas_shard_tensor(&p, name, ndim, shape, ATLAS_DTYPE_BF16, &s));
                    if (s.present) rank_bytes[rank] += (size_t)s.n_chunks * s.chunk;
                }
            }
            /* the tiling of the first and last layers' tensors and the global ones */
            int count = atlas_shard_tensor_count(g);
            for (int i = 0; i < count; i++) {
                char name[128];
                int ndim;
                int64_t shape[2];
                atlas_shard_tensor_info(g, i, name, sizeof name, &ndim, shape);
                char last[32];
                snprintf(last, sizeof last, "layers.%d.", g->n_layers - 1);
                if (!strstr(name, "layers.") || strstr(name, "layers.0.") || strstr(name, last))
                    check_tiling(g, world, name, ndim, shape);
            }
            CHECK(atlas_shard_kv_token_bytes(&p, 2) ==
                  (size_t)g->n_layers * 2 * g->n_kv_heads * g->head_dim * 2 / (size_t)world);
            printf("%-12s N=%d: rank 0 %.2f GiB, rank %d %.2f GiB of bf16 weights; KV %zu "
                   "bytes/token/rank\n", models[m].name, world, rank_bytes[0] / 1073741824.0,
                   world - 1, rank_bytes[world - 1] / 1073741824.0,
                   atlas_shard_kv_token_bytes(&p, 2));
        }
    }
    /* the names and counts of one model: 2 + 9 per layer + norm + lm_head */
    CHECK(atlas_shard_tensor_count(&models[0].g) == 2 + 32 * 9 + 1);
    CHECK(atlas_shard_tensor_count(&models[2].g) == 2 + 36 * 11 + 1);
    char name[128];
    int ndim;
    int64_t shape[2];
    atlas_shard_tensor_info(&models[1].g, 1 + 9 + 2, name, sizeof name, &ndim, shape);
    CHECK_MSG(strcmp(name, "model.layers.1.self_attn.k_proj.weight") == 0, "%s", name);
    CHECK(ndim == 2 && shape[0] == 1024 && shape[1] == 8192);
}

/* 16 query heads on 2 KV heads: N = 8 replicates each KV head on 4 ranks. */
static void test_replication(void) {
    atlas_shard_geom g = {.hidden = 2048, .n_heads = 16, .n_kv_heads = 2, .head_dim = 128,
                          .intermediate = 8192, .vocab_size = 1000, .n_layers = 2};
    for (int world = 4; world <= 16; world *= 2) {
        for (int rank = 0; rank < world; rank++) {
            atlas_shard_plan p;
            CHECK_OK(atlas_shard_plan_make(&g, world, rank, &p));
            CHECK(p.kv_replicas == world / 2 && p.n_kv_heads == 1);
            CHECK(p.kv_head0 == rank / (world / 2));
            /* its q heads are all in its KV head's group of 8 */
            CHECK(p.q_head0 / 8 == p.kv_head0 && (p.q_head0 + p.n_q_heads - 1) / 8 == p.kv_head0);
        }
        int count = atlas_shard_tensor_count(&g);
        for (int i = 0; i < count; i++) {
            char name[128];
            int ndim;
            int64_t shape[2];
            atlas_shard_tensor_info(&g, i, name, sizeof name, &ndim, shape);
            check_tiling(&g, world, name, ndim, shape);
        }
    }
}

/* --- element by element on a small model with every optional tensor ----------------------- */

static const atlas_shard_geom small = {
    .hidden = 16, .n_heads = 8, .n_kv_heads = 2, .head_dim = 4, .intermediate = 24,
    .vocab_size = 10, .n_layers = 2, .qkv_bias = true, .o_bias = true, .mlp_bias = true,
    .qk_norm = true};

static void test_elements(void) {
    int count = atlas_shard_tensor_count(&small);
    CHECK(count == 2 + 2 * 18 + 1);
    for (int world = 1; world <= 8; world *= 2) {
        for (int i = 0; i < count; i++) {
            char name[128];
            int ndim;
            int64_t shape[2];
            atlas_shard_tensor_info(&small, i, name, sizeof name, &ndim, shape);
            size_t n = (size_t)shape[0] * (ndim == 2 ? (size_t)shape[1] : 1);
            float *full = malloc(n * sizeof *full), *part = malloc(n * sizeof *part);
            int *held = calloc(n, sizeof *held);
            for (size_t e = 0; e < n; e++) full[e] = (float)e + 0.5f;
            atlas_shard_slice s;
            int replicas = 1;
            for (int rank = 0; rank < world; rank++) {
                atlas_shard_plan p;
                CHECK_OK(atlas_shard_plan_make(&small, world, rank, &p));
                CHECK_OK(atlas_shard_tensor(&p, name, ndim, shape, ATLAS_DTYPE_F32, &s));
                if (strstr(name, "k_proj") || strstr(name, "v_proj")) replicas = p.kv_replicas;
                if (!s.present) continue;
                atlas_shard_slice_copy(&s, full, part);
                for (int64_t r = 0; r < s.n_rows; r++)
                    for (int64_t c = 0; c < s.n_cols; c++) {
                        size_t at = (size_t)((s.row0 + r) * s.cols + s.col0 + c);
                        held[at]++;
                        CHECK(part[r * s.n_cols + c] == full[at]);
                    }
            }
            int want = s.kind == ATLAS_SHARD_REPLICATED ? world : replicas;
            int bad = 0;
            for (size_t e = 0; e < n; e++) bad += held[e] != want;
            CHECK_MSG(bad == 0, "%s at N=%d: %d elements not held %d times", name, world, bad,
                      want);
            free(full);
            free(part);
            free(held);
        }
    }
}

/* --- the sharded blocks, computed on the CPU ------------------------------------------------ */

enum { T = 5 }; /* tokens of the test sequence */

typedef struct block_weights {
    float *wq, *wk, *wv, *bq, *bk, *bv, *wo, *bo; /* full tensors */
    float *wg, *wu, *wd, *bg, *bu, *bd;
} block_weights;

static float *rand_tensor(size_t n, unsigned *seed) {
    float *t = malloc(n * sizeof *t);
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        t[i] = (float)((*seed >> 8) & 0xffff) / 65536.0f - 0.5f;
    }
    return t;
}

/* This rank's slice of a layer-0 tensor (malloc'd; NULL when the rank holds none). */
static float *slice_of(const atlas_shard_plan *p, const char *suffix, const float *full) {
    char name[128];
    snprintf(name, sizeof name, "model.layers.0.%s", suffix);
    int64_t shape[2];
    int ndim = 0;
    for (int i = 0; i < atlas_shard_tensor_count(&p->g); i++) {
        char n2[128];
        atlas_shard_tensor_info(&p->g, i, n2, sizeof n2, &ndim, shape);
        if (strcmp(n2, name) == 0) break;
    }
    atlas_shard_slice s;
    CHECK_OK(atlas_shard_tensor(p, name, ndim, shape, ATLAS_DTYPE_F32, &s));
    if (!s.present) return NULL;
    float *out = malloc((size_t)(s.n_rows * s.n_cols) * sizeof *out);
    atlas_shard_slice_copy(&s, full, out);
    return out;
}

/* out[T, m] = x[T, k] @ w[m, k]^T (+ b) */
static void linear(float *out, const float *x, const float *w, const float *b, int m, int k) {
    for (int t = 0; t < T; t++)
        for (int i = 0; i < m; i++) {
            double acc = b ? b[i] : 0;
            for (int j = 0; j < k; j++) acc += (double)x[t * k + j] * w[(size_t)i * k + j];
            out[t * m + i] = (float)acc;
        }
}

/* This rank's partial attention output [T, d] (before the all-reduce): its q heads, its KV
 * heads with the local GQA ratio, its columns of o_proj, the o bias on rank 0. */
static void attention_partial(const atlas_shard_plan *p, const block_weights *w,
                              const float *x, float *out) {
    int d = p->g.hidden, hd = p->g.head_dim, nq = p->n_q_heads, nkv = p->n_kv_heads;
    float *wq = slice_of(p, "self_attn.q_proj.weight", w->wq);
    float *bq = slice_of(p, "self_attn.q_proj.bias", w->bq);
    float *wk = slice_of(p, "self_attn.k_proj.weight", w->wk);
    float *bk = slice_of(p, "self_attn.k_proj.bias", w->bk);
    float *wv = slice_of(p, "self_attn.v_proj.weight", w->wv);
    float *bv = slice_of(p, "self_attn.v_proj.bias", w->bv);
    float *wo = slice_of(p, "self_attn.o_proj.weight", w->wo);
    float *bo = slice_of(p, "self_attn.o_proj.bias", w->bo);
    float q[T * 64], k[T * 64], v[T * 64], att[T * 64];
    linear(q, x, wq, bq, nq * hd, d);
    linear(k, x, wk, bk, nkv * hd, d);
    linear(v, x, wv, bv, nkv * hd, d);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nq; h++) {
            int kh = h / (nq / nkv); /* as the backend maps local heads */
            double s[T], mx = -1e30, sum = 0;
            for (int u = 0; u <= t; u++) {
                s[u] = 0;
                for (int e = 0; e < hd; e++)
                    s[u] += (double)q[(t * nq + h) * hd + e] * k[(u * nkv + kh) * hd + e];
                s[u] /= sqrt(hd);
                if (s[u] > mx) mx = s[u];
            }
            for (int u = 0; u <= t; u++) sum += s[u] = exp(s[u] - mx);
            for (int e = 0; e < hd; e++) {
                double acc = 0;
                for (int u = 0; u <= t; u++) acc += s[u] / sum * v[(u * nkv + kh) * hd + e];
                att[(t * nq + h) * hd + e] = (float)acc;
            }
        }
    linear(out, att, wo, bo, d, nq * hd);
    free(wq); free(bq); free(wk); free(bk); free(wv); free(bv); free(wo); free(bo);
}

/* This rank's partial MLP output [T, d]: silu(gate) * up on its columns, its columns of down. */
static void mlp_partial(const atlas_shard_plan *p, const block_weights *w, const float *x,
                        float *out) {
    int d = p->g.hidden, nf = p->n_mlp;
    float *wg = slice_of(p, "mlp.gate_proj.weight", w->wg);
    float *bg = slice_of(p, "mlp.gate_proj.bias", w->bg);
    float *wu = slice_of(p, "mlp.up_proj.weight", w->wu);
    float *bu = slice_of(p, "mlp.up_proj.bias", w->bu);
    float *wd = slice_of(p, "mlp.down_proj.weight", w->wd);
    float *bd = slice_of(p, "mlp.down_proj.bias", w->bd);
    float g[T * 64], u[T * 64];
    linear(g, x, wg, bg, nf, d);
    linear(u, x, wu, bu, nf, d);
    for (int i = 0; i < T * nf; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    linear(out, g, wd, bd, d, nf);
    free(wg); free(bg); free(wu); free(bu); free(wd); free(bd);
}

static void test_sharded_math(void) {
    const atlas_shard_geom *g = &small;
    int d = g->hidden, q = g->n_heads * g->head_dim, kv = g->n_kv_heads * g->head_dim;
    int f = g->intermediate;
    unsigned seed = 12345;
    block_weights w = {
        .wq = rand_tensor((size_t)q * d, &seed), .bq = rand_tensor(q, &seed),
        .wk = rand_tensor((size_t)kv * d, &seed), .bk = rand_tensor(kv, &seed),
        .wv = rand_tensor((size_t)kv * d, &seed), .bv = rand_tensor(kv, &seed),
        .wo = rand_tensor((size_t)d * q, &seed), .bo = rand_tensor(d, &seed),
        .wg = rand_tensor((size_t)f * d, &seed), .bg = rand_tensor(f, &seed),
        .wu = rand_tensor((size_t)f * d, &seed), .bu = rand_tensor(f, &seed),
        .wd = rand_tensor((size_t)d * f, &seed), .bd = rand_tensor(d, &seed)};
    float *x = rand_tensor((size_t)T * d, &seed);
    float ref_att[T * 16], ref_mlp[T * 16];
    atlas_shard_plan p;
    CHECK_OK(atlas_shard_plan_make(g, 1, 0, &p));
    attention_partial(&p, &w, x, ref_att);
    mlp_partial(&p, &w, x, ref_mlp);
    for (int world = 2; world <= 8; world *= 2) {
        float sum_att[T * 16] = {0}, sum_mlp[T * 16] = {0}, part[T * 16];
        for (int rank = 0; rank < world; rank++) {
            CHECK_OK(atlas_shard_plan_make(g, world, rank, &p));
            attention_partial(&p, &w, x, part);
            for (int i = 0; i < T * d; i++) sum_att[i] += part[i]; /* the all-reduce */
            mlp_partial(&p, &w, x, part);
            for (int i = 0; i < T * d; i++) sum_mlp[i] += part[i];
        }
        double err_att = 0, err_mlp = 0;
        for (int i = 0; i < T * d; i++) {
            err_att = fmax(err_att, fabs(sum_att[i] - ref_att[i]));
            err_mlp = fmax(err_mlp, fabs(sum_mlp[i] - ref_mlp[i]));
        }
        CHECK_MSG(err_att < 1e-4 && err_mlp < 1e-4, "N=%d: attention error %g, MLP error %g",
                  world, err_att, err_mlp);
    }
    float *all[] = {w.wq, w.bq, w.wk, w.bk, w.wv, w.bv, w.wo, w.bo, w.wg, w.bg, w.wu, w.bu,
                    w.wd, w.bd, x};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

/* --- the tiny checkpoints: views and a sharded forward against transformers' logits -------- */

typedef struct rank_weights {
    atlas_shard_plan p;
    /* per layer, this rank's parts as f32 (NULL when absent), keyed by layer_rules order */
    float *t[2][18];
    int64_t rows[2][18], cols[2][18];
} rank_weights;

static const char *const tiny_layer_names[] = {
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "self_attn.o_proj.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight",
    "mlp.up_proj.weight", "mlp.down_proj.weight"};
enum { W_IN, W_Q, W_K, W_V, W_QN, W_KN, W_O, W_POST, W_GATE, W_UP, W_DOWN, W_COUNT };

static float *view_to_f32(const atlas_tensor_view *v) {
    size_t n = v->nbytes / 2;
    float *out = malloc(n * sizeof *out);
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, (const char *)v->data + 2 * i, 2);
        out[i] = atlas_bf16_to_f32(h);
    }
    return out;
}

/* Cuts every tensor of st for N ranks with atlas_shard_view and puts the parts back: each
 * split tensor's bytes exactly once (KV heads once per replica), replicated ones on every
 * rank, lead-only ones on rank 0. */
static void check_views(const atlas_st *st, const atlas_shard_geom *g, int world) {
    for (size_t i = 0; i < atlas_st_count(st); i++) {
        const atlas_tensor_view *full = atlas_st_at(st, i);
        unsigned char *back = calloc(1, full->nbytes);
        int *held = calloc(full->nbytes / 2, sizeof *held);
        int want = 1;
        for (int rank = 0; rank < world; rank++) {
            atlas_shard_plan p;
            CHECK_OK(atlas_shard_plan_make(g, world, rank, &p));
            atlas_shard_slice s;
            CHECK_OK(atlas_shard_tensor(&p, full->name, full->n_dims, full->shape, full->dtype, &s));
            want = s.kind == ATLAS_SHARD_REPLICATED ? world
                   : strstr(full->name, "k_proj") || strstr(full->name, "v_proj") ? p.kv_replicas
                                                                                  : 1;
            atlas_tensor_view v;
            void *owned = NULL;
            bool present = false;
            CHECK_OK(atlas_shard_view(&p, full, &v, &owned, &present));
            if (!present) continue;
            CHECK(v.shape[0] == s.n_rows && (v.n_dims == 1 || v.shape[1] == s.n_cols));
            CHECK((owned != NULL) == (s.n_chunks > 1));
            /* the CUDA loader preads a view from (fd, file_offset): a row split must point at
             * its own bytes in the shard file, a gathered column band at no file */
            if (owned) {
                CHECK_MSG(v.fd < 0, "%s rank %d: a copied column band keeps fd %d", full->name,
                          rank, v.fd);
            } else if (v.fd >= 0) {
                void *file = malloc(v.nbytes);
                CHECK_OK(atlas_file_read_at(v.fd, file, v.nbytes, v.file_offset));
                CHECK_MSG(memcmp(file, v.data, v.nbytes) == 0, "%s rank %d: the file at offset "
                          "%llu is not the view's bytes", full->name, rank,
                          (unsigned long long)v.file_offset);
                free(file);
            }
            for (int64_t r = 0; r < s.n_rows; r++) {
                size_t to = (size_t)((s.row0 + r) * s.cols + s.col0) * 2;
                memcpy(back + to, (const char *)v.data + (size_t)(r * s.n_cols) * 2,
                       (size_t)s.n_cols * 2);
                for (int64_t c = 0; c < s.n_cols; c++) held[to / 2 + (size_t)c]++;
            }
            free(owned);
        }
        int bad = 0;
        for (size_t e = 0; e < full->nbytes / 2; e++) bad += held[e] != want;
        CHECK_MSG(bad == 0 && memcmp(back, full->data, full->nbytes) == 0,
                  "%s at N=%d: %d elements not held %d times, or bytes differ", full->name, world,
                  bad, want);
        free(back);
        free(held);
    }
}

static void load_rank(const atlas_st *st, const atlas_shard_geom *g, int world, int rank,
                      rank_weights *rw) {
    memset(rw, 0, sizeof *rw);
    CHECK_OK(atlas_shard_plan_make(g, world, rank, &rw->p));
    for (int l = 0; l < g->n_layers && l < 2; l++)
        for (int k = 0; k < W_COUNT; k++) {
            char name[128];
            snprintf(name, sizeof name, "model.layers.%d.%s", l, tiny_layer_names[k]);
            const atlas_tensor_view *full = atlas_st_find(st, name);
            if (!full) continue;
            atlas_tensor_view v;
            void *owned = NULL;
            bool present = false;
            CHECK_OK(atlas_shard_view(&rw->p, full, &v, &owned, &present));
            if (!present) continue;
            rw->t[l][k] = view_to_f32(&v);
            rw->rows[l][k] = v.shape[0];
            rw->cols[l][k] = v.n_dims == 2 ? v.shape[1] : 1;
            free(owned);
        }
}

static void free_rank(rank_weights *rw) {
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < W_COUNT; k++) free(rw->t[l][k]);
}

/* out[T, m] = x[T, k] @ w[m, k]^T, T rows */
static void matmul_t(float *out, const float *x, const float *w, int n, int m, int k) {
    for (int t = 0; t < n; t++)
        for (int i = 0; i < m; i++) {
            double acc = 0;
            for (int j = 0; j < k; j++) acc += (double)x[t * k + j] * w[(size_t)i * k + j];
            out[t * m + i] = (float)acc;
        }
}

static void rmsnorm_rows(float *out, const float *x, const float *w, int n, int d, double eps) {
    for (int t = 0; t < n; t++) {
        double ss = 0;
        for (int i = 0; i < d; i++) ss += (double)x[t * d + i] * x[t * d + i];
        float inv = (float)(1.0 / sqrt(ss / d + eps));
        for (int i = 0; i < d; i++) out[t * d + i] = w[i] * (x[t * d + i] * inv);
    }
}

/* Rotate-half RoPE of heads [n, heads, hd] at positions 0..n-1. */
static void rope_heads(float *x, int n, int heads, int hd, const double *inv_freq, double scale) {
    for (int t = 0; t < n; t++)
        for (int h = 0; h < heads; h++) {
            float *v = x + ((size_t)t * heads + h) * hd;
            for (int i = 0; i < hd / 2; i++) {
                double c = cos(t * inv_freq[i]) * scale, s = sin(t * inv_freq[i]) * scale;
                float a = v[i], b = v[i + hd / 2];
                v[i] = (float)(a * c - b * s);
                v[i + hd / 2] = (float)(b * c + a * s);
            }
        }
}

/* One rank's attention partial o[n, d] of layer l from its input h[n, d]. */
static void tiny_attention(const rank_weights *rw, const atlas_config *cfg, const double *inv,
                           double scale, int l, const float *h, int n, float *o) {
    int d = cfg->hidden, hd = cfg->head_dim, nq = rw->p.n_q_heads, nkv = rw->p.n_kv_heads;
    float *q = malloc(sizeof(float) * n * nq * hd), *k = malloc(sizeof(float) * n * nkv * hd);
    float *v = malloc(sizeof(float) * n * nkv * hd), *att = malloc(sizeof(float) * n * nq * hd);
    matmul_t(q, h, rw->t[l][W_Q], n, nq * hd, d);
    matmul_t(k, h, rw->t[l][W_K], n, nkv * hd, d);
    matmul_t(v, h, rw->t[l][W_V], n, nkv * hd, d);
    if (rw->t[l][W_QN]) {
        rmsnorm_rows(q, q, rw->t[l][W_QN], n * nq, hd, cfg->rms_eps);
        rmsnorm_rows(k, k, rw->t[l][W_KN], n * nkv, hd, cfg->rms_eps);
    }
    rope_heads(q, n, nq, hd, inv, scale);
    rope_heads(k, n, nkv, hd, inv, scale);
    for (int t = 0; t < n; t++)
        for (int hh = 0; hh < nq; hh++) {
            int kh = hh / (nq / nkv);
            double s[64], mx = -1e300, sum = 0;
            for (int u = 0; u <= t; u++) {
                s[u] = 0;
                for (int e = 0; e < hd; e++)
                    s[u] += (double)q[(t * nq + hh) * hd + e] * k[(u * nkv + kh) * hd + e];
                s[u] /= sqrt(hd);
                mx = s[u] > mx ? s[u] : mx;
            }
            for (int u = 0; u <= t; u++) sum += s[u] = exp(s[u] - mx);
            for (int e = 0; e < hd; e++) {
                double acc = 0;
                for (int u = 0; u <= t; u++) acc += s[u] / sum * v[(u * nkv + kh) * hd + e];
                att[(t * nq + hh) * hd + e] = (float)acc;
            }
        }
    matmul_t(o, att, rw->t[l][W_O], n, d, nq * hd);
    free(q); free(k); free(v); free(att);
}

static void tiny_mlp(const rank_weights *rw, const atlas_config *cfg, int l, const float *h,
                     int n, float *o) {
    int d = cfg->hidden, nf = rw->p.n_mlp;
    float *g = malloc(sizeof(float) * n * nf), *u = malloc(sizeof(float) * n * nf);
    matmul_t(g, h, rw->t[l][W_GATE], n, nf, d);
    matmul_t(u, h, rw->t[l][W_UP], n, nf, d);
    for (int i = 0; i < n * nf; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    matmul_t(o, g, rw->t[l][W_DOWN], n, d, nf);
    free(g); free(u);
}

/* The logits of the last of ids[n] with the model split over `world` ranks: every rank's
 * partial outputs summed where the all-reduces go. */
static void tiny_forward(const atlas_st *st, const atlas_config *cfg, int world,
                         const int32_t *ids, int n, float *logits) {
    atlas_shard_geom g;
    atlas_shard_geom_from_config(cfg, &g);
    rank_weights *rw = malloc(sizeof *rw * (size_t)world);
    for (int r = 0; r < world; r++) load_rank(st, &g, world, r, &rw[r]);
    int d = cfg->hidden;
    double inv[64], scale = 1;
    atlas_rope_inv_freq(cfg, inv, &scale);
    const atlas_tensor_view *emb = atlas_st_find(st, "model.embed_tokens.weight");
    float *x = calloc((size_t)n * d, sizeof *x), *h = malloc(sizeof(float) * n * d);
    float *sum = malloc(sizeof(float) * n * d), *part = malloc(sizeof(float) * n * d);
    for (int t = 0; t < n; t++)
        for (int i = 0; i < d; i++) {
            uint16_t b;
            memcpy(&b, (const char *)emb->data + ((size_t)ids[t] * d + i) * 2, 2);
            x[t * d + i] = atlas_bf16_to_f32(b);
        }
    for (int l = 0; l < cfg->n_layers; l++) {
        rmsnorm_rows(h, x, rw[0].t[l][W_IN], n, d, cfg->rms_eps);
        memset(sum, 0, sizeof(float) * n * d);
        for (int r = 0; r < world; r++) {
            tiny_attention(&rw[r], cfg, inv, scale, l, h, n, part);
            for (int i = 0; i < n * d; i++) sum[i] += part[i]; /* all-reduce 1 */
        }
        for (int i = 0; i < n * d; i++) x[i] += sum[i];
        rmsnorm_rows(h, x, rw[0].t[l][W_POST], n, d, cfg->rms_eps);
        memset(sum, 0, sizeof(float) * n * d);
        for (int r = 0; r < world; r++) {
            tiny_mlp(&rw[r], cfg, l, h, n, part);
            for (int i = 0; i < n * d; i++) sum[i] += part[i]; /* all-reduce 2 */
        }
        for (int i = 0; i < n * d; i++) x[i] += sum[i];
    }
    /* rank 0: final norm of the last token and the (tied) head */
    const atlas_tensor_view *norm = atlas_st_find(st, "model.norm.weight");
    float *nw = view_to_f32(norm);
    rmsnorm_rows(h, x + (size_t)(n - 1) * d, nw, 1, d, cfg->rms_eps);
    for (int v = 0; v < cfg->vocab_size; v++) {
        double acc = 0;
        for (int i = 0; i < d; i++) {
            uint16_t b;
            memcpy(&b, (const char *)emb->data + ((size_t)v * d + i) * 2, 2);
            acc += (double)h[i] * atlas_bf16_to_f32(b);
        }
        logits[v] = (float)acc;
    }
    free(nw); free(x); free(h); free(sum); free(part);
    for (int r = 0; r < world; r++) free_rank(&rw[r]);
    free(rw);
}

static void test_tiny_models(void) {
    const char *dirs[] = {"tiny-llama3", "tiny-qwen3"};
    for (int m = 0; m < 2; m++) {
        char dir[1024], ref_path[1100];
        snprintf(dir, sizeof dir, "%s", harness_data_path(dirs[m]));
        snprintf(ref_path, sizeof ref_path, "%s/reference.safetensors", dir);
        atlas_config cfg;
        atlas_st *st = NULL, *ref = NULL;
        CHECK_OK(atlas_config_load(dir, &cfg));
        CHECK_OK(atlas_st_open_dir(dir, &st));
        CHECK_OK(atlas_st_open_file(ref_path, &ref));
        if (!st || !ref) return;
        CHECK(cfg.tie_embeddings && cfg.n_layers == 2);
        atlas_shard_geom g;
        atlas_shard_geom_from_config(&cfg, &g);
        const atlas_tensor_view *ids_v = atlas_st_find(ref, "p1.ids");
        const atlas_tensor_view *want_v = atlas_st_find(ref, "p1.last_logits");
        CHECK(ids_v && want_v && ids_v->dtype == ATLAS_DTYPE_I32);
        int n = (int)ids_v->shape[0];
        int32_t ids[64];
        memcpy(ids, ids_v->data, (size_t)n * 4);
        float *want = malloc(want_v->nbytes), *got = malloc(want_v->nbytes);
        memcpy(want, want_v->data, want_v->nbytes);
        for (int world = 1; world <= 4; world *= 2) {
            atlas_shard_plan p;
            if (atlas_shard_plan_make(&g, world, 0, &p) != ATLAS_OK) {
                /* tiny-llama3 has 2 heads: 4 ranks is an impossible split */
                CHECK(strstr(atlas_last_error(), "2 attention heads"));
                continue;
            }
            check_views(st, &g, world);
            tiny_forward(st, &cfg, world, ids, n, got);
            double err = 0, scale = 0;
            for (int v = 0; v < cfg.vocab_size; v++) {
                err = fmax(err, fabs(got[v] - want[v]));
                scale = fmax(scale, fabs(want[v]));
            }
            printf("%s N=%d (kv replicas %d): logits vs transformers: max abs diff / max abs "
                   "= %.2e\n", dirs[m], world, p.kv_replicas, err / scale);
            CHECK_MSG(err / scale < 1e-4, "%s N=%d: %g", dirs[m], world, err / scale);
        }
        free(want);
        free(got);
        atlas_st_free(st);
        atlas_st_free(ref);
    }
}

/* --- errors --------------------------------------------------------------------------------- */

static void expect_plan_error(atlas_shard_geom g, int world, int rank, atlas_status want,
                              const char *text) {
    atlas_shard_plan p;
    atlas_status st = atlas_shard_plan_make(&g, world, rank, &p);
    CHECK_MSG(st == want && strstr(atlas_last_error(), text), "N=%d rank %d: %s: %s", world,
              rank, atlas_status_str(st), atlas_last_error());
}

static void test_errors(void) {
    atlas_shard_geom qwen3_14b = {.hidden = 5120, .n_heads = 40, .n_kv_heads = 8,
                                  .head_dim = 128, .intermediate = 17408, .vocab_size = 151936,
                                  .n_layers = 40, .qk_norm = true};
    atlas_shard_plan p;
    CHECK_OK(atlas_shard_plan_make(&qwen3_14b, 8, 7, &p));
    expect_plan_error(qwen3_14b, 3, 0, ATLAS_ERR_UNSUPPORTED, "40 attention heads");
    expect_plan_error(qwen3_14b, 16, 0, ATLAS_ERR_UNSUPPORTED, "40 attention heads");
    atlas_shard_geom g = qwen3_14b;
    g.n_heads = 24; /* divisible by 3, its 8 KV heads are not */
    expect_plan_error(g, 3, 1, ATLAS_ERR_UNSUPPORTED, "8 KV heads");
    g.n_heads = 48, g.n_kv_heads = 4; /* 6 ranks > 4 KV heads, not a multiple */
    expect_plan_error(g, 6, 0, ATLAS_ERR_UNSUPPORTED, "replicated evenly");
    g = models[0].g;
    g.intermediate = 1000; /* 1000 % 16 = 8 */
    expect_plan_error(g, 16, 0, ATLAS_ERR_UNSUPPORTED, "1000 MLP columns (intermediate_size)");
    expect_plan_error(models[0].g, 0, 0, ATLAS_ERR_INVALID, "size 0");
    expect_plan_error(models[0].g, 4, 4, ATLAS_ERR_INVALID, "rank 4 outside 0..3");
    expect_plan_error(models[0].g, 2, -1, ATLAS_ERR_INVALID, "rank -1");
    g = models[0].g;
    g.n_kv_heads = 5;
    expect_plan_error(g, 1, 0, ATLAS_ERR_INVALID, "5 KV heads do not divide 32");

    CHECK_OK(atlas_shard_plan_make(&models[0].g, 2, 1, &p));
    atlas_shard_slice s;
    int64_t bad[2] = {4096, 4095};
    atlas_status st = atlas_shard_tensor(&p, "model.layers.3.self_attn.q_proj.weight", 2, bad,
                                         ATLAS_DTYPE_BF16, &s);
    CHECK_MSG(st == ATLAS_ERR_FORMAT && strstr(atlas_last_error(), "layers.3.self_attn.q_proj") &&
                  strstr(atlas_last_error(), "[4096, 4095], want [4096, 4096]"),
              "%s", atlas_last_error());
    int64_t ok[2] = {4096, 4096};
    st = atlas_shard_tensor(&p, "model.layers.32.self_attn.q_proj.weight", 2, ok,
                            ATLAS_DTYPE_BF16, &s);
    CHECK_MSG(st == ATLAS_ERR_FORMAT && strstr(atlas_last_error(), "layer 32, the model has 32"),
              "%s", atlas_last_error());
    st = atlas_shard_tensor(&p, "model.layers.1.mlp.experts.0.weight", 2, ok, ATLAS_DTYPE_BF16, &s);
    CHECK_MSG(st == ATLAS_ERR_UNSUPPORTED && strstr(atlas_last_error(), "experts.0"), "%s",
              atlas_last_error());
    st = atlas_shard_tensor(&p, "model.layers.x.mlp.up_proj.weight", 2, ok, ATLAS_DTYPE_BF16, &s);
    CHECK(st == ATLAS_ERR_UNSUPPORTED);
    int64_t vec[1] = {4096};
    st = atlas_shard_tensor(&p, "model.norm.weight", 1, vec, ATLAS_DTYPE_COUNT, &s);
    CHECK(st == ATLAS_ERR_INVALID);
    CHECK_OK(atlas_shard_tensor(&p, "model.norm.weight", 1, vec, ATLAS_DTYPE_F32, &s));
    CHECK(s.present && s.n_chunks == 1 && s.chunk == 4096 * 4 && s.kind == ATLAS_SHARD_REPLICATED);
    /* rank 1 holds no lm_head; rank 1's down_proj is the second half of every row */
    int64_t head[2] = {128256, 4096}, down[2] = {4096, 14336};
    CHECK_OK(atlas_shard_tensor(&p, "lm_head.weight", 2, head, ATLAS_DTYPE_BF16, &s));
    CHECK(!s.present && s.n_chunks == 0 && s.kind == ATLAS_SHARD_LEAD);
    CHECK_OK(atlas_shard_tensor(&p, "model.layers.0.mlp.down_proj.weight", 2, down,
                                ATLAS_DTYPE_BF16, &s));
    CHECK(s.kind == ATLAS_SHARD_COLS && s.n_chunks == 4096 && s.chunk == 7168 * 2 &&
          s.offset == 7168 * 2 && s.stride == 14336 * 2 && s.col0 == 7168);
}

int main(void) {
    test_real_shapes();
    test_replication();
    test_elements();
    test_sharded_math();
    test_tiny_models();
    test_errors();
    return harness_finish();
}

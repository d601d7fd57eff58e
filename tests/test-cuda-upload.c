/* tests/test-cuda-upload.c — the CUDA backend's weight upload through the fake driver
 * (tests/fake_cuda.h; CI has no GPU): "device" addresses are host memory, copies are memcpy,
 * and a copy whose source is not a pinned (cuMemHostAlloc) buffer is counted as the real
 * driver's slow path.  With kernels in the binary (kernels are never launched): a fused
 * weight of bf16, f32 and f16 tensors lands converted at its offsets through the host's
 * loader threads and the staging pool, every byte read through the sources' reader (the
 * model's pread), a weight freed before weights_done is waited for, a weight of more
 * tensors than an upload holds (a mixture-of-experts layer's stacked experts) lands whole,
 * and quantized stacked experts are refused by name.  Work that wants a quiet device
 * (atlas_host_quiet_call: a load's kernel modules) runs on the serving thread at its quiet
 * point, its failure reported to the caller, and on the caller when nothing serves or the
 * serving thread sleeps.  The quantized matmul on split x launches the kernels it needs.
 * INT4 as GPTQ stores it goes up as stored and is queued for the repack at weights_done (not
 * on a host tier's hit, which replays the bytes kept). Sampled steps queued ahead put each
 * step's rows in its slot.
 * tests/test-gpu-load.c loads the fixtures on a real GPU. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/host_tier.h"
#include "core/dtype.h"
#include "core/file.h"
#include "fake_cuda.h"
#include "harness.h"
#include "format/safetensors.h"
#include "model/forward.h"
#include "model/model_internal.h"
#include "model/weight_read.h"

/* --- the CUDA backend's weight_load ------------------------------------------------------- */
#ifdef ATLAS_HAVE_KERNELS

/* A checkpoint of mixed dtypes: a[4, 8] bf16, b[2, 8] f32, c[3, 8] bf16, n[8] bf16, m[8] f16,
 * big[16384, 64] bf16 (2 MiB: several 1 MiB pieces), after a header of odd length. */
static void write_checkpoint(const char *path) {
    const char *hdr = "{\"a\":{\"dtype\":\"BF16\",\"shape\":[4,8],\"data_offsets\":[0,64]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2,8],\"data_offsets\":[64,128]},"
                      "\"c\":{\"dtype\":\"BF16\",\"shape\":[3,8],\"data_offsets\":[128,176]},"
                      "\"n\":{\"dtype\":\"BF16\",\"shape\":[8],\"data_offsets\":[176,192]},"
                      "\"m\":{\"dtype\":\"F16\",\"shape\":[8],\"data_offsets\":[192,208]},"
                      "\"big\":{\"dtype\":\"BF16\",\"shape\":[16384,64],"
                      "\"data_offsets\":[208,2097360]}} "; /* 363 bytes: data at an odd offset */
    uint64_t hn = strlen(hdr);
    size_t data = 2097360;
    unsigned char *buf = malloc(data);
    uint32_t x = 12345;
    for (size_t i = 0; i < data; i++) {
        x = x * 1103515245u + 12345u;
        buf[i] = (unsigned char)(x >> 16);
    }
    for (int i = 0; i < 16; i++) { /* b: finite floats; m: finite halves */
        float f = (float)i * 0.37f - 2.0f;
        memcpy(buf + 64 + 4 * i, &f, 4);
    }
    for (int i = 0; i < 8; i++) {
        uint16_t h = (uint16_t)(0x3c00 + i * 0x111);
        memcpy(buf + 192 + 2 * i, &h, 2);
    }
    FILE *fp = fopen(path, "wb");
    CHECK(fp && fwrite(&hn, 8, 1, fp) == 1 && fwrite(hdr, 1, hn, fp) == hn &&
          fwrite(buf, 1, data, fp) == data);
    if (fp) fclose(fp);
    free(buf);
}

/* The bf16 bytes a source should become on the device, appended at out. */
static size_t expect_src(const atlas_weight_src *v, unsigned char *out) {
    size_t ne = v->nbytes / atlas_dtype_size(v->dtype);
    for (size_t i = 0; i < ne; i++) {
        uint16_t b;
        if (v->dtype == ATLAS_DTYPE_BF16) {
            memcpy(&b, (const char *)v->data + 2 * i, 2);
        } else if (v->dtype == ATLAS_DTYPE_F16) {
            uint16_t h;
            memcpy(&h, (const char *)v->data + 2 * i, 2);
            b = atlas_f32_to_bf16(atlas_f16_to_f32(h));
        } else {
            float f;
            memcpy(&f, (const char *)v->data + 4 * i, 4);
            b = atlas_f32_to_bf16(f);
        }
        if (v->offset != 0) b = atlas_f32_to_bf16(atlas_bf16_to_f32(b) + v->offset);
        memcpy(out + 2 * i, &b, 2);
    }
    return 2 * ne;
}

static int weight_is(const atlas_weight *w, const atlas_weight_src *const *v, int n) {
    unsigned char *want = malloc((size_t)w->rows * w->cols * 2);
    size_t off = 0;
    for (int i = 0; i < n; i++) off += expect_src(v[i], want + off);
    int same = off == (size_t)w->rows * w->cols * 2 &&
               !memcmp((void *)(uintptr_t)w->ptr, want, off);
    free(want);
    return same;
}

/* The model's reader (model/weight_read.h), counting the bytes the backend read through it. */
static atomic_size_t read_bytes;
static atlas_status counting_read(void *ctx, void *dst, uint64_t offset, size_t n) {
    atomic_fetch_add(&read_bytes, n);
    return atlas_weight_file_read(ctx, dst, offset, n);
}

enum { N_SRC = 6 };

static void test_backend(const char *dir) {
    char path[600];
    snprintf(path, sizeof path, "%s/mixed.safetensors", dir);
    write_checkpoint(path);
    atlas_st *st = NULL;
    CHECK_OK(atlas_st_open_file(path, &st));
    double inv_freq[4] = {1, 0.1, 0.01, 0.001};
    atlas_backend_geom g = {.hidden = 8, .n_heads = 1, .n_kv_heads = 1, .head_dim = 8,
                            .intermediate = 8, .vocab_size = 4, .n_layers = 1, .rms_eps = 1e-5f,
                            .rope_inv_freq = inv_freq, .rope_attn_factor = 1};
    atlas_backend_options o = {.no_cublaslt = 1, .no_pdl = 1};
    atlas_backend *be = NULL;
    /* Gemma 3's geometry (GeGLU, a scaled embedding, post-norms, a second RoPE set chosen by
     * layer) and Phi-4-mini's (partial rotary, longrope) are taken, their arrays copied; a
     * layer's set that is not one and an odd rope_dim are refused by name */
    atlas_backend_geom gemma = g;
    uint8_t sets[1] = {1};
    double local[4] = {1, 0.5, 0.25, 0.125};
    gemma.glu = ATLAS_GLU_GELU_TANH, gemma.embed_scale = 2.0f, gemma.post_norms = 1;
    gemma.n_rope_sets = 1, gemma.rope_sets[0] = (atlas_rope_set){local, 1.0};
    gemma.layer_rope_set = sets;
    CHECK_OK(atlas_backend_cuda_create(&gemma, &o, &be));
    if (be) {
        const atlas_backend_geom *kept = &be->geom;
        CHECK(kept->layer_rope_set && kept->layer_rope_set != sets &&
              kept->layer_rope_set[0] == 1 && kept->rope_dim == 8);
        CHECK(kept->rope_sets[0].inv_freq != local && kept->rope_sets[0].inv_freq[3] == 0.125);
        CHECK_OK(be->ops->destroy(be));
        be = NULL;
    }
    sets[0] = 2;
    CHECK(atlas_backend_cuda_create(&gemma, &o, &be) == ATLAS_ERR_INVALID && !be);
    const char *why = atlas_last_error();
    CHECK_MSG(strstr(why, "layer 0 rotates with RoPE set 2"), "%s", why);
    atlas_backend_geom phi = g;
    double inv_long[2] = {0.5, 0.05};
    phi.rope_dim = 4, phi.rope_inv_freq_long = inv_long, phi.rope_long_after = 16;
    CHECK_OK(atlas_backend_cuda_create(&phi, &o, &be));
    if (be) {
        CHECK(be->geom.rope_inv_freq_long != inv_long && be->geom.rope_inv_freq_long[1] == 0.05);
        CHECK_OK(be->ops->destroy(be));
        be = NULL;
    }
    phi.rope_dim = 5;
    CHECK(atlas_backend_cuda_create(&phi, &o, &be) == ATLAS_ERR_INVALID && !be);
    why = atlas_last_error();
    CHECK_MSG(strstr(why, "rope_dim 5"), "%s", why);
    /* a mixture-of-experts geometry (Qwen3-MoE, Mixtral) is made; experts' columns the
     * kernels do not take are refused, the rule named */
    atlas_backend_geom moe = g;
    moe.n_experts = 4, moe.n_experts_used = 2, moe.expert_ffn = 12;
    CHECK(atlas_backend_cuda_create(&moe, &o, &be) == ATLAS_ERR_UNSUPPORTED && !be);
    why = atlas_last_error();
    CHECK_MSG(strstr(why, "experts") && strstr(why, "multiple of 8"), "%s", why);
    /* one expert of big's shape ([16384, 64] gate and up); quantized, they are refused */
    moe.hidden = 64, moe.n_experts = 1, moe.n_experts_used = 1, moe.expert_ffn = 16384;
    CHECK_OK(atlas_backend_cuda_create(&moe, &o, &be));
    if (be && st) {
        const atlas_tensor_view *v = atlas_st_find(st, "big");
        atlas_weight_file file;
        atlas_weight_src q = {0};
        if (v) atlas_weight_src_of_view(v, &file, &q);
        float one = 1.0f;
        atlas_wquant fp8 = {.format = ATLAS_WFMT_FP8_E4M3, .block_rows = 16384,
                            .block_cols = 64, .scale_cols = 1, .scales = &one};
        q.quant = &fp8;
        const atlas_weight_src *gu[] = {&q, &q};
        atlas_weight *w = NULL;
        CHECK(be->ops->weight_load(be, gu, 2, &w) == ATLAS_ERR_UNSUPPORTED && !w);
        CHECK_MSG(strstr(atlas_last_error(), "quantized mixture-of-experts") &&
                  strstr(atlas_last_error(), "--device cpu"), "%s", atlas_last_error());
    }
    if (be) be->ops->destroy(be);
    be = NULL;
    CHECK_OK(atlas_backend_cuda_create(&g, &o, &be));
    if (!st || !be) goto out;
    static const char *const names[N_SRC] = {"a", "b", "c", "n", "m", "big"};
    atlas_weight_file files[N_SRC];
    atlas_weight_src src[N_SRC];
    for (int i = 0; i < N_SRC; i++) {
        const atlas_tensor_view *v = atlas_st_find(st, names[i]);
        CHECK(v && v->fd >= 0);
        if (!v) goto out;
        atlas_weight_src_of_view(v, &files[i], &src[i]);
        CHECK(src[i].read == atlas_weight_file_read && src[i].ctx == &files[i]);
        src[i].read = counting_read;
    }
    const atlas_weight_src *a = &src[0], *b = &src[1], *c = &src[2], *n = &src[3], *m = &src[4],
                           *big = &src[5];
    const atlas_weight_src *abc[] = {a, b, c}, *nm[] = {n, m}, *cc[] = {c}, *bg[] = {big};
    const atlas_weight_src *five[] = {a, b, c, a, b};
    atlas_weight *w_abc = NULL, *w_nm = NULL, *w_c = NULL, *w_big = NULL, *w_five = NULL;
    CHECK_OK(be->ops->weight_load(be, abc, 3, &w_abc));
    CHECK_OK(be->ops->weight_load(be, nm, 2, &w_nm));
    CHECK_OK(be->ops->weight_load(be, cc, 1, &w_c));
    CHECK_OK(be->ops->weight_load(be, bg, 1, &w_big));
    /* more tensors than one queued upload holds (a mixture-of-experts layer's stacked
     * experts): queued a few at a time, each group at its rows */
    CHECK_OK(be->ops->weight_load(be, five, 5, &w_five));
    /* a quantized weight the kernels do not take (8 columns) is refused, naming the weight
     * and the rule, never uploaded as something else */
    float scale = 1.0f;
    atlas_wquant fp8 = {.format = ATLAS_WFMT_FP8_E4M3, .block_rows = 8, .block_cols = 8,
                        .scale_cols = 1, .scales = &scale};
    atlas_weight_src qsrc = *c;
    qsrc.quant = &fp8;
    const atlas_weight_src *qs[] = {&qsrc};
    atlas_weight *w_q = NULL;
    CHECK(be->ops->weight_load(be, qs, 1, &w_q) == ATLAS_ERR_UNSUPPORTED && !w_q);
    /* a norm used as 1 + w (Gemma): the offset added in float32, rounded once to bf16; on
     * a 2-D weight it is a caller's mistake, refused */
    atlas_weight_src osrc = *n;
    osrc.offset = 1.0f;
    const atlas_weight_src *os[] = {&osrc};
    atlas_weight *w_off = NULL;
    CHECK_OK(be->ops->weight_load(be, os, 1, &w_off));
    atlas_weight_src o2 = *c;
    o2.offset = 1.0f;
    const atlas_weight_src *o2s[] = {&o2};
    CHECK(be->ops->weight_load(be, o2s, 1, &w_q) == ATLAS_ERR_INVALID && !w_q);
    CHECK_MSG(strstr(atlas_last_error(), "offset on a 2-D weight"), "%s", atlas_last_error());
    CHECK(be->ops->weight_load(be, qs, 1, &w_q) == ATLAS_ERR_UNSUPPORTED && !w_q);
    CHECK_MSG(strstr(atlas_last_error(), "FP8 e4m3") &&
              strstr(atlas_last_error(), "multiples of 16") &&
              strstr(atlas_last_error(), "--device cpu"),
              "%s", atlas_last_error());
    if (!w_abc || !w_nm || !w_c || !w_big || !w_five) goto out;
    /* freed while its pieces may be in flight: waited for first (ASan would see a write
     * into freed memory) */
    be->ops->weight_free(be, w_c);
    CHECK_OK(be->ops->weights_done(be));
    CHECK_MSG(weight_is(w_abc, abc, 3), "fused bf16|f32|bf16 weight differs");
    CHECK_MSG(weight_is(w_nm, nm, 2), "fused bf16|f16 1-D weight differs");
    CHECK_MSG(weight_is(w_big, bg, 1), "big weight differs");
    CHECK_MSG(weight_is(w_five, five, 5), "weight of five tensors differs");
    CHECK_MSG(w_off && weight_is(w_off, os, 1), "norm weight with its 1 + w differs");
    long bad_copies = fake_cuda_get_stats().bad_copies;
    CHECK_MSG(bad_copies == 0, "%ld copies not out of a pinned buffer", bad_copies);
    /* every byte came through the reader, f32 and f16 ones too (nothing from the mapping,
     * which a truncated file turns into SIGBUS); c twice: w_c was read before its free; n
     * twice: w_nm and w_off */
    size_t want_read = 3 * a->nbytes + 3 * b->nbytes + 3 * c->nbytes + 2 * n->nbytes +
                       m->nbytes + big->nbytes;
    CHECK_MSG(atomic_load(&read_bytes) == want_read, "%zu bytes read through the reader, want "
              "%zu", atomic_load(&read_bytes), want_read);
    const cuda_load *ld = &((cuda_backend *)be)->wt.load;
    size_t want = 3 * a->nbytes + 3 * 2 * (b->nbytes / 4) + 3 * c->nbytes + 2 * n->nbytes +
                  m->nbytes + big->nbytes;
    CHECK_MSG(ld->staged_bytes == want, "staged %zu bytes, want %zu", ld->staged_bytes, want);
    printf("backend: %zu bytes staged by weight_load, %zu read through the reader\n",
           ld->staged_bytes, atomic_load(&read_bytes));
    be->ops->weight_free(be, w_abc);
    be->ops->weight_free(be, w_nm);
    be->ops->weight_free(be, w_big);
    be->ops->weight_free(be, w_five);
    be->ops->weight_free(be, w_off);
out:
    if (be) be->ops->destroy(be);
    atlas_st_free(st);
}

/* The launches of the quantized matmuls' newer kernels, as the driver sees them (none runs):
 * the tensor-core matmul on x split once (plan.qmma_split) launches the split before it, and
 * without the plan one kernel. */
static void test_quant_launches(void) {
    enum { M = 64, K = 4096, BC = 128, N = 16 };
    double inv_freq[4] = {1, 0.1, 0.01, 0.001};
    atlas_backend_geom g = {.hidden = K, .n_heads = 1, .n_kv_heads = 1, .head_dim = 8,
                            .intermediate = 8, .vocab_size = 4, .n_layers = 1, .rms_eps = 1e-5f,
                            .rope_inv_freq = inv_freq, .rope_attn_factor = 1};
    atlas_backend_options o = {.no_cublaslt = 1, .no_pdl = 1};
    uint8_t *codes = calloc((size_t)M * K / 2, 1);
    float *sc = malloc((size_t)M * (K / BC) * sizeof(float));
    float *zs = malloc((size_t)M * (K / BC) * sizeof(float));
    for (int i = 0; sc && zs && i < M * (K / BC); i++) sc[i] = 1e-3f, zs[i] = 8.0f;
    atlas_wquant q = {.format = ATLAS_WFMT_INT4, .block_rows = 1, .block_cols = BC,
                      .scale_cols = K / BC, .scales = sc, .zeros = zs};
    atlas_weight_src src = {.name = "w", .dtype = ATLAS_DTYPE_U8, .n_dims = 2, .shape = {M, K},
                            .nbytes = (size_t)M * K / 2, .data = codes, .quant = &q};
    const atlas_weight_src *v[] = {&src};
    atlas_backend *be = NULL;
    atlas_weight *w = NULL;
    void *x = NULL, *out = NULL;
    if (codes && sc && zs) CHECK_OK(atlas_backend_cuda_create(&g, &o, &be));
    if (be) {
        cuda_backend *cb = (cuda_backend *)be;
        CHECK_OK(be->ops->weight_load(be, v, 1, &w));
        CHECK_OK(be->ops->weights_done(be));
        CHECK_OK(be->ops->alloc(be, (size_t)N * K * 4, &x));
        CHECK_OK(be->ops->alloc(be, (size_t)N * M * 4, &out));
        if (w && x && out) {
            CHECK_OK(cuda_deq_reserve(cb));
            bool split0 = cb->plan.qmma_split;
            for (int split = 1; split >= 0; split--) {
                cb->plan.qmma_split = split;
                long before = fake_cuda_get_stats().launches;
                CHECK_OK(be->ops->matmul(be, out, x, w, NULL, N));
                long n = fake_cuda_get_stats().launches - before;
                CHECK_MSG(n == 1 + split, "%d rows, x %s: %ld launches, want %d", N,
                          split ? "split once" : "as it is", n, 1 + split);
            }
            cb->plan.qmma_split = split0;
        }
        if (x) be->ops->free(be, x);
        if (out) be->ops->free(be, out);
        if (w) be->ops->weight_free(be, w);
        CHECK_OK(be->ops->destroy(be));
    }
    free(codes);
    free(sc);
    free(zs);
}

/* Sampled steps queued a step ahead (atlas_model_forward_sample_queue: stage.c's
 * cuda_sample_queue) on a model loaded on the fake (no kernel runs, so only the host's side
 * is checked): each step's rows land in its slot of the mapped rows buffer, the 40 rows of a
 * step whose logits go a chunk at a time (the fixture's chunk is 16 rows) at their offsets;
 * a third step is refused while two are queued, a row asking for logprobs before anything
 * is queued; both steps are collected and no more. */
static void test_sample_queue(void) {
    enum { W = 40 };
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CUDA;
    p.load_tokenizer = 0;
    p.kv_block_size = 16;
    p.kv_tokens = 16 * W;
    p.max_batch_tokens = 64;
    atlas_model *m = NULL;
    CHECK_OK(atlas_model_load(harness_data_path("tiny-llama3"), &p, &m));
    if (!m) return;
    cuda_backend *cb = (cuda_backend *)m->be;
    int32_t tok[W], pos[W], start[W + 1], ctx[W], rows[W], table[W], ids[W];
    atlas_sample_row r[2][W];
    for (int i = 0; i < W; i++) {
        tok[i] = 7 * i + 3;
        start[i] = rows[i] = table[i] = i;
        pos[i] = 0, ctx[i] = 1;
        for (int k = 0; k < 2; k++)
            r[k][i] = (atlas_sample_row){.seed = 100u + (uint64_t)i, .counter = 1u + (uint64_t)k,
                                         .temperature = i % 3 ? 0.7f : 0.0f, .top_p = 0.9f,
                                         .repetition_penalty = 1.0f, .top_k = i % 5};
    }
    start[W] = W;
    atlas_batch b = {.n_tokens = W, .tokens = tok, .positions = pos, .n_seqs = W,
                     .seq_start = start, .seq_ctx = ctx, .block_table = table, .max_blocks = 1,
                     .n_logits = W, .logit_rows = rows};
    CHECK_OK(atlas_model_forward_sample_queue(m, &b, r[0]));
    int32_t prev[W];
    for (int i = 0; i < W; i++) pos[i] = 1, ctx[i] = 2, prev[i] = ATLAS_BATCH_PREV(W - 1 - i);
    b.tokens = prev;
    CHECK_OK(atlas_model_forward_sample_queue(m, &b, r[1]));
    CHECK(cb->batch.tok_ids == cb->ws.d_ids); /* the embedding reads the ids on the device */
    CHECK(atlas_model_queued_ready(m)); /* the fake driver's events have always happened */
    CHECK(cb->batch.aq_n == 2 && cb->batch.aq_rows[0] == W && cb->batch.aq_rows[1] == W);
    CHECK(cb->ws.h_sq && cb->ws.sq_cap >= W);
    for (int k = 0; cb->ws.h_sq && k < 2; k++)
        CHECK_MSG(!memcmp((const atlas_sample_row *)cb->ws.h_sq + (size_t)k * cb->ws.sq_cap,
                          r[k], sizeof r[k]),
                  "step %d's rows are not in slot %d of the rows buffer", k, k);
    CHECK(atlas_model_forward_sample_queue(m, &b, r[1]) == ATLAS_ERR_BUSY);
    CHECK_OK(atlas_model_argmax_collect(m, ids, W));
    atlas_sample_row bad[W];
    memcpy(bad, r[1], sizeof bad);
    bad[W - 1].flags = ATLAS_SAMPLE_LOGPROB;
    CHECK(atlas_model_forward_sample_queue(m, &b, bad) == ATLAS_ERR_INVALID);
    CHECK(cb->batch.aq_n == 1);
    CHECK_OK(atlas_model_argmax_collect(m, ids, W));
    CHECK(atlas_model_argmax_collect(m, ids, W) == ATLAS_ERR_INVALID);
    CHECK_OK(atlas_model_release(m));
    printf("sampled steps queued: two steps of %d rows in their slots, a third refused\n", W);
}

/* INT4 as GPTQ stores it (backend.h atlas_int4_order) goes up as stored: the codes into their
 * region, each part's scales and zeros into the start of its rows' regions of the float grids
 * (the rest zero), and weights_done repacks each part in place (a copy to a scratch buffer and
 * two launches a part; the fake runs no kernel, so the regions keep what went up) and frees
 * the scratch; a weight freed before weights_done is not repacked. */
static void test_int4_stored(void) {
    enum { K = 256, G = 2 };
    const int rows[2] = {64, 32};
    double inv_freq[4] = {1, 0.1, 0.01, 0.001};
    atlas_backend_geom g = {.hidden = K, .n_heads = 1, .n_kv_heads = 1, .head_dim = 8,
                            .intermediate = 8, .vocab_size = 4, .n_layers = 1, .rms_eps = 1e-5f,
                            .rope_inv_freq = inv_freq, .rope_attn_factor = 1};
    atlas_backend_options o = {.no_cublaslt = 1, .no_pdl = 1};
    uint32_t qw[2][64 * K / 8], qz[2][G * 64 / 8];
    uint16_t sc[2][G * 64];
    atlas_weight_src src[2], ss[2], zs[2];
    atlas_wquant q[2];
    const atlas_weight_src *v[2];
    for (int p = 0; p < 2; p++) {
        int r = rows[p];
        for (int i = 0; i < r * K / 8; i++) qw[p][i] = 0x9e3779b9u * (uint32_t)(i + 7 * p + 1);
        for (int i = 0; i < G * r / 8; i++) qz[p][i] = 0x77777777u + (uint32_t)i;
        for (int i = 0; i < G * r; i++) sc[p][i] = (uint16_t)(0x1c00 + i + p);
        ss[p] = (atlas_weight_src){.name = "scales", .dtype = ATLAS_DTYPE_F16, .n_dims = 2,
                                   .shape = {G, r}, .nbytes = (size_t)G * r * 2, .data = sc[p]};
        zs[p] = (atlas_weight_src){.name = "qzeros", .dtype = ATLAS_DTYPE_I32, .n_dims = 2,
                                   .shape = {G, r / 8}, .nbytes = (size_t)G * r / 2,
                                   .data = qz[p]};
        q[p] = (atlas_wquant){.format = ATLAS_WFMT_INT4, .block_rows = 1, .block_cols = K / G,
                              .scale_cols = G, .order = ATLAS_INT4_GPTQ, .stored_scales = &ss[p],
                              .stored_zeros = &zs[p], .zero_add = 1.0f};
        src[p] = (atlas_weight_src){.name = "qkv", .dtype = ATLAS_DTYPE_I32, .n_dims = 2,
                                    .shape = {r, K}, .nbytes = (size_t)r * K / 2, .data = qw[p],
                                    .quant = &q[p]};
        v[p] = &src[p];
    }
    atlas_backend *be = NULL;
    CHECK_OK(atlas_backend_cuda_create(&g, &o, &be));
    if (!be) return;
    CHECK(be->int4_stored == 1);
    atlas_weight *w = NULL, *dropped = NULL;
    long allocs0 = fake_cuda_get_stats().live_allocs, l0 = fake_cuda_get_stats().launches;
    CHECK_OK(be->ops->weight_load(be, v, 2, &w));
    CHECK_OK(be->ops->weights_done(be));
    long launches = fake_cuda_get_stats().launches - l0;
    CHECK_MSG(launches == 4, "%ld launches to repack 2 parts, want 4", launches);
    CHECK_MSG(fake_cuda_get_stats().live_allocs == allocs0 + 3, "%ld allocations after the "
              "repack, want the weight's 3 (the scratch freed)",
              fake_cuda_get_stats().live_allocs - allocs0);
    if (w) {
        size_t grid = (size_t)96 * G * 4, at = 0, gat = 0;
        CHECK(w->bytes == (size_t)96 * K / 2 + 2 * grid);
        for (int p = 0; p < 2; p++) {
            int r = rows[p];
            size_t region = (size_t)r * G * 4;
            const char *codes = (const char *)(uintptr_t)w->ptr + at;
            const char *sr = (const char *)(uintptr_t)w->scales + gat;
            const char *zr = (const char *)(uintptr_t)w->zeros + gat;
            CHECK(!memcmp(codes, qw[p], (size_t)r * K / 2));
            CHECK(!memcmp(sr, sc[p], ss[p].nbytes));
            CHECK(!memcmp(zr, qz[p], zs[p].nbytes));
            bool zero = true;
            for (size_t i = ss[p].nbytes; i < region; i++) zero &= sr[i] == 0;
            for (size_t i = zs[p].nbytes; i < region; i++) zero &= zr[i] == 0;
            CHECK_MSG(zero, "part %d: the rest of its grid regions is not zero", p);
            at += (size_t)r * K / 2;
            gat += region;
        }
        be->ops->weight_free(be, w);
    }
    l0 = fake_cuda_get_stats().launches;
    CHECK_OK(be->ops->weight_load(be, v, 1, &dropped));
    if (dropped) be->ops->weight_free(be, dropped);
    CHECK_OK(be->ops->weights_done(be));
    CHECK_MSG(fake_cuda_get_stats().launches == l0, "a weight freed before weights_done was "
              "repacked (%ld launches)", fake_cuda_get_stats().launches - l0);
    CHECK_OK(be->ops->destroy(be));
    /* the host tier: a load keeps its image (the repacked bytes, copied back once it serves);
     * a second load of the key replays it and repacks nothing */
    const uint64_t key = 0x5eed1e55u;
    size_t bytes = (size_t)96 * K / 2 + 2 * (size_t)96 * G * 4;
    unsigned char *first = malloc(bytes), *again = malloc(bytes);
    for (int round = 0; round < 2 && first && again; round++) {
        int hit = -1;
        const char *off = NULL;
        atlas_tier_stats ts;
        atlas_host_tier_stats(&ts);
        uint64_t fills = ts.fills;
        be = NULL;
        w = NULL;
        CHECK_OK(atlas_backend_cuda_create(&g, &o, &be));
        if (!be) break;
        CHECK_OK(be->ops->host_tier(be, key, (size_t)64 << 20, bytes, &hit, &off));
        CHECK_MSG(hit == round, "load %d of the key: hit %d", round + 1, hit);
        l0 = fake_cuda_get_stats().launches;
        CHECK_OK(be->ops->weight_load(be, v, 2, &w));
        CHECK_OK(be->ops->weights_done(be));
        long n = fake_cuda_get_stats().launches - l0;
        CHECK_MSG(n == (round ? 0 : 4), "load %d: %ld launches to repack", round + 1, n);
        if (w) {
            unsigned char *dst = round ? again : first;
            size_t cb_ = (size_t)96 * K / 2, gb = (size_t)96 * G * 4;
            memcpy(dst, (const void *)(uintptr_t)w->ptr, cb_);
            memcpy(dst + cb_, (const void *)(uintptr_t)w->scales, gb);
            memcpy(dst + cb_ + gb, (const void *)(uintptr_t)w->zeros, gb);
        }
        if (!round) {
            be->ops->tier_fill(be);
            for (int i = 0; i < 1000 && ts.fills == fills; i++) {
                struct timespec t = {0, 10 * 1000 * 1000};
                nanosleep(&t, NULL);
                atlas_host_tier_stats(&ts);
            }
            CHECK_MSG(ts.fills > fills, "no image kept after 10 s");
        }
        if (w) be->ops->weight_free(be, w);
        CHECK_OK(be->ops->destroy(be));
    }
    if (first && again) CHECK(!memcmp(first, again, bytes));
    free(first);
    free(again);
    printf("int4 as stored: uploaded as stored, %ld launches to repack 2 parts, none on a "
           "host tier's hit\n", launches);
}
#else
static void test_backend(const char *dir) {
    (void)dir;
    printf("backend: skipped (built without kernels: no CUDA backend to create)\n");
}
static void test_int4_stored(void) { printf("int4 as stored: skipped (built without kernels)\n"); }
static void test_sample_queue(void) { printf("sampled steps queued: skipped (built without kernels)\n"); }
static void test_quant_launches(void) {
    printf("quantized launches: skipped (built without kernels)\n");
}
#endif

/* --- work for a quiet device ----------------------------------------------------------- */

typedef struct quiet_arg {
    pthread_t ran_on;
    int runs;
    bool fail;
} quiet_arg;

static atlas_status quiet_work(void *arg) {
    quiet_arg *q = arg;
    q->ran_on = pthread_self();
    q->runs++;
    return q->fail ? atlas_fail(ATLAS_ERR_RANGE, "quiet work failed on purpose") : ATLAS_OK;
}

typedef struct server {
    atlas_host *h;
    atomic_int stop, points, sleep_now, up;
    quiet_arg own; /* a quiet call made on the serving thread itself */
} server;

/* A serving thread: says it serves and offers a quiet point every millisecond; asked to
 * sleep, says it no longer serves and offers none. */
static void *server_main(void *arg) {
    server *sv = arg;
    atlas_host_serving(sv->h, true);
    CHECK_OK(atlas_host_quiet_call(sv->h, quiet_work, &sv->own)); /* runs here, at once */
    atomic_store(&sv->up, 1);
    while (!atomic_load(&sv->stop)) {
        if (atomic_load(&sv->sleep_now)) {
            atlas_host_serving(sv->h, false);
            usleep(1000);
            continue;
        }
        atlas_host_serving(sv->h, true);
        if (atlas_host_quiet_wanted(sv->h)) atomic_fetch_add(&sv->points, 1);
        atlas_host_quiet_point(sv->h);
        usleep(1000);
    }
    atlas_host_serving(sv->h, false);
    return NULL;
}

static void test_quiet(atlas_host *h) {
    quiet_arg q = {0};
    CHECK_OK(atlas_host_quiet_call(h, quiet_work, &q)); /* nothing serves: here */
    CHECK(q.runs == 1 && pthread_equal(q.ran_on, pthread_self()));
    server sv = {.h = h};
    pthread_t t;
    if (pthread_create(&t, NULL, server_main, &sv) != 0) {
        CHECK_MSG(0, "pthread_create");
        return;
    }
    while (!atomic_load(&sv.up)) usleep(100);
    q = (quiet_arg){0};
    CHECK_OK(atlas_host_quiet_call(h, quiet_work, &q));
    CHECK_MSG(q.runs == 1 && pthread_equal(q.ran_on, t) && atomic_load(&sv.points) >= 1,
              "quiet work ran %d times, %s the serving thread", q.runs,
              pthread_equal(q.ran_on, t) ? "on" : "not on");
    q = (quiet_arg){.fail = true};
    CHECK(atlas_host_quiet_call(h, quiet_work, &q) == ATLAS_ERR_RANGE);
    CHECK_MSG(strstr(atlas_last_error(), "on purpose") != NULL, "%s", atlas_last_error());
    CHECK(pthread_equal(q.ran_on, t));
    atomic_store(&sv.sleep_now, 1); /* asleep: the caller runs its work itself */
    usleep(20000);
    q = (quiet_arg){0};
    CHECK_OK(atlas_host_quiet_call(h, quiet_work, &q));
    CHECK(q.runs == 1 && pthread_equal(q.ran_on, pthread_self()));
    atomic_store(&sv.stop, 1);
    pthread_join(t, NULL);
    CHECK(sv.own.runs == 1 && pthread_equal(sv.own.ran_on, t));
    CHECK(!atlas_host_quiet_wanted(h));
}

int main(void) {
    CHECK_OK(fake_cuda_install(1));
    atlas_host *h = NULL;
    CHECK_OK(atlas_host_get(0, &h));
    char dir[512];
    CHECK(harness_mkdtemp(dir, sizeof dir, "upload"));
    if (!h || harness_failures) return harness_finish();
    test_quiet(h);
    test_backend(dir);
    test_quant_launches();
    test_int4_stored();
    test_sample_queue();
    harness_rm_rf(dir);
    return harness_finish();
}

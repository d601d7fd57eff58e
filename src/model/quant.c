/* model/quant.c — a quantized linear layer's tensors into a backend weight format
 * (model/quant.h). */
#include "model/quant.h"

#include <fnmatch.h>
#include <math.h>
#include <regex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/file.h"
#include "core/threadpool.h"

/* ---- the ignore list ----------------------------------------------------------------- */

static bool ignored(const atlas_quant_config *qc, const char *module) {
    for (int i = 0; i < qc->n_ignore; i++) {
        const char *e = qc->ignore[i];
        if (strncmp(e, "re:", 3) && strchr(e, '*')) { /* a glob (gpt-oss's "model.layers.*.
                                                        self_attn"): the module or a parent */
            char parent[160];
            snprintf(parent, sizeof parent, "%s.*", e);
            if (!fnmatch(e, module, 0) || !fnmatch(parent, module, 0)) return true;
            continue;
        }
        if (strncmp(e, "re:", 3)) {
            if (strstr(module, e)) return true;
            continue;
        }
        char full[160];
        snprintf(full, sizeof full, "^(%s)$", e + 3);
        regex_t re;
        if (regcomp(&re, full, REG_EXTENDED | REG_NOSUB)) continue; /* checked when parsed */
        bool hit = regexec(&re, module, 0, NULL, 0) == 0;
        regfree(&re);
        if (hit) return true;
    }
    return false;
}

/* ---- finding and checking the tensors ------------------------------------------------ */

typedef struct qfind {
    const atlas_st *st;
    const char *module;
    bool *used;
    size_t bytes;
    atlas_threadpool *pool; /* the reads and repacks split over its threads; NULL: this one */
} qfind;

/* fn over [0, n) on the pool's threads, or on this one without a pool. */
static void par(atlas_threadpool *pool, int64_t n, int64_t min_chunk, atlas_parallel_fn fn,
                void *ctx) {
    if (pool) atlas_threadpool_for(pool, n, min_chunk, fn, ctx);
    else if (n > 0) fn(ctx, 0, n, 0);
}

/* A pool worker (thread > 0) gives way to serving, as the host's loader threads do: a load
 * may run beside resident models (the caller's thread keeps its own priority). */
static void pool_worker(int thread) {
    if (thread > 0) atlas_thread_background();
}

static atlas_status shape_err(const atlas_tensor_view *v, const char *want) {
    char got[96] = "[";
    for (int i = 0; i < v->n_dims && i < 4; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "",
                 (long long)v->shape[i]);
    strncat(got, "]", sizeof got - strlen(got) - 1);
    return atlas_fail(ATLAS_ERR_FORMAT, "%s: tensor %s: shape %s %s, want %s",
                      v->file ? v->file : "?", v->name, got, atlas_dtype_name(v->dtype), want);
}

/* module.suffix, which must exist with one of the dtypes (mask of 1 << dtype) and, when
 * n_dims > 0, that shape (a dimension of -1 matches any). */
static atlas_status need(qfind *f, const char *suffix, unsigned dtypes, int n_dims,
                         int64_t d0, int64_t d1, const atlas_tensor_view **out) {
    char name[256];
    snprintf(name, sizeof name, "%s.%s", f->module, suffix);
    const atlas_tensor_view *v = atlas_st_find(f->st, name);
    if (!v)
        return atlas_fail(ATLAS_ERR_NOT_FOUND, "tensor %s: missing from the checkpoint (its "
                          "quantization_config stores %s quantized)", name, f->module);
    char want[96];
    snprintf(want, sizeof want, "[%lld, %lld]", (long long)d0, (long long)d1);
    if (n_dims == 1) snprintf(want, sizeof want, "[%lld]", (long long)d0);
    if (!((dtypes >> v->dtype) & 1u) || (n_dims && v->n_dims != n_dims) ||
        (n_dims >= 1 && d0 >= 0 && v->shape[0] != d0) ||
        (n_dims >= 2 && d1 >= 0 && v->shape[1] != d1))
        return shape_err(v, want);
    size_t i = atlas_st_index(f->st, v);
    if (f->used && i < atlas_st_count(f->st)) f->used[i] = true;
    f->bytes += v->nbytes;
    *out = v;
    return ATLAS_OK;
}

#define FLOATS ((1u << ATLAS_DTYPE_F32) | (1u << ATLAS_DTYPE_BF16) | (1u << ATLAS_DTYPE_F16))
#define INT32 (1u << ATLAS_DTYPE_I32)

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

static atlas_status read_view(const atlas_tensor_view *v, void *dst) {
    if (v->fd >= 0) return atlas_file_read_at(v->fd, dst, v->nbytes, v->file_offset);
    memcpy(dst, v->data, v->nbytes);
    return ATLAS_OK;
}

/* The first error of a job split over a pool's threads, kept for the caller. */
typedef struct par_err {
    atomic_flag failed;
    atomic_bool set;
    atlas_status st;
    char msg[512];
} par_err;

static void par_fail(par_err *e, atlas_status st) {
    if (atomic_flag_test_and_set(&e->failed)) return;
    e->st = st;
    snprintf(e->msg, sizeof e->msg, "%s", atlas_last_error());
    atomic_store(&e->set, true);
}

static bool par_failed(par_err *e) { return atomic_load(&e->set); }

static atlas_status par_result(par_err *e) {
    return par_failed(e) ? atlas_fail(e->st, "%s", e->msg) : ATLAS_OK;
}

/* A tensor read in pieces by the pool's threads: a fresh buffer's pages are zeroed by the
 * kernel on first touch, and one thread zeroing, copying and repacking held an 8B INT4 load
 * to 1.4 GB/s (bench/RESULTS.md). */
enum { READ_PIECE = 4 << 20 };
typedef struct par_read {
    const atlas_tensor_view *v;
    char *dst;
    par_err err;
} par_read;

static void read_pieces(void *ctx, int64_t b, int64_t e, int thread) {
    pool_worker(thread);
    par_read *r = ctx;
    const atlas_tensor_view *v = r->v;
    size_t lo = (size_t)b * READ_PIECE, hi = (size_t)e * READ_PIECE;
    if (hi > v->nbytes) hi = v->nbytes;
    if (v->fd < 0) {
        memcpy(r->dst + lo, (const char *)v->data + lo, hi - lo);
        return;
    }
    atlas_status st = atlas_file_read_at(v->fd, r->dst + lo, hi - lo, v->file_offset + lo);
    if (st != ATLAS_OK) par_fail(&r->err, st);
}

static atlas_status read_view_par(atlas_threadpool *pool, const atlas_tensor_view *v, void *dst) {
    if (!pool || v->nbytes < 2 * (size_t)READ_PIECE) return read_view(v, dst);
    par_read r = {.v = v, .dst = dst, .err = {.failed = ATOMIC_FLAG_INIT}};
    par(pool, (int64_t)((v->nbytes + READ_PIECE - 1) / READ_PIECE), 1, read_pieces, &r);
    return par_result(&r.err);
}

typedef struct to_floats {
    const void *raw;
    float *f;
    atlas_dtype dtype;
} to_floats;

static void floats_range(void *ctx, int64_t b, int64_t e, int thread) {
    pool_worker(thread);
    const to_floats *t = ctx;
    for (int64_t i = b; i < e; i++) {
        if (t->dtype == ATLAS_DTYPE_F32) memcpy(&t->f[i], (const char *)t->raw + 4 * i, 4);
        else if (t->dtype == ATLAS_DTYPE_BF16) t->f[i] = atlas_bf16_to_f32(((const uint16_t *)t->raw)[i]);
        else t->f[i] = atlas_f16_to_f32(((const uint16_t *)t->raw)[i]);
    }
}

/* A float tensor of n elements as float32 (owned; freed by the caller). */
static atlas_status read_floats(atlas_threadpool *pool, const atlas_tensor_view *v, size_t n,
                                float **out) {
    *out = NULL;
    void *raw = malloc(v->nbytes ? v->nbytes : 1);
    float *f = malloc((n ? n : 1) * sizeof *f);
    atlas_status st = raw && f ? read_view_par(pool, v, raw)
                               : atlas_fail(ATLAS_ERR_NOMEM, "out of memory");
    to_floats t = {raw, f, v->dtype};
    if (st == ATLAS_OK) par(pool, (int64_t)n, 1 << 16, floats_range, &t);
    free(raw);
    if (st != ATLAS_OK) {
        free(f);
        return atlas_fail_wrap(st, "reading %s", v->name);
    }
    *out = f;
    return ATLAS_OK;
}

static atlas_status read_ints(atlas_threadpool *pool, const atlas_tensor_view *v, int32_t **out) {
    *out = malloc(v->nbytes ? v->nbytes : 1);
    if (!*out) return atlas_fail(ATLAS_ERR_NOMEM, "reading %s: out of memory", v->name);
    atlas_status st = read_view_par(pool, v, *out);
    if (st != ATLAS_OK) {
        free(*out);
        *out = NULL;
        return atlas_fail_wrap(st, "reading %s", v->name);
    }
    return ATLAS_OK;
}

/* ---- FP8 ----------------------------------------------------------------------------- */

static atlas_status bind_fp8(qfind *f, const atlas_quant_config *qc, const atlas_tensor_view *w,
                             bool read, atlas_qweight *out) {
    int64_t rows = w->shape[0], cols = w->shape[1];
    const atlas_tensor_view *s = NULL;
    int64_t grow = 1, gcol = 1;
    atlas_wquant *q = &out->q;
    q->format = ATLAS_WFMT_FP8_E4M3;
    if (qc->strategy == ATLAS_QS_BLOCK) {
        grow = cdiv(rows, qc->block[0]);
        gcol = cdiv(cols, qc->block[1]);
        ATLAS_TRY(need(f, qc->method == ATLAS_QM_FP8 ? "weight_scale_inv" : "weight_scale",
                       FLOATS, 2, grow, gcol, &s));
        q->block_rows = qc->block[0];
        q->block_cols = qc->block[1];
    } else if (qc->strategy == ATLAS_QS_CHANNEL) {
        grow = rows;
        ATLAS_TRY(need(f, "weight_scale", FLOATS, 2, rows, 1, &s));
        q->block_rows = 1;
        q->block_cols = (int)cols;
    } else {
        ATLAS_TRY(need(f, "weight_scale", FLOATS, 0, 0, 0, &s));
        if (s->nbytes != atlas_dtype_size(s->dtype) || s->n_dims > 1)
            return shape_err(s, "[] or [1]");
        q->block_rows = (int)rows;
        q->block_cols = (int)cols;
    }
    q->scale_cols = (int)gcol;
    out->codes = w;
    if (qc->static_act) { /* checked and left unused: the matmul runs weight-only */
        const atlas_tensor_view *in;
        ATLAS_TRY(need(f, "input_scale", FLOATS, 0, 0, 0, &in));
        if (in->nbytes != atlas_dtype_size(in->dtype) || in->n_dims > 1)
            return shape_err(in, "[] or [1]");
    }
    if (read) ATLAS_TRY(read_floats(f->pool, s, (size_t)(grow * gcol), &out->scales));
    q->scales = out->scales;
    return ATLAS_OK;
}

/* ---- FP4 ----------------------------------------------------------------------------- */

/* MXFP4 (e8m0 scales per 32) and NVFP4 (e4m3 scales per 16 times or over a float32 global
 * scale): the codes stay as stored, each block's scale becomes one float32. */
static atlas_status bind_fp4(qfind *f, const atlas_quant_config *qc, int64_t rows, int64_t cols,
                             bool read, atlas_qweight *out) {
    int64_t bs = qc->group, groups = cols / (bs ? bs : 1);
    if (!bs || cols % bs)
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: %lld columns are not whole blocks of %lld",
                          f->module, (long long)cols, (long long)bs);
    const atlas_tensor_view *w, *s, *g = NULL, *in = NULL;
    bool mx = qc->method == ATLAS_QM_MXFP4, ct = qc->method == ATLAS_QM_CT_NVFP4;
    if (mx) {
        ATLAS_TRY(need(f, "weight_blocks", 1u << ATLAS_DTYPE_U8, 3, rows, groups, &w));
        if (w->shape[2] != 16) return shape_err(w, "[out, in/32, 16]");
        ATLAS_TRY(need(f, "weight_scales", 1u << ATLAS_DTYPE_U8, 2, rows, groups, &s));
    } else {
        ATLAS_TRY(need(f, ct ? "weight_packed" : "weight", 1u << ATLAS_DTYPE_U8, 2, rows,
                       cols / 2, &w));
        ATLAS_TRY(need(f, "weight_scale", 1u << ATLAS_DTYPE_F8_E4M3, 2, rows, groups, &s));
        ATLAS_TRY(need(f, ct ? "weight_global_scale" : "weight_scale_2", 1u << ATLAS_DTYPE_F32,
                       0, 0, 0, &g));
        if (g->nbytes != 4 || g->n_dims > 1) return shape_err(g, "[] or [1]");
        /* W4A4's activation scale: the CPU runs weight-only and leaves the activations be */
        char name[256];
        snprintf(name, sizeof name, "%s.%s", f->module, ct ? "input_global_scale" : "input_scale");
        if (atlas_st_find(f->st, name))
            ATLAS_TRY(need(f, ct ? "input_global_scale" : "input_scale", 1u << ATLAS_DTYPE_F32,
                           0, 0, 0, &in));
    }
    out->q = (atlas_wquant){.format = ATLAS_WFMT_FP4_E2M1, .block_rows = 1,
                            .block_cols = (int)bs, .scale_cols = (int)groups};
    out->codes = w;
    if (!read) return ATLAS_OK;
    size_t n = (size_t)(rows * groups);
    uint8_t *raw = malloc(n);
    out->scales = malloc(n * sizeof(float));
    float global = 1.0f;
    atlas_status st = raw && out->scales ? read_view(s, raw)
                                         : atlas_fail(ATLAS_ERR_NOMEM, "out of memory");
    if (st == ATLAS_OK && g) st = read_view(g, &global);
    if (st == ATLAS_OK && g && !(global > 0.0f && global < INFINITY))
        st = atlas_fail(ATLAS_ERR_FORMAT, "%s: global scale %g (want a positive number)",
                        g->name, (double)global);
    /* one float32 rounding, in the order the publishers' dequantizers compute it */
    for (size_t i = 0; st == ATLAS_OK && i < n; i++)
        out->scales[i] = mx ? atlas_e8m0_to_f32(raw[i])
                            : ct ? atlas_e4m3_to_f32(raw[i]) / global
                                 : atlas_e4m3_to_f32(raw[i]) * global;
    free(raw);
    out->q.scales = out->scales;
    out->q.global = mx ? 0.0f : ct ? 1.0f / global : global;
    return st == ATLAS_OK ? ATLAS_OK : atlas_fail_wrap(st, "reading %s", s->name);
}

/* ---- INT4 ---------------------------------------------------------------------------- */

/* One INT4 weight's repack, split over a pool's threads by output rows (each range its own
 * rows of the packed codes and of the grids), the codes read a piece at a time. */
typedef struct int4_job {
    const atlas_tensor_view *qwv; /* the codes, read a piece at a time (AWQ, GPTQ) */
    const int32_t *qw, *qz;       /* qw: compressed-tensors' codes, read whole */
    const float *s;  /* the checkpoint's scales [groups, rows] (AWQ, GPTQ), or NULL */
    atlas_qweight *o;
    float zero_add;  /* GPTQ's stored zero - 1 (1), else 0 */
    par_err err;
} int4_job;

/* The grids' rows [r0, r1): zeros from qz (row 8i+k in nibble nib[k] of word i of a group's
 * words, as AWQ and GPTQ store them: [groups, rows/8]) and the scales transposed from
 * [groups, rows] to [rows, groups]. */
static void grid_rows(const int4_job *j, const int *nib, int64_t r0, int64_t r1) {
    const atlas_qweight *o = j->o;
    int64_t rows = o->rows, groups = o->q.scale_cols, w8 = rows / 8;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t g = 0; g < groups; g++) {
            o->zeros[r * groups + g] =
                (float)(((uint32_t)j->qz[g * w8 + r / 8] >> (4 * nib[r % 8])) & 0xf) + j->zero_add;
            o->scales[r * groups + g] = j->s[g * rows + r];
        }
}

static const int AWQ_NIBBLE[8] = {0, 4, 1, 5, 2, 6, 3, 7}; /* column 8j+k is in nibble AWQ_NIBBLE[k] */
static const int PLAIN_NIBBLE[8] = {0, 1, 2, 3, 4, 5, 6, 7};

/* Stored rows [s0, s0 + ns) and words [w0, w1) of the codes (int32 [NS, W] as stored): a
 * pointer into a view of memory, or read into buf ([ns][w1 - w0]: one pread where the words
 * span whole rows, else one a row); *stride: the bytes from one stored row to the next. */
static const uint8_t *codes_block(int4_job *j, int64_t s0, int64_t ns, int64_t w0, int64_t w1,
                                  uint8_t *buf, size_t *stride) {
    const atlas_tensor_view *v = j->qwv;
    int64_t W = v->shape[1];
    size_t want = (size_t)(w1 - w0) * 4;
    if (v->fd < 0) {
        *stride = (size_t)W * 4;
        return (const uint8_t *)v->data + ((size_t)s0 * W + w0) * 4;
    }
    *stride = want;
    uint64_t at = v->file_offset + ((uint64_t)s0 * W + w0) * 4;
    bool whole = w0 == 0 && w1 == W;
    atlas_status st = whole ? atlas_file_read_at(v->fd, buf, (size_t)ns * want, at) : ATLAS_OK;
    for (int64_t r = 0; st == ATLAS_OK && !whole && r < ns; r++)
        st = atlas_file_read_at(v->fd, buf + r * want, want, at + (uint64_t)r * W * 4);
    if (st == ATLAS_OK) return buf;
    par_fail(&j->err, atlas_fail_wrap(st, "reading %s", v->name));
    return NULL;
}

/* A range of output rows takes its words [w0, w1) of every stored row, a piece of about
 * READ_PIECE (a multiple of `align` stored rows) at a time, each handed to fn(job, first
 * stored row, rows, w0, w1, bytes, stride); each range writes its own rows of the output
 * alone. The whole tensor read into fresh memory had the kernel zero every page of it on
 * each load; a piece's buffer is freed and malloc'd again at about the same size, which
 * glibc serves from the memory just freed. */
typedef void (*piece_fn)(int4_job *j, int64_t s0, int64_t n, int64_t w0, int64_t w1,
                         const uint8_t *bytes, size_t stride);
static void pieces(int4_job *j, int64_t w0, int64_t w1, int align, piece_fn fn) {
    const atlas_tensor_view *v = j->qwv;
    int64_t NS = v->shape[0];
    int64_t per = (int64_t)(READ_PIECE / ((size_t)(w1 - w0) * 4)) / align * align;
    if (per < align) per = align;
    uint8_t *buf = v->fd >= 0 ? malloc((size_t)per * (w1 - w0) * 4) : NULL;
    if (v->fd >= 0 && !buf) {
        par_fail(&j->err, atlas_fail(ATLAS_ERR_NOMEM, "reading %s: out of memory", v->name));
        return;
    }
    for (int64_t s = 0; s < NS && !par_failed(&j->err); s += per) {
        int64_t n = NS - s < per ? NS - s : per;
        size_t stride;
        const uint8_t *p = codes_block(j, s, n, w0, w1, buf, &stride);
        if (p) fn(j, s, n, w0, w1, p, stride);
    }
    free(buf);
}

/* AWQ gemm: qweight [in, out/8], qzeros [in/g, out/8] in AWQ's order, scales [in/g, out].
 * A piece: input columns [c0, c0 + n) (stored rows), words [w0, w1) (output rows 8 w0 ..
 * 8 w1); a byte of the output is two input columns' nibbles of one word each. Blocks of 64
 * columns x 16 words are copied out first and each output row's 32 bytes then written
 * together: walked directly, the reads a stored row apart and the single-byte writes fell
 * in a few cache sets (an 8B AWQ loaded in 6.8 s against GPTQ's 4.1 on an H100 box). */
static void awq_piece(int4_job *jb, int64_t c0, int64_t n, int64_t w0, int64_t w1,
                      const uint8_t *bytes, size_t stride) {
    int64_t half = jb->o->cols / 2;
    uint8_t *p = jb->o->packed;
    uint32_t blk[64][16];
    for (int64_t t0 = 0; t0 < n; t0 += 64)
        for (int64_t j0 = w0; j0 < w1; j0 += 16) {
            int nt = n - t0 < 64 ? (int)(n - t0) : 64, nj = w1 - j0 < 16 ? (int)(w1 - j0) : 16;
            for (int t = 0; t < nt; t++)
                memcpy(blk[t], bytes + (t0 + t) * stride + (j0 - w0) * 4, 4 * nj);
            for (int j = 0; j < nj; j++)
                for (int k = 0; k < 8; k++) {
                    uint8_t *dst = p + (8 * (j0 + j) + k) * half + (c0 + t0) / 2;
                    int sh = 4 * AWQ_NIBBLE[k];
                    for (int t = 0; t < nt; t += 2)
                        dst[t / 2] = (uint8_t)(((blk[t][j] >> sh) & 0xf) |
                                               ((blk[t + 1][j] >> sh) & 0xf) << 4);
                }
        }
}

/* Items: words of a stored row (8 output rows each): the codes, then those rows' grids. */
static void awq_range(void *ctx, int64_t b, int64_t e, int thread) {
    pool_worker(thread);
    int4_job *jb = ctx;
    pieces(jb, b, e, 2, awq_piece);
    grid_rows(jb, AWQ_NIBBLE, 8 * b, 8 * e);
}

/* GPTQ: qweight [in/8, out] (input 8i+k in nibble k), qzeros [groups, out/8] (output 8j+k in
 * nibble k), zero - 1 stored unless v2. A piece: words [j0, j0 + n) (stored rows) of output
 * rows [r0, r1); row r's 8 columns from word j are that word's 4 bytes as they are (column
 * 8j + k in nibble k, as atlas packs): a transpose of 32-bit words, a block of 16 x 16 (a
 * cache line each way) at a time, since the stored rows are a power of two apart and walked
 * across they fell in one cache set. */
static void gptq_piece(int4_job *jb, int64_t j0, int64_t n, int64_t r0, int64_t r1,
                       const uint8_t *bytes, size_t stride) {
    int64_t half = jb->o->cols / 2;
    uint8_t *p = jb->o->packed;
    uint32_t blk[16][16];
    for (int64_t jb0 = 0; jb0 < n; jb0 += 16)
        for (int64_t rb = r0; rb < r1; rb += 16) {
            int nj = n - jb0 < 16 ? (int)(n - jb0) : 16, nr = r1 - rb < 16 ? (int)(r1 - rb) : 16;
            for (int j = 0; j < nj; j++)
                memcpy(blk[j], bytes + (jb0 + j) * stride + (rb - r0) * 4, 4 * nr);
            for (int r = 0; r < nr; r++) {
                uint32_t row[16];
                for (int j = 0; j < nj; j++) row[j] = blk[j][r];
                memcpy(p + (rb + r) * half + 4 * (j0 + jb0), row, 4 * nj);
            }
        }
}

/* Items: output rows: the codes, then the rows' grids. */
static void gptq_range(void *ctx, int64_t b, int64_t e, int thread) {
    pool_worker(thread);
    int4_job *jb = ctx;
    pieces(jb, b, e, 1, gptq_piece);
    grid_rows(jb, PLAIN_NIBBLE, b, e);
}

/* AWQ's or GPTQ's codes (read from qwv), zeros and scales (s: [groups, rows]) into o's
 * layout, split over the pool by output rows. */
static atlas_status repack_int4(atlas_threadpool *pool, bool awq, const atlas_tensor_view *qwv,
                                const int32_t *qz, const float *s, bool v2, atlas_qweight *o) {
    o->zeros = malloc((size_t)(o->rows * o->q.scale_cols) * sizeof *o->zeros);
    if (!o->zeros) return atlas_fail(ATLAS_ERR_NOMEM, "out of memory");
    int4_job j = {.qwv = qwv, .qz = qz, .s = s, .o = o, .zero_add = awq || v2 ? 0.0f : 1.0f,
                  .err = {.failed = ATOMIC_FLAG_INIT}};
    if (awq) par(pool, o->rows / 8, 8, awq_range, &j);
    else par(pool, o->rows, 64, gptq_range, &j);
    return par_result(&j.err);
}

/* compressed-tensors pack-quantized: weight_packed [out, ceil(in/8)] (column 8j+k in nibble
 * k), weight_zero_point [ceil(out/8), groups] (row 8i+k in nibble k); both store the signed
 * 4-bit value plus 8, so w = (q - z) * s reads the nibbles as they are, and a symmetric
 * layout's zero is 8. Items: output rows. */
static void ct_range(void *ctx, int64_t b, int64_t e, int thread) {
    pool_worker(thread);
    const int4_job *jb = ctx;
    const atlas_qweight *o = jb->o;
    int64_t cols = o->cols, groups = o->q.scale_cols, wpr = cdiv(cols, 8);
    uint8_t *p = o->packed;
    /* the same nibble order as atlas's: each row's bytes as they are, its last word cut
     * short (cols not a multiple of 8: jb->qw; otherwise the codes are the view) */
    for (int64_t r = b; r < e; r++) {
        if (jb->qw) memcpy(p + r * (cols / 2), jb->qw + r * wpr, (size_t)cols / 2);
        for (int64_t g = 0; g < groups; g++)
            o->zeros[r * groups + g] =
                jb->qz ? (float)(((uint32_t)jb->qz[(r / 8) * groups + g] >> (4 * (r % 8))) & 0xf)
                       : 8.0f;
    }
}

/* A g_idx out of range is refused; one in the plain i / group order is dropped (the tile
 * reads groups in order). Then the grids are handed to the weight format. */
static atlas_status check_g_idx(const atlas_tensor_view *gi, int64_t group, atlas_qweight *out) {
    int64_t groups = out->q.scale_cols;
    bool plain = true;
    for (int64_t i = 0; out->g_idx && i < out->cols; i++) {
        if (out->g_idx[i] < 0 || out->g_idx[i] >= groups)
            return atlas_fail(ATLAS_ERR_FORMAT, "%s[%lld] = %d is not a group (0..%lld)",
                              gi->name, (long long)i, out->g_idx[i], (long long)groups - 1);
        plain &= out->g_idx[i] == i / group;
    }
    if (out->g_idx && plain) {
        free(out->g_idx);
        out->g_idx = NULL;
    }
    out->q.scales = out->scales;
    out->q.zeros = out->zeros;
    out->q.g_idx = out->g_idx;
    return ATLAS_OK;
}

static atlas_status bind_int4(qfind *f, const atlas_quant_config *qc, int64_t rows,
                              int64_t cols, bool read, bool stored, atlas_qweight *out) {
    bool awq = qc->method == ATLAS_QM_AWQ;
    int64_t group = qc->group ? qc->group : cols;
    if (rows % 8 || cols % 8 || cols % group)
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: [%lld, %lld] does not pack into 4-bit words "
                          "in groups of %lld (rows and columns multiples of 8, columns of "
                          "the group)", f->module, (long long)rows, (long long)cols,
                          (long long)group);
    int64_t groups = cols / group;
    const atlas_tensor_view *qw, *qz, *sc, *gi = NULL;
    ATLAS_TRY(need(f, "qweight", INT32, 2, awq ? cols : cols / 8, awq ? rows / 8 : rows, &qw));
    ATLAS_TRY(need(f, "qzeros", INT32, 2, groups, rows / 8, &qz));
    ATLAS_TRY(need(f, "scales", FLOATS, 2, groups, rows, &sc));
    char gname[256];
    snprintf(gname, sizeof gname, "%s.g_idx", f->module);
    if (!awq && atlas_st_find(f->st, gname)) ATLAS_TRY(need(f, "g_idx", INT32, 1, cols, 0, &gi));
    out->q = (atlas_wquant){.format = ATLAS_WFMT_INT4, .block_rows = 1, .block_cols = (int)group,
                            .scale_cols = (int)groups};
    out->act_order = gi && qc->desc_act;
    if (!read) return ATLAS_OK;
    if (stored) { /* the backend repacks: the views handed on, the small g_idx checked here */
        out->codes = qw;
        out->stored_scales = sc;
        out->stored_zeros = qz;
        out->q.order = awq ? ATLAS_INT4_AWQ : ATLAS_INT4_GPTQ;
        out->q.zero_add = awq || qc->gptq_v2 ? 0.0f : 1.0f;
        out->packed_bytes = qw->nbytes;
        atlas_status st = gi ? read_ints(f->pool, gi, &out->g_idx) : ATLAS_OK;
        return st == ATLAS_OK ? check_g_idx(gi, group, out) : st;
    }
    int32_t *z = NULL;
    float *s = NULL;
    out->packed_bytes = (size_t)(rows * cols / 2);
    out->packed = malloc(out->packed_bytes);
    out->scales = malloc((size_t)(rows * groups) * sizeof(float));
    atlas_status st = out->packed && out->scales ? ATLAS_OK
                                                 : atlas_fail(ATLAS_ERR_NOMEM, "out of memory");
    if (st == ATLAS_OK) st = read_ints(f->pool, qz, &z);
    if (st == ATLAS_OK) st = read_floats(f->pool, sc, (size_t)(rows * groups), &s);
    if (st == ATLAS_OK && gi) st = read_ints(f->pool, gi, &out->g_idx);
    if (st == ATLAS_OK) st = repack_int4(f->pool, awq, qw, z, s, qc->gptq_v2, out);
    if (st == ATLAS_OK) st = check_g_idx(gi, group, out);
    free(z);
    free(s);
    return st;
}

/* compressed-tensors pack-quantized (repack_ct): weight_packed, weight_scale [out, groups],
 * weight_zero_point unless symmetric, weight_shape [2] = [out, in], weight_g_idx (actorder
 * group). */
static atlas_status bind_ct_int4(qfind *f, const atlas_quant_config *qc, int64_t rows,
                                 int64_t cols, bool read, atlas_qweight *out) {
    int64_t group = qc->group ? qc->group : cols;
    if (cols % 2 || cols % group)
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: %lld columns are not whole groups of %lld "
                          "(an even number)", f->module, (long long)cols, (long long)group);
    int64_t groups = cols / group;
    const atlas_tensor_view *qw, *sc, *shape, *qz = NULL, *gi = NULL;
    ATLAS_TRY(need(f, "weight_packed", INT32, 2, rows, cdiv(cols, 8), &qw));
    ATLAS_TRY(need(f, "weight_scale", FLOATS, 2, rows, groups, &sc));
    ATLAS_TRY(need(f, "weight_shape", INT32 | (1u << ATLAS_DTYPE_I64), 1, 2, 0, &shape));
    if (!qc->symmetric)
        ATLAS_TRY(need(f, "weight_zero_point", INT32, 2, cdiv(rows, 8), groups, &qz));
    char gname[256];
    snprintf(gname, sizeof gname, "%s.weight_g_idx", f->module);
    if (atlas_st_find(f->st, gname)) ATLAS_TRY(need(f, "weight_g_idx", INT32, 1, cols, 0, &gi));
    out->q = (atlas_wquant){.format = ATLAS_WFMT_INT4, .block_rows = 1, .block_cols = (int)group,
                            .scale_cols = (int)groups};
    out->act_order = gi && qc->desc_act;
    if (!read) return ATLAS_OK;
    int64_t dims[2] = {0, 0};
    int32_t *w = NULL, *z = NULL;
    /* whole words a row: the stored rows are atlas's packed rows, handed on as they are (the
     * backend reads them through the view, as FP8's codes); else repacked, each row cut short */
    bool whole = cols % 8 == 0;
    out->packed_bytes = (size_t)(rows * cols / 2);
    out->packed = whole ? NULL : malloc(out->packed_bytes);
    out->zeros = malloc((size_t)(rows * groups) * sizeof(float));
    atlas_status st = (whole || out->packed) && out->zeros
                          ? read_view(shape, dims)
                          : atlas_fail(ATLAS_ERR_NOMEM, "out of memory");
    if (st == ATLAS_OK && shape->dtype == ATLAS_DTYPE_I32) {
        int32_t d32[2];
        memcpy(d32, dims, sizeof d32);
        dims[0] = d32[0], dims[1] = d32[1];
    }
    if (st == ATLAS_OK && (dims[0] != rows || dims[1] != cols))
        st = atlas_fail(ATLAS_ERR_FORMAT, "%s: weight_shape [%lld, %lld], but the model's %s is "
                        "[%lld, %lld]", shape->name, (long long)dims[0], (long long)dims[1],
                        f->module, (long long)rows, (long long)cols);
    if (st == ATLAS_OK && !whole) st = read_ints(f->pool, qw, &w);
    if (whole) out->codes = qw;
    if (st == ATLAS_OK && qz) st = read_ints(f->pool, qz, &z);
    if (st == ATLAS_OK) st = read_floats(f->pool, sc, (size_t)(rows * groups), &out->scales);
    if (st == ATLAS_OK && gi) st = read_ints(f->pool, gi, &out->g_idx);
    if (st == ATLAS_OK) {
        int4_job j = {.qw = w, .qz = z, .o = out};
        par(f->pool, rows, 256, ct_range, &j);
    }
    if (st == ATLAS_OK) st = check_g_idx(gi, group, out);
    free(w);
    free(z);
    return st;
}

/* ---- binding ------------------------------------------------------------------------- */

atlas_status atlas_quant_bind(const atlas_st *st, const atlas_quant_config *qc,
                              const char *module, int64_t rows, int64_t cols, bool read,
                              bool int4_stored, bool *used, atlas_threadpool *pool,
                              atlas_qweight *out) {
    memset(out, 0, sizeof *out);
    out->rows = rows;
    out->cols = cols;
    if (qc->method == ATLAS_QM_NONE) return ATLAS_OK;
    char name[256];
    bool ct4 = qc->method == ATLAS_QM_CT_INT4;
    bool int4 = qc->method == ATLAS_QM_AWQ || qc->method == ATLAS_QM_GPTQ || ct4;
    bool fp4 = qc->method == ATLAS_QM_MXFP4 || qc->method == ATLAS_QM_NVFP4 ||
               qc->method == ATLAS_QM_CT_NVFP4;
    const char *head = ct4 ? "weight_packed" : int4 ? "qweight"
                       : qc->method == ATLAS_QM_MXFP4 ? "weight_blocks"
                       : qc->method == ATLAS_QM_CT_NVFP4 ? "weight_packed" : "weight";
    snprintf(name, sizeof name, "%s.%s", module, head);
    const atlas_tensor_view *w = atlas_st_find(st, name);
    bool quantized = int4 || (fp4 && strcmp(head, "weight")) ? w != NULL
                     : fp4 ? (w && w->dtype == ATLAS_DTYPE_U8)
                           : (w && w->dtype == ATLAS_DTYPE_F8_E4M3);
    bool skip = ignored(qc, module);
    if (quantized && skip)
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: tensor %s is quantized, but "
                          "quantization_config's ignore list names %s", w->file, name, module);
    if (!quantized) {
        /* the output head is quantized only where the checkpoint says so (transformers leaves
         * lm_head alone unless asked); a decoder layer's linear the config does not ignore
         * must be quantized */
        snprintf(name, sizeof name, "%s.weight", module);
        if (!skip && strcmp(module, "lm_head") && atlas_st_find(st, name))
            return atlas_fail(ATLAS_ERR_FORMAT, "tensor %s: stored unquantized, but "
                              "quantization_config quantizes %s (it is not in its ignore list)",
                              name, module);
        return ATLAS_OK; /* dense: the caller finds module.weight */
    }
    qfind f = {st, module, used, 0, pool};
    out->quantized = true;
    atlas_status s;
    if (ct4) {
        s = bind_ct_int4(&f, qc, rows, cols, read, out);
    } else if (int4) {
        s = bind_int4(&f, qc, rows, cols, read, int4_stored, out);
    } else if (fp4) {
        s = bind_fp4(&f, qc, rows, cols, read, out);
    } else {
        s = need(&f, "weight", 1u << ATLAS_DTYPE_F8_E4M3, 2, rows, cols, &w);
        if (s == ATLAS_OK) s = bind_fp8(&f, qc, w, read, out);
    }
    out->file_bytes = f.bytes;
    if (s != ATLAS_OK) atlas_qweight_free(out);
    return s;
}

atlas_status atlas_quant_fuse(atlas_qweight *parts, int n) {
    if (n < 2) return ATLAS_OK;
    for (int i = 0; i < n; i++) {
        atlas_qweight *p = &parts[i];
        if (p->quantized != parts[0].quantized || p->q.format != parts[0].q.format)
            return atlas_fail(ATLAS_ERR_FORMAT, "fused weight: part %d is stored %s, part 0 %s "
                              "(one format a fused weight)", i,
                              p->quantized ? atlas_wformat_name(p->q.format) : "unquantized",
                              parts[0].quantized ? atlas_wformat_name(parts[0].q.format)
                                                 : "unquantized");
        if (!p->quantized || p->q.format != ATLAS_WFMT_FP8_E4M3 || p->q.block_rows != p->rows ||
            p->q.block_cols != p->cols || p->rows == 1)
            continue;
        /* per-tensor -> per-channel: the same scale on every row, exactly */
        float *ch = p->scales ? malloc((size_t)p->rows * sizeof *ch) : NULL;
        if (p->scales && !ch) return atlas_fail(ATLAS_ERR_NOMEM, "out of memory");
        for (int64_t r = 0; ch && r < p->rows; r++) ch[r] = p->scales[0];
        if (ch) {
            free(p->scales);
            p->scales = ch;
        }
        p->q.block_rows = 1;
        p->q.scales = p->scales;
    }
    return ATLAS_OK;
}

bool atlas_quant_concatenable(const atlas_qweight *parts, int n) {
    for (int i = 0; i < n; i++) {
        const atlas_wquant *q = &parts[i].q;
        if (!parts[i].quantized) continue;
        if (q->block_rows != parts[0].q.block_rows || q->block_cols != parts[0].q.block_cols ||
            q->scale_cols != parts[0].q.scale_cols || (i < n - 1 && parts[i].rows % q->block_rows))
            return false;
    }
    return true;
}

void atlas_qweight_free(atlas_qweight *w) {
    if (!w) return;
    free(w->packed);
    free(w->scales);
    free(w->zeros);
    free(w->g_idx);
    memset(w, 0, sizeof *w);
}

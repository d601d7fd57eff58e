/* model/experts_oss.c — see experts_oss.h. */
#include "model/experts_oss.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/file.h"

static const char *const PART_NAME[ATLAS_OSS_N] = {"gate_up_proj", "gate_up_proj_bias",
                                                    "down_proj", "down_proj_bias"};

static bool is_float(atlas_dtype t) {
    return t == ATLAS_DTYPE_BF16 || t == ATLAS_DTYPE_F16 || t == ATLAS_DTYPE_F32;
}

/* Tensor pre + "layers.L.mlp.experts." + name, of n dims shape[] and a float dtype (u8: U8);
 * used marked. */
static atlas_status need(const atlas_st *st, const char *pre, int layer, const char *name,
                         int n, const int64_t *shape, bool u8, bool *used,
                         const atlas_tensor_view **out) {
    char full[200];
    snprintf(full, sizeof full, "%slayers.%d.mlp.experts.%s", pre, layer, name);
    const atlas_tensor_view *v = atlas_st_find(st, full);
    if (!v) return atlas_fail(ATLAS_ERR_NOT_FOUND, "tensor %s: missing from the checkpoint", full);
    if (used) used[atlas_st_index(st, v)] = true;
    bool ok = v->n_dims == n && (u8 ? v->dtype == ATLAS_DTYPE_U8 : is_float(v->dtype));
    for (int i = 0; ok && i < n; i++) ok = v->shape[i] == shape[i];
    if (ok) {
        *out = v;
        return ATLAS_OK;
    }
    char want[96] = "[", got[96] = "[";
    for (int i = 0; i < n; i++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? ", " : "",
                 (long long)shape[i]);
    for (int i = 0; i < v->n_dims && i < 6; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "",
                 (long long)v->shape[i]);
    return atlas_fail(ATLAS_ERR_FORMAT, "%s: tensor %s: %s %s], want %s %s] (gpt-oss's "
                      "stacked experts)", v->file ? v->file : "?", full,
                      atlas_dtype_name(v->dtype), got, u8 ? "U8" : "a float", want);
}

/* Part p's matrix: [out, in] = [2f, d] for gate_up, [d, f] for down. */
static void dims_of(const atlas_oss_experts *x, int p, int64_t *out, int64_t *in) {
    *out = p == ATLAS_OSS_GATE_UP ? 2 * x->f : x->d;
    *in = p == ATLAS_OSS_GATE_UP ? x->d : x->f;
}

static atlas_status find_matrix(const atlas_st *st, const char *pre, int layer, int p,
                                bool *used, atlas_oss_experts *x) {
    int64_t E = x->E, out, in;
    dims_of(x, p, &out, &in);
    char name[64];
    if (!x->mxfp4) { /* [E, in, out]: x @ W */
        int64_t shape[3] = {E, in, out};
        ATLAS_TRY(need(st, pre, layer, PART_NAME[p], 3, shape, false, used, &x->v[p]));
        x->file_bytes[p] = x->v[p]->nbytes;
        snprintf(x->format[p], sizeof x->format[p], "%s", atlas_dtype_name(x->v[p]->dtype));
    } else {
        if (in % 32)
            return atlas_fail(ATLAS_ERR_FORMAT, "%slayers.%d.mlp.experts.%s_blocks: %lld input "
                              "columns are not whole MXFP4 blocks of 32", pre, layer,
                              PART_NAME[p], (long long)in);
        int64_t blocks[4] = {E, out, in / 32, 16}, scales[3] = {E, out, in / 32};
        snprintf(name, sizeof name, "%s_blocks", PART_NAME[p]);
        ATLAS_TRY(need(st, pre, layer, name, 4, blocks, true, used, &x->v[p]));
        snprintf(name, sizeof name, "%s_scales", PART_NAME[p]);
        ATLAS_TRY(need(st, pre, layer, name, 3, scales, true, used, &x->scales[p]));
        x->file_bytes[p] = x->v[p]->nbytes + x->scales[p]->nbytes;
        snprintf(x->format[p], sizeof x->format[p], "MXFP4 e2m1 group 32");
    }
    x->params[p] = E * out * in;
    return ATLAS_OK;
}

atlas_status atlas_oss_experts_find(const atlas_st *st, const atlas_config *cfg,
                                    const char *pre, int layer, bool *used,
                                    atlas_oss_experts *out) {
    memset(out, 0, sizeof *out);
    out->E = cfg->n_experts, out->d = cfg->hidden, out->f = cfg->expert_ffn;
    char name[200];
    snprintf(name, sizeof name, "%slayers.%d.mlp.experts.gate_up_proj_blocks", pre, layer);
    out->mxfp4 = atlas_st_find(st, name) != NULL;
    if (out->mxfp4 && cfg->quant.method != ATLAS_QM_MXFP4)
        return atlas_fail(ATLAS_ERR_FORMAT, "tensor %s: MXFP4 experts, but config.json's "
                          "quantization_config does not say quant_method mxfp4", name);
    ATLAS_TRY(find_matrix(st, pre, layer, ATLAS_OSS_GATE_UP, used, out));
    ATLAS_TRY(find_matrix(st, pre, layer, ATLAS_OSS_DOWN, used, out));
    int64_t gub[2] = {out->E, 2 * out->f}, dnb[2] = {out->E, out->d};
    const int64_t *bias_shape[2] = {gub, dnb};
    for (int i = 0; i < 2; i++) {
        int p = i ? ATLAS_OSS_DOWN_BIAS : ATLAS_OSS_GATE_UP_BIAS;
        ATLAS_TRY(need(st, pre, layer, PART_NAME[p], 2, bias_shape[i], false, used, &out->v[p]));
        out->file_bytes[p] = out->v[p]->nbytes;
        out->params[p] = bias_shape[i][0] * bias_shape[i][1];
        snprintf(out->format[p], sizeof out->format[p], "%s", atlas_dtype_name(out->v[p]->dtype));
    }
    return ATLAS_OK;
}

/* Bytes [off, off + n) of v's data, read with pread (or copied: an in-memory checkpoint). */
static atlas_status read_at(const atlas_tensor_view *v, void *dst, size_t off, size_t n) {
    if (v->fd >= 0) return atlas_file_read_at(v->fd, dst, n, v->file_offset + off);
    memcpy(dst, (const char *)v->data + off, n);
    return ATLAS_OK;
}

/* gate_up's output row r of atlas's layout (gate rows, then up rows) is the published row
 * (or column) 2r, or 2(r - f) + 1. */
static int64_t interleaved(int64_t r, int64_t f) { return r < f ? 2 * r : 2 * (r - f) + 1; }

/* A dense expert [in, out] (slab) into dst [out, in], gate_up's rows de-interleaved. */
static void transpose(const char *slab, char *dst, int64_t in, int64_t out, size_t es,
                      int64_t f, bool gate_up) {
    for (int64_t r = 0; r < out; r++) {
        int64_t c = gate_up ? interleaved(r, f) : r;
        for (int64_t i = 0; i < in; i++)
            memcpy(dst + ((size_t)r * in + i) * es, slab + ((size_t)i * out + c) * es, es);
    }
}

/* Part p's matrices, one expert's slab at a time. */
static atlas_status read_matrix(atlas_oss_experts *x, int p) {
    int64_t out, in;
    dims_of(x, p, &out, &in);
    bool gu = p == ATLAS_OSS_GATE_UP;
    const atlas_tensor_view *v = x->v[p];
    size_t slab = v->nbytes / (size_t)x->E, es = x->mxfp4 ? 1 : atlas_dtype_size(v->dtype);
    size_t row = x->mxfp4 ? (size_t)in / 2 : 0, srow = (size_t)in / 32; /* MXFP4's bytes */
    char *tmp = malloc(slab ? slab : 1);
    uint8_t *raw = x->mxfp4 ? malloc((size_t)(out * in / 32)) : NULL;
    x->bytes[p] = malloc(v->nbytes ? v->nbytes : 1);
    if (x->mxfp4) x->fscales[p] = malloc((size_t)(x->E * out * in / 32) * sizeof(float));
    atlas_status st = tmp && x->bytes[p] && (!x->mxfp4 || (raw && x->fscales[p]))
                          ? ATLAS_OK : atlas_fail(ATLAS_ERR_NOMEM, "%s: out of memory", v->name);
    for (int e = 0; st == ATLAS_OK && e < x->E; e++) {
        char *dst = (char *)x->bytes[p] + (size_t)e * slab;
        st = read_at(v, tmp, (size_t)e * slab, slab);
        if (st == ATLAS_OK && !x->mxfp4) {
            transpose(tmp, dst, in, out, es, x->f, gu);
            continue;
        }
        if (st == ATLAS_OK) st = read_at(x->scales[p], raw, (size_t)e * out * srow, out * srow);
        float *fs = x->fscales[p] + (size_t)e * out * srow;
        for (int64_t r = 0; st == ATLAS_OK && r < out; r++) {
            int64_t s = gu ? interleaved(r, x->f) : r;
            memcpy(dst + r * row, tmp + s * row, row);
            for (size_t g = 0; g < srow; g++) fs[r * srow + g] = atlas_e8m0_to_f32(raw[s * srow + g]);
        }
    }
    free(tmp), free(raw);
    return st == ATLAS_OK ? ATLAS_OK : atlas_fail_wrap(st, "reading %s", v->name);
}

static atlas_status read_bias(atlas_oss_experts *x, int p) {
    const atlas_tensor_view *v = x->v[p];
    size_t es = atlas_dtype_size(v->dtype), n = (size_t)v->shape[1];
    char *raw = malloc(v->nbytes ? v->nbytes : 1);
    x->bytes[p] = malloc(v->nbytes ? v->nbytes : 1);
    atlas_status st = raw && x->bytes[p] ? read_at(v, raw, 0, v->nbytes)
                                         : atlas_fail(ATLAS_ERR_NOMEM, "%s: out of memory",
                                                      v->name);
    for (int e = 0; st == ATLAS_OK && e < x->E; e++)
        for (size_t r = 0; r < n; r++) {
            size_t s = p == ATLAS_OSS_GATE_UP_BIAS ? (size_t)interleaved((int64_t)r, x->f) : r;
            memcpy((char *)x->bytes[p] + ((size_t)e * n + r) * es, raw + ((size_t)e * n + s) * es,
                   es);
        }
    free(raw);
    return st == ATLAS_OK ? ATLAS_OK : atlas_fail_wrap(st, "reading %s", v->name);
}

/* Expert e's source of part p, into the part's owned bytes. */
static void make_src(atlas_oss_experts *x, int p, int e) {
    atlas_weight_src *s = &x->srcs[p * x->E + e];
    const atlas_tensor_view *v = x->v[p];
    size_t each = v->nbytes / (size_t)x->E;
    *s = (atlas_weight_src){.name = v->name, .dtype = v->dtype, .nbytes = each,
                            .data = (const char *)x->bytes[p] + (size_t)e * each};
    if (p == ATLAS_OSS_GATE_UP_BIAS || p == ATLAS_OSS_DOWN_BIAS) {
        s->n_dims = 1;
        s->shape[0] = v->shape[1];
    } else {
        s->n_dims = 2;
        dims_of(x, p, &s->shape[0], &s->shape[1]);
    }
    if (x->mxfp4 && s->n_dims == 2) {
        int64_t groups = s->shape[1] / 32;
        atlas_wquant *q = &x->q[(p == ATLAS_OSS_DOWN) * x->E + e];
        *q = (atlas_wquant){.format = ATLAS_WFMT_FP4_E2M1, .block_rows = 1, .block_cols = 32,
                            .scale_cols = (int)groups,
                            .scales = x->fscales[p] + (size_t)e * s->shape[0] * groups};
        s->quant = q;
    }
    x->sp[p * x->E + e] = s;
}

atlas_status atlas_oss_experts_read(atlas_oss_experts *x) {
    size_t n = (size_t)ATLAS_OSS_N * x->E;
    x->srcs = calloc(n, sizeof *x->srcs);
    x->sp = calloc(n, sizeof *x->sp);
    x->q = calloc((size_t)2 * x->E, sizeof *x->q);
    if (!x->srcs || !x->sp || !x->q)
        return atlas_fail(ATLAS_ERR_NOMEM, "%s: out of memory", x->v[0]->name);
    ATLAS_TRY(read_matrix(x, ATLAS_OSS_GATE_UP));
    ATLAS_TRY(read_matrix(x, ATLAS_OSS_DOWN));
    ATLAS_TRY(read_bias(x, ATLAS_OSS_GATE_UP_BIAS));
    ATLAS_TRY(read_bias(x, ATLAS_OSS_DOWN_BIAS));
    for (int p = 0; p < ATLAS_OSS_N; p++)
        for (int e = 0; e < x->E; e++) make_src(x, p, e);
    return ATLAS_OK;
}

void atlas_oss_experts_free(atlas_oss_experts *x) {
    if (!x) return;
    for (int p = 0; p < ATLAS_OSS_N; p++) free(x->bytes[p]), free(x->fscales[p]);
    free(x->q), free(x->srcs), free(x->sp);
    memset(x, 0, sizeof *x);
}

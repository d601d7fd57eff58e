/* tests/test-quant.c — quantized checkpoints (model/quant.h, backend formats of backend.h).
 *
 * - Known answers from each format's published rules: e4m3 codes (normals, subnormals, the
 *   largest 448, NaN 0x7F / 0xFF, signed zero); AWQ's interleaved nibble order and GPTQ's
 *   order and zero offset (gptq stores zero - 1, gptq_v2 the zero), read through
 *   atlas_quant_bind from checkpoints written here word by word, and dequantized by the CPU
 *   backend's matmul (one-hot inputs read back the weights' columns); the same for
 *   compressed-tensors' pack_to_int32 (signed values plus 8, weights packed along the row,
 *   zero points along the column, padded words at both ends). AWQ and GPTQ bound as stored
 *   (a backend that repacks on its device) hand on the tensors with the order and zero
 *   offset that make them exactly the host's repack.
 * - quantization_config and hf_quant_config.json: what is refused names the method (and
 *   lists what is read); what is read and not applied (static activation scales, an FP8 KV
 *   cache) is said in the quantization string.
 * - End to end: tools/quant/quantize.py (the published layouts, written from their specs, not
 *   from atlas's code) quantizes a small checkpoint into every layout and writes the same
 *   weights dequantized to float32; the engine's logits on the quantized directory must
 *   equal those on the float one (the CPU dequantizes each weight to the value the float
 *   file holds and multiplies it in the same order), and atlas_model_inspect (atlas info from
 *   the headers alone) must agree with the loaded model on the formats, the bytes a token
 *   reads and the weights' stored size that the memory check counts. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "atlas/model.h"
#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/threadpool.h"
#include "format/safetensors.h"
#include "harness.h"
#include "model/config.h"
#include "model/forward.h"
#include "model/kv_scale.h"
#include "model/quant.h"

/* ---- e4m3 ---------------------------------------------------------------------------- */

static void test_e4m3(void) {
    static const struct { uint8_t code; float value; } known[] = {
        {0x00, 0.0f},     {0x01, 0x1p-9f},  {0x07, 7 * 0x1p-9f}, {0x08, 0x1p-6f},
        {0x0f, 1.875f * 0x1p-6f}, {0x38, 1.0f}, {0x39, 1.125f}, {0x40, 2.0f}, {0x7e, 448.0f},
        {0x77, 240.0f},   {0xb8, -1.0f},    {0x81, -0x1p-9f},    {0xfe, -448.0f},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        CHECK_MSG(atlas_e4m3_to_f32(known[i].code) == known[i].value, "e4m3 0x%02x: %g, want %g",
                  known[i].code, atlas_e4m3_to_f32(known[i].code), known[i].value);
    CHECK(isnan(atlas_e4m3_to_f32(0x7f)) && isnan(atlas_e4m3_to_f32(0xff)));
    CHECK(signbit(atlas_e4m3_to_f32(0x80)) && atlas_e4m3_to_f32(0x80) == 0.0f);
    int nans = 0; /* only S.1111.111 is NaN: no infinities in the "fn" variant */
    for (int c = 0; c < 256; c++) nans += isnan(atlas_e4m3_to_f32((uint8_t)c)) != 0;
    CHECK(nans == 2);
}

/* ---- e2m1 and e8m0 ------------------------------------------------------------------- */

/* The OCP MX specification's tables (v1.0, FP4 E2M1 and E8M0), written out here. */
static const float E2M1_SPEC[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

static void test_e2m1_e8m0(void) {
    for (int c = 0; c < 16; c++) {
        float v = atlas_e2m1_to_f32((uint8_t)c);
        CHECK_MSG(v == E2M1_SPEC[c] && signbit(v) == signbit(E2M1_SPEC[c]),
                  "e2m1 0x%x: %g, want %g", c, v, E2M1_SPEC[c]);
    }
    static const struct { uint8_t code; float value; } e8m0[] = {
        {127, 1.0f}, {128, 2.0f}, {126, 0.5f}, {0, 0x1p-127f}, {1, 0x1p-126f}, {254, 0x1p127f},
        {117, 0x1p-10f},
    };
    for (size_t i = 0; i < sizeof e8m0 / sizeof e8m0[0]; i++)
        CHECK_MSG(atlas_e8m0_to_f32(e8m0[i].code) == e8m0[i].value, "e8m0 %d: %g, want %g",
                  e8m0[i].code, atlas_e8m0_to_f32(e8m0[i].code), e8m0[i].value);
    CHECK(isnan(atlas_e8m0_to_f32(0xff)));
}

/* ---- a checkpoint written word by word -------------------------------------------------- */

typedef struct tensor {
    const char *name, *dtype;
    int n_dims;
    int64_t shape[3];
    const void *data;
    size_t nbytes;
} tensor;

/* A safetensors file in memory: the caller frees *buf after atlas_st_free. */
static atlas_st *st_of(const tensor *t, int n, char **buf) {
    char head[4096] = "{";
    size_t off = 0, total = 0;
    for (int i = 0; i < n; i++) {
        char shape[64];
        if (t[i].n_dims == 3) snprintf(shape, sizeof shape, "[%lld,%lld,%lld]",
                                       (long long)t[i].shape[0], (long long)t[i].shape[1],
                                       (long long)t[i].shape[2]);
        else if (t[i].n_dims == 2) snprintf(shape, sizeof shape, "[%lld,%lld]", (long long)t[i].shape[0],
                                       (long long)t[i].shape[1]);
        else snprintf(shape, sizeof shape, "[%lld]", (long long)t[i].shape[0]);
        snprintf(head + strlen(head), sizeof head - strlen(head),
                 "%s\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%zu,%zu]}",
                 i ? "," : "", t[i].name, t[i].dtype, shape, off, off + t[i].nbytes);
        off += t[i].nbytes;
    }
    strcat(head, "}");
    while (strlen(head) % 8) strcat(head, " ");
    uint64_t hl = strlen(head);
    total = 8 + hl + off;
    *buf = malloc(total);
    memcpy(*buf, &hl, 8);
    memcpy(*buf + 8, head, hl);
    off = 8 + hl;
    for (int i = 0; i < n; i++) {
        memcpy(*buf + off, t[i].data, t[i].nbytes);
        off += t[i].nbytes;
    }
    atlas_st *st = NULL;
    CHECK_OK(atlas_st_open_memory(*buf, total, "quant.safetensors", &st));
    return st;
}

/* The weight through the CPU backend: column c of w = w @ e_c (one-hot rows). */
static void read_back(const atlas_qweight *q, float *w) {
    atlas_backend_geom g = {.hidden = 64, .n_heads = 1, .n_kv_heads = 1, .head_dim = 8,
                            .intermediate = 64, .vocab_size = 8, .n_layers = 1, .rms_eps = 1e-5,
                            .max_position = 16};
    double inv[4] = {1, 1, 1, 1};
    g.rope_inv_freq = inv;
    atlas_backend *be = NULL;
    CHECK_OK(atlas_backend_cpu_create(&g, 1, &be));
    if (!be) return;
    atlas_weight_src src = {.name = "w", .dtype = ATLAS_DTYPE_U8, .n_dims = 2,
                            .shape = {q->rows, q->cols}, .nbytes = q->packed_bytes,
                            .data = q->packed ? q->packed : q->codes->data, .quant = &q->q};
    const atlas_weight_src *sp = &src;
    atlas_weight *w8 = NULL;
    CHECK_OK(be->ops->weight_load(be, &sp, 1, &w8));
    int64_t R = q->rows, C = q->cols;
    float *x = calloc((size_t)(C * C), sizeof *x), *out = calloc((size_t)(C * R), sizeof *out);
    for (int64_t c = 0; c < C; c++) x[c * C + c] = 1.0f;
    if (w8) CHECK_OK(be->ops->matmul(be, out, x, w8, NULL, (int)C));
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) w[r * C + c] = out[c * R + r];
    free(x);
    free(out);
    be->ops->weight_free(be, w8);
    CHECK_OK(be->ops->destroy(be));
}

/* 16 outputs x 16 inputs, groups of 8 (two groups): q[r][c] = (r + 3c) % 16, zero[r][g] =
 * (r + g) % 16, scale[g][r] = 0.5 + r + g / 4. */
enum { R = 16, C = 16, G = 8 };
static int qv(int r, int c) { return (r + 3 * c) % 16; }
static int zv(int r, int g) { return (r + g + 1) % 15 + 1; }
static float sv(int r, int g) { return 0.5f + (float)r + (float)g / 4; }

/* The same weight bound as stored (a backend's int4_stored: the CUDA one repacks on its
 * device): the tensors handed on as they are, with the order and zero offset that turn them
 * into exactly the host's repack (host: bound the usual way), as backend.h defines them. */
static void stored_agrees(const char *what, const atlas_st *st, const atlas_quant_config *qc,
                          const atlas_qweight *host) {
    static const int awq_nib[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    atlas_qweight q;
    CHECK_OK(atlas_quant_bind(st, qc, "m", R, C, true, true, NULL, NULL, &q));
    bool awq = qc->method == ATLAS_QM_AWQ;
    CHECK_MSG(q.quantized && q.codes && q.stored_scales && q.stored_zeros && !q.packed &&
                  !q.q.scales && !q.q.zeros && q.packed_bytes == (size_t)(R * C / 2),
              "%s as stored: tensors not handed on", what);
    CHECK_MSG(q.q.order == (awq ? ATLAS_INT4_AWQ : ATLAS_INT4_GPTQ), "%s: order %d", what,
              (int)q.q.order);
    CHECK_MSG(!q.g_idx == !host->g_idx &&
                  (!q.g_idx || !memcmp(q.g_idx, host->g_idx, sizeof(int32_t) * C)),
              "%s as stored: g_idx not the host's", what);
    int bad = 0;
    for (int r = 0; q.codes && q.stored_scales && r < R; r++) {
        const uint32_t *w = q.codes->data, *z = q.stored_zeros->data;
        const uint16_t *sc = q.stored_scales->data;
        for (int c = 0; c < C; c++) {
            uint32_t word = awq ? w[c * (R / 8) + r / 8] : w[(c / 8) * R + r];
            int code = (int)(word >> (4 * (awq ? awq_nib[r % 8] : c % 8))) & 0xf;
            uint8_t b = ((const uint8_t *)host->packed)[r * (C / 2) + c / 2];
            bad += code != ((b >> (4 * (c & 1))) & 0xf);
        }
        for (int g = 0; g < C / G; g++) {
            int nz = awq ? awq_nib[r % 8] : r % 8;
            float zero = (float)((z[g * (R / 8) + r / 8] >> (4 * nz)) & 0xf) + q.q.zero_add;
            bad += zero != host->zeros[r * (C / G) + g];
            bad += atlas_f16_to_f32(sc[g * R + r]) != host->scales[r * (C / G) + g];
        }
    }
    CHECK_MSG(bad == 0, "%s as stored: %d codes, zeros or scales not the host's repack", what, bad);
    atlas_qweight_free(&q);
}

static void check_int4(const char *what, const atlas_quant_config *qc, const tensor *t, int n,
                       int zero_offset, const int32_t *g_idx) {
    char *buf = NULL;
    atlas_st *st = st_of(t, n, &buf);
    atlas_qweight q;
    CHECK_OK(atlas_quant_bind(st, qc, "m", R, C, true, false, NULL, NULL, &q));
    CHECK_MSG(q.quantized && q.q.format == ATLAS_WFMT_INT4, "%s: not INT4", what);
    float w[R * C];
    memset(w, 0, sizeof w);
    if (q.quantized) read_back(&q, w);
    int bad = 0;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            int g = g_idx ? g_idx[c] : c / G;
            float want = ((float)qv(r, c) - (float)(zv(r, g) + zero_offset)) * sv(r, g);
            if (w[r * C + c] != want && bad++ < 3)
                fprintf(stderr, "%s: w[%d][%d] = %g, want %g\n", what, r, c, w[r * C + c], want);
        }
    CHECK_MSG(bad == 0, "%s: %d weights differ", what, bad);
    stored_agrees(what, st, qc, &q);
    atlas_qweight_free(&q);
    atlas_st_free(st);
    free(buf);
}

static void test_awq_gptq(void) {
    static const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7}; /* AutoAWQ's pack order */
    int32_t awq_w[C][R / 8], awq_z[C / G][R / 8], gq_w[C / 8][R], gq_z[C / G][R / 8];
    uint16_t sc[C / G][R];
    for (int c = 0; c < C; c++) /* AWQ: [in, out/8], nibble i holds output 8j + order[i] */
        for (int j = 0; j < R / 8; j++) {
            uint32_t word = 0;
            for (int i = 0; i < 8; i++) word |= (uint32_t)qv(8 * j + order[i], c) << (4 * i);
            awq_w[c][j] = (int32_t)word;
        }
    for (int g = 0; g < C / G; g++)
        for (int j = 0; j < R / 8; j++) {
            uint32_t a = 0, b = 0;
            for (int i = 0; i < 8; i++) {
                a |= (uint32_t)zv(8 * j + order[i], g) << (4 * i);
                b |= (uint32_t)(zv(8 * j + i, g) - 1) << (4 * i); /* gptq: zero - 1 */
            }
            awq_z[g][j] = (int32_t)a;
            gq_z[g][j] = (int32_t)b;
        }
    for (int i = 0; i < C / 8; i++) /* GPTQ: [in/8, out], input 8i + k in nibble k */
        for (int r = 0; r < R; r++) {
            uint32_t word = 0;
            for (int k = 0; k < 8; k++) word |= (uint32_t)qv(r, 8 * i + k) << (4 * k);
            gq_w[i][r] = (int32_t)word;
        }
    for (int g = 0; g < C / G; g++)
        for (int r = 0; r < R; r++) {
            float s = sv(r, g);
            uint32_t u;
            memcpy(&u, &s, 4); /* exact in f16: small halves and quarters */
            int e = (int)((u >> 23) & 0xff) - 127 + 15;
            sc[g][r] = (uint16_t)((e << 10) | ((u >> 13) & 0x3ff));
        }
    atlas_quant_config awq = {.method = ATLAS_QM_AWQ, .group = G};
    tensor ta[] = {{"m.qweight", "I32", 2, {C, R / 8}, awq_w, sizeof awq_w},
                   {"m.qzeros", "I32", 2, {C / G, R / 8}, awq_z, sizeof awq_z},
                   {"m.scales", "F16", 2, {C / G, R}, sc, sizeof sc}};
    check_int4("awq gemm", &awq, ta, 3, 0, NULL);
    atlas_quant_config gptq = {.method = ATLAS_QM_GPTQ, .group = G};
    tensor tg[] = {{"m.qweight", "I32", 2, {C / 8, R}, gq_w, sizeof gq_w},
                   {"m.qzeros", "I32", 2, {C / G, R / 8}, gq_z, sizeof gq_z},
                   {"m.scales", "F16", 2, {C / G, R}, sc, sizeof sc}};
    check_int4("gptq (zeros stored minus one)", &gptq, tg, 3, 0, NULL);
    gptq.gptq_v2 = true; /* the same words read as v2: every zero one less */
    check_int4("gptq_v2", &gptq, tg, 3, -1, NULL);
    /* desc_act: a g_idx of the plain order reads the same; a permuted one moves the groups */
    int32_t gi[C];
    for (int c = 0; c < C; c++) gi[c] = c / G;
    tensor tgi[] = {tg[0], tg[1], tg[2], {"m.g_idx", "I32", 1, {C}, gi, sizeof gi}};
    gptq.gptq_v2 = false;
    check_int4("gptq g_idx in order", &gptq, tgi, 4, 0, NULL);
    for (int c = 0; c < C; c++) gi[c] = (c * 5 / 3) % 2; /* act-order: groups interleaved */
    check_int4("gptq act-order g_idx", &gptq, tgi, 4, 0, gi);
    gi[0] = 7; /* not a group: refused, named */
    char *buf = NULL;
    atlas_st *st = st_of(tgi, 4, &buf);
    atlas_qweight q;
    CHECK(atlas_quant_bind(st, &gptq, "m", R, C, true, false, NULL, NULL, &q) == ATLAS_ERR_FORMAT);
    CHECK(strstr(atlas_last_error(), "g_idx") != NULL);
    atlas_st_free(st);
    free(buf);
}

/* ---- compressed-tensors pack-quantized ------------------------------------------------ */

/* 12 outputs x 20 inputs in groups of 10: neither a multiple of 8, so both packed tensors end
 * in a padded word. Signed values q in [-8, 7], zero points z in [-8, 7]; the published rule
 * (compressed-tensors' pack_to_int32) stores v + 8, eight a word, the first in the lowest
 * nibble: weights along a row (column 8j+k in nibble k of word j), zero points along a
 * column (row 8i+k in nibble k of word row i). w = (q - z) * s; symmetric: z = 0. */
enum { CR = 12, CC = 20, CG = 10, CW = (CC + 7) / 8, CZ = (CR + 7) / 8 };
static int ct_q(int r, int c) { return (r + 3 * c) % 16 - 8; }
static int ct_z(int r, int g) { return (5 * r + g) % 16 - 8; }

static uint16_t bf16_of(float f) { /* exact for the small quarters used here */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static void check_ct_int4(const char *what, bool sym, const tensor *t, int n) {
    atlas_quant_config qc = {.method = ATLAS_QM_CT_INT4, .group = CG, .symmetric = sym};
    char *buf = NULL;
    atlas_st *st = st_of(t, n, &buf);
    atlas_qweight q;
    CHECK_OK(atlas_quant_bind(st, &qc, "m", CR, CC, true, false, NULL, NULL, &q));
    CHECK_MSG(q.quantized && q.q.format == ATLAS_WFMT_INT4, "%s: not INT4", what);
    float w[CR * CC];
    memset(w, 0, sizeof w);
    if (q.quantized && q.packed) read_back(&q, w);
    int bad = 0;
    for (int r = 0; r < CR; r++)
        for (int c = 0; c < CC; c++) {
            int g = c / CG;
            float want = (float)(ct_q(r, c) - (sym ? 0 : ct_z(r, g))) * sv(r, g);
            if (w[r * CC + c] != want && bad++ < 3)
                fprintf(stderr, "%s: w[%d][%d] = %g, want %g\n", what, r, c, w[r * CC + c], want);
        }
    CHECK_MSG(bad == 0, "%s: %d weights differ", what, bad);
    atlas_qweight_free(&q);
    atlas_st_free(st);
    free(buf);
}

static void test_ct_int4(void) {
    int32_t packed[CR][CW], zp[CZ][CC / CG];
    uint16_t sc[CR][CC / CG];
    int64_t shape[2] = {CR, CC};
    memset(packed, 0, sizeof packed); /* the padding nibbles are zero */
    memset(zp, 0, sizeof zp);
    for (int r = 0; r < CR; r++)
        for (int c = 0; c < CC; c++)
            packed[r][c / 8] = (int32_t)((uint32_t)packed[r][c / 8] |
                                         (uint32_t)(ct_q(r, c) + 8) << (4 * (c % 8)));
    for (int r = 0; r < CR; r++)
        for (int g = 0; g < CC / CG; g++) {
            zp[r / 8][g] = (int32_t)((uint32_t)zp[r / 8][g] |
                                     (uint32_t)(ct_z(r, g) + 8) << (4 * (r % 8)));
            sc[r][g] = bf16_of(sv(r, g));
        }
    tensor t[] = {{"m.weight_packed", "I32", 2, {CR, CW}, packed, sizeof packed},
                  {"m.weight_scale", "BF16", 2, {CR, CC / CG}, sc, sizeof sc},
                  {"m.weight_shape", "I64", 1, {2}, shape, sizeof shape},
                  {"m.weight_zero_point", "I32", 2, {CZ, CC / CG}, zp, sizeof zp}};
    check_ct_int4("compressed-tensors INT4 symmetric", true, t, 3);
    check_ct_int4("compressed-tensors INT4 with zero points", false, t, 4);
    /* weight_shape must say the model's shape */
    shape[1] = CC + 2;
    char *buf = NULL;
    atlas_st *st = st_of(t, 4, &buf);
    atlas_quant_config qc = {.method = ATLAS_QM_CT_INT4, .group = CG};
    atlas_qweight q;
    CHECK(atlas_quant_bind(st, &qc, "m", CR, CC, true, false, NULL, NULL, &q) == ATLAS_ERR_FORMAT);
    CHECK(strstr(atlas_last_error(), "weight_shape") != NULL);
    atlas_st_free(st);
    free(buf);
    /* asymmetric without its zero points: the missing tensor is named */
    shape[1] = CC;
    st = st_of(t, 3, &buf);
    CHECK(atlas_quant_bind(st, &qc, "m", CR, CC, true, false, NULL, NULL, &q) == ATLAS_ERR_NOT_FOUND);
    CHECK(strstr(atlas_last_error(), "m.weight_zero_point") != NULL);
    atlas_st_free(st);
    free(buf);
}

/* ---- quantization_config ------------------------------------------------------------------ */

/* ---- the same repack on a pool's threads ---------------------------------------------- */

/* A matrix large enough that a pool splits its read (several 4 MiB pieces of codes) and its
 * repack (rows in several ranges), with rows and columns that leave part blocks of the
 * repack's 16 x 16 tiles (1,025 words of AWQ's rows, 8,200 output rows): bound with a
 * 3-thread pool, from memory and from a file (the pieces read with pread), every code must
 * be the nibble its layout's definition names, and every byte of the codes and the grids
 * must equal the single-thread bind's (whose grids the known answers above check). */
enum { PR = 8200, PC = 2176, PG = 128 };

/* Output row r, input column c of a repacked INT4 weight. */
static unsigned nib_at(const uint8_t *packed, int64_t cols, int64_t r, int64_t c) {
    uint8_t b = packed[r * (cols / 2) + c / 2];
    return c % 2 ? b >> 4 : b & 0xf;
}

/* The packed codes: repacked, or (compressed-tensors of whole words) the stored tensor's
 * bytes read through its view into *tmp (freed by the caller). */
static const uint8_t *codes_of(const atlas_qweight *q, uint8_t **tmp) {
    *tmp = NULL;
    if (q->packed || !q->codes) return q->packed;
    const atlas_tensor_view *v = q->codes;
    if (v->fd < 0) return v->data;
    *tmp = malloc(v->nbytes);
    if (*tmp && pread(v->fd, *tmp, v->nbytes, (off_t)v->file_offset) != (ssize_t)v->nbytes) {
        free(*tmp);
        *tmp = NULL;
    }
    return *tmp;
}

static atlas_st *st_file(const tensor *t, int n, const char *path) {
    char *buf = NULL;
    atlas_st *mem = st_of(t, n, &buf);
    atlas_st_free(mem);
    size_t total = 8 + (size_t)((const uint64_t *)buf)[0];
    for (int i = 0; i < n; i++) total += t[i].nbytes;
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(buf, 1, total, f) == total);
    if (f) fclose(f);
    free(buf);
    atlas_st *st = NULL;
    CHECK_OK(atlas_st_open_file(path, &st));
    return st;
}

static void same_on_pool(const char *what, const atlas_quant_config *qc, const tensor *t, int n,
                         atlas_threadpool *pool, unsigned (*want)(int64_t r, int64_t c)) {
    for (int from_file = 0; from_file < 2; from_file++) {
        char *buf = NULL, path[] = "/tmp/atlas-test-quant-XXXXXX";
        int fd = from_file ? mkstemp(path) : -1;
        if (fd >= 0) close(fd);
        atlas_st *st = from_file ? st_file(t, n, path) : st_of(t, n, &buf);
        atlas_qweight a, b;
        CHECK_OK(atlas_quant_bind(st, qc, "m", PR, PC, true, false, NULL, NULL, &a));
        CHECK_OK(atlas_quant_bind(st, qc, "m", PR, PC, true, false, NULL, pool, &b));
        size_t grid = (size_t)PR * (PC / PG) * sizeof(float);
        int64_t bad = 0;
        uint8_t *ta = NULL, *tb = NULL;
        const uint8_t *pa = codes_of(&a, &ta), *pb = codes_of(&b, &tb);
        for (int64_t r = 0; pa && r < PR; r++)
            for (int64_t c = 0; c < PC; c++) bad += nib_at(pa, PC, r, c) != want(r, c);
        CHECK_MSG(pa && !bad, "%s (%s): %lld codes are not the layout's", what,
                  from_file ? "file" : "memory", (long long)bad);
        CHECK_MSG(pa && pb && a.packed_bytes == b.packed_bytes && !memcmp(pa, pb, a.packed_bytes),
                  "%s (%s): the codes differ on the pool", what, from_file ? "file" : "memory");
        free(ta);
        free(tb);
        CHECK_MSG(a.scales && b.scales && !memcmp(a.scales, b.scales, grid),
                  "%s: the scales differ on the pool", what);
        CHECK_MSG(a.zeros && b.zeros && !memcmp(a.zeros, b.zeros, grid),
                  "%s: the zeros differ on the pool", what);
        atlas_qweight_free(&a);
        atlas_qweight_free(&b);
        atlas_st_free(st);
        free(buf);
        if (from_file) unlink(path);
    }
}

static int32_t *pool_w; /* the codes' words, shared by the three layouts' definitions */

static unsigned awq_want(int64_t r, int64_t c) { /* [in, out/8], AutoAWQ's order */
    static const int nib[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    return ((uint32_t)pool_w[c * (PR / 8) + r / 8] >> (4 * nib[r % 8])) & 0xf;
}

static unsigned gptq_want(int64_t r, int64_t c) { /* [in/8, out], input 8i + k in nibble k */
    return ((uint32_t)pool_w[(c / 8) * PR + r] >> (4 * (c % 8))) & 0xf;
}

static unsigned ct_want(int64_t r, int64_t c) { /* [out, in/8], input 8j + k in nibble k */
    return ((uint32_t)pool_w[r * (PC / 8) + c / 8] >> (4 * (c % 8))) & 0xf;
}

static void test_int4_pool(void) {
    atlas_threadpool *pool = NULL;
    CHECK_OK(atlas_threadpool_create(3, &pool));
    int32_t *w = malloc((size_t)PR * PC / 2), *z = malloc((size_t)(PC / PG) * PR / 8 * 4);
    uint16_t *sc = malloc((size_t)(PC / PG) * PR * 2);
    CHECK(w && z && sc);
    if (!pool || !w || !z || !sc) goto done;
    pool_w = w;
    uint32_t x = 12345u; /* xorshift: every nibble and scale differs from its neighbours' */
    for (size_t i = 0; i < (size_t)PR * PC / 8; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        w[i] = (int32_t)x;
    }
    for (size_t i = 0; i < (size_t)(PC / PG) * PR / 8; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        z[i] = (int32_t)x;
    }
    for (size_t i = 0; i < (size_t)(PC / PG) * PR; i++) sc[i] = (uint16_t)(0x3c00 + i % 1021);
    atlas_quant_config awq = {.method = ATLAS_QM_AWQ, .group = PG};
    tensor ta[] = {{"m.qweight", "I32", 2, {PC, PR / 8}, w, (size_t)PR * PC / 2},
                   {"m.qzeros", "I32", 2, {PC / PG, PR / 8}, z, (size_t)(PC / PG) * PR / 2},
                   {"m.scales", "F16", 2, {PC / PG, PR}, sc, (size_t)(PC / PG) * PR * 2}};
    same_on_pool("awq", &awq, ta, 3, pool, awq_want);
    atlas_quant_config gptq = {.method = ATLAS_QM_GPTQ, .group = PG};
    tensor tg[] = {{"m.qweight", "I32", 2, {PC / 8, PR}, w, (size_t)PR * PC / 2}, ta[1], ta[2]};
    same_on_pool("gptq", &gptq, tg, 3, pool, gptq_want);
    int64_t shape[2] = {PR, PC};
    atlas_quant_config ct = {.method = ATLAS_QM_CT_INT4, .group = PG};
    tensor tc[] = {{"m.weight_packed", "I32", 2, {PR, PC / 8}, w, (size_t)PR * PC / 2},
                   {"m.weight_scale", "F16", 2, {PR, PC / PG}, sc, (size_t)(PC / PG) * PR * 2},
                   {"m.weight_shape", "I64", 1, {2}, shape, sizeof shape},
                   {"m.weight_zero_point", "I32", 2, {PR / 8, PC / PG}, z,
                    (size_t)(PC / PG) * PR / 2}};
    same_on_pool("compressed-tensors", &ct, tc, 4, pool, ct_want);
done:
    free(w);
    free(z);
    free(sc);
    atlas_threadpool_free(pool);
}


static atlas_status parse(const char *qjson, atlas_quant_config *qc) {
    json_error_t e;
    json_t *q = json_loads(qjson, 0, &e);
    CHECK_MSG(q != NULL, "bad test JSON %s", qjson);
    atlas_status s = atlas_quant_config_parse("config.json", q, qc);
    json_decref(q);
    return s;
}

static void refused(const char *qjson, const char *name) {
    atlas_quant_config qc;
    atlas_status s = parse(qjson, &qc);
    const char *msg = atlas_last_error();
    CHECK_MSG(s == ATLAS_ERR_UNSUPPORTED && strstr(msg, name) && strstr(msg, "config.json") &&
                  strstr(msg, "gptq (4-bit"), "%s: %s (%s)", qjson, atlas_status_str(s), msg);
}

/* FP4: 16 outputs x 32 inputs; code(r, c) = (3r + c) % 16, the even column in the low
 * nibble of each byte (gpt-oss's and ModelOpt's packing). */
enum { FR = 16, FC = 32 };
static int fp4_code(int r, int c) { return (3 * r + c) % 16; }

/* The weight through the CPU backend, its codes read from the checkpoint's view. */
static void read_back_codes(atlas_qweight *q, float *w) {
    q->packed = (void *)q->codes->data; /* borrowed: read_back's source */
    q->packed_bytes = q->codes->nbytes;
    read_back(q, w);
    q->packed = NULL;
}

static void check_fp4(const char *what, atlas_qmethod method, const tensor *t, int n,
                      float (*want_scale)(int r, int g)) {
    atlas_quant_config qc = {.method = method, .group = method == ATLAS_QM_MXFP4 ? 32 : 16};
    char *buf = NULL;
    atlas_st *st = st_of(t, n, &buf);
    atlas_qweight q;
    CHECK_OK(atlas_quant_bind(st, &qc, "m", FR, FC, true, false, NULL, NULL, &q));
    CHECK_MSG(q.quantized && q.q.format == ATLAS_WFMT_FP4_E2M1, "%s: not FP4", what);
    float w[FR * FC];
    memset(w, 0, sizeof w);
    if (q.quantized && q.codes) read_back_codes(&q, w);
    int bad = 0;
    for (int r = 0; r < FR; r++)
        for (int c = 0; c < FC; c++) {
            float want = E2M1_SPEC[fp4_code(r, c)] * want_scale(r, c / qc.group);
            if (w[r * FC + c] != want && bad++ < 3)
                CHECK_MSG(0, "%s: w[%d][%d] = %g, want %g", what, r, c, w[r * FC + c], want);
        }
    CHECK_MSG(!bad, "%s: %d weights differ", what, bad);
    atlas_qweight_free(&q);
    atlas_st_free(st);
    free(buf);
}

static uint8_t nv_scale_code(int r, int g) { return (uint8_t)(0x30 + (r + 3 * g) % 8); }
/* ModelOpt: weight_scale_2 multiplies; compressed-tensors: weight_global_scale divides */
static float nv_mul(int r, int g) { return atlas_e4m3_to_f32(nv_scale_code(r, g)) * 0.25f; }
static float nv_div(int r, int g) { return atlas_e4m3_to_f32(nv_scale_code(r, g)) / 4.0f; }
static float mx_scale(int r, int g) { (void)g; return ldexpf(1.0f, (r % 10) - 7); }

static void test_fp4(void) {
    uint8_t packed[FR * FC / 2], nv_s[FR * FC / 16], mx_s[FR];
    for (int r = 0; r < FR; r++)
        for (int j = 0; j < FC / 2; j++)
            packed[r * FC / 2 + j] = (uint8_t)(fp4_code(r, 2 * j) | fp4_code(r, 2 * j + 1) << 4);
    for (int r = 0; r < FR; r++) {
        for (int g = 0; g < FC / 16; g++) nv_s[r * FC / 16 + g] = nv_scale_code(r, g);
        mx_s[r] = (uint8_t)(127 + (r % 10) - 7);
    }
    float g2 = 0.25f, gg = 4.0f, in = 1.0f;
    tensor mo[] = {
        {"m.weight", "U8", 2, {FR, FC / 2}, packed, sizeof packed},
        {"m.weight_scale", "F8_E4M3", 2, {FR, FC / 16}, nv_s, sizeof nv_s},
        {"m.weight_scale_2", "F32", 1, {1}, &g2, 4},
        {"m.input_scale", "F32", 1, {1}, &in, 4},
    };
    check_fp4("modelopt NVFP4", ATLAS_QM_NVFP4, mo, 4, nv_mul);
    tensor ct[] = {
        {"m.weight_packed", "U8", 2, {FR, FC / 2}, packed, sizeof packed},
        {"m.weight_scale", "F8_E4M3", 2, {FR, FC / 16}, nv_s, sizeof nv_s},
        {"m.weight_global_scale", "F32", 1, {1}, &gg, 4},
    };
    check_fp4("compressed-tensors NVFP4", ATLAS_QM_CT_NVFP4, ct, 3, nv_div);
    tensor mx[] = {
        {"m.weight_blocks", "U8", 3, {FR, FC / 32, 16}, packed, sizeof packed},
        {"m.weight_scales", "U8", 2, {FR, FC / 32}, mx_s, sizeof mx_s},
    };
    check_fp4("mxfp4", ATLAS_QM_MXFP4, mx, 2, mx_scale);
}

static void test_config(void) {
    atlas_quant_config qc;
    CHECK_OK(parse("{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\",\"activation_scheme\":\"dynamic\","
                   "\"weight_block_size\":[128,128]}", &qc));
    CHECK(qc.method == ATLAS_QM_FP8 && qc.strategy == ATLAS_QS_BLOCK && qc.block[0] == 128);
    CHECK_OK(parse("{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":-1,\"desc_act\":true,"
                   "\"checkpoint_format\":\"gptq_v2\",\"modules_to_not_convert\":[\"lm_head\"]}", &qc));
    CHECK(qc.method == ATLAS_QM_GPTQ && qc.group == 0 && qc.gptq_v2 && qc.n_ignore == 1);
    CHECK_OK(parse("{\"quant_method\":\"awq\",\"version\":\"GEMM\",\"bits\":4,\"group_size\":64}",
                   &qc));
    CHECK(qc.method == ATLAS_QM_AWQ && qc.group == 64);
    CHECK(parse("{\"quant_method\":\"awq\",\"modules_to_not_convert\":[\"re:(\"]}", &qc) ==
          ATLAS_ERR_FORMAT);
    CHECK(strstr(atlas_last_error(), "modules_to_not_convert[0]") != NULL);
    /* an FP8 KV cache's scale tensors are read, not bound, for the model's layers only: one
     * of a layer it lacks is a stray tensor the load names */
    CHECK(atlas_kv_scale_name("model.layers.3.self_attn.k_scale", 4));
    CHECK(atlas_kv_scale_name("model.layers.0.self_attn.v_proj.v_scale", 4));
    CHECK(atlas_kv_scale_name("model.layers.2.self_attn.k_proj.output_scale", 4));
    CHECK(!atlas_kv_scale_name("model.layers.99.self_attn.k_scale", 4));
    CHECK(!atlas_kv_scale_name("model.layers.4.self_attn.v_scale", 4));
    CHECK(!atlas_kv_scale_name("model.layers.1.mlp.k_scale", 4));
    /* a field of the wrong type is named, not read as absent ("8" was taken as the default 4) */
    CHECK(parse("{\"quant_method\":\"gptq\",\"bits\":\"8\"}", &qc) == ATLAS_ERR_FORMAT);
    CHECK(strstr(atlas_last_error(), "quantization_config.bits\" must be an integer") != NULL);
    CHECK(parse("{\"quant_method\":\"gptq\",\"bits\":4,\"desc_act\":\"true\"}", &qc) ==
          ATLAS_ERR_FORMAT);
    CHECK(strstr(atlas_last_error(), "desc_act\" must be true or false") != NULL);
    refused("{\"quant_method\":\"bitsandbytes\",\"load_in_4bit\":true}", "bitsandbytes");
    refused("{\"quant_method\":\"hqq\"}", "hqq");
    refused("{\"quant_method\":\"exl2\"}", "exl2");
    refused("{\"quant_method\":\"aqlm\"}", "aqlm");
    refused("{\"quant_method\":\"awq\",\"version\":\"gemv\",\"bits\":4}", "gemv");
    refused("{\"quant_method\":\"awq\",\"version\":\"gemv_fast\",\"bits\":4}", "gemv_fast");
    refused("{\"quant_method\":\"gptq\",\"bits\":4,\"checkpoint_format\":\"marlin\"}", "marlin");
    refused("{\"quant_method\":\"gptq\",\"bits\":8}", "gptq with 8 bits: only 4-bit GPTQ");
    /* static activation scales: read, not applied (weight-only), and said */
    char str[96];
    CHECK_OK(parse("{\"quant_method\":\"fp8\",\"activation_scheme\":\"static\"}", &qc));
    CHECK(qc.method == ATLAS_QM_FP8 && qc.static_act &&
          strstr(atlas_quant_config_str(&qc, str, sizeof str), "weight-only"));
    CHECK_OK(parse("{\"quant_method\":\"compressed-tensors\",\"format\":\"float-quantized\","
                   "\"config_groups\":{\"g\":{\"targets\":[\"Linear\"],\"weights\":{"
                   "\"num_bits\":8,\"type\":\"float\",\"strategy\":\"tensor\"},"
                   "\"input_activations\":{\"num_bits\":8,\"type\":\"float\",\"dynamic\":false}}}}",
                   &qc));
    CHECK(qc.method == ATLAS_QM_CT_FP8 && qc.static_act);
    refused("{\"quant_method\":\"modelopt\",\"quant_algo\":\"W4A8_AWQ\"}", "W4A8_AWQ");
    refused("{\"quant_method\":\"modelopt\",\"quant_algo\":\"FP8_PB_WO\"}", "FP8_PB_WO");
    refused("{\"quant_method\":\"modelopt\",\"quant_algo\":\"FP8\",\"kv_cache_scheme\":"
            "{\"num_bits\":4,\"type\":\"float\"}}", "kv_cache_scheme");
    /* ModelOpt FP8 in config.json: an FP8 KV cache (object or, older, string) is not applied */
    CHECK_OK(parse("{\"quant_method\":\"modelopt\",\"quant_algo\":\"FP8\",\"ignore\":[\"lm_head\","
                   "\"*.mlp.gate\"],\"kv_cache_scheme\":{\"dynamic\":false,\"num_bits\":8,\"type\":"
                   "\"float\"}}", &qc));
    CHECK(qc.method == ATLAS_QM_MODELOPT_FP8 && qc.kv_fp8 && qc.static_act && qc.n_ignore == 2);
    CHECK(!strcmp(atlas_quant_config_str(&qc, str, sizeof str),
                  "modelopt (FP8 e4m3, per-tensor, weight-only; KV cache unquantized)"));
    CHECK_OK(parse("{\"quant_method\":\"modelopt\",\"quant_algo\":\"fp8\",\"kv_cache_scheme\":"
                   "\"FP8\"}", &qc));
    CHECK(qc.method == ATLAS_QM_MODELOPT_FP8 && qc.kv_fp8);
    /* compressed-tensors pack-quantized: 4-bit integers only, weight-only */
#define CT_INT4(w, in) "{\"quant_method\":\"compressed-tensors\",\"format\":\"pack-quantized\"," \
    "\"config_groups\":{\"group_0\":{\"targets\":[\"Linear\"],\"weights\":{" w "}," \
    "\"input_activations\":" in "}},\"ignore\":[\"lm_head\"]}"
    CHECK_OK(parse(CT_INT4("\"num_bits\":4,\"type\":\"int\",\"symmetric\":true,\"strategy\":"
                           "\"group\",\"group_size\":128,\"actorder\":\"group\"", "null"), &qc));
    CHECK(qc.method == ATLAS_QM_CT_INT4 && qc.group == 128 && qc.symmetric && qc.desc_act &&
          qc.n_ignore == 1);
    CHECK_OK(parse(CT_INT4("\"num_bits\":4,\"type\":\"int\",\"symmetric\":false,\"strategy\":"
                           "\"channel\",\"actorder\":\"weight\"", "null"), &qc));
    CHECK(qc.method == ATLAS_QM_CT_INT4 && qc.group == 0 && !qc.symmetric && !qc.desc_act);
    refused(CT_INT4("\"num_bits\":8,\"type\":\"int\",\"strategy\":\"channel\"", "null"),
            "8-bit integers");
    refused(CT_INT4("\"num_bits\":4,\"type\":\"int\",\"strategy\":\"group\",\"group_size\":128",
                    "{\"num_bits\":8,\"type\":\"int\",\"dynamic\":true}"), "W4A8");
    refused(CT_INT4("\"num_bits\":4,\"type\":\"int\",\"strategy\":\"tensor\"", "null"),
            "strategy tensor");
#undef CT_INT4
    refused("{\"quant_method\":\"compressed-tensors\",\"format\":\"int-quantized\"}",
            "int-quantized (8-bit integers");
    /* ModelOpt's hf_quant_config.json */
    json_error_t e;
    json_t *hf = json_loads("{\"producer\":{\"name\":\"modelopt\",\"version\":\"0.19.0\"},"
                            "\"quantization\":{\"quant_algo\":\"FP8\",\"kv_cache_quant_algo\":"
                            "\"FP8\",\"exclude_modules\":[\"lm_head\"]}}", 0, &e);
    CHECK_OK(atlas_quant_config_parse_hf("m/hf_quant_config.json", hf, &qc));
    CHECK(qc.method == ATLAS_QM_MODELOPT_FP8 && qc.kv_fp8 && qc.n_ignore == 1);
    json_object_set_new(json_object_get(hf, "quantization"), "kv_cache_quant_algo",
                        json_string("NVFP4"));
    CHECK(atlas_quant_config_parse_hf("m/hf_quant_config.json", hf, &qc) == ATLAS_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(atlas_last_error(), "m/hf_quant_config.json: field \"quantization\": "
                     "kv_cache_quant_algo NVFP4"), "%s", atlas_last_error());
    json_object_set_new(json_object_get(hf, "producer"), "name", json_string("other"));
    CHECK(atlas_quant_config_parse_hf("m/hf_quant_config.json", hf, &qc) == ATLAS_ERR_UNSUPPORTED);
    CHECK(strstr(atlas_last_error(), "producer other") != NULL);
    json_decref(hf);
    refused("{\"quant_method\":\"modelopt\",\"quant_algo\":\"NVFP4\",\"group_size\":32}",
            "group_size 32");
}

/* ---- end to end ------------------------------------------------------------------------ */

enum { E2E_TOKENS = 24 };

/* The bytes of every tensor in dir's safetensors files: what a quantized checkpoint stores
 * (packed codes, scales, zero points, indices), read from the headers here. */
static size_t stored_bytes(const char *dir) {
    atlas_st *st = NULL;
    CHECK_OK(atlas_st_open_dir(dir, &st));
    size_t sum = 0;
    for (size_t i = 0; st && i < atlas_st_count(st); i++) {
        const atlas_tensor_view *v = atlas_st_at(st, i);
        size_t n = strlen(v->name);
        /* an FP8 KV cache's scales are not weights (model/kv_scale.c reads them) */
        if (n > 8 && (!strcmp(v->name + n - 8, ".k_scale") || !strcmp(v->name + n - 8, ".v_scale")))
            continue;
        sum += v->nbytes;
    }
    atlas_st_free(st);
    return sum;
}

/* atlas info without --load (atlas_model_inspect, headers only) must say what the loaded
 * model says of its formats and the bytes a token reads, and its memory check must count
 * the weights as stored, not as the bf16 they would be. */
static void check_survey(const char *dir, const atlas_model_params *p, const atlas_model_info *mi) {
    atlas_model_survey s;
    CHECK_OK(atlas_model_inspect(dir, p, &s));
    CHECK_MSG(!strcmp(s.quantization, mi->quantization), "%s: survey says %s, load %s", dir,
              s.quantization, mi->quantization);
    CHECK_MSG(!strcmp(s.formats, mi->formats), "%s: survey's formats \"%s\", load's \"%s\"",
              dir, s.formats, mi->formats);
    CHECK_MSG(s.token_weight_bytes == mi->token_weight_bytes && s.token_weight_bytes > 0,
              "%s: a token reads %zu bytes by the survey, %zu loaded", dir,
              s.token_weight_bytes, mi->token_weight_bytes);
    CHECK_MSG(s.kv_token_bytes == mi->kv_token_bytes && s.kv_token_bytes > 0,
              "%s: KV a token %zu by the survey, %zu loaded", dir, s.kv_token_bytes,
              mi->kv_token_bytes);
    CHECK_MSG(s.n_params == mi->n_params && !strcmp(s.dtype, mi->dtype), "%s: survey %lld %s, "
              "load %lld %s", dir, (long long)s.n_params, s.dtype, (long long)mi->n_params,
              mi->dtype);
    size_t stored = stored_bytes(dir);
    CHECK_MSG(s.weight_bytes == stored && mi->weight_bytes == stored && s.needed_bytes ==
              stored + s.kv_bytes, "%s: weights %zu by the survey (needs %zu), %zu loaded, "
              "%zu stored", dir, s.weight_bytes, s.needed_bytes, mi->weight_bytes, stored);
}

/* The logits of every position of one prompt, [E2E_TOKENS, vocab]; NULL after a failure. */
static float *logits_of(const char *dir, int *vocab, char *info, size_t cap, size_t *reads,
                        atlas_cpu_activations act, double *repack_ms) {
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CPU;
    p.cpu_activations = act;
    p.load_tokenizer = 0;
    p.n_threads = 1;
    atlas_model *m = NULL;
    CHECK_OK(atlas_model_load(dir, &p, &m));
    if (!m) return NULL;
    atlas_model_info mi;
    atlas_model_get_info(m, &mi);
    *vocab = mi.vocab_size;
    check_survey(dir, &p, &mi);
    if (info) snprintf(info, cap, "%s", mi.formats);
    *reads = mi.token_weight_bytes;
    if (repack_ms) *repack_ms = mi.times.repack_ms;
    int32_t tok[E2E_TOKENS], pos[E2E_TOKENS], rows[E2E_TOKENS], start[2] = {0, E2E_TOKENS};
    int32_t ctx = E2E_TOKENS, table[4] = {0, 1, 2, 3};
    for (int i = 0; i < E2E_TOKENS; i++) {
        tok[i] = (i * 37 + 11) % mi.vocab_size;
        pos[i] = rows[i] = i;
    }
    atlas_batch b = {.n_tokens = E2E_TOKENS, .tokens = tok, .positions = pos, .n_seqs = 1,
                     .seq_start = start, .seq_ctx = &ctx, .block_table = table, .max_blocks = 4,
                     .n_logits = E2E_TOKENS, .logit_rows = rows};
    float *out = malloc(sizeof(float) * E2E_TOKENS * mi.vocab_size);
    CHECK_OK(atlas_model_forward(m, &b, out));
    CHECK_OK(atlas_model_release(m));
    return out;
}

/* DIR/config.json's quantization_config.KEY = [entry]; then the load must fail naming what. */
static void refuse_ignored(const char *dir, const char *key, const char *entry, const char *what) {
    char path[700];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t e;
    json_t *cfg = json_load_file(path, 0, &e);
    CHECK_MSG(cfg != NULL, "reading %s", path);
    if (!cfg) return;
    json_object_set_new(json_object_get(cfg, "quantization_config"), key, json_pack("[s]", entry));
    CHECK(json_dump_file(cfg, path, 0) == 0);
    json_decref(cfg);
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CPU;
    p.load_tokenizer = 0;
    atlas_model *m = NULL;
    atlas_status st = atlas_model_load(dir, &p, &m);
    CHECK_MSG(st == ATLAS_ERR_FORMAT && strstr(atlas_last_error(), what) &&
                  strstr(atlas_last_error(), "ignore list"),
              "%s with %s [%s]: %s: %s", dir, key, entry, atlas_status_str(st), atlas_last_error());
    if (m) atlas_model_release(m);
}

/* Loads dir on the CPU with kv's cache and checks what its info says of the cache and of the
 * checkpoint's scales (want: a piece of kv_scales). */
static void kv_info(const char *dir, atlas_kv_dtype kv, const char *dtype, const char *want,
                    const char *quant, size_t *kv_bytes) {
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CPU;
    p.load_tokenizer = 0;
    p.kv_dtype = kv;
    atlas_model *m = NULL;
    CHECK_OK(atlas_model_load(dir, &p, &m));
    if (!m) return;
    atlas_model_info mi;
    atlas_model_get_info(m, &mi);
    CHECK_MSG(!strcmp(mi.kv_dtype, dtype) && strstr(mi.kv_scales, want), "%s, kv %s: cache %s, "
              "scales \"%s\"; want %s, \"%s\"", dir, atlas_model_kv_dtype_name(kv), mi.kv_dtype,
              mi.kv_scales, dtype, want);
    /* the quantization line says whether the FP8 KV cache the checkpoint asks for is applied,
     * from the headers (atlas info) as loaded */
    CHECK_MSG(quant ? strstr(mi.quantization, quant) != NULL : !strstr(mi.quantization, "KV"),
              "%s, kv %s: quantization \"%s\", want %s", dir, atlas_model_kv_dtype_name(kv),
              mi.quantization, quant ? quant : "no KV note");
    check_survey(dir, &p, &mi);
    *kv_bytes = mi.kv_bytes;
    CHECK_OK(atlas_model_release(m));
}

/* An FP8 KV cache's scales (quantize.py writes k_proj.k_scale 2/448 and v_proj.v_scale 3/448
 * a layer) are read: used by an FP8 cache, said unused by another; a checkpoint that carries
 * them without asking for an FP8 KV cache (no kv_cache_quant_algo) loads the same way. */
static void check_kv_scales(const char *dir) {
    atlas_config c;
    atlas_st *st = NULL;
    CHECK_OK(atlas_config_load(dir, &c));
    CHECK_OK(atlas_st_open_dir(dir, &st));
    if (!st) return;
    float sc[2 * 64];
    int found = -1;
    CHECK(c.n_layers <= 64);
    CHECK_OK(atlas_kv_scales_read(st, c.n_layers, sc, &found));
    atlas_st_free(st);
    CHECK_MSG(found == 2 * c.n_layers, "%s: %d scale tensors of %d layers", dir, found, c.n_layers);
    for (int l = 0; l < c.n_layers; l++)
        CHECK_MSG(sc[2 * l] == 2.0f / 448.0f && sc[2 * l + 1] == 3.0f / 448.0f,
                  "layer %d: scales %g %g", l, sc[2 * l], sc[2 * l + 1]);
    for (int drop = 0; drop < 2; drop++) {
        if (drop) {
            char path[700];
            snprintf(path, sizeof path, "%s/hf_quant_config.json", dir);
            json_error_t e;
            json_t *hf = json_load_file(path, 0, &e);
            CHECK_MSG(hf != NULL, "reading %s", path);
            if (!hf) return;
            json_object_del(json_object_get(hf, "quantization"), "kv_cache_quant_algo");
            CHECK(json_dump_file(hf, path, 0) == 0);
            json_decref(hf);
        }
        size_t f32 = 0, fp8 = 0;
        kv_info(dir, ATLAS_KV_DTYPE_AUTO, "f32", "unused", drop ? NULL : "; KV cache unquantized",
                &f32);
        kv_info(dir, ATLAS_KV_DTYPE_FP8, "fp8", "scale tensors of the checkpoint, used",
                drop ? NULL : "; FP8 KV cache", &fp8);
        CHECK_MSG(fp8 * 4 == f32 && fp8 > 0, "KV bytes: fp8 %zu, f32 %zu", fp8, f32);
    }
}

static void test_end_to_end(void) {
    const char *src = getenv("ATLAS_SOURCE_DIR");
    char tmp[512], cmd[4096], out[4096];
    if (!src || !harness_mkdtemp(tmp, sizeof tmp, "quant")) {
        printf("SKIP end to end: no ATLAS_SOURCE_DIR\n");
        return;
    }
    static const struct { const char *layout, *model, *args, *format; int int8; } cases[] = {
        /* Qwen3-*-FP8's 128x128 */
        {"fp8-block", "qk-norm", "", "attention FP8 e4m3 block 128x128", 0},
        /* per-tensor, lm_head quantized */
        {"ct-tensor", "odd-heads", "--lm-head", "lm_head FP8 e4m3 per-tensor", 0},
        {"ct-channel", "qk-norm", "", "mlp FP8 e4m3 per-channel", 0},
        /* partial blocks; q|k|v parts not multiples of the block */
        {"ct-block", "odd-heads", "--block 24 16", "attention FP8 e4m3 block 24x16", 0},
        {"awq", "qk-norm", "--group 32", "mlp INT4 group 32", 1},
        {"gptq", "qk-norm", "--group 16 --sym --act-order", "mlp INT4 group 16 act-order", 0},
        /* asymmetric, zeros minus one */
        {"gptq", "odd-heads", "--group 16", "attention INT4 group 16", 0},
        {"gptq-v2", "qk-norm", "--group -1 --act-order", "attention INT4 one group a row", 0},
        /* gpt-oss's naming and glob ignore list; ModelOpt's and compressed-tensors' NVFP4 */
        {"mxfp4", "qk-norm", "", "mlp MXFP4 e2m1 group 32", 0},
        {"nvfp4", "odd-heads", "", "attention NVFP4 e2m1 group 16", 0},
        {"ct-nvfp4", "qk-norm", "", "mlp NVFP4 e2m1 group 16", 0},
        /* transformers' FbgemmFp8Config: float32 scales per channel, lm_head left alone */
        {"fbgemm", "odd-heads", "", "mlp FP8 e4m3 per-channel", 0},
        /* ModelOpt FP8 in config.json, and in hf_quant_config.json with an FP8 KV cache's
         * scales and a glob in exclude_modules (down_proj left unquantized) */
        {"modelopt-fp8", "qk-norm", "", "mlp FP8 e4m3 per-tensor", 0},
        {"modelopt-fp8-hf", "odd-heads", "", "attention FP8 e4m3 per-tensor", 0},
        /* compressed-tensors pack-quantized: zero points and act-order; symmetric channel */
        {"ct-int4", "qk-norm", "--group 8 --act-order", "attention INT4 group 8 act-order", 0},
        {"ct-int4", "odd-heads", "--group -1 --sym", "mlp INT4 one group a row", 1},
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    snprintf(cmd, sizeof cmd, "command -v python3 >/dev/null 2>&1");
    if (harness_run(cmd, out, sizeof out) != 0) {
        printf("SKIP end to end: no python3 to run tools/quant/quantize.py\n");
        harness_rm_rf(tmp);
        return;
    }
    for (int i = 0; i < n; i++) {
        char q[600], f[700], info[480] = "";
        snprintf(q, sizeof q, "%s/%d-%s", tmp, i, cases[i].layout);
        snprintf(f, sizeof f, "%s-float", q);
        snprintf(cmd, sizeof cmd, "python3 %s/tools/quant/quantize.py --layout %s --src "
                 "%s/tests/data/small/%s --out %s --dequant %s %s 2>&1", src, cases[i].layout,
                 src, cases[i].model, q, f, cases[i].args);
        int rc = harness_run(cmd, out, sizeof out);
        CHECK_MSG(rc == 0, "%s: %s", cmd, out);
        if (rc) continue;
        int vq = 0, vf = 0;
        size_t rq = 0, rf = 0;
        double tq = 0, tf = 0;
        float *lq = logits_of(q, &vq, info, sizeof info, &rq, ATLAS_CPU_ACT_FP32, &tq);
        float *lf = logits_of(f, &vf, NULL, 0, &rf, ATLAS_CPU_ACT_FP32, &tf);
        /* the load's time in reading and repacking quantized weights: some, and none for
         * the float copy */
        CHECK_MSG(tq > 0 && tf == 0, "%s: repack %.3f ms, %.3f ms in float32", cases[i].layout,
                  tq, tf);
        /* the packed weights and their scales read fewer bytes than float32 ones */
        CHECK_MSG(rq > 0 && rq < rf, "%s: a token reads %zu bytes, %zu in float32",
                  cases[i].layout, rq, rf);
        if (lq && lf && vq == vf) {
            double e = harness_rel_err(lq, lf, E2E_TOKENS * vq);
            printf("%-10s %-9s %-30s logits error %.3g against the float checkpoint\n",
                   cases[i].layout, cases[i].model, cases[i].args, e);
            CHECK_MSG(strstr(info, cases[i].format) != NULL, "%s: formats \"%s\", want %s",
                      cases[i].layout, info, cases[i].format);
            CHECK_MSG(e <= 1e-6, "%s on %s: logits error %.3g", cases[i].layout, cases[i].model, e);
        }
        /* INT4 with int8 activations: off the fp32 result (the int8 kernels ran), by no more
         * than the GPU's tolerance (these random models' logits move about 3% with it) */
        if (lf && cases[i].int8) {
            int v8 = 0;
            size_t r8 = 0;
            float *l8 = logits_of(q, &v8, NULL, 0, &r8, ATLAS_CPU_ACT_INT8, NULL);
            if (l8 && v8 == vf) {
                double e = harness_rel_err(l8, lf, E2E_TOKENS * vf);
                printf("%-10s %-9s %-30s int8 activations: logits error %.3g\n", cases[i].layout,
                       cases[i].model, cases[i].args, e);
                CHECK_MSG(e > 1e-6 && e <= 6e-2, "%s on %s, int8 activations: logits error %.3g",
                          cases[i].layout, cases[i].model, e);
            }
            free(l8);
        }
        free(lq);
        free(lf);
        /* the ignore list is honoured: a module it names must not be stored quantized */
        if (i == 1) refuse_ignored(q, "ignore", "lm_head", "lm_head");
        if (i == 4) refuse_ignored(q, "modules_to_not_convert", "re:.*mlp\\.down_proj",
                                   "model.layers.0.mlp.down_proj");
        if (!strcmp(cases[i].layout, "modelopt-fp8-hf")) check_kv_scales(q);
    }
    harness_rm_rf(tmp);
}

int main(void) {
    test_e4m3();
    test_awq_gptq();
    test_ct_int4();
    test_int4_pool();
    test_e2m1_e8m0();
    test_fp4();
    test_config();
    test_end_to_end();
    return harness_finish();
}

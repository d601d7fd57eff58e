/* backend/cpu/cpu_quant.c — the quantized weight formats of backend.h on the CPU: a weight
 * stays packed as loaded (1 byte a weight for FP8, half a byte for INT4 and FP4, plus its
 * scales) and one row at a time is dequantized to fp32 into the matmul's tile (cpu_matmul.c),
 * so the CPU never holds a float copy of a quantized model. Every dequantized value is one
 * float32 rounding of the format's formula (FP8 and FP4: code x scale; INT4: (q - zero) x
 * scale), the value the quantizers in tools/ write into their dequantized checkpoints. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "core/error.h"

static float e4m3_table[256];
static pthread_once_t e4m3_once = PTHREAD_ONCE_INIT;

static float e2m1_table[16];

static void e4m3_init(void) {
    for (int c = 0; c < 256; c++) e4m3_table[c] = atlas_e4m3_to_f32((uint8_t)c);
    for (int c = 0; c < 16; c++) e2m1_table[c] = atlas_e2m1_to_f32((uint8_t)c);
}

const float *cpu_e4m3_table(void) {
    pthread_once(&e4m3_once, e4m3_init);
    return e4m3_table;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void cpu_dequant_row(const cpu_part *p, int64_t r, int64_t cols, float *dst) {
    const atlas_wquant *q = &p->quant;
    const float *s = q->scales + (r / q->block_rows) * q->scale_cols;
    if (q->format == ATLAS_WFMT_FP8_E4M3) {
        const uint8_t *c = (const uint8_t *)p->data + r * cols;
        for (int64_t j0 = 0, g = 0; j0 < cols; j0 += q->block_cols, g++) {
            int64_t j1 = j0 + q->block_cols < cols ? j0 + q->block_cols : cols;
            float sg = s[g];
            for (int64_t j = j0; j < j1; j++) dst[j] = e4m3_table[c[j]] * sg;
        }
        return;
    }
    if (q->format == ATLAS_WFMT_FP4_E2M1) { /* two codes a byte, the even column low */
        const uint8_t *b = (const uint8_t *)p->data + r * (cols / 2);
        for (int64_t j0 = 0, g = 0; j0 < cols; j0 += q->block_cols, g++) {
            int64_t j1 = j0 + q->block_cols < cols ? j0 + q->block_cols : cols;
            float sg = s[g];
            for (int64_t j = j0; j < j1; j += 2) {
                uint8_t v = b[j >> 1];
                dst[j] = e2m1_table[v & 0xf] * sg;
                dst[j + 1] = e2m1_table[v >> 4] * sg;
            }
        }
        return;
    }
    /* INT4: two columns a byte, the even one in the low nibble */
    const uint8_t *b = (const uint8_t *)p->data + r * (cols / 2);
    const float *z = q->zeros + (r / q->block_rows) * q->scale_cols;
    if (q->g_idx) { /* act-order: each column names its group */
        for (int64_t j = 0; j < cols; j++) {
            int g = q->g_idx[j];
            float v = (float)((b[j >> 1] >> ((j & 1) * 4)) & 0xf);
            dst[j] = (v - z[g]) * s[g];
        }
        return;
    }
    for (int64_t j0 = 0, g = 0; j0 < cols; j0 += q->block_cols, g++) {
        int64_t j1 = j0 + q->block_cols < cols ? j0 + q->block_cols : cols;
        float sg = s[g], zg = z[g];
        for (int64_t j = j0; j < j1; j += 2) {
            uint8_t v = b[j >> 1];
            dst[j] = ((float)(v & 0xf) - zg) * sg;
            dst[j + 1] = ((float)(v >> 4) - zg) * sg;
        }
    }
}

atlas_status cpu_quant_load(const atlas_weight_src *v, cpu_part *part) {
    const atlas_wquant *q = v->quant;
    int64_t rows = v->shape[0], cols = v->shape[1];
    pthread_once(&e4m3_once, e4m3_init);
    if (q->block_rows < 1 || q->block_cols < 1 || q->scale_cols < 1 || !q->scales)
        return atlas_fail(ATLAS_ERR_INTERNAL, "%s: scale grid of %d x %d blocks, %d columns",
                          v->name, q->block_rows, q->block_cols, q->scale_cols);
    size_t want;
    atlas_dtype dt;
    if (q->format == ATLAS_WFMT_FP8_E4M3) {
        want = (size_t)(rows * cols);
        dt = ATLAS_DTYPE_F8_E4M3;
        if (q->scale_cols != ceil_div(cols, q->block_cols))
            return atlas_fail(ATLAS_ERR_INTERNAL, "%s: %d scale columns for %lld columns in "
                              "blocks of %d", v->name, q->scale_cols, (long long)cols,
                              q->block_cols);
    } else if (q->format == ATLAS_WFMT_INT4) {
        want = (size_t)(rows * (cols / 2));
        dt = ATLAS_DTYPE_U8;
        if (cols % 2 || q->block_rows != 1 || !q->zeros ||
            (!q->g_idx && q->scale_cols != ceil_div(cols, q->block_cols)))
            return atlas_fail(ATLAS_ERR_INTERNAL, "%s: INT4 of %lld columns, groups of %d, "
                              "%d scale columns", v->name, (long long)cols, q->block_cols,
                              q->scale_cols);
    } else if (q->format == ATLAS_WFMT_FP4_E2M1) {
        want = (size_t)(rows * (cols / 2));
        dt = ATLAS_DTYPE_U8;
        if (cols % 2 || q->block_cols % 2 || q->block_rows != 1 || q->zeros || q->g_idx ||
            q->scale_cols != ceil_div(cols, q->block_cols))
            return atlas_fail(ATLAS_ERR_INTERNAL, "%s: FP4 of %lld columns, blocks of %d, "
                              "%d scale columns", v->name, (long long)cols, q->block_cols,
                              q->scale_cols);
    } else {
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: weight format %d is not one the CPU "
                          "backend reads", v->name, (int)q->format);
    }
    if (v->dtype != dt || v->nbytes != want)
        return atlas_fail(ATLAS_ERR_INVALID, "%s: %s weight of %lld x %lld: %zu bytes of %s, "
                          "want %zu of %s", v->name, atlas_wformat_name(q->format),
                          (long long)rows, (long long)cols, v->nbytes,
                          atlas_dtype_name(v->dtype), want, atlas_dtype_name(dt));
    size_t grid = (size_t)ceil_div(rows, q->block_rows) * (size_t)q->scale_cols;
    size_t n_f = grid * (q->zeros ? 2 : 1), n_i = q->g_idx ? (size_t)cols : 0;
    char *owned = malloc(n_f * sizeof(float) + n_i * sizeof(int32_t) + 1);
    if (!owned) return atlas_fail(ATLAS_ERR_NOMEM, "%s: out of memory for its scales", v->name);
    float *scales = (float *)owned, *zeros = q->zeros ? scales + grid : NULL;
    int32_t *g_idx = q->g_idx ? (int32_t *)(scales + n_f) : NULL;
    memcpy(scales, q->scales, grid * sizeof(float));
    if (zeros) memcpy(zeros, q->zeros, grid * sizeof(float));
    for (size_t j = 0; j < n_i; j++) {
        if (q->g_idx[j] < 0 || q->g_idx[j] >= q->scale_cols) {
            free(owned);
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: g_idx[%zu] = %d is not a group (0..%d)",
                              v->name, j, q->g_idx[j], q->scale_cols - 1);
        }
        g_idx[j] = q->g_idx[j];
    }
    part->owned = owned;
    part->quant = *q;
    part->quant.scales = scales;
    part->quant.zeros = zeros;
    part->quant.g_idx = g_idx;
    return ATLAS_OK;
}

/* tests/ckpt.c — see ckpt.h. */
#include "ckpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "model/forward.h"
#include "harness.h"

typedef struct entry {
    char name[128];
    int64_t rows, cols; /* cols 0: a vector */
} entry;

float ckpt_bf16(float x) { return atlas_bf16_to_f32(atlas_f32_to_bf16(x)); }

float ckpt_unit(const char *name, int64_t i) {
    uint64_t h = 1469598103934665603ull;
    for (const char *c = name; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    h ^= (uint64_t)i * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29, h *= 0xBF58476D1CE4E5B9ull, h ^= h >> 32;
    return (float)((double)(h >> 11) / (double)(1ull << 53)) * 2.0f - 1.0f;
}

void ckpt_ref_linear(ckpt_fill fill, void *user, const char *name, int rows, int cols,
                     const double *in, double *out) {
    for (int i = 0; i < rows; i++) {
        double acc = 0;
        for (int j = 0; j < cols; j++)
            acc += ckpt_bf16(fill(user, name, (int64_t)i * cols + j)) * in[j];
        out[i] = acc;
    }
}

void ckpt_ref_rmsnorm(ckpt_fill fill, void *user, const char *name, int64_t j0, double add,
                      const double *x, int d, double eps, double *out) {
    double ms = 0;
    for (int j = 0; j < d; j++) ms += x[j] * x[j];
    double inv = 1.0 / sqrt(ms / d + eps);
    for (int j = 0; j < d; j++) out[j] = x[j] * inv * (add + ckpt_bf16(fill(user, name, j0 + j)));
}

static int64_t count_of(const entry *e) { return e->rows * (e->cols ? e->cols : 1); }

/* The header: {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [b, e]}, ...}, padded
 * with spaces to 8 bytes as the safetensors library does. NULL when out of memory. */
static char *header_of(const entry *t, int n, size_t *len) {
    size_t cap = 64 + (size_t)n * 256, used = 1;
    char *h = malloc(cap);
    if (!h) return NULL;
    strcpy(h, "{");
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        uint64_t bytes = (uint64_t)count_of(&t[i]) * 2;
        char shape[64];
        if (t[i].cols) snprintf(shape, sizeof shape, "%lld,%lld", (long long)t[i].rows,
                                (long long)t[i].cols);
        else snprintf(shape, sizeof shape, "%lld", (long long)t[i].rows);
        used += (size_t)snprintf(h + used, cap - used,
                                 "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%s],"
                                 "\"data_offsets\":[%llu,%llu]}", i ? "," : "", t[i].name, shape,
                                 (unsigned long long)off, (unsigned long long)(off + bytes));
        off += bytes;
    }
    strcpy(h + used++, "}");
    while (used % 8) strcpy(h + used++, " ");
    *len = used;
    return h;
}

static int write_st(const char *dir, const entry *t, int n, ckpt_fill fill, void *user) {
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    size_t len = 0;
    char *h = header_of(t, n, &len);
    FILE *f = h ? fopen(path, "wb") : NULL;
    uint64_t hl = len;
    int ok = f && fwrite(&hl, 8, 1, f) == 1 && fwrite(h, 1, len, f) == len;
    for (int i = 0; ok && i < n; i++)
        for (int64_t j = 0; ok && j < count_of(&t[i]); j++) {
            uint16_t v = atlas_f32_to_bf16(fill(user, t[i].name, j));
            ok = fwrite(&v, 2, 1, f) == 1;
        }
    if (f && fclose(f)) ok = 0;
    free(h);
    CHECK_MSG(ok, "writing %s", path);
    return ok;
}

static int write_model(const char *dir, const atlas_shard_geom *g, const char *drop,
                       const char *prefix, const ckpt_extra *extra, int n_extra, ckpt_fill fill,
                       void *user) {
    int n = g ? atlas_shard_tensor_count(g) : 0, k = 0;
    entry *t = calloc((size_t)(n + n_extra), sizeof *t);
    if (!t) return 0;
    for (int i = 0; i < n; i++) {
        int ndim;
        int64_t shape[2];
        atlas_shard_tensor_info(g, i, t[k].name, sizeof t[k].name, &ndim, shape);
        if (drop && !strcmp(drop, t[k].name)) continue;
        if (prefix && !strncmp(t[k].name, "model.", 6)) {
            char rest[128];
            snprintf(rest, sizeof rest, "%s", t[k].name + 6);
            snprintf(t[k].name, sizeof t[k].name, "%s%s", prefix, rest);
        }
        t[k].rows = shape[0];
        t[k].cols = ndim == 2 ? shape[1] : 0;
        k++;
    }
    for (int i = 0; i < n_extra; i++, k++) {
        snprintf(t[k].name, sizeof t[k].name, "%s", extra[i].name);
        t[k].rows = extra[i].rows;
        t[k].cols = extra[i].cols;
    }
    int ok = write_st(dir, t, k, fill, user);
    free(t);
    return ok;
}

int ckpt_write_model(const char *dir, const atlas_shard_geom *g, const char *drop,
                     const ckpt_extra *extra, int n_extra, ckpt_fill fill, void *user) {
    return write_model(dir, g, drop, NULL, extra, n_extra, fill, user);
}

int ckpt_write_model_prefixed(const char *dir, const atlas_shard_geom *g, const char *prefix,
                              const ckpt_extra *extra, int n_extra, ckpt_fill fill, void *user) {
    return write_model(dir, g, NULL, prefix, extra, n_extra, fill, user);
}

int ckpt_write_tensors(const char *dir, const ckpt_extra *t, int n, ckpt_fill fill, void *user) {
    return write_model(dir, NULL, NULL, NULL, t, n, fill, user);
}

int ckpt_write_text(const char *dir, const char *name, const char *text) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    int ok = f && fputs(text, f) >= 0;
    if (f && fclose(f)) ok = 0;
    CHECK_MSG(ok, "writing %s", path);
    return ok;
}

atlas_model_params ckpt_params(int max_t, int block, int max_blocks) {
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CPU;
    p.load_tokenizer = 0;
    p.n_threads = 2;
    p.max_batch_tokens = max_t;
    p.kv_block_size = block;
    p.kv_tokens = 2 * max_blocks * block;
    return p;
}

atlas_status ckpt_feed(atlas_model *m, int n_seqs, const int32_t *tokens, const int *ctx0,
                       const int *count, const int32_t *rope_len, int max_blocks, bool spread,
                       float *logits) {
    int total = 0;
    for (int s = 0; s < n_seqs; s++) total += count[s];
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)(2 * total + 2 * max_blocks)), *rows;
    if (!pos) return atlas_fail(ATLAS_ERR_NOMEM, "ckpt_feed: out of memory");
    int32_t *table = pos + total, start[3], ctx[2];
    rows = table + 2 * max_blocks;
    int t = 0;
    for (int s = 0; s < n_seqs; s++) {
        start[s] = t;
        for (int i = 0; i < count[s]; i++, t++) pos[t] = ctx0[s] + i, rows[t] = t;
        ctx[s] = ctx0[s] + count[s];
        for (int b = 0; b < max_blocks; b++)
            table[s * max_blocks + b] =
                spread ? (int32_t)((b * 5 + s * 3) % (2 * max_blocks)) : s * max_blocks + b;
    }
    start[n_seqs] = t;
    atlas_batch b = {.n_tokens = t, .tokens = tokens, .positions = pos, .n_seqs = n_seqs,
                     .seq_start = start, .seq_ctx = ctx, .seq_rope_len = rope_len,
                     .block_table = table, .max_blocks = max_blocks, .n_logits = t,
                     .logit_rows = rows};
    atlas_status st = atlas_model_forward(m, &b, logits);
    free(pos);
    return st;
}

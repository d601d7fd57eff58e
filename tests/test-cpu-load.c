/* tests/test-cpu-load.c — the CPU backend's weight reads from a real safetensors file, as the
 * model makes its sources (model/weight_read.h): a matrix of several read pieces (in a huge
 * page mapping), one fused of a small matrix and a part of it, and a vector read at once.
 * weights_done reads them on every thread of the pool into the weights' own memory, byte for
 * byte; a weight freed before weights_done is never read; a weight loaded after it is read
 * by the next begin_batch. A file truncated after it was opened fails weights_done with an
 * I/O error that names the tensor, the file and the offset, and the batches after it until
 * the weights are freed; no read touches the mapping (past the new end: SIGBUS). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cpu/cpu.h"
#include "core/error.h"
#include "format/safetensors.h"
#include "harness.h"
#include "model/weight_read.h"

/* big: 2,600 x 2,048 bf16 (10.2 MiB: three 4 MiB pieces, the last short); small: 40 x 24
 * bf16; vec: 24 f32 */
enum { BIG_R = 2600, BIG_C = 2048, SMALL_R = 40, SMALL_C = 24, VEC = 24, N_T = 3 };

static const char *const names[N_T] = {"big", "small", "vec"};
static size_t sizes[N_T] = {(size_t)BIG_R * BIG_C * 2, (size_t)SMALL_R * SMALL_C * 2, VEC * 4};

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint32_t next_u32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* Writes the checkpoint, big last; data[i] receives tensor i's bytes. Returns where big's
 * data starts in the file. */
static size_t write_checkpoint(const char *path, unsigned char **data) {
    char header[512];
    size_t a = sizes[2], b = a + sizes[1], c = b + sizes[0]; /* vec, small, big */
    int hl = snprintf(header, sizeof header,
                      "{\"vec\":{\"dtype\":\"F32\",\"shape\":[%d],\"data_offsets\":[0,%zu]},"
                      "\"small\":{\"dtype\":\"BF16\",\"shape\":[%d,%d],\"data_offsets\":[%zu,%zu]},"
                      "\"big\":{\"dtype\":\"BF16\",\"shape\":[%d,%d],\"data_offsets\":[%zu,%zu]}}",
                      VEC, a, SMALL_R, SMALL_C, a, b, BIG_R, BIG_C, b, c);
    FILE *f = fopen(path, "wb");
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    CHECK(f && fwrite(len, 1, 8, f) == 8 && fwrite(header, 1, (size_t)hl, f) == (size_t)hl);
    for (int t = N_T - 1; t >= 0; t--) {
        data[t] = malloc(sizes[t]);
        for (size_t i = 0; i < sizes[t]; i += 2) { /* finite f32 halves and any bf16 */
            uint16_t v = (uint16_t)(next_u32() & (t == 2 && i % 4 == 2 ? 0x3fff : 0xffff));
            memcpy(data[t] + i, &v, 2);
        }
        CHECK(f && fwrite(data[t], 1, sizes[t], f) == sizes[t]);
    }
    if (f) fclose(f);
    return 8 + (size_t)hl + b;
}

static bool sources(const atlas_st *st, atlas_weight_file *files, atlas_weight_src *src) {
    for (int i = 0; i < N_T; i++) {
        const atlas_tensor_view *v = atlas_st_find(st, names[i]);
        if (!v) return false;
        atlas_weight_src_of_view(v, &files[i], &src[i]);
        if (!src[i].read) return false;
    }
    return true;
}

static atlas_backend *make_backend(void) {
    static double inv_freq[5] = {1, 0.5, 0.25, 0.125, 0.0625};
    atlas_backend_geom g = {.hidden = 20, .n_heads = 4, .n_kv_heads = 2, .head_dim = 10,
                            .intermediate = 36, .vocab_size = 50, .n_layers = 2,
                            .rms_eps = 1e-5f, .rope_inv_freq = inv_freq,
                            .rope_attn_factor = 1.0, .max_position = 64};
    atlas_backend *be = NULL;
    CHECK_OK(atlas_backend_cpu_create(&g, 2, &be));
    return be;
}

/* big alone; small fused with its first rows again (a second source of one weight); vec. */
static void load_all(atlas_backend *be, atlas_weight_src *src, atlas_weight **w) {
    atlas_weight_src part = src[1];
    part.shape[0] = 8;
    part.nbytes = 8 * SMALL_C * 2;
    const atlas_weight_src *big[1] = {&src[0]}, *small[2] = {&src[1], &part}, *vec[1] = {&src[2]};
    CHECK_OK(be->ops->weight_load(be, big, 1, &w[0]));
    CHECK_OK(be->ops->weight_load(be, small, 2, &w[1]));
    CHECK_OK(be->ops->weight_load(be, vec, 1, &w[2]));
}

static void check_bytes(atlas_weight *const *w, unsigned char *const *data, const char *what) {
    if (!w[0] || !w[1] || !w[2]) return;
    CHECK_MSG(!memcmp(w[0]->parts[0].data, data[0], sizes[0]), "%s: big differs", what);
    CHECK_MSG(!memcmp(w[1]->parts[0].data, data[1], sizes[1]), "%s: small differs", what);
    CHECK_MSG(w[1]->n_parts == 2 && !memcmp(w[1]->parts[1].data, data[1], 8 * SMALL_C * 2),
              "%s: small's second part differs", what);
    float v0;
    memcpy(&v0, data[2], 4);
    CHECK_MSG(w[2]->vec && w[2]->vec[0] == v0, "%s: vec differs", what);
}

static void free_all(atlas_backend *be, atlas_weight **w) {
    for (int i = 0; i < N_T; i++) be->ops->weight_free(be, w[i]), w[i] = NULL;
}

int main(void) {
    char dir[512], path[600];
    if (!harness_mkdtemp(dir, sizeof dir, "cpu-load")) return 2;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unsigned char *data[N_T];
    size_t big_at = write_checkpoint(path, data);
    atlas_backend *be = make_backend();
    atlas_st *st = NULL;
    CHECK_OK(atlas_st_open_file(path, &st));
    atlas_weight_file files[N_T];
    atlas_weight_src src[N_T];
    if (!be || !st || !sources(st, files, src)) {
        CHECK(!"backend, file or sources");
        return harness_finish();
    }
    atlas_weight *w[N_T] = {0};
    load_all(be, src, w);
    CHECK_OK(be->ops->weights_done(be));
    check_bytes(w, data, "weights_done");
    free_all(be, w);

    /* loaded after weights_done: begin_batch reads it before any op runs */
    load_all(be, src, w);
    int32_t tok = 0, pos = 0, start[2] = {0, 1}, table = 0, ctx = 1, row = 0;
    atlas_batch b = {.n_tokens = 1, .tokens = &tok, .positions = &pos, .n_seqs = 1,
                     .seq_start = start, .seq_ctx = &ctx, .block_table = &table,
                     .max_blocks = 1, .n_logits = 1, .logit_rows = &row};
    CHECK_OK(be->ops->begin_batch(be, &b, 16));
    check_bytes(w, data, "begin_batch");
    free_all(be, w);

    /* freed before weights_done: its reads are dropped, never run (their reader's
     * descriptor is made one that is not open: a read would fail) */
    load_all(be, src, w);
    int fd = files[0].fd;
    files[0].fd = 1 << 20;
    be->ops->weight_free(be, w[0]), w[0] = NULL;
    CHECK_OK(be->ops->weights_done(be));
    files[0].fd = fd;
    free_all(be, w);

    /* the file cut short after it was opened, inside big's last piece (the others and the
     * tensors before big are whole) */
    uint64_t cut = big_at + (9u << 20);
    CHECK(truncate(path, (off_t)cut) == 0);
    load_all(be, src, w);
    atlas_status s = be->ops->weights_done(be);
    const char *e = atlas_last_error();
    char at[64];
    snprintf(at, sizeof at, "end of file at %llu", (unsigned long long)cut);
    CHECK_MSG(s == ATLAS_ERR_IO && strstr(e, "reading weight big") && strstr(e, path) &&
              strstr(e, at), "truncated: status %d: %s", s, e);
    /* the weights read in part are never taken as read: a batch fails the same way */
    CHECK(be->ops->begin_batch(be, &b, 16) == ATLAS_ERR_IO);
    free_all(be, w);
    atlas_error_clear();
    CHECK_OK(be->ops->weights_done(be)); /* nothing left queued */

    atlas_st_free(st);
    CHECK_OK(be->ops->destroy(be));
    for (int i = 0; i < N_T; i++) free(data[i]);
    harness_rm_rf(dir);
    return harness_finish();
}

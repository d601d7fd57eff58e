/* tests/test-weight-fill.c — the host side of the CUDA weight upload (backend/cuda/
 * weight_fill.h), without a GPU: a fused weight of bf16, f16 and f32 tensors from a real
 * safetensors file, produced into "staging chunks" cut at many places, must equal the bf16
 * bytes computed here, whether the bf16 sources are read through the model's reader (pread
 * of the file: model/weight_read.h) or from the mapping (an in-memory checkpoint: no reader).
 * A failing read, and a file truncated after it was opened, fail the fill with an error and
 * read nothing from the mapping (which would raise SIGBUS past the file's new end). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda/weight_fill.h"
#include "core/dtype.h"
#include "core/error.h"
#include "format/safetensors.h"
#include "harness.h"
#include "model/weight_read.h"

enum { COLS = 24, ROWS_A = 37, ROWS_B = 5, ROWS_C = 11, N_ELEMS = (ROWS_A + ROWS_B + ROWS_C) * COLS };

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* Writes DIR/model.safetensors (a: bf16, b: f16, c: f32) and the fused bf16 it must give. */
static void write_checkpoint(const char *path, uint16_t *want) {
    char header[512];
    size_t na = (size_t)ROWS_A * COLS * 2, nb = (size_t)ROWS_B * COLS * 2,
           nc = (size_t)ROWS_C * COLS * 4;
    int hl = snprintf(header, sizeof header,
                      "{\"a\":{\"dtype\":\"BF16\",\"shape\":[%d,%d],\"data_offsets\":[0,%zu]},"
                      "\"b\":{\"dtype\":\"F16\",\"shape\":[%d,%d],\"data_offsets\":[%zu,%zu]},"
                      "\"c\":{\"dtype\":\"F32\",\"shape\":[%d,%d],\"data_offsets\":[%zu,%zu]}}",
                      ROWS_A, COLS, na, ROWS_B, COLS, na, na + nb, ROWS_C, COLS, na + nb,
                      na + nb + nc);
    size_t total = 8 + (size_t)hl + na + nb + nc;
    unsigned char *buf = malloc(total);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, (size_t)hl);
    unsigned char *d = buf + 8 + hl;
    size_t w = 0;
    for (size_t i = 0; i < na / 2; i++) { /* any bf16 bits go through unchanged */
        uint16_t v = (uint16_t)next_u32();
        memcpy(d + 2 * i, &v, 2);
        want[w++] = v;
    }
    for (size_t i = 0; i < nb / 2; i++) {
        uint16_t v = (uint16_t)(next_u32() & 0x7bff); /* finite halves */
        memcpy(d + na + 2 * i, &v, 2);
        want[w++] = atlas_f32_to_bf16(atlas_f16_to_f32(v));
    }
    for (size_t i = 0; i < nc / 4; i++) {
        float v = (float)((int32_t)next_u32()) / 65536.0f;
        memcpy(d + na + nb + 4 * i, &v, 4);
        want[w++] = atlas_f32_to_bf16(v);
    }
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(buf, 1, total, f) == total);
    if (f) fclose(f);
    free(buf);
}

/* Produces the whole weight into chunks of chunk bytes, each filled in pieces of at most
 * piece bytes (both even), as the staging pool and its threads do; compares with want.
 * *st: the first fill's failure (then false). */
static bool produce(const atlas_weight_src *const *srcs, size_t chunk, size_t piece,
                    const uint16_t *want, atlas_status *st) {
    *st = ATLAS_OK;
    size_t bytes = (size_t)N_ELEMS * 2;
    char *out = malloc(bytes), *staging = malloc(chunk);
    memset(out, 0xAB, bytes);
    for (size_t off = 0; off < bytes; off += chunk) {
        size_t n = bytes - off < chunk ? bytes - off : chunk;
        memset(staging, 0xCD, chunk);
        for (size_t a = off; a < off + n; a += piece) {
            size_t b = a + piece < off + n ? a + piece : off + n;
            if (*st == ATLAS_OK) *st = atlas_cuda_fill_weight(srcs, 3, staging, off, a, b);
        }
        memcpy(out + off, staging, n);
    }
    bool same = *st == ATLAS_OK && !memcmp(out, want, bytes);
    free(out);
    free(staging);
    return same;
}

static void check_all_cuts(const atlas_weight_src *const *srcs, const uint16_t *want,
                           const char *what) {
    static const size_t chunks[] = {2, 6, 48, 94, 1000, 2 * N_ELEMS};
    static const size_t pieces[] = {2, 10, 46, 512, 2 * N_ELEMS};
    for (size_t i = 0; i < sizeof chunks / sizeof chunks[0]; i++)
        for (size_t j = 0; j < sizeof pieces / sizeof pieces[0]; j++) {
            atlas_status st;
            CHECK_MSG(produce(srcs, chunks[i], pieces[j], want, &st),
                      "%s: chunks of %zu bytes, pieces of %zu: the fused bf16 differs (%s)",
                      what, chunks[i], pieces[j], st ? atlas_last_error() : "no error");
        }
}

/* Every fill of the whole weight fails with an I/O error naming the tensor. */
static void check_fails(const atlas_weight_src *const *srcs, const uint16_t *want,
                        const char *what) {
    atlas_status st;
    CHECK_MSG(!produce(srcs, 94, 46, want, &st) && st == ATLAS_ERR_IO, "%s: status %d", what, st);
    CHECK_MSG(strstr(atlas_last_error(), "reading weight"), "%s: %s", what, atlas_last_error());
    atlas_error_clear();
}

/* The sources of tensors a, b and c, as the model makes them; false when one is missing. */
static bool sources(const atlas_st *st, atlas_weight_file *files, atlas_weight_src *src) {
    static const char *const names[3] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++) {
        const atlas_tensor_view *v = atlas_st_find(st, names[i]);
        if (!v) return false;
        atlas_weight_src_of_view(v, &files[i], &src[i]);
    }
    return true;
}

int main(void) {
    char dir[512], path[600];
    if (!harness_mkdtemp(dir, sizeof dir, "weight-fill")) return 2;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    uint16_t *want = malloc(sizeof(uint16_t) * N_ELEMS);
    write_checkpoint(path, want);

    atlas_st *st = NULL;
    CHECK_OK(atlas_st_open_file(path, &st));
    if (st) {
        atlas_weight_file files[3];
        atlas_weight_src src[3];
        const atlas_weight_src *v[3] = {&src[0], &src[1], &src[2]};
        bool all = sources(st, files, src);
        CHECK(all && src[0].read && src[0].ctx == &files[0]);
        if (all) {
            check_all_cuts(v, want, "pread");
            /* a read that fails (a descriptor that is not open) fails the fill */
            int fd = files[0].fd;
            files[0].fd = 1 << 20;
            check_fails(v, want, "failing pread");
            files[0].fd = fd;
            /* the file cut short after it was opened and mapped, as a re-download does:
             * reading the mapping past the new end would kill the process with SIGBUS */
            CHECK(truncate(path, 64) == 0);
            check_fails(v, want, "truncated file");
        }
        atlas_st_free(st);
    }
    write_checkpoint(path, want);

    /* the same bytes as an in-memory checkpoint: no descriptor, no reader: the mapping */
    FILE *f = fopen(path, "rb");
    static unsigned char raw[1 << 16];
    size_t len = f ? fread(raw, 1, sizeof raw, f) : 0;
    if (f) fclose(f);
    CHECK_OK(atlas_st_open_memory(raw, len, "in-memory", &st));
    if (st) {
        atlas_weight_file files[3];
        atlas_weight_src src[3];
        const atlas_weight_src *v[3] = {&src[0], &src[1], &src[2]};
        bool all = sources(st, files, src);
        CHECK(all && !src[0].read);
        if (all) check_all_cuts(v, want, "memory");
        atlas_st_free(st);
    }
    free(want);
    harness_rm_rf(dir);
    return harness_finish();
}

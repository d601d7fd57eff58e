/* tests/test-gpu-load.c — the weight load paths on a real GPU (label "gpu"; skips without
 * one): ATLAS_LOAD=stage, direct and mix (backend/cuda/direct.h; pieces of 1 MiB, so several
 * a fixture) give the same device weights, bit for bit, and report which path carried them;
 * with ATLAS_TEST_BIG_MODEL (a multi-shard checkpoint: tools/make_checkpoint.py) the same
 * with the default piece size, timed.  Last (it turns direct loading off for the process): a
 * registration the real driver refuses (the test registered the pages already) is staged
 * instead, the bytes land, and nothing of the loader's stays registered.
 * tests/test-direct-load.c checks the same logic through a fake driver on every machine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "atlas/model.h"
#include "backend/cuda/bench_cuda.h"
#include "backend/cuda/cuda_backend.h"
#include "harness.h"
#include "model/forward.h"
#include "model/model_internal.h"
#include "format/safetensors.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static atlas_model *load(const char *dir) {
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CUDA;
    p.load_tokenizer = 0;
    p.max_batch_tokens = 64;
    p.kv_block_size = 16;
    p.kv_tokens = 256;
    atlas_model *m = NULL;
    atlas_status st = atlas_model_load(dir, &p, &m);
    CHECK_MSG(st == ATLAS_OK, "loading %s: %s", dir, atlas_last_error());
    return m;
}

/* Every device weight of a CUDA model, in model order, downloaded into one buffer. */
static unsigned char *download_weights(atlas_model *m, size_t *len) {
    const atlas_model_weights *w = &m->w;
    const atlas_weight **all = malloc(sizeof *all * (3 + 9 * (size_t)w->n_layers));
    int n = 0;
    all[n++] = w->embed;
    all[n++] = w->norm;
    if (w->lm_head != w->embed) all[n++] = w->lm_head;
    for (int l = 0; l < w->n_layers; l++) {
        const atlas_layer_weights *lw = &w->layers[l];
        const atlas_weight *lws[] = {lw->attn_norm, lw->qkv, lw->qkv_bias, lw->q_norm, lw->k_norm,
                                     lw->o, lw->mlp_norm, lw->gate_up, lw->down};
        for (int i = 0; i < 9; i++)
            if (lws[i]) all[n++] = lws[i];
    }
    size_t total = 0;
    for (int i = 0; i < n; i++) total += (size_t)all[i]->rows * all[i]->cols * 2;
    unsigned char *buf = malloc(total);
    size_t off = 0;
    for (int i = 0; buf && i < n; i++) {
        size_t b = (size_t)all[i]->rows * all[i]->cols * 2;
        CHECK_OK(ATLAS_CU(cuMemcpyDtoH, buf + off, all[i]->ptr, b));
        off += b;
    }
    free(all);
    *len = total;
    return buf;
}

/* The three load paths give the same weights; piece_mb NULL: the default piece size. */
static void test_load_paths(const char *dir, const char *piece_mb) {
    const char *modes[] = {"stage", "direct", "mix"};
    unsigned char *ref = NULL;
    size_t ref_len = 0;
    if (piece_mb) setenv("ATLAS_LOAD_PIECE_MB", piece_mb, 1);
    setenv("ATLAS_LOAD_STAGE_PCT", "50", 1);
    for (int i = 0; i < 3; i++) {
        setenv("ATLAS_LOAD", modes[i], 1);
        double t0 = now_s();
        atlas_model *g = load(dir);
        double dt = now_s() - t0;
        if (!g) continue;
        atlas_cuda_load_info li;
        CHECK_OK(atlas_cuda_load_info_get(atlas_model_backend(g), &li));
        printf("%s ATLAS_LOAD=%s: load %.3f s (%.1f GB/s); %zu bytes direct, %zu staged, %d "
               "pieces of %zu KiB (%d staged), direct run %.1f ms%s%s\n", dir, li.mode, dt,
               (li.direct_bytes + li.staged_bytes) / 1e9 / dt, li.direct_bytes, li.staged_bytes,
               li.pieces, li.piece_bytes >> 10, li.pieces_staged, li.direct_ms,
               li.refused[0] ? "; refused: " : "", li.refused);
        CHECK(!strcmp(li.mode, modes[i]));
        if (i == 0) {
            CHECK(li.direct_bytes == 0 && li.staged_bytes > 0 && li.pieces == 0);
        } else if (li.refused[0]) {
            printf("note: direct loading refused on this machine: only the fallback was tested\n");
            CHECK(li.direct_bytes == 0);
        } else {
            CHECK_MSG(li.direct_bytes > 0 && li.pieces > 1, "%s %s: nothing loaded directly",
                      dir, modes[i]);
            if (i == 1) CHECK(li.staged_bytes == 0 && li.pieces_staged == 0);
            else CHECK(li.staged_bytes > 0 && li.pieces_staged > 0);
        }
        size_t len = 0;
        unsigned char *buf = download_weights(g, &len);
        if (i == 0) {
            ref = buf;
            ref_len = len;
        } else {
            CHECK_MSG(buf && ref && len == ref_len && !memcmp(buf, ref, len),
                      "%s: weights loaded with ATLAS_LOAD=%s differ from the staged ones", dir,
                      modes[i]);
            free(buf);
        }
        CHECK_OK(atlas_model_release(g));
    }
    free(ref);
    unsetenv("ATLAS_LOAD");
    unsetenv("ATLAS_LOAD_PIECE_MB");
    unsetenv("ATLAS_LOAD_STAGE_PCT");
}

static atlas_status stage_copy(void *user, CUdeviceptr dst, const char *src, int fd,
                               uint64_t file_off, size_t bytes) {
    (void)fd, (void)file_off;
    return atlas_host_upload_copy(user, dst, src, bytes);
}

/* The driver refuses a registration (its pages are registered already, here by the test):
 * the loader stages that piece and the rest, the bytes land, nothing of its own stays
 * registered, and direct loading is off for the rest of the process. */
static void test_refused(const char *dir) {
    if (atlas_direct_refused()[0]) {
        printf("refused: skipped, direct loading is off already: %s\n", atlas_direct_refused());
        return;
    }
    atlas_st *st = NULL;
    atlas_host *host = NULL;
    CHECK_OK(atlas_st_open_dir(dir, &st));
    CHECK_OK(atlas_host_get(0, &host));
    if (!st || !host) goto out;
    const atlas_tensor_view *v = atlas_st_at(st, 0);
    size_t n = atlas_st_count(st), last = 0;
    for (size_t i = 0; i < n; i++) {
        const atlas_tensor_view *t = atlas_st_at(st, i);
        if (t->fd == v->fd && t->file_offset + t->nbytes > last) last = t->file_offset + t->nbytes;
    }
    char *base = (char *)v->data - v->file_offset;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), span = (last + pg - 1) / pg * pg;
    CHECK(atlas_direct_eligible(v->data, v->fd, v->file_offset));
    CHECK_OK(ATLAS_CU(cuMemHostRegister, base, span, ATLAS_CU_MEMHOSTREGISTER_READ_ONLY));
    atlas_direct_opts o = {(size_t)1 << 20, 2, 0, 0};
    atlas_direct *d = NULL;
    CHECK_OK(atlas_direct_create(host, &o, stage_copy, host, &d));
    CUdeviceptr dev = 0;
    CHECK_OK(ATLAS_CU(cuMemAlloc, &dev, last));
    size_t queued = 0;
    for (size_t i = 0; d && dev && i < n; i++) {
        const atlas_tensor_view *t = atlas_st_at(st, i);
        if (t->fd != v->fd) continue;
        CHECK_OK(atlas_direct_add(d, dev + t->file_offset, t->data, t->fd, t->file_offset,
                                  t->nbytes));
        queued += t->nbytes;
    }
    atlas_direct_stats s;
    CHECK_OK(atlas_direct_run(d, &s));
    printf("refused: %zu bytes direct, %zu staged (%d pieces): %s\n", s.direct_bytes,
           s.staged_bytes, s.pieces, atlas_direct_refused());
    CHECK(s.direct_bytes == 0 && s.staged_bytes == queued && s.pieces_staged == s.pieces);
    CHECK(atlas_direct_refused()[0] != '\0');
    CHECK(!atlas_direct_eligible(v->data, v->fd, v->file_offset));
    unsigned char *back = malloc(last);
    if (back && dev) {
        CHECK_OK(ATLAS_CU(cuMemcpyDtoH, back, dev, last));
        for (size_t i = 0; i < n; i++) {
            const atlas_tensor_view *t = atlas_st_at(st, i);
            if (t->fd == v->fd)
                CHECK_MSG(!memcmp(back + t->file_offset, t->data, t->nbytes), "%s: %s differs",
                          dir, t->name);
        }
    }
    free(back);
    /* the test's registration is still the only one: it unregisters cleanly */
    CHECK_OK(ATLAS_CU(cuMemHostUnregister, base));
    if (dev) CHECK_OK(ATLAS_CU(cuMemFree, dev));
    atlas_direct_free(d);
out:
    atlas_st_free(st);
}

int main(void) {
    char dir[2][512];
    snprintf(dir[0], sizeof dir[0], "%s/tiny-llama3", harness_data_dir());
    snprintf(dir[1], sizeof dir[1], "%s/tiny-qwen3", harness_data_dir());
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CUDA;
    p.load_tokenizer = 0;
    atlas_model *probe = NULL;
    atlas_status st = atlas_model_load(dir[1], &p, &probe);
    if (st == ATLAS_ERR_NO_DEVICE) {
        printf("SKIP: no CUDA device: %s\n", atlas_last_error());
        return 0;
    }
    CHECK_OK(st);
    CHECK_OK(atlas_model_release(probe));
    test_load_paths(dir[0], "1");
    test_load_paths(dir[1], "1");
    const char *big = getenv("ATLAS_TEST_BIG_MODEL");
    if (big && *big) test_load_paths(big, NULL);
    else printf("big model: skipped (set ATLAS_TEST_BIG_MODEL to a checkpoint directory)\n");
    test_refused(dir[0]); /* last: direct loading is off after it */
    return harness_finish();
}

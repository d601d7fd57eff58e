/* tests/test-engine-kvhost.c — a released model's prefix KV kept in host memory
 * (atlas_engine_params.host_cache), on the CPU with the fixture models (tests/data/tiny-llama3
 * as A, tiny-qwen3 as B) and one model resident at a time:
 * - a conversation on A, a request for B (A is released, its blocks saved), and the next
 *   turn on A: the turn reports the conversation's blocks as cached, restored from host
 *   memory, and answers token for token as the same turn does on an engine that never
 *   swapped;
 * - a request of another cache_salt takes nothing from the store;
 * - with no host cache nothing is saved and the turn computes its whole prompt;
 * - A's files changed while it was out: its blocks are dropped at its next load;
 * - the store alone, on tiny-llama3's cache: a chain's K/V comes back byte for byte into
 *   another pool; a store short of room keeps a chain's first blocks; saving again copies
 *   nothing new; room for another chain is made from the old one's last blocks; another
 *   salt or first block finds nothing; another identity (KV type, geometry) drops it all;
 * the store's memory goes with the engine (LeakSanitizer in CI). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "atlas/engine.h"
#include "engine/kv_host.h"
#include "engine_wait.h"
#include "harness.h"
#include "model/forward.h"

enum { TURN1 = 70, EXTRA = 9, N_OUT = 12, MAX_OUT = 32 };

typedef struct answer {
    int32_t ids[MAX_OUT];
    int n_ids, cached;
    atlas_finish finish;
    char msg[256];
} answer;

static void on_event(const atlas_event *ev, void *user) {
    answer *a = user;
    if (ev->type == ATLAS_EVENT_TOKEN) {
        if (a->n_ids < MAX_OUT) a->ids[a->n_ids++] = ev->id;
        return;
    }
    a->finish = ev->finish;
    a->cached = ev->usage.cached_tokens;
    snprintf(a->msg, sizeof a->msg, "%s", ev->message);
}

static answer run(atlas_engine *e, const char *model, const int32_t *ids, int n,
                  const char *salt) {
    atlas_request r = {.model = model, .prompt = ids, .n_prompt = (size_t)n,
                       .max_tokens = N_OUT, .ignore_eos = 1, .cache_salt = salt};
    r.sampling = atlas_sampler_default_params();
    r.sampling.temperature = 0;
    answer a = {0};
    CHECK_OK(engine_wait_run(e, &r, on_event, &a));
    CHECK_MSG(a.finish == ATLAS_FINISH_LENGTH && a.n_ids == N_OUT, "%s: finish %d, %d ids: %s",
              model, (int)a.finish, a.n_ids, a.msg);
    return a;
}

static atlas_engine *engine_new(const char *dir_a, size_t host_cache) {
    static char dir_b[1024];
    snprintf(dir_b, sizeof dir_b, "%s", harness_data_path("tiny-qwen3"));
    atlas_engine_model models[2] = {{.name = "a", .dir = dir_a}, {.name = "b", .dir = dir_b}};
    atlas_engine_params p = atlas_engine_default_params();
    p.models = models;
    p.n_models = 2;
    p.max_resident = 1;
    p.ctx_size = 256;
    p.parallel = 2;
    p.batch_tokens = 256;
    p.device = ATLAS_DEVICE_CPU;
    p.n_threads = 2;
    p.host_cache = host_cache;
    atlas_engine *e = NULL;
    CHECK_OK(atlas_engine_create(&p, &e));
    return e;
}

static atlas_engine_metrics metrics(atlas_engine *e) {
    atlas_engine_metrics m;
    atlas_engine_get_metrics(e, &m);
    return m;
}

/* The first turn's prompt; the second is it, the first turn's answer and EXTRA tokens. */
static int turn2_of(const int32_t *turn1, const answer *a1, int32_t *out) {
    int n = 0;
    for (int i = 0; i < TURN1; i++) out[n++] = turn1[i];
    for (int i = 0; i < a1->n_ids; i++) out[n++] = a1->ids[i];
    for (int i = 0; i < EXTRA; i++) out[n++] = 500 + 37 * i;
    return n;
}

static const int32_t B_PROMPT[] = {11, 22, 33, 44, 55, 66, 77, 88, 99};

/* The conversation with a swap to B between its turns; returns the second turn's answer. */
static answer converse(atlas_engine *e, const int32_t *t1, const char *salt1,
                       const char *salt2) {
    answer a1 = run(e, "a", t1, TURN1, salt1);
    int32_t t2[TURN1 + MAX_OUT + EXTRA];
    int n2 = turn2_of(t1, &a1, t2);
    run(e, "b", B_PROMPT, (int)(sizeof B_PROMPT / sizeof *B_PROMPT), NULL);
    return run(e, "a", t2, n2, salt2);
}

enum { SB = 16 }; /* tokens a block */

/* A chain of n blocks of tokens toks in pool p, its K/V the images img (written through the
 * model's restore), released: registered and cached. */
static void chain_into(atlas_model *m, atlas_kv_pool *p, const int32_t *toks, int n,
                       void **img) {
    atlas_kv_table t;
    CHECK_OK(atlas_kv_table_init(&t, 16, NULL, 0));
    CHECK(atlas_kv_table_reserve(p, &t, n * SB));
    CHECK_OK(atlas_model_kv_restore(m, t.ids, n, (const void *const *)img));
    atlas_kv_table_release(p, &t, toks, n * SB);
    atlas_kv_table_destroy(&t);
}

/* Restores what h has of toks[n] into a fresh pool; checks the bytes against img; returns
 * the blocks restored. */
static int restored(atlas_kv_host *h, atlas_model *m, const int32_t *toks, int n,
                    const char *salt, void **img, size_t bb) {
    atlas_kv_pool q;
    atlas_kv_pool_params kp = {.n_blocks = 16, .block_size = SB};
    CHECK_OK(atlas_kv_pool_init(&q, &kp));
    atlas_kv_table t;
    CHECK_OK(atlas_kv_table_init(&t, 16, salt, salt ? strlen(salt) : 0));
    atlas_kv_host_moved mv;
    int got = atlas_kv_host_restore(h, 0, m, &q, &t, toks, n, &mv) / SB;
    CHECK(mv.blocks == (uint64_t)got && t.n == got);
    unsigned char *back = malloc(bb);
    for (int i = 0; i < got && back; i++) {
        CHECK_OK(atlas_model_kv_save(m, &t.ids[i], 1, (void *[]){back}));
        CHECK_MSG(!memcmp(back, img[i], bb), "block %d", i);
    }
    free(back);
    atlas_kv_table_release(&q, &t, toks, t.n * SB);
    atlas_kv_table_destroy(&t);
    atlas_kv_pool_destroy(&q);
    return got;
}

static void test_store(const char *dir) {
    atlas_model_params mp = atlas_model_default_params();
    mp.device = ATLAS_DEVICE_CPU;
    mp.kv_blocks = 16;
    mp.kv_block_size = SB;
    mp.n_threads = 1;
    mp.load_tokenizer = 0;
    atlas_model *m = NULL;
    CHECK_OK(atlas_model_load(dir, &mp, &m));
    if (!m) return;
    size_t bb = atlas_model_kv_block_bytes(m), entry = bb + SB * sizeof(int32_t);
    CHECK(bb > 0);
    enum { NB = 5 };
    unsigned char *imgs = malloc(2 * NB * bb);
    void *img[NB], *img2[NB];
    for (size_t i = 0; i < 2 * NB * bb; i++) imgs[i] = (unsigned char)(i * 131 + i / bb);
    for (int i = 0; i < NB; i++) img[i] = imgs + i * bb, img2[i] = imgs + (NB + i) * bb;
    int32_t toks[NB * SB + 1], other[NB * SB + 1];
    for (int i = 0; i <= NB * SB; i++) toks[i] = 100 + i, other[i] = 900 + i;
    atlas_kv_pool p;
    atlas_kv_pool_params kp = {.n_blocks = 16, .block_size = SB};
    CHECK_OK(atlas_kv_pool_init(&p, &kp));
    chain_into(m, &p, toks, NB, img);
    atlas_kv_host_ident id = {.files = 1, .block_bytes = bb, .block_size = SB, .n_layers = 2,
                              .n_kv_heads = 2, .head_dim = 64, .kv_dtype = "f32",
                              .backend = "cpu"};
    atlas_kv_host_moved mv;

    atlas_kv_host *h = NULL; /* room for two blocks and a half: the first two */
    CHECK_OK(atlas_kv_host_create(2 * entry + entry / 2, 1, NULL, &h));
    atlas_kv_host_save(h, 0, &id, m, &p, &mv);
    CHECK(mv.blocks == 2 && atlas_kv_host_blocks(h) == 2 && mv.bytes == 2 * bb);
    CHECK(restored(h, m, toks, NB * SB + 1, NULL, img, bb) == 2);
    atlas_kv_host_free(h);

    CHECK_OK(atlas_kv_host_create(NB * entry, 1, NULL, &h));
    atlas_kv_host_save(h, 0, &id, m, &p, &mv);
    CHECK(mv.blocks == NB && atlas_kv_host_blocks(h) == NB);
    atlas_kv_host_save(h, 0, &id, m, &p, &mv); /* the same blocks: nothing copied */
    CHECK(mv.blocks == 0 && mv.dropped == 0 && atlas_kv_host_blocks(h) == NB);
    /* a whole chain back, but a token left to compute: 4 blocks of an 80-token prompt */
    CHECK(restored(h, m, toks, NB * SB + 1, NULL, img, bb) == NB);
    CHECK(restored(h, m, toks, NB * SB, NULL, img, bb) == NB - 1);
    CHECK(restored(h, m, toks, NB * SB + 1, "tenant", img, bb) == 0);
    CHECK(restored(h, m, other, NB * SB + 1, NULL, img, bb) == 0);
    /* another chain of 3 takes the room of the first one's last 3 blocks */
    atlas_kv_pool_destroy(&p);
    CHECK_OK(atlas_kv_pool_init(&p, &kp));
    chain_into(m, &p, other, 3, img2);
    atlas_kv_host_save(h, 0, &id, m, &p, &mv);
    CHECK(mv.blocks == 3 && mv.dropped == 3 && atlas_kv_host_blocks(h) == NB);
    CHECK(restored(h, m, toks, NB * SB + 1, NULL, img, bb) == 2);
    CHECK(restored(h, m, other, NB * SB + 1, NULL, img2, bb) == 3);
    /* the same model: kept; another KV type, block or geometry: dropped */
    atlas_kv_host_check(h, 0, &id, &mv);
    CHECK(mv.dropped == 0 && atlas_kv_host_blocks(h) == NB);
    atlas_kv_host_ident f16 = id;
    snprintf(f16.kv_dtype, sizeof f16.kv_dtype, "bf16");
    atlas_kv_host_check(h, 0, &f16, &mv);
    CHECK(mv.dropped == NB && atlas_kv_host_blocks(h) == 0 && atlas_kv_host_bytes(h) == 0);
    chain_into(m, &p, toks, 1, img);
    atlas_kv_host_save(h, 0, &id, m, &p, &mv); /* saved as id again: f16's go */
    CHECK(mv.blocks >= 1 && atlas_kv_host_blocks(h) >= 1);
    atlas_kv_host_ident deeper = id;
    deeper.n_layers = 3;
    atlas_kv_host_check(h, 0, &deeper, &mv);
    CHECK(mv.dropped >= 1 && atlas_kv_host_blocks(h) == 0);
    atlas_kv_host_free(h);
    atlas_kv_pool_destroy(&p);
    free(imgs);
    CHECK_OK(atlas_model_release(m));
}

int main(void) {
    char dir_a[4096]; /* absolute: the links below point at it */
    if (!realpath(harness_data_path("tiny-llama3"), dir_a)) {
        fprintf(stderr, "no tests/data/tiny-llama3\n");
        return 1;
    }
    test_store(dir_a);
    int32_t t1[TURN1];
    for (int i = 0; i < TURN1; i++) t1[i] = 1000 + (i * 7919) % 20000;

    /* the reference: the same two turns on an engine that never swaps */
    atlas_engine *ref = engine_new(dir_a, 0);
    answer r1 = run(ref, "a", t1, TURN1, NULL);
    int32_t t2[TURN1 + MAX_OUT + EXTRA];
    int n2 = turn2_of(t1, &r1, t2);
    answer r2 = run(ref, "a", t2, n2, NULL);
    atlas_engine_free(ref);
    /* its KV holds the first turn but its last token: whole blocks of that */
    int blocks = (TURN1 + N_OUT - 1) / 16;

    atlas_engine *e = engine_new(dir_a, (size_t)64 << 20);
    answer a2 = converse(e, t1, NULL, NULL);
    atlas_engine_metrics m = metrics(e);
    CHECK_MSG(a2.cached == blocks * 16, "cached %d, want %d", a2.cached, blocks * 16);
    CHECK_MSG(m.kv_host_restored_blocks == (uint64_t)blocks, "restored %llu of %d",
              (unsigned long long)m.kv_host_restored_blocks, blocks);
    CHECK(m.kv_host_saved_blocks >= (uint64_t)blocks && m.kv_host_blocks > 0 &&
          m.kv_host_bytes > 0 && m.kv_host_restored_bytes > 0 && m.swaps == 2);
    CHECK(!memcmp(a2.ids, r2.ids, sizeof a2.ids));
    /* A is released again: the blocks it restored are in the store already (not copied
     * twice), and its own new ones are added */
    uint64_t saved = m.kv_host_saved_blocks;
    run(e, "b", B_PROMPT, (int)(sizeof B_PROMPT / sizeof *B_PROMPT), NULL);
    m = metrics(e);
    CHECK_MSG(m.kv_host_saved_blocks - saved <= (uint64_t)((n2 + N_OUT) / 16 - blocks),
              "saved %llu more", (unsigned long long)(m.kv_host_saved_blocks - saved));

    /* another salt: its second turn finds nothing of the first's (salted "x") */
    uint64_t restored = m.kv_host_restored_blocks;
    int32_t s1[TURN1];
    for (int i = 0; i < TURN1; i++) s1[i] = 2000 + (i * 104729) % 20000;
    answer s2 = converse(e, s1, "x", "y");
    m = metrics(e);
    CHECK_MSG(s2.cached == 0 && m.kv_host_restored_blocks == restored, "cached %d", s2.cached);
    atlas_engine_free(e);

    /* no host cache: nothing saved, nothing restored */
    e = engine_new(dir_a, 0);
    answer z2 = converse(e, t1, NULL, NULL);
    m = metrics(e);
    CHECK(z2.cached == 0 && m.kv_host_saved_blocks == 0 && m.kv_host_blocks == 0);
    CHECK(!memcmp(z2.ids, r2.ids, sizeof z2.ids));
    atlas_engine_free(e);

    /* a budget below the weights' bytes: on the CPU no weights are kept (no host tier), so
     * a load leaves the KV blocks their whole budget */
    e = engine_new(dir_a, (size_t)2 << 20);
    answer w2 = converse(e, t1, NULL, NULL);
    m = metrics(e);
    CHECK_MSG(w2.cached == blocks * 16 && m.host_tier_pinned == 0, "cached %d, want %d",
              w2.cached, blocks * 16);
    atlas_engine_free(e);

    /* A's files change while it is out: its blocks are dropped when it is back */
    char tmp[1024], path[4200], src[4200];
    if (!harness_mkdtemp(tmp, sizeof tmp, "kvhost")) return harness_finish();
    static const char *files[] = {"config.json", "generation_config.json", "model.safetensors",
                                  "tokenizer.json", "tokenizer_config.json"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(src, sizeof src, "%s/%s", dir_a, files[i]);
        snprintf(path, sizeof path, "%s/%s", tmp, files[i]);
        CHECK(symlink(src, path) == 0);
    }
    e = engine_new(tmp, (size_t)64 << 20);
    answer c1 = run(e, "a", t1, TURN1, NULL);
    run(e, "b", B_PROMPT, (int)(sizeof B_PROMPT / sizeof *B_PROMPT), NULL);
    m = metrics(e);
    CHECK(m.kv_host_saved_blocks >= (uint64_t)blocks && m.kv_host_dropped_blocks == 0);
    /* a copy of a file in place of its link: the same bytes, another file */
    snprintf(path, sizeof path, "%s/generation_config.json", tmp);
    snprintf(src, sizeof src, "%s/generation_config.json", dir_a);
    FILE *in = fopen(src, "rb");
    char buf[4096];
    size_t got = in ? fread(buf, 1, sizeof buf, in) : 0;
    if (in) fclose(in);
    CHECK(got > 0 && unlink(path) == 0);
    FILE *out = fopen(path, "wb");
    CHECK(out && fwrite(buf, 1, got, out) == got);
    if (out) fclose(out);
    struct timespec ts[2] = {{0, UTIME_NOW}, {12345, 0}}; /* a modification time of its own */
    CHECK(utimensat(AT_FDCWD, path, ts, 0) == 0);
    int32_t c2[TURN1 + MAX_OUT + EXTRA];
    int nc2 = turn2_of(t1, &c1, c2);
    answer d2 = run(e, "a", c2, nc2, NULL);
    m = metrics(e);
    CHECK_MSG(d2.cached == 0 && m.kv_host_dropped_blocks >= (uint64_t)blocks &&
              m.kv_host_restored_blocks == 0, "cached %d, dropped %llu", d2.cached,
              (unsigned long long)m.kv_host_dropped_blocks);
    CHECK(!memcmp(d2.ids, r2.ids, sizeof d2.ids));
    atlas_engine_free(e);
    harness_rm_rf(tmp);
    return harness_finish();
}

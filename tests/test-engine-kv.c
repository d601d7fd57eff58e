/* tests/test-engine-kv.c — the KV block manager and its prefix cache against a shadow
 * model of what each block holds: random sequences over a small alphabet (so prefixes
 * repeat) take cached blocks, grow, and are released, many times over.  Every block a
 * sequence gets from the cache must hold exactly that sequence's tokens; no block is ever
 * held by two sequences unless it came from the cache; counts add up; all blocks come back. */
#include <stdlib.h>
#include <string.h>

#include "engine/kv.h"
#include "harness.h"

enum { N_BLOCKS = 48, BS = 4, MAX_TOK = 40, N_SEQS = 6, ROUNDS = 20000 };

typedef struct shadow_seq {
    atlas_kv_table t;
    int32_t tokens[MAX_TOK];
    int n, n_final, live;
    int own_from; /* blocks before this came from the cache */
} shadow_seq;

static int32_t content[N_BLOCKS][BS]; /* what the "model" wrote into each block */
static int writers[N_BLOCKS];         /* sequences that may write to it (must stay <= 1) */

static uint64_t rng = 12345;
static int rnd(int n) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (int)((rng >> 33) % (uint64_t)n);
}

/* Writes positions [from, to) of s into its blocks, as a forward pass would. */
static void write_tokens(shadow_seq *s, int from, int to) {
    for (int p = from; p < to; p++) content[s->t.ids[p / BS]][p % BS] = s->tokens[p];
}

static void start(atlas_kv_pool *pool, shadow_seq *s) {
    s->n = 1 + rnd(MAX_TOK - 8);
    for (int i = 0; i < s->n; i++) s->tokens[i] = rnd(3); /* few symbols: shared prefixes */
    int cached = atlas_kv_table_match(pool, &s->t, s->tokens, s->n);
    CHECK(cached % BS == 0 && cached < s->n && cached == s->t.n * BS);
    for (int b = 0; b < s->t.n; b++)
        CHECK_MSG(!memcmp(content[s->t.ids[b]], s->tokens + b * BS, sizeof content[0]),
                  "cached block %d holds other tokens", (int)s->t.ids[b]);
    if (!atlas_kv_table_reserve(pool, &s->t, s->n)) {
        atlas_kv_table_release(pool, &s->t, s->tokens, cached);
        return;
    }
    s->own_from = cached / BS;
    for (int b = s->own_from; b < s->t.n; b++) writers[s->t.ids[b]]++;
    write_tokens(s, cached, s->n);
    s->n_final = s->n;
    s->live = 1;
}

static void grow(atlas_kv_pool *pool, shadow_seq *s) {
    if (s->n >= MAX_TOK) return;
    int old_blocks = s->t.n;
    if (!atlas_kv_table_reserve(pool, &s->t, s->n + 1)) return;
    for (int b = old_blocks; b < s->t.n; b++) writers[s->t.ids[b]]++;
    s->tokens[s->n] = rnd(3);
    write_tokens(s, s->n, s->n + 1);
    s->n++;
    s->n_final = s->n;
}

static void finish(atlas_kv_pool *pool, shadow_seq *s) {
    for (int b = s->own_from; b < s->t.n; b++) writers[s->t.ids[b]]--;
    atlas_kv_table_release(pool, &s->t, s->tokens, s->n_final);
    CHECK(s->t.n == 0);
    s->live = 0;
}

int main(void) {
    atlas_kv_pool pool;
    CHECK_OK(atlas_kv_pool_init(&pool, N_BLOCKS, BS));
    shadow_seq seqs[N_SEQS];
    memset(seqs, 0, sizeof seqs);
    for (int i = 0; i < N_SEQS; i++) CHECK_OK(atlas_kv_table_init(&seqs[i].t, MAX_TOK / BS));
    int hits = 0;
    for (int r = 0; r < ROUNDS; r++) {
        shadow_seq *s = &seqs[rnd(N_SEQS)];
        if (!s->live) {
            start(&pool, s);
            hits += s->live && s->own_from > 0;
        } else if (rnd(4) == 0) {
            finish(&pool, s);
        } else {
            grow(&pool, s);
        }
        for (int b = 0; b < N_BLOCKS; b++)
            if (writers[b] > 1) {
                CHECK_MSG(0, "block %d written by %d sequences", b, writers[b]);
                writers[b] = 1;
            }
        int held = 0;
        for (int i = 0; i < N_SEQS; i++) held += seqs[i].t.n;
        CHECK(atlas_kv_pool_used(&pool) <= held);
        CHECK(atlas_kv_pool_used(&pool) + atlas_kv_pool_free(&pool) == N_BLOCKS);
    }
    for (int i = 0; i < N_SEQS; i++)
        if (seqs[i].live) finish(&pool, &seqs[i]);
    CHECK(atlas_kv_pool_used(&pool) == 0 && atlas_kv_pool_free(&pool) == N_BLOCKS);
    CHECK(atlas_kv_pool_cached(&pool) > 0);
    CHECK_MSG(hits > 100, "only %d starts took cached blocks", hits);
    for (int i = 0; i < N_SEQS; i++) atlas_kv_table_destroy(&seqs[i].t);
    atlas_kv_pool_destroy(&pool);
    atlas_kv_pool_destroy(&pool); /* a destroyed pool is zeroed: destroying again is fine */
    return harness_finish();
}

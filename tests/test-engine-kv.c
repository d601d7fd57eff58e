/* tests/test-engine-kv.c — the KV block manager and its prefix cache.
 *
 * A shadow model of what each block holds: random sequences over a small alphabet (so
 * prefixes repeat), each with one of a few salts, take cached blocks, grow (registering
 * their full blocks as they go), and are released, many times over.  Every block a sequence gets from the cache must hold exactly
 * that sequence's tokens and have been written under its salt; no block is ever held by two
 * sequences unless it came from the cache; counts add up; all blocks come back.  The walk
 * runs under the default keyed hash and under injected hashes that collide all the time, as
 * does a set of hand-made cases: blocks of the same hash (different tokens, or the same
 * tokens after a different prefix or under a different salt) are told apart, and a block
 * whose predecessor was evicted and reused is not taken after the new one; chains are
 * evicted from their tails; blocks are shared while their sequence still runs, once the
 * step that wrote them ran. */
#include <stdlib.h>
#include <string.h>

#include "engine/kv.h"
#include "harness.h"

enum { N_BLOCKS = 48, BS = 4, MAX_TOK = 40, N_SEQS = 6, ROUNDS = 40000, N_SALTS = 3 };

/* The salts of the walk: none, and two that differ only after a NUL byte. */
static const char *const salts[N_SALTS] = {NULL, "s\0a", "s\0b"};
static const size_t salt_lens[N_SALTS] = {0, 3, 3};

typedef struct shadow_seq {
    atlas_kv_table t;
    int salt;
    int32_t tokens[MAX_TOK];
    int n, n_final, live;
    int own_from; /* blocks before this came from the cache */
} shadow_seq;

static int32_t content[N_BLOCKS][BS]; /* what the "model" wrote into each block */
static int content_salt[N_BLOCKS];    /* the salt of the sequence that wrote it */
static int writers[N_BLOCKS];         /* sequences that may write to it (must stay <= 1) */

static uint64_t rng = 12345;
static int rnd(int n) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (int)((rng >> 33) % (uint64_t)n);
}

/* ---- injected hashes -------------------------------------------------------------------- */

/* Every block of every prefix and salt under one hash. */
static uint64_t hash_const(void *ctx, uint64_t prev, const void *bytes, size_t n) {
    (void)ctx, (void)prev, (void)bytes, (void)n;
    return 42;
}

/* Four hashes in all (prev is ignored, so equal blocks after different prefixes collide
 * too); counts its calls, to show that the hash is the one used. */
static uint64_t hash_2bit(void *ctx, uint64_t prev, const void *bytes, size_t n) {
    (void)prev;
    ++*(long *)ctx;
    const unsigned char *b = bytes;
    unsigned s = 0;
    for (size_t i = 0; i < n; i++) s += b[i];
    return 1 + (s & 3);
}

/* ---- the shadow walk -------------------------------------------------------------------- */

/* Writes positions [from, to) of s into its blocks, as a forward pass would. */
static void write_tokens(shadow_seq *s, int from, int to) {
    for (int p = from; p < to; p++) {
        content[s->t.ids[p / BS]][p % BS] = s->tokens[p];
        content_salt[s->t.ids[p / BS]] = s->salt;
    }
}

static void start(atlas_kv_pool *pool, shadow_seq *s) {
    atlas_kv_table_destroy(&s->t);
    s->salt = rnd(N_SALTS);
    CHECK_OK(atlas_kv_table_init(&s->t, MAX_TOK / BS, salts[s->salt], salt_lens[s->salt]));
    s->n = 1 + rnd(MAX_TOK - 8);
    for (int i = 0; i < s->n; i++) s->tokens[i] = rnd(3); /* few symbols: shared prefixes */
    int cached = atlas_kv_table_match(pool, &s->t, s->tokens, s->n);
    CHECK(cached % BS == 0 && cached < s->n && cached == s->t.n * BS);
    for (int b = 0; b < s->t.n; b++) {
        CHECK_MSG(!memcmp(content[s->t.ids[b]], s->tokens + b * BS, sizeof content[0]),
                  "cached block %d holds other tokens", (int)s->t.ids[b]);
        CHECK_MSG(content_salt[s->t.ids[b]] == s->salt, "cached block %d of salt %d taken "
                  "under salt %d", (int)s->t.ids[b], content_salt[s->t.ids[b]], s->salt);
    }
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
    /* its full blocks are registered while it runs: planned (pending) then written, or
     * written already; a pending one may last until its release, which forgets it */
    bool pending = rnd(2);
    atlas_kv_table_commit(pool, &s->t, s->tokens, s->n + 1, pending);
    write_tokens(s, s->n, s->n + 1);
    if (!pending || rnd(2)) atlas_kv_table_written(pool, &s->t, s->n + 1);
    s->n++;
    s->n_final = s->n;
}

static void finish(atlas_kv_pool *pool, shadow_seq *s) {
    for (int b = s->own_from; b < s->t.n; b++) writers[s->t.ids[b]]--;
    atlas_kv_table_release(pool, &s->t, s->tokens, s->n_final);
    CHECK(s->t.n == 0);
    s->live = 0;
}

static void walk(const char *what, atlas_kv_hash_fn hash, void *ctx) {
    memset(content, 0xff, sizeof content);
    memset(content_salt, 0xff, sizeof content_salt);
    memset(writers, 0, sizeof writers);
    atlas_kv_pool pool;
    CHECK_OK(atlas_kv_pool_init(&pool, &(atlas_kv_pool_params){.n_blocks = N_BLOCKS,
                                                                .block_size = BS,
                                                                .hash = hash,
                                                                .hash_ctx = ctx}));
    shadow_seq seqs[N_SEQS];
    memset(seqs, 0, sizeof seqs);
    int hits[N_SALTS] = {0};
    for (int r = 0; r < ROUNDS; r++) {
        shadow_seq *s = &seqs[rnd(N_SEQS)];
        if (!s->live) {
            start(&pool, s);
            hits[s->salt] += s->live && s->own_from > 0;
        } else if (rnd(4) == 0) {
            finish(&pool, s);
        } else {
            grow(&pool, s);
        }
        for (int b = 0; b < N_BLOCKS; b++)
            if (writers[b] > 1) {
                CHECK_MSG(0, "%s: block %d written by %d sequences", what, b, writers[b]);
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
    for (int i = 0; i < N_SALTS; i++)
        CHECK_MSG(hits[i] > 30, "%s: only %d starts of salt %d took cached blocks", what,
                  hits[i], i);
    for (int i = 0; i < N_SEQS; i++) atlas_kv_table_destroy(&seqs[i].t);
    atlas_kv_pool_destroy(&pool);
    atlas_kv_pool_destroy(&pool); /* a destroyed pool is zeroed: destroying again is fine */
}

/* ---- hand-made cases -------------------------------------------------------------------- */

/* A sequence of tokens tok[n] under salt[salt_len]: its table matched against the pool. */
typedef struct hand_seq {
    atlas_kv_table t;
    int cached;
} hand_seq;

static void hand_match(atlas_kv_pool *p, hand_seq *h, const char *salt, size_t salt_len,
                       const int32_t *tok, int n) {
    CHECK_OK(atlas_kv_table_init(&h->t, 4, salt, salt_len));
    h->cached = atlas_kv_table_match(p, &h->t, tok, n);
}

/* Computes the rest of tok[n] (reserves its blocks) and lets it go with all of it final. */
static void hand_run(atlas_kv_pool *p, hand_seq *h, const int32_t *tok, int n) {
    CHECK(atlas_kv_table_reserve(p, &h->t, n));
    atlas_kv_table_release(p, &h->t, tok, n);
    atlas_kv_table_destroy(&h->t);
}

/* Runs tok[n] from scratch (its own blocks) and returns how many tokens it found cached;
 * the ids of the blocks it found go to ids[]. */
static int run_seq(atlas_kv_pool *p, const char *salt, size_t salt_len, const int32_t *tok,
                   int n, int32_t *ids) {
    hand_seq h;
    hand_match(p, &h, salt, salt_len, tok, n);
    for (int i = 0; ids && i < h.t.n; i++) ids[i] = h.t.ids[i];
    int cached = h.cached;
    hand_run(p, &h, tok, n);
    return cached;
}

/* Under a constant hash: two different blocks, each found by its own tokens; the same
 * second block after different first blocks; a salted and an unsalted copy. */
static void collisions(void) {
    atlas_kv_pool p;
    CHECK_OK(atlas_kv_pool_init(&p, &(atlas_kv_pool_params){.n_blocks = 16, .block_size = BS,
                                                             .hash = hash_const}));
    const int32_t a[9] = {1, 2, 3, 4, 5, 6, 7, 8, 0}, b[9] = {9, 9, 9, 9, 5, 6, 7, 8, 0};
    int32_t ia[2], ib[2], ja[2], jb[2];
    CHECK(run_seq(&p, NULL, 0, a, 9, NULL) == 0);
    /* b's blocks hash as a's do: the second (same tokens, other prefix) must miss too */
    CHECK_MSG(run_seq(&p, NULL, 0, b, 9, NULL) == 0, "a block of another prefix was taken");
    CHECK(run_seq(&p, NULL, 0, a, 9, ia) == 8);
    CHECK(run_seq(&p, NULL, 0, b, 9, ib) == 8);
    CHECK_MSG(ia[0] != ib[0] && ia[1] != ib[1], "a and b share blocks %d %d / %d %d",
              (int)ia[0], (int)ia[1], (int)ib[0], (int)ib[1]);
    /* found again, each its own, whatever the order */
    CHECK(run_seq(&p, NULL, 0, b, 9, jb) == 8 && run_seq(&p, NULL, 0, a, 9, ja) == 8);
    CHECK(!memcmp(ia, ja, sizeof ia) && !memcmp(ib, jb, sizeof ib));
    /* a prompt that shares only a's first block takes that and computes the rest */
    const int32_t c[9] = {1, 2, 3, 4, 9, 9, 9, 9, 0};
    CHECK(run_seq(&p, NULL, 0, c, 9, ja) == 4 && ja[0] == ia[0]);
    /* the same tokens under a salt: nothing shared, then its own blocks */
    CHECK(run_seq(&p, "x", 1, a, 9, NULL) == 0);
    CHECK(run_seq(&p, "x", 1, a, 9, ja) == 8 && ja[0] != ia[0] && ja[1] != ia[1]);
    CHECK(run_seq(&p, "y", 1, a, 9, NULL) == 0);
    CHECK(run_seq(&p, "xy", 2, a, 9, NULL) == 0);
    CHECK(run_seq(&p, NULL, 0, a, 9, ja) == 8 && !memcmp(ia, ja, sizeof ia));
    atlas_kv_pool_destroy(&p);
}

/* A block whose predecessor was evicted and its id reused for other tokens: the orphan
 * must not be taken after the new block, though it has the same hash and tokens.  Chains
 * are evicted from their tails, so the orphan is made as two sequences that computed the
 * same first blocks side by side leave it: the second's third block is registered after
 * the first's second, which is freed (and evicted) before it. */
static void reused_parent(void) {
    atlas_kv_pool p;
    CHECK_OK(atlas_kv_pool_init(&p, &(atlas_kv_pool_params){.n_blocks = 5, .block_size = BS,
                                                             .hash = hash_const}));
    const int32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[12] = {1, 2, 3, 4, 5, 6, 7, 8, 5, 6, 7, 8};
    const int32_t d[4] = {7, 7, 7, 7}, e[9] = {7, 7, 7, 7, 5, 6, 7, 8, 0};
    atlas_kv_table ta, tb, hold;
    CHECK_OK(atlas_kv_table_init(&ta, 4, NULL, 0));
    CHECK_OK(atlas_kv_table_init(&tb, 4, NULL, 0));
    CHECK_OK(atlas_kv_table_init(&hold, 4, NULL, 0));
    CHECK(atlas_kv_table_reserve(&p, &ta, 8) && atlas_kv_table_reserve(&p, &tb, 12));
    int32_t a1 = ta.ids[1];
    atlas_kv_table_release(&p, &ta, a, 8);  /* registers a's two blocks */
    atlas_kv_table_release(&p, &tb, b, 12); /* its first two are twins: only the third */
    CHECK(atlas_kv_pool_cached(&p) == 3);
    CHECK(atlas_kv_table_reserve(&p, &hold, 8)); /* the two free unregistered blocks */
    CHECK(run_seq(&p, NULL, 0, d, 4, NULL) == 0); /* evicts a's second, reuses its id */
    hand_seq h;
    hand_match(&p, &h, NULL, 0, e, 9);
    CHECK_MSG(h.cached == 4 && h.t.ids[0] == a1, "cached %d: the orphaned block was taken",
              h.cached);
    atlas_kv_table_release(&p, &h.t, e, h.cached);
    atlas_kv_table_destroy(&h.t);
    atlas_kv_table_release(&p, &hold, NULL, 0);
    atlas_kv_table_destroy(&hold);
    atlas_kv_table_destroy(&ta);
    atlas_kv_table_destroy(&tb);
    atlas_kv_pool_destroy(&p);
}

/* A chain is evicted from its tail: after one block is taken back from a cached chain of
 * four, the first three are still found. */
static void tail_first(void) {
    atlas_kv_pool p;
    CHECK_OK(atlas_kv_pool_init(&p, &(atlas_kv_pool_params){.n_blocks = 4, .block_size = BS}));
    int32_t tok[17];
    for (int i = 0; i < 17; i++) tok[i] = 10 + i;
    CHECK(run_seq(&p, NULL, 0, tok, 16, NULL) == 0);
    CHECK(atlas_kv_pool_cached(&p) == 4);
    int32_t other[4] = {99, 99, 99, 99};
    CHECK(run_seq(&p, NULL, 0, other, 4, NULL) == 0); /* takes one cached block */
    hand_seq h;
    hand_match(&p, &h, NULL, 0, tok, 17);
    CHECK_MSG(h.cached == 12, "cached %d of 12: the chain was evicted from its head",
              h.cached);
    atlas_kv_table_release(&p, &h.t, tok, h.cached);
    atlas_kv_table_destroy(&h.t);
    CHECK(atlas_kv_pool_used(&p) == 0);
    atlas_kv_pool_destroy(&p);
}

/* Shared while it fills: blocks registered for a step are pending (another sequence at
 * that point waits), shareable once the step ran, forgotten if it never did; a sequence
 * that reserved blocks ahead gives them back for the shared ones. */
static void while_filling(void) {
    atlas_kv_pool p;
    CHECK_OK(atlas_kv_pool_init(&p, &(atlas_kv_pool_params){.n_blocks = 8, .block_size = BS}));
    int32_t tok[13];
    for (int i = 0; i < 13; i++) tok[i] = 50 + i;
    atlas_kv_table a, b;
    CHECK_OK(atlas_kv_table_init(&a, 4, NULL, 0));
    CHECK_OK(atlas_kv_table_init(&b, 4, NULL, 0));
    /* a plans its first 8 tokens; b, planned after it in the same step, must wait */
    CHECK(atlas_kv_table_reserve(&p, &a, 8));
    atlas_kv_table_commit(&p, &a, tok, 8, true);
    bool wait = false;
    CHECK(atlas_kv_table_extend(&p, &b, tok, 13, 0, &wait) == 0 && wait && b.n == 0);
    /* the step never ran (a was preempted): nothing of it may be found */
    atlas_kv_table_release(&p, &a, tok, 0);
    wait = false;
    CHECK(atlas_kv_table_extend(&p, &b, tok, 13, 0, &wait) == 0 && !wait);
    CHECK(atlas_kv_pool_cached(&p) == 0);
    /* again, and it ran: b, holding a block reserved ahead, takes both of a's, a still
     * running, and gives its own back */
    CHECK(atlas_kv_table_reserve(&p, &a, 8) && atlas_kv_table_reserve(&p, &b, 4));
    atlas_kv_table_commit(&p, &a, tok, 8, true);
    atlas_kv_table_written(&p, &a, 8);
    int free_before = atlas_kv_pool_free(&p);
    wait = false;
    CHECK(atlas_kv_table_extend(&p, &b, tok, 13, 0, &wait) == 8 && !wait && b.n == 2);
    CHECK(b.ids[0] == a.ids[0] && b.ids[1] == a.ids[1]);
    CHECK(atlas_kv_pool_free(&p) == free_before + 1);
    /* b computes on from 8; a's third block is pending when b reaches it */
    CHECK(atlas_kv_table_reserve(&p, &a, 12));
    atlas_kv_table_commit(&p, &a, tok, 12, true);
    wait = false;
    CHECK(atlas_kv_table_extend(&p, &b, tok, 13, 8, &wait) == 8 && wait);
    /* a step before the one that writes it ran (steps queued ahead): still pending */
    atlas_kv_table_written(&p, &a, 11);
    wait = false;
    CHECK(atlas_kv_table_extend(&p, &b, tok, 13, 8, &wait) == 8 && wait);
    atlas_kv_table_written(&p, &a, 12);
    wait = false;
    CHECK(atlas_kv_table_extend(&p, &b, tok, 13, 8, &wait) == 12 && !wait && b.n == 3);
    atlas_kv_table_release(&p, &a, tok, 12);
    atlas_kv_table_release(&p, &b, tok, 12);
    CHECK(atlas_kv_pool_used(&p) == 0 && atlas_kv_pool_cached(&p) == 3);
    atlas_kv_table_destroy(&a);
    atlas_kv_table_destroy(&b);
    atlas_kv_pool_destroy(&p);
}

/* The salt at the kv level under the default keyed hash: the same prompt shares blocks
 * only within a salt; a salt differing after a NUL byte is another salt. */
static void salted(void) {
    atlas_kv_pool p;
    CHECK_OK(atlas_kv_pool_init(&p, &(atlas_kv_pool_params){.n_blocks = 32, .block_size = BS}));
    int32_t tok[13];
    for (int i = 0; i < 13; i++) tok[i] = 100 + i;
    CHECK(run_seq(&p, "tenant-a", 8, tok, 13, NULL) == 0);
    CHECK(run_seq(&p, "tenant-b", 8, tok, 13, NULL) == 0);
    CHECK(run_seq(&p, NULL, 0, tok, 13, NULL) == 0);
    CHECK(run_seq(&p, "", 0, tok, 13, NULL) == 12); /* "" is no salt */
    CHECK(run_seq(&p, "tenant-a", 8, tok, 13, NULL) == 12);
    CHECK(run_seq(&p, "tenant-b", 8, tok, 13, NULL) == 12);
    CHECK(run_seq(&p, "tenant-a\0x", 10, tok, 13, NULL) == 0);
    CHECK(run_seq(&p, "tenant-a\0y", 10, tok, 13, NULL) == 0);
    CHECK(run_seq(&p, "tenant-a\0x", 10, tok, 13, NULL) == 12);
    CHECK(atlas_kv_pool_used(&p) == 0);
    atlas_kv_pool_destroy(&p);
}

int main(void) {
    long calls = 0;
    walk("keyed hash", NULL, NULL);
    walk("constant hash", hash_const, NULL);
    walk("2-bit hash", hash_2bit, &calls);
    CHECK_MSG(calls > ROUNDS, "the injected hash was called %ld times", calls);
    collisions();
    reused_parent();
    tail_first();
    while_filling();
    salted();
    return harness_finish();
}

/* engine/kv.c — block ids of the paged KV cache and the prefix cache (see kv.h). */
#include "engine/kv.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "core/error.h"

/* ---- the prefix hash -------------------------------------------------------------------- */

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))

static void sip_round(uint64_t v[4]) {
    v[0] += v[1], v[1] = ROTL(v[1], 13), v[1] ^= v[0], v[0] = ROTL(v[0], 32);
    v[2] += v[3], v[3] = ROTL(v[3], 16), v[3] ^= v[2];
    v[0] += v[3], v[3] = ROTL(v[3], 21), v[3] ^= v[0];
    v[2] += v[1], v[1] = ROTL(v[1], 17), v[1] ^= v[2], v[2] = ROTL(v[2], 32);
}

static void sip_word(uint64_t v[4], uint64_t m) {
    v[3] ^= m;
    sip_round(v);
    sip_round(v);
    v[0] ^= m;
}

/* SipHash-2-4 under key k of prev's 8 bytes then data[n] (words read in host order: the
 * hash never leaves the process). */
static uint64_t siphash(const uint64_t k[2], uint64_t prev, const void *data, size_t n) {
    uint64_t v[4] = {k[0] ^ 0x736f6d6570736575ULL, k[1] ^ 0x646f72616e646f6dULL,
                     k[0] ^ 0x6c7967656e657261ULL, k[1] ^ 0x7465646279746573ULL};
    const unsigned char *s = data;
    sip_word(v, prev);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t m;
        memcpy(&m, s + i, 8);
        sip_word(v, m);
    }
    uint64_t last = (uint64_t)((n + 8) & 0xff) << 56;
    for (size_t j = 0; i + j < n; j++) last |= (uint64_t)s[i + j] << (8 * j);
    sip_word(v, last);
    v[2] ^= 0xff;
    for (int r = 0; r < 4; r++) sip_round(v);
    return v[0] ^ v[1] ^ v[2] ^ v[3];
}

uint64_t atlas_kv_siphash(const uint64_t key[2], uint64_t prev, const void *bytes, size_t n) {
    return siphash(key, prev, bytes, n);
}

/* prev continued over bytes[n]; never 0, which means "not registered". */
static uint64_t hash_bytes(const atlas_kv_pool *p, uint64_t prev, const void *bytes, size_t n) {
    uint64_t h = p->hash_fn ? p->hash_fn(p->hash_ctx, prev, bytes, n)
                            : siphash(p->key, prev, bytes, n);
    return h ? h : 1;
}

/* The hash a table's chain starts from: its salt's, 0 without one. */
static uint64_t root_hash(const atlas_kv_pool *p, const atlas_kv_table *t) {
    return t->salt_len ? hash_bytes(p, 0, t->salt, t->salt_len) : 0;
}

static uint64_t block_hash(const atlas_kv_pool *p, uint64_t prev, const int32_t *tokens) {
    return hash_bytes(p, prev, tokens, (size_t)p->block_size * sizeof *tokens);
}

/* Whether registered block id holds tokens[block_size] right after the registration parent
 * (0: at the start of a sequence salted as t). */
static bool holds(const atlas_kv_pool *p, int32_t id, uint64_t parent, const int32_t *tokens,
                  const atlas_kv_table *t) {
    const atlas_kv_block *b = &p->blk[id];
    size_t bs = (size_t)p->block_size;
    if (b->parent != parent || memcmp(p->toks + (size_t)id * bs, tokens, bs * sizeof *tokens))
        return false;
    return parent != 0 || (b->salt_len == t->salt_len &&
                           (t->salt_len == 0 || !memcmp(b->salt, t->salt, t->salt_len)));
}

/* ---- the hash map: linear probing, deletion by backward shift --------------------------- */

static int home(const atlas_kv_pool *p, uint64_t h) { return (int)(h & (uint64_t)(p->map_cap - 1)); }

/* The registered block under hash h that holds tokens after parent (see holds); -1 if none.
 * Every entry of that hash is a candidate: a collision is a miss, never a hit. */
static int32_t map_find(const atlas_kv_pool *p, uint64_t h, uint64_t parent,
                        const int32_t *tokens, const atlas_kv_table *t) {
    for (int i = home(p, h);; i = (i + 1) & (p->map_cap - 1)) {
        int32_t id = p->map[i];
        if (id < 0) return -1;
        if (p->hash[id] == h && holds(p, id, parent, tokens, t)) return id;
    }
}

static void map_insert(atlas_kv_pool *p, int32_t id) {
    int i = home(p, p->hash[id]);
    while (p->map[i] >= 0) i = (i + 1) & (p->map_cap - 1);
    p->map[i] = id;
}

static void map_delete(atlas_kv_pool *p, int32_t id) {
    int mask = p->map_cap - 1, i = home(p, p->hash[id]);
    while (p->map[i] != id) i = (i + 1) & mask;
    for (int j = i;;) {
        j = (j + 1) & mask;
        if (p->map[j] < 0) break;
        int k = home(p, p->hash[p->map[j]]);
        /* the entry at j may fill the hole at i unless its home lies in (i, j] */
        int movable = i <= j ? (k <= i || k > j) : (k <= i && k > j);
        if (movable) {
            p->map[i] = p->map[j];
            i = j;
        }
    }
    p->map[i] = -1;
}

/* ---- the list of cached free blocks ----------------------------------------------------- */

static void lru_push(atlas_kv_pool *p, int32_t id) {
    p->prev[id] = p->lru_tail;
    p->next[id] = -1;
    if (p->lru_tail >= 0) p->next[p->lru_tail] = id;
    else p->lru_head = id;
    p->lru_tail = id;
    p->n_cached++;
}

static void lru_remove(atlas_kv_pool *p, int32_t id) {
    if (p->prev[id] >= 0) p->next[p->prev[id]] = p->next[id];
    else p->lru_head = p->next[id];
    if (p->next[id] >= 0) p->prev[p->next[id]] = p->prev[id];
    else p->lru_tail = p->prev[id];
    p->n_cached--;
}

/* ---- the pool --------------------------------------------------------------------------- */

/* A fresh key per pool: what a client may learn of one process's hashes helps it nowhere
 * else, and the hash needs no stability across loads. */
atlas_status atlas_kv_random_key(uint64_t key[2]) {
    unsigned char *b = (unsigned char *)key;
    size_t got = 0;
    while (got < 2 * sizeof *key) {
        ssize_t r = getrandom(b + got, 2 * sizeof *key - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return atlas_fail(ATLAS_ERR_IO, "kv pool: no random key for the prefix hash "
                                            "(getrandom: %s)", strerror(errno));
        got += (size_t)r;
    }
    return ATLAS_OK;
}

atlas_status atlas_kv_pool_init(atlas_kv_pool *p, const atlas_kv_pool_params *params) {
    *p = (atlas_kv_pool){.lru_head = -1, .lru_tail = -1};
    int n_blocks = params->n_blocks, block_size = params->block_size;
    if (n_blocks <= 0 || block_size <= 0 || n_blocks > (1 << 28))
        return atlas_fail(ATLAS_ERR_INVALID, "kv pool: %d blocks of %d tokens", n_blocks,
                          block_size);
    p->hash_fn = params->hash;
    p->hash_ctx = params->hash_ctx;
    if (!p->hash_fn) ATLAS_TRY(atlas_kv_random_key(p->key));
    p->map_cap = 16;
    while (p->map_cap < 2 * n_blocks) p->map_cap *= 2;
    size_t n = (size_t)n_blocks;
    p->refs = calloc(n, sizeof *p->refs);
    p->hash = calloc(n, sizeof *p->hash);
    p->blk = calloc(n, sizeof *p->blk);
    p->toks = malloc(n * (size_t)block_size * sizeof *p->toks);
    p->plain = malloc(n * sizeof *p->plain);
    p->prev = malloc(n * sizeof *p->prev);
    p->next = malloc(n * sizeof *p->next);
    p->map = malloc((size_t)p->map_cap * sizeof *p->map);
    if (!p->refs || !p->hash || !p->blk || !p->toks || !p->plain || !p->prev || !p->next ||
        !p->map) {
        atlas_kv_pool_destroy(p);
        return atlas_fail(ATLAS_ERR_NOMEM, "kv pool: %d blocks", n_blocks);
    }
    for (int i = 0; i < p->map_cap; i++) p->map[i] = -1;
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    /* Pushed in reverse so that block 0 is handed out first. */
    for (int i = 0; i < n_blocks; i++) p->plain[i] = n_blocks - 1 - i;
    p->n_plain = n_blocks;
    return ATLAS_OK;
}

void atlas_kv_pool_destroy(atlas_kv_pool *p) {
    for (int i = 0; p->blk && i < p->n_blocks; i++) free(p->blk[i].salt);
    free(p->refs);
    free(p->hash);
    free(p->blk);
    free(p->toks);
    free(p->plain);
    free(p->prev);
    free(p->next);
    free(p->map);
    *p = (atlas_kv_pool){.lru_head = -1, .lru_tail = -1};
}

int atlas_kv_pool_free(const atlas_kv_pool *p) { return p->n_plain + p->n_cached; }
int atlas_kv_pool_used(const atlas_kv_pool *p) { return p->n_blocks - atlas_kv_pool_free(p); }
int atlas_kv_pool_cached(const atlas_kv_pool *p) { return p->n_cached; }

int atlas_kv_blocks_for(const atlas_kv_pool *p, int n_tokens) {
    return (n_tokens + p->block_size - 1) / p->block_size;
}

/* Forgets block id's registration (it keeps its refs). */
static void unregister(atlas_kv_pool *p, int32_t id) {
    map_delete(p, id);
    p->hash[id] = 0;
    free(p->blk[id].salt);
    p->blk[id] = (atlas_kv_block){0};
}

/* A free block: a never-registered one, else the least recently freed cached one (its
 * prefix forgotten; blocks registered after it become unreachable, as their parent's
 * serial is never seen again, and age out in turn: release frees a chain tail first, so
 * its tail is the older).  The caller made sure that there is one. */
static int32_t take_block(atlas_kv_pool *p) {
    int32_t id;
    if (p->n_plain > 0) {
        id = p->plain[--p->n_plain];
    } else {
        id = p->lru_head;
        assert(id >= 0);
        lru_remove(p, id);
        unregister(p, id);
    }
    assert(p->refs[id] == 0);
    p->refs[id] = 1;
    return id;
}

/* Registers block id as holding tokens[block_size] after the registration parent, under
 * hash h, unless a registered block already holds that prefix.  Returns the serial of the
 * block that holds it, 0 when none does (no memory for the salt's copy). */
static uint64_t register_block(atlas_kv_pool *p, const atlas_kv_table *t, int32_t id,
                               uint64_t h, uint64_t parent, const int32_t *tokens,
                               bool pending) {
    /* a registered block in a table came from the cache at this very position */
    if (p->hash[id]) {
        assert(holds(p, id, parent, tokens, t));
        return p->blk[id].serial;
    }
    int32_t had = map_find(p, h, parent, tokens, t);
    if (had >= 0) return p->blk[had].serial;
    atlas_kv_block *b = &p->blk[id];
    if (parent == 0 && t->salt_len) {
        if (!(b->salt = malloc(t->salt_len))) return 0;
        memcpy(b->salt, t->salt, t->salt_len);
        b->salt_len = t->salt_len;
    }
    b->serial = ++p->serials;
    b->parent = parent;
    b->pending = pending;
    memcpy(p->toks + (size_t)id * (size_t)p->block_size, tokens,
           (size_t)p->block_size * sizeof *tokens);
    p->hash[id] = h;
    map_insert(p, id);
    return b->serial;
}

/* ---- block tables ----------------------------------------------------------------------- */

atlas_status atlas_kv_table_init(atlas_kv_table *t, int cap, const char *salt, size_t salt_len) {
    *t = (atlas_kv_table){0};
    if (!salt) salt_len = 0;
    t->ids = malloc((size_t)(cap > 0 ? cap : 1) * sizeof *t->ids);
    t->salt = salt_len ? malloc(salt_len) : NULL;
    if (!t->ids || (salt_len && !t->salt)) {
        free(t->ids);
        free(t->salt);
        *t = (atlas_kv_table){0};
        return atlas_fail(ATLAS_ERR_NOMEM, "kv block table of %d blocks", cap);
    }
    if (salt_len) memcpy(t->salt, salt, salt_len);
    t->salt_len = salt_len;
    t->cap = cap;
    return ATLAS_OK;
}

void atlas_kv_table_destroy(atlas_kv_table *t) {
    assert(t->n == 0);
    free(t->ids);
    free(t->salt);
    *t = (atlas_kv_table){0};
}

/* Where t's chain starts: its salt's hash, no parent. */
static void chain_reset(const atlas_kv_pool *p, atlas_kv_table *t) {
    t->n_reg = t->n_written = 0;
    t->h = root_hash(p, t);
    t->parent = 0;
    t->broken = false;
}

int atlas_kv_table_extend(atlas_kv_pool *p, atlas_kv_table *t, const int32_t *tokens, int n,
                          int n_computed, bool *wait) {
    int bs = p->block_size, max = n > 0 ? (n - 1) / bs : 0;
    if (max > t->cap) max = t->cap;
    if (t->n_reg == 0) chain_reset(p, t);
    if (t->broken || n_computed != t->n_reg * bs || t->n_written != t->n_reg) return n_computed;
    while (t->n_reg < max) {
        int i = t->n_reg;
        const int32_t *block = tokens + (size_t)i * bs;
        uint64_t h = block_hash(p, t->h, block);
        int32_t id = map_find(p, h, t->parent, block, t);
        if (id < 0) break;
        if (p->blk[id].pending) {
            *wait = true;
            break;
        }
        if (i < t->n) { /* reserved, never written: back to the pool */
            int32_t own = t->ids[i];
            assert(p->refs[own] == 1 && !p->hash[own]);
            p->refs[own] = 0;
            p->plain[p->n_plain++] = own;
        } else {
            t->n++;
        }
        if (p->refs[id] == 0) lru_remove(p, id);
        p->refs[id]++;
        t->ids[i] = id;
        t->h = h;
        t->parent = p->blk[id].serial;
        t->n_written = ++t->n_reg;
    }
    return t->n_reg * bs > n_computed ? t->n_reg * bs : n_computed;
}

int atlas_kv_table_match(atlas_kv_pool *p, atlas_kv_table *t, const int32_t *tokens, int n) {
    assert(t->n == 0);
    bool wait = false;
    return atlas_kv_table_extend(p, t, tokens, n, 0, &wait);
}

bool atlas_kv_table_reserve(atlas_kv_pool *p, atlas_kv_table *t, int n_tokens) {
    int need = atlas_kv_blocks_for(p, n_tokens);
    assert(need <= t->cap);
    if (need <= t->n) return true;
    if (need - t->n > atlas_kv_pool_free(p)) return false;
    while (t->n < need) t->ids[t->n++] = take_block(p);
    return true;
}

void atlas_kv_table_commit(atlas_kv_pool *p, atlas_kv_table *t, const int32_t *tokens,
                           int n_final, bool pending) {
    int bs = p->block_size;
    if (t->n_reg == 0) chain_reset(p, t);
    while (!t->broken && t->n_reg < t->n && (t->n_reg + 1) * bs <= n_final) {
        int i = t->n_reg;
        int32_t id = t->ids[i];
        assert(id >= 0 && id < p->n_blocks && p->refs[id] > 0);
        const int32_t *block = tokens + (size_t)i * bs;
        uint64_t h = block_hash(p, t->h, block);
        uint64_t serial = register_block(p, t, id, h, t->parent, block, pending);
        /* a block after an unregistered one would pass for a first block */
        if (serial == 0) {
            t->broken = true;
            break;
        }
        t->h = h;
        t->parent = serial;
        t->n_reg++;
        if (!pending && t->n_written == i) t->n_written = t->n_reg;
    }
}

void atlas_kv_table_written(atlas_kv_pool *p, atlas_kv_table *t, int n_done) {
    int i = t->n_written;
    for (; i < t->n_reg && (i + 1) * p->block_size <= n_done; i++)
        p->blk[t->ids[i]].pending = false;
    t->n_written = i;
}

void atlas_kv_table_release(atlas_kv_pool *p, atlas_kv_table *t, const int32_t *tokens,
                            int n_final) {
    atlas_kv_table_commit(p, t, tokens, n_final, false);
    for (int i = t->n - 1; i >= 0; i--) {
        int32_t id = t->ids[i];
        assert(id >= 0 && id < p->n_blocks && p->refs[id] > 0);
        /* registered for a step that never ran: its K/V was never written */
        if (p->blk[id].pending) {
            assert(p->refs[id] == 1);
            unregister(p, id);
        }
        if (--p->refs[id] > 0) continue;
        if (p->hash[id]) lru_push(p, id);
        else p->plain[p->n_plain++] = id;
    }
    t->n = 0;
    chain_reset(p, t);
}

/* Serials grow with each registration and a block is registered after the one before it
 * in its prefix, so in serial order every parent comes before its children. */
static int by_serial(const void *a, const void *b, void *blk) {
    uint64_t x = ((const atlas_kv_block *)blk)[*(const int32_t *)a].serial,
             y = ((const atlas_kv_block *)blk)[*(const int32_t *)b].serial;
    return (x > y) - (x < y);
}

int atlas_kv_pool_chains(const atlas_kv_pool *p, int32_t *ids, int32_t *parent) {
    int n = 0;
    for (int32_t id = 0; id < p->n_blocks; id++)
        if (p->hash[id] && !p->blk[id].pending) ids[n++] = id;
    qsort_r(ids, (size_t)n, sizeof *ids, by_serial, p->blk);
    int kept = 0;
    for (int i = 0; i < n; i++) {
        uint64_t want = p->blk[ids[i]].parent;
        int32_t at = -1;
        for (int lo = 0, hi = kept - 1; want && lo <= hi;) { /* among those kept */
            int mid = (lo + hi) / 2;
            uint64_t s = p->blk[ids[mid]].serial;
            if (s == want) { at = mid; break; }
            if (s < want) lo = mid + 1;
            else hi = mid - 1;
        }
        if (want && at < 0) continue; /* its parent was evicted: no hit can reach it */
        ids[kept] = ids[i];
        parent[kept++] = at;
    }
    return kept;
}

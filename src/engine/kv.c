/* engine/kv.c — block ids of the paged KV cache and the prefix cache (see kv.h). */
#include "engine/kv.h"

#include <assert.h>
#include <stdlib.h>

#include "core/error.h"

#define HASH_SEED 0x6a09e667f3bcc909ULL

/* The prefix hash of a block: that of the blocks before it, then its tokens (FNV-1a over
 * the ids, then a final mix); never 0, which means "not registered". */
static uint64_t chain(uint64_t h, const int32_t *tokens, int n) {
    for (int i = 0; i < n; i++) {
        h ^= (uint32_t)tokens[i];
        h *= 0x100000001b3ULL;
    }
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 29;
    return h ? h : 1;
}

/* ---- the hash map: linear probing, deletion by backward shift --------------------------- */

static int home(const atlas_kv_pool *p, uint64_t h) { return (int)(h & (uint64_t)(p->map_cap - 1)); }

static int32_t map_find(const atlas_kv_pool *p, uint64_t h) {
    for (int i = home(p, h);; i = (i + 1) & (p->map_cap - 1)) {
        int32_t id = p->map[i];
        if (id < 0) return -1;
        if (p->hash[id] == h) return id;
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

atlas_status atlas_kv_pool_init(atlas_kv_pool *p, int n_blocks, int block_size) {
    *p = (atlas_kv_pool){.lru_head = -1, .lru_tail = -1};
    if (n_blocks <= 0 || block_size <= 0 || n_blocks > (1 << 28))
        return atlas_fail(ATLAS_ERR_INVALID, "kv pool: %d blocks of %d tokens", n_blocks,
                          block_size);
    p->map_cap = 16;
    while (p->map_cap < 2 * n_blocks) p->map_cap *= 2;
    size_t n = (size_t)n_blocks;
    p->refs = calloc(n, sizeof *p->refs);
    p->hash = calloc(n, sizeof *p->hash);
    p->plain = malloc(n * sizeof *p->plain);
    p->prev = malloc(n * sizeof *p->prev);
    p->next = malloc(n * sizeof *p->next);
    p->map = malloc((size_t)p->map_cap * sizeof *p->map);
    if (!p->refs || !p->hash || !p->plain || !p->prev || !p->next || !p->map) {
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
    free(p->refs);
    free(p->hash);
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

/* A free block: a never-registered one, else the least recently freed cached one (its
 * prefix forgotten).  The caller made sure that there is one. */
static int32_t take_block(atlas_kv_pool *p) {
    int32_t id;
    if (p->n_plain > 0) {
        id = p->plain[--p->n_plain];
    } else {
        id = p->lru_head;
        assert(id >= 0);
        lru_remove(p, id);
        map_delete(p, id);
        p->hash[id] = 0;
    }
    assert(p->refs[id] == 0);
    p->refs[id] = 1;
    return id;
}

/* ---- block tables ----------------------------------------------------------------------- */

atlas_status atlas_kv_table_init(atlas_kv_table *t, int cap) {
    *t = (atlas_kv_table){0};
    t->ids = malloc((size_t)(cap > 0 ? cap : 1) * sizeof *t->ids);
    if (!t->ids) return atlas_fail(ATLAS_ERR_NOMEM, "kv block table of %d blocks", cap);
    t->cap = cap;
    return ATLAS_OK;
}

void atlas_kv_table_destroy(atlas_kv_table *t) {
    assert(t->n == 0);
    free(t->ids);
    *t = (atlas_kv_table){0};
}

int atlas_kv_table_match(atlas_kv_pool *p, atlas_kv_table *t, const int32_t *tokens, int n) {
    assert(t->n == 0);
    int bs = p->block_size, max = n > 0 ? (n - 1) / bs : 0;
    if (max > t->cap) max = t->cap;
    uint64_t h = HASH_SEED;
    for (int i = 0; i < max; i++) {
        h = chain(h, tokens + (size_t)i * bs, bs);
        int32_t id = map_find(p, h);
        if (id < 0) break;
        if (p->refs[id] == 0) lru_remove(p, id);
        p->refs[id]++;
        t->ids[t->n++] = id;
    }
    return t->n * bs;
}

bool atlas_kv_table_reserve(atlas_kv_pool *p, atlas_kv_table *t, int n_tokens) {
    int need = atlas_kv_blocks_for(p, n_tokens);
    assert(need <= t->cap);
    if (need <= t->n) return true;
    if (need - t->n > atlas_kv_pool_free(p)) return false;
    while (t->n < need) t->ids[t->n++] = take_block(p);
    return true;
}

void atlas_kv_table_release(atlas_kv_pool *p, atlas_kv_table *t, const int32_t *tokens,
                            int n_final) {
    int bs = p->block_size;
    uint64_t h = HASH_SEED;
    for (int i = 0; i < t->n; i++) {
        int32_t id = t->ids[i];
        assert(id >= 0 && id < p->n_blocks && p->refs[id] > 0);
        if ((i + 1) * bs <= n_final) {
            h = chain(h, tokens + (size_t)i * bs, bs);
            /* Registered unless it already is, or another block holds the same prefix. */
            if (p->hash[id] == 0 && map_find(p, h) < 0) {
                p->hash[id] = h;
                map_insert(p, id);
            }
        }
        if (--p->refs[id] > 0) continue;
        if (p->hash[id]) lru_push(p, id);
        else p->plain[p->n_plain++] = id;
    }
    t->n = 0;
}

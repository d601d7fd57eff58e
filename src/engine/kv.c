/* engine/kv.c — block ids of the paged KV cache (see kv.h). */
#include "engine/kv.h"

#include <assert.h>
#include <stdlib.h>

#include "core/error.h"

atlas_status atlas_kv_pool_init(atlas_kv_pool *p, int n_blocks, int block_size) {
    *p = (atlas_kv_pool){0};
    if (n_blocks <= 0 || block_size <= 0)
        return atlas_fail(ATLAS_ERR_INVALID, "kv pool: %d blocks of %d tokens", n_blocks,
                          block_size);
    p->free_ids = malloc((size_t)n_blocks * sizeof *p->free_ids);
    p->used = calloc((size_t)n_blocks, 1);
    if (!p->free_ids || !p->used) {
        atlas_kv_pool_destroy(p);
        return atlas_fail(ATLAS_ERR_NOMEM, "kv pool: %d blocks", n_blocks);
    }
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    /* Pushed in reverse so that block 0 is handed out first. */
    for (int i = 0; i < n_blocks; i++) p->free_ids[i] = n_blocks - 1 - i;
    p->n_free = n_blocks;
    return ATLAS_OK;
}

void atlas_kv_pool_destroy(atlas_kv_pool *p) {
    free(p->free_ids);
    free(p->used);
    *p = (atlas_kv_pool){0};
}

int atlas_kv_pool_used(const atlas_kv_pool *p) { return p->n_blocks - p->n_free; }

int atlas_kv_blocks_for(const atlas_kv_pool *p, int n_tokens) {
    return (n_tokens + p->block_size - 1) / p->block_size;
}

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

bool atlas_kv_table_reserve(atlas_kv_pool *p, atlas_kv_table *t, int n_tokens) {
    int need = atlas_kv_blocks_for(p, n_tokens);
    assert(need <= t->cap);
    if (need <= t->n) return true;
    if (need - t->n > p->n_free) return false;
    while (t->n < need) {
        int32_t id = p->free_ids[--p->n_free];
        assert(!p->used[id]);
        p->used[id] = 1;
        t->ids[t->n++] = id;
    }
    return true;
}

void atlas_kv_table_release(atlas_kv_pool *p, atlas_kv_table *t) {
    /* Last block first, so that the next sequence gets them back in the same order. */
    while (t->n > 0) {
        int32_t id = t->ids[--t->n];
        assert(id >= 0 && id < p->n_blocks && p->used[id]);
        p->used[id] = 0;
        p->free_ids[p->n_free++] = id;
    }
}

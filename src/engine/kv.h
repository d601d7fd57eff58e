/* engine/kv.h — the paged KV cache's block manager.  Internal.
 *
 * The model owns the K/V memory (n_blocks blocks of block_size tokens, per layer); this
 * hands out block ids.  A sequence's block table lists its blocks in position order: the
 * token at position p lives in block table[p / block_size], slot p % block_size.  Freed
 * blocks go on a stack (the most recently freed is reused first: it is warm in cache). */
#ifndef ATLAS_ENGINE_KV_H
#define ATLAS_ENGINE_KV_H

#include <stdbool.h>
#include <stdint.h>

#include "atlas/status.h"

typedef struct atlas_kv_pool {
    int n_blocks;
    int block_size;
    int32_t *free_ids; /* [n_blocks] stack; free_ids[0 .. n_free) are free */
    int n_free;
    uint8_t *used;     /* [n_blocks] 1 while handed out: catches double frees */
} atlas_kv_pool;

/* A sequence's block table; cap is fixed at init (the context's blocks), so growing it
 * never allocates. */
typedef struct atlas_kv_table {
    int32_t *ids; /* [cap] */
    int n;
    int cap;
} atlas_kv_table;

atlas_status atlas_kv_pool_init(atlas_kv_pool *p, int n_blocks, int block_size);
void atlas_kv_pool_destroy(atlas_kv_pool *p); /* safe on a zeroed pool */
int atlas_kv_pool_used(const atlas_kv_pool *p);

/* Blocks needed to hold n_tokens tokens. */
int atlas_kv_blocks_for(const atlas_kv_pool *p, int n_tokens);

atlas_status atlas_kv_table_init(atlas_kv_table *t, int cap);
void atlas_kv_table_destroy(atlas_kv_table *t); /* blocks must have been released */

/* Grows t so that it covers n_tokens tokens.  Returns false, taking nothing, when the
 * pool has too few free blocks.  n_tokens beyond the table's cap is a programming error. */
bool atlas_kv_table_reserve(atlas_kv_pool *p, atlas_kv_table *t, int n_tokens);

/* Gives all of t's blocks back to the pool; t is then empty. */
void atlas_kv_table_release(atlas_kv_pool *p, atlas_kv_table *t);

#endif

/* engine/kv_host.h — released models' prefix KV blocks kept in host memory.  Internal.
 *
 * When a model is released its KV pool goes, and with it every conversation's cached
 * prefix.  The store keeps, within a byte budget shared by every model, the pool's written
 * registered blocks as the prefix cache (kv.h) knew them: a block's tokens, the entry of the
 * block before it in its prefix (a first block: its salt) and an image of its K/V from the
 * cache (atlas_model_kv_save).  A hit is proven as kv.h proves one: a walk from a first
 * block, matching salt and tokens block by block, so an entry holds exactly the K/V of the
 * sequence's tokens from position 0.  Nothing is copied back at the model's load: a request
 * whose prefix the pool lacks and the store holds takes free blocks, has the images copied
 * in (atlas_model_kv_restore) and registers them as written, at its admission.
 *
 * Least recently used out, and never a block before its continuations: the entries are
 * kept in an order where every entry is more recent than the entries after it in its
 * prefix, so the least recent one is never a block that a longer prefix needs.  A save
 * that runs out of budget keeps the first blocks of each chain, which every longer prefix
 * needs, and leaves out the later ones.
 *
 * Entries are good only for a model loaded the same way: each model's entries carry its
 * identity (files, backend, KV element type, geometry), and a load with another identity
 * drops them.  One thread uses a store (the engine's scheduler); it is not locked. */
#ifndef ATLAS_ENGINE_KV_HOST_H
#define ATLAS_ENGINE_KV_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "atlas/host.h"
#include "atlas/model.h"
#include "atlas/status.h"
#include "engine/kv.h"

typedef struct atlas_kv_host atlas_kv_host;

/* What a model's K/V images depend on, beyond its configured directory. */
typedef struct atlas_kv_host_ident {
    uint64_t files;     /* the directory's files (atlas_engine_dir_sig) */
    size_t block_bytes; /* atlas_model_kv_block_bytes: geometry and element size */
    int block_size, n_layers, n_kv_heads, head_dim;
    char kv_dtype[8];
    char backend[16];
} atlas_kv_host_ident;

/* What a save or a restore did. */
typedef struct atlas_kv_host_moved {
    uint64_t blocks, bytes; /* copied (a save's blocks the store had already are not) */
    uint64_t dropped;       /* entries evicted for room, or dropped by a change of model */
} atlas_kv_host_moved;

/* budget: bytes of host memory the entries may take (images, tokens, salts); 0 keeps
 * nothing.  n_models: the engine's.  host: the process's GPU, whose pinned memory then holds
 * the images (a restore of 250 2 MiB blocks: 10 ms against 63 from plain memory on an
 * H100), or NULL: plain memory.  ATLAS_ERR_NOMEM, or ATLAS_ERR_IO when no hash key. */
atlas_status atlas_kv_host_create(size_t budget, int n_models, atlas_host *host,
                                  atlas_kv_host **out);
void atlas_kv_host_free(atlas_kv_host *h); /* NULL: nothing */

/* Sets the budget (the engine's share of --host-cache that the weights' host tier leaves),
 * evicting the least recently used entries down to it; returns how many went. */
uint64_t atlas_kv_host_set_budget(atlas_kv_host *h, size_t budget);

/* Bytes and entries held now, and the budget. */
size_t atlas_kv_host_bytes(const atlas_kv_host *h);
size_t atlas_kv_host_budget(const atlas_kv_host *h);
int atlas_kv_host_blocks(const atlas_kv_host *h);

/* A model was loaded as id: its entries stay if they were saved from a model loaded the same
 * way, else they are dropped (counted in *out). */
void atlas_kv_host_check(atlas_kv_host *h, int model, const atlas_kv_host_ident *id,
                         atlas_kv_host_moved *out);

/* Before m's release (no sequence holds a block of p): saves p's written registered blocks,
 * first blocks first, those the store holds already refreshed, evicting the least recently
 * used entries of any model for room but none that this save made.  A failed copy or
 * allocation ends the save with what it kept (the store stays consistent). */
void atlas_kv_host_save(atlas_kv_host *h, int model, const atlas_kv_host_ident *id,
                        atlas_model *m, const atlas_kv_pool *p, atlas_kv_host_moved *out);

/* At a sequence's admission, after atlas_kv_table_match gave t its first blocks: when the
 * store holds the blocks after them along tokens[n], as many as the pool has free blocks for
 * and leaving a token to compute, takes free blocks into t, copies the images in and
 * registers them as written.  Returns the tokens t covers now (a multiple of block_size). */
int atlas_kv_host_restore(atlas_kv_host *h, int model, atlas_model *m, atlas_kv_pool *p,
                          atlas_kv_table *t, const int32_t *tokens, int n,
                          atlas_kv_host_moved *out);

#endif

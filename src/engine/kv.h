/* engine/kv.h — the paged KV cache's block manager, with prefix caching.  Internal.
 *
 * The model owns the K/V memory (n_blocks blocks of block_size tokens, per layer); this
 * hands out block ids.  A sequence's block table lists its blocks in position order: the
 * token at position p lives in block table[p / block_size], slot p % block_size.
 *
 * Prefix caching: a full block is registered under a hash of all the tokens up to its end
 * (chained block by block) as soon as the step that writes it is planned; it is "pending"
 * until that step has run (atlas_kv_table_written), and shareable from then on, while its
 * sequence still runs.  When its sequence lets it go it keeps its contents, on a list of
 * cached free blocks; another sequence whose tokens start the same way takes those blocks
 * (counted references: several sequences may share one) instead of computing them, at its
 * admission or later, whenever it stands at a block boundary (atlas_kv_table_extend).  A
 * pending block is never taken: the sequence that finds one waits a step rather than
 * compute the same tokens beside its writer.  Shared blocks are never written: a sequence
 * writes only at positions past its cached prefix.  Allocation takes never-registered free
 * blocks first, then evicts the least recently freed cached ones; a sequence gives its
 * blocks back last block first, so that a chain is evicted from its tail and its first
 * blocks, which every longer prefix needs, go last.
 *
 * The hash only finds candidates; a hit is proven, never trusted: a registered block keeps
 * its tokens and the registration of the block before it (the first block: the sequence's
 * salt), and a candidate must match all three, so by induction a hit holds exactly the
 * sequence's tokens from position 0, whatever the hash does.  The default hash is SipHash
 * under a key drawn per pool from the system's random source, so that no client can aim
 * many blocks at one slot of the map.  A sequence's salt keeps its blocks apart: blocks are
 * shared only between sequences of the same salt, byte for byte, and a sequence without one
 * shares only with others without one. */
#ifndef ATLAS_ENGINE_KV_H
#define ATLAS_ENGINE_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "atlas/status.h"

/* A prefix hash: prev continued over n bytes.  Correctness never depends on it (hits are
 * checked); a poor one only makes the map's probes longer. */
typedef uint64_t (*atlas_kv_hash_fn)(void *ctx, uint64_t prev, const void *bytes, size_t n);

typedef struct atlas_kv_pool_params {
    int n_blocks;
    int block_size;
    /* NULL (default): keyed SipHash-2-4, the key drawn per pool from getrandom.  A test
     * injects its own to force collisions. */
    atlas_kv_hash_fn hash;
    void *hash_ctx;
} atlas_kv_pool_params;

/* What a registered block is checked against on every hit, beside its tokens. */
typedef struct atlas_kv_block {
    uint64_t serial; /* this registration, unique in the pool; 0: not registered */
    uint64_t parent; /* serial of the block before it in its prefix; 0: it is the first */
    char *salt;      /* a first block's salt (salt_len bytes, owned); NULL: none */
    size_t salt_len;
    bool pending;    /* registered by a step not yet run: its K/V is not written */
} atlas_kv_block;

typedef struct atlas_kv_pool {
    int n_blocks;
    int block_size;
    int32_t *refs;     /* [n_blocks] sequences holding each block */
    uint64_t *hash;    /* [n_blocks] its prefix hash; 0: not registered */
    atlas_kv_block *blk; /* [n_blocks] */
    int32_t *toks;     /* [n_blocks * block_size] the tokens of each registered block */
    uint64_t serials;  /* registrations so far */
    int32_t *plain;    /* [n_blocks] stack of free unregistered blocks */
    int n_plain;
    int32_t *prev, *next; /* [n_blocks] the cached free blocks, least recently freed first */
    int32_t lru_head, lru_tail;
    int n_cached;      /* free blocks that keep a registered prefix */
    int32_t *map;      /* [map_cap] open addressing: hash -> block id, -1 empty */
    int map_cap;
    atlas_kv_hash_fn hash_fn; /* NULL: SipHash under key */
    void *hash_ctx;
    uint64_t key[2];
} atlas_kv_pool;

/* A sequence's block table; cap is fixed at init (the context's blocks), so growing it
 * never allocates. */
typedef struct atlas_kv_table {
    int32_t *ids; /* [cap] */
    int n;
    int cap;
    char *salt;   /* owned copy; NULL: none */
    size_t salt_len;
    /* the chain registered so far: blocks [0, n_reg) are registered (or held by a
     * registered twin), the last n_reg - n_written of them pending; h is the prefix hash
     * after them and parent the serial of the last; broken when a registration failed (no
     * later block may be registered after a gap) */
    int n_reg, n_written;
    uint64_t h, parent;
    bool broken;
} atlas_kv_table;

/* ATLAS_ERR_INVALID on bad sizes, ATLAS_ERR_IO when no random key can be had. */
atlas_status atlas_kv_pool_init(atlas_kv_pool *p, const atlas_kv_pool_params *params);
void atlas_kv_pool_destroy(atlas_kv_pool *p); /* safe on a zeroed pool */
int atlas_kv_pool_used(const atlas_kv_pool *p);   /* blocks held by sequences */
int atlas_kv_pool_free(const atlas_kv_pool *p);   /* blocks that can be handed out */
int atlas_kv_pool_cached(const atlas_kv_pool *p); /* free blocks that keep a prefix */

/* The written registered blocks that a hit can still reach, parents first: ids[i] and the
 * index in ids of the block before it in its prefix (parent[i], -1: a first block).  ids and
 * parent hold n_blocks.  Returns their number.  Their tokens are p->toks[id * block_size ..],
 * a first block's salt p->blk[id].salt. */
int atlas_kv_pool_chains(const atlas_kv_pool *p, int32_t *ids, int32_t *parent);

/* The pool's hash (keyed SipHash-2-4) and its key, for a store beside the pool
 * (engine/kv_host.c). */
uint64_t atlas_kv_siphash(const uint64_t key[2], uint64_t prev, const void *bytes, size_t n);
atlas_status atlas_kv_random_key(uint64_t key[2]);

/* Blocks needed to hold n_tokens tokens. */
int atlas_kv_blocks_for(const atlas_kv_pool *p, int n_tokens);

/* salt[salt_len] is copied; salt_len 0 (or salt NULL): none.  A table shares blocks only
 * with tables of the same salt. */
atlas_status atlas_kv_table_init(atlas_kv_table *t, int cap, const char *salt, size_t salt_len);
/* Blocks must have been released.  Safe on a zeroed table. */
void atlas_kv_table_destroy(atlas_kv_table *t);

/* For an empty table: takes the cached blocks that hold a prefix of tokens[n], leaving at
 * least one token to compute.  Returns the number of tokens covered (a multiple of
 * block_size). */
int atlas_kv_table_match(atlas_kv_pool *p, atlas_kv_table *t, const int32_t *tokens, int n);

/* For a table whose K/V covers tokens[0, n_computed): when n_computed ends its registered
 * chain, takes the written registered blocks that continue it along tokens[n], leaving at
 * least one token to compute (the table's own blocks there, reserved but unwritten, go
 * back to the pool).  Returns the tokens now covered (n_computed when nothing was taken);
 * *wait is set when the next block is pending (another sequence writes it in the step
 * being planned). */
int atlas_kv_table_extend(atlas_kv_pool *p, atlas_kv_table *t, const int32_t *tokens, int n,
                          int n_computed, bool *wait);

/* Registers the full blocks of tokens[0, n_final) not registered yet.  pending: their K/V
 * is written by the step being planned (atlas_kv_table_written once it ran; released
 * before that, they are forgotten); else it is written already. */
void atlas_kv_table_commit(atlas_kv_pool *p, atlas_kv_table *t, const int32_t *tokens,
                           int n_final, bool pending);

/* The steps that write t's positions below n_done ran: its pending blocks there may be
 * shared now (those past it wait for a step queued behind). */
void atlas_kv_table_written(atlas_kv_pool *p, atlas_kv_table *t, int n_done);

/* Grows t so that it covers n_tokens tokens.  Returns false, taking nothing, when the
 * pool has too few free blocks.  n_tokens beyond the table's cap is a programming error. */
bool atlas_kv_table_reserve(atlas_kv_pool *p, atlas_kv_table *t, int n_tokens);

/* Gives all of t's blocks back, the last first; t is then empty.  tokens[n_final] are the
 * tokens whose K/V is in the blocks and final: the full blocks among them are registered
 * for reuse; pending blocks (their step never ran) are forgotten. */
void atlas_kv_table_release(atlas_kv_pool *p, atlas_kv_table *t, const int32_t *tokens,
                            int n_final);

#endif

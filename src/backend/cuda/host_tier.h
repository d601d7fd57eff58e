/* backend/cuda/host_tier.h — the host tier: released models' weights kept in pinned host
 * memory exactly as they lie on the device, so that loading one again is a stream of large
 * host-to-device copies and reads no file.  Internal.
 *
 * Filled after the load, off its critical path: a load that the tier does not hold uploads
 * through the staging pool as any load does and records each upload's size and device
 * address; once the model's load is over and the model serves (atlas_tier_fill_start, through
 * the backend op tier_fill: the engine calls it after the LOADED event), a thread of the fill
 * pins the image's chunks (about 1.5 GB/s: 16 GB took 10.8 s when the load itself pinned
 * them) and copies the weights back from the device into them.  The driver runs no other
 * call of the context while cuMemHostAlloc pins, so a fill that ran during the load held each
 * of the load's later driver calls (the KV cache, the activations, the modules) for a chunk:
 * 9.6 s more for an 8B.  After the load, a chunk of at most 32 MiB, with a pause after each,
 * holds a serving step's driver calls about 21 ms at most while the image fills (16 GB:
 * about 500 chunks over some 11 s).  A model released
 * before its fill ends keeps no image (the chunks pinned so far stay free for the next fill),
 * so the release waits at most for one chunk.  An entry is one model's uploads in order, laid
 * end to end over chunks of pinned memory, with each upload's size; a hit replays them in the
 * same order, each checked against its recorded size.
 *
 * Least recently used out, whole entries only: an evicted entry's chunks stay pinned in a free
 * list for the next fill (cuMemHostAlloc of many GB is slow), and every chunk, held or free,
 * counts against the budget.  An entry is keyed by the model's identity (model.c: its files'
 * names, sizes, times and inodes, the tensor-parallel rank, the layout), so a changed file
 * is read from the files again.  Off on a GPU that shares the host's memory (integrated, or
 * reading pageable memory through the host's page tables: GB10): a host copy there would be a
 * second copy of the same DRAM (atlas_host_tier_off_reason).
 *
 * Process-wide, as the host is: a lock guards the entries; a use belongs to one load. */
#ifndef ATLAS_CUDA_HOST_TIER_H
#define ATLAS_CUDA_HOST_TIER_H

#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/host.h"

typedef struct atlas_tier_use atlas_tier_use; /* one load's use of the tier */

typedef struct atlas_tier_stats {
    size_t budget;  /* bytes of pinned memory it may hold (the last load's) */
    size_t pinned;  /* held now: the entries' chunks and free ones kept for the next fill */
    size_t filling; /* what fills running after their loads have yet to pin (the KV store
                       leaves it to them) */
    size_t held;    /* the entries' bytes */
    int entries;
    uint64_t hits, fills, evicted; /* loads served, images kept, entries evicted for room */
    uint64_t abandoned;            /* fills given up (no room, pinned memory short) */
} atlas_tier_stats;

/* Why the tier is off on host's GPU ("" when it is on).  Static text. */
const char *atlas_host_tier_off_reason(const atlas_host *host);

/* Starts a load's use: sets the tier's budget (every chunk past it freed, least recently used
 * entries evicted), then a hit when a complete entry has key, else a fill of an entry for key
 * when expect (the weights' bytes, about) fits the budget.  *out NULL (ATLAS_OK): the load
 * goes without the tier (budget 0, key 0, the tier off on this GPU, too large, or the same
 * key being filled by another load; loads may read one image together).  ATLAS_ERR_NOMEM. */
atlas_status atlas_host_tier_open(atlas_host *host, uint64_t key, size_t budget, size_t expect,
                                  atlas_tier_use **out);

/* 1 when u replays a kept image (no fill is called). */
int atlas_tier_use_hit(const atlas_tier_use *u);

/* One upload of the load, as atlas_host_upload_queue (u NULL: that): a hit copies the
 * image's bytes from pinned memory (ATLAS_ERR_INTERNAL when the upload's size is not the one
 * recorded: the image is dropped at close); a fill records it and uploads it through staging
 * (past the budget it gives the fill up).  The device bytes must stay as uploaded until the
 * fill ends: the fill copies them back. */
atlas_status atlas_tier_upload(atlas_host *host, atlas_tier_use *u, CUdeviceptr dst,
                               size_t bytes, atlas_host_fill_fn fill, const void *ctx,
                               size_t ctx_bytes);

/* Ends the load's part of the use once its uploads were waited for (ok: they all landed).  A
 * hit is refreshed (dropped when bad), a failed fill dropped: u is freed, NULL returned.  A
 * fill that went well is returned, not yet started (its room reserved): atlas_tier_fill_start
 * once the model serves, and atlas_tier_fill_end before the device memory is freed.  NULL:
 * nothing. */
atlas_tier_use *atlas_tier_close(atlas_host *host, atlas_tier_use *u, int ok);

/* Starts the fill atlas_tier_close returned, on a thread of its own: the image's chunks
 * pinned, the uploads copied back from the device (NULL, or started already: nothing). */
void atlas_tier_fill_start(atlas_tier_use *u);

/* Ends a fill atlas_tier_close returned, and frees u (NULL: nothing).  wait: until it is done
 * (kept, or dropped if it failed; one never started runs here); else it stops at its next
 * chunk and, unless it was done, keeps nothing (the device memory is about to go). */
void atlas_tier_fill_end(atlas_tier_use *u, int wait);

void atlas_host_tier_stats(atlas_tier_stats *out);

/* Tests: the size of a chunk for a budget (1 MiB to 32 MiB, a sixteenth of it). */
size_t atlas_host_tier_chunk_for(size_t budget);

#endif

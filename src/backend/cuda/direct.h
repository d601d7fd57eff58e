/* backend/cuda/direct.h — weight uploads that the copy engine reads straight out of the page
 * cache: the checkpoint's file mapping is registered (cuMemHostRegister, read-only) piece by
 * piece, copied from, and unregistered.  The CPU copies a page-cached file at ~20-24 GB/s on
 * the H200 machine, the copy engine reads pinned memory at ~55 GB/s: the staging pool
 * (host.h) is bound by the first, this path by the second and by the rate of registration.
 * Internal to backend/cuda.
 *
 * Pieces: each file is cut into a fixed grid of piece_bytes cells (page aligned, from the
 * mapping's start); a piece is the page-rounded part of one cell that queued copies touch, so
 * pieces never overlap (registering a page twice fails).  A copy that spans cells is cut at
 * the cell edges: each cut lies inside one registration, which is what the driver needs to
 * treat the source as pinned.
 *
 * One run: `threads` threads register pieces in file order, at most `window` pieces ahead of
 * the last one unregistered; the calling thread queues each registered piece's copies on a
 * stream of the loader's own and records an event; reaper threads (one per 4 registering
 * threads) wait for that event and unregister the piece.  With stage_pct > 0, that share of the pieces (spread evenly) goes
 * through the staging pool instead, on another thread, so the CPU copy and the copy engine's
 * reads out of the page cache add up.  A registration the driver refuses (containers, old
 * drivers, no read-only registration) turns direct loading off for the process: that piece
 * and every later one are staged, and atlas_direct_refused says why.
 *
 * Errors: a run that fails leaves nothing registered (it waits for its copies, then
 * unregisters every piece it registered) and returns the first error, naming the piece. */
#ifndef ATLAS_CUDA_DIRECT_H
#define ATLAS_CUDA_DIRECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/host.h"

typedef struct atlas_direct_opts {
    size_t piece_bytes; /* grid cell; rounded up to whole pages (0: ATLAS_DIRECT_PIECE) */
    int threads;        /* registering threads (0: ATLAS_DIRECT_THREADS) */
    int window;         /* pieces registered at once at most (0: 2 * threads + 2) */
    int stage_pct;      /* share of the pieces copied through the staging pool, 0..100 */
} atlas_direct_opts;

#define ATLAS_DIRECT_PIECE ((size_t)64 << 20)
#define ATLAS_DIRECT_THREADS 8

/* Copies bytes [file_off, file_off + bytes) of a file (also mapped at src) to dst through
 * the staging pool; may return before the copy landed (atlas_host_upload_wait). */
typedef atlas_status (*atlas_direct_stage_fn)(void *user, CUdeviceptr dst, const char *src,
                                              int fd, uint64_t file_off, size_t bytes);

typedef struct atlas_direct_stats {
    size_t direct_bytes;   /* copied out of registered pieces */
    size_t staged_bytes;   /* through the staging pool (stage_pct, or after a refusal) */
    int pieces, pieces_staged;
    size_t piece_bytes;
    int threads, window;
    double ms;             /* the whole run, copies landed */
} atlas_direct_stats;

typedef struct atlas_direct atlas_direct;

/* A loader with an empty queue; stage serves the pieces that are staged. */
atlas_status atlas_direct_create(atlas_host *host, const atlas_direct_opts *opts,
                                 atlas_direct_stage_fn stage, void *user, atlas_direct **out);
void atlas_direct_free(atlas_direct *d); /* drops the queue; NULL is fine */

/* Whether bytes at src can be copied this way: a descriptor, and src - file_off (the start
 * of the file's mapping) page aligned.  False once a registration was refused. */
bool atlas_direct_eligible(const void *src, int fd, uint64_t file_off);

/* Queues a copy of `bytes` at file offset file_off (mapped at src) to dst. */
atlas_status atlas_direct_add(atlas_direct *d, CUdeviceptr dst, const void *src, int fd,
                              uint64_t file_off, size_t bytes);
/* Forgets the queued copies into [lo, hi) (a weight freed before the run). */
void atlas_direct_drop(atlas_direct *d, CUdeviceptr lo, CUdeviceptr hi);
size_t atlas_direct_queued_bytes(const atlas_direct *d);

/* Runs the queue (see above) and empties it; returns when every copy has landed and nothing
 * is registered.  *stats (may be NULL) describes the run. */
atlas_status atlas_direct_run(atlas_direct *d, atlas_direct_stats *stats);

/* sum += s: bytes, pieces and ms added, the run's settings (piece size, threads, window)
 * those of s. */
void atlas_direct_stats_add(atlas_direct_stats *sum, const atlas_direct_stats *s);

/* Why direct loading is off in this process ("" while it is not). */
const char *atlas_direct_refused(void);

#endif

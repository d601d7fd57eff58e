/* core/threadpool.h — a persistent pool of worker threads with a parallel-for.  Internal.
 *
 * The workers are created once and sleep between jobs, so an op costs a wake-up, not a
 * thread creation. The calling thread takes part in every job as worker 0. One job at a
 * time: atlas_threadpool_for must not be called concurrently on the same pool, nor from
 * inside a job. */
#ifndef ATLAS_CORE_THREADPOOL_H
#define ATLAS_CORE_THREADPOOL_H

#include <stdint.h>

#include "atlas/status.h"

typedef struct atlas_threadpool atlas_threadpool;

/* fn handles items [begin, end); thread is in [0, atlas_threadpool_size). */
typedef void (*atlas_parallel_fn)(void *ctx, int64_t begin, int64_t end, int thread);

/* The online cores, at least 1 and at most `most` (a pool or loader's thread count). */
int atlas_cores(int most);
/* The same less one core, left to the engine's scheduler while a model loads beside the
 * resident ones: at least 1 and at most `most` (a loader's reader threads). */
int atlas_cores_spare(int most);

/* Lowers the calling thread's scheduling priority (Linux: nice 10 for this thread alone;
 * elsewhere nothing): a load's reader and copy threads take idle cores at full speed but
 * give way to the scheduler and the HTTP threads when the cores are all busy. */
void atlas_thread_background(void);

/* n_threads counts the caller: n_threads - 1 workers are started. 0: one per online core. */
atlas_status atlas_threadpool_create(int n_threads, atlas_threadpool **out);
void atlas_threadpool_free(atlas_threadpool *pool); /* NULL does nothing; joins the workers */
int atlas_threadpool_size(const atlas_threadpool *pool);

/* Calls fn over [0, n) split into at most size() contiguous ranges of at least min_chunk
 * items (min_chunk < 1 counts as 1), and returns when all are done. Small jobs (n <=
 * min_chunk) run on the caller alone. */
void atlas_threadpool_for(atlas_threadpool *pool, int64_t n, int64_t min_chunk,
                          atlas_parallel_fn fn, void *ctx);

#endif

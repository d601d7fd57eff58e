/* backend/cuda/host.h — the process host, internal side: the context, the streams and the
 * pinned staging pool that outlive every model.  Public side: include/atlas/host.h.
 *
 * Threads: the primary context must be current on a thread before it calls the driver;
 * atlas_host_get makes it current on the calling thread, atlas_host_make_current on others
 * (cheap: call it at the start of any entry point that may run on a new thread). */
#ifndef ATLAS_CUDA_HOST_H
#define ATLAS_CUDA_HOST_H

#include <stdbool.h>
#include <stdint.h>

#include "atlas/host.h"
#include "backend/cuda/driver.h"

/* Makes the host's primary context current on the calling thread. */
atlas_status atlas_host_make_current(atlas_host *host);

CUcontext atlas_host_context(const atlas_host *host);
CUdevice atlas_host_device(const atlas_host *host);
/* The stream the model's kernels run on (non-blocking: it does not sync with stream 0). */
CUstream atlas_host_stream(const atlas_host *host);
/* The stream weight uploads run on, so that they overlap host-side copies. */
CUstream atlas_host_copy_stream(const atlas_host *host);

/* The pool device memory is allocated from in stream order (cuMemAllocFromPoolAsync,
 * cuMemFreeAsync: neither synchronises the device, as cuMemFree does, so a release or a failed
 * load beside serving does not stall the resident models' steps), or NULL where the driver
 * or the device has no memory pools (CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED): then the
 * registry allocates with cuMemAlloc and frees with cuMemFree.  The host owns it: its release
 * threshold is 0 (memory a release frees goes back to the driver at the next synchronise,
 * and the registry trims it at once: device memory is back at its baseline after every
 * release) and it inserts no dependency between streams of its own (a load's allocation
 * never makes the copy stream wait for the serving stream, nor the other way round). */
CUmemoryPool atlas_host_pool(const atlas_host *host);

/* How many times the host retained the primary context: 1 for the life of the process
 * (tests check that model swaps never create a context). */
int atlas_host_context_retains(const atlas_host *host);

/* How many times this process created its GPU context (retained the primary context): 0
 * before its first use of the GPU, then 1 for its life; a swap that made another would count
 * here.  Binds nothing, so /metrics may read it on a CPU-only server.  Any thread. */
uint64_t atlas_host_contexts_created(void);

/* --- weight uploads through the pinned staging pool ---------------------------------------
 * The pool (ATLAS_HOST_STAGING_COUNT buffers of ATLAS_HOST_STAGING_BYTES, pinned, allocated on
 * the first upload and kept for the process) lets the CPU fill some buffers while the copy
 * engine drains others.  Its loader threads (one a core, up to 16, started with the pool)
 * fill the queued uploads' pieces, one buffer each, concurrently. */
#define ATLAS_HOST_STAGING_MAX 64
#define ATLAS_HOST_STAGING_COUNT 32
#define ATLAS_HOST_STAGING_BYTES ((size_t)16 << 20)

/* Fills dst[0, bytes) of a staging buffer with bytes [offset, offset + bytes) of an upload.
 * Lets the caller convert (e.g. fp32 -> bf16) while copying. A failure (a file read short
 * because the file was truncated) fails the upload with fill's message. */
typedef atlas_status (*atlas_host_fill_fn)(void *dst, size_t offset, size_t bytes, void *user);

/* Uploads `bytes` to device address dst, produced buffer by buffer by fill, on this thread
 * (synchronous uploaders are serialised).  Returns when the last piece is queued on the copy
 * stream; call atlas_host_upload_wait before the data is used or the source changes. */
atlas_status atlas_host_upload(atlas_host *host, CUdeviceptr dst, size_t bytes,
                               atlas_host_fill_fn fill, void *user);
/* Queues an upload for the loader threads and returns at once: fill runs on them, on several
 * pieces at a time, with a copy of ctx (ctx_bytes).  What fill reads must stay valid until
 * atlas_host_upload_wait; a failure is reported there. */
atlas_status atlas_host_upload_queue(atlas_host *host, CUdeviceptr dst, size_t bytes,
                                     atlas_host_fill_fn fill, const void *ctx,
                                     size_t ctx_bytes);
/* The same, with the pieces filled in pinned memory of the caller's (`pinned`, `bytes` long,
 * valid until atlas_host_upload_wait) instead of the staging buffers and copied from there:
 * what a load reads stays there, for the host tier (host_tier.h).  fill is told offsets
 * from base on (a part of a larger upload). */
atlas_status atlas_host_upload_queue_at(atlas_host *host, CUdeviceptr dst, size_t bytes,
                                        atlas_host_fill_fn fill, const void *ctx,
                                        size_t ctx_bytes, void *pinned, size_t base);
/* atlas_host_upload with memcpy from src; src may be freed or changed once it returns
 * (it is copied into staging memory before the call returns). */
atlas_status atlas_host_upload_copy(atlas_host *host, CUdeviceptr dst, const void *src,
                                    size_t bytes);
/* Waits until every queued upload has reached the device; returns the first failure of a
 * queued upload since the last wait. */
atlas_status atlas_host_upload_wait(atlas_host *host);

/* A hold on the device memory pool, for a load that follows a release: while one is held,
 * memory freed (the released model's) stays mapped in the pool, so that the newcomer's
 * allocations take it without mapping memory again (mapping stalled every stream of the
 * device, a resident model's steps among them: bench/RESULTS.md), and a release does not trim
 * it; the last unhold gives back what is unused, so memory is at its baseline once the load is
 * over.  Holds nest; no-ops without a pool.  atlas_host_mem_info counts what a hold keeps
 * unused as free. */
atlas_status atlas_host_pool_hold(atlas_host *host);
atlas_status atlas_host_pool_unhold(atlas_host *host);
bool atlas_host_pool_held(atlas_host *host);

/* Work that makes the driver wait for an idle device while it holds the context (loading
 * kernel modules: a 7.5 ms wait for a resident model's step in flight, each one a step's
 * bubble in that model's stream; bench/RESULTS.md), run where the serving thread has nothing
 * queued. atlas_host_quiet_call hands fn to the thread that said atlas_host_serving(true)
 * and waits for it to run fn at its next atlas_host_quiet_point, and returns what fn
 * returned (its message too); with no serving thread, on the serving thread itself, or after
 * 2 s without a quiet point, fn runs on the caller. fn must not wait for the serving thread.
 * The serving thread stops queuing ahead while atlas_host_quiet_wanted says so, offers a
 * point after its steps are collected, and says atlas_host_serving(false) before it sleeps
 * (waiters then run their work themselves). */
typedef atlas_status (*atlas_host_quiet_fn)(void *arg);
atlas_status atlas_host_quiet_call(atlas_host *host, atlas_host_quiet_fn fn, void *arg);
void atlas_host_serving(atlas_host *host, bool serving);
bool atlas_host_quiet_wanted(atlas_host *host);
void atlas_host_quiet_point(atlas_host *host);

/* Sets the pool's shape (count <= ATLAS_HOST_STAGING_MAX) before the first upload
 * (ATLAS_ERR_BUSY after): for tests and for hosts short of pinned memory. */
atlas_status atlas_host_set_staging(atlas_host *host, int count, size_t bytes);

/* Allocates the staging pool and starts its loader threads now rather than at the first
 * upload (atlas_host_start runs it beside the first load's file work); a failure leaves the
 * first upload to try again and report it. */
atlas_status atlas_host_prepare_staging(atlas_host *host);

/* The times of atlas_host_times (atlas/host.h): the set-up began (the first call wins), and
 * cuBLASLt's library was opened (cuda_lt_open_library, by host_start.c). */
void atlas_host_mark_begin(void);
void atlas_host_mark_cublaslt(double t);

/* Tests only: the pinned bytes the staging pool holds (0 until the first upload). */
size_t atlas_host_staging_bytes(const atlas_host *host);

#endif

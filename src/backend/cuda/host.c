/* backend/cuda/host.c — the process host: binds one GPU, retains its primary context once,
 * owns the streams and the pinned staging pool.  Never destroyed (DESIGN.md, "The two
 * lifetimes"): re-creating a context is what in-process swapping exists to avoid.
 *
 * Globals (docs/ARCHITECTURE.md, "Globals"): the host itself, whether it is bound, the last
 * reason it could not be, all under host_lock; and per thread, the context made current. */
#include "backend/cuda/host.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "core/fault.h"
#include "core/threadpool.h"

/* atlas_host_upload_copy splits each staging chunk into pieces copied by this many threads:
 * one thread's memcpy (~6 GB/s measured on the H200 machine) is far below the copy engine. */
#define HOST_COPY_THREADS 8
#define HOST_COPY_PIECE ((size_t)2 << 20)
/* loader threads for queued uploads (the reference loader used 16 on 16 cores; one core is
 * left to the scheduler) */
#define HOST_LOADERS_MAX 16

struct atlas_host {
    atlas_host_props props;
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;      /* kernels */
    CUstream copy_stream; /* weight uploads */
    CUmemoryPool pool;    /* device memory in stream order; NULL: cuMemAlloc (host.h) */
    int ctx_retains;
    int pool_holds;       /* atlas_host_pool_hold's count (pool_lock): the pool keeps what is
                             freed while > 0 */

    /* pinned staging pool, allocated on the first upload.  staging_lock serialises the
     * synchronous uploaders; q_lock guards the free buffers and the queued uploads. */
    pthread_mutex_t staging_lock;
    int staging_count;             /* buffers wanted */
    size_t staging_size;           /* bytes each */
    int staging_n;                 /* buffers allocated (0: not yet) */
    void *staging[ATLAS_HOST_STAGING_MAX];
    CUevent staging_done[ATLAS_HOST_STAGING_MAX]; /* recorded after the last copy from it */
    atlas_threadpool *copy_pool;   /* for atlas_host_upload_copy; NULL: the caller copies */

    pthread_mutex_t q_lock;
    pthread_cond_t q_buf_cv;       /* a buffer went back to the free list */
    pthread_cond_t q_job_cv;       /* a job was queued */
    pthread_cond_t q_idle_cv;      /* the queue ran dry and no piece is being filled */
    int free_buf[ATLAS_HOST_STAGING_MAX]; /* ring of free buffers, oldest copy first */
    int free_head, free_n;
    struct host_job *jobs, *jobs_tail;    /* queued uploads with pieces left to fill */
    int pieces_busy;               /* pieces being filled by loader threads */
    int loaders;                   /* loader threads started */
    atlas_status q_err;            /* first failure of a queued piece, until the next wait */
    char q_msg[512];

    /* work that wants a quiet device (atlas_host_quiet_call), for the serving thread */
    pthread_mutex_t quiet_lock;
    pthread_cond_t quiet_cv;
    struct quiet_call *quiet;      /* waiting, oldest first */
    bool serving;                  /* a serving thread queues work and offers quiet points */
    pthread_t server;
};

static pthread_mutex_t host_lock = PTHREAD_MUTEX_INITIALIZER;
/* the pool's holds, apart from host_lock: an unhold trims the pool (unmapping takes a while)
 * and nothing else should wait for that */
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static atlas_host host_global = {.staging_lock = PTHREAD_MUTEX_INITIALIZER,
                                  .q_lock = PTHREAD_MUTEX_INITIALIZER,
                                  .q_buf_cv = PTHREAD_COND_INITIALIZER,
                                  .q_job_cv = PTHREAD_COND_INITIALIZER,
                                  .q_idle_cv = PTHREAD_COND_INITIALIZER,
                                  .quiet_lock = PTHREAD_MUTEX_INITIALIZER,
                                  .quiet_cv = PTHREAD_COND_INITIALIZER};
static int host_bound;
static uint64_t host_contexts; /* contexts retained, never decremented (under host_lock) */
static char host_reason[512];
static _Thread_local CUcontext thread_ctx;
/* when each part of binding ended (atlas_host_times), under its own lock: the staging pool's
 * is written under staging_lock, the others under host_lock */
static pthread_mutex_t times_lock = PTHREAD_MUTEX_INITIALIZER;
static atlas_host_times host_times;

static void host_mark(double *field, double t) {
    pthread_mutex_lock(&times_lock);
    if (field == &host_times.begin && host_times.begin) t = host_times.begin; /* the first */
    *field = t;
    pthread_mutex_unlock(&times_lock);
}

void atlas_host_mark_begin(void) { host_mark(&host_times.begin, atlas_now_ms()); }
void atlas_host_mark_cublaslt(double t) { host_mark(&host_times.cublaslt, t); }

void atlas_host_get_times(atlas_host_times *out) {
    double loaded, init;
    atlas_driver_times(&loaded, &init);
    pthread_mutex_lock(&times_lock);
    *out = host_times;
    pthread_mutex_unlock(&times_lock);
    out->driver = loaded;
    out->cuinit = init;
}

static atlas_status host_attr(atlas_host *h, int attr, int *out) {
    return ATLAS_CU(cuDeviceGetAttribute, out, attr, h->dev);
}

static atlas_status host_read_props(atlas_host *h, int ordinal) {
    atlas_host_props *p = &h->props;
    p->ordinal = ordinal;
    ATLAS_CU_TRY(cuDeviceGetName, p->name, (int)sizeof p->name, h->dev);
    p->name[sizeof p->name - 1] = '\0';
    ATLAS_TRY(host_attr(h, ATLAS_CU_ATTR_COMPUTE_CAPABILITY_MAJOR, &p->cc_major));
    ATLAS_TRY(host_attr(h, ATLAS_CU_ATTR_COMPUTE_CAPABILITY_MINOR, &p->cc_minor));
    ATLAS_TRY(host_attr(h, ATLAS_CU_ATTR_MULTIPROCESSOR_COUNT, &p->sm_count));
    ATLAS_TRY(host_attr(h, ATLAS_CU_ATTR_L2_CACHE_SIZE, &p->l2_bytes));
    ATLAS_TRY(host_attr(h, ATLAS_CU_ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                        &p->smem_per_block_optin));
    ATLAS_TRY(host_attr(h, ATLAS_CU_ATTR_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, &p->smem_per_sm));
    ATLAS_TRY(host_attr(h, ATLAS_CU_ATTR_INTEGRATED, &p->integrated));
    ATLAS_TRY(host_attr(h, ATLAS_CU_ATTR_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES,
                        &p->host_page_tables));
    ATLAS_CU_TRY(cuDeviceTotalMem, &p->total_mem, h->dev);
    p->driver_version = atlas_driver_version();
    return ATLAS_OK;
}

/* Makes the host's memory pool where the driver and the device have them; h->pool stays
 * NULL (cuMemAlloc and cuMemFree) where they do not or it cannot be made as atlas wants it. */
static void host_pool_init(atlas_host *h) {
    const atlas_driver *d = atlas_driver_get();
    int supported = 0;
    if (!d->cuMemPoolCreate || !d->cuMemPoolDestroy || !d->cuMemPoolSetAttribute ||
        !d->cuMemPoolTrimTo || !d->cuMemAllocFromPoolAsync || !d->cuMemFreeAsync ||
        d->cuDeviceGetAttribute(&supported, ATLAS_CU_ATTR_MEMORY_POOLS_SUPPORTED, h->dev) !=
            ATLAS_CUDA_SUCCESS || !supported)
        return;
    ATLAS_CUMEMPOOLPROPS props = {.allocType = ATLAS_CU_MEM_ALLOCATION_TYPE_PINNED,
                                  .location = {ATLAS_CU_MEM_LOCATION_TYPE_DEVICE, h->dev}};
    if (d->cuMemPoolCreate(&h->pool, &props) != ATLAS_CUDA_SUCCESS) {
        h->pool = NULL;
        return;
    }
    /* threshold 0: what is freed and unused goes back to the driver at every synchronise,
     * so the pool never keeps a released model's memory from the next model or another
     * process; the cost is that an allocation after it maps memory again, as cuMemAlloc
     * does.  No internal dependencies: memory freed on the serving stream is reused by a
     * load on the copy stream only in stream order (the registry makes the copy stream wait
     * for the serving stream when a load begins), never by a wait the driver would add */
    unsigned long long threshold = 0;
    int internal = 0;
    if (d->cuMemPoolSetAttribute(h->pool, ATLAS_CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                                 &threshold) != ATLAS_CUDA_SUCCESS ||
        d->cuMemPoolSetAttribute(h->pool, ATLAS_CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
                                 &internal) != ATLAS_CUDA_SUCCESS) {
        d->cuMemPoolDestroy(h->pool);
        h->pool = NULL;
    }
}

/* Undoes a partial host_init so that a later call can try again. */
static void host_undo(atlas_host *h) {
    const atlas_driver *d = atlas_driver_get();
    if (h->pool) d->cuMemPoolDestroy(h->pool);
    h->pool = NULL;
    if (h->copy_stream) d->cuStreamDestroy(h->copy_stream);
    if (h->stream) d->cuStreamDestroy(h->stream);
    if (h->ctx) {
        d->cuCtxSetCurrent(NULL);
        d->cuDevicePrimaryCtxRelease(h->dev);
        h->ctx_retains--;
    }
    h->stream = h->copy_stream = NULL;
    h->ctx = NULL;
    thread_ctx = NULL;
}

static atlas_status host_init(atlas_host *h, int ordinal) {
    double t0 = atlas_now_ms();
    host_mark(&host_times.begin, t0);
    ATLAS_TRY(atlas_driver_load(NULL));
    int count = 0;
    ATLAS_CU_TRY(cuDeviceGetCount, &count);
    if (count <= 0) return atlas_fail(ATLAS_ERR_NO_DEVICE, "no CUDA device");
    if (ordinal >= count)
        return atlas_fail(ATLAS_ERR_NO_DEVICE, "GPU %d requested, but the driver sees %d "
                          "device(s) (ordinals 0..%d)", ordinal, count, count - 1);
    ATLAS_CU_TRY(cuDeviceGet, &h->dev, ordinal);
    ATLAS_TRY(host_read_props(h, ordinal));
    ATLAS_CU_TRY(cuDevicePrimaryCtxRetain, &h->ctx, h->dev);
    h->ctx_retains++;
    host_contexts++;
    atlas_status st = ATLAS_CU(cuCtxSetCurrent, h->ctx);
    if (st == ATLAS_OK) thread_ctx = h->ctx;
    if (st == ATLAS_OK) host_mark(&host_times.context, atlas_now_ms());
    if (st == ATLAS_OK) st = ATLAS_CU(cuStreamCreate, &h->stream, ATLAS_CU_STREAM_NON_BLOCKING);
    if (st == ATLAS_OK)
        st = ATLAS_CU(cuStreamCreate, &h->copy_stream, ATLAS_CU_STREAM_NON_BLOCKING);
    if (st != ATLAS_OK) {
        host_undo(h);
        return st;
    }
    host_pool_init(h);
    size_t total = 0; /* nothing allocated yet: the start's checks read this, not the driver */
    if (atlas_driver_get()->cuMemGetInfo(&h->props.free_at_bind, &total) != 0)
        h->props.free_at_bind = 0;
    host_mark(&host_times.streams, atlas_now_ms());
    /* 32 x 16 MiB: 8 x 64 and 24 x 32 MiB measured the same (bench/RESULTS.md) */
    h->staging_count = ATLAS_HOST_STAGING_COUNT;
    h->staging_size = ATLAS_HOST_STAGING_BYTES;
    h->props.init_ms = atlas_now_ms() - t0;
    return ATLAS_OK;
}

atlas_status atlas_host_get(int ordinal, atlas_host **out) {
    *out = NULL;
    if (ordinal < 0) return atlas_fail(ATLAS_ERR_INVALID, "host: GPU ordinal %d < 0", ordinal);
    pthread_mutex_lock(&host_lock);
    atlas_status st = ATLAS_OK;
    if (host_bound && host_global.props.ordinal != ordinal) {
        st = atlas_fail(ATLAS_ERR_INVALID, "host: GPU %d requested, but this process is bound "
                        "to GPU %d (one GPU per process)", ordinal, host_global.props.ordinal);
    } else if (!host_bound) {
        st = host_init(&host_global, ordinal);
        if (st == ATLAS_OK) {
            host_bound = 1;
            host_reason[0] = '\0';
        } else {
            snprintf(host_reason, sizeof host_reason, "%s", atlas_last_error());
        }
    }
    pthread_mutex_unlock(&host_lock);
    if (st == ATLAS_OK) st = atlas_host_make_current(&host_global);
    if (st == ATLAS_OK) *out = &host_global;
    return st;
}

const char *atlas_host_unavailable_reason(void) {
    /* written under host_lock, once per failed bind; reads race only with a concurrent bind */
    return host_reason;
}

const atlas_host_props *atlas_host_properties(const atlas_host *host) { return &host->props; }

atlas_status atlas_host_make_current(atlas_host *host) {
    if (thread_ctx == host->ctx) return ATLAS_OK;
    ATLAS_CU_TRY(cuCtxSetCurrent, host->ctx);
    thread_ctx = host->ctx;
    return ATLAS_OK;
}

atlas_status atlas_host_mem_info(atlas_host *host, size_t *free_bytes, size_t *total_bytes) {
    ATLAS_TRY(atlas_host_make_current(host));
    bool held = atlas_host_pool_held(host);
    /* what the pool holds unused is free for any model: given back before it is counted, or
     * while a hold keeps it mapped, counted as free beside the driver's */
    unsigned long long reserved = 0, used = 0;
    if (host->pool && !held) ATLAS_CU_TRY(cuMemPoolTrimTo, host->pool, 0);
    if (host->pool && held) {
        ATLAS_CU_TRY(cuMemPoolGetAttribute, host->pool,
                     ATLAS_CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved);
        ATLAS_CU_TRY(cuMemPoolGetAttribute, host->pool, ATLAS_CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
                     &used);
    }
    ATLAS_CU_TRY(cuMemGetInfo, free_bytes, total_bytes);
    if (reserved > used) *free_bytes += (size_t)(reserved - used);
    return ATLAS_OK;
}

/* The pool's release threshold: 0 (what is freed goes back to the driver at every
 * synchronise) or, while held, all of it. */
static atlas_status pool_threshold(atlas_host *host, bool keep) {
    unsigned long long t = keep ? ~0ull : 0;
    return ATLAS_CU(cuMemPoolSetAttribute, host->pool, ATLAS_CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    &t);
}

atlas_status atlas_host_pool_hold(atlas_host *host) {
    if (!host->pool) return ATLAS_OK;
    ATLAS_TRY(atlas_host_make_current(host));
    pthread_mutex_lock(&pool_lock);
    atlas_status st = host->pool_holds == 0 ? pool_threshold(host, true) : ATLAS_OK;
    if (st == ATLAS_OK) host->pool_holds++;
    pthread_mutex_unlock(&pool_lock);
    return st;
}

atlas_status atlas_host_pool_unhold(atlas_host *host) {
    if (!host->pool) return ATLAS_OK;
    ATLAS_TRY(atlas_host_make_current(host));
    pthread_mutex_lock(&pool_lock);
    atlas_status st = ATLAS_OK;
    if (host->pool_holds > 0 && --host->pool_holds == 0) {
        st = pool_threshold(host, false);
        atlas_status t = ATLAS_CU(cuMemPoolTrimTo, host->pool, 0);
        if (st == ATLAS_OK) st = t;
    }
    pthread_mutex_unlock(&pool_lock);
    return st;
}

bool atlas_host_pool_held(atlas_host *host) {
    pthread_mutex_lock(&pool_lock);
    bool held = host->pool_holds > 0;
    pthread_mutex_unlock(&pool_lock);
    return held;
}

atlas_status atlas_host_alloc_pinned(atlas_host *host, size_t bytes, void **out) {
    *out = NULL;
    ATLAS_TRY(atlas_host_make_current(host));
    /* a fault site (core/fault.h): out of pinned memory, without asking the driver */
    atlas_status st = ATLAS_FAULT_HERE()
                          ? atlas_cu_check(ATLAS_CUDA_ERROR_OUT_OF_MEMORY,
                                           "cuMemHostAlloc (injected fault)", __FILE__, __LINE__)
                          : ATLAS_CU(cuMemHostAlloc, out, bytes, 0);
    if (st != ATLAS_OK)
        return atlas_fail_wrap(ATLAS_ERR_NOMEM, "host: allocating %zu bytes of pinned memory",
                               bytes);
    return ATLAS_OK;
}

void atlas_host_free_pinned(atlas_host *host, void *p) {
    if (!p || atlas_host_make_current(host) != ATLAS_OK) return;
    (void)atlas_driver_get()->cuMemFreeHost(p);
}

CUcontext atlas_host_context(const atlas_host *host) { return host->ctx; }
CUdevice atlas_host_device(const atlas_host *host) { return host->dev; }
CUstream atlas_host_stream(const atlas_host *host) { return host->stream; }
CUstream atlas_host_copy_stream(const atlas_host *host) { return host->copy_stream; }
CUmemoryPool atlas_host_pool(const atlas_host *host) { return host->pool; }
int atlas_host_context_retains(const atlas_host *host) { return host->ctx_retains; }

uint64_t atlas_host_contexts_created(void) {
    pthread_mutex_lock(&host_lock);
    uint64_t n = host_contexts;
    pthread_mutex_unlock(&host_lock);
    return n;
}

/* --- staging pool ------------------------------------------------------------------------ */

atlas_status atlas_host_set_staging(atlas_host *host, int count, size_t bytes) {
    if (count < 1 || count > ATLAS_HOST_STAGING_MAX || bytes < 4096)
        return atlas_fail(ATLAS_ERR_INVALID, "host: staging pool of %d x %zu bytes: want 1..%d "
                          "buffers of at least 4096 bytes", count, bytes, ATLAS_HOST_STAGING_MAX);
    pthread_mutex_lock(&host->staging_lock);
    atlas_status st = ATLAS_OK;
    if (host->staging_n)
        st = atlas_fail(ATLAS_ERR_BUSY, "host: the staging pool is already allocated");
    else
        host->staging_count = count, host->staging_size = bytes;
    pthread_mutex_unlock(&host->staging_lock);
    return st;
}

/* A queued upload (atlas_host_upload_queue): its pieces go to the loader threads in order. */
typedef struct host_job {
    struct host_job *next;
    CUdeviceptr dst;
    size_t bytes, next_off;   /* next_off: first byte no loader has taken */
    int pieces_busy;          /* taken and not yet queued on the copy stream */
    char *via;                /* pinned memory the pieces are filled in and copied from
                                 (atlas_host_upload_queue_at); NULL: the staging buffers */
    size_t base;              /* offset of the job's first byte in the caller's upload */
    atlas_host_fill_fn fill;
    max_align_t ctx[];        /* the caller's context, copied */
} host_job;

static void *host_loader_main(void *arg);

/* Takes the free buffer whose last copy was queued first, waiting for one if every buffer
 * is being filled; returns once its copies are done.  Called without q_lock. */
static atlas_status host_buf_take(atlas_host *h, int *out) {
    pthread_mutex_lock(&h->q_lock);
    while (h->free_n == 0) pthread_cond_wait(&h->q_buf_cv, &h->q_lock);
    int i = h->free_buf[h->free_head];
    h->free_head = (h->free_head + 1) % h->staging_n;
    h->free_n--;
    pthread_mutex_unlock(&h->q_lock);
    *out = i;
    return ATLAS_CU(cuEventSynchronize, h->staging_done[i]);
}

/* Fills buffer i with bytes [off, off + n) of an upload and queues its copy to dst + off. */
static atlas_status host_buf_send(atlas_host *h, int i, CUdeviceptr dst, size_t off, size_t n,
                                  atlas_host_fill_fn fill, void *user) {
    ATLAS_TRY(fill(h->staging[i], off, n, user));
    ATLAS_CU_TRY(cuMemcpyHtoDAsync, dst + off, h->staging[i], n, h->copy_stream);
    return ATLAS_CU(cuEventRecord, h->staging_done[i], h->copy_stream);
}

static void host_buf_give(atlas_host *h, int i) {
    pthread_mutex_lock(&h->q_lock);
    h->free_buf[(h->free_head + h->free_n) % h->staging_n] = i;
    h->free_n++;
    pthread_cond_signal(&h->q_buf_cv);
    pthread_mutex_unlock(&h->q_lock);
}

/* Allocates the pool and starts its threads on first use.  Pinned memory can be scarce
 * (GB10, containers): keep as many buffers as could be had, fail only if none.  Runs under
 * staging_lock. */
static atlas_status host_staging_ensure(atlas_host *h) {
    if (h->staging_n) return ATLAS_OK;
    atlas_status st = ATLAS_OK;
    for (int i = 0; i < h->staging_count; i++) {
        /* a fault site (core/fault.h): out of pinned memory, without asking the driver */
        st = ATLAS_FAULT_HERE()
                 ? atlas_cu_check(ATLAS_CUDA_ERROR_OUT_OF_MEMORY,
                                  "cuMemHostAlloc (injected fault)", __FILE__, __LINE__)
                 : ATLAS_CU(cuMemHostAlloc, &h->staging[i], h->staging_size,
                            ATLAS_CU_MEMHOSTALLOC_PORTABLE);
        if (st != ATLAS_OK) break;
        /* blocking: a loader waiting on a copy must not spin on a core the others read on */
        st = ATLAS_CU(cuEventCreate, &h->staging_done[i],
                      ATLAS_CU_EVENT_DISABLE_TIMING | ATLAS_CU_EVENT_BLOCKING_SYNC);
        if (st != ATLAS_OK) {
            atlas_driver_get()->cuMemFreeHost(h->staging[i]);
            break;
        }
        h->staging_n = i + 1;
    }
    if (h->staging_n == 0)
        return atlas_fail_wrap(st, "host: allocating %zu bytes of pinned staging memory",
                               h->staging_size);
    pthread_mutex_lock(&h->q_lock);
    for (int i = 0; i < h->staging_n; i++) h->free_buf[i] = i;
    h->free_head = 0;
    h->free_n = h->staging_n;
    pthread_mutex_unlock(&h->q_lock);
    /* the copiers and readers leave the scheduler a core: a load runs beside serving */
    int threads = atlas_cores_spare(HOST_COPY_THREADS);
    if (threads > 1 && atlas_threadpool_create(threads, &h->copy_pool) != ATLAS_OK)
        h->copy_pool = NULL; /* copies still work, on the calling thread */
    /* loader threads: one a core but the scheduler's, up to HOST_LOADERS_MAX (8 / 12 / 16 of
     * them on the 16-core H200 machine: 27 / 34 / 38 GB/s; bench/RESULTS.md) */
    int loaders = atlas_cores_spare(HOST_LOADERS_MAX);
    for (int i = 0; i < loaders; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, host_loader_main, h) != 0) break;
        pthread_detach(t); /* process-lived, like the host */
        h->loaders++;
    }
    host_mark(&host_times.staging, atlas_now_ms());
    return ATLAS_OK;
}

atlas_status atlas_host_prepare_staging(atlas_host *host) {
    ATLAS_TRY(atlas_host_make_current(host));
    pthread_mutex_lock(&host->staging_lock);
    atlas_status st = host_staging_ensure(host);
    pthread_mutex_unlock(&host->staging_lock);
    return st;
}

/* Uploads synchronously: the caller fills each buffer (its fill may use its own threads). */
static atlas_status host_upload_locked(atlas_host *h, CUdeviceptr dst, size_t bytes,
                                       atlas_host_fill_fn fill, void *user) {
    ATLAS_TRY(host_staging_ensure(h));
    for (size_t off = 0; off < bytes;) {
        size_t n = bytes - off < h->staging_size ? bytes - off : h->staging_size;
        int i;
        atlas_status st = host_buf_take(h, &i);
        if (st == ATLAS_OK) st = host_buf_send(h, i, dst, off, n, fill, user);
        host_buf_give(h, i);
        if (st != ATLAS_OK) return st;
        off += n;
    }
    return ATLAS_OK;
}

atlas_status atlas_host_upload(atlas_host *host, CUdeviceptr dst, size_t bytes,
                               atlas_host_fill_fn fill, void *user) {
    ATLAS_TRY(atlas_host_make_current(host));
    pthread_mutex_lock(&host->staging_lock);
    atlas_status st = host_upload_locked(host, dst, bytes, fill, user);
    pthread_mutex_unlock(&host->staging_lock);
    if (st != ATLAS_OK) return atlas_fail_wrap(st, "host: uploading %zu bytes", bytes);
    return ATLAS_OK;
}

/* Fills piece [off, off + n) of a job in its own pinned memory and queues its copy: nothing
 * is reused before the job's wait, so no buffer is waited for. */
static atlas_status host_via_send(atlas_host *h, host_job *j, size_t off, size_t n) {
    ATLAS_TRY(j->fill(j->via + off, j->base + off, n, j->ctx));
    return ATLAS_CU(cuMemcpyHtoDAsync, j->dst + off, j->via + off, n, h->copy_stream);
}

/* A loader thread: takes the next piece of the first queued upload, a free buffer, fills it
 * and queues its copy, so that every thread reads while the copy engine drains (a fork-join
 * a buffer left threads idle at each join). */
static void *host_loader_main(void *arg) {
    atlas_host *h = arg;
    atlas_thread_background(); /* a load reads beside serving: the scheduler goes first */
    atlas_status cur = atlas_host_make_current(h);
    char why[384];
    snprintf(why, sizeof why, "%s", cur == ATLAS_OK ? "" : atlas_last_error());
    pthread_mutex_lock(&h->q_lock);
    for (;;) {
        while (!h->jobs) pthread_cond_wait(&h->q_job_cv, &h->q_lock);
        host_job *j = h->jobs;
        size_t off = j->next_off, n = j->bytes - off;
        if (n > h->staging_size) n = h->staging_size;
        j->next_off += n;
        if (j->next_off == j->bytes) { /* every piece taken: off the list */
            h->jobs = j->next;
            if (!h->jobs) h->jobs_tail = NULL;
        }
        j->pieces_busy++;
        h->pieces_busy++;
        pthread_mutex_unlock(&h->q_lock);

        atlas_status st = cur;
        int i = -1;
        if (st == ATLAS_OK && j->via) st = host_via_send(h, j, off, n);
        else if (st == ATLAS_OK) st = host_buf_take(h, &i);
        if (st == ATLAS_OK && !j->via) st = host_buf_send(h, i, j->dst, off, n, j->fill, j->ctx);
        if (st != ATLAS_OK && cur == ATLAS_OK) snprintf(why, sizeof why, "%s", atlas_last_error());
        if (i >= 0) host_buf_give(h, i);

        pthread_mutex_lock(&h->q_lock);
        if (st != ATLAS_OK && h->q_err == ATLAS_OK) {
            h->q_err = st;
            snprintf(h->q_msg, sizeof h->q_msg, "uploading bytes %zu..%zu of %zu: %s", off,
                     off + n, j->bytes, why);
        }
        if (--j->pieces_busy == 0 && j->next_off == j->bytes) free(j);
        if (--h->pieces_busy == 0 && !h->jobs) pthread_cond_broadcast(&h->q_idle_cv);
    }
    return NULL;
}

static atlas_status host_queue(atlas_host *host, CUdeviceptr dst, size_t bytes,
                               atlas_host_fill_fn fill, const void *ctx, size_t ctx_bytes,
                               void *via, size_t base) {
    if (bytes == 0) return ATLAS_OK;
    ATLAS_TRY(atlas_host_make_current(host));
    pthread_mutex_lock(&host->staging_lock);
    atlas_status st = host_staging_ensure(host);
    pthread_mutex_unlock(&host->staging_lock);
    if (st == ATLAS_OK && host->loaders == 0 && !via) /* no thread could be started: fill here */
        return atlas_host_upload(host, dst, bytes, fill, (void *)ctx);
    host_job *j = st == ATLAS_OK ? malloc(sizeof *j + ctx_bytes) : NULL;
    if (st == ATLAS_OK && !j) st = atlas_fail(ATLAS_ERR_NOMEM, "host: out of memory");
    if (st != ATLAS_OK) return atlas_fail_wrap(st, "host: queuing an upload of %zu bytes", bytes);
    *j = (host_job){.dst = dst, .bytes = bytes, .fill = fill, .via = via, .base = base};
    memcpy(j->ctx, ctx, ctx_bytes);
    if (via && host->loaders == 0) { /* no loader thread: the caller fills it */
        st = host_via_send(host, j, 0, bytes);
        free(j);
        return st;
    }
    pthread_mutex_lock(&host->q_lock);
    if (host->jobs_tail)
        host->jobs_tail->next = j;
    else
        host->jobs = j;
    host->jobs_tail = j;
    pthread_cond_broadcast(&host->q_job_cv);
    pthread_mutex_unlock(&host->q_lock);
    return ATLAS_OK;
}

atlas_status atlas_host_upload_queue(atlas_host *host, CUdeviceptr dst, size_t bytes,
                                     atlas_host_fill_fn fill, const void *ctx,
                                     size_t ctx_bytes) {
    return host_queue(host, dst, bytes, fill, ctx, ctx_bytes, NULL, 0);
}

atlas_status atlas_host_upload_queue_at(atlas_host *host, CUdeviceptr dst, size_t bytes,
                                        atlas_host_fill_fn fill, const void *ctx,
                                        size_t ctx_bytes, void *pinned, size_t base) {
    return host_queue(host, dst, bytes, fill, ctx, ctx_bytes, pinned, base);
}

typedef struct host_copy {
    const char *src;     /* the whole upload's source */
    char *dst;           /* the staging chunk */
    size_t offset, bytes;/* of the chunk in the upload */
    const atlas_host *host;
} host_copy;

static void host_copy_job(void *ctx, int64_t begin, int64_t end, int thread) {
    if (thread > 0) atlas_thread_background(); /* a worker: cheap to say again */
    const host_copy *c = ctx;
    size_t a = (size_t)begin * HOST_COPY_PIECE, b = (size_t)end * HOST_COPY_PIECE;
    if (b > c->bytes) b = c->bytes;
    memcpy(c->dst + a, c->src + c->offset + a, b - a);
}

/* Runs under staging_lock, so the pool has one job at a time. */
static atlas_status host_fill_memcpy(void *dst, size_t offset, size_t bytes, void *user) {
    host_copy *c = user;
    c->dst = dst;
    c->offset = offset;
    c->bytes = bytes;
    int64_t pieces = (int64_t)((bytes + HOST_COPY_PIECE - 1) / HOST_COPY_PIECE);
    if (c->host->copy_pool && pieces > 1)
        atlas_threadpool_for(c->host->copy_pool, pieces, 1, host_copy_job, c);
    else
        memcpy(dst, c->src + offset, bytes);
    return ATLAS_OK;
}

atlas_status atlas_host_upload_copy(atlas_host *host, CUdeviceptr dst, const void *src,
                                    size_t bytes) {
    host_copy c = {.src = src, .host = host};
    return atlas_host_upload(host, dst, bytes, host_fill_memcpy, &c);
}

atlas_status atlas_host_upload_wait(atlas_host *host) {
    ATLAS_TRY(atlas_host_make_current(host));
    pthread_mutex_lock(&host->q_lock);
    while (host->jobs || host->pieces_busy) pthread_cond_wait(&host->q_idle_cv, &host->q_lock);
    atlas_status st = host->q_err;
    char msg[sizeof host->q_msg];
    snprintf(msg, sizeof msg, "%s", host->q_msg);
    host->q_err = ATLAS_OK;
    host->q_msg[0] = '\0';
    pthread_mutex_unlock(&host->q_lock);
    atlas_status sync = ATLAS_CU(cuStreamSynchronize, host->copy_stream);
    if (st != ATLAS_OK) return atlas_fail(st, "host: %s", msg);
    return sync;
}

size_t atlas_host_staging_bytes(const atlas_host *host) {
    return (size_t)host->staging_n * host->staging_size;
}

/* ---- work for a quiet device ------------------------------------------------------------- */

typedef struct quiet_call {
    struct quiet_call *next;
    atlas_host_quiet_fn fn;
    void *arg;
    int state; /* 0 waiting, 1 taken by the serving thread, 2 done */
    atlas_status st;
    char msg[512];
} quiet_call;

/* How long a caller waits for a quiet point before it runs its work itself: a serving
 * thread offers one after each step, so this is a bound for a stuck one, not a wait. */
#define QUIET_WAIT_MS 2000

static void quiet_unlink(atlas_host *h, quiet_call *c) {
    for (quiet_call **p = &h->quiet; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            return;
        }
}

atlas_status atlas_host_quiet_call(atlas_host *h, atlas_host_quiet_fn fn, void *arg) {
    pthread_mutex_lock(&h->quiet_lock);
    if (!h->serving || pthread_equal(h->server, pthread_self())) {
        pthread_mutex_unlock(&h->quiet_lock);
        return fn(arg);
    }
    quiet_call c = {.fn = fn, .arg = arg};
    quiet_call **tail = &h->quiet;
    while (*tail) tail = &(*tail)->next;
    *tail = &c;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += QUIET_WAIT_MS / 1000;
    while (c.state != 2) {
        if (c.state == 0 && !h->serving) break; /* serving ended: no quiet point will come */
        if (pthread_cond_timedwait(&h->quiet_cv, &h->quiet_lock, &until) != 0 && c.state == 0)
            break;
    }
    if (c.state == 0) { /* run here after all */
        quiet_unlink(h, &c);
        pthread_mutex_unlock(&h->quiet_lock);
        return fn(arg);
    }
    pthread_mutex_unlock(&h->quiet_lock);
    if (c.st != ATLAS_OK) return atlas_fail(c.st, "%s", c.msg); /* its message, on this thread */
    return ATLAS_OK;
}

void atlas_host_serving(atlas_host *h, bool serving) {
    pthread_mutex_lock(&h->quiet_lock);
    /* one serving thread at a time: another's word waits until the first one sleeps */
    if (!h->serving || pthread_equal(h->server, pthread_self())) {
        h->serving = serving;
        h->server = pthread_self();
        if (!serving) pthread_cond_broadcast(&h->quiet_cv); /* waiters run their work */
    }
    pthread_mutex_unlock(&h->quiet_lock);
}

bool atlas_host_quiet_wanted(atlas_host *h) {
    pthread_mutex_lock(&h->quiet_lock);
    bool wanted = h->quiet != NULL;
    pthread_mutex_unlock(&h->quiet_lock);
    return wanted;
}

void atlas_host_quiet_point(atlas_host *h) {
    pthread_mutex_lock(&h->quiet_lock);
    while (h->quiet) {
        quiet_call *c = h->quiet;
        h->quiet = c->next;
        c->state = 1;
        pthread_mutex_unlock(&h->quiet_lock);
        atlas_status st = c->fn(c->arg);
        pthread_mutex_lock(&h->quiet_lock);
        c->st = st;
        if (st != ATLAS_OK) snprintf(c->msg, sizeof c->msg, "%s", atlas_last_error());
        atlas_error_clear(); /* the caller's failure, not this thread's */
        c->state = 2;
        pthread_cond_broadcast(&h->quiet_cv);
    }
    pthread_mutex_unlock(&h->quiet_lock);
}

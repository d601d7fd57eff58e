/* backend/cuda/host.c — the process host: binds one GPU, retains its primary context once,
 * owns the streams and the pinned staging pool.  Never destroyed (DESIGN.md, "The two
 * lifetimes"): re-creating a context is what in-process swapping exists to avoid.
 *
 * Globals (docs/ARCHITECTURE.md, "Globals"): the host itself, whether it is bound, the last
 * reason it could not be, all under host_lock; and per thread, the context made current. */
#include "backend/cuda/host.h"

#include <pthread.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/threadpool.h"

/* atlas_host_upload_copy splits each staging chunk into pieces copied by this many threads:
 * one thread's memcpy (~6 GB/s measured on the H200 machine) is far below the copy engine. */
#define HOST_COPY_THREADS 8
#define HOST_COPY_PIECE ((size_t)2 << 20)

struct atlas_host {
    atlas_host_props props;
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;      /* kernels */
    CUstream copy_stream; /* weight uploads */
    int ctx_retains;

    /* pinned staging pool, under staging_lock; allocated on the first upload */
    pthread_mutex_t staging_lock;
    int staging_count;             /* buffers wanted */
    size_t staging_size;           /* bytes each */
    int staging_n;                 /* buffers allocated (0: not yet) */
    void *staging[ATLAS_HOST_STAGING_COUNT];
    CUevent staging_done[ATLAS_HOST_STAGING_COUNT]; /* recorded after the last copy from it */
    int staging_cur;               /* buffer being filled */
    size_t staging_used;           /* bytes of it already queued */
    atlas_threadpool *copy_pool;   /* for atlas_host_upload_copy; NULL: the caller copies */
};

static pthread_mutex_t host_lock = PTHREAD_MUTEX_INITIALIZER;
static atlas_host host_global = {.staging_lock = PTHREAD_MUTEX_INITIALIZER};
static int host_bound;
static char host_reason[512];
static _Thread_local CUcontext thread_ctx;

static double host_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
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
    ATLAS_CU_TRY(cuDeviceTotalMem, &p->total_mem, h->dev);
    p->driver_version = atlas_driver_version();
    return ATLAS_OK;
}

/* Undoes a partial host_init so that a later call can try again. */
static void host_undo(atlas_host *h) {
    const atlas_driver *d = atlas_driver_get();
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
    double t0 = host_now_ms();
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
    atlas_status st = ATLAS_CU(cuCtxSetCurrent, h->ctx);
    if (st == ATLAS_OK) thread_ctx = h->ctx;
    if (st == ATLAS_OK) st = ATLAS_CU(cuStreamCreate, &h->stream, ATLAS_CU_STREAM_NON_BLOCKING);
    if (st == ATLAS_OK)
        st = ATLAS_CU(cuStreamCreate, &h->copy_stream, ATLAS_CU_STREAM_NON_BLOCKING);
    if (st != ATLAS_OK) {
        host_undo(h);
        return st;
    }
    h->staging_count = ATLAS_HOST_STAGING_COUNT;
    h->staging_size = ATLAS_HOST_STAGING_BYTES;
    const char *e = getenv("ATLAS_HOST_STAGING_MB"); /* each buffer's size, for measuring */
    if (e && atoi(e) >= 8 && atoi(e) <= 1024) h->staging_size = (size_t)atoi(e) << 20;
    h->props.init_ms = host_now_ms() - t0;
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
    return ATLAS_CU(cuMemGetInfo, free_bytes, total_bytes);
}

CUcontext atlas_host_context(const atlas_host *host) { return host->ctx; }
CUdevice atlas_host_device(const atlas_host *host) { return host->dev; }
CUstream atlas_host_stream(const atlas_host *host) { return host->stream; }
CUstream atlas_host_copy_stream(const atlas_host *host) { return host->copy_stream; }
int atlas_host_context_retains(const atlas_host *host) { return host->ctx_retains; }

/* --- staging pool ------------------------------------------------------------------------ */

atlas_status atlas_host_set_staging(atlas_host *host, int count, size_t bytes) {
    if (count < 1 || count > ATLAS_HOST_STAGING_COUNT || bytes < 4096)
        return atlas_fail(ATLAS_ERR_INVALID, "host: staging pool of %d x %zu bytes: want 1..%d "
                          "buffers of at least 4096 bytes", count, bytes, ATLAS_HOST_STAGING_COUNT);
    pthread_mutex_lock(&host->staging_lock);
    atlas_status st = ATLAS_OK;
    if (host->staging_n)
        st = atlas_fail(ATLAS_ERR_BUSY, "host: the staging pool is already allocated");
    else
        host->staging_count = count, host->staging_size = bytes;
    pthread_mutex_unlock(&host->staging_lock);
    return st;
}

/* Allocates the pool on first use.  Pinned memory can be scarce (GB10, containers): keep as
 * many buffers as could be had, fail only if none. */
static atlas_status host_staging_ensure(atlas_host *h) {
    if (h->staging_n) return ATLAS_OK;
    atlas_status st = ATLAS_OK;
    for (int i = 0; i < h->staging_count; i++) {
        st = ATLAS_CU(cuMemHostAlloc, &h->staging[i], h->staging_size,
                      ATLAS_CU_MEMHOSTALLOC_PORTABLE);
        if (st != ATLAS_OK) break;
        st = ATLAS_CU(cuEventCreate, &h->staging_done[i], ATLAS_CU_EVENT_DISABLE_TIMING);
        if (st != ATLAS_OK) {
            atlas_driver_get()->cuMemFreeHost(h->staging[i]);
            break;
        }
        h->staging_n = i + 1;
    }
    if (h->staging_n == 0)
        return atlas_fail_wrap(st, "host: allocating %zu bytes of pinned staging memory",
                               h->staging_size);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = cores > HOST_COPY_THREADS ? HOST_COPY_THREADS : (int)(cores > 1 ? cores : 1);
    if (threads > 1 && atlas_threadpool_create(threads, &h->copy_pool) != ATLAS_OK)
        h->copy_pool = NULL; /* copies still work, on the calling thread */
    h->staging_cur = 0;
    h->staging_used = 0;
    return ATLAS_OK;
}

/* Queues one upload, packing small ones into the current buffer. */
static atlas_status host_upload_locked(atlas_host *h, CUdeviceptr dst, size_t bytes,
                                       atlas_host_fill_fn fill, void *user) {
    ATLAS_TRY(host_staging_ensure(h));
    for (size_t off = 0; off < bytes;) {
        if (h->staging_used >= h->staging_size) {
            /* next buffer: wait until the copies out of it are done */
            h->staging_cur = (h->staging_cur + 1) % h->staging_n;
            h->staging_used = 0;
            ATLAS_CU_TRY(cuEventSynchronize, h->staging_done[h->staging_cur]);
        }
        int i = h->staging_cur;
        size_t n = h->staging_size - h->staging_used;
        if (n > bytes - off) n = bytes - off;
        char *buf = (char *)h->staging[i] + h->staging_used;
        fill(buf, off, n, user);
        ATLAS_CU_TRY(cuMemcpyHtoDAsync, dst + off, buf, n, h->copy_stream);
        ATLAS_CU_TRY(cuEventRecord, h->staging_done[i], h->copy_stream);
        h->staging_used += (n + 255) & ~(size_t)255; /* keep chunks 256-byte aligned */
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

typedef struct host_copy {
    const char *src;     /* the whole upload's source */
    char *dst;           /* the staging chunk */
    size_t offset, bytes;/* of the chunk in the upload */
    const atlas_host *host;
} host_copy;

static void host_copy_job(void *ctx, int64_t begin, int64_t end, int thread) {
    const host_copy *c = ctx;
    size_t a = (size_t)begin * HOST_COPY_PIECE, b = (size_t)end * HOST_COPY_PIECE;
    if (b > c->bytes) b = c->bytes;
    memcpy(c->dst + a, c->src + c->offset + a, b - a);
}

/* Runs under staging_lock, so the pool has one job at a time. */
static void host_fill_memcpy(void *dst, size_t offset, size_t bytes, void *user) {
    host_copy *c = user;
    c->dst = dst;
    c->offset = offset;
    c->bytes = bytes;
    int64_t pieces = (int64_t)((bytes + HOST_COPY_PIECE - 1) / HOST_COPY_PIECE);
    if (c->host->copy_pool && pieces > 1)
        atlas_threadpool_for(c->host->copy_pool, pieces, 1, host_copy_job, c);
    else
        memcpy(dst, c->src + offset, bytes);
}

atlas_status atlas_host_upload_copy(atlas_host *host, CUdeviceptr dst, const void *src,
                                    size_t bytes) {
    host_copy c = {.src = src, .host = host};
    return atlas_host_upload(host, dst, bytes, host_fill_memcpy, &c);
}

atlas_status atlas_host_upload_wait(atlas_host *host) {
    ATLAS_TRY(atlas_host_make_current(host));
    return ATLAS_CU(cuStreamSynchronize, host->copy_stream);
}

size_t atlas_host_staging_bytes(const atlas_host *host) {
    return (size_t)host->staging_n * host->staging_size;
}

/* tests/fake_cuda.c — the fake CUDA driver of tests/fake_cuda.h. */
#include "fake_cuda.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { FK_MAX_ARMED = 4 };

/* What the fake made: device allocations, pinned buffers and modules, in one list. */
typedef enum { FK_DEVICE, FK_HOST, FK_MODULE } fk_kind;
typedef struct fk_obj {
    uintptr_t p;
    size_t bytes;
    fk_kind kind;
    int failed; /* a free of it failed: fake_cuda_free_failed frees it */
} fk_obj;

/* A module: "FAKEMOD:a,b" lists its kernels as ",a,b,"; a fatbin has every kernel. */
typedef struct fk_module {
    int all;
    char names[256];
    char fn_tags[8]; /* CUfunction handles point into this */
} fk_module;

static struct {
    pthread_mutex_t mu;
    int device_count;
    fk_obj *objs;
    int n_objs, cap_objs;
    fake_cuda_stats st;
    long calls[FAKE_CU_CALLS], failed[FAKE_CU_CALLS];
    long fail_at[FAKE_CU_CALLS][FK_MAX_ARMED];      /* 1-based call numbers; 0: none */
    uintptr_t fail_on[FAKE_CU_CALLS][FK_MAX_ARMED]; /* handles; 0: none */
    long events;
    int streams;
    int no_pools;                 /* fake_cuda_set_pools(0) */
    long seq;                     /* orders frees and waits (fake_cuda_stats) */
    CUstream recorded_on[1024];   /* the stream each event was last recorded on */
} fk = {.mu = PTHREAD_MUTEX_INITIALIZER, .device_count = 1,
        .st = {.pool_threshold = -1, .pool_internal_deps = -1}};

static _Thread_local CUcontext fk_current;
static char fk_ctx, fk_stream[2], fk_graph, fk_graph_exec, fk_pool;

/* Counts a call of c (on handle h, 0 for none); 1 when the test picked it to fail. */
static int fk_fails_locked(fake_cuda_call c, uintptr_t h) {
    long n = ++fk.calls[c];
    int fail = 0;
    for (int k = 0; k < FK_MAX_ARMED; k++) {
        if (fk.fail_at[c][k] == n) fail = 1, fk.fail_at[c][k] = 0;
        if (h && fk.fail_on[c][k] == h) fail = 1;
    }
    fk.failed[c] += fail;
    return fail;
}

static int fk_fails(fake_cuda_call c, uintptr_t h) {
    pthread_mutex_lock(&fk.mu);
    int fail = fk_fails_locked(c, h);
    pthread_mutex_unlock(&fk.mu);
    return fail;
}

static int fk_add_locked(uintptr_t p, size_t bytes, fk_kind kind) {
    if (fk.n_objs == fk.cap_objs) {
        int cap = fk.cap_objs ? 2 * fk.cap_objs : 256;
        fk_obj *o = realloc(fk.objs, (size_t)cap * sizeof *o);
        if (!o) return 0;
        fk.objs = o, fk.cap_objs = cap;
    }
    fk.objs[fk.n_objs++] = (fk_obj){p, bytes, kind, 0};
    return 1;
}

static fk_obj *fk_find_locked(uintptr_t p, fk_kind kind) {
    for (int i = 0; i < fk.n_objs; i++)
        if (fk.objs[i].p == p && fk.objs[i].kind == kind) return &fk.objs[i];
    return NULL;
}

/* Drops o from the list and from the live counts; the caller frees the memory. */
static void fk_drop_locked(fk_obj *o) {
    if (o->kind == FK_DEVICE) fk.st.live_allocs--, fk.st.live_bytes -= o->bytes;
    if (o->kind == FK_HOST) fk.st.live_hosts--;
    if (o->kind == FK_MODULE) fk.st.live_modules--, fk.st.modules_unloaded++;
    *o = fk.objs[--fk.n_objs];
}

/* A free of p: fails when picked (p stays live), CUDA_ERROR_INVALID_VALUE when p is not
 * live, else p is freed. */
static CUresult fk_free(fake_cuda_call c, uintptr_t p, fk_kind kind) {
    pthread_mutex_lock(&fk.mu);
    fk_obj *o = fk_find_locked(p, kind);
    CUresult r = 0;
    if (fk_fails_locked(c, p)) {
        if (o) o->failed = 1;
        r = FAKE_CUDA_ILLEGAL_ADDRESS;
    } else if (!o) {
        r = 1;
    } else {
        fk_drop_locked(o);
    }
    pthread_mutex_unlock(&fk.mu);
    if (!r) free((void *)p);
    return r;
}

/* --- init, errors, devices, contexts ----------------------------------------------------- */

static CUresult f_init(unsigned int flags) { (void)flags; return 0; }
static CUresult f_version(int *v) { *v = 13000; return 0; }
static CUresult f_err_name(CUresult e, const char **name) {
    switch (e) {
    case 0: *name = "CUDA_SUCCESS"; return 0;
    case 1: *name = "CUDA_ERROR_INVALID_VALUE"; return 0;
    case 2: *name = "CUDA_ERROR_OUT_OF_MEMORY"; return 0;
    case 200: *name = "CUDA_ERROR_INVALID_IMAGE"; return 0;
    case 500: *name = "CUDA_ERROR_NOT_FOUND"; return 0;
    case 700: *name = "CUDA_ERROR_ILLEGAL_ADDRESS"; return 0;
    case 719: *name = "CUDA_ERROR_LAUNCH_FAILED"; return 0;
    }
    *name = NULL;
    return 1;
}
static CUresult f_err_string(CUresult e, const char **text) {
    *text = e == 2 ? "out of memory" : "fake error";
    return 0;
}
static CUresult f_dev_get(CUdevice *d, int ordinal) { *d = ordinal; return 0; }
static CUresult f_dev_count(int *n) {
    pthread_mutex_lock(&fk.mu);
    *n = fk.device_count;
    pthread_mutex_unlock(&fk.mu);
    return 0;
}
static CUresult f_dev_name(char *name, int len, CUdevice d) {
    snprintf(name, (size_t)len, "Fake GPU %d", d);
    return 0;
}
/* fake_cuda_set_unified: the device reports itself integrated, reading host memory through
 * the host's page tables (GB10) */
static int fk_unified;
static CUresult f_dev_attr(int *v, CUdevice_attribute a, CUdevice d) {
    (void)d;
    switch (a) {
    case ATLAS_CU_ATTR_INTEGRATED: *v = fk_unified; break;
    case ATLAS_CU_ATTR_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES: *v = fk_unified; break;
    case ATLAS_CU_ATTR_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
    case ATLAS_CU_ATTR_MULTIPROCESSOR_COUNT: *v = 132; break;
    case ATLAS_CU_ATTR_L2_CACHE_SIZE: *v = 50 << 20; break;
    case ATLAS_CU_ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = 232448; break;
    case ATLAS_CU_ATTR_MEMORY_POOLS_SUPPORTED: *v = !fk.no_pools; break;
    default: *v = 0;
    }
    return 0;
}
static CUresult f_total_mem(size_t *b, CUdevice d) {
    (void)d;
    *b = FAKE_CUDA_TOTAL_MEM;
    return 0;
}
static CUresult f_retain(CUcontext *c, CUdevice d) {
    (void)d;
    pthread_mutex_lock(&fk.mu);
    int fail = fk_fails_locked(FAKE_CU_RETAIN, 0);
    fk.st.retains += !fail;
    pthread_mutex_unlock(&fk.mu);
    if (fail) return FAKE_CUDA_OUT_OF_MEMORY;
    *c = (CUcontext)&fk_ctx;
    return 0;
}
static CUresult f_release(CUdevice d) {
    (void)d;
    pthread_mutex_lock(&fk.mu);
    fk.st.releases++;
    pthread_mutex_unlock(&fk.mu);
    return 0;
}
static CUresult f_set_current(CUcontext c) { fk_current = c; return 0; }
static CUresult f_get_current(CUcontext *c) { *c = fk_current; return 0; }
static CUresult f_sync(void) {
    return fk_fails(FAKE_CU_SYNC, 0) ? FAKE_CUDA_ILLEGAL_ADDRESS : 0;
}

/* --- streams and events ------------------------------------------------------------------- */

static CUresult f_stream_create(CUstream *s, unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&fk.mu);
    *s = (CUstream)&fk_stream[fk.streams++ % 2];
    pthread_mutex_unlock(&fk.mu);
    return 0;
}
static CUresult f_stream(CUstream s) { (void)s; return 0; }
/* An event's slot in recorded_on: fake events are 0x1000 + 16 * n. */
static size_t fk_event_slot(CUevent e) {
    return ((uintptr_t)e - 0x1000) / 16 % (sizeof fk.recorded_on / sizeof fk.recorded_on[0]);
}
static CUresult f_stream_wait(CUstream s, CUevent e, unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&fk.mu);
    fk.st.last_wait_seq = ++fk.seq;
    fk.st.last_wait_stream = s;
    fk.st.last_wait_after = fk.recorded_on[fk_event_slot(e)];
    pthread_mutex_unlock(&fk.mu);
    return 0;
}
static CUresult f_event_create(CUevent *e, unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&fk.mu);
    *e = (CUevent)(uintptr_t)(0x1000 + 16 * ++fk.events); /* never dereferenced */
    pthread_mutex_unlock(&fk.mu);
    return 0;
}
static CUresult f_event_record(CUevent e, CUstream s) {
    pthread_mutex_lock(&fk.mu);
    fk.recorded_on[fk_event_slot(e)] = s;
    pthread_mutex_unlock(&fk.mu);
    return 0;
}
static CUresult f_event(CUevent e) { (void)e; return 0; }
static CUresult f_event_destroy(CUevent e) {
    return fk_fails(FAKE_CU_EVENT_DESTROY, (uintptr_t)e) ? FAKE_CUDA_ILLEGAL_ADDRESS : 0;
}

/* --- memory ------------------------------------------------------------------------------- */

static CUresult f_alloc(CUdeviceptr *p, size_t bytes) {
    if (fk_fails(FAKE_CU_ALLOC, 0)) return FAKE_CUDA_OUT_OF_MEMORY;
    void *q = NULL;
    if (posix_memalign(&q, 256, bytes ? bytes : 1)) return FAKE_CUDA_OUT_OF_MEMORY;
    pthread_mutex_lock(&fk.mu);
    int ok = fk_add_locked((uintptr_t)q, bytes, FK_DEVICE);
    if (ok) fk.st.live_allocs++, fk.st.live_bytes += bytes;
    pthread_mutex_unlock(&fk.mu);
    if (!ok) {
        free(q);
        return FAKE_CUDA_OUT_OF_MEMORY;
    }
    *p = (CUdeviceptr)(uintptr_t)q;
    return 0;
}
static CUresult f_free(CUdeviceptr p) { return fk_free(FAKE_CU_FREE, (uintptr_t)p, FK_DEVICE); }

/* --- memory pools: one pool; every stream is idle, so an ordered free is done at once ------ */

static CUresult f_pool_create(CUmemoryPool *pool, const ATLAS_CUMEMPOOLPROPS *props) {
    if (props->allocType != ATLAS_CU_MEM_ALLOCATION_TYPE_PINNED ||
        props->location.type != ATLAS_CU_MEM_LOCATION_TYPE_DEVICE || props->location.id < 0 ||
        props->location.id >= fk.device_count)
        return 1;
    pthread_mutex_lock(&fk.mu);
    fk.st.live_pools++;
    pthread_mutex_unlock(&fk.mu);
    *pool = (CUmemoryPool)&fk_pool;
    return 0;
}
static CUresult f_pool_destroy(CUmemoryPool pool) {
    if (pool != (CUmemoryPool)&fk_pool) return 1;
    pthread_mutex_lock(&fk.mu);
    fk.st.live_pools--;
    pthread_mutex_unlock(&fk.mu);
    return 0;
}
static CUresult f_pool_set(CUmemoryPool pool, CUmemPool_attribute a, void *v) {
    if (pool != (CUmemoryPool)&fk_pool) return 1;
    pthread_mutex_lock(&fk.mu);
    if (a == ATLAS_CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
        fk.st.pool_threshold = (long long)*(unsigned long long *)v;
    if (a == ATLAS_CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES)
        fk.st.pool_internal_deps = *(int *)v;
    pthread_mutex_unlock(&fk.mu);
    return 0;
}
static CUresult f_pool_get(CUmemoryPool pool, CUmemPool_attribute a, void *v) {
    if (pool != (CUmemoryPool)&fk_pool) return 1;
    pthread_mutex_lock(&fk.mu);
    if (a == ATLAS_CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
        *(unsigned long long *)v = fk.st.live_bytes;
    pthread_mutex_unlock(&fk.mu);
    return 0;
}
static CUresult f_pool_trim(CUmemoryPool pool, size_t keep) {
    (void)keep;
    if (pool != (CUmemoryPool)&fk_pool) return 1;
    pthread_mutex_lock(&fk.mu);
    fk.st.pool_trims++;
    pthread_mutex_unlock(&fk.mu);
    return 0;
}
static CUresult f_alloc_async(CUdeviceptr *p, size_t bytes, CUmemoryPool pool, CUstream s) {
    if (pool != (CUmemoryPool)&fk_pool || !s) return 1;
    CUresult r = f_alloc(p, bytes);
    pthread_mutex_lock(&fk.mu);
    fk.st.pool_allocs += r == 0;
    fk.st.last_alloc_stream = s;
    pthread_mutex_unlock(&fk.mu);
    return r;
}
static CUresult f_free_async(CUdeviceptr p, CUstream s) {
    if (!s) return 1;
    CUresult r = fk_free(FAKE_CU_FREE, (uintptr_t)p, FK_DEVICE);
    pthread_mutex_lock(&fk.mu);
    fk.st.last_free_seq = ++fk.seq;
    if (!fk.st.first_free_seq) fk.st.first_free_seq = fk.st.last_free_seq;
    fk.st.last_free_stream = s;
    fk.st.pool_frees += r == 0;
    pthread_mutex_unlock(&fk.mu);
    return r;
}
static CUresult f_mem_info(size_t *free_b, size_t *total) {
    pthread_mutex_lock(&fk.mu);
    *free_b = FAKE_CUDA_TOTAL_MEM - fk.st.live_bytes;
    pthread_mutex_unlock(&fk.mu);
    *total = FAKE_CUDA_TOTAL_MEM;
    return 0;
}
static CUresult f_host_alloc(void **p, size_t bytes, unsigned int flags) {
    (void)flags;
    if (fk_fails(FAKE_CU_HOST_ALLOC, 0)) return FAKE_CUDA_OUT_OF_MEMORY;
    *p = malloc(bytes ? bytes : 1);
    if (!*p) return FAKE_CUDA_OUT_OF_MEMORY;
    pthread_mutex_lock(&fk.mu);
    int ok = fk_add_locked((uintptr_t)*p, bytes, FK_HOST);
    fk.st.live_hosts += ok;
    pthread_mutex_unlock(&fk.mu);
    if (!ok) {
        free(*p);
        return FAKE_CUDA_OUT_OF_MEMORY;
    }
    return 0;
}
static CUresult f_free_host(void *p) { return fk_free(FAKE_CU_FREE_HOST, (uintptr_t)p, FK_HOST); }
static CUresult f_host_dptr(CUdeviceptr *d, void *p, unsigned int flags) {
    (void)flags;
    *d = (CUdeviceptr)(uintptr_t)p;
    return 0;
}
static CUresult f_htod(CUdeviceptr dst, const void *src, size_t n) {
    memcpy((void *)(uintptr_t)dst, src, n);
    return 0;
}
/* A copy not out of a pinned buffer is the real driver's slow path: counted. */
static CUresult f_htod_async(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    (void)s;
    uintptr_t a = (uintptr_t)src, b = a + n;
    pthread_mutex_lock(&fk.mu);
    int fail = fk_fails_locked(FAKE_CU_HTOD_ASYNC, 0), pinned = 0;
    for (int i = 0; i < fk.n_objs; i++) {
        const fk_obj *o = &fk.objs[i];
        pinned |= o->kind == FK_HOST && o->p <= a && b <= o->p + o->bytes;
    }
    fk.st.bad_copies += !fail && !pinned;
    pthread_mutex_unlock(&fk.mu);
    if (fail) return FAKE_CUDA_ILLEGAL_ADDRESS;
    return f_htod(dst, src, n);
}
static CUresult f_dtoh(void *dst, CUdeviceptr src, size_t n) {
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return 0;
}
/* Device to device: both are host memory here. */
static CUresult f_dtod_async(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    (void)s;
    memmove((void *)dst, (const void *)src, n);
    return 0;
}
/* Likewise a copy not into a pinned buffer. */
static CUresult f_dtoh_async(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    (void)s;
    uintptr_t a = (uintptr_t)dst, b = a + n;
    pthread_mutex_lock(&fk.mu);
    int pinned = 0;
    for (int i = 0; i < fk.n_objs; i++) {
        const fk_obj *o = &fk.objs[i];
        pinned |= o->kind == FK_HOST && o->p <= a && b <= o->p + o->bytes;
    }
    fk.st.bad_copies += !pinned;
    pthread_mutex_unlock(&fk.mu);
    return f_dtoh(dst, src, n);
}
static CUresult f_memset8(CUdeviceptr dst, unsigned char v, size_t n) {
    memset((void *)(uintptr_t)dst, v, n);
    return 0;
}
static CUresult f_memset8_async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) {
    (void)s;
    return f_memset8(dst, v, n);
}
static CUresult f_memset32_async(CUdeviceptr dst, unsigned int v, size_t n, CUstream s) {
    (void)s;
    for (size_t i = 0; i < n; i++) ((unsigned int *)(uintptr_t)dst)[i] = v;
    return 0;
}

/* --- modules and kernels: nothing runs ---------------------------------------------------- */

/* 1 when image starts with a fatbin's magic; compared a byte at a time, so that a short
 * text image is not read past its end. */
static int fk_is_fatbin(const unsigned char *image) {
    static const unsigned char magic[4] = {0x50, 0xed, 0x55, 0xba};
    for (int i = 0; i < 4; i++)
        if (image[i] != magic[i]) return 0;
    return 1;
}

static CUresult f_module_load(CUmodule *m, const void *image) {
    const char *s = image;
    int all = fk_is_fatbin(image);
    if (!all && strncmp(s, "FAKEMOD:", 8) != 0) return 200;
    fk_module *fm = calloc(1, sizeof *fm);
    if (!fm) return FAKE_CUDA_OUT_OF_MEMORY;
    fm->all = all;
    if (!all) snprintf(fm->names, sizeof fm->names, ",%s,", s + 8);
    pthread_mutex_lock(&fk.mu);
    int ok = fk_add_locked((uintptr_t)fm, sizeof *fm, FK_MODULE);
    if (ok) {
        fk.st.live_modules++, fk.st.modules_loaded++, fk.st.last_module = (CUmodule)fm;
        fk.st.last_module_thread = pthread_self();
    }
    pthread_mutex_unlock(&fk.mu);
    if (!ok) {
        free(fm);
        return FAKE_CUDA_OUT_OF_MEMORY;
    }
    *m = (CUmodule)fm;
    return 0;
}
static CUresult f_module_unload(CUmodule m) {
    return fk_free(FAKE_CU_MODULE_UNLOAD, (uintptr_t)m, FK_MODULE);
}
static CUresult f_get_function(CUfunction *fn, CUmodule m, const char *name) {
    fk_module *fm = (fk_module *)m;
    fk_fails(FAKE_CU_GET_FUNCTION, 0);
    if (fm->all) {
        *fn = (CUfunction)&fm->fn_tags[0];
        return 0;
    }
    char key[128];
    snprintf(key, sizeof key, ",%s,", name);
    const char *at = strstr(fm->names, key);
    if (!at) return 500;
    *fn = (CUfunction)&fm->fn_tags[(at - fm->names) % 8];
    return 0;
}
static CUresult f_func_set(CUfunction fn, CUfunction_attribute a, int v) {
    (void)fn, (void)a, (void)v;
    return 0;
}
static CUresult f_func_get(int *v, CUfunction_attribute a, CUfunction fn) {
    (void)a, (void)fn;
    *v = 0;
    return 0;
}
static CUresult f_occupancy(int *blocks, CUfunction fn, int bs, size_t smem) {
    (void)fn, (void)bs, (void)smem;
    *blocks = 2;
    return 0;
}
static CUresult f_launch(CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                         unsigned by, unsigned bz, unsigned smem, CUstream s, void **params,
                         void **extra) {
    (void)fn, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)smem, (void)s;
    (void)params, (void)extra;
    pthread_mutex_lock(&fk.mu);
    fk.st.launches++;
    pthread_mutex_unlock(&fk.mu);
    return 0;
}
static CUresult f_begin_capture(CUstream s, CUstreamCaptureMode mode) {
    (void)s, (void)mode;
    return 0;
}
static CUresult f_end_capture(CUstream s, CUgraph *g) {
    (void)s;
    *g = (CUgraph)&fk_graph;
    return 0;
}
static CUresult f_is_capturing(CUstream s, CUstreamCaptureStatus *st) {
    (void)s;
    *st = (CUstreamCaptureStatus)0;
    return 0;
}
static CUresult f_instantiate(CUgraphExec *e, CUgraph g, unsigned long long flags) {
    (void)g, (void)flags;
    *e = (CUgraphExec)&fk_graph_exec;
    return 0;
}
static CUresult f_graph_launch(CUgraphExec e, CUstream s) { (void)e, (void)s; return 0; }
static CUresult f_graph_exec_destroy(CUgraphExec e) { (void)e; return 0; }
static CUresult f_graph_destroy(CUgraph g) { (void)g; return 0; }

/* --- the table and the test's controls ---------------------------------------------------- */

atlas_driver fake_cuda_table(void) {
    atlas_driver d;
    memset(&d, 0, sizeof d);
    d.cuInit = f_init;
    d.cuDriverGetVersion = f_version;
    d.cuGetErrorName = f_err_name;
    d.cuGetErrorString = f_err_string;
    d.cuDeviceGet = f_dev_get;
    d.cuDeviceGetCount = f_dev_count;
    d.cuDeviceGetName = f_dev_name;
    d.cuDeviceGetAttribute = f_dev_attr;
    d.cuDeviceTotalMem = f_total_mem;
    d.cuDevicePrimaryCtxRetain = f_retain;
    d.cuDevicePrimaryCtxRelease = f_release;
    d.cuCtxSetCurrent = f_set_current;
    d.cuCtxGetCurrent = f_get_current;
    d.cuCtxSynchronize = f_sync;
    d.cuStreamCreate = f_stream_create;
    d.cuStreamDestroy = f_stream;
    d.cuStreamSynchronize = f_stream;
    d.cuStreamWaitEvent = f_stream_wait;
    d.cuEventCreate = f_event_create;
    d.cuEventRecord = f_event_record;
    d.cuEventSynchronize = f_event;
    d.cuEventQuery = f_event;
    d.cuEventDestroy = f_event_destroy;
    d.cuMemAlloc = f_alloc;
    d.cuMemFree = f_free;
    d.cuMemGetInfo = f_mem_info;
    d.cuMemcpyHtoD = f_htod;
    d.cuMemcpyHtoDAsync = f_htod_async;
    d.cuMemcpyDtoH = f_dtoh;
    d.cuMemcpyDtoHAsync = f_dtoh_async;
    d.cuMemcpyDtoDAsync = f_dtod_async;
    d.cuMemsetD8 = f_memset8;
    d.cuMemsetD8Async = f_memset8_async;
    d.cuMemsetD32Async = f_memset32_async;
    d.cuMemPoolCreate = f_pool_create;
    d.cuMemPoolDestroy = f_pool_destroy;
    d.cuMemPoolSetAttribute = f_pool_set;
    d.cuMemPoolGetAttribute = f_pool_get;
    d.cuMemPoolTrimTo = f_pool_trim;
    d.cuMemAllocFromPoolAsync = f_alloc_async;
    d.cuMemFreeAsync = f_free_async;
    d.cuMemHostAlloc = f_host_alloc;
    d.cuMemFreeHost = f_free_host;
    d.cuMemHostGetDevicePointer = f_host_dptr;
    d.cuModuleLoadData = f_module_load;
    d.cuModuleUnload = f_module_unload;
    d.cuModuleGetFunction = f_get_function;
    d.cuFuncSetAttribute = f_func_set;
    d.cuFuncGetAttribute = f_func_get;
    d.cuOccupancyMaxActiveBlocksPerMultiprocessor = f_occupancy;
    d.cuLaunchKernel = f_launch;
    d.cuStreamBeginCapture = f_begin_capture;
    d.cuStreamEndCapture = f_end_capture;
    d.cuStreamIsCapturing = f_is_capturing;
    d.cuGraphInstantiateWithFlags = f_instantiate;
    d.cuGraphLaunch = f_graph_launch;
    d.cuGraphExecDestroy = f_graph_exec_destroy;
    d.cuGraphDestroy = f_graph_destroy;
    return d;
}

void fake_cuda_set_unified(int on) { fk_unified = on; }
void fake_cuda_set_pools(int on) { fk.no_pools = !on; }

atlas_status fake_cuda_install(int device_count) {
    pthread_mutex_lock(&fk.mu);
    fk.device_count = device_count;
    pthread_mutex_unlock(&fk.mu);
    atlas_driver d = fake_cuda_table();
    return atlas_driver_install_for_test(&d, 13000);
}

fake_cuda_stats fake_cuda_get_stats(void) {
    pthread_mutex_lock(&fk.mu);
    fake_cuda_stats s = fk.st;
    pthread_mutex_unlock(&fk.mu);
    return s;
}

long fake_cuda_calls(fake_cuda_call c) {
    pthread_mutex_lock(&fk.mu);
    long n = fk.calls[c];
    pthread_mutex_unlock(&fk.mu);
    return n;
}

long fake_cuda_failed(fake_cuda_call c) {
    pthread_mutex_lock(&fk.mu);
    long n = fk.failed[c];
    pthread_mutex_unlock(&fk.mu);
    return n;
}

static void fk_arm_locked(fake_cuda_call c, long n, uintptr_t h) {
    if (n <= 0 && !h) return;
    for (int k = 0; k < FK_MAX_ARMED; k++) {
        if (n && !fk.fail_at[c][k]) {
            fk.fail_at[c][k] = n;
            return;
        }
        if (h && !fk.fail_on[c][k]) {
            fk.fail_on[c][k] = h;
            return;
        }
    }
    fprintf(stderr, "fake_cuda: more than %d failures armed for call %d\n", FK_MAX_ARMED, c);
    abort();
}

void fake_cuda_fail(fake_cuda_call c, long n) {
    pthread_mutex_lock(&fk.mu);
    fk_arm_locked(c, n, 0);
    pthread_mutex_unlock(&fk.mu);
}

void fake_cuda_fail_next(fake_cuda_call c) {
    pthread_mutex_lock(&fk.mu);
    fk_arm_locked(c, fk.calls[c] + 1, 0);
    pthread_mutex_unlock(&fk.mu);
}

void fake_cuda_fail_handle(fake_cuda_call c, uintptr_t handle) {
    pthread_mutex_lock(&fk.mu);
    fk_arm_locked(c, 0, handle);
    pthread_mutex_unlock(&fk.mu);
}

void fake_cuda_disarm(void) {
    pthread_mutex_lock(&fk.mu);
    memset(fk.fail_at, 0, sizeof fk.fail_at);
    memset(fk.fail_on, 0, sizeof fk.fail_on);
    memset(fk.calls, 0, sizeof fk.calls);
    memset(fk.failed, 0, sizeof fk.failed);
    fk.st.first_free_seq = 0;
    pthread_mutex_unlock(&fk.mu);
}

long fake_cuda_free_failed(void) {
    long n = 0;
    pthread_mutex_lock(&fk.mu);
    for (int i = 0; i < fk.n_objs;) {
        if (!fk.objs[i].failed) {
            i++;
            continue;
        }
        void *p = (void *)fk.objs[i].p;
        fk_drop_locked(&fk.objs[i]); /* the last takes its place: look at i again */
        free(p);
        n++;
    }
    pthread_mutex_unlock(&fk.mu);
    return n;
}

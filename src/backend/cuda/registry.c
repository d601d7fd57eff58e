/* backend/cuda/registry.c — one model's kernel modules, functions and device memory. */
#include "backend/cuda/registry.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fault.h"

typedef struct registry_module {
    char *name;
    CUmodule mod;
} registry_module;

typedef struct registry_function {
    char *name;
    CUfunction fn;
} registry_function;

typedef struct registry_alloc {
    CUdeviceptr ptr;
    size_t bytes;
    char *what;
} registry_alloc;

/* Failures to free the model's memory, listed for release's one message.  The text stays
 * short enough that the model's prefix and the count still fit in an error message. */
typedef struct release_report {
    char text[720];
    size_t used;
    int count, omitted;
    atlas_status first;
} release_report;

struct atlas_registry {
    atlas_host *host;
    CUmemoryPool pool;     /* the host's (stream-ordered allocation); NULL: cuMemAlloc */
    CUstream stream;       /* allocations and frees are ordered on it (registry.h) */
    int handles; /* the owner's + atlas_registry_ref's */
    registry_module *modules;
    int n_modules, cap_modules;
    registry_function *functions;
    int n_functions, cap_functions;
    registry_alloc *allocs;
    int n_allocs, cap_allocs;
    size_t alloc_bytes;
    release_report failed; /* failed frees kept since create, then release's own */
    bool portable;         /* modules from the compute_80 PTX images (atlas_registry_set_portable) */
};

const atlas_kernel_image *atlas_kernel_images(int *count) {
#ifdef ATLAS_HAVE_KERNELS
    return atlas_kernel_image_table(count);
#else
    *count = 0;
    return NULL;
#endif
}

/* Makes room for one more element of `size` bytes in *items. */
static atlas_status registry_grow(void **items, int n, int *cap, size_t size) {
    if (n < *cap) return ATLAS_OK;
    int cap2 = *cap ? *cap * 2 : 16;
    void *p = realloc(*items, (size_t)cap2 * size);
    if (!p) return atlas_fail(ATLAS_ERR_NOMEM, "registry: out of host memory");
    *items = p;
    *cap = cap2;
    return ATLAS_OK;
}

static char *registry_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

/* Makes `waiter` wait (on the device, not the host) for what is queued on `after` now. */
static atlas_status registry_fence(atlas_registry *r, CUstream after, CUstream waiter) {
    (void)r;
    if (after == waiter) return ATLAS_OK;
    CUevent ev = NULL;
    ATLAS_CU_TRY(cuEventCreate, &ev, ATLAS_CU_EVENT_DISABLE_TIMING);
    atlas_status st = ATLAS_CU(cuEventRecord, ev, after);
    if (st == ATLAS_OK) st = ATLAS_CU(cuStreamWaitEvent, waiter, ev, 0);
    /* destroyed at once: the driver keeps it until the wait has been satisfied */
    atlas_status des = ATLAS_CU(cuEventDestroy, ev);
    return st != ATLAS_OK ? st : des;
}

atlas_status atlas_registry_create(atlas_host *host, atlas_registry **out) {
    *out = NULL;
    ATLAS_TRY(atlas_host_make_current(host));
    atlas_registry *r = calloc(1, sizeof *r);
    if (!r) return atlas_fail(ATLAS_ERR_NOMEM, "registry: out of host memory");
    r->host = host;
    r->handles = 1;
    r->pool = atlas_host_pool(host);
    r->stream = atlas_host_copy_stream(host);
    /* a load allocates on the copy stream: what the serving stream freed before it (the
     * model it replaces) is reused in stream order, instead of the pool mapping more memory
     * beside memory whose free has not run yet */
    atlas_status st = r->pool ? registry_fence(r, atlas_host_stream(host), r->stream)
                              : ATLAS_OK;
    if (st != ATLAS_OK) {
        free(r);
        return atlas_fail_wrap(st, "registry: ordering the load after the serving stream");
    }
    *out = r;
    return ATLAS_OK;
}

atlas_status atlas_registry_set_stream(atlas_registry *r, CUstream stream) {
    if (stream == r->stream) return ATLAS_OK;
    ATLAS_TRY(atlas_host_make_current(r->host));
    /* the allocations made so far, and what was queued on them, come before stream's work */
    if (r->pool) ATLAS_TRY(registry_fence(r, r->stream, stream));
    r->stream = stream;
    return ATLAS_OK;
}

CUstream atlas_registry_stream(const atlas_registry *r) { return r->stream; }

static const registry_module *registry_find_module(const atlas_registry *r, const char *name) {
    for (int i = 0; i < r->n_modules; i++)
        if (strcmp(r->modules[i].name, name) == 0) return &r->modules[i];
    return NULL;
}

atlas_status atlas_registry_load_image(atlas_registry *r, const char *name, const void *image) {
    if (registry_find_module(r, name))
        return atlas_fail(ATLAS_ERR_INVALID, "registry: module '%s' is already loaded", name);
    ATLAS_TRY(atlas_host_make_current(r->host));
    ATLAS_TRY(registry_grow((void **)&r->modules, r->n_modules, &r->cap_modules,
                            sizeof *r->modules));
    char *copy = registry_strdup(name);
    if (!copy) return atlas_fail(ATLAS_ERR_NOMEM, "registry: out of host memory");
    CUmodule mod = NULL;
    atlas_status st = ATLAS_CU(cuModuleLoadData, &mod, image);
    if (st != ATLAS_OK) {
        free(copy);
        return atlas_fail_wrap(st, "registry: loading kernel module '%s'", name);
    }
    r->modules[r->n_modules++] = (registry_module){copy, mod};
    return ATLAS_OK;
}

atlas_status atlas_registry_set_portable(atlas_registry *r, bool portable) {
    if (r->n_modules > 0 && r->portable != portable)
        return atlas_fail(ATLAS_ERR_INVALID, "registry: the kernel images cannot change once "
                          "%d module(s) are loaded", r->n_modules);
    r->portable = portable;
    return ATLAS_OK;
}

bool atlas_registry_portable(const atlas_registry *r) { return r->portable; }

atlas_status atlas_registry_load_module(atlas_registry *r, const char *name) {
    if (registry_find_module(r, name)) return ATLAS_OK;
    int count = 0;
    const atlas_kernel_image *images = atlas_kernel_images(&count);
    for (int i = 0; i < count; i++) {
        if (strcmp(images[i].name, name) != 0) continue;
        if (!r->portable) return atlas_registry_load_image(r, name, images[i].data);
        if (!images[i].ptx || images[i].ptx_size < 2)
            return atlas_fail(ATLAS_ERR_NOT_FOUND, "registry: kernel module '%s' has no "
                              "portable (PTX) image in this binary", name);
        return atlas_registry_load_image(r, name, images[i].ptx);
    }
    if (count == 0)
        return atlas_fail(ATLAS_ERR_NOT_FOUND, "registry: kernel module '%s': this binary was "
                          "built without CUDA kernels (no nvcc at build time)", name);
    return atlas_fail(ATLAS_ERR_NOT_FOUND, "registry: no kernel module '%s' in this binary "
                      "(kernels/%s.cu)", name, name);
}

/* "probe, norm" into buf, for messages. */
static const char *registry_module_list(const atlas_registry *r, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < r->n_modules && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%s", i ? ", " : "",
                                 r->modules[i].name);
    if (r->n_modules == 0) snprintf(buf, size, "none loaded");
    return buf;
}

atlas_status atlas_registry_function(atlas_registry *r, const char *name, CUfunction *out) {
    *out = NULL;
    for (int i = 0; i < r->n_functions; i++) {
        if (strcmp(r->functions[i].name, name) == 0) {
            *out = r->functions[i].fn;
            return ATLAS_OK;
        }
    }
    ATLAS_TRY(atlas_host_make_current(r->host));
    const atlas_driver *d = atlas_driver_get();
    CUfunction fn = NULL;
    for (int i = 0; i < r->n_modules && !fn; i++) {
        CUresult res = d->cuModuleGetFunction(&fn, r->modules[i].mod, name);
        if (res == ATLAS_CUDA_ERROR_NOT_FOUND) {
            fn = NULL;
            continue;
        }
        atlas_status st = atlas_cu_check(res, "cuModuleGetFunction", __FILE__, __LINE__);
        if (st != ATLAS_OK)
            return atlas_fail_wrap(st, "registry: kernel '%s' in module '%s'", name,
                                   r->modules[i].name);
    }
    if (!fn) {
        char list[512];
        return atlas_fail(ATLAS_ERR_NOT_FOUND, "registry: no kernel '%s' in the loaded modules "
                          "(%s)", name, registry_module_list(r, list, sizeof list));
    }
    ATLAS_TRY(registry_grow((void **)&r->functions, r->n_functions, &r->cap_functions,
                            sizeof *r->functions));
    char *copy = registry_strdup(name);
    if (!copy) return atlas_fail(ATLAS_ERR_NOMEM, "registry: out of host memory");
    r->functions[r->n_functions++] = (registry_function){copy, fn};
    *out = fn;
    return ATLAS_OK;
}

/* --- failures: every one kept for release's message -------------------------------------- */

/* Appends "entry" (already formatted) to rep, counting it. */
static void report_text(release_report *rep, atlas_status st, const char *entry) {
    if (rep->count++ == 0) rep->first = st;
    size_t n = strlen(entry) + (rep->used ? 2 : 0);
    if (rep->used + n < sizeof rep->text) {
        rep->used += (size_t)snprintf(rep->text + rep->used, sizeof rep->text - rep->used,
                                      "%s%s", rep->used ? "; " : "", entry);
    } else {
        rep->omitted++;
    }
}

/* Keeps a failed driver call (it also sets the thread's message, as atlas_cu_check does);
 * returns its status. */
static atlas_status report_add(release_report *rep, CUresult res, const char *file, int line,
                               const char *call, const char *what, size_t bytes) {
    atlas_status st = atlas_cu_check(res, call, file, line);
    if (st == ATLAS_OK) return st;
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    char entry[256];
    if (what && bytes)
        snprintf(entry, sizeof entry, "%s '%s' (%zu bytes): %s (%s:%d)", call, what, bytes,
                 atlas_cu_error_name(res), base, line);
    else if (what)
        snprintf(entry, sizeof entry, "%s '%s': %s (%s:%d)", call, what,
                 atlas_cu_error_name(res), base, line);
    else
        snprintf(entry, sizeof entry, "%s: %s (%s:%d)", call, atlas_cu_error_name(res), base,
                 line);
    report_text(rep, st, entry);
    return st;
}

atlas_status atlas_registry_keep_cu(atlas_registry *r, CUresult res, const char *call,
                                    const char *what, const char *file, int line) {
    if (!r) return atlas_cu_check(res, call, file, line);
    return report_add(&r->failed, res, file, line, call, what, 0);
}

atlas_status atlas_registry_keep(atlas_registry *r, atlas_status st) {
    if (st == ATLAS_OK || !r) return st;
    char entry[256];
    snprintf(entry, sizeof entry, "%s", atlas_last_error());
    report_text(&r->failed, st, entry);
    return st;
}

int atlas_registry_module_count(const atlas_registry *r) { return r->n_modules; }
int atlas_registry_function_count(const atlas_registry *r) { return r->n_functions; }

/* The driver's allocation: from the pool on r->stream, else cuMemAlloc; *call names it. */
static CUresult registry_dev_alloc(atlas_registry *r, size_t bytes, CUdeviceptr *p,
                                   const char **call) {
    const atlas_driver *d = atlas_driver_get();
    *call = r->pool ? "cuMemAllocFromPoolAsync" : "cuMemAlloc";
    return r->pool ? d->cuMemAllocFromPoolAsync(p, bytes, r->pool, r->stream)
                   : d->cuMemAlloc(p, bytes);
}

/* The driver's free of one allocation, reported into rep.  In stream order on r->stream:
 * after the serving stream's work queued so far when that is another stream (a failed load,
 * on the copy stream), since the model's kernels may read the memory until they end. */
static atlas_status registry_dev_free(atlas_registry *r, const registry_alloc *a, bool fence) {
    const atlas_driver *d = atlas_driver_get();
    release_report *rep = &r->failed;
    if (!r->pool)
        return report_add(rep, d->cuMemFree(a->ptr), __FILE__, __LINE__, "cuMemFree", a->what,
                          a->bytes);
    CUstream serving = atlas_host_stream(r->host);
    if (fence && r->stream != serving) {
        atlas_status st = registry_fence(r, serving, r->stream);
        /* not freed: the memory may still be read; it stays the pool's (reported) */
        if (st != ATLAS_OK) return atlas_registry_keep(r, st);
    }
    return report_add(rep, d->cuMemFreeAsync(a->ptr, r->stream), __FILE__, __LINE__,
                      "cuMemFreeAsync", a->what, a->bytes);
}

atlas_status atlas_registry_alloc(atlas_registry *r, size_t bytes, const char *what,
                                  CUdeviceptr *out) {
    *out = 0;
    if (bytes == 0)
        return atlas_fail(ATLAS_ERR_INVALID, "registry: zero-byte device allocation for %s",
                          what);
    ATLAS_TRY(atlas_host_make_current(r->host));
    ATLAS_TRY(registry_grow((void **)&r->allocs, r->n_allocs, &r->cap_allocs,
                            sizeof *r->allocs));
    char *copy = registry_strdup(what);
    if (!copy) return atlas_fail(ATLAS_ERR_NOMEM, "registry: out of host memory");
    CUdeviceptr p = 0;
    const char *call = r->pool ? "cuMemAllocFromPoolAsync (injected fault)"
                               : "cuMemAlloc (injected fault)";
    /* a fault site (core/fault.h): the driver's out of memory, without asking the driver */
    atlas_status st = ATLAS_FAULT_HERE()
                          ? atlas_cu_check(ATLAS_CUDA_ERROR_OUT_OF_MEMORY, call, __FILE__,
                                           __LINE__)
                          : ATLAS_OK;
    if (st == ATLAS_OK) {
        CUresult res = registry_dev_alloc(r, bytes, &p, &call);
        st = atlas_cu_check(res, call, __FILE__, __LINE__);
    }
    if (st != ATLAS_OK) {
        free(copy);
        return atlas_fail_wrap(st, "registry: allocating %zu bytes of device memory for %s",
                               bytes, what);
    }
    r->allocs[r->n_allocs++] = (registry_alloc){p, bytes, copy};
    r->alloc_bytes += bytes;
    *out = p;
    return ATLAS_OK;
}

atlas_status atlas_registry_free(atlas_registry *r, CUdeviceptr ptr) {
    if (!ptr) return ATLAS_OK;
    int i = r->n_allocs - 1; /* recent allocations are freed first, typically */
    while (i >= 0 && r->allocs[i].ptr != ptr) i--;
    if (i < 0)
        return atlas_fail(ATLAS_ERR_INVALID, "registry: device pointer 0x%llx was not "
                          "allocated by this registry", ptr);
    registry_alloc a = r->allocs[i];
    ATLAS_TRY(atlas_host_make_current(r->host)); /* nothing freed: release tries again */
    /* A failed free is not tried again (what the driver did with the memory is unknown: it
     * may even have been handed out again) and is dropped from the live list; it stays in
     * the release's report, since that memory did not come back. */
    atlas_status st = registry_dev_free(r, &a, true);
    if (st != ATLAS_OK) st = atlas_fail_wrap(st, "registry: freeing %s", a.what);
    r->allocs[i] = r->allocs[--r->n_allocs];
    r->alloc_bytes -= a.bytes;
    free(a.what);
    return st;
}

int atlas_registry_alloc_count(const atlas_registry *r) { return r->n_allocs; }
size_t atlas_registry_alloc_bytes(const atlas_registry *r) { return r->alloc_bytes; }

atlas_registry *atlas_registry_ref(atlas_registry *r) {
    r->handles++;
    return r;
}

void atlas_registry_unref(atlas_registry *r) {
    if (!r) return;
    /* the owner's handle goes through atlas_registry_release, never here */
    assert(r->handles > 1);
    if (r->handles > 1) r->handles--;
}

int atlas_registry_handles(const atlas_registry *r) { return r->handles; }

/* Release's frees in stream order: after the serving stream's work (the model's last
 * kernels), on r->stream, then a wait for that stream alone (no device-wide synchronise: a
 * load on the copy stream goes on), so that the modules may be unloaded and the pool gives
 * the memory back to the driver now.  Every failure goes to r->failed. */
static void registry_release_pool(atlas_registry *r) {
    const atlas_driver *d = atlas_driver_get();
    release_report *rep = &r->failed;
    CUstream serving = atlas_host_stream(r->host);
    atlas_status fenced = registry_fence(r, serving, r->stream);
    if (fenced != ATLAS_OK) { /* the wait could not be queued: the host waits instead */
        atlas_registry_keep(r, fenced);
        report_add(rep, d->cuStreamSynchronize(serving), __FILE__, __LINE__,
                   "cuStreamSynchronize", NULL, 0);
    }
    /* a failure frees the rest all the same: one bad pointer must not leak the model */
    for (int i = r->n_allocs - 1; i >= 0; i--) registry_dev_free(r, &r->allocs[i], false);
    /* the stream's wait covers the serving stream's work when fenced: both done after it */
    CUevent ev = NULL;
    CUresult res = d->cuEventCreate(&ev, ATLAS_CU_EVENT_DISABLE_TIMING);
    if (res == ATLAS_CUDA_SUCCESS) res = d->cuEventRecord(ev, r->stream);
    if (res == ATLAS_CUDA_SUCCESS) {
        report_add(rep, d->cuEventSynchronize(ev), __FILE__, __LINE__, "cuEventSynchronize",
                   NULL, 0);
    } else {
        report_add(rep, res, __FILE__, __LINE__, "cuEventRecord", NULL, 0);
        report_add(rep, d->cuStreamSynchronize(r->stream), __FILE__, __LINE__,
                   "cuStreamSynchronize", NULL, 0);
    }
    if (ev) report_add(rep, d->cuEventDestroy(ev), __FILE__, __LINE__, "cuEventDestroy", NULL, 0);
    /* the frees have run and the host has seen it: the memory goes back to the driver, but
     * for a hold (atlas_host_pool_hold: a load follows, and takes it) */
    if (!atlas_host_pool_held(r->host))
        report_add(rep, d->cuMemPoolTrimTo(r->pool, 0), __FILE__, __LINE__, "cuMemPoolTrimTo",
                   NULL, 0);
}

atlas_status atlas_registry_release(atlas_registry *r) {
    if (!r) return ATLAS_OK;
    if (r->handles > 1)
        return atlas_fail(ATLAS_ERR_BUSY, "registry: release refused: %d other handle(s) "
                          "live; nothing was unloaded", r->handles - 1);
    release_report *rep = &r->failed; /* the failed frees before, then this release's */
    const atlas_driver *d = atlas_driver_get();
    if (atlas_host_make_current(r->host) != ATLAS_OK)
        report_add(rep, d->cuCtxSetCurrent(atlas_host_context(r->host)), __FILE__, __LINE__,
                   "cuCtxSetCurrent", NULL, 0);
    if (r->pool) {
        registry_release_pool(r);
    } else {
        /* kernels still running may use the memory: wait for them first (cuMemFree would
         * synchronise the device all the same) */
        report_add(rep, d->cuCtxSynchronize(), __FILE__, __LINE__, "cuCtxSynchronize", NULL, 0);
        /* a failure frees the rest all the same: one bad pointer must not leak the model */
        for (int i = r->n_allocs - 1; i >= 0; i--) registry_dev_free(r, &r->allocs[i], false);
    }
    for (int i = r->n_allocs - 1; i >= 0; i--) free(r->allocs[i].what);
    for (int i = r->n_modules - 1; i >= 0; i--) {
        report_add(rep, d->cuModuleUnload(r->modules[i].mod), __FILE__, __LINE__,
                   "cuModuleUnload", r->modules[i].name, 0);
        free(r->modules[i].name);
    }
    for (int i = 0; i < r->n_functions; i++) free(r->functions[i].name);
    int n_allocs = r->n_allocs, n_modules = r->n_modules;
    release_report out = *rep;
    free(r->allocs);
    free(r->modules);
    free(r->functions);
    free(r);
    if (out.count == 0) return ATLAS_OK;
    char more[48] = "";
    if (out.omitted) snprintf(more, sizeof more, "; and %d more", out.omitted);
    return atlas_fail(out.first, "registry release (%d allocation(s), %d module(s)): %d "
                      "failure(s): %s%s", n_allocs, n_modules, out.count, out.text, more);
}

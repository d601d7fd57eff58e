/* atlas/host.h — the process's GPU: the one documented global.
 *
 * There is one host per process (a process serves one GPU).  The first atlas_host_get binds
 * the GPU ordinal: it loads the driver (libcuda.so.1, at run time), retains the device's
 * primary context once and creates the streams.  The host is never destroyed while the
 * process runs: models come and go (each with its own kernel registry and memory), the
 * context stays, so that swapping models costs a weight upload, not a context.
 * Where there is no driver or no GPU, atlas_host_get fails with ATLAS_ERR_NO_DEVICE and the
 * reason, kept for `atlas info`; the engine then uses the CPU backend.
 *
 * Threads: every function here may be called from any thread (binding is locked; each
 * thread that uses the host makes its context current itself).  Ownership: the host, its
 * properties and the reason string belong to the process and are never freed; the caller
 * frees nothing it gets here. */
#ifndef ATLAS_HOST_H
#define ATLAS_HOST_H

#include <stddef.h>

#include "atlas/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct atlas_host atlas_host;

typedef struct atlas_host_props {
    int ordinal;              /* GPU ordinal the host is bound to */
    char name[256];           /* "NVIDIA H200" */
    int cc_major, cc_minor;   /* compute capability, 9.0 for Hopper */
    int sm_count;             /* streaming multiprocessors */
    size_t total_mem;         /* bytes of device memory */
    int l2_bytes;             /* L2 cache */
    int smem_per_block_optin; /* shared memory a block may opt in to (cuFuncSetAttribute) */
    int smem_per_sm;          /* shared memory per multiprocessor */
    int integrated;           /* 1 when the GPU shares the host's memory (GB10) */
    int host_page_tables;     /* 1 when the GPU reads pageable host memory through the host's
                                 page tables (CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_
                                 HOST_PAGE_TABLES: GB10, Grace Hopper) */
    int driver_version;       /* 13000 = CUDA 13.0 */
    double init_ms;           /* time to load the driver and create the context (first use) */
    size_t free_at_bind;      /* bytes of device memory free when the host bound, before the
                                 process allocated any (0: unknown): what a start's checks
                                 compare with, since asking the driver (atlas_host_mem_info)
                                 while atlas_host_start pins the staging pool waits for it */
} atlas_host_props;

/* The process host on GPU `ordinal`.  The first successful call binds it; the same ordinal
 * again returns the same host; another ordinal fails with ATLAS_ERR_INVALID naming both.
 * ATLAS_ERR_NO_DEVICE when there is no driver or no such GPU (the message says why, and so
 * does atlas_host_unavailable_reason()).  Thread-safe.  The host is never freed. */
ATLAS_API atlas_status atlas_host_get(int ordinal, atlas_host **out);

/* Starts binding the process to GPU `ordinal` on threads of its own and returns at once: the
 * driver, cuInit, the primary context and the streams, then the pinned staging pool with its
 * loader threads, and beside them cuBLASLt's library, which the first model load would
 * otherwise make one after another.  A caller that needs the host meanwhile
 * (atlas_host_get, a model load) waits for what it needs; a set-up that fails is tried again
 * by the next atlas_host_get, which reports the error on its caller's thread as ever.  Call it
 * first thing (`atlas serve` does, unless --device cpu), then do the load's file work.
 * Thread-safe; nothing to free. */
ATLAS_API void atlas_host_start(int ordinal);

/* Waits until atlas_host_start's threads have ended (at once if none runs): a process that
 * exits early (a port in use, a bad model) calls it first, so that it does not unload the
 * driver under them.  Thread-safe. */
ATLAS_API void atlas_host_start_wait(void);

/* When each part of the host's set-up ended, in milliseconds of CLOCK_MONOTONIC (clock_gettime's
 * clock; 0: not done, or a test's fake driver), for a start-up's log.  With atlas_host_start
 * the parts overlap: cuBLASLt's library and the staging pool are made beside the rest. */
typedef struct atlas_host_times {
    double begin;    /* the set-up began (atlas_host_start, or the first atlas_host_get) */
    double driver;   /* libcuda.so.1 opened and its entry points found */
    double cuinit;   /* cuInit returned */
    double context;  /* the primary context retained and current */
    double streams;  /* the streams made: the host is bound */
    double staging;  /* the pinned staging pool allocated and its loader threads started */
    double cublaslt; /* cuBLASLt's library opened (or found absent) */
} atlas_host_times;

/* The process's set-up times so far, into *out.  Thread-safe. */
ATLAS_API void atlas_host_get_times(atlas_host_times *out);

/* Why the last atlas_host_get failed with ATLAS_ERR_NO_DEVICE ("" if it has not), e.g.
 * "libcuda.so.1: cannot open shared object file: No such file or directory".  A static
 * buffer, rewritten only by a failing atlas_host_get on another thread. */
ATLAS_API const char *atlas_host_unavailable_reason(void);

/* The device's properties, valid for the life of the process. */
ATLAS_API const atlas_host_props *atlas_host_properties(const atlas_host *host);

/* bytes of pinned (page-locked) host memory in the host's context, into *out: the GPU copies
 * to and from it at the bus's rate (2 MiB blocks: 51 GB/s against 8.3 from pageable memory
 * on an H100, bench/RESULTS.md).  Pinning is slow: keep such memory for reuse.  Freed with
 * atlas_host_free_pinned (NULL: nothing).  ATLAS_ERR_NOMEM. */
ATLAS_API atlas_status atlas_host_alloc_pinned(atlas_host *host, size_t bytes, void **out);
ATLAS_API void atlas_host_free_pinned(atlas_host *host, void *p);

/* Free and total device memory now (cuMemGetInfo), into the caller's two size_t; memory the
 * process's allocator holds freed and unused is given back to the driver first, so it counts
 * as free. */
ATLAS_API atlas_status atlas_host_mem_info(atlas_host *host, size_t *free_bytes,
                                           size_t *total_bytes);

#ifdef __cplusplus
}
#endif
#endif

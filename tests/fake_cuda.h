/* tests/fake_cuda.h — one fake CUDA driver for the tests that run the CUDA backend without a
 * GPU (CI has none).  "Device" memory is host memory (256-byte aligned), copies are memcpy,
 * kernels and graphs do nothing.  The fake counts what is live (allocations and their bytes,
 * pinned buffers, modules), counts the calls of the functions a test can fail, and fails the
 * calls a test picks.  A module image "FAKEMOD:a,b" holds kernels a and b; an embedded fatbin
 * holds every kernel; any other image is CUDA_ERROR_INVALID_IMAGE.  It has memory pools
 * (cuMemAllocFromPoolAsync and cuMemFreeAsync run at once, as if every stream were idle) unless
 * fake_cuda_set_pools(0) says the device has none.  All of it is safe to call from any
 * thread. */
#ifndef ATLAS_TESTS_FAKE_CUDA_H
#define ATLAS_TESTS_FAKE_CUDA_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/driver.h"

#define FAKE_CUDA_OUT_OF_MEMORY 2
#define FAKE_CUDA_ILLEGAL_ADDRESS 700
#define FAKE_CUDA_TOTAL_MEM ((size_t)80 << 30)

/* The calls a test can count and fail.  A failed free leaves what it was asked to free live
 * (as the real driver may); a failed cuMemAlloc or cuMemHostAlloc is out of memory, a failed
 * context retain too; the others fail with CUDA_ERROR_ILLEGAL_ADDRESS. */
typedef enum fake_cuda_call {
    FAKE_CU_ALLOC,          /* cuMemAlloc or cuMemAllocFromPoolAsync */
    FAKE_CU_FREE,           /* cuMemFree or cuMemFreeAsync */
    FAKE_CU_FREE_HOST,      /* cuMemFreeHost */
    FAKE_CU_MODULE_UNLOAD,  /* cuModuleUnload */
    FAKE_CU_EVENT_DESTROY,  /* cuEventDestroy */
    FAKE_CU_RETAIN,         /* cuDevicePrimaryCtxRetain */
    FAKE_CU_SYNC,           /* cuCtxSynchronize */
    FAKE_CU_HTOD_ASYNC,     /* cuMemcpyHtoDAsync */
    FAKE_CU_GET_FUNCTION,   /* cuModuleGetFunction (counted; a missing kernel is NOT_FOUND) */
    FAKE_CU_HOST_ALLOC,     /* cuMemHostAlloc (fails as out of memory) */
    FAKE_CU_CALLS
} fake_cuda_call;

/* What the fake holds now; "live" is made and not (successfully) freed. */
typedef struct fake_cuda_stats {
    long live_allocs, live_hosts, live_modules;
    size_t live_bytes;                /* of the live allocations */
    long retains, releases;           /* primary context */
    long modules_loaded, modules_unloaded;
    long bad_copies;                  /* cuMemcpyHtoDAsync from, or DtoHAsync into, memory
                                         that is not pinned */
    CUmodule last_module;             /* the last one loaded */
    pthread_t last_module_thread;     /* the thread that loaded it */
    /* memory pools: pools made and not destroyed; the last pool's release threshold and
     * whether it allows internal dependencies (-1 until set); stream-ordered allocations
     * and frees that succeeded; trims */
    long live_pools, pool_allocs, pool_frees, pool_trims;
    long long pool_threshold;
    int pool_internal_deps;
    /* the order of stream-ordered frees and waits (a counter shared by both, from 1): the
     * last cuStreamWaitEvent (the waiting stream and the stream its event was recorded on),
     * the first cuMemFreeAsync since fake_cuda_disarm and the last one, and its stream */
    long last_wait_seq, first_free_seq, last_free_seq;
    CUstream last_wait_stream, last_wait_after, last_free_stream, last_alloc_stream;
    long launches; /* kernel launches (none run) */
} fake_cuda_stats;

/* The fake's driver table, and that table installed (atlas_driver_install_for_test, which
 * refuses a second install once a host is bound) with device_count devices. */
atlas_driver fake_cuda_table(void);
atlas_status fake_cuda_install(int device_count);

/* Before the host is bound: the device says it is integrated and reads pageable host memory
 * through the host's page tables (GB10's unified memory); 0 (default): a discrete GPU. */
void fake_cuda_set_unified(int on);
/* Before the host is bound: 0 makes the device say it has no memory pools
 * (CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED), so atlas falls back to cuMemAlloc/cuMemFree;
 * 1 (default): it has them. */
void fake_cuda_set_pools(int on);

fake_cuda_stats fake_cuda_get_stats(void);

/* Calls of c made, and failed, since the last fake_cuda_disarm. */
long fake_cuda_calls(fake_cuda_call c);
long fake_cuda_failed(fake_cuda_call c);

/* The n-th call of c counted from the last fake_cuda_disarm fails (at most 4 armed a kind;
 * each fails once); fake_cuda_fail_next, the next call of c. */
void fake_cuda_fail(fake_cuda_call c, long n);
void fake_cuda_fail_next(fake_cuda_call c);
/* Every call of c on handle (a CUdeviceptr, pinned pointer or CUmodule) fails until
 * fake_cuda_disarm; at most 4 armed. */
void fake_cuda_fail_handle(fake_cuda_call c, uintptr_t handle);
/* No failures armed; calls counted from zero again. */
void fake_cuda_disarm(void);

/* Frees what failed frees left live, so that the sanitizers see no leak; returns how many. */
long fake_cuda_free_failed(void);

#endif

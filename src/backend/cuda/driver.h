/* backend/cuda/driver.h — the CUDA driver API as one table of function pointers, filled at
 * run time from libcuda.so.1 (dlopen), so that atlas builds and runs without the CUDA
 * toolkit or a driver.  Internal.
 *
 * The types below mirror the driver's ABI (cuda.h, CUDA 12.0 .. 13.0) so that no CUDA header
 * is needed to build: do not include cuda.h next to this file.  Each field is named after the
 * API's base name and has the signature of that API as of CUDA 12.8 (cuMemAlloc is
 * cuMemAlloc_v2, cuStreamBeginCapture is _v2, but cuCtxSynchronize is the (void) one, not
 * CUDA 13's cuCtxSynchronize_v2(ctx)); driver.c asks cuGetProcAddress for exactly that
 * version, so a newer driver cannot change a signature under us.  Adding an entry: check
 * its PFN_<name>_v<version> typedefs in cudaTypedefs.h for the one in force at 12.8.
 *
 * Usage (inside a function that returns atlas_status, after atlas_host_get succeeded):
 *     CUdeviceptr p;
 *     ATLAS_CU_TRY(cuMemAlloc, &p, bytes);
 *     atlas_status st = ATLAS_CU(cuStreamSynchronize, stream); // when cleanup must follow
 * A failure returns ATLAS_ERR_DEVICE (ATLAS_ERR_DEVICE_NOMEM for CUDA_ERROR_OUT_OF_MEMORY)
 * with "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory) (registry.c:123)". */
#ifndef ATLAS_CUDA_DRIVER_H
#define ATLAS_CUDA_DRIVER_H

#include <stddef.h>

#include "atlas/status.h"
#include "core/error.h"

/* --- driver ABI types (see cuda.h) -------------------------------------------------------- */
typedef int CUresult; /* enum cudaError_enum */
typedef int CUdevice;
typedef unsigned long long CUdeviceptr; /* 64-bit device address (CUdeviceptr_v2) */
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef int CUdevice_attribute;
typedef int CUfunction_attribute;
typedef int CUstreamCaptureMode;
typedef int CUstreamCaptureStatus;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef int CUmemPool_attribute;

/* cuMemPoolCreate's description (CUmemPoolProps_v1, 88 bytes): atlas makes a pool of pinned
 * device memory on one device, exportable by no handle; the rest stays zero. */
typedef struct ATLAS_CUMEMPOOLPROPS {
    int allocType;   /* CUmemAllocationType: 1 pinned */
    int handleTypes; /* CUmemAllocationHandleType: 0 none */
    struct {
        int type; /* CUmemLocationType: 1 device */
        int id;   /* the device's ordinal */
    } location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} ATLAS_CUMEMPOOLPROPS;
#define ATLAS_CU_MEM_ALLOCATION_TYPE_PINNED 1
#define ATLAS_CU_MEM_LOCATION_TYPE_DEVICE 1
/* CUmemPool_attribute values (the threshold's value is a cuuint64_t, the others an int) */
#define ATLAS_CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES 1
#define ATLAS_CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC 2
#define ATLAS_CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES 3
#define ATLAS_CU_MEMPOOL_ATTR_RELEASE_THRESHOLD 4
#define ATLAS_CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT 5
#define ATLAS_CU_MEMPOOL_ATTR_USED_MEM_CURRENT 7

/* cuMemcpy2D's description (CUDA_MEMCPY2D_v2): Height rows of WidthInBytes, each side with
 * its own pitch; a memory type is 1 host, 2 device. */
typedef struct ATLAS_CUDA_MEMCPY2D {
    size_t srcXInBytes, srcY;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    void *srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    void *dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
} ATLAS_CUDA_MEMCPY2D;
#define ATLAS_CU_MEMORYTYPE_HOST 1
#define ATLAS_CU_MEMORYTYPE_DEVICE 2

/* CUresult values atlas looks at (the rest are named by cuGetErrorName). */
#define ATLAS_CUDA_SUCCESS 0
#define ATLAS_CUDA_ERROR_INVALID_VALUE 1
#define ATLAS_CUDA_ERROR_OUT_OF_MEMORY 2
#define ATLAS_CUDA_ERROR_NOT_INITIALIZED 3
#define ATLAS_CUDA_ERROR_NO_DEVICE 100
#define ATLAS_CUDA_ERROR_INVALID_DEVICE 101
#define ATLAS_CUDA_ERROR_INVALID_IMAGE 200
#define ATLAS_CUDA_ERROR_NO_BINARY_FOR_GPU 209
#define ATLAS_CUDA_ERROR_UNSUPPORTED_PTX_VERSION 222
#define ATLAS_CUDA_ERROR_INVALID_HANDLE 400
#define ATLAS_CUDA_ERROR_NOT_FOUND 500
#define ATLAS_CUDA_ERROR_NOT_READY 600

/* CUdevice_attribute values */
#define ATLAS_CU_ATTR_MAX_THREADS_PER_BLOCK 1
#define ATLAS_CU_ATTR_MAX_SHARED_MEMORY_PER_BLOCK 8
#define ATLAS_CU_ATTR_WARP_SIZE 10
#define ATLAS_CU_ATTR_MAX_REGISTERS_PER_BLOCK 12
#define ATLAS_CU_ATTR_CLOCK_RATE 13 /* kHz */
#define ATLAS_CU_ATTR_MULTIPROCESSOR_COUNT 16
#define ATLAS_CU_ATTR_INTEGRATED 18
#define ATLAS_CU_ATTR_PCI_BUS_ID 33
#define ATLAS_CU_ATTR_PCI_DEVICE_ID 34
#define ATLAS_CU_ATTR_MEMORY_CLOCK_RATE 36 /* kHz */
#define ATLAS_CU_ATTR_GLOBAL_MEMORY_BUS_WIDTH 37 /* bits */
#define ATLAS_CU_ATTR_L2_CACHE_SIZE 38
#define ATLAS_CU_ATTR_MAX_THREADS_PER_MULTIPROCESSOR 39
#define ATLAS_CU_ATTR_PCI_DOMAIN_ID 50
#define ATLAS_CU_ATTR_COMPUTE_CAPABILITY_MAJOR 75
#define ATLAS_CU_ATTR_COMPUTE_CAPABILITY_MINOR 76
#define ATLAS_CU_ATTR_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR 81
#define ATLAS_CU_ATTR_MANAGED_MEMORY 83
#define ATLAS_CU_ATTR_PAGEABLE_MEMORY_ACCESS 88
#define ATLAS_CU_ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN 97
#define ATLAS_CU_ATTR_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES 100
#define ATLAS_CU_ATTR_MEMORY_POOLS_SUPPORTED 115

/* CUfunction_attribute values */
#define ATLAS_CU_FUNC_ATTR_MAX_THREADS_PER_BLOCK 0
#define ATLAS_CU_FUNC_ATTR_NUM_REGS 4
#define ATLAS_CU_FUNC_ATTR_PTX_VERSION 5
#define ATLAS_CU_FUNC_ATTR_BINARY_VERSION 6
#define ATLAS_CU_FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES 8

/* flags */
#define ATLAS_CU_STREAM_NON_BLOCKING 0x1
#define ATLAS_CU_EVENT_DEFAULT 0x0
#define ATLAS_CU_EVENT_BLOCKING_SYNC 0x1
#define ATLAS_CU_EVENT_DISABLE_TIMING 0x2
#define ATLAS_CU_MEMHOSTALLOC_PORTABLE 0x1
#define ATLAS_CU_MEMHOSTALLOC_DEVICEMAP 0x2
#define ATLAS_CU_MEMHOSTALLOC_WRITECOMBINED 0x4
#define ATLAS_CU_MEMHOSTREGISTER_PORTABLE 0x1
/* the device only reads the range: what a read-only file mapping can be registered with
 * (needs CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED) */
#define ATLAS_CU_MEMHOSTREGISTER_READ_ONLY 0x8
#define ATLAS_CU_STREAM_CAPTURE_MODE_GLOBAL 0
#define ATLAS_CU_STREAM_CAPTURE_MODE_THREAD_LOCAL 1
#define ATLAS_CU_STREAM_CAPTURE_MODE_RELAXED 2

/* The driver API atlas uses.  Every pointer is non-NULL once the table is loaded, except
 * those marked "optional" (NULL when the driver lacks them). */
typedef struct atlas_driver {
    /* init and version */
    CUresult (*cuInit)(unsigned int flags);
    CUresult (*cuDriverGetVersion)(int *version); /* 12080 = 12.8 */
    CUresult (*cuGetErrorName)(CUresult error, const char **name);
    CUresult (*cuGetErrorString)(CUresult error, const char **text);

    /* devices */
    CUresult (*cuDeviceGet)(CUdevice *dev, int ordinal);
    CUresult (*cuDeviceGetCount)(int *count);
    CUresult (*cuDeviceGetName)(char *name, int len, CUdevice dev);
    CUresult (*cuDeviceGetAttribute)(int *value, CUdevice_attribute attr, CUdevice dev);
    CUresult (*cuDeviceTotalMem)(size_t *bytes, CUdevice dev);

    /* contexts: atlas only uses the device's primary context (host.c) */
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice dev);
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice dev);
    CUresult (*cuCtxSetCurrent)(CUcontext ctx);
    CUresult (*cuCtxGetCurrent)(CUcontext *ctx);
    CUresult (*cuCtxSynchronize)(void);

    /* streams and events */
    CUresult (*cuStreamCreate)(CUstream *stream, unsigned int flags);
    CUresult (*cuStreamDestroy)(CUstream stream);
    CUresult (*cuStreamSynchronize)(CUstream stream);
    CUresult (*cuStreamWaitEvent)(CUstream stream, CUevent event, unsigned int flags);
    CUresult (*cuEventCreate)(CUevent *event, unsigned int flags);
    CUresult (*cuEventRecord)(CUevent event, CUstream stream);
    CUresult (*cuEventSynchronize)(CUevent event);
    CUresult (*cuEventQuery)(CUevent event); /* CUDA_SUCCESS or CUDA_ERROR_NOT_READY (600) */
    CUresult (*cuEventElapsedTime)(float *ms, CUevent start, CUevent end);
    CUresult (*cuEventDestroy)(CUevent event);

    /* device memory */
    CUresult (*cuMemAlloc)(CUdeviceptr *ptr, size_t bytes);
    CUresult (*cuMemFree)(CUdeviceptr ptr);
    CUresult (*cuMemGetInfo)(size_t *free_bytes, size_t *total_bytes);
    CUresult (*cuMemcpyHtoD)(CUdeviceptr dst, const void *src, size_t bytes);
    CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr dst, const void *src, size_t bytes, CUstream s);
    CUresult (*cuMemcpyDtoH)(void *dst, CUdeviceptr src, size_t bytes);
    CUresult (*cuMemcpyDtoHAsync)(void *dst, CUdeviceptr src, size_t bytes, CUstream s);
    CUresult (*cuMemcpyDtoD)(CUdeviceptr dst, CUdeviceptr src, size_t bytes);
    CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s);
    /* optional: strided copies (a KV block's rows of every layer in one call) */
    CUresult (*cuMemcpy2DAsync)(const ATLAS_CUDA_MEMCPY2D *copy, CUstream s);
    CUresult (*cuMemsetD8)(CUdeviceptr dst, unsigned char value, size_t count);
    CUresult (*cuMemsetD32)(CUdeviceptr dst, unsigned int value, size_t count);
    CUresult (*cuMemsetD8Async)(CUdeviceptr dst, unsigned char value, size_t count, CUstream s);
    CUresult (*cuMemsetD32Async)(CUdeviceptr dst, unsigned int value, size_t count, CUstream s);

    /* optional, all or none (CUDA 11.2): stream-ordered allocation from a memory pool, which
     * never synchronises the device as cuMemFree does (registry.c) */
    CUresult (*cuMemPoolCreate)(CUmemoryPool *pool, const ATLAS_CUMEMPOOLPROPS *props);
    CUresult (*cuMemPoolDestroy)(CUmemoryPool pool);
    CUresult (*cuMemPoolSetAttribute)(CUmemoryPool pool, CUmemPool_attribute attr, void *value);
    CUresult (*cuMemPoolGetAttribute)(CUmemoryPool pool, CUmemPool_attribute attr, void *value);
    CUresult (*cuMemPoolTrimTo)(CUmemoryPool pool, size_t min_bytes_to_keep);
    CUresult (*cuMemAllocFromPoolAsync)(CUdeviceptr *ptr, size_t bytes, CUmemoryPool pool,
                                        CUstream s);
    CUresult (*cuMemFreeAsync)(CUdeviceptr ptr, CUstream s);

    /* pinned host memory */
    CUresult (*cuMemHostAlloc)(void **ptr, size_t bytes, unsigned int flags);
    CUresult (*cuMemFreeHost)(void *ptr);
    CUresult (*cuMemHostGetDevicePointer)(CUdeviceptr *dptr, void *ptr, unsigned int flags);
    CUresult (*cuMemHostRegister)(void *ptr, size_t bytes, unsigned int flags);
    CUresult (*cuMemHostUnregister)(void *ptr);

    /* modules and kernels */
    CUresult (*cuModuleLoadData)(CUmodule *module, const void *image);
    CUresult (*cuModuleUnload)(CUmodule module);
    CUresult (*cuModuleGetFunction)(CUfunction *fn, CUmodule module, const char *name);
    CUresult (*cuModuleGetGlobal)(CUdeviceptr *ptr, size_t *bytes, CUmodule module,
                                  const char *name);
    CUresult (*cuFuncSetAttribute)(CUfunction fn, CUfunction_attribute attr, int value);
    CUresult (*cuFuncGetAttribute)(int *value, CUfunction_attribute attr, CUfunction fn);
    CUresult (*cuLaunchKernel)(CUfunction fn, unsigned int grid_x, unsigned int grid_y,
                               unsigned int grid_z, unsigned int block_x, unsigned int block_y,
                               unsigned int block_z, unsigned int shared_bytes, CUstream s,
                               void **params, void **extra);
    CUresult (*cuOccupancyMaxActiveBlocksPerMultiprocessor)(int *blocks, CUfunction fn,
                                                            int block_size, size_t dyn_smem);

    /* CUDA graphs (decode steps are captured once and replayed) */
    CUresult (*cuStreamBeginCapture)(CUstream s, CUstreamCaptureMode mode);
    CUresult (*cuStreamEndCapture)(CUstream s, CUgraph *graph);
    CUresult (*cuStreamIsCapturing)(CUstream s, CUstreamCaptureStatus *status);
    CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec *exec, CUgraph graph,
                                            unsigned long long flags);
    CUresult (*cuGraphLaunch)(CUgraphExec exec, CUstream s);
    CUresult (*cuGraphExecDestroy)(CUgraphExec exec);
    CUresult (*cuGraphDestroy)(CUgraph graph);
} atlas_driver;

/* Loads libcuda.so.1 (or $ATLAS_LIBCUDA when set) once and fills the table; later calls
 * return the first call's result.  ATLAS_ERR_NO_DEVICE with the reason (the dlerror text, a
 * missing symbol, a driver older than atlas needs) when it cannot.  Thread-safe. */
atlas_status atlas_driver_load(const atlas_driver **out);

/* The loaded table, or NULL before a successful atlas_driver_load. */
const atlas_driver *atlas_driver_get(void);

/* The driver's version (e.g. 13000), 0 before a successful load. */
int atlas_driver_version(void);

/* When the driver was opened (its entry points found) and when its cuInit returned, in
 * atlas_now_ms (0: not yet, or a fake driver installed). */
void atlas_driver_times(double *loaded, double *init);

/* Tests only: makes `fake` (copied) the driver table, as if libcuda had been loaded, with
 * version `version`.  Must precede every other use of the driver (ATLAS_ERR_INVALID after);
 * NULL entries in `fake` are programmer errors when called.  The one place a fake is used:
 * CI has no GPU. */
atlas_status atlas_driver_install_for_test(const atlas_driver *fake, int version);

/* Turns a CUresult into an atlas status and message naming the call, cuGetErrorName and
 * file:line.  CUDA_ERROR_OUT_OF_MEMORY -> ATLAS_ERR_DEVICE_NOMEM, others -> ATLAS_ERR_DEVICE. */
atlas_status atlas_cu_check(CUresult res, const char *call, const char *file, int line);

/* 1 once a call checked by atlas_cu_check has returned one of CUDA's sticky errors (an
 * illegal address, a launch failure, an uncorrectable ECC error...): the process's context
 * can run nothing more, and only a restart gives the GPU back.  msg (n bytes, may be NULL)
 * gets the first such error's message, "" while there is none.  Thread-safe. */
int atlas_cu_lost(char *msg, size_t n);

/* Tests only: forgets a sticky error the fake driver was made to return. */
void atlas_cu_lost_clear_for_test(void);

/* "CUDA_ERROR_OUT_OF_MEMORY" for 2, "CUDA_ERROR_<n>" when the driver does not know it. */
const char *atlas_cu_error_name(CUresult res);

/* Calls driver function `fn` with the arguments and evaluates to an atlas_status. */
#define ATLAS_CU(fn, ...) atlas_cu_check(atlas_driver_get()->fn(__VA_ARGS__), #fn, __FILE__, __LINE__)

/* Same, returning the failure from the enclosing function. */
#define ATLAS_CU_TRY(fn, ...) ATLAS_TRY(ATLAS_CU(fn, __VA_ARGS__))

#endif

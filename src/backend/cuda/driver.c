/* backend/cuda/driver.c — loads libcuda.so.1 with dlopen and fills the driver table.
 *
 * Globals (documented in docs/ARCHITECTURE.md, "Globals"): the table, the library handle and
 * the outcome of the one load attempt, written once under a lock and read-only afterwards;
 * and the first sticky error the driver returned (the context is lost), under its own lock. */
#include "backend/cuda/driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"

/* The oldest driver atlas accepts: the kernels are built by the nvcc whose version
 * cmake/kernels.cmake passes in (a driver older than that toolkit cannot load its fatbins);
 * without kernels, CUDA 12.0 (the ABI this table mirrors). */
#ifdef ATLAS_KERNELS_CUDA_VERSION
#define ATLAS_DRIVER_MIN_VERSION ATLAS_KERNELS_CUDA_VERSION
#else
#define ATLAS_DRIVER_MIN_VERSION 12000
#endif
/* The ABI the table's signatures match, pinned: cuGetProcAddress is asked for each entry
 * point as of min(driver, this), whatever newer driver runs.  Asking for the driver's own
 * version broke on CUDA 13.0, which gave cuCtxSynchronize_v2(CUcontext) for the table's
 * cuCtxSynchronize(void) (checked against cudaTypedefs.h of CUDA 13.0: every other entry
 * has the same signature at 12.8 and 13.0). */
#define ATLAS_DRIVER_ABI_VERSION 12080

/* cuMemPoolCreate reads the whole CUmemPoolProps_v1 */
_Static_assert(sizeof(ATLAS_CUMEMPOOLPROPS) == 88, "CUmemPoolProps_v1 is 88 bytes");

typedef CUresult (*get_proc_fn)(const char *symbol, void **pfn, int cuda_version,
                                unsigned long long flags, int *symbol_status);

typedef struct driver_symbol {
    const char *name;      /* base name, as cuGetProcAddress wants it */
    const char *versioned; /* exported name of the same ABI, for dlsym */
    size_t offset;         /* of the field in atlas_driver */
    int optional;
} driver_symbol;

#define SYM(f, v) {#f, v, offsetof(atlas_driver, f), 0}
#define SYM_OPT(f, v) {#f, v, offsetof(atlas_driver, f), 1}

static const driver_symbol driver_symbols[] = {
    SYM(cuInit, "cuInit"),
    SYM(cuDriverGetVersion, "cuDriverGetVersion"),
    SYM(cuGetErrorName, "cuGetErrorName"),
    SYM(cuGetErrorString, "cuGetErrorString"),
    SYM(cuDeviceGet, "cuDeviceGet"),
    SYM(cuDeviceGetCount, "cuDeviceGetCount"),
    SYM(cuDeviceGetName, "cuDeviceGetName"),
    SYM(cuDeviceGetAttribute, "cuDeviceGetAttribute"),
    SYM(cuDeviceTotalMem, "cuDeviceTotalMem_v2"),
    SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    SYM(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
    SYM(cuCtxSetCurrent, "cuCtxSetCurrent"),
    SYM(cuCtxGetCurrent, "cuCtxGetCurrent"),
    SYM(cuCtxSynchronize, "cuCtxSynchronize"),
    SYM(cuStreamCreate, "cuStreamCreate"),
    SYM(cuStreamDestroy, "cuStreamDestroy_v2"),
    SYM(cuStreamSynchronize, "cuStreamSynchronize"),
    SYM(cuStreamWaitEvent, "cuStreamWaitEvent"),
    SYM(cuEventCreate, "cuEventCreate"),
    SYM(cuEventRecord, "cuEventRecord"),
    SYM(cuEventSynchronize, "cuEventSynchronize"),
    SYM(cuEventQuery, "cuEventQuery"),
    SYM(cuEventElapsedTime, "cuEventElapsedTime"),
    SYM(cuEventDestroy, "cuEventDestroy_v2"),
    SYM(cuMemAlloc, "cuMemAlloc_v2"),
    SYM(cuMemFree, "cuMemFree_v2"),
    SYM(cuMemGetInfo, "cuMemGetInfo_v2"),
    SYM(cuMemcpyHtoD, "cuMemcpyHtoD_v2"),
    SYM(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
    SYM(cuMemcpyDtoH, "cuMemcpyDtoH_v2"),
    SYM(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
    SYM(cuMemcpyDtoD, "cuMemcpyDtoD_v2"),
    SYM(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"),
    SYM_OPT(cuMemcpy2DAsync, "cuMemcpy2DAsync_v2"),
    SYM(cuMemsetD8, "cuMemsetD8_v2"),
    SYM(cuMemsetD32, "cuMemsetD32_v2"),
    SYM(cuMemsetD8Async, "cuMemsetD8Async"),
    SYM(cuMemsetD32Async, "cuMemsetD32Async"),
    SYM_OPT(cuMemPoolCreate, "cuMemPoolCreate"),
    SYM_OPT(cuMemPoolDestroy, "cuMemPoolDestroy"),
    SYM_OPT(cuMemPoolSetAttribute, "cuMemPoolSetAttribute"),
    SYM_OPT(cuMemPoolGetAttribute, "cuMemPoolGetAttribute"),
    SYM_OPT(cuMemPoolTrimTo, "cuMemPoolTrimTo"),
    SYM_OPT(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync"),
    SYM_OPT(cuMemFreeAsync, "cuMemFreeAsync"),
    SYM(cuMemHostAlloc, "cuMemHostAlloc"),
    SYM(cuMemFreeHost, "cuMemFreeHost"),
    SYM(cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2"),
    SYM(cuMemHostRegister, "cuMemHostRegister_v2"),
    SYM(cuMemHostUnregister, "cuMemHostUnregister"),
    SYM(cuModuleLoadData, "cuModuleLoadData"),
    SYM(cuModuleUnload, "cuModuleUnload"),
    SYM(cuModuleGetFunction, "cuModuleGetFunction"),
    SYM(cuModuleGetGlobal, "cuModuleGetGlobal_v2"),
    SYM(cuFuncSetAttribute, "cuFuncSetAttribute"),
    SYM(cuFuncGetAttribute, "cuFuncGetAttribute"),
    SYM(cuLaunchKernel, "cuLaunchKernel"),
    SYM_OPT(cuOccupancyMaxActiveBlocksPerMultiprocessor,
            "cuOccupancyMaxActiveBlocksPerMultiprocessor"),
    SYM(cuStreamBeginCapture, "cuStreamBeginCapture_v2"),
    SYM(cuStreamEndCapture, "cuStreamEndCapture"),
    SYM(cuStreamIsCapturing, "cuStreamIsCapturing"),
    SYM(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags"),
    SYM(cuGraphLaunch, "cuGraphLaunch"),
    SYM(cuGraphExecDestroy, "cuGraphExecDestroy"),
    SYM(cuGraphDestroy, "cuGraphDestroy"),
};

static pthread_mutex_t driver_lock = PTHREAD_MUTEX_INITIALIZER;
static atlas_driver driver_table;
static int driver_attempted;         /* a load was tried (or a fake installed) */
static const atlas_driver *driver_loaded; /* &driver_table once usable */
static int driver_ver;
static atlas_status driver_status;   /* outcome of the attempt */
static char driver_reason[512];      /* why it failed */
static void *driver_lib;             /* never closed: the table points into it */
static double driver_t_loaded, driver_t_init; /* atlas_now_ms when opened and after cuInit */

/* POSIX guarantees that a dlsym'd void * converts to a function pointer. */
static void driver_set_field(const driver_symbol *s, void *fn) {
    memcpy((char *)&driver_table + s->offset, &fn, sizeof fn);
}

/* Finds one entry point: through cuGetProcAddress for the driver's version when it has one,
 * else by its exported versioned name. */
static void *driver_resolve(get_proc_fn get_proc, const driver_symbol *s, int version) {
    void *fn = NULL;
    if (get_proc) {
        int abi = version < ATLAS_DRIVER_ABI_VERSION ? version : ATLAS_DRIVER_ABI_VERSION;
        int found = -1;
        if (get_proc(s->name, &fn, abi, 0, &found) != ATLAS_CUDA_SUCCESS || found != 0)
            fn = NULL;
    }
    if (!fn) fn = dlsym(driver_lib, s->versioned);
    return fn;
}

static atlas_status driver_fail(const char *fmt, const char *a, const char *b) {
    snprintf(driver_reason, sizeof driver_reason, fmt, a, b);
    return atlas_fail(ATLAS_ERR_NO_DEVICE, "%s", driver_reason);
}

static atlas_status driver_open(void) {
    const char *path = getenv("ATLAS_LIBCUDA");
    if (!path || !path[0]) path = "libcuda.so.1";
    driver_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!driver_lib) {
        const char *err = dlerror();
        return driver_fail("%s%s", err ? err : path, err ? "" : ": cannot be loaded");
    }
    CUresult (*get_version)(int *) = (CUresult(*)(int *))dlsym(driver_lib, "cuDriverGetVersion");
    if (!get_version) return driver_fail("%s: no symbol %s (not a CUDA driver)", path,
                                         "cuDriverGetVersion");
    int version = 0;
    if (get_version(&version) != ATLAS_CUDA_SUCCESS || version <= 0)
        return driver_fail("%s: %s failed", path, "cuDriverGetVersion");
    if (version < ATLAS_DRIVER_MIN_VERSION) {
        char have[32], need[32];
        snprintf(have, sizeof have, "%d.%d", version / 1000, version % 1000 / 10);
        snprintf(need, sizeof need, "%d.%d", ATLAS_DRIVER_MIN_VERSION / 1000,
                 ATLAS_DRIVER_MIN_VERSION % 1000 / 10);
        return driver_fail("the CUDA driver supports CUDA %s; atlas needs %s or newer "
                           "(update the NVIDIA driver)", have, need);
    }
    get_proc_fn get_proc = (get_proc_fn)dlsym(driver_lib, "cuGetProcAddress_v2");
    for (size_t i = 0; i < sizeof driver_symbols / sizeof driver_symbols[0]; i++) {
        const driver_symbol *s = &driver_symbols[i];
        void *fn = driver_resolve(get_proc, s, version);
        if (!fn && !s->optional)
            return driver_fail("%s: driver API %s not found", path, s->name);
        driver_set_field(s, fn);
    }
    driver_ver = version;
    driver_t_loaded = atlas_now_ms();
    CUresult res = driver_table.cuInit(0);
    driver_t_init = atlas_now_ms();
    if (res != ATLAS_CUDA_SUCCESS) {
        const char *name = NULL;
        if (driver_table.cuGetErrorName(res, &name) != ATLAS_CUDA_SUCCESS || !name)
            name = "unknown error";
        return driver_fail(res == ATLAS_CUDA_ERROR_NO_DEVICE ? "no CUDA device (cuInit: %s%s)"
                                                             : "cuInit failed: %s%s",
                           name, "");
    }
    return ATLAS_OK;
}

atlas_status atlas_driver_load(const atlas_driver **out) {
    pthread_mutex_lock(&driver_lock);
    if (!driver_attempted) {
        driver_attempted = 1;
        driver_status = driver_open();
        if (driver_status == ATLAS_OK) driver_loaded = &driver_table;
    }
    atlas_status st = driver_status;
    pthread_mutex_unlock(&driver_lock);
    if (out) *out = driver_loaded;
    if (st != ATLAS_OK) return atlas_fail(st, "%s", driver_reason);
    return ATLAS_OK;
}

const atlas_driver *atlas_driver_get(void) { return driver_loaded; }

int atlas_driver_version(void) { return driver_loaded ? driver_ver : 0; }

void atlas_driver_times(double *loaded, double *init) {
    pthread_mutex_lock(&driver_lock);
    *loaded = driver_t_loaded;
    *init = driver_t_init;
    pthread_mutex_unlock(&driver_lock);
}

atlas_status atlas_driver_install_for_test(const atlas_driver *fake, int version) {
    pthread_mutex_lock(&driver_lock);
    atlas_status st = ATLAS_OK;
    if (driver_attempted) {
        st = atlas_fail(ATLAS_ERR_INVALID, "driver: a fake driver must be installed before "
                                           "the first use of the driver");
    } else {
        driver_table = *fake;
        driver_ver = version;
        driver_attempted = 1;
        driver_status = ATLAS_OK;
        driver_loaded = &driver_table;
    }
    pthread_mutex_unlock(&driver_lock);
    return st;
}

const char *atlas_cu_error_name(CUresult res) {
    static _Thread_local char unknown[32];
    const char *name = NULL;
    if (driver_loaded && driver_loaded->cuGetErrorName &&
        driver_loaded->cuGetErrorName(res, &name) == ATLAS_CUDA_SUCCESS && name)
        return name;
    snprintf(unknown, sizeof unknown, "CUDA_ERROR_%d", (int)res);
    return unknown;
}

/* CUDA's sticky errors: after one of these (a kernel's fault, an uncorrectable ECC error, a
 * launch that timed out) the context fails every later call, and only a new process can use
 * the GPU again; the first one seen is kept for /health and the metrics. */
static int cu_sticky(CUresult res) {
    switch ((int)res) {
    case 214: /* ECC_UNCORRECTABLE */
    case 700: /* ILLEGAL_ADDRESS */
    case 702: /* LAUNCH_TIMEOUT */
    case 710: /* ASSERT */
    case 714: /* HARDWARE_STACK_ERROR */
    case 715: /* ILLEGAL_INSTRUCTION */
    case 716: /* MISALIGNED_ADDRESS */
    case 717: /* INVALID_ADDRESS_SPACE */
    case 718: /* INVALID_PC */
    case 719: /* LAUNCH_FAILED */
        return 1;
    default:
        return 0;
    }
}

static pthread_mutex_t lost_lock = PTHREAD_MUTEX_INITIALIZER;
static int lost;             /* a sticky error was seen */
static char lost_msg[512];   /* the first one's message */

static atlas_status note_lost(atlas_status st) {
    pthread_mutex_lock(&lost_lock);
    if (!lost) {
        lost = 1;
        snprintf(lost_msg, sizeof lost_msg, "%s", atlas_last_error());
    }
    pthread_mutex_unlock(&lost_lock);
    return st;
}

int atlas_cu_lost(char *msg, size_t n) {
    pthread_mutex_lock(&lost_lock);
    int was = lost;
    if (msg && n) snprintf(msg, n, "%s", was ? lost_msg : "");
    pthread_mutex_unlock(&lost_lock);
    return was;
}

void atlas_cu_lost_clear_for_test(void) {
    pthread_mutex_lock(&lost_lock);
    lost = 0;
    lost_msg[0] = 0;
    pthread_mutex_unlock(&lost_lock);
}

atlas_status atlas_cu_check(CUresult res, const char *call, const char *file, int line) {
    if (res == ATLAS_CUDA_SUCCESS) return ATLAS_OK;
    /* "src/backend/cuda/registry.c" rather than the build machine's absolute path */
    const char *rel = strstr(file, "src/");
    if (!rel) rel = strstr(file, "tests/");
    if (!rel) rel = file;
    const char *text = NULL;
    if (!driver_loaded || !driver_loaded->cuGetErrorString ||
        driver_loaded->cuGetErrorString(res, &text) != ATLAS_CUDA_SUCCESS)
        text = NULL;
    atlas_status st = res == ATLAS_CUDA_ERROR_OUT_OF_MEMORY ? ATLAS_ERR_DEVICE_NOMEM
                                                            : ATLAS_ERR_DEVICE;
    if (text)
        st = atlas_fail(st, "%s failed: %s (%s) (%s:%d)", call, atlas_cu_error_name(res), text,
                        rel, line);
    else
        st = atlas_fail(st, "%s failed: %s (%s:%d)", call, atlas_cu_error_name(res), rel, line);
    return cu_sticky(res) ? note_lost(st) : st;
}

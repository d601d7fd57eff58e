/* parallel/preflight.c — what tensor parallelism across N processes needs on this machine,
 * checked before anything starts (the CLI's --tensor-parallel). See atlas/parallel.h. */
#include <stdio.h>

#include "atlas/parallel.h"
#include "backend/cuda/driver.h"
#include "core/error.h"
#include "parallel/nccl.h"

/* "N GPU(s)" or "no GPU (why)" into buf. */
static void probe_gpus(int want, char *buf, size_t cap) {
    const atlas_driver *drv = NULL;
    if (atlas_driver_load(&drv) != ATLAS_OK) {
        snprintf(buf, cap, "no GPU (%s)", atlas_last_error());
        return;
    }
    int count = 0;
    if (drv->cuDeviceGetCount(&count) != 0) count = 0;
    snprintf(buf, cap, "%d GPU(s)%s", count, count < want ? ", too few" : "");
}

/* "NCCL x.y.z (path)" or "no NCCL (why)" into buf. The library stays mapped either way. */
static void probe_nccl(char *buf, size_t cap) {
    atlas_nccl *nccl = NULL;
    if (atlas_nccl_open(NULL, &nccl) != ATLAS_OK) {
        snprintf(buf, cap, "no usable libnccl.so.2 (%s)", atlas_last_error());
        return;
    }
    int v = atlas_nccl_version(nccl);
    snprintf(buf, cap, "NCCL %d.%d.%d (%s)", v / 10000, v / 100 % 100, v % 100,
             atlas_nccl_path(nccl));
    atlas_nccl_close(nccl);
}

atlas_status atlas_tp_preflight(int world) {
    if (world == 1) return ATLAS_OK;
    if (world < 1 || world > 64)
        return atlas_fail(ATLAS_ERR_INVALID, "tensor parallel size %d (1..64)", world);
    char gpus[512], nccl[512];
    probe_gpus(world, gpus, sizeof gpus);
    probe_nccl(nccl, sizeof nccl);
    return atlas_fail(ATLAS_ERR_UNSUPPORTED, "tensor parallel size %d needs %d GPUs, "
                      "libnccl.so.2 and the rank processes, which are not wired into this "
                      "build yet (docs/TENSOR_PARALLEL.md); this machine has %s and %s",
                      world, world, gpus, nccl);
}

/* backend/cuda/backend_cuda.c — placeholder until the CUDA op table lands: reports that
 * the CUDA backend is not built, so that the engine falls back to the CPU. */
#include "backend/backend.h"
#include "core/error.h"

atlas_status atlas_backend_cuda_create(const atlas_backend_geom *geom, atlas_backend **out) {
    (void)geom;
    *out = NULL;
    return atlas_fail(ATLAS_ERR_NO_DEVICE, "CUDA backend: not built into this binary");
}

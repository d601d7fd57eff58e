/* atlas/parallel.h — tensor parallelism across processes (docs/TENSOR_PARALLEL.md).
 *
 * Thread safety: the function may be called from any thread. */
#ifndef ATLAS_PARALLEL_H
#define ATLAS_PARALLEL_H

#include "atlas/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether tensor parallelism over `world` GPUs can start here: ATLAS_OK for 1; above 1
 * ATLAS_ERR_UNSUPPORTED with one line saying what it needs (N GPUs, libnccl.so.2, the rank
 * processes, which are not wired yet) and what this machine has (the GPU count or why
 * there is none, the NCCL version or why it cannot be loaded). Loads the driver and NCCL
 * when world > 1 and keeps nothing of them. Owns nothing; call it before anything touches
 * a GPU. */
ATLAS_API atlas_status atlas_tp_preflight(int world);

#ifdef __cplusplus
}
#endif
#endif

/* backend/expand.h — the fused ops of the op table (backend.h), called the one way whatever
 * the backend: its own kernel when it has one, else the plain ops they stand for.  Internal.
 * model/forward.c states every fusion it wants through these. */
#ifndef ATLAS_BACKEND_EXPAND_H
#define ATLAS_BACKEND_EXPAND_H

#include "backend/backend.h"

atlas_status atlas_op_rmsnorm_matmul(atlas_backend *be, void *out, void *h, const void *x,
                                     const atlas_weight *norm, const atlas_weight *w,
                                     const atlas_weight *bias, int n, int d, int row0,
                                     const atlas_epilogue *epi);
atlas_status atlas_op_matmul_residual(atlas_backend *be, void *resid, void *tmp, const void *x,
                                      const atlas_weight *w, int n, int d);
atlas_status atlas_op_rope_kv_store(atlas_backend *be, void *qkv, atlas_kv *kv, int layer,
                                    int n);

#endif

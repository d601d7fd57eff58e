/* backend/expand.c — the fused ops of backend.h as plain ops, for a backend without a kernel
 * of its own for one (the CPU: the same float operations in the same order as the plain ops,
 * so the results are bit-identical to calling those). */
#include "backend/expand.h"

#include "core/error.h"

atlas_status atlas_op_rmsnorm_matmul(atlas_backend *be, void *out, void *h, const void *x,
                                     const atlas_weight *norm, const atlas_weight *w,
                                     const atlas_weight *bias, int n, int d, int row0,
                                     const atlas_epilogue *epi) {
    const atlas_backend_ops *op = be->ops;
    if (op->rmsnorm_matmul) return op->rmsnorm_matmul(be, out, h, x, norm, w, bias, n, d, row0, epi);
    if (norm) ATLAS_TRY(op->rmsnorm(be, h, x, norm, n, d));
    const char *in = (const char *)h + (size_t)row0 * d * be->act_size;
    ATLAS_TRY(op->matmul(be, out, in, w, bias, n));
    switch (epi ? epi->kind : ATLAS_EPI_NONE) {
    case ATLAS_EPI_NONE:
        return ATLAS_OK;
    case ATLAS_EPI_SWIGLU:
        return op->swiglu(be, epi->act, out, n, epi->f);
    case ATLAS_EPI_ROPE_KV:
        ATLAS_TRY(op->rope(be, out, n, epi->layer));
        return op->kv_store(be, out, epi->kv, epi->layer);
    case ATLAS_EPI_GLU:
        if (!op->glu)
            return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s backend: no gated activation but "
                              "SwiGLU (run with --device cpu)", op->name);
        return op->glu(be, epi->act, out, n, epi->f);
    }
    return atlas_fail(ATLAS_ERR_INTERNAL, "rmsnorm_matmul: epilogue %d", (int)epi->kind);
}

atlas_status atlas_op_matmul_residual(atlas_backend *be, void *resid, void *tmp, const void *x,
                                      const atlas_weight *w, int n, int d) {
    const atlas_backend_ops *op = be->ops;
    if (op->matmul_residual) return op->matmul_residual(be, resid, tmp, x, w, n, d);
    ATLAS_TRY(op->matmul(be, tmp, x, w, NULL, n));
    return op->add(be, resid, tmp, n, d);
}

atlas_status atlas_op_rope_kv_store(atlas_backend *be, void *qkv, atlas_kv *kv, int layer,
                                    int n) {
    const atlas_backend_ops *op = be->ops;
    if (op->rope_kv_store) return op->rope_kv_store(be, qkv, kv, layer, n);
    ATLAS_TRY(op->rope(be, qkv, n, layer));
    return op->kv_store(be, qkv, kv, layer);
}

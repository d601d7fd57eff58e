/* model/experts_oss.h — gpt-oss's experts as published, turned into atlas's stacked expert
 * weights (backend.h moe_experts).  Internal to src/model (weights.c binds them).
 *
 * A layer's E experts are four stacked tensors under model.layers.L.mlp.experts.:
 * - bf16 (or any float dtype): gate_up_proj [E, d, 2f] and down_proj [E, f, d], each expert's
 *   matrix [in, out] (transformers computes x @ W), gate and up interleaved as the even and
 *   odd output columns;
 * - MXFP4 (quantization_config mxfp4): gate_up_proj_blocks [E, 2f, d/32, 16] and
 *   gate_up_proj_scales [E, 2f, d/32], down_proj_blocks [E, d, f/32, 16] and
 *   down_proj_scales [E, d, f/32]: [out, in] rows of e2m1 codes, the even column in a byte's
 *   low nibble, one e8m0 scale per 32 (transformers' convert_moe_packed_tensors), the
 *   gate_up rows interleaved likewise;
 * - either way gate_up_proj_bias [E, 2f] (interleaved) and down_proj_bias [E, d].
 * Each expert becomes one part of each stacked weight, as [out, in]: its gate rows, then its
 * up rows (de-interleaved here, so that the expert matmul and the GLU stay the ones every
 * family runs), and its down rows; the biases likewise. The parts' bytes are copies made
 * here (read with pread, never from the mapping), owned until atlas_oss_experts_free. */
#ifndef ATLAS_MODEL_EXPERTS_OSS_H
#define ATLAS_MODEL_EXPERTS_OSS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "atlas/status.h"
#include "backend/backend.h"
#include "format/safetensors.h"
#include "model/config.h"

/* The four stacked weights of a layer, in this order. */
typedef enum atlas_oss_part {
    ATLAS_OSS_GATE_UP, ATLAS_OSS_GATE_UP_BIAS, ATLAS_OSS_DOWN, ATLAS_OSS_DOWN_BIAS, ATLAS_OSS_N
} atlas_oss_part;

typedef struct atlas_oss_experts {
    int E;
    int64_t d, f;
    bool mxfp4;
    /* found: per part, the tensor (MXFP4: the blocks) and the scales (MXFP4 matrices only) */
    const atlas_tensor_view *v[ATLAS_OSS_N], *scales[ATLAS_OSS_N];
    size_t file_bytes[ATLAS_OSS_N]; /* bytes in the files, scales included */
    int64_t params[ATLAS_OSS_N];    /* weights (elements) each part holds */
    char format[ATLAS_OSS_N][48];   /* "BF16", "MXFP4 e2m1 group 32" */
    /* read: E sources a part (srcs[p * E + e]), pointing into owned bytes */
    void *bytes[ATLAS_OSS_N];
    float *fscales[ATLAS_OSS_N];
    atlas_wquant *q;                /* [2E] MXFP4: gate_up's, then down's */
    atlas_weight_src *srcs;         /* [4E] */
    const atlas_weight_src **sp;    /* [4E] */
} atlas_oss_experts;

/* Finds and checks layer `layer`'s expert tensors (names under pre, e.g. "model."), their
 * shapes and dtypes for cfg, marking each found in used[atlas_st_index] (used may be NULL);
 * reads nothing. MXFP4 when gate_up_proj_blocks is there, which needs quantization_config
 * mxfp4. Errors name the tensor. */
atlas_status atlas_oss_experts_find(const atlas_st *st, const atlas_config *cfg,
                                    const char *pre, int layer, bool *used,
                                    atlas_oss_experts *out);
/* Reads what find found into its per-expert sources: x->sp + p * x->E are part p's E. */
atlas_status atlas_oss_experts_read(atlas_oss_experts *x);
void atlas_oss_experts_free(atlas_oss_experts *x);

#endif

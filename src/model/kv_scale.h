/* model/kv_scale.h — an FP8 KV cache's per-layer scales as a checkpoint publishes them, and
 * the KV cache types' names.  Internal to src/model. */
#ifndef ATLAS_MODEL_KV_SCALE_H
#define ATLAS_MODEL_KV_SCALE_H

#include "atlas/status.h"
#include "format/safetensors.h"

/* Whether name is one of the scalar K / V scale tensors of an FP8 KV cache, in any of the
 * spellings atlas_kv_scales_read looks for: model.layers.N.self_attn.k_scale (llm-compressor,
 * vLLM), .self_attn.k_proj.k_scale (ModelOpt), .self_attn.k_proj.output_scale (older
 * llm-compressor), and v for V, of a layer below n_layers (one of a layer the model lacks is
 * a stray tensor). They are read here, not bound as weights (model/weights.c). */
int atlas_kv_scale_name(const char *name, int n_layers);

/* out[2 * n_layers]: layer l's K scale at 2l and V scale at 2l + 1, from st's tensors, 1.0
 * where a layer has none (as vLLM). *found: the scale tensors read. A scale must be one
 * element of F32, BF16 or F16, finite and above 0: anything else is ATLAS_ERR_FORMAT naming
 * the tensor, as are two spellings of one layer's scale. */
atlas_status atlas_kv_scales_read(const atlas_st *st, int n_layers, float *out, int *found);

#endif

/* model/inspect.h — what a load will take, known before it reads a weight: the KV cache's
 * size at given params and the check of weights plus KV against the memory the backend
 * has.  Internal to src/model (model.c's load and atlas_model_inspect call it). */
#ifndef ATLAS_MODEL_INSPECT_H
#define ATLAS_MODEL_INSPECT_H

#include <stdbool.h>
#include <stddef.h>

#include "atlas/model.h"
#include "model/config.h"

/* Blocks of the paged KV cache a load with p makes (p->kv_blocks, else enough for
 * p->kv_tokens, else for min(max_position, 4096) tokens). */
int atlas_model_kv_blocks_for(const atlas_config *c, const atlas_model_params *p);

/* What act means on this machine's CPU: AUTO resolved by its features, any other as it is. */
atlas_cpu_activations atlas_model_cpu_act(atlas_cpu_activations act);

/* Bytes of a KV cache element as the backend stores it: 1 for FP8 and 2 for bf16 where kv
 * asks for them; under AUTO bf16 on CUDA, and on the CPU with bf16 or int8 activations (as a
 * GPU keeps it); fp32 on the CPU's reference path. */
size_t atlas_model_kv_elem(bool cuda, atlas_cpu_activations act, atlas_kv_dtype kv);

/* Bytes of KV cache for blocks of block_size tokens, n_kv_heads of them (a rank's), elem
 * bytes an element (atlas_model_kv_elem). */
size_t atlas_model_kv_bytes_for(const atlas_config *c, int n_kv_heads, int blocks,
                                int block_size, size_t elem);

/* What the backend has now: the GPU's free memory, or the machine's (core/meminfo.h).
 * 0 and what "" when it cannot be known. */
void atlas_model_memory_room(bool cuda, int gpu, size_t *avail, char *what, size_t cap);

/* ATLAS_ERR_NOMEM (CPU) or ATLAS_ERR_DEVICE_NOMEM (CUDA), naming both figures, when weights
 * + kv exceed what the backend has and skip is 0; ATLAS_OK otherwise (and when the room
 * cannot be known). */
atlas_status atlas_model_memory_check(bool cuda, int gpu, size_t weights, size_t kv, int skip);

/* atlas_model_inspect (include/atlas/model.h) for params p (not NULL). */
atlas_status atlas_model_survey_dir(const char *dir, const atlas_model_params *p,
                                    atlas_model_survey *out);

#endif

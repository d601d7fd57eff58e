/* model/config_moe.h — a mixture-of-experts config's fields (Qwen3-MoE, Mixtral, gpt-oss).
 * Internal to src/model (config.c reads them with the rest of config.json). */
#ifndef ATLAS_MODEL_CONFIG_MOE_H
#define ATLAS_MODEL_CONFIG_MOE_H

#include <jansson.h>

#include "atlas/status.h"
#include "model/config.h"

/* Sets cfg's experts and which layers are MoE layers, with the defaults of transformers'
 * Qwen3MoeConfig and MixtralConfig; leaves a dense family's config without experts. Needs
 * cfg->arch, n_layers and intermediate. Errors name file and field. */
atlas_status atlas_config_read_moe(const char *file, json_t *root, atlas_config *cfg);

/* GptOssConfig's RoPE when config.json gives none: YaRN, factor 32 over 4096 positions,
 * beta_fast 32, beta_slow 1, not truncated, rope_theta 150000 (a top-level rope_theta, read
 * after, wins). */
void atlas_config_gpt_oss_rope(atlas_rope *r);

#endif

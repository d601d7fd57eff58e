/* model/config_moe.c — see config_moe.h.
 *
 * Qwen3MoeConfig: num_experts 128 (num_local_experts, its attribute_map's other name, when
 * absent), num_experts_per_tok 8, moe_intermediate_size 768, norm_topk_prob false; layer l
 * is a MoE layer unless it is in mlp_only_layers, when num_experts > 0 and (l + 1) is a
 * multiple of decoder_sparse_step (1), as Qwen3MoeDecoderLayer decides; the others keep the
 * dense MLP of intermediate_size. MixtralConfig: num_local_experts 8, num_experts_per_tok 2,
 * every layer a MoE layer of intermediate_size experts, the top two renormalised.
 * GptOssConfig: num_local_experts 128, num_experts_per_tok 4 (the original release's
 * experts_per_token, when present, must agree), every layer a MoE layer of
 * intermediate_size experts, swiglu_alpha 1.702 and swiglu_limit 7.0, biases on the router
 * and the experts, sinks in attention.
 * router_aux_loss_coef, output_router_logits and router_jitter_noise are training's and
 * change nothing here. */
#include "model/config_moe.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"

/* An integer field in [lo, hi]; *out left alone when absent or null. */
static atlas_status moe_int(const char *file, json_t *root, const char *key, int lo, int hi,
                            int *out) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return ATLAS_OK;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return atlas_fail(json_is_integer(v) ? ATLAS_ERR_RANGE : ATLAS_ERR_FORMAT,
                          "%s: field \"%s\": expected an integer in [%d, %d]", file, key, lo,
                          hi);
    *out = (int)json_integer_value(v);
    return ATLAS_OK;
}

/* mlp_only_layers: the layers that keep the dense MLP (an index past the last layer names
 * none, as in transformers). */
static atlas_status dense_layers(const char *file, json_t *root, atlas_config *cfg) {
    json_t *v = json_object_get(root, "mlp_only_layers");
    if (!v || json_is_null(v)) return ATLAS_OK;
    if (!json_is_array(v))
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: field \"mlp_only_layers\": expected a list "
                          "of layer indices", file);
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0)
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: field \"mlp_only_layers[%zu]\": expected "
                              "a layer index", file, i);
        if (json_integer_value(e) < cfg->n_layers) cfg->layer_moe[json_integer_value(e)] = 0;
    }
    return ATLAS_OK;
}

static atlas_status read_qwen3_moe(const char *file, json_t *root, atlas_config *cfg) {
    int step = 1;
    cfg->n_experts = 128, cfg->n_experts_used = 8, cfg->expert_ffn = 768;
    const char *key = json_object_get(root, "num_experts") ? "num_experts" : "num_local_experts";
    ATLAS_TRY(moe_int(file, root, key, 0, ATLAS_MAX_EXPERTS, &cfg->n_experts));
    ATLAS_TRY(moe_int(file, root, "num_experts_per_tok", 1, ATLAS_MAX_EXPERTS_USED,
                      &cfg->n_experts_used));
    ATLAS_TRY(moe_int(file, root, "moe_intermediate_size", 1, 1 << 24, &cfg->expert_ffn));
    ATLAS_TRY(moe_int(file, root, "decoder_sparse_step", 1, 1 << 30, &step));
    json_t *norm = json_object_get(root, "norm_topk_prob");
    if (norm && !json_is_null(norm) && !json_is_boolean(norm))
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: field \"norm_topk_prob\": expected a boolean",
                          file);
    cfg->moe_norm_topk = json_is_true(norm);
    for (int l = 0; l < cfg->n_layers; l++)
        cfg->layer_moe[l] = cfg->n_experts > 0 && (l + 1) % step == 0;
    ATLAS_TRY(dense_layers(file, root, cfg));
    if (cfg->n_experts == 0) cfg->n_experts_used = 0, cfg->expert_ffn = 0;
    return ATLAS_OK;
}

static atlas_status read_mixtral(const char *file, json_t *root, atlas_config *cfg) {
    cfg->n_experts = 8, cfg->n_experts_used = 2, cfg->expert_ffn = cfg->intermediate;
    cfg->moe_norm_topk = true;
    ATLAS_TRY(moe_int(file, root, "num_local_experts", 1, ATLAS_MAX_EXPERTS, &cfg->n_experts));
    ATLAS_TRY(moe_int(file, root, "num_experts_per_tok", 1, ATLAS_MAX_EXPERTS_USED,
                      &cfg->n_experts_used));
    for (int l = 0; l < cfg->n_layers; l++) cfg->layer_moe[l] = 1;
    return ATLAS_OK;
}

/* A positive finite number; *out left alone when absent or null. */
static atlas_status moe_num(const char *file, json_t *root, const char *key, double *out) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return ATLAS_OK;
    if (!json_is_number(v) || !(json_number_value(v) > 0) || !isfinite(json_number_value(v)))
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: field \"%s\": expected a positive number",
                          file, key);
    *out = json_number_value(v);
    return ATLAS_OK;
}

static atlas_status read_gpt_oss(const char *file, json_t *root, atlas_config *cfg) {
    int alias = 0;
    cfg->n_experts = 128, cfg->n_experts_used = 4, cfg->expert_ffn = cfg->intermediate;
    cfg->moe_topk_softmax = cfg->moe_bias = cfg->attn_sinks = true;
    cfg->swiglu_alpha = 1.702, cfg->swiglu_limit = 7.0;
    ATLAS_TRY(moe_int(file, root, "num_local_experts", 1, ATLAS_MAX_EXPERTS, &cfg->n_experts));
    ATLAS_TRY(moe_int(file, root, "num_experts_per_tok", 1, ATLAS_MAX_EXPERTS_USED,
                      &cfg->n_experts_used));
    alias = cfg->n_experts_used;
    ATLAS_TRY(moe_int(file, root, "experts_per_token", 1, ATLAS_MAX_EXPERTS_USED, &alias));
    if (alias != cfg->n_experts_used)
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: fields \"experts_per_token\" (%d) and "
                          "\"num_experts_per_tok\" (%d) disagree", file, alias,
                          cfg->n_experts_used);
    ATLAS_TRY(moe_num(file, root, "swiglu_alpha", &cfg->swiglu_alpha));
    ATLAS_TRY(moe_num(file, root, "swiglu_limit", &cfg->swiglu_limit));
    for (int l = 0; l < cfg->n_layers; l++) cfg->layer_moe[l] = 1;
    return ATLAS_OK;
}

void atlas_config_gpt_oss_rope(atlas_rope *r) {
    r->type = ATLAS_ROPE_YARN;
    r->theta = 150000.0, r->factor = 32.0, r->beta_fast = 32.0, r->beta_slow = 1.0;
    r->truncate = false, r->original_max_position = 4096;
}

atlas_status atlas_config_read_moe(const char *file, json_t *root, atlas_config *cfg) {
    cfg->n_experts = cfg->n_experts_used = cfg->expert_ffn = 0;
    cfg->moe_norm_topk = cfg->moe_topk_softmax = cfg->moe_bias = cfg->attn_sinks = false;
    memset(cfg->layer_moe, 0, sizeof cfg->layer_moe);
    if (cfg->arch == ATLAS_ARCH_QWEN3_MOE) ATLAS_TRY(read_qwen3_moe(file, root, cfg));
    else if (cfg->arch == ATLAS_ARCH_MIXTRAL) ATLAS_TRY(read_mixtral(file, root, cfg));
    else if (cfg->arch == ATLAS_ARCH_GPT_OSS) ATLAS_TRY(read_gpt_oss(file, root, cfg));
    else return ATLAS_OK;
    if (cfg->n_experts_used > cfg->n_experts)
        return atlas_fail(ATLAS_ERR_RANGE, "%s: field \"num_experts_per_tok\": %d experts a "
                          "token of %d", file, cfg->n_experts_used, cfg->n_experts);
    return ATLAS_OK;
}

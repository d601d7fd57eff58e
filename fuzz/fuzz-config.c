/* fuzz/fuzz-config.c — libFuzzer target for config.json and generation_config.json parsing
 * and the RoPE frequencies of whatever config parses. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    atlas_config cfg;
    if (atlas_config_parse((const char *)data, size, "fuzz/config.json", &cfg) != ATLAS_OK)
        return 0;
    if (cfg.head_dim <= 0 || cfg.head_dim % 2 || cfg.n_heads % cfg.n_kv_heads) abort();
    if (cfg.n_eos < 0 || cfg.n_eos > ATLAS_MAX_EOS) abort();
    double *inv = malloc((size_t)cfg.head_dim / 2 * sizeof *inv);
    if (!inv) return 0;
    double attn;
    atlas_rope_inv_freq(&cfg, inv, &attn);
    free(inv);
    for (int l = 0; l < cfg.n_layers; l++) (void)atlas_config_layer_sliding(&cfg, l);
    /* The same bytes as a generation_config.json merged into it. */
    (void)atlas_config_parse_generation((const char *)data, size, "fuzz/generation_config.json",
                                        &cfg);
    if (cfg.n_eos < 0 || cfg.n_eos > ATLAS_MAX_EOS) abort();
    return 0;
}

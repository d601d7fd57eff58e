/* fuzz/fuzz-config.c — libFuzzer target for config.json and generation_config.json parsing
 * and the RoPE frequencies of whatever config parses: rope_scaling and rope_parameters of
 * every type (default, linear, llama3, yarn accepted; dynamic, longrope and per-layer-type
 * blocks refused), quantization_config blocks (not read: the corpus keeps them so that a
 * reader added later is fuzzed at once), hidden_act. An accepted config's frequencies must
 * not be NaN or negative, its attention factor must be positive, and the context it derives
 * must be 1..INT32_MAX (a factor of 1e30 is refused at parse, not converted). */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "model/config.h"
#include "model/rope.h"

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
    /* Absurd magnitudes (rope_theta 1e300, factor 1e-300) may round to 0 or inf in float;
     * a NaN or a negative frequency is a bug whatever the input. */
    for (int i = 0; i < cfg.head_dim / 2; i++)
        if (!(inv[i] >= 0)) abort();
    if (!(attn > 0)) abort();
    free(inv);
    long ctx = atlas_config_max_context(&cfg);
    if (ctx < 1 || ctx > INT32_MAX) abort();
    for (int l = 0; l < cfg.n_layers; l++) (void)atlas_config_layer_sliding(&cfg, l);
    /* The same bytes as a generation_config.json merged into it. */
    (void)atlas_config_parse_generation((const char *)data, size, "fuzz/generation_config.json",
                                        &cfg);
    if (cfg.n_eos < 0 || cfg.n_eos > ATLAS_MAX_EOS) abort();
    return 0;
}

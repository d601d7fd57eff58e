/* tests/test-engine-budget.c — what a step's prompt tokens cost (engine/budget.h), on the
 * config.json files of Llama 3.1 8B and of a Gemma 3 with sliding layers, read by the
 * engine's own config loader: a chunk from position 0 costs its tokens, one deep in a long
 * prompt its attention too, by the FLOPs counted here independently. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/budget.h"
#include "harness.h"

static void write_config(const char *dir, const char *json) {
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(json, f);
    fclose(f);
}

static int load(const char *json, atlas_config *cfg) {
    char dir[256];
    if (!harness_mkdtemp(dir, sizeof dir, "budget")) return 0;
    write_config(dir, json);
    atlas_status st = atlas_config_load(dir, cfg);
    CHECK_MSG(st == ATLAS_OK, "config: %s", atlas_last_error());
    harness_rm_rf(dir);
    return st == ATLAS_OK;
}

static void llama_8b(void) {
    atlas_config cfg;
    if (!load("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 4096, "
              "\"intermediate_size\": 14336, \"num_hidden_layers\": 32, "
              "\"num_attention_heads\": 32, \"num_key_value_heads\": 8, \"vocab_size\": 128256, "
              "\"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-5, "
              "\"rope_theta\": 500000.0, \"torch_dtype\": \"bfloat16\"}", &cfg))
        return;
    atlas_step_cost c;
    atlas_step_cost_init(&c, &cfg);
    /* per layer: q, k, v, o and gate, up, down; 4 x 32 heads x 128 FLOPs a key a layer */
    double params = 32.0 * (4096.0 * (32 + 16) * 128 + 32 * 128 * 4096.0 + 3 * 4096.0 * 14336);
    double r = 4.0 * 32 * 128 * 32 / (2 * params);
    CHECK_MSG(fabs(c.full / r - 1) < 1e-9 && c.window == 0, "full %g (want %g), window %g",
              c.full, r, c.window);
    CHECK(atlas_step_cost_of(&c, 0, 512) == 512);
    CHECK(atlas_step_cost_take(&c, 0, 2000, 512) == 512);
    CHECK(atlas_step_cost_take(&c, 0, 100, 512) == 100);
    /* 32k tokens in, a token's attention is as much again as its matmuls (r ~ 3.8e-5 a key) */
    int p = 32768 - 512, take = atlas_step_cost_take(&c, p, 2000, 512);
    CHECK_MSG(take == (int)(512 / (1 + r * p)) && take > 200 && take < 260, "take %d", take);
    CHECK(atlas_step_cost_of(&c, p, take) <= 512 && atlas_step_cost_of(&c, p, take + 1) > 512);
    CHECK(atlas_step_cost_take(&c, p, 2000, 1.5) == 0);         /* not one token fits */
    CHECK(atlas_step_cost_take(&c, p, 0, 512) == 0);
}

/* Gemma 3's pattern: five sliding layers of a 512-token window, then a global one. */
static void gemma3_sliding(void) {
    atlas_config cfg;
    if (!load("{\"architectures\": [\"Gemma3ForCausalLM\"], \"hidden_size\": 1152, "
              "\"intermediate_size\": 6912, \"num_hidden_layers\": 26, "
              "\"num_attention_heads\": 4, \"num_key_value_heads\": 1, \"head_dim\": 256, "
              "\"vocab_size\": 262144, \"max_position_embeddings\": 32768, "
              "\"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0, \"rope_local_base_freq\": 10000.0, "
              "\"sliding_window\": 512, \"sliding_window_pattern\": 6, "
              "\"query_pre_attn_scalar\": 256, \"torch_dtype\": \"bfloat16\"}", &cfg))
        return;
    atlas_step_cost c;
    atlas_step_cost_init(&c, &cfg);
    int n_window = 0;
    for (int l = 0; l < 26; l++) n_window += atlas_config_layer_sliding(&cfg, l);
    CHECK_MSG(n_window == 22, "%d sliding layers", n_window); /* every sixth is global */
    CHECK_MSG(fabs(c.window / c.full - 22.0 / 4) < 1e-9, "window %g, full %g", c.window, c.full);
    /* past the window the sliding layers stop adding: cost grows with the 4 global ones */
    double a = atlas_step_cost_of(&c, 1000, 1), b = atlas_step_cost_of(&c, 9000, 1);
    CHECK_MSG(fabs((b - a) - c.full * 8000) < 1e-9, "%g %g", a, b);
    CHECK(fabs(atlas_step_cost_of(&c, 512, 1) - (1 + (c.full + c.window) * 512)) < 1e-9);
}

int main(void) {
    llama_8b();
    gemma3_sliding();
    return harness_finish();
}

/* engine/budget.c — a step's token costs (see budget.h). */
#include "engine/budget.h"

/* Matmul parameters a token passes through (its layers' projections and the experts it is
 * routed to; the embedding row and the lm_head, which a prompt chunk computes for one
 * token, are left out). */
static double active_params(const atlas_config *cfg) {
    double d = cfg->hidden, hd = cfg->head_dim;
    double attn = d * (cfg->n_heads + 2.0 * cfg->n_kv_heads) * hd + cfg->n_heads * hd * d;
    double mlp = cfg->n_experts > 0
                     ? cfg->n_experts_used * 3.0 * d * cfg->expert_ffn + d * cfg->n_experts
                     : 3.0 * d * cfg->intermediate;
    return cfg->n_layers * (attn + mlp);
}

void atlas_step_cost_init(atlas_step_cost *c, const atlas_config *cfg) {
    double per_layer = 4.0 * cfg->n_heads * cfg->head_dim, tok = 2.0 * active_params(cfg);
    int n_window = 0;
    for (int l = 0; l < cfg->n_layers; l++) n_window += atlas_config_layer_sliding(cfg, l);
    c->full = tok > 0 ? per_layer * (cfg->n_layers - n_window) / tok : 0;
    c->window = tok > 0 ? per_layer * n_window / tok : 0;
    c->sliding_window = cfg->sliding_window;
}

/* A token's cost at position p: one, and its attention over the p keys before its chunk
 * (within the chunk the keys are the chunk's own, which a step of short prompts pays too). */
static double per_token(const atlas_step_cost *c, int p) {
    int w = c->sliding_window && p > c->sliding_window ? c->sliding_window : p;
    return 1.0 + c->full * p + c->window * w;
}

double atlas_step_cost_of(const atlas_step_cost *c, int p, int n) {
    return n * per_token(c, p);
}

int atlas_step_cost_take(const atlas_step_cost *c, int p, int n, double budget) {
    double t = budget / per_token(c, p);
    return t >= n ? n : (int)t;
}

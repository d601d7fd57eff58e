/* model/rope.h — RoPE inverse frequencies from a config's rope parameters (default, linear,
 * dynamic, yarn, llama3, longrope), as transformers' modeling_rope_utils.py computes them.
 * Internal. */
#ifndef ATLAS_MODEL_ROPE_H
#define ATLAS_MODEL_ROPE_H

#include <stdbool.h>

#include "model/config.h"

/* RoPE inverse frequencies for the config's rope type: inv_freq[rope_dim/2], and the factor
 * by which cos/sin are scaled (yarn's attention factor; 1 otherwise). Matches transformers'
 * ROPE_INIT_FUNCTIONS: the values are float32's (never the weights' dtype); the backends take
 * each angle as the float32 product inv_freq * position, as transformers does. */
void atlas_rope_inv_freq(const atlas_config *cfg, double *inv_freq, double *attn_factor);
/* The same for cfg->rope_local; returns false (nothing written) without one. */
bool atlas_rope_inv_freq_local(const atlas_config *cfg, double *inv_freq, double *attn_factor);
/* longrope's second set (long_factor), inv_freq[rope_dim/2]; returns false (nothing written)
 * for the other types. atlas_rope_inv_freq gives the short set; both share its factor. */
bool atlas_rope_inv_freq_long(const atlas_config *cfg, double *inv_freq);

#endif

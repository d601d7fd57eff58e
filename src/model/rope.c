/* model/rope.c — see rope.h. */
#include "model/rope.h"

#include <math.h>
#include <stdbool.h>

/* RoPE inverse frequencies (transformers' modeling_rope_utils.py):
 * transformers computes these in float32 whatever the weights' dtype and keeps them so; we
 * compute in double and round the result to float32 once (an ulp from its chain of float32
 * operations at most). */

static double yarn_get_mscale(double scale, double mscale) {
    return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

static double yarn_correction_dim(double rotations, int dim, double base, double max_pos) {
    return (dim * log(max_pos / (rotations * 2 * M_PI))) / (2 * log(base));
}

static void rope_yarn(const atlas_rope *r, int dim, double *inv, double *attn) {
    double factor = r->factor;
    if (r->attention_factor != 0)
        *attn = r->attention_factor;
    else if (r->mscale != 0 && r->mscale_all_dim != 0)
        *attn = yarn_get_mscale(factor, r->mscale) / yarn_get_mscale(factor, r->mscale_all_dim);
    else
        *attn = yarn_get_mscale(factor, 1.0);
    double low = yarn_correction_dim(r->beta_fast, dim, r->theta, r->original_max_position);
    double high = yarn_correction_dim(r->beta_slow, dim, r->theta, r->original_max_position);
    if (r->truncate) {
        low = floor(low);
        high = ceil(high);
    }
    if (low < 0) low = 0;
    if (high > dim - 1) high = dim - 1;
    if (low == high) high += 0.001; /* as transformers: avoid dividing by zero */
    for (int i = 0; i < dim / 2; i++) {
        double pos_freq = pow(r->theta, (double)(2 * i) / dim);
        double ramp = ((double)i - low) / (high - low);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double extrap = 1.0 - ramp; /* weight of the unscaled frequency */
        inv[i] = (1.0 / (factor * pos_freq)) * (1 - extrap) + (1.0 / pos_freq) * extrap;
    }
}

static void rope_llama3(const atlas_rope *r, int dim, double *inv) {
    double old_ctx = r->original_max_position;
    double low_wavelen = old_ctx / r->low_freq_factor;
    double high_wavelen = old_ctx / r->high_freq_factor;
    for (int i = 0; i < dim / 2; i++) {
        double f = inv[i];
        double wavelen = 2 * M_PI / f;
        if (wavelen > low_wavelen) {
            inv[i] = f / r->factor;
        } else if (wavelen >= high_wavelen) {
            double smooth = (old_ctx / wavelen - r->low_freq_factor) /
                            (r->high_freq_factor - r->low_freq_factor);
            inv[i] = (1 - smooth) * f / r->factor + smooth * f;
        }
    }
}

static void rope_longrope(const atlas_rope *r, const double *ext, int dim, double *inv) {
    for (int i = 0; i < dim / 2; i++)
        inv[i] = 1.0 / (ext[i] * pow(r->theta, (double)(2 * i) / dim));
}

bool atlas_rope_inv_freq_long(const atlas_config *cfg, double *inv_freq) {
    if (cfg->rope.type != ATLAS_ROPE_LONGROPE) return false;
    int dim = cfg->rope_dim;
    rope_longrope(&cfg->rope, cfg->rope.long_factor, dim, inv_freq);
    for (int i = 0; i < dim / 2; i++) inv_freq[i] = (float)inv_freq[i];
    return true;
}

static void inv_freq_of(const atlas_rope *r, int dim, double *inv_freq, double *attn_factor) {
    double attn = 1.0;
    if (r->type == ATLAS_ROPE_LONGROPE) {
        rope_longrope(r, r->short_factor, dim, inv_freq);
        attn = r->attention_factor;
    } else if (r->type == ATLAS_ROPE_YARN) {
        rope_yarn(r, dim, inv_freq, &attn);
    } else {
        for (int i = 0; i < dim / 2; i++)
            inv_freq[i] = 1.0 / pow(r->theta, (double)(2 * i) / dim);
        if (r->type == ATLAS_ROPE_LINEAR)
            for (int i = 0; i < dim / 2; i++) inv_freq[i] /= r->factor;
        else if (r->type == ATLAS_ROPE_LLAMA3)
            rope_llama3(r, dim, inv_freq);
    }
    for (int i = 0; i < dim / 2; i++) inv_freq[i] = (float)inv_freq[i];
    if (attn_factor) *attn_factor = attn;
}

void atlas_rope_inv_freq(const atlas_config *cfg, double *inv_freq, double *attn_factor) {
    inv_freq_of(&cfg->rope, cfg->rope_dim ? cfg->rope_dim : cfg->head_dim, inv_freq,
                attn_factor);
}

bool atlas_rope_inv_freq_local(const atlas_config *cfg, double *inv_freq, double *attn_factor) {
    if (!cfg->has_rope_local) return false;
    inv_freq_of(&cfg->rope_local, cfg->rope_dim ? cfg->rope_dim : cfg->head_dim, inv_freq,
                attn_factor);
    return true;
}

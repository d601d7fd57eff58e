/* model/kv_scale.c — see kv_scale.h. */
#include "model/kv_scale.h"

#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "atlas/model.h"
#include "core/dtype.h"
#include "core/error.h"

/* The spellings of layer %d's scale of k or v, as kv_scale.h lists them. */
static const char *const SPELLINGS[] = {
    "model.layers.%d.self_attn.%c_scale",
    "model.layers.%d.self_attn.%c_proj.%c_scale",
    "model.layers.%d.self_attn.%c_proj.output_scale",
};
static const char *const PATTERNS[] = {
    "model.layers.*.self_attn.[kv]_scale",
    "model.layers.*.self_attn.k_proj.k_scale",
    "model.layers.*.self_attn.v_proj.v_scale",
    "model.layers.*.self_attn.[kv]_proj.output_scale",
};

int atlas_kv_scale_name(const char *name, int n_layers) {
    int layer = -1;
    for (size_t i = 0; i < sizeof PATTERNS / sizeof PATTERNS[0]; i++)
        if (fnmatch(PATTERNS[i], name, 0) == 0 && sscanf(name, "model.layers.%d.", &layer) == 1)
            return layer >= 0 && layer < n_layers;
    return 0;
}

static atlas_status read_scalar(const atlas_tensor_view *v, float *out) {
    int64_t n = 1;
    for (int i = 0; i < v->n_dims; i++) n *= v->shape[i];
    size_t es = atlas_dtype_size(v->dtype);
    if (n != 1 || (v->dtype != ATLAS_DTYPE_F32 && v->dtype != ATLAS_DTYPE_BF16 &&
                   v->dtype != ATLAS_DTYPE_F16) || v->nbytes != es || !v->data)
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: tensor '%s': a KV cache scale is one F32, "
                          "BF16 or F16 element (it has %lld of %s)", v->file, v->name,
                          (long long)n, atlas_dtype_name(v->dtype));
    uint16_t h = 0;
    float f = 0;
    if (es == 2) memcpy(&h, v->data, 2);
    else memcpy(&f, v->data, 4);
    if (v->dtype == ATLAS_DTYPE_BF16) f = atlas_bf16_to_f32(h);
    if (v->dtype == ATLAS_DTYPE_F16) f = atlas_f16_to_f32(h);
    if (!isfinite(f) || f <= 0)
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: tensor '%s': KV cache scale %g (it must be "
                          "finite and above 0)", v->file, v->name, (double)f);
    *out = f;
    return ATLAS_OK;
}

atlas_status atlas_kv_scales_read(const atlas_st *st, int n_layers, float *out, int *found) {
    *found = 0;
    for (int l = 0; l < n_layers; l++)
        for (int kv = 0; kv < 2; kv++) {
            char c = kv ? 'v' : 'k', name[128];
            const atlas_tensor_view *hit = NULL;
            out[2 * l + kv] = 1.0f;
            for (size_t i = 0; i < sizeof SPELLINGS / sizeof SPELLINGS[0]; i++) {
                snprintf(name, sizeof name, SPELLINGS[i], l, c, c);
                const atlas_tensor_view *v = atlas_st_find(st, name);
                if (!v) continue;
                if (hit)
                    return atlas_fail(ATLAS_ERR_FORMAT, "%s: layer %d's %c scale is there "
                                      "twice, as '%s' and '%s'", v->file, l, c, hit->name,
                                      v->name);
                hit = v;
            }
            if (!hit) continue;
            ATLAS_TRY(read_scalar(hit, &out[2 * l + kv]));
            ++*found;
        }
    return ATLAS_OK;
}

/* ---- the public names (include/atlas/model.h) ---------------------------------------- */

atlas_status atlas_model_kv_dtype_parse(const char *text, atlas_kv_dtype *out) {
    if (!text) text = "";
    if (!strcmp(text, "auto")) return *out = ATLAS_KV_DTYPE_AUTO, ATLAS_OK;
    if (!strcmp(text, "bf16")) return *out = ATLAS_KV_DTYPE_BF16, ATLAS_OK;
    if (!strcmp(text, "fp8") || !strcmp(text, "fp8_e4m3"))
        return *out = ATLAS_KV_DTYPE_FP8, ATLAS_OK;
    if (!strcmp(text, "fp8_e5m2"))
        return atlas_fail(ATLAS_ERR_INVALID, "KV cache dtype 'fp8_e5m2': atlas's FP8 KV cache "
                          "is e4m3 (fp8, fp8_e4m3); it has auto, bf16, fp8, fp8_e4m3");
    return atlas_fail(ATLAS_ERR_INVALID, "KV cache dtype '%.40s': not one atlas has (auto, "
                      "bf16, fp8, fp8_e4m3)", text);
}

const char *atlas_model_kv_dtype_name(atlas_kv_dtype t) {
    switch (t) {
    case ATLAS_KV_DTYPE_AUTO: return "auto";
    case ATLAS_KV_DTYPE_BF16: return "bf16";
    case ATLAS_KV_DTYPE_FP8: return "fp8";
    }
    return "?";
}

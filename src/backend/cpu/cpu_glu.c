/* backend/cpu/cpu_glu.c — the gated activations of the MLP (backend.h: swiglu, glu), shared
 * by the dense MLP's ops and the experts of cpu_moe.c. */
#include <math.h>

#include "backend/cpu/cpu.h"

atlas_status cpu_swiglu(atlas_backend *be, void *out, const void *gate_up, int n, int f) {
    for (int t = 0; t < n; t++) {
        const float *gt = (const float *)gate_up + (size_t)t * 2 * f, *up = gt + f;
        float *o = (float *)out + (size_t)t * f;
        for (int i = 0; i < f; i++) o[i] = gt[i] / (1.0f + expf(-gt[i])) * up[i];
    }
    return ATLAS_OK;
}

/* gelu_pytorch_tanh in float32, as torch computes it */
static float gelu_tanh(float x) {
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

/* gpt-oss's: the gate clamped from above and up on both sides at L, in transformers' order
 * (glu = g * sigmoid(alpha * g), then (u + 1) * glu) in float32 */
static void swiglu_clamp(const atlas_backend_geom *g, float *out, const float *gate_up, int n,
                         int f) {
    float alpha = g->glu_alpha, lim = g->glu_limit;
    for (int t = 0; t < n; t++) {
        const float *gt = gate_up + (size_t)t * 2 * f, *up = gt + f;
        float *o = out + (size_t)t * f;
        for (int i = 0; i < f; i++) {
            float x = gt[i] < lim ? gt[i] : lim, u = up[i];
            u = u < -lim ? -lim : u > lim ? lim : u;
            float glu = x * (1.0f / (1.0f + expf(-(x * alpha))));
            o[i] = (u + 1.0f) * glu;
        }
    }
}

atlas_status cpu_glu(atlas_backend *be, void *out, const void *gate_up, int n, int f) {
    if (be->geom.glu == ATLAS_GLU_SILU) return cpu_swiglu(be, out, gate_up, n, f);
    if (be->geom.glu == ATLAS_GLU_SWIGLU_CLAMP) {
        swiglu_clamp(&be->geom, out, gate_up, n, f);
        return ATLAS_OK;
    }
    for (int t = 0; t < n; t++) {
        const float *gt = (const float *)gate_up + (size_t)t * 2 * f, *up = gt + f;
        float *o = (float *)out + (size_t)t * f;
        for (int i = 0; i < f; i++) o[i] = gelu_tanh(gt[i]) * up[i];
    }
    return ATLAS_OK;
}

/* kernels/rope.cu — rotary position embedding, rotate-half convention (Llama, Qwen). */
#include "common.cuh"

/* Rotates the q and k heads of qkv[n, (H+2K)*hd] at positions pos[n]: for pair i < hd/2,
 * angle = pos * inv_freq[i] (in double: positions reach 1e5 and more), and
 *   x[i]        = x[i] * c - x[i + hd/2] * s
 *   x[i + hd/2] = x[i + hd/2] * c + x[i] * s,  with c, s scaled by attn_factor.
 * grid n; threads over the pairs, each applies its angle to every head. */
extern "C" __global__ void atlas_rope(float *qkv, const int *pos, const double *inv_freq, int H,
                                      int K, int hd, float attn_factor) {
    int half = hd / 2;
    float *row = qkv + (size_t)blockIdx.x * (H + 2 * K) * hd;
    double p = (double)pos[blockIdx.x];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        double sd, cd;
        sincos(p * inv_freq[i], &sd, &cd);
        float s = (float)sd * attn_factor, c = (float)cd * attn_factor;
        for (int h = 0; h < H + K; h++) {
            float *x = row + (size_t)h * hd;
            float a = x[i], b = x[i + half];
            x[i] = a * c - b * s;
            x[i + half] = b * c + a * s;
        }
    }
}

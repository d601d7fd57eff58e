/* kernels/rope.cu — rotary position embedding, rotate-half convention (Llama, Qwen).
 * cos/sin come from begin_batch ([n, hd/2] float2, computed on the host like the CPU
 * backend and transformers: angle = (float)inv_freq * (float)pos, scaled by attn_factor). */
#include "common.cuh"

/* x[i] = x[i] c - x[i + hd/2] s;  x[i + hd/2] = x[i + hd/2] c + x[i] s for the q and k heads
 * of qkv[n, (H+2K)*hd]. grid (n, H + K), threads over the hd/2 pairs. */
extern "C" __global__ void atlas_rope(float *qkv, const float2 *cs, int H, int K, int hd) {
    pdl_trigger();
    pdl_wait();
    int half = hd / 2, t = blockIdx.x;
    float *x = qkv + (size_t)t * (H + 2 * K) * hd + (size_t)blockIdx.y * hd;
    for (int i = threadIdx.x; i < half; i += blockDim.x)
        rope_pair(x, NULL, i, half, x[i], x[i + half], cs[(size_t)t * half + i]);
}

/* cs[t, i] = (cos, sin)(angle) * attn_factor with angle = inv_freq[i] * (float)pos[t] rounded
 * to float first, as the CPU backend and transformers do; cos/sin in double. grid n. */
extern "C" __global__ void atlas_rope_table(float2 *cs, const int *pos, const float *inv_freq,
                                            int half, float attn_factor) {
    pdl_trigger();
    pdl_wait();
    float p = (float)pos[blockIdx.x];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float angle = __fmul_rn(inv_freq[i], p);
        double sd, cd;
        sincos((double)angle, &sd, &cd);
        cs[(size_t)blockIdx.x * half + i] = make_float2((float)cd * attn_factor, (float)sd * attn_factor);
    }
}

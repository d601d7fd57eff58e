/* kernels/rope.cu — rotary position embedding, rotate-half convention (Llama, Qwen).
 * cos/sin come from atlas_stage ([n, hd/2] float2, computed as the CPU backend and
 * transformers do: angle = (float)inv_freq * (float)pos, scaled by attn_factor). */
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

/* The batch's staging, first in its command list (and so in a decode step's graph): src is
 * the pinned host buffer begin_batch wrote (mapped), copied to dst ([words] ints), and the
 * rope table cs[t, i] = (cos, sin)(angle) * attn_factor with angle = inv_freq[i] * (float)
 * pos[t] rounded to float first, as the CPU backend and transformers do; cos/sin in double;
 * pos = src + pos_off. The host memory is read with ld.global.cv (a replay must not see the
 * last step's values) before the wait, so that its bus latency overlaps the previous kernel;
 * nothing is written before it. No trigger: the next kernel is launched without PDL
 * (ops_cuda.c pdl_fence), as kernels read staged ints before their own wait.
 * grid n (the batch's tokens), STAGE_THREADS threads. */
enum { STAGE_THREADS = 128, STAGE_EARLY = 4 };
extern "C" __global__ void __launch_bounds__(STAGE_THREADS)
atlas_stage(int *dst, const int *src, int words, int pos_off, float2 *cs, const float *inv_freq,
            int half, float attn_factor) {
    int step = gridDim.x * STAGE_THREADS, i0 = blockIdx.x * STAGE_THREADS + threadIdx.x;
    int v[STAGE_EARLY];
#pragma unroll
    for (int r = 0; r < STAGE_EARLY; r++) {
        int i = i0 + r * step;
        v[r] = i < words ? __ldcv(src + i) : 0;
    }
    float p = (float)__ldcv(src + pos_off + blockIdx.x);
    pdl_wait();
#pragma unroll
    for (int r = 0; r < STAGE_EARLY; r++) {
        int i = i0 + r * step;
        if (i < words) dst[i] = v[r];
    }
    for (int i = i0 + STAGE_EARLY * step; i < words; i += step) dst[i] = __ldcv(src + i);
    for (int i = threadIdx.x; i < half; i += STAGE_THREADS) {
        float angle = __fmul_rn(inv_freq[i], p);
        double sd, cd;
        sincos((double)angle, &sd, &cd);
        cs[(size_t)blockIdx.x * half + i] = make_float2((float)cd * attn_factor, (float)sd * attn_factor);
    }
}

/* kernels/rope.cu — rotary position embedding, rotate-half convention (Llama, Qwen), over the
 * first 2 * rot dimensions of each head (partial rotary, Phi-4-mini: the rest pass through).
 * cos/sin come from atlas_stage (a table [n, hd/2] float2 per RoPE set, computed as the CPU
 * backend and transformers do: angle = (float)inv_freq * (float)pos, scaled by the set's
 * attn_factor); the host passes the table of the layer's set. */
#include "common.cuh"
#include "kv8.cuh" /* rope_pair */

/* x[i] = x[i] c - x[i + rot] s;  x[i + rot] = x[i + rot] c + x[i] s (i < rot) for the q and k
 * heads of qkv[n, (H+2K)*hd]. grid (n, H + K), threads over the rot pairs. */
extern "C" __global__ void atlas_rope(float *qkv, const float2 *cs, int H, int K, int hd,
                                      int rot) {
    pdl_trigger();
    pdl_wait();
    int half = hd / 2, t = blockIdx.x;
    float *x = qkv + (size_t)t * (H + 2 * K) * hd + (size_t)blockIdx.y * hd;
    for (int i = threadIdx.x; i < rot; i += blockDim.x)
        rope_pair<bf16_t>(x, NULL, i, rot, x[i], x[i + rot], cs[(size_t)t * half + i]);
}

/* The batch's staging, first in its command list (and so in a decode step's graph): src is
 * the pinned host buffer begin_batch wrote (mapped), copied to dst ([words] ints), and the
 * rope tables: for each of n_sets sets (set_stride float2 apart), cs[t, i] = (cos, sin)(angle)
 * * attn_factor (f0, f1) with angle = inv[i] * (float)pos[t] rounded to float first, as the
 * CPU backend and transformers do; cos/sin in double; i < rot. inv_freq is [3][hd/2]: set 0's
 * frequencies, longrope's long ones for set 0 (taken by a token whose flag, src + long_off,
 * is set; long_off < 0: none), set 1's. pos = src + pos_off. The host memory is read with
 * ld.global.cv (a replay must not see the last step's values) before the wait, so that its
 * bus latency overlaps the previous kernel; nothing is written before it. No trigger: the
 * next kernel is launched without PDL (ops_cuda.c pdl_fence), as kernels read staged ints
 * before their own wait. grid n (the batch's tokens), STAGE_THREADS threads. */
enum { STAGE_THREADS = 128, STAGE_EARLY = 4 };
extern "C" __global__ void __launch_bounds__(STAGE_THREADS)
atlas_stage(int *dst, const int *src, int words, int pos_off, int long_off, float2 *cs,
            const float *inv_freq, int half, int rot, int n_sets, int set_stride, float f0,
            float f1) {
    int step = gridDim.x * STAGE_THREADS, i0 = blockIdx.x * STAGE_THREADS + threadIdx.x;
    int v[STAGE_EARLY];
#pragma unroll
    for (int r = 0; r < STAGE_EARLY; r++) {
        int i = i0 + r * step;
        v[r] = i < words ? __ldcv(src + i) : 0;
    }
    float p = (float)__ldcv(src + pos_off + blockIdx.x);
    int use_long = long_off >= 0 ? __ldcv(src + long_off + blockIdx.x) : 0;
    pdl_wait();
#pragma unroll
    for (int r = 0; r < STAGE_EARLY; r++) {
        int i = i0 + r * step;
        if (i < words) dst[i] = v[r];
    }
    for (int i = i0 + STAGE_EARLY * step; i < words; i += step) dst[i] = __ldcv(src + i);
    for (int s = 0; s < n_sets; s++) {
        const float *inv = inv_freq + (size_t)(s ? 2 : use_long ? 1 : 0) * half;
        float f = s ? f1 : f0;
        float2 *row = cs + (size_t)s * set_stride + (size_t)blockIdx.x * half;
        for (int i = threadIdx.x; i < rot; i += STAGE_THREADS) {
            float angle = __fmul_rn(inv[i], p);
            double sd, cd;
            sincos((double)angle, &sd, &cd);
            row[i] = make_float2((float)cd * f, (float)sd * f);
        }
    }
}

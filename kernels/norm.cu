/* kernels/norm.cu — RMSNorm (optionally fused with the residual add) and Qwen3's per-head
 * q/k norm.  Sums of squares in fp32. */
#include "common.cuh"

/* With delta: resid[r] += delta[r]; then out[r] = resid[r] * rsqrt(mean(resid[r]^2) + eps) * w.
 * Without (delta NULL): out[r] = rmsnorm(resid[r]) * w and resid is only read. out_bf (may be
 * NULL) gets out rounded to bf16 as well: prefill's next matmul reads that copy instead of
 * converting out again (ops_cuda.c, "bf16 copies for cuBLASLt").
 * grid rows, d % 4 == 0; out may alias resid. */
extern "C" __global__ void atlas_add_rmsnorm(float *resid, const float *delta, float *out,
                                             const bf16_t *w, int d, float eps, bf16_t *out_bf) {
    pdl_trigger();
    pdl_wait();
    size_t base = (size_t)blockIdx.x * d;
    float4 *r4 = (float4 *)(resid + base);
    const float4 *d4 = (const float4 *)(delta ? delta + base : 0);
    float ss = 0.0f;
    for (int c = threadIdx.x; c < d / 4; c += blockDim.x) {
        float4 v = r4[c];
        if (delta) {
            float4 e = d4[c];
            v.x += e.x; v.y += e.y; v.z += e.z; v.w += e.w;
            r4[c] = v;
        }
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    float scale = rsqrtf(block_sum(ss) / (float)d + eps);
    float4 *o4 = (float4 *)(out + base);
    for (int c = threadIdx.x; c < d / 4; c += blockDim.x) {
        float4 v = r4[c];
        const bf16_t *wc = w + c * 4;
        v.x *= scale * bf2f(wc[0]); v.y *= scale * bf2f(wc[1]);
        v.z *= scale * bf2f(wc[2]); v.w *= scale * bf2f(wc[3]);
        o4[c] = v;
        if (out_bf)
            *(uint2 *)(out_bf + base + c * 4) = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
    }
}

/* Per-head RMSNorm of the q heads (qn[hd]) and k heads (kn[hd]) of qkv[n, (H+2K)*hd], in
 * place. grid (n, H + K), one warp a head. */
extern "C" __global__ void atlas_qk_norm(float *qkv, const bf16_t *qn, const bf16_t *kn, int H,
                                         int K, int hd, float eps) {
    pdl_trigger();
    pdl_wait();
    int head = blockIdx.y;
    float *v = qkv + (size_t)blockIdx.x * (H + 2 * K) * hd + (size_t)head * hd;
    const bf16_t *w = head < H ? qn : kn;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < hd; i += 32) ss += v[i] * v[i];
    float scale = rsqrtf(warp_sum(ss) / (float)hd + eps);
    for (int i = threadIdx.x; i < hd; i += 32) v[i] = v[i] * scale * bf2f(w[i]);
}

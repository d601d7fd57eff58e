/* kernels/embed.cu — token embedding lookup and row gather. */
#include "common.cuh"

/* x[n, d] (fp32) = table[tokens[i], :] (bf16) * scale (geom.embed_scale, Gemma's sqrt(d) in
 * float32 as the CPU backend multiplies it; 1 exactly otherwise); a token v < 0 is ids[-1 - v]
 * (a queued step's: the step before's ids). grid n, d % 8 == 0. */
extern "C" __global__ void atlas_embed(float *x, const bf16_t *table, const int *tokens,
                                       const int *ids, int d, float scale) {
    pdl_trigger();
    pdl_wait();
    int row = blockIdx.x, tok = tokens[row];
    if (tok < 0) tok = ids[-1 - tok];
    const bf16_t *src = table + (size_t)tok * d;
    float *dst = x + (size_t)row * d;
    for (int c = threadIdx.x * 8; c < d; c += blockDim.x * 8) {
        float f[8];
        unpack8(*(const uint4 *)(src + c), f);
#pragma unroll
        for (int j = 0; j < 8; j++) f[j] *= scale;
        *(float4 *)(dst + c) = make_float4(f[0], f[1], f[2], f[3]);
        *(float4 *)(dst + c + 4) = make_float4(f[4], f[5], f[6], f[7]);
    }
}

/* out[i, d] = x[rows[i], d]. grid n_rows, d % 4 == 0. */
extern "C" __global__ void atlas_gather_rows(float *out, const float *x, const int *rows, int d) {
    pdl_trigger();
    pdl_wait();
    const float4 *src = (const float4 *)(x + (size_t)rows[blockIdx.x] * d);
    float4 *dst = (float4 *)(out + (size_t)blockIdx.x * d);
    for (int c = threadIdx.x; c < d / 4; c += blockDim.x) dst[c] = src[c];
}

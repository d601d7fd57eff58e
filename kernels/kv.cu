/* kernels/kv.cu — writing new K/V rows into the paged cache. */
#include "common.cuh"

/* kc/vc: one layer's pools [n_blocks * block_size, K, hd] (bf16). Token t's k heads (after q)
 * and v heads of qkv[n, (H+2K)*hd] go to slot slots[t]. grid n. */
extern "C" __global__ void atlas_kv_store(const float *qkv, bf16_t *kc, bf16_t *vc, const int *slots,
                                          int H, int K, int hd) {
    int t = blockIdx.x, w = K * hd;
    const float *src = qkv + (size_t)t * (H + 2 * K) * hd + (size_t)H * hd;
    size_t dst = (size_t)slots[t] * w;
    for (int j = threadIdx.x; j < w; j += blockDim.x) {
        kc[dst + j] = f2bf(src[j]);
        vc[dst + j] = f2bf(src[w + j]);
    }
}

/* Decode's rope + kv_store in one launch: rotates the q and k heads of qkv[n] in place (as
 * kernels/rope.cu) and writes the rotated k and the v heads to the cache. grid n. */
extern "C" __global__ void atlas_rope_kv_store(float *qkv, bf16_t *kc, bf16_t *vc, const int *slots,
                                               const int *pos, const double *inv_freq, int H,
                                               int K, int hd, float attn_factor) {
    int half = hd / 2, w = K * hd;
    float *row = qkv + (size_t)blockIdx.x * (H + 2 * K) * hd;
    size_t dst = (size_t)slots[blockIdx.x] * w;
    double p = (double)pos[blockIdx.x];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        double sd, cd;
        sincos(p * inv_freq[i], &sd, &cd);
        float s = (float)sd * attn_factor, c = (float)cd * attn_factor;
        for (int h = 0; h < H + K; h++) {
            float *x = row + (size_t)h * hd;
            float a = x[i], b = x[i + half];
            float ra = a * c - b * s, rb = b * c + a * s;
            x[i] = ra;
            x[i + half] = rb;
            if (h >= H) {
                kc[dst + (size_t)(h - H) * hd + i] = f2bf(ra);
                kc[dst + (size_t)(h - H) * hd + i + half] = f2bf(rb);
            }
        }
    }
    for (int j = threadIdx.x; j < w; j += blockDim.x) vc[dst + j] = f2bf(row[(size_t)(H + K) * hd + j]);
}

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

/* kernels/kv.cu — writing new K/V rows into the paged cache. */
#include "common.cuh"

/* kc/vc: one layer's pools [n_blocks * block_size, K, hd] (bf16). Token t's k heads (after q)
 * and v heads of qkv[n, (H+2K)*hd] go to slot slots[t]. grid n. */
extern "C" __global__ void atlas_kv_store(const float *qkv, bf16_t *kc, bf16_t *vc, const int *slots,
                                          int H, int K, int hd) {
    pdl_trigger();
    pdl_wait();
    int t = blockIdx.x, w = K * hd;
    const float *src = qkv + (size_t)t * (H + 2 * K) * hd + (size_t)H * hd;
    size_t dst = (size_t)slots[t] * w;
    for (int j = threadIdx.x; j < w; j += blockDim.x) {
        kc[dst + j] = f2bf(src[j]);
        vc[dst + j] = f2bf(src[w + j]);
    }
}

/* Decode's rope + kv_store in one launch (the qkv fusion does the same in the qkv GEMV's
 * epilogue: kernels/gemv.cu gb_rope_kv). grid (n, H + 2K): blocks of the q and k heads
 * rotate their first 2 * rot dimensions in place (as kernels/rope.cu), those of k heads also
 * store the rotated k and its dimensions past 2 * rot, those of v heads store v. cs: the
 * layer's rope table. */
extern "C" __global__ void atlas_rope_kv_store(float *qkv, bf16_t *kc, bf16_t *vc, const int *slots,
                                               const float2 *cs, int H, int K, int hd, int rot) {
    pdl_trigger();
    pdl_wait();
    int half = hd / 2, t = blockIdx.x, h = blockIdx.y;
    float *x = qkv + (size_t)t * (H + 2 * K) * hd + (size_t)h * hd;
    size_t dst = (size_t)slots[t] * K * hd;
    if (h >= H + K) {
        for (int i = threadIdx.x; i < hd; i += blockDim.x) vc[dst + (size_t)(h - H - K) * hd + i] = f2bf(x[i]);
        return;
    }
    bf16_t *kr = h >= H ? kc + dst + (size_t)(h - H) * hd : NULL;
    for (int i = threadIdx.x; i < rot; i += blockDim.x)
        rope_pair(x, kr, i, rot, x[i], x[i + rot], cs[(size_t)t * half + i]);
    if (kr) /* partial rotary: the dimensions that pass through */
        for (int i = 2 * rot + threadIdx.x; i < hd; i += blockDim.x) kr[i] = f2bf(x[i]);
}

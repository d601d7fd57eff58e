/* kernels/kv.cu — writing new K/V rows into the paged cache: bf16, or FP8 e4m3 codes of
 * x / scale (the _fp8 kernels, with the layer's K and V scales: kv8.cuh). */
#include "common.cuh"
#include "kv8.cuh"

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

/* atlas_kv_store's FP8 cache: kc/vc hold e4m3 codes of x / ks and x / vs. */
extern "C" __global__ void atlas_kv_store_fp8(const float *qkv, fp8_t *kc, fp8_t *vc,
                                              const int *slots, int H, int K, int hd, float ks,
                                              float vs) {
    pdl_trigger();
    pdl_wait();
    int t = blockIdx.x, w = K * hd;
    const float *src = qkv + (size_t)t * (H + 2 * K) * hd + (size_t)H * hd;
    size_t dst = (size_t)slots[t] * w;
    for (int j = threadIdx.x; j < w; j += blockDim.x) {
        kc[dst + j] = f2fp8(src[j], ks);
        vc[dst + j] = f2fp8(src[w + j], vs);
    }
}

/* atlas_rope_kv_store's FP8 cache (the same grid): the rotated k and v as e4m3 codes of
 * x / ks and x / vs. */
extern "C" __global__ void atlas_rope_kv_store_fp8(float *qkv, fp8_t *kc, fp8_t *vc,
                                                   const int *slots, const float2 *cs, int H,
                                                   int K, int hd, int rot, float ks, float vs) {
    pdl_trigger();
    pdl_wait();
    int half = hd / 2, t = blockIdx.x, h = blockIdx.y;
    float *x = qkv + (size_t)t * (H + 2 * K) * hd + (size_t)h * hd;
    size_t dst = (size_t)slots[t] * K * hd;
    if (h >= H + K) {
        for (int i = threadIdx.x; i < hd; i += blockDim.x)
            vc[dst + (size_t)(h - H - K) * hd + i] = f2fp8(x[i], vs);
        return;
    }
    fp8_t *kr = h >= H ? kc + dst + (size_t)(h - H) * hd : NULL;
    for (int i = threadIdx.x; i < rot; i += blockDim.x) {
        float2 r = cs[(size_t)t * half + i];
        float a = x[i], b = x[i + rot], ra = a * r.x - b * r.y, rb = b * r.x + a * r.y;
        x[i] = ra; /* as rope_pair, the cache's copy in FP8 */
        x[i + rot] = rb;
        if (kr) {
            kr[i] = f2fp8(ra, ks);
            kr[i + rot] = f2fp8(rb, ks);
        }
    }
    if (kr) /* partial rotary: the dimensions that pass through */
        for (int i = 2 * rot + threadIdx.x; i < hd; i += blockDim.x) kr[i] = f2fp8(x[i], ks);
}

/* kernels/kv.cu — writing new K/V rows into the paged cache: bf16, or FP8 e4m3 codes of
 * x / scale (the _fp8 kernels, with the layer's K and V scales: kv8.cuh). Each body is a
 * template over the cache's element (kv_put), instantiated once for each cache. */
#include "common.cuh"
#include "kv8.cuh"

/* kc/vc: one layer's pools [n_blocks * block_size, K, hd]. Token t's k heads (after q) and v
 * heads of qkv[n, (H+2K)*hd] go to slot slots[t]. grid n. ks, vs: an FP8 cache's scales. */
template <class T>
__device__ __forceinline__ void kv_store_body(const float *qkv, T *kc, T *vc, const int *slots,
                                              int H, int K, int hd, float ks, float vs) {
    pdl_trigger();
    pdl_wait();
    int t = blockIdx.x, w = K * hd;
    const float *src = qkv + (size_t)t * (H + 2 * K) * hd + (size_t)H * hd;
    size_t dst = (size_t)slots[t] * w;
    for (int j = threadIdx.x; j < w; j += blockDim.x) {
        kv_put(kc + dst + j, src[j], ks);
        kv_put(vc + dst + j, src[w + j], vs);
    }
}

extern "C" __global__ void atlas_kv_store(const float *qkv, bf16_t *kc, bf16_t *vc, const int *slots,
                                          int H, int K, int hd) {
    kv_store_body(qkv, kc, vc, slots, H, K, hd, 1.0f, 1.0f);
}

extern "C" __global__ void atlas_kv_store_fp8(const float *qkv, fp8_t *kc, fp8_t *vc,
                                              const int *slots, int H, int K, int hd, float ks,
                                              float vs) {
    kv_store_body(qkv, kc, vc, slots, H, K, hd, ks, vs);
}

/* Decode's rope + kv_store in one launch (the qkv fusion does the same in the qkv GEMV's
 * epilogue: kernels/gemv.cu gb_rope_kv). grid (n, H + 2K): blocks of the q and k heads
 * rotate their first 2 * rot dimensions in place (as kernels/rope.cu), those of k heads also
 * store the rotated k and its dimensions past 2 * rot, those of v heads store v. cs: the
 * layer's rope table. */
template <class T>
__device__ __forceinline__ void rope_kv_store_body(float *qkv, T *kc, T *vc, const int *slots,
                                                   const float2 *cs, int H, int K, int hd,
                                                   int rot, float ks, float vs) {
    pdl_trigger();
    pdl_wait();
    int half = hd / 2, t = blockIdx.x, h = blockIdx.y;
    float *x = qkv + (size_t)t * (H + 2 * K) * hd + (size_t)h * hd;
    size_t dst = (size_t)slots[t] * K * hd;
    if (h >= H + K) {
        for (int i = threadIdx.x; i < hd; i += blockDim.x)
            kv_put(vc + dst + (size_t)(h - H - K) * hd + i, x[i], vs);
        return;
    }
    T *kr = h >= H ? kc + dst + (size_t)(h - H) * hd : NULL;
    for (int i = threadIdx.x; i < rot; i += blockDim.x)
        rope_pair(x, kr, i, rot, x[i], x[i + rot], cs[(size_t)t * half + i], ks);
    if (kr) /* partial rotary: the dimensions that pass through */
        for (int i = 2 * rot + threadIdx.x; i < hd; i += blockDim.x) kv_put(kr + i, x[i], ks);
}

extern "C" __global__ void atlas_rope_kv_store(float *qkv, bf16_t *kc, bf16_t *vc, const int *slots,
                                               const float2 *cs, int H, int K, int hd, int rot) {
    rope_kv_store_body(qkv, kc, vc, slots, cs, H, K, hd, rot, 1.0f, 1.0f);
}

extern "C" __global__ void atlas_rope_kv_store_fp8(float *qkv, fp8_t *kc, fp8_t *vc,
                                                   const int *slots, const float2 *cs, int H,
                                                   int K, int hd, int rot, float ks, float vs) {
    rope_kv_store_body(qkv, kc, vc, slots, cs, H, K, hd, rot, ks, vs);
}

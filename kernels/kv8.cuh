/* kernels/kv8.cuh — the FP8 (e4m3) KV cache's codes (--kv-cache-dtype fp8): a row x is written
 * as e4m3(x / scale), the division in fp32, saturating at +-448 with ties to even
 * (__nv_cvt_float_to_fp8 with __NV_SATFINITE: what vLLM writes, and the CPU backend's
 * atlas_f32_to_e4m3), and read back as the code's value; the kernels apply each layer's scale
 * once, folded into q for K and into the output for V. Every e4m3 value is a half exactly,
 * and sm_89+ converts two codes at a time in one instruction (cuda_fp8.h emulates it below).
 * kv_put and rope_pair write an element of either cache (bf16 or e4m3), for the store
 * kernels' templates. */
#ifndef ATLAS_KERNELS_KV8_CUH
#define ATLAS_KERNELS_KV8_CUH

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "common.cuh"

typedef uint8_t fp8_t; /* raw e4m3 bits */

__device__ __forceinline__ fp8_t f2fp8(float x, float scale) {
    return (fp8_t)__nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE, __NV_E4M3);
}

/* A cache element from x: bf16 rounds it (the scale is e4m3's alone), e4m3 codes x / scale.
 * The store kernels are templates over the element, so each exists once for both caches. */
__device__ __forceinline__ void kv_put(bf16_t *p, float x, float) { *p = f2bf(x); }
__device__ __forceinline__ void kv_put(fp8_t *p, float x, float scale) { *p = f2fp8(x, scale); }

/* One rotate-half pair of a q or k head (rope): x[i], x[i + rot] = (a, b) rotated by
 * r = (cos, sin), rot the rotated dimensions' half (hd/2, or less with partial rotary); kr,
 * when not NULL (a k head's row in the cache), gets the result as the cache holds it (ks:
 * an FP8 cache's K scale). */
template <class T>
__device__ __forceinline__ void rope_pair(float *x, T *kr, int i, int rot, float a, float b,
                                          float2 r, float ks = 1.0f) {
    float ra = a * r.x - b * r.y, rb = b * r.x + a * r.y;
    x[i] = ra;
    x[i + rot] = rb;
    if (kr) {
        kv_put(kr + i, ra, ks);
        kv_put(kr + i + rot, rb, ks);
    }
}

/* 2 codes (the first in the low byte) as floats. */
__device__ __forceinline__ float2 fp8x2(uint32_t v) {
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v & 0xffffu), __NV_E4M3);
    return __half22float2(*reinterpret_cast<__half2 *>(&h));
}

/* D consecutive codes at p (D = 2, 4, 8: one 2-, 4- or 8-byte load) as floats. */
template <int D>
__device__ __forceinline__ void load_fp8(const fp8_t *p, float (&f)[D]) {
    if constexpr (D == 2) {
        float2 a = fp8x2(*(const uint16_t *)p);
        f[0] = a.x, f[1] = a.y;
    } else if constexpr (D == 4) {
        uint32_t u = *(const uint32_t *)p;
        float2 a = fp8x2(u), b = fp8x2(u >> 16);
        f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
    } else {
        uint2 u = *(const uint2 *)p;
        const uint32_t w[2] = {u.x, u.y};
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float2 a = fp8x2(w[i]), b = fp8x2(w[i] >> 16);
            f[4 * i] = a.x, f[4 * i + 1] = a.y, f[4 * i + 2] = b.x, f[4 * i + 3] = b.y;
        }
    }
}

/* 8 codes (one 8-byte word) as 8 bf16 (exact: e4m3 has 3 mantissa bits), in the order the
 * bf16 cache keeps them: what the prefill kernel's shared tiles hold. */
__device__ __forceinline__ uint4 fp8x8_to_bf16(uint2 u) {
    float f[8];
    const uint32_t w[2] = {u.x, u.y};
#pragma unroll
    for (int i = 0; i < 2; i++) {
        float2 a = fp8x2(w[i]), b = fp8x2(w[i] >> 16);
        f[4 * i] = a.x, f[4 * i + 1] = a.y, f[4 * i + 2] = b.x, f[4 * i + 3] = b.y;
    }
    return make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]),
                      pack_bf16x2(f[6], f[7]));
}

#endif

/* kernels/kv8.cuh — the FP8 (e4m3) KV cache's codes (--kv-cache-dtype fp8): a row x is written
 * as e4m3(x / scale), the division in fp32, saturating at +-448 with ties to even
 * (__nv_cvt_float_to_fp8 with __NV_SATFINITE: what vLLM writes, and the CPU backend's
 * atlas_f32_to_e4m3), and read back as the code's value; the kernels apply each layer's scale
 * once, folded into q for K and into the output for V. Every e4m3 value is a half exactly,
 * and sm_89+ converts two codes at a time in one instruction (cuda_fp8.h emulates it below). */
#ifndef ATLAS_KERNELS_KV8_CUH
#define ATLAS_KERNELS_KV8_CUH

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "common.cuh"

typedef uint8_t fp8_t; /* raw e4m3 bits */

__device__ __forceinline__ fp8_t f2fp8(float x, float scale) {
    return (fp8_t)__nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE, __NV_E4M3);
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

/* kernels/common.cuh — helpers shared by the kernels: bf16 unpacking, warp and block
 * reductions, streaming loads.  Every kernel is extern "C" so that the registry finds it
 * by its plain name with cuModuleGetFunction. */
#ifndef ATLAS_KERNELS_COMMON_CUH
#define ATLAS_KERNELS_COMMON_CUH

#include <stdint.h>

typedef uint16_t bf16_t; /* raw bf16 bits: weights and the KV cache */

__device__ __forceinline__ float bf2f(bf16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* Round to nearest even (inputs are finite activations). */
__device__ __forceinline__ bf16_t f2bf(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

/* Two floats into one bf16x2 register (low half = a), as mma.sync wants them. */
__device__ __forceinline__ uint32_t pack_bf16x2(float a, float b) {
    return (uint32_t)f2bf(a) | ((uint32_t)f2bf(b) << 16);
}

/* 8 bf16 (one 16-byte load) into floats. */
__device__ __forceinline__ void unpack8(uint4 u, float f[8]) {
    f[0] = __uint_as_float(u.x << 16); f[1] = __uint_as_float(u.x & 0xffff0000u);
    f[2] = __uint_as_float(u.y << 16); f[3] = __uint_as_float(u.y & 0xffff0000u);
    f[4] = __uint_as_float(u.z << 16); f[5] = __uint_as_float(u.z & 0xffff0000u);
    f[6] = __uint_as_float(u.w << 16); f[7] = __uint_as_float(u.w & 0xffff0000u);
}

/* Weights are read once per step: keep them out of L1. */
__device__ __forceinline__ uint4 ld_stream16(const void *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

/* ld_stream16 where ok, else zeros: a predicated load, where `ok ? load : 0` compiles to a
 * branch and a convergence barrier around it. */
__device__ __forceinline__ uint4 ld_stream16_if(const void *p, bool ok) {
    uint4 v = make_uint4(0, 0, 0, 0);
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %5, 0;\n\t"
                 "@p ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n\t}"
                 : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
                 : "l"(p), "r"((int)ok));
    return v;
}

/* __ldg(p) where ok, else 0, predicated as ld_stream16_if. */
__device__ __forceinline__ float ldg_if(const float *p, bool ok) {
    float v = 0.0f;
    asm("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\t@p ld.global.nc.f32 %0, [%1];\n\t}"
        : "+f"(v)
        : "l"(p), "r"((int)ok));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets it. */
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); /* part[] may still be read by a previous call */
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = lane < nw ? part[lane] : 0.0f;
    return warp_sum(v);
}

/* SwiGLU of one (gate, up) pair: silu(g) * u, as every kernel that computes it does. */
__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + __expf(-g)) * u; }

/* A gate activation as the kernels take it (by value, a kernel argument; the host's
 * cuda_glu_act, cuda_backend.h, has the same layout): kind is atlas_glu_kind (backend.h),
 * alpha and limit are ATLAS_GLU_SWIGLU_CLAMP's gain and clamp (unused by the others). */
struct glu_act {
    int kind;
    float alpha, limit;
};

/* The gated activation of one (gate, up) pair, in float32 as the CPU backend (cpu_glu.c) and
 * torch compute it: 0 SwiGLU; 1 GeGLU with gelu_pytorch_tanh, 0.5 g (1 + tanh(sqrt(2/pi)
 * (g + 0.044715 g^3))); 2 gpt-oss's clamped SwiGLU, (clamp(u, -L, L) + 1) * x * sigmoid(alpha
 * x) with x = min(g, L). The kind is the same for every thread. */
__device__ __forceinline__ float glu_mul(float g, float u, glu_act a) {
    if (a.kind == 0) return silu_mul(g, u);
    if (a.kind == 2) {
        float x = fminf(g, a.limit);
        u = fminf(fmaxf(u, -a.limit), a.limit);
        return (u + 1.0f) * (x * (1.0f / (1.0f + __expf(-(x * a.alpha)))));
    }
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    return 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g))) * u;
}

/* Programmatic dependent launch (sm_90+; launches with the attribute, see ops_cuda.c): a
 * kernel lets the next one start early (pdl_trigger) and waits for the previous one's
 * results (pdl_wait) before it reads them or writes anything the previous one reads.
 * Without the attribute both do nothing. */
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

#endif

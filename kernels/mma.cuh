/* kernels/mma.cuh — the tensor-core building blocks that the GEMM, the prefill attention and
 * the small-batch GEMV share: 16-byte async copies into shared memory, ldmatrix, and the
 * bf16 m16n8k16 mma.sync with fp32 accumulators (sm_80+). */
#ifndef ATLAS_KERNELS_MMA_CUH
#define ATLAS_KERNELS_MMA_CUH

#include "common.cuh"

/* 16 bytes global -> shared, asynchronously (cp.async.cg: L2 only); bytes < 16 reads only
 * that many and zero-fills the rest (0: all zeros). */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int bytes) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(bytes));
}

/* Four 8x8 b16 tiles from shared memory (each lane gives one row's address). */
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void *smem) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}

/* The same, each tile transposed. */
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void *smem) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}

/* d += a (16x16, row) x b (16x8, col), bf16 in, fp32 accumulators, in the fragment layout of
 * mma.sync m16n8k16. */
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* (a, b) as bf16x2 hi and the rest lo: a ~ hi.lo16 + lo.lo16 to ~16 bits. */
__device__ __forceinline__ void split_bf16x2(float a, float b, uint32_t &hi, uint32_t &lo) {
    hi = pack_bf16x2(a, b);
    lo = pack_bf16x2(a - __uint_as_float(hi << 16), b - __uint_as_float(hi & 0xffff0000u));
}

#endif

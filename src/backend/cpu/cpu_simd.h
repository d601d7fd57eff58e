/* backend/cpu/cpu_simd.h — the AVX2/FMA helpers the CPU kernels share (x86-64-v3 is the
 * release baseline); CPU_SIMD is defined where they exist, and every kernel keeps a plain C
 * path for the targets where it is not. Internal to backend/cpu. */
#ifndef ATLAS_BACKEND_CPU_SIMD_H
#define ATLAS_BACKEND_CPU_SIMD_H

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define CPU_SIMD 1

/* The lanes of v summed in one fixed order: part of the matmul's summation order. */
static inline float cpu_hsum256(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}
#endif

#endif

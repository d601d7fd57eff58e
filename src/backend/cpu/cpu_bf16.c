/* backend/cpu/cpu_bf16.c — bf16 weights times fp32 activations with AVX-512, chosen at run
 * time (the functions carry their own target attributes, so the build's baseline stays what
 * it is and a CPU without AVX-512 never runs them), and with NEON on aarch64 (every core has
 * it), in the same layout, blocks and tiles.
 *
 * The activations are packed once a call (cpu_bf16_pack), in 32-column chunks laid out for the
 * kernel, the last chunk zero-padded; weights are read as stored, the last chunk of a row
 * through a masked load, so a row of any length takes one vector order and no scalar tail.
 * Each chunk is widened to fp32 as its even and odd columns (a shift and a mask of the same
 * 32 bf16) and multiplied into x packed as its even and odd columns with two FMAs: every
 * product exact, as in the AVX2 path. AVX512_BF16's vdpbf16ps was measured against this and
 * lost: with x rounded to bf16 it is twice as fast in prefill but misses the conformance
 * bound; with x split into three bf16 terms (all of fp32's bits) it is slower.
 * Decode (one token) reads the rows one after another, in address order, which the hardware
 * prefetchers follow at the read rate (eight rows interleaved chunk by chunk, with software
 * prefetches 2 KB ahead in each stream, read a 151,936 x 1,024 matrix at 17 GB/s, one row
 * at a time at 29 GB/s, a thread on Zen 4); prefill multiplies a 4-row tile of
 * the weight with 4 tokens at a time, over a block of tokens whose packed x stays in L2, so
 * each weight tile is read from memory once a block. Every output (row, token) is summed in
 * one order in all of these (one 16-lane accumulator over the chunks in order, the
 * same steps, then _mm512_reduce_add_ps), so a token's result is bitwise the same alone or
 * batched, with any thread split. */
#include "backend/cpu/cpu.h"

int cpu_bf16_kind_supported(cpu_bf16_kind kind) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
    if (kind == CPU_BF16_F32) return avx512;
    if (kind == CPU_BF16_DOT) return avx512 && __builtin_cpu_supports("avx512bf16");
#elif defined(__aarch64__)
    if (kind == CPU_BF16_NEON) return 1; /* Advanced SIMD is part of every ARMv8-A core */
#endif
    (void)kind;
    return 0;
}

cpu_bf16_kind cpu_bf16_best(void) {
    if (cpu_bf16_kind_supported(CPU_BF16_F32)) return CPU_BF16_F32;
    if (cpu_bf16_kind_supported(CPU_BF16_NEON)) return CPU_BF16_NEON;
    return CPU_BF16_NONE;
}

size_t cpu_bf16_pack_bytes(cpu_bf16_kind kind, int64_t k) {
    return (size_t)((k + 31) / 32) * 32 * (kind == CPU_BF16_DOT ? sizeof(uint16_t) : sizeof(float));
}

/* One token's x[k] into dst[cpu_bf16_pack_bytes]: for DOT, x rounded to bf16 in column
 * order (vdpbf16ps pairs neighbouring columns, as the weight row stores them); else per chunk,
 * its 16 even columns then its 16 odd ones. */
void cpu_bf16_pack(cpu_bf16_kind kind, const float *x, int64_t k, void *dst) {
    int64_t padded = (k + 31) / 32 * 32;
    if (kind == CPU_BF16_DOT) {
        uint16_t *d = dst;
        for (int64_t i = 0; i < padded; i++) d[i] = i < k ? atlas_f32_to_bf16(x[i]) : 0;
        return;
    }
    float *d = dst;
    for (int64_t c = 0; c < padded / 32; c++, d += 32)
        for (int j = 0; j < 32; j++) {
            int64_t i = c * 32 + j;
            d[(j & 1) * 16 + j / 2] = i < k ? x[i] : 0.0f;
        }
}

/* Blocks of tokens whose packed x fits in about 256 KB (L2); in each, one row at a time for
 * one token, 4x4 tiles for more, then the odd rows and tokens. One driver for each tile kind
 * (ATTR: its target attribute, X: the packed element's type, TILE: the tile). */
#define BF16_DRIVER(NAME, ATTR, X, TILE)                                                      \
    ATTR static void NAME(const uint16_t *w, int64_t k, int64_t r0,  \
                                                     int64_t r1, const X *xp, int n, float *out, \
                                                     int64_t ldo, int64_t xs) {                 \
        int nb = (int)((256 * 1024 / sizeof(X)) / xs) & ~3;                                      \
        if (nb < 4) nb = 4;                                                                      \
        for (int t0 = 0; t0 < n; t0 += nb) {                                                     \
            int t1 = t0 + nb < n ? t0 + nb : n;                                                  \
            int64_t r = r0;                                                                      \
            if (t1 - t0 == 1)                                                                    \
                for (; r < r1; r++)                                                              \
                    TILE(w + r * k, k, xp + t0 * xs, xs, out + t0 * ldo + r, ldo, 1, 1);         \
            for (; r < r1; r += r + 4 <= r1 ? 4 : 1) {                                           \
                const uint16_t *wr = w + r * k;                                                  \
                int t = t0, mr = r + 4 <= r1 ? 4 : 1;                                            \
                if (mr == 4) {                                                                   \
                    for (; t + 4 <= t1; t += 4)                                                  \
                        TILE(wr, k, xp + t * xs, xs, out + t * ldo + r, ldo, 4, 4);              \
                    for (; t < t1; t++) TILE(wr, k, xp + t * xs, xs, out + t * ldo + r, ldo, 4, 1); \
                } else {                                                                         \
                    for (; t + 4 <= t1; t += 4)                                                  \
                        TILE(wr, k, xp + t * xs, xs, out + t * ldo + r, ldo, 1, 4);              \
                    for (; t < t1; t++) TILE(wr, k, xp + t * xs, xs, out + t * ldo + r, ldo, 1, 1); \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
    }

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define T512 "avx512f,avx512bw,avx512vl,avx512dq"

/* out[t * ldo + r] = dot(w row r, token t) for MR rows and NR tokens (constants after
 * inlining, so the MR x NR accumulators stay in registers); xp: the first token's packed x,
 * xs floats from one token's to the next. Each chunk: even columns are the low halves of
 * its 32-bit words shifted up, odd ones the high halves masked; the even ones first. */
__attribute__((target(T512), always_inline)) static inline void
tile(const uint16_t *w, int64_t k, const float *xp, int64_t xs, float *out, int64_t ldo,
     const int MR, const int NR) {
    const int64_t nch = (k + 31) / 32;
    const __mmask32 tail = k % 32 ? (__mmask32)((1u << (k % 32)) - 1) : ~(__mmask32)0;
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    __m512 acc[4][4];
    for (int r = 0; r < MR; r++)
        for (int t = 0; t < NR; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t c = 0; c < nch; c++) {
        __mmask32 mk = c + 1 < nch ? ~(__mmask32)0 : tail;
        __m512 we[4], wo[4];
        for (int r = 0; r < MR; r++) {
            const uint16_t *p = w + r * k + c * 32;
            __m512i v = _mm512_maskz_loadu_epi16(mk, p);
            we[r] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
            wo[r] = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
        }
        for (int t = 0; t < NR; t++) {
            const float *x = xp + t * xs + c * 32;
            __m512 xe = _mm512_load_ps(x), xo = _mm512_load_ps(x + 16);
            for (int r = 0; r < MR; r++) {
                acc[r][t] = _mm512_fmadd_ps(we[r], xe, acc[r][t]);
                acc[r][t] = _mm512_fmadd_ps(wo[r], xo, acc[r][t]);
            }
        }
    }
    for (int r = 0; r < MR; r++)
        for (int t = 0; t < NR; t++) out[t * ldo + r] = _mm512_reduce_add_ps(acc[r][t]);
}

/* The same with x rounded to bf16 (CPU_BF16_DOT): one vdpbf16ps a chunk multiplies 32 weight
 * columns into 32 of x and adds neighbouring pairs into the 16 fp32 lanes, twice the
 * multiply-adds of the widening path's two FMAs and no widening. */
__attribute__((target(T512 ",avx512bf16"), always_inline)) static inline void
tile_dot(const uint16_t *w, int64_t k, const uint16_t *xp, int64_t xs, float *out, int64_t ldo,
         const int MR, const int NR) {
    const int64_t nch = (k + 31) / 32;
    const __mmask32 tail = k % 32 ? (__mmask32)((1u << (k % 32)) - 1) : ~(__mmask32)0;
    __m512 acc[4][4];
    for (int r = 0; r < MR; r++)
        for (int t = 0; t < NR; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t c = 0; c < nch; c++) {
        __mmask32 mk = c + 1 < nch ? ~(__mmask32)0 : tail;
        __m512bh wv[4];
        for (int r = 0; r < MR; r++) {
            const uint16_t *p = w + r * k + c * 32;
            wv[r] = (__m512bh)_mm512_maskz_loadu_epi16(mk, p);
        }
        for (int t = 0; t < NR; t++) {
            __m512bh xv = (__m512bh)_mm512_load_si512(xp + t * xs + c * 32);
            for (int r = 0; r < MR; r++) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wv[r], xv);
        }
    }
    for (int r = 0; r < MR; r++)
        for (int t = 0; t < NR; t++) out[t * ldo + r] = _mm512_reduce_add_ps(acc[r][t]);
}

BF16_DRIVER(gemm_f32, __attribute__((target(T512))), float, tile)
BF16_DRIVER(gemm_dot, __attribute__((target(T512 ",avx512bf16"))), uint16_t, tile_dot)

void cpu_bf16_gemm(cpu_bf16_kind kind, const uint16_t *w, int64_t k, int64_t r0, int64_t r1,
                   const void *xp, int n, float *out, int64_t ldo) {
    int64_t padded = (k + 31) / 32 * 32;
    if (kind == CPU_BF16_F32) gemm_f32(w, k, r0, r1, xp, n, out, ldo, padded);
    if (kind == CPU_BF16_DOT) gemm_dot(w, k, r0, r1, xp, n, out, ldo, padded);
}
#elif defined(__aarch64__)
#include <arm_neon.h>
#include <string.h>

/* The NEON tile: as the AVX-512 one, each chunk's 32 bf16 as four vectors of 8, each widened
 * to its 4 even columns (shifted up) and 4 odd ones (masked), against the packed x's matching
 * quarter of the even and of the odd half. A row's last, partial chunk is read from a
 * zero-padded copy (NEON has no masked load, and the bytes past a row may not be numbers). */
static inline __attribute__((always_inline)) void
tile(const uint16_t *w, int64_t k, const float *xp, int64_t xs, float *out, int64_t ldo,
     const int MR, const int NR) {
    const int64_t nch = (k + 31) / 32, full = k / 32;
    const uint32x4_t hi = vdupq_n_u32(0xffff0000u);
    float32x4_t acc[4][4];
    uint16_t last[4][32];
    for (int r = 0; r < MR; r++)
        for (int t = 0; t < NR; t++) acc[r][t] = vdupq_n_f32(0.0f);
    for (int64_t c = 0; c < nch; c++) {
        const uint16_t *wp[4];
        for (int r = 0; r < MR; r++) {
            wp[r] = w + r * k + c * 32;
            if (c == full) {
                memset(last[r], 0, sizeof last[r]);
                memcpy(last[r], wp[r], sizeof(uint16_t) * (size_t)(k % 32));
                wp[r] = last[r];
            }
        }
        for (int q = 0; q < 4; q++) {
            float32x4_t we[4], wo[4];
            for (int r = 0; r < MR; r++) {
                uint32x4_t v = vreinterpretq_u32_u16(vld1q_u16(wp[r] + 8 * q));
                we[r] = vreinterpretq_f32_u32(vshlq_n_u32(v, 16));
                wo[r] = vreinterpretq_f32_u32(vandq_u32(v, hi));
            }
            for (int t = 0; t < NR; t++) {
                const float *x = xp + t * xs + c * 32;
                float32x4_t xe = vld1q_f32(x + 4 * q), xo = vld1q_f32(x + 16 + 4 * q);
                for (int r = 0; r < MR; r++) {
                    acc[r][t] = vfmaq_f32(acc[r][t], we[r], xe);
                    acc[r][t] = vfmaq_f32(acc[r][t], wo[r], xo);
                }
            }
        }
    }
    for (int r = 0; r < MR; r++)
        for (int t = 0; t < NR; t++) out[t * ldo + r] = vaddvq_f32(acc[r][t]);
}

/* The same blocks, rows and tiles as the AVX-512 driver. */
BF16_DRIVER(gemm_neon, , float, tile)

void cpu_bf16_gemm(cpu_bf16_kind kind, const uint16_t *w, int64_t k, int64_t r0, int64_t r1,
                   const void *xp, int n, float *out, int64_t ldo) {
    if (kind == CPU_BF16_NEON) gemm_neon(w, k, r0, r1, xp, n, out, ldo, (k + 31) / 32 * 32);
}
#else
void cpu_bf16_gemm(cpu_bf16_kind kind, const uint16_t *w, int64_t k, int64_t r0, int64_t r1,
                   const void *xp, int n, float *out, int64_t ldo) {
    (void)kind, (void)w, (void)k, (void)r0, (void)r1, (void)xp, (void)n, (void)out, (void)ldo;
    /* never called: cpu_bf16_kind_supported says no off x86-64 and aarch64 */
}
#endif

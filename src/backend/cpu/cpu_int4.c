/* backend/cpu/cpu_int4.c — INT4 weights (backend.h's ATLAS_WFMT_INT4) read straight from
 * their packed nibbles with AVX2/FMA, where each group's columns are whole 8-lane steps (no
 * g_idx, groups a multiple of 8 columns; the rest, and targets without AVX2, take
 * cpu_quant.c's row dequantizer).
 *
 * Decode multiplies the packed bytes into the token as it reads them, four rows at a time
 * sharing the loads of x: each byte is read once and no fp32 row is written. Each group's
 * sixteen values are made once per row, and each 8-column step looks its nibbles up in them
 * (AVX2: two permutes and a blend; AVX-512VL, where the CPU has it: one two-table permute),
 * which costs fewer operations than converting and scaling every nibble: on a CPU the INT4
 * decode is bound by operations a weight, not by the bytes read. Prefill
 * dequantizes a row eight columns a step into the matmul's tile. Both give, weight for weight,
 * cpu_dequant_row's value ((q - zero) then x scale, two float32 roundings) and sum in the
 * matmul's order (cpu_matmul.c's header), so the result is bitwise that of the plain path:
 * tests/test-quant.c checks the two against each other. */
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_simd.h"

int cpu_int4_fast(const cpu_part *p) {
#ifdef CPU_SIMD
    return p->quant.format == ATLAS_WFMT_INT4 && !p->quant.g_idx &&
           p->quant.block_cols % 8 == 0;
#else
    (void)p;
    return 0;
#endif
}

#ifdef CPU_SIMD
/* Columns c .. c+7 (c a multiple of 8) as floats: column c + l is nibble l of the
 * little-endian dword at byte c / 2 (the even column in the low nibble). */
static inline __m256 nibbles8(const uint8_t *b) {
    int32_t v;
    memcpy(&v, b, 4);
    const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    __m256i q = _mm256_srlv_epi32(_mm256_set1_epi32(v), shifts);
    return _mm256_cvtepi32_ps(_mm256_and_si256(q, _mm256_set1_epi32(0xf)));
}

static inline __m256 deq8(const uint8_t *b, __m256 z, __m256 s) {
    return _mm256_mul_ps(_mm256_sub_ps(nibbles8(b), z), s);
}

static inline float deq1(const uint8_t *b, int64_t j, float z, float s) {
    return ((float)((b[j >> 1] >> ((j & 1) * 4)) & 0xf) - z) * s;
}

/* out[i] = dot(row r + i, x) for NR rows (a constant after inlining: the accumulators stay
 * in registers), each 8-column step's weights looked up from its group's sixteen values by
 * LOOKUP(values 0-7, values 8-15, indices): one body for the AVX2 and the AVX-512VL kernels,
 * which differ in that lookup and in the target they are compiled for. */
#define GEMV_ROWS(NAME, ATTR, LOOKUP)                                                          \
    static inline ATTR void NAME(const cpu_part *p, const float *x, int64_t k, int64_t r,      \
                                 float *out, const int NR) {                                   \
    const atlas_wquant *q = &p->quant;                                                      \
    const int64_t kb = k / 2, k8 = k & ~(int64_t)7, bc = q->block_cols, sc = q->scale_cols; \
    const uint8_t *b[4];                                                                    \
    const float *s[4], *z[4];                                                               \
    __m256 a[4];                                                                            \
    for (int i = 0; i < NR; i++) {                                                          \
        b[i] = (const uint8_t *)p->data + (r + i) * kb;                                     \
        s[i] = q->scales + (r + i) * sc;                                                    \
        z[i] = q->zeros + (r + i) * sc;                                                     \
        a[i] = _mm256_setzero_ps();                                                         \
    }                                                                                       \
    const __m256 q_lo = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);                             \
    const __m256 q_hi = _mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15);                       \
    const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);                  \
    for (int64_t j0 = 0, g = 0; j0 < k8; j0 += bc, g++) {                                   \
        int64_t j1 = j0 + bc < k8 ? j0 + bc : k8;                                           \
        __m256 t_lo[4], t_hi[4];                                                            \
        for (int i = 0; i < NR; i++) {                                                      \
            __m256 sg = _mm256_set1_ps(s[i][g]), zg = _mm256_set1_ps(z[i][g]);              \
            t_lo[i] = _mm256_mul_ps(_mm256_sub_ps(q_lo, zg), sg);                           \
            t_hi[i] = _mm256_mul_ps(_mm256_sub_ps(q_hi, zg), sg);                           \
        }                                                                                   \
        for (int64_t j = j0; j < j1; j += 8) {                                              \
            __m256 xv = _mm256_loadu_ps(x + j);                                             \
            for (int i = 0; i < NR; i++) {                                                  \
                int32_t v;                                                                  \
                memcpy(&v, b[i] + j / 2, 4);                                                \
                __m256i idx = _mm256_srlv_epi32(_mm256_set1_epi32(v), shifts);              \
                __m256 w = LOOKUP(t_lo[i], t_hi[i], idx);                                   \
                a[i] = _mm256_fmadd_ps(w, xv, a[i]);                                        \
            }                                                                               \
        }                                                                                   \
    }                                                                                       \
    float sum[4];                                                                           \
    for (int i = 0; i < NR; i++) sum[i] = cpu_hsum256(a[i]);                                \
    for (int64_t j = k8; j < k; j++)                                                        \
        for (int i = 0; i < NR; i++) {                                                      \
            float w = deq1(b[i], j, z[i][j / bc], s[i][j / bc]);                            \
            sum[i] += w * x[j];                                                             \
        }                                                                                   \
    for (int i = 0; i < NR; i++) out[i] = sum[i];                                           \
    }

/* AVX2: two permutes and a blend on the index's fourth bit. */
static inline __m256 lookup_avx2(__m256 lo, __m256 hi, __m256i idx) {
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, idx), _mm256_permutevar8x32_ps(hi, idx),
                            _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
}
GEMV_ROWS(gemv_rows, __attribute__((always_inline)), lookup_avx2)

/* AVX-512VL where the CPU has it: one two-table permute (vpermt2ps) looks up all sixteen
 * values, two operations a step where the AVX2 lookup takes five. */
#define CPU_T512 __attribute__((target("avx512f,avx512vl"), always_inline))
#define LOOKUP512(lo, hi, idx) _mm256_permutex2var_ps(lo, idx, hi)
GEMV_ROWS(gemv_rows512, CPU_T512, LOOKUP512)

__attribute__((target("avx512f,avx512vl"))) static void
gemv512(const cpu_part *p, const float *x, int64_t k, int64_t r0, int64_t r1, float *out) {
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) gemv_rows512(p, x, k, r, out + r, 4);
    for (; r < r1; r++) gemv_rows512(p, x, k, r, out + r, 1);
}

void cpu_int4_gemv_at(const cpu_part *p, const float *x, int64_t k, int64_t r0, int64_t r1,
                      float *out, int avx512) {
    if (avx512 && __builtin_cpu_supports("avx512vl")) {
        gemv512(p, x, k, r0, r1, out);
        return;
    }
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) gemv_rows(p, x, k, r, out + r, 4);
    for (; r < r1; r++) gemv_rows(p, x, k, r, out + r, 1);
}

void cpu_int4_gemv(const cpu_part *p, const float *x, int64_t k, int64_t r0, int64_t r1,
                   float *out) {
    cpu_int4_gemv_at(p, x, k, r0, r1, out, 1);
}

void cpu_int4_row(const cpu_part *p, int64_t r, int64_t k, float *dst) {
    const atlas_wquant *q = &p->quant;
    const int64_t k8 = k & ~(int64_t)7, bc = q->block_cols;
    const uint8_t *b = (const uint8_t *)p->data + r * (k / 2);
    const float *s = q->scales + r * q->scale_cols, *z = q->zeros + r * q->scale_cols;
    for (int64_t j0 = 0, g = 0; j0 < k8; j0 += bc, g++) {
        int64_t j1 = j0 + bc < k8 ? j0 + bc : k8;
        __m256 sg = _mm256_set1_ps(s[g]), zg = _mm256_set1_ps(z[g]);
        for (int64_t j = j0; j < j1; j += 8) _mm256_storeu_ps(dst + j, deq8(b + j / 2, zg, sg));
    }
    for (int64_t j = k8; j < k; j++) dst[j] = deq1(b, j, z[j / bc], s[j / bc]);
}
#else
void cpu_int4_gemv_at(const cpu_part *p, const float *x, int64_t k, int64_t r0, int64_t r1,
                      float *out, int avx512) {
    (void)p, (void)x, (void)k, (void)r0, (void)r1, (void)out, (void)avx512;
    /* never called: cpu_int4_fast says no without AVX2 */
}

void cpu_int4_gemv(const cpu_part *p, const float *x, int64_t k, int64_t r0, int64_t r1,
                   float *out) {
    cpu_int4_gemv_at(p, x, k, r0, r1, out, 0);
}

void cpu_int4_row(const cpu_part *p, int64_t r, int64_t k, float *dst) {
    cpu_dequant_row(p, r, k, dst);
}
#endif

/* backend/cpu/cpu_q8.c — INT4 weights times activations quantized to int8 (`--cpu-activations
 * int8`), the scheme llama.cpp runs its 4-bit formats with: each token's x in blocks of 32
 * columns, a block's values round(x / d) with d = max |x| / 127, and the products summed as
 * integers (AVX512-VNNI's vpdpbusd, AVX2's vpmaddubsw: unsigned nibble times signed byte), a
 * 32-bit sum a weight group and block scaled once in fp32. The fp32 path spends five
 * operations on eight weights and is bound by them, not by the bytes; this one spends about
 * ten on 128.
 *
 * A weight row of group g, zero z and scale s gives, for block b of x:
 *   s * sum_j (q_j - z) * d_b * xq_j = s * d_b * sum_j q_j * xq_j - s * z * (d_b * sum_j xq_j)
 * so the kernel sums q * xq in integers and subtracts, once a row, sum_g s_g z_g X_g, where X_g
 * (the packed token's sum of its dequantized values over group g) is computed at packing.
 *
 * Packed token layout (cpu_q8_pack), for k rounded up to kp, a multiple of 128: per 128-column
 * chunk its 64 even columns then its 64 odd ones as int8 (a weight byte's low and high
 * nibbles, so one mask and one shift give the bytes vpdpbusd pairs with them); then kp / 32
 * fp32 block scales d_b; then the group sums X_g, zero-padded to a multiple of 16. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_simd.h"

#if defined(__aarch64__) && defined(__GNUC__)
#include <arm_neon.h>
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#define CPU_Q8_HAVE_NEON 1
#endif

int cpu_q8_kind_supported(cpu_q8_kind kind) {
#if defined(__x86_64__) && defined(__GNUC__) && defined(CPU_SIMD)
    __builtin_cpu_init();
    if (kind == CPU_Q8_AVX2) return 1;
    if (kind == CPU_Q8_VNNI)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#endif
#ifdef CPU_Q8_HAVE_NEON
    if (kind == CPU_Q8_NEON) return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#endif
    return kind == CPU_Q8_PLAIN;
}

cpu_q8_kind cpu_q8_best(void) {
    if (cpu_q8_kind_supported(CPU_Q8_VNNI)) return CPU_Q8_VNNI;
    if (cpu_q8_kind_supported(CPU_Q8_AVX2)) return CPU_Q8_AVX2;
    if (cpu_q8_kind_supported(CPU_Q8_NEON)) return CPU_Q8_NEON;
    return CPU_Q8_PLAIN;
}

/* Groups the kernels' lane scales handle: 32 or 64 columns (a fixed pattern in a chunk) or
 * whole chunks (one scale a chunk). */
static int group_ok(int64_t bc) { return bc == 32 || bc == 64 || (bc > 0 && bc % 128 == 0); }

int cpu_q8_fits(const atlas_weight *w) {
    if (w->n_dims != 2 || w->cols % 32 || w->n_parts < 1) return 0;
    int bc = w->parts[0].quant.block_cols;
    for (int p = 0; p < w->n_parts; p++) {
        const atlas_wquant *q = &w->parts[p].quant;
        if (q->format != ATLAS_WFMT_INT4 || q->g_idx || q->block_cols != bc) return 0;
    }
    /* one group a row (per channel) is a group of cols columns */
    return group_ok(bc) || bc >= w->cols;
}

static int64_t padded(int64_t k) { return (k + 127) / 128 * 128; }

/* Groups as the packing sums them: a per-channel weight's block_cols may exceed k. */
static int64_t n_groups(int64_t k, int64_t bc) { return (k + bc - 1) / bc; }

/* What every kernel derives from a part and k: bytes a row (kb), k padded to whole chunks
 * (kp, nch of them), the group (bc), scales a row (sc), the chunks inside the row (nfull),
 * and whether each chunk has one scale (whole: groups of whole chunks or one a row). */
typedef struct q8_shape {
    int64_t kb, kp, nch, bc, sc, nfull;
    int whole;
} q8_shape;

static inline q8_shape q8_shape_of(const cpu_part *p, int64_t k) {
    q8_shape g = {k / 2, padded(k), padded(k) / 128, p->quant.block_cols, p->quant.scale_cols,
                  k / 2 / 64, 0};
    g.whole = g.bc % 128 == 0 || g.bc >= k;
    return g;
}

size_t cpu_q8_pack_bytes(int64_t k, int64_t bc) {
    int64_t kp = padded(k), g = (n_groups(k, bc) + 15) / 16 * 16;
    return (size_t)kp + (size_t)(kp / 32) * sizeof(float) + (size_t)g * sizeof(float);
}

/* One block of 32 columns: its int8 values into the chunk's even and odd halves, its scale
 * into *d; returns the sum of its values. */
static int pack_block_plain(const float *xb, int64_t b, int8_t *q, float *d) {
    float amax = 0;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xb[i]));
    float inv = amax > 0 ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int i = 0; i < 32; i++) {
        int64_t j = b * 32 + i, c = j / 128, jj = j % 128;
        int v = (int)nearbyintf(xb[i] * inv);
        v = v > 127 ? 127 : v < -127 ? -127 : v;
        q[c * 128 + (jj & 1) * 64 + jj / 2] = (int8_t)v;
        sum += v;
    }
    *d = amax / 127.0f;
    return sum;
}

#ifdef CPU_SIMD
/* The same with AVX2, value for value: the same products, rounded to nearest even and
 * clamped in fp32 (exact: |x * inv| stays near 127), then packed to bytes and split into
 * the even and odd columns. Prefill packs every token of every matmul: in plain C (fmaxf a
 * libm call) that was 4.5% of an INT4 prefill's CPU time, on one thread (bench/RESULTS.md). */
static int pack_block_avx2(const float *xb, int64_t b, int8_t *q, float *d) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], m;
    for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(xb + 8 * i);
    m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                      _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float amax = _mm_cvtss_f32(h);
    float inv = amax > 0 ? 127.0f / amax : 0.0f;
    const __m256 vi = _mm256_set1_ps(inv), lim = _mm256_set1_ps(127.0f), nlim = _mm256_set1_ps(-127.0f);
    __m256i n[4], acc = _mm256_setzero_si256();
    for (int i = 0; i < 4; i++) {
        __m256 r = _mm256_round_ps(_mm256_mul_ps(v[i], vi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        n[i] = _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(r, lim), nlim));
        acc = _mm256_add_epi32(acc, n[i]);
    }
    /* bytes in dword order: columns 0-3, 8-11, 16-19, 24-27 | 4-7, 12-15, 20-23, 28-31 */
    __m256i p8 = _mm256_packs_epi16(_mm256_packs_epi32(n[0], n[1]), _mm256_packs_epi32(n[2], n[3]));
    p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    /* in each 16 columns the even ones, then the odd ones; then evens 0-31, odds 0-31 */
    const __m256i eo = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                        0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    p8 = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(p8, eo), 0xd8);
    int8_t *dst = q + (b / 4) * 128 + (b % 4) * 16;
    _mm_storeu_si128((__m128i *)dst, _mm256_castsi256_si128(p8));
    _mm_storeu_si128((__m128i *)(dst + 64), _mm256_extracti128_si256(p8, 1));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    *d = amax / 127.0f;
    return _mm_cvtsi128_si32(s);
}
#endif

void cpu_q8_pack_at(const float *x, int64_t k, int64_t bc, void *dst, int simd) {
    int64_t kp = padded(k);
    int8_t *q = dst;
    float *d = (float *)(q + kp), *xg = d + kp / 32;
    memset(dst, 0, cpu_q8_pack_bytes(k, bc));
    for (int64_t b = 0; b < k / 32; b++) {
#ifdef CPU_SIMD
        int sum = simd ? pack_block_avx2(x + b * 32, b, q, d + b) : pack_block_plain(x + b * 32, b, q, d + b);
#else
        (void)simd;
        int sum = pack_block_plain(x + b * 32, b, q, d + b);
#endif
        xg[(b * 32) / bc] += d[b] * (float)sum;
    }
}

void cpu_q8_pack(const float *x, int64_t k, int64_t bc, void *dst) { cpu_q8_pack_at(x, k, bc, dst, 1); }

/* A row's last chunk, when k stops inside it, as a zeroed copy (its bytes past the row are
 * the next row's). */
static inline const uint8_t *chunk_tail_plain(const uint8_t *row, int64_t c, int64_t kb,
                                              uint8_t *tmp) {
    int64_t off = c * 64;
    memset(tmp, 0, 64);
    memcpy(tmp, row + off, (size_t)(kb - off));
    return tmp;
}

/* The zero points' share of a row: sum over groups of s_g * z_g * X_g. */
static float zero_term(const float *s, const float *z, const float *xg, int64_t ng) {
    float t = 0;
    for (int64_t g = 0; g < ng; g++) t += s[g] * z[g] * xg[g];
    return t;
}

/* The reference every kernel is checked against: a block's integer sum, then scaled. */
static void rows_plain(const cpu_part *p, int64_t k, int64_t r, const void *xp, float *out) {
    const atlas_wquant *qw = &p->quant;
    int64_t kp = padded(k), bc = qw->block_cols, ng = qw->scale_cols;
    const int8_t *q = xp;
    const float *d = (const float *)(q + kp), *xg = d + kp / 32;
    const uint8_t *b = (const uint8_t *)p->data + r * (k / 2);
    const float *s = qw->scales + r * qw->scale_cols, *z = qw->zeros + r * qw->scale_cols;
    float acc = 0;
    for (int64_t blk = 0; blk < k / 32; blk++) {
        int isum = 0;
        for (int i = 0; i < 32; i++) {
            int64_t j = blk * 32 + i, c = j / 128, jj = j % 128;
            int w = (b[j / 2] >> ((j & 1) * 4)) & 0xf;
            isum += w * q[c * 128 + (jj & 1) * 64 + jj / 2];
        }
        acc += (float)isum * (d[blk] * s[(blk * 32) / bc]);
    }
    *out = acc - zero_term(s, z, xg, ng);
}

#ifdef CPU_SIMD
/* Chunk c's group scale index for groups of whole chunks (bc a multiple of 128, or one
 * group a row): kept as a counter, for a division a chunk costs more than the chunk. */
typedef struct grp_walk {
    int64_t g, left, per; /* the group, its chunks left, chunks a group (0: one group) */
} grp_walk;

static inline grp_walk grp_start(int64_t bc, int64_t k) {
    grp_walk w = {0, 0, bc >= k ? 0 : bc / 128};
    w.left = w.per;
    return w;
}

static inline void grp_next(grp_walk *w) {
    if (w->per && --w->left == 0) {
        w->g++;
        w->left = w->per;
    }
}

/* zero_term with AVX2, eight groups a step, for each x86 kernel's one-token rows and tiles
 * alike (a token's sum must not depend on which of the two took it): in scalar code a
 * row's groups cost about a fifth of its integer work at k = 1024. */
static inline float zero_term_avx2(const float *s, const float *z, const float *xg, int64_t ng) {
    __m256 a = _mm256_setzero_ps();
    int64_t g = 0;
    for (; g + 8 <= ng; g += 8)
        a = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(s + g), _mm256_loadu_ps(z + g)),
                            _mm256_loadu_ps(xg + g), a);
    float t = cpu_hsum256(a);
    for (; g < ng; g++) t += s[g] * z[g] * xg[g];
    return t;
}

#define T_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

/* A row's lane scales for chunk c, s the row's scales: one a chunk when whole (group g), else
 * groups of 32 or 64 from c's first (lane_grp: each lane's; none past the row's last). */
static inline T_VNNI __attribute__((always_inline)) __m512
lane_scales(const float *s, int64_t c, int64_t g, int64_t sc, int64_t g_shift, __m512i lane_grp,
            int whole) {
    if (whole) return _mm512_set1_ps(s[g]);
    const int64_t g0 = c << g_shift, left = sc - g0;
    const __mmask16 gm = (__mmask16)(left >= 4 ? 0xf : left > 0 ? (1u << left) - 1 : 0);
    return _mm512_permutexvar_ps(lane_grp, _mm512_maskz_loadu_ps(gm, s + g0));
}

/* Chunk c of a row (its 64 bytes at wb) into acc: x's even and odd bytes, the blocks' scales,
 * the row's lane scales (lane_scales, WHOLE its whole). */
static inline T_VNNI __attribute__((always_inline)) __m512
chunk_vnni(__m512 acc, const uint8_t *wb, const int8_t *q, const float *d, int64_t c,
           const float *s, int64_t g, int64_t sc, int64_t g_shift, __m512i lane_grp,
           const int WHOLE) {
    const __m512i m0f = _mm512_set1_epi8(0x0f);
    const __m512i lane_blk = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i xe = _mm512_loadu_si512(q + c * 128), xo = _mm512_loadu_si512(q + c * 128 + 64);
    const __m512 dv = _mm512_permutexvar_ps(lane_blk, _mm512_castps128_ps512(_mm_loadu_ps(d + c * 4)));
    const __m512i w = _mm512_loadu_si512(wb);
    __m512i t = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(w, m0f), xe);
    t = _mm512_dpbusd_epi32(t, _mm512_and_si512(_mm512_srli_epi16(w, 4), m0f), xo);
    const __m512 sv = lane_scales(s, c, g, sc, g_shift, lane_grp, WHOLE);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(dv, sv), acc);
}

/* Row r against one packed token, WHOLE as chunk_vnni: the row's whole chunks straight from
 * it, then the one k stops inside through a zeroed copy. */
static inline T_VNNI __attribute__((always_inline)) float
row_vnni_of(const cpu_part *p, const q8_shape sh, int64_t k, int64_t r, const void *xp,
            const int WHOLE) {
    const atlas_wquant *qw = &p->quant;
    const int64_t kb = sh.kb, kp = sh.kp, nch = sh.nch, bc = sh.bc, sc = sh.sc, nfull = sh.nfull;
    const int8_t *q = xp;
    const float *d = (const float *)(q + kp), *xg = d + kp / 32;
    const uint8_t *row = (const uint8_t *)p->data + r * kb;
    const float *s = qw->scales + r * sc;
    /* lane l covers columns 8l .. 8l + 7 of a chunk: block l / 4, group (8l) / bc */
    const __m512i lane_blk = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i lane_grp = bc == 32 ? lane_blk : _mm512_srli_epi32(lane_blk, 1);
    const int64_t g_shift = bc == 32 ? 2 : 1; /* groups of 32 / 64: chunk c starts group c << */
    __m512 acc = _mm512_setzero_ps();
    grp_walk gw = grp_start(bc, k);
    int64_t c = 0;
    for (; c < nfull; c++, grp_next(&gw))
        acc = chunk_vnni(acc, row + c * 64, q, d, c, s, gw.g, sc, g_shift, lane_grp, WHOLE);
    for (; c < nch; c++, grp_next(&gw)) {
        __attribute__((aligned(64))) uint8_t tmp[64];
        acc = chunk_vnni(acc, chunk_tail_plain(row, c, kb, tmp), q, d, c, s, gw.g, sc, g_shift,
                         lane_grp, WHOLE);
    }
    return _mm512_reduce_add_ps(acc) - zero_term_avx2(s, qw->zeros + r * sc, xg, sc);
}

/* Row r of part p against one packed token. One row at a time reads the weights in address
 * order, which the hardware prefetchers follow at the read rate; four rows interleaved chunk
 * by chunk (64 bytes from each of four streams kb apart) they did not, and software
 * prefetches made up for none of it: a 151,936 x 1,024 decode matmul in groups of 128 took
 * 8.7 ms that way against 3.7 one row at a time (one thread, Zen 4). x's packed chunks, read
 * again for each row, stay in L1. */
static inline T_VNNI __attribute__((always_inline)) void
row_vnni(const cpu_part *p, const q8_shape sh, int64_t k, int64_t r, const void *xp, float *out) {
    *out = sh.whole ? row_vnni_of(p, sh, k, r, xp, 1) : row_vnni_of(p, sh, k, r, xp, 0);
}

/* Prefill's tile: 4 rows times Q8_TILE_TOKENS tokens, each chunk's nibbles unpacked once for
 * all of them (the 4 rows stay in L1 while every token's packed x streams from L2); the same
 * sums, in the same order, as row_vnni gives each token alone. */
enum { Q8_TILE_TOKENS = 3 };

static inline T_VNNI __attribute__((always_inline)) void
tile_vnni(const cpu_part *p, int64_t k, int64_t r, const void *xp, size_t xs, float *out,
          int64_t ldo) {
    enum { NT = Q8_TILE_TOKENS };
    const atlas_wquant *qw = &p->quant;
    const q8_shape sh = q8_shape_of(p, k);
    const int64_t kb = sh.kb, kp = sh.kp, nch = sh.nch, bc = sh.bc, sc = sh.sc, nfull = sh.nfull;
    const int whole = sh.whole;
    const uint8_t *row[4];
    const float *s[4];
    __m512 acc[4][NT];
    for (int i = 0; i < 4; i++) {
        row[i] = (const uint8_t *)p->data + (r + i) * kb;
        s[i] = qw->scales + (r + i) * sc;
        for (int t = 0; t < NT; t++) acc[i][t] = _mm512_setzero_ps();
    }
    const __m512i m0f = _mm512_set1_epi8(0x0f);
    const __m512i lane_blk = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i lane_grp = bc == 32 ? lane_blk : _mm512_srli_epi32(lane_blk, 1);
    const int64_t g_shift = bc == 32 ? 2 : 1;
    grp_walk gw = grp_start(bc, k);
    for (int64_t c = 0; c < nch; c++) {
        __attribute__((aligned(64))) uint8_t tmp[4][64];
        __m512i lo[4], hi[4];
        __m512 sv[4];
        for (int i = 0; i < 4; i++) {
            __m512i w = _mm512_loadu_si512(c < nfull ? row[i] + c * 64 : chunk_tail_plain(row[i], c, kb, tmp[i]));
            lo[i] = _mm512_and_si512(w, m0f);
            hi[i] = _mm512_and_si512(_mm512_srli_epi16(w, 4), m0f);
            sv[i] = lane_scales(s[i], c, gw.g, sc, g_shift, lane_grp, whole);
        }
        for (int t = 0; t < NT; t++) {
            const int8_t *q = (const int8_t *)xp + xs * t;
            const float *d = (const float *)(q + kp);
            const __m512i xe = _mm512_loadu_si512(q + c * 128), xo = _mm512_loadu_si512(q + c * 128 + 64);
            const __m512 dv = _mm512_permutexvar_ps(lane_blk, _mm512_castps128_ps512(_mm_loadu_ps(d + c * 4)));
            for (int i = 0; i < 4; i++) {
                __m512i v = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[i], xe);
                v = _mm512_dpbusd_epi32(v, hi[i], xo);
                acc[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), _mm512_mul_ps(dv, sv[i]), acc[i][t]);
            }
        }
        grp_next(&gw);
    }
    for (int t = 0; t < NT; t++) {
        const float *xg = (const float *)((const int8_t *)xp + xs * t + kp) + kp / 32;
        for (int i = 0; i < 4; i++)
            out[t * ldo + i] = _mm512_reduce_add_ps(acc[i][t]) -
                               zero_term_avx2(s[i], qw->zeros + (r + i) * sc, xg, sc);
    }
}

T_VNNI static void gemm_vnni(const cpu_part *p, int64_t k, int64_t r0, int64_t r1,
                             const void *xp, size_t xs, int n, float *out, int64_t ldo) {
    const q8_shape sh = q8_shape_of(p, k);
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {
        int t = 0;
        for (; t + Q8_TILE_TOKENS <= n; t += Q8_TILE_TOKENS)
            tile_vnni(p, k, r, (const char *)xp + xs * t, xs, out + t * ldo + r, ldo);
        for (; t < n; t++)
            for (int i = 0; i < 4; i++)
                row_vnni(p, sh, k, r + i, (const char *)xp + xs * t, out + t * ldo + r + i);
    }
    for (; r < r1; r++)
        for (int t = 0; t < n; t++)
            row_vnni(p, sh, k, r, (const char *)xp + xs * t, out + t * ldo + r);
}

/* A row's weight scales for the half chunk whose first block is b0, lane l taking columns
 * 8l .. 8l + 7: one group a chunk or a row (whole: group g), groups of 64, or of 32 (this
 * half's two blocks; past the last group 0). */
static inline __m256 half_scales(const float *s, int64_t g, int64_t b0, int64_t bc, int64_t sc,
                                 int whole) {
    if (whole) return _mm256_set1_ps(s[g]);
    if (bc == 64) return _mm256_set1_ps(s[b0 / 2]);
    float s1 = b0 + 1 < sc ? s[b0 + 1] : 0.0f;
    return _mm256_setr_ps(s[b0], s[b0], s[b0], s[b0], s1, s1, s1, s1);
}

/* AVX2: vpmaddubsw pairs each nibble with its byte of x into 16 bits (at most 2 x 15 x 127,
 * and the low and high sums added stay below 32,767), vpmaddwd widens to eight 32-bit lanes,
 * lane l again columns 8l .. 8l + 7 of a 64-column half chunk. One row at a time, as
 * row_vnni and for its reason. */
static inline __attribute__((always_inline)) void
row_avx2(const cpu_part *p, const q8_shape sh, int64_t k, int64_t r, const void *xp, float *out) {
    const atlas_wquant *qw = &p->quant;
    const int64_t kb = sh.kb, kp = sh.kp, nch = sh.nch, bc = sh.bc, sc = sh.sc, nfull = sh.nfull;
    const int whole = sh.whole;
    const int8_t *q = xp;
    const float *d = (const float *)(q + kp), *xg = d + kp / 32;
    const uint8_t *row = (const uint8_t *)p->data + r * kb;
    const float *s = qw->scales + r * sc;
    __m256 acc = _mm256_setzero_ps();
    uint8_t tmp[64];
    const __m256i m0f = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const __m256i lane_blk = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    grp_walk gw = grp_start(bc, k);
    for (int64_t c = 0; c < nch; grp_next(&gw), c++) {
        const uint8_t *wc = c < nfull ? row + c * 64 : chunk_tail_plain(row, c, kb, tmp);
        for (int h = 0; h < 2; h++) {
            const __m256i xe = _mm256_loadu_si256((const __m256i *)(q + c * 128 + h * 32));
            const __m256i xo = _mm256_loadu_si256((const __m256i *)(q + c * 128 + 64 + h * 32));
            const int64_t b0 = c * 4 + h * 2; /* first block of this half */
            const __m256 dv = _mm256_permutevar8x32_ps(
                _mm256_castps128_ps256(_mm_castpd_ps(_mm_load_sd((const double *)(d + b0)))),
                lane_blk);
            __m256i w = _mm256_loadu_si256((const __m256i *)(wc + h * 32));
            __m256i lo = _mm256_and_si256(w, m0f);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m0f);
            __m256i t16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xe), _mm256_maddubs_epi16(hi, xo));
            __m256i t = _mm256_madd_epi16(t16, ones);
            const __m256 sv = half_scales(s, gw.g, b0, bc, sc, whole);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(dv, sv), acc);
        }
    }
    *out = cpu_hsum256(acc) - zero_term_avx2(s, qw->zeros + r * sc, xg, sc);
}

/* Prefill's tile with AVX2: Q8_ROWS_AVX2 rows times Q8_TILE_AVX2 tokens, each half chunk's
 * nibbles unpacked once for all of them (row_avx2 unpacks them again for every token); the
 * same sums, in the same order, as row_avx2 gives each token alone. Two rows by four tokens
 * keep the eight accumulators and four unpacked halves in the sixteen registers (4 x 2
 * spilled the accumulators): 1.5-1.7x the untiled kernel's rate (bench/RESULTS.md). */
enum { Q8_ROWS_AVX2 = 2, Q8_TILE_AVX2 = 4 };

static inline __attribute__((always_inline)) void
tile_avx2(const cpu_part *p, int64_t k, int64_t r, const void *xp, size_t xs, float *out,
          int64_t ldo) {
    enum { NT = Q8_TILE_AVX2, NR = Q8_ROWS_AVX2 };
    const atlas_wquant *qw = &p->quant;
    const q8_shape sh = q8_shape_of(p, k);
    const int64_t kb = sh.kb, kp = sh.kp, nch = sh.nch, bc = sh.bc, sc = sh.sc, nfull = sh.nfull;
    const int whole = sh.whole;
    const uint8_t *row[NR];
    const float *s[NR];
    __m256 acc[NR][NT];
    __attribute__((aligned(32))) uint8_t tmp[NR][64];
    for (int i = 0; i < NR; i++) {
        row[i] = (const uint8_t *)p->data + (r + i) * kb;
        s[i] = qw->scales + (r + i) * sc;
        for (int t = 0; t < NT; t++) acc[i][t] = _mm256_setzero_ps();
    }
    const __m256i m0f = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const __m256i lane_blk = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    grp_walk gw = grp_start(bc, k);
    for (int64_t c = 0; c < nch; grp_next(&gw), c++) {
        const uint8_t *wc[NR];
        for (int i = 0; i < NR; i++) wc[i] = c < nfull ? row[i] + c * 64 : chunk_tail_plain(row[i], c, kb, tmp[i]);
        for (int h = 0; h < 2; h++) {
            const int64_t b0 = c * 4 + h * 2;
            __m256i lo[NR], hi[NR];
            __m256 sv[NR];
            for (int i = 0; i < NR; i++) {
                __m256i w = _mm256_loadu_si256((const __m256i *)(wc[i] + h * 32));
                lo[i] = _mm256_and_si256(w, m0f);
                hi[i] = _mm256_and_si256(_mm256_srli_epi16(w, 4), m0f);
                sv[i] = half_scales(s[i], gw.g, b0, bc, sc, whole);
            }
            for (int t = 0; t < NT; t++) {
                const int8_t *q = (const int8_t *)xp + xs * t;
                const float *d = (const float *)(q + kp);
                const __m256i xe = _mm256_loadu_si256((const __m256i *)(q + c * 128 + h * 32));
                const __m256i xo = _mm256_loadu_si256((const __m256i *)(q + c * 128 + 64 + h * 32));
                const __m256 dv = _mm256_permutevar8x32_ps(
                    _mm256_castps128_ps256(_mm_castpd_ps(_mm_load_sd((const double *)(d + b0)))),
                    lane_blk);
                for (int i = 0; i < NR; i++) {
                    __m256i t16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo[i], xe), _mm256_maddubs_epi16(hi[i], xo));
                    __m256i t32 = _mm256_madd_epi16(t16, ones);
                    acc[i][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t32), _mm256_mul_ps(dv, sv[i]), acc[i][t]);
                }
            }
        }
    }
    for (int t = 0; t < NT; t++) {
        const float *xg = (const float *)((const int8_t *)xp + xs * t + kp) + kp / 32;
        for (int i = 0; i < NR; i++)
            out[t * ldo + i] = cpu_hsum256(acc[i][t]) - zero_term_avx2(s[i], qw->zeros + (r + i) * sc, xg, sc);
    }
}

static void gemm_avx2(const cpu_part *p, int64_t k, int64_t r0, int64_t r1, const void *xp,
                      size_t xs, int n, float *out, int64_t ldo) {
    const q8_shape sh = q8_shape_of(p, k);
    int64_t r = r0;
    for (; r + Q8_ROWS_AVX2 <= r1; r += Q8_ROWS_AVX2) {
        int t = 0;
        for (; t + Q8_TILE_AVX2 <= n; t += Q8_TILE_AVX2)
            tile_avx2(p, k, r, (const char *)xp + xs * t, xs, out + t * ldo + r, ldo);
        for (; t < n; t++)
            for (int i = 0; i < Q8_ROWS_AVX2; i++)
                row_avx2(p, sh, k, r + i, (const char *)xp + xs * t, out + t * ldo + r + i);
    }
    for (; r < r1; r++)
        for (int t = 0; t < n; t++)
            row_avx2(p, sh, k, r, (const char *)xp + xs * t, out + t * ldo + r);
}
#endif

#ifdef CPU_Q8_HAVE_NEON
/* aarch64 with the dot-product extension (ARMv8.2's sdot, in most cores since Cortex-A55 and
 * in Grace's Neoverse V2): each 16 bytes of a chunk are one block of 32 columns, the low
 * and high nibbles against the block's even and odd bytes of x, a row at a time. */
__attribute__((target("arch=armv8.2-a+dotprod"))) static void
gemm_neon(const cpu_part *p, int64_t k, int64_t r0, int64_t r1, const void *xp, size_t xs,
          int n, float *out, int64_t ldo) {
    const atlas_wquant *qw = &p->quant;
    const q8_shape sh = q8_shape_of(p, k);
    const int64_t kb = sh.kb, kp = sh.kp, nch = sh.nch, bc = sh.bc, sc = sh.sc, nfull = sh.nfull;
    const uint8x16_t m0f = vdupq_n_u8(0x0f);
    uint8_t tmp[64];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)p->data + r * kb;
        const float *s = qw->scales + r * sc, *z = qw->zeros + r * sc;
        for (int t = 0; t < n; t++) {
            const int8_t *q = (const int8_t *)xp + xs * t;
            const float *d = (const float *)(q + kp), *xg = d + kp / 32;
            float32x4_t acc = vdupq_n_f32(0);
            for (int64_t c = 0; c < nch; c++) {
                const uint8_t *wb = c < nfull ? row + c * 64 : chunk_tail_plain(row, c, kb, tmp);
                for (int pc = 0; pc < 4; pc++) {
                    int64_t blk = c * 4 + pc, g = bc >= k ? 0 : (blk * 32) / bc;
                    if (g >= sc) g = sc - 1; /* a zero-padded block past k: its sum is 0 */
                    uint8x16_t w = vld1q_u8(wb + 16 * pc);
                    int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(w, m0f));
                    int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(w, 4));
                    int32x4_t v = vdotq_s32(vdupq_n_s32(0), lo, vld1q_s8(q + c * 128 + 16 * pc));
                    v = vdotq_s32(v, hi, vld1q_s8(q + c * 128 + 64 + 16 * pc));
                    acc = vfmaq_n_f32(acc, vcvtq_f32_s32(v), d[blk] * s[g]);
                }
            }
            out[t * ldo + r] = vaddvq_f32(acc) - zero_term(s, z, xg, sc);
        }
    }
}
#endif

void cpu_q8_gemm(cpu_q8_kind kind, const cpu_part *p, int64_t k, int64_t r0, int64_t r1,
                 const void *xp, size_t xs, int n, float *out, int64_t ldo) {
#ifdef CPU_SIMD
    if (kind == CPU_Q8_VNNI) {
        gemm_vnni(p, k, r0, r1, xp, xs, n, out, ldo);
        return;
    }
    if (kind == CPU_Q8_AVX2) {
        gemm_avx2(p, k, r0, r1, xp, xs, n, out, ldo);
        return;
    }
#endif
#ifdef CPU_Q8_HAVE_NEON
    if (kind == CPU_Q8_NEON) {
        gemm_neon(p, k, r0, r1, xp, xs, n, out, ldo);
        return;
    }
#endif
    (void)kind;
    for (int64_t r = r0; r < r1; r++)
        for (int t = 0; t < n; t++)
            rows_plain(p, k, r, (const char *)xp + xs * t, out + t * ldo + r);
}

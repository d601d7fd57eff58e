/* backend/cpu/cpu_attention.c — causal attention of the batch's q heads over the paged KV
 * cache (GQA, optional sliding window, optional sinks), fp32.
 *
 * Two paths, chosen at run time (cb->attn). The tiled one (cpu_attn_tile.h: AVX-512 or AVX2,
 * NEON on aarch64)
 * takes a block of up to cb->attn_rows rows, a sequence's consecutive tokens times the q
 * heads of one kv head, through blocks of keys with an online softmax, so each key and value
 * is read once a block instead of once a (token, head); the items are (query block, kv head),
 * ordered so that contiguous ranges mix early (short) and late (long) blocks of a causal
 * prefill. The plain path, the reference the tests check the tiled ones against, takes one
 * (token, q head) at a time with the same online softmax. A sink (gpt-oss) is one more logit
 * with no value: the running maximum starts at it and the sum at its exp(0). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "core/error.h"

typedef struct attn_job {
    cpu_backend *cb;
    cpu_attn_kind kind;
    int window;          /* this layer's sliding window; 0: none */
    float *out;          /* [n, H*hd] */
    const float *qkv;    /* [n, (H+2K)*hd] */
    const void *k, *v;   /* this layer's base in the pools (cpu_kv_layer, cpu_kv_at) */
    const atlas_kv *kv;
    const float *sinks;  /* [H] or NULL */
    int n_blocks;        /* query blocks: cb->attn_blocks[2b] first token, [2b+1] count */
    size_t buf_floats;   /* a thread's share of cb->attn_buf */
    float k_scale, v_scale; /* an FP8 cache's scales of this layer */
} attn_job;

/* A bf16 cache's row as fp32 (exact). */
static void kv_widen(const uint16_t *src, float *dst, int n) {
    for (int i = 0; i < n; i++) dst[i] = atlas_bf16_to_f32(src[i]);
}

/* An FP8 cache's row as fp32: each code's value times the layer's scale (one rounding). */
static void kv_widen_fp8(const uint8_t *src, float scale, float *dst, int n) {
    const float *tab = cpu_e4m3_table();
    for (int i = 0; i < n; i++) dst[i] = tab[src[i]] * scale;
}

static void plain_range(void *ctx, int64_t begin, int64_t end, int thread) {
    attn_job *j = ctx;
    cpu_backend *cb = j->cb;
    const atlas_backend_geom *g = &cb->base.geom;
    int H = g->n_heads, K = g->n_kv_heads, hd = g->head_dim;
    int group = H / K, bs = cb->block_size;
    float scale = atlas_geom_attn_scale(g);
    float *acc = cb->scratch + (size_t)thread * cb->scratch_floats; /* [hd] */
    float *krow = acc + hd, *vrow = krow + hd; /* a bf16 cache's rows widened */
    for (int64_t item = begin; item < end; item++) {
        int t = (int)(item / H), h = (int)(item % H), kvh = h / group;
        int s = cb->tok_seq[t], pos = cb->positions[t];
        const float *q = j->qkv + (size_t)t * (H + 2 * K) * hd + (size_t)h * hd;
        const int32_t *table = cb->block_table + (size_t)s * cb->max_blocks;
        int start = 0;
        if (j->window > 0 && pos - j->window + 1 > 0) start = pos - j->window + 1;
        float mx = j->sinks ? j->sinks[h] : -INFINITY, sum = j->sinks ? 1.0f : 0.0f;
        memset(acc, 0, (size_t)hd * sizeof *acc);
        for (int p = start; p <= pos; p++) {
            size_t slot = (size_t)table[p / bs] * bs + p % bs;
            size_t off = cpu_kv_at(j->kv, slot, (size_t)kvh, (size_t)hd);
            const float *kk = (const float *)j->k + off, *vv = (const float *)j->v + off;
            if (j->kv->fp8) {
                kv_widen_fp8((const uint8_t *)j->k + off, j->k_scale, krow, hd);
                kv_widen_fp8((const uint8_t *)j->v + off, j->v_scale, vrow, hd);
                kk = krow, vv = vrow;
            } else if (j->kv->bf16) {
                kv_widen((const uint16_t *)j->k + off, krow, hd);
                kv_widen((const uint16_t *)j->v + off, vrow, hd);
                kk = krow, vv = vrow;
            }
            float score = cpu_dot(q, kk, hd) * scale;
            if (score > mx) {
                float c = expf(mx - score); /* rescale what was summed so far */
                sum *= c;
                for (int i = 0; i < hd; i++) acc[i] *= c;
                mx = score;
            }
            float e = expf(score - mx);
            sum += e;
            for (int i = 0; i < hd; i++) acc[i] += e * vv[i];
        }
        float *o = j->out + (size_t)t * H * hd + (size_t)h * hd;
        float inv = 1.0f / sum;
        for (int i = 0; i < hd; i++) o[i] = acc[i] * inv;
    }
}

/* One tiled item: nq consecutive tokens (positions pos0 ..) of one sequence times the group
 * of q heads of kv head kvh; row m is token m / group, head m % group of the group. */
typedef struct attn_item {
    int nq, group, hd, pos0, window, kvh, n_kv, bs;
    float scale;
    const float *q;      /* the first token's first q head of the group */
    size_t q_stride;     /* floats from one token's q to the next */
    float *out;          /* the same for the output */
    size_t out_stride;
    const void *k, *v;   /* the layer's base in the pools (cpu_kv_layer, cpu_kv_at) */
    const atlas_kv *kv;
    const int32_t *table;
    const float *sinks;  /* the group's [group], or NULL */
    float k_scale, v_scale; /* an FP8 cache's scales of this layer */
} attn_item;

/* Floats of one thread's tile buffers for rows rows (the widest vector: 16, keys 32). */
static size_t attn_buf_floats(int rows, int hd) {
    size_t hdp = (size_t)(hd + 15) / 16 * 16;
    return (2 * rows * hdp + rows * 32 + 2 * 32 * hdp + 2 * rows + 15) / 16 * 16;
}

static int attn_first_key(const attn_item *it, int pos) {
    return it->window > 0 && pos - it->window + 1 > 0 ? pos - it->window + 1 : 0;
}

/* The rows' q times the scale, zero-padded to hdp; outputs, maxima and sums started. */
static void attn_load_q(const attn_item *it, float *qs, int hdp, float *o, float *mrow,
                        float *lrow) {
    for (int i = 0; i < it->nq; i++)
        for (int g = 0; g < it->group; g++) {
            int m = i * it->group + g;
            const float *q = it->q + i * it->q_stride + (size_t)g * it->hd;
            float *d = qs + (size_t)m * hdp;
            for (int x = 0; x < hdp; x++) d[x] = x < it->hd ? q[x] * it->scale : 0.0f;
            memset(o + (size_t)m * hdp, 0, sizeof(float) * hdp);
            mrow[m] = it->sinks ? it->sinks[g] : -INFINITY;
            lrow[m] = it->sinks ? 1.0f : 0.0f;
        }
}

/* Keys j0 .. j0+nk-1 into ks[nk][hdp] and their values into vs[nk][hdp] (zero-padded). */
static void attn_gather(const attn_item *it, int j0, int nk, float *ks, float *vs, int hdp) {
    int hd = it->hd;
    for (int j = 0; j < nk; j++) {
        int p = j0 + j;
        size_t slot = (size_t)it->table[p / it->bs] * it->bs + p % it->bs;
        size_t off = cpu_kv_at(it->kv, slot, (size_t)it->kvh, (size_t)hd);
        if (it->kv->fp8) {
            kv_widen_fp8((const uint8_t *)it->k + off, it->k_scale, ks + (size_t)j * hdp, hd);
            kv_widen_fp8((const uint8_t *)it->v + off, it->v_scale, vs + (size_t)j * hdp, hd);
        } else if (it->kv->bf16) {
            kv_widen((const uint16_t *)it->k + off, ks + (size_t)j * hdp, hd);
            kv_widen((const uint16_t *)it->v + off, vs + (size_t)j * hdp, hd);
        } else {
            memcpy(ks + (size_t)j * hdp, (const float *)it->k + off, sizeof(float) * hd);
            memcpy(vs + (size_t)j * hdp, (const float *)it->v + off, sizeof(float) * hd);
        }
        memset(ks + (size_t)j * hdp + hd, 0, sizeof(float) * (hdp - hd));
        memset(vs + (size_t)j * hdp + hd, 0, sizeof(float) * (hdp - hd));
    }
}

/* Scores of keys a row may not see (after its position, before its window, past the block's
 * last key) become -inf; a key block inside every row's range is left as it is. */
static void attn_mask(const attn_item *it, int j0, int kb, float *s) {
    for (int i = 0; i < it->nq; i++) {
        int pos = it->pos0 + i, lo = attn_first_key(it, pos);
        if (j0 >= lo && j0 + kb - 1 <= pos) continue;
        for (int g = 0; g < it->group; g++) {
            float *row = s + (size_t)(i * it->group + g) * kb;
            for (int j = 0; j < kb; j++)
                if (j0 + j < lo || j0 + j > pos) row[j] = -INFINITY;
        }
    }
}

static void attn_store(const attn_item *it, const float *o, int hdp, const float *lrow) {
    for (int i = 0; i < it->nq; i++)
        for (int g = 0; g < it->group; g++) {
            int m = i * it->group + g;
            float *d = it->out + i * it->out_stride + (size_t)g * it->hd;
            float inv = 1.0f / lrow[m];
            for (int x = 0; x < it->hd; x++) d[x] = o[(size_t)m * hdp + x] * inv;
        }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_TILED 1

/* e4m3 codes as floats, exactly cpu_e4m3_table's values, for the decode path that reads an
 * FP8 cache's rows in place: a normal code's exponent and mantissa bits shifted into a
 * float's, its exponent rebased (+120), a subnormal m as m * 2^-9, NaN (S.1111.111) as NaN,
 * then the sign. 16 codes (AVX-512), 8 (AVX2). */
__attribute__((target("avx512f"))) static inline __m512 fp8x16_512(const uint8_t *p) {
    __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    __m512i mag = _mm512_and_si512(c, _mm512_set1_epi32(0x7f));
    __m512i sign = _mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x80)), 24);
    __m512 v = _mm512_castsi512_ps(
        _mm512_add_epi32(_mm512_slli_epi32(mag, 20), _mm512_set1_epi32(120 << 23)));
    __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(mag), _mm512_set1_ps(0x1p-9f));
    v = _mm512_mask_blend_ps(_mm512_cmplt_epi32_mask(mag, _mm512_set1_epi32(8)), v, sub);
    v = _mm512_mask_blend_ps(_mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7f)), v,
                             _mm512_set1_ps(__builtin_nanf("")));
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), sign));
}

__attribute__((target("avx2,fma"))) static inline __m256 fp8x8_256(const uint8_t *p) {
    __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    __m256i mag = _mm256_and_si256(c, _mm256_set1_epi32(0x7f));
    __m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24);
    __m256 v = _mm256_castsi256_ps(
        _mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(120 << 23)));
    __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(mag), _mm256_set1_ps(0x1p-9f));
    v = _mm256_blendv_ps(v, sub, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(8), mag)));
    v = _mm256_blendv_ps(v, _mm256_set1_ps(__builtin_nanf("")),
                         _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7f))));
    return _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(v), sign));
}

#define VW 16
#define VEC __m512
#define TGT __attribute__((target("avx512f")))
#define F(name) name##_512
#define vzero() _mm512_setzero_ps()
#define vset1(x) _mm512_set1_ps(x)
#define vload(p) _mm512_loadu_ps(p)
#define vstore(p, x) _mm512_storeu_ps(p, x)
#define vfma(a, b, c) _mm512_fmadd_ps(a, b, c)
#define vmul(a, b) _mm512_mul_ps(a, b)
#define vadd(a, b) _mm512_add_ps(a, b)
#define vsub(a, b) _mm512_sub_ps(a, b)
#define vmax(a, b) _mm512_max_ps(a, b)
#define vmin(a, b) _mm512_min_ps(a, b)
#define vround(x) _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define vpow2(n) _mm512_castsi512_ps(_mm512_slli_epi32( \
    _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23))
#define vhmax(x) _mm512_reduce_max_ps(x)
#define vhsum(x) _mm512_reduce_add_ps(x)
#define vloadbf(p) _mm512_castsi512_ps(_mm512_slli_epi32( \
    _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define vloadfp8(p) fp8x16_512(p)
#include "backend/cpu/cpu_attn_tile.h"
#undef VW
#undef VEC
#undef TGT
#undef F
#undef vzero
#undef vset1
#undef vload
#undef vstore
#undef vfma
#undef vmul
#undef vadd
#undef vsub
#undef vmax
#undef vmin
#undef vround
#undef vpow2
#undef vhmax
#undef vhsum
#undef vloadbf
#undef vloadfp8

__attribute__((target("avx2,fma"))) static inline float hmax256(__m256 x) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

__attribute__((target("avx2,fma"))) static inline float hsum256(__m256 x) {
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

#define VW 8
#define VEC __m256
#define TGT __attribute__((target("avx2,fma")))
#define F(name) name##_256
#define vzero() _mm256_setzero_ps()
#define vset1(x) _mm256_set1_ps(x)
#define vload(p) _mm256_loadu_ps(p)
#define vstore(p, x) _mm256_storeu_ps(p, x)
#define vfma(a, b, c) _mm256_fmadd_ps(a, b, c)
#define vmul(a, b) _mm256_mul_ps(a, b)
#define vadd(a, b) _mm256_add_ps(a, b)
#define vsub(a, b) _mm256_sub_ps(a, b)
#define vmax(a, b) _mm256_max_ps(a, b)
#define vmin(a, b) _mm256_min_ps(a, b)
#define vround(x) _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define vpow2(n) _mm256_castsi256_ps(_mm256_slli_epi32( \
    _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23))
#define vhmax(x) hmax256(x)
#define vhsum(x) hsum256(x)
#define vloadbf(p) _mm256_castsi256_ps(_mm256_slli_epi32( \
    _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define vloadfp8(p) fp8x8_256(p)
#include "backend/cpu/cpu_attn_tile.h"
#elif defined(__aarch64__)
#include <arm_neon.h>
#define HAVE_TILED 1

/* 4 e4m3 codes as floats, as the x86 fp8x16_512 makes them. */
static inline float32x4_t fp8x4_neon(const uint8_t *p) {
    uint32_t w;
    memcpy(&w, p, 4);
    uint32x4_t c = vmovl_u16(vget_low_u16(vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(w)))));
    uint32x4_t mag = vandq_u32(c, vdupq_n_u32(0x7f));
    uint32x4_t sign = vshlq_n_u32(vandq_u32(c, vdupq_n_u32(0x80)), 24);
    float32x4_t v = vreinterpretq_f32_u32(vaddq_u32(vshlq_n_u32(mag, 20), vdupq_n_u32(120u << 23)));
    float32x4_t sub = vmulq_f32(vcvtq_f32_u32(mag), vdupq_n_f32(0x1p-9f));
    v = vbslq_f32(vcltq_u32(mag, vdupq_n_u32(8)), sub, v);
    v = vbslq_f32(vceqq_u32(mag, vdupq_n_u32(0x7f)), vdupq_n_f32(__builtin_nanf("")), v);
    return vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(v), sign));
}

#define VW 4
#define VEC float32x4_t
#define TGT
#define F(name) name##_neon
#define vzero() vdupq_n_f32(0.0f)
#define vset1(x) vdupq_n_f32(x)
#define vload(p) vld1q_f32(p)
#define vstore(p, x) vst1q_f32(p, x)
#define vfma(a, b, c) vfmaq_f32(c, a, b)
#define vmul(a, b) vmulq_f32(a, b)
#define vadd(a, b) vaddq_f32(a, b)
#define vsub(a, b) vsubq_f32(a, b)
#define vmax(a, b) vmaxq_f32(a, b)
#define vmin(a, b) vminq_f32(a, b)
#define vround(x) vrndnq_f32(x)
#define vpow2(n) vreinterpretq_f32_s32(vshlq_n_s32( \
    vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23))
#define vhmax(x) vmaxvq_f32(x)
#define vhsum(x) vaddvq_f32(x)
#define vloadbf(p) vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)(p)), 16))
#define vloadfp8(p) fp8x4_neon(p)
#include "backend/cpu/cpu_attn_tile.h"
#endif

int cpu_attn_kind_supported(cpu_attn_kind kind) {
    if (kind == CPU_ATTN_PLAIN) return 1;
#if defined(__aarch64__)
    return kind == CPU_ATTN_NEON; /* Advanced SIMD is part of every ARMv8-A core */
#elif defined(HAVE_TILED)
    __builtin_cpu_init();
    if (kind == CPU_ATTN_AVX2)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (kind == CPU_ATTN_AVX512) return __builtin_cpu_supports("avx512f");
#endif
    return 0;
}

cpu_attn_kind cpu_attn_best(void) {
    if (cpu_attn_kind_supported(CPU_ATTN_NEON)) return CPU_ATTN_NEON;
    if (cpu_attn_kind_supported(CPU_ATTN_AVX512)) return CPU_ATTN_AVX512;
    if (cpu_attn_kind_supported(CPU_ATTN_AVX2)) return CPU_ATTN_AVX2;
    return CPU_ATTN_PLAIN;
}

static void tiled_range(void *ctx, int64_t begin, int64_t end, int thread) {
    attn_job *j = ctx;
    cpu_backend *cb = j->cb;
    const atlas_backend_geom *g = &cb->base.geom;
    int H = g->n_heads, K = g->n_kv_heads, hd = g->head_dim, nb = j->n_blocks;
    float *buf = cb->attn_buf + (size_t)thread * j->buf_floats;
    for (int64_t item = begin; item < end; item++) {
        int bi = (int)(item / K), kvh = (int)(item % K);
        int b = bi % 2 == 0 ? bi / 2 : nb - 1 - bi / 2; /* 0, nb-1, 1, nb-2, ... */
        int t0 = cb->attn_blocks[2 * b], s = cb->tok_seq[t0];
        attn_item it = {
            .nq = cb->attn_blocks[2 * b + 1], .group = H / K, .hd = hd,
            .pos0 = cb->positions[t0], .window = j->window, .kvh = kvh, .n_kv = K,
            .bs = cb->block_size, .scale = atlas_geom_attn_scale(g),
            .q = j->qkv + (size_t)t0 * (H + 2 * K) * hd + (size_t)kvh * (H / K) * hd,
            .q_stride = (size_t)(H + 2 * K) * hd,
            .out = j->out + (size_t)t0 * H * hd + (size_t)kvh * (H / K) * hd,
            .out_stride = (size_t)H * hd, .k = j->k, .v = j->v, .kv = j->kv,
            .table = cb->block_table + (size_t)s * cb->max_blocks,
            .sinks = j->sinks ? j->sinks + kvh * (H / K) : NULL,
            .k_scale = j->k_scale, .v_scale = j->v_scale};
#if defined(__aarch64__)
        attn_item_neon(&it, buf);
#elif defined(HAVE_TILED)
        if (j->kind == CPU_ATTN_AVX512) attn_item_512(&it, buf);
        else attn_item_256(&it, buf);
#else
        (void)it, (void)buf;
#endif
    }
}

/* The batch's query blocks: runs of at most qb tokens of one sequence at consecutive
 * positions, into cb->attn_blocks; and each thread's tile buffers. */
static atlas_status tiled_prepare(cpu_backend *cb, int qb, attn_job *j) {
    int n = cb->n_tokens, hd = cb->base.geom.head_dim;
    int group = cb->base.geom.n_heads / cb->base.geom.n_kv_heads;
    if ((size_t)n * 2 > cb->attn_blocks_cap) {
        int32_t *nbk = realloc(cb->attn_blocks, sizeof(int32_t) * 2 * n);
        if (!nbk) return atlas_fail(ATLAS_ERR_NOMEM, "cpu attention: %d query blocks", n);
        cb->attn_blocks = nbk, cb->attn_blocks_cap = (size_t)n * 2;
    }
    j->n_blocks = 0;
    for (int t = 0; t < n;) {
        int len = 1;
        while (t + len < n && len < qb && cb->tok_seq[t + len] == cb->tok_seq[t] &&
               cb->positions[t + len] == cb->positions[t] + len)
            len++;
        cb->attn_blocks[2 * j->n_blocks] = t, cb->attn_blocks[2 * j->n_blocks + 1] = len;
        j->n_blocks++, t += len;
    }
    j->buf_floats = attn_buf_floats(qb * group, hd);
    size_t need = j->buf_floats * cb->n_threads;
    if (need > cb->attn_buf_cap) {
        free(cb->attn_buf);
        cb->attn_buf = aligned_alloc(64, need * sizeof(float));
        cb->attn_buf_cap = cb->attn_buf ? need : 0;
        if (!cb->attn_buf)
            return atlas_fail(ATLAS_ERR_NOMEM, "cpu attention: %zu floats of tiles", need);
    }
    return ATLAS_OK;
}

atlas_status cpu_attention(atlas_backend *be, void *out, const void *qkv, const atlas_kv *kv,
                           int layer, const atlas_weight *sinks) {
    cpu_backend *cb = (cpu_backend *)be;
    if (layer < 0 || layer >= kv->n_layers)
        return atlas_fail(ATLAS_ERR_INTERNAL, "cpu attention: layer %d of %d", layer,
                          kv->n_layers);
    if (sinks && (sinks->n_dims != 1 || sinks->cols != be->geom.n_heads))
        return atlas_fail(ATLAS_ERR_INTERNAL, "cpu attention: %lld sinks for %d heads",
                          (long long)sinks->cols, be->geom.n_heads);
    int window = atlas_geom_window(&be->geom, layer);
    attn_job j = {cb, cb->attn, window, out, qkv, cpu_kv_layer(kv, kv->k, layer),
                  cpu_kv_layer(kv, kv->v, layer), kv, sinks ? sinks->vec : NULL, 0, 0,
                  kv->fp8 ? kv->scales[2 * layer] : 1.0f, kv->fp8 ? kv->scales[2 * layer + 1] : 1.0f};
    int64_t max_pos = 0;
    for (int t = 0; t < cb->n_tokens; t++)
        if (cb->positions[t] > max_pos) max_pos = cb->positions[t];
    int64_t hd = be->geom.head_dim;
    if (j.kind == CPU_ATTN_PLAIN) {
        /* An item costs about 2 * context * hd multiply-adds: split only 32k or more a thread. */
        int64_t min_items = 32768 / (2 * (max_pos + 1) * hd) + 1;
        atlas_threadpool_for(cb->pool, (int64_t)cb->n_tokens * be->geom.n_heads, min_items,
                             plain_range, &j);
        return ATLAS_OK;
    }
    int group = be->geom.n_heads / be->geom.n_kv_heads;
    int qb = cb->attn_rows / group > 1 ? cb->attn_rows / group : 1;
    atlas_status st = tiled_prepare(cb, qb, &j);
    if (st != ATLAS_OK) return st;
    int64_t items = (int64_t)j.n_blocks * be->geom.n_kv_heads;
    /* Under about 64k multiply-adds in all, waking the workers costs more than it saves. */
    int64_t work = (int64_t)cb->n_tokens * be->geom.n_heads * (max_pos + 1) * hd * 2;
    atlas_threadpool_for(cb->pool, items, work < 65536 ? items : 1, tiled_range, &j);
    return ATLAS_OK;
}

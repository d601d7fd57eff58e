/* backend/cpu/cpu_matmul.c — out[n, m] = x[n, k] @ w[m, k]^T (+ bias[m]) over bf16/f16/f32
 * weights, fp32 arithmetic.
 *
 * Parallel over output rows (each thread owns a contiguous range of weight rows, so every
 * weight byte is read once per call). A tile of CPU_ROWS weight rows is converted to fp32
 * into the thread's scratch, then multiplied with the tokens CPU_TOKS at a time: in prefill
 * each weight row is read once for all tokens. With AVX2+FMA the inner loops use intrinsics;
 * elsewhere plain C that any compiler handles. One token over bf16 or INT4 (cpu_int4.c) is
 * multiplied straight from the stored bytes, with no fp32 row in between.
 *
 * Weights all of bf16 take cpu_bf16.c's AVX-512 kernels instead where the CPU has them, and
 * its NEON ones on aarch64 (chosen at backend creation), for one token and many alike.
 *
 * Batch invariance: every out[t, r] is summed in ONE order, whatever the tile, the batch
 * size, the token's place in it or the thread split (row_dot's order: with SIMD one 8-lane
 * FMA accumulator over the 8-aligned head, its lanes added by hsum256, then the tail one
 * product at a time; without, cpu_dot's; cpu_bf16.c keeps its own, one for all its tiles).
 * So a token's logits are bitwise the same alone or batched, with 1 or N threads, and
 * seeded sampling reproduces. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_simd.h"
#include "core/error.h"

enum { CPU_TOKS = 2 }; /* tokens per matmul tile */

float cpu_dot(const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    float sum = 0.0f;
#ifdef CPU_SIMD
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8)
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    sum = cpu_hsum256(_mm256_add_ps(acc0, acc1));
#else
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f; /* four chains: no reassociation needed */
    for (; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    sum = (s0 + s1) + (s2 + s3);
#endif
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

/* The matmul's summation order for one (row, token): see the header. The tiles below keep
 * exactly this order per accumulator; only their interleaving differs. */
static float row_dot(const float *w, const float *x, int64_t k) {
#ifdef CPU_SIMD
    __m256 a = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a);
    float sum = cpu_hsum256(a);
    for (; i < k; i++) sum += w[i] * x[i];
    return sum;
#else
    return cpu_dot(w, x, k);
#endif
}

static void convert_row(const void *src, atlas_dtype dt, int64_t k, float *dst) {
    int64_t i = 0;
    if (dt == ATLAS_DTYPE_F32) {
        memcpy(dst, src, (size_t)k * sizeof(float));
        return;
    }
    const uint16_t *h = src;
    if (dt == ATLAS_DTYPE_BF16) {
#ifdef CPU_SIMD
        for (; i + 8 <= k; i += 8) {
            __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + i)));
            _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
        }
#endif
        for (; i < k; i++) dst[i] = atlas_bf16_to_f32(h[i]);
        return;
    }
#if defined(CPU_SIMD) && defined(__F16C__)
    for (; i + 8 <= k; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
#endif
    for (; i < k; i++) dst[i] = atlas_f16_to_f32(h[i]);
}

void cpu_weight_row(const atlas_weight *w, int64_t r, float *dst) {
    for (int p = 0; p < w->n_parts; p++) {
        const cpu_part *part = &w->parts[p];
        if (r < part->row0 + part->rows) {
            if (part->quant.format != ATLAS_WFMT_DENSE) {
                cpu_dequant_row(part, r - part->row0, w->cols, dst);
                return;
            }
            size_t esz = atlas_dtype_size(part->dtype);
            const char *row = (const char *)part->data + (size_t)(r - part->row0) * w->cols * esz;
            convert_row(row, part->dtype, w->cols, dst);
            return;
        }
    }
}

/* out[t, r0 + i] = dot(wrow[i], x[t]) for CPU_ROWS rows i (nr of them valid) and one
 * tile of tokens (nt <= CPU_TOKS). */
static void tile(float *out, int64_t m, const float *x, int64_t k, const float *wrow, int nr,
                 int64_t r0, int64_t t0, int nt) {
#ifdef CPU_SIMD
    if (nr == CPU_ROWS && nt == CPU_TOKS) {
        const float *x0 = x + t0 * k, *x1 = x0 + k;
        const float *w0 = wrow, *w1 = w0 + k, *w2 = w1 + k, *w3 = w2 + k;
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;
        __m256 a20 = a00, a21 = a00, a30 = a00, a31 = a00;
        int64_t i = 0;
        for (; i + 8 <= k; i += 8) {
            __m256 v0 = _mm256_loadu_ps(x0 + i), v1 = _mm256_loadu_ps(x1 + i);
            __m256 w = _mm256_loadu_ps(w0 + i);
            a00 = _mm256_fmadd_ps(w, v0, a00);
            a01 = _mm256_fmadd_ps(w, v1, a01);
            w = _mm256_loadu_ps(w1 + i);
            a10 = _mm256_fmadd_ps(w, v0, a10);
            a11 = _mm256_fmadd_ps(w, v1, a11);
            w = _mm256_loadu_ps(w2 + i);
            a20 = _mm256_fmadd_ps(w, v0, a20);
            a21 = _mm256_fmadd_ps(w, v1, a21);
            w = _mm256_loadu_ps(w3 + i);
            a30 = _mm256_fmadd_ps(w, v0, a30);
            a31 = _mm256_fmadd_ps(w, v1, a31);
        }
        float s[CPU_ROWS][CPU_TOKS] = {{cpu_hsum256(a00), cpu_hsum256(a01)}, {cpu_hsum256(a10), cpu_hsum256(a11)},
                                       {cpu_hsum256(a20), cpu_hsum256(a21)}, {cpu_hsum256(a30), cpu_hsum256(a31)}};
        for (; i < k; i++)
            for (int r = 0; r < CPU_ROWS; r++) {
                s[r][0] += wrow[r * k + i] * x0[i];
                s[r][1] += wrow[r * k + i] * x1[i];
            }
        for (int r = 0; r < CPU_ROWS; r++)
            for (int t = 0; t < CPU_TOKS; t++) out[(t0 + t) * m + r0 + r] = s[r][t];
        return;
    }
    if (nr == CPU_ROWS && nt == 1) { /* decode of f32/f16 weights, odd last token */
        const float *x0 = x + t0 * k;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int64_t i = 0;
        for (; i + 8 <= k; i += 8) {
            __m256 v = _mm256_loadu_ps(x0 + i);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(wrow + i), v, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(wrow + k + i), v, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(wrow + 2 * k + i), v, a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(wrow + 3 * k + i), v, a3);
        }
        float s[CPU_ROWS] = {cpu_hsum256(a0), cpu_hsum256(a1), cpu_hsum256(a2), cpu_hsum256(a3)};
        for (; i < k; i++)
            for (int r = 0; r < CPU_ROWS; r++) s[r] += wrow[r * k + i] * x0[i];
        for (int r = 0; r < CPU_ROWS; r++) out[t0 * m + r0 + r] = s[r];
        return;
    }
#endif
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++)
            out[(t0 + t) * m + r0 + r] = row_dot(wrow + r * k, x + (t0 + t) * k, k);
}

#ifdef CPU_SIMD
static inline __m256 load_bf16(const uint16_t *p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* Decode (one token): out[r] = dot(w[r], x) straight from bf16, no fp32 copy of the rows,
 * one row after another: in address order the hardware prefetchers keep up, where four rows
 * at a time sharing the loads of x (with software prefetches of the next four) read a
 * 151,936 x 1,024 matrix at 12 GB/s against 21 a thread, one accumulator chain and all (Zen
 * 4). Rows [r0, r1) of one bf16 part. */
static void gemv_bf16(float *out, const uint16_t *w, const float *x, int64_t k, int64_t r0,
                      int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
        const uint16_t *wr = w + r * k;
        __m256 a = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 8 <= k; i += 8) a = _mm256_fmadd_ps(load_bf16(wr + i), _mm256_loadu_ps(x + i), a);
        float sum = cpu_hsum256(a);
        for (; i < k; i++) sum += atlas_bf16_to_f32(wr[i]) * x[i];
        out[r] = sum;
    }
}
#endif

typedef struct matmul_job {
    cpu_backend *cb;
    float *out;
    const float *x;
    const atlas_weight *w, *bias;
    int n;
    int plain; /* every row through cpu_weight_row: the reference path */
    cpu_bf16_kind bf16; /* not NONE: every part bf16, x packed in cb->xpack for this kernel */
    cpu_q8_kind q8;     /* not OFF: every part INT4, x packed as int8 in cb->xpack */
    size_t q8_xs;       /* bytes from one packed token to the next */
} matmul_job;

/* Rows [begin, end) of each part through the packed-token kernel the job chose (cpu_q8.c's
 * for INT4, cpu_bf16.c's for bf16), then the bias. */
static void packed_range(const matmul_job *j, int64_t begin, int64_t end) {
    const atlas_weight *w = j->w;
    for (int p = 0; p < w->n_parts; p++) {
        const cpu_part *part = &w->parts[p];
        int64_t lo = begin > part->row0 ? begin : part->row0;
        int64_t hi = end < part->row0 + part->rows ? end : part->row0 + part->rows;
        if (lo >= hi) continue;
        if (j->q8 != CPU_Q8_OFF)
            cpu_q8_gemm(j->q8, part, w->cols, lo - part->row0, hi - part->row0, j->cb->xpack,
                        j->q8_xs, j->n, j->out + part->row0, w->rows);
        else
            cpu_bf16_gemm(j->bf16, part->data, w->cols, lo - part->row0, hi - part->row0,
                          j->cb->xpack, j->n, j->out + part->row0, w->rows);
    }
    if (j->bias)
        for (int64_t t = 0; t < j->n; t++)
            for (int64_t r = begin; r < end; r++) j->out[t * w->rows + r] += j->bias->vec[r];
}

/* Decode straight from the stored bytes, part by part, when every part has such a kernel
 * (bf16, or INT4 that cpu_int4_fast takes). Returns 0 when one has not. */
static int decode_direct(const matmul_job *j, int64_t begin, int64_t end) {
#ifdef CPU_SIMD
    const atlas_weight *w = j->w;
    if (j->n != 1 || j->plain) return 0;
    for (int p = 0; p < w->n_parts; p++)
        if (w->parts[p].dtype != ATLAS_DTYPE_BF16 && !cpu_int4_fast(&w->parts[p])) return 0;
    for (int p = 0; p < w->n_parts; p++) {
        const cpu_part *part = &w->parts[p];
        int64_t lo = begin > part->row0 ? begin : part->row0;
        int64_t hi = end < part->row0 + part->rows ? end : part->row0 + part->rows;
        if (lo >= hi) continue;
        if (part->dtype == ATLAS_DTYPE_BF16)
            gemv_bf16(j->out + part->row0, part->data, j->x, w->cols, lo - part->row0,
                      hi - part->row0);
        else
            cpu_int4_gemv(part, j->x, w->cols, lo - part->row0, hi - part->row0,
                          j->out + part->row0);
    }
    if (j->bias)
        for (int64_t r = begin; r < end; r++) j->out[r] += j->bias->vec[r];
    return 1;
#else
    (void)j, (void)begin, (void)end;
    return 0;
#endif
}

/* Row r of w in fp32 for a tile: through a format's kernel where it has one. */
static void tile_row(const atlas_weight *w, int64_t r, float *dst, int plain) {
    for (int p = 0; !plain && p < w->n_parts; p++) {
        const cpu_part *part = &w->parts[p];
        if (r < part->row0 + part->rows) {
            if (!cpu_int4_fast(part)) break;
            cpu_int4_row(part, r - part->row0, w->cols, dst);
            return;
        }
    }
    cpu_weight_row(w, r, dst);
}

static void matmul_range(void *ctx, int64_t begin, int64_t end, int thread) {
    matmul_job *j = ctx;
    const atlas_weight *w = j->w;
    int64_t k = w->cols, m = w->rows;
    float *buf = j->cb->scratch + (size_t)thread * j->cb->scratch_floats; /* [CPU_ROWS, k] */
    if (j->bf16 != CPU_BF16_NONE || j->q8 != CPU_Q8_OFF) {
        packed_range(j, begin, end);
        return;
    }
    if (decode_direct(j, begin, end)) return;
    for (int64_t r0 = begin; r0 < end; r0 += CPU_ROWS) {
        int nr = end - r0 < CPU_ROWS ? (int)(end - r0) : CPU_ROWS;
        for (int r = 0; r < nr; r++) tile_row(w, r0 + r, buf + r * k, j->plain);
        for (int64_t t0 = 0; t0 < j->n; t0 += CPU_TOKS) {
            int nt = j->n - t0 < CPU_TOKS ? (int)(j->n - t0) : CPU_TOKS;
            tile(j->out, m, j->x, k, buf, nr, r0, t0, nt);
        }
        if (j->bias)
            for (int64_t t = 0; t < j->n; t++)
                for (int r = 0; r < nr; r++) j->out[t * m + r0 + r] += j->bias->vec[r0 + r];
    }
}

static int all_dense_bf16(const atlas_weight *w) {
    for (int p = 0; p < w->n_parts; p++)
        if (w->parts[p].dtype != ATLAS_DTYPE_BF16 || w->parts[p].quant.format != ATLAS_WFMT_DENSE)
            return 0;
    return 1;
}

/* Grows *buf to hold need bytes, 64-byte aligned (its contents are not kept). */
static atlas_status grow(void **buf, size_t *cap, size_t need, const char *what) {
    if (need <= *cap) return ATLAS_OK;
    size_t c = need > 2 * *cap ? need : 2 * *cap;
    void *b = aligned_alloc(64, (c + 63) / 64 * 64);
    if (!b) return atlas_fail(ATLAS_ERR_NOMEM, "cpu matmul: no memory for %zu bytes of %s", c, what);
    free(*buf);
    *buf = b;
    *cap = c;
    return ATLAS_OK;
}

/* bf16 activations without the DOT kernel: j's tokens rounded to bf16 into cb->xround, which
 * the kernel this CPU has then multiplies (every product still exact). */
static atlas_status round_x(cpu_backend *cb, matmul_job *j) {
    size_t nx = (size_t)j->n * j->w->cols;
    ATLAS_TRY(grow((void **)&cb->xround, &cb->xround_cap, nx * sizeof(float), "rounded activations"));
    for (size_t i = 0; i < nx; i++) cb->xround[i] = atlas_bf16_to_f32(atlas_f32_to_bf16(j->x[i]));
    j->x = cb->xround;
    return ATLAS_OK;
}

/* Chooses cpu_bf16.c's kernel when the backend has one and every part is bf16, and packs the
 * tokens for it once, here, for all threads. */
static atlas_status bf16_prepare(cpu_backend *cb, matmul_job *j, int exact) {
    cpu_bf16_kind kind = exact && cb->bf16 == CPU_BF16_DOT ? cpu_bf16_best() : cb->bf16;
    if (j->plain || kind == CPU_BF16_NONE || !all_dense_bf16(j->w)) return ATLAS_OK;
    int64_t k = j->w->cols;
    size_t xs = cpu_bf16_pack_bytes(kind, k);
    ATLAS_TRY(grow(&cb->xpack, &cb->xpack_cap, xs * (size_t)j->n, "packed activations"));
    for (int t = 0; t < j->n; t++)
        cpu_bf16_pack(kind, j->x + (size_t)t * k, k, (char *)cb->xpack + xs * t);
    j->bf16 = kind;
    return ATLAS_OK;
}

/* Tokens [begin, end) of a job quantized into cb->xpack (q8_prepare's parallel part). */
static void q8_pack_range(void *ctx, int64_t begin, int64_t end, int thread) {
    const matmul_job *j = ctx;
    int64_t k = j->w->cols, bc = j->w->parts[0].quant.block_cols;
    (void)thread;
    for (int64_t t = begin; t < end; t++)
        cpu_q8_pack(j->x + (size_t)t * k, k, bc, (char *)j->cb->xpack + j->q8_xs * t);
}

/* INT4 weights with int8 activations (the backend's q8 kind): the tokens quantized and packed
 * once, here, for all threads, split over them by tokens (a prefill's packing on one thread
 * would leave the others waiting). */
static atlas_status q8_prepare(cpu_backend *cb, matmul_job *j) {
    int64_t k = j->w->cols, bc = j->w->parts[0].quant.block_cols;
    size_t xs = (cpu_q8_pack_bytes(k, bc) + 63) / 64 * 64;
    ATLAS_TRY(grow(&cb->xpack, &cb->xpack_cap, xs * (size_t)j->n, "int8 activations"));
    j->q8_xs = xs;
    /* a thread's share at least 16k columns, the wake-up's worth */
    atlas_threadpool_for(cb->pool, j->n, 1 + 16384 / k, q8_pack_range, j);
    j->q8 = cb->q8;
    return ATLAS_OK;
}

/* plain: the reference path; exact: fp32 activations whatever the backend's setting. */
static atlas_status matmul(atlas_backend *be, void *out, const void *x, const atlas_weight *w,
                           const atlas_weight *bias, int n, int plain, int exact) {
    cpu_backend *cb = (cpu_backend *)be;
    if (w->n_dims != 2)
        return atlas_fail(ATLAS_ERR_INTERNAL, "cpu matmul: weight is not a matrix");
    if ((size_t)w->cols * CPU_ROWS > cb->scratch_floats)
        return atlas_fail(ATLAS_ERR_INTERNAL, "cpu matmul: in-dimension %lld exceeds the scratch",
                          (long long)w->cols);
    if (bias && (bias->n_dims != 1 || bias->cols != w->rows))
        return atlas_fail(ATLAS_ERR_INTERNAL, "cpu matmul: bias length %lld for %lld rows",
                          (long long)bias->cols, (long long)w->rows);
    matmul_job j = {cb, out, x, w, bias, n, plain, CPU_BF16_NONE, CPU_Q8_OFF, 0};
    if (!plain && !exact && cb->round_x && cb->bf16 != CPU_BF16_DOT && all_dense_bf16(w))
        ATLAS_TRY(round_x(cb, &j));
    ATLAS_TRY(bf16_prepare(cb, &j, plain || exact));
    if (!plain && !exact && cb->q8 != CPU_Q8_OFF && cpu_q8_fits(w)) ATLAS_TRY(q8_prepare(cb, &j));
    /* A thread's share must outweigh waking it (~10 us): at least 64k multiply-adds, and
     * 16 rows, so that small matrices stay on the calling thread. */
    int64_t min_rows = (int64_t)65536 / (w->cols * (int64_t)n);
    atlas_threadpool_for(cb->pool, w->rows, min_rows > 16 ? min_rows : 16, matmul_range, &j);
    return ATLAS_OK;
}

atlas_status cpu_matmul(atlas_backend *be, void *out, const void *x, const atlas_weight *w,
                        const atlas_weight *bias, int n) {
    return matmul(be, out, x, w, bias, n, 0, 0);
}

atlas_status cpu_matmul_exact(atlas_backend *be, void *out, const void *x,
                              const atlas_weight *w, const atlas_weight *bias, int n) {
    return matmul(be, out, x, w, bias, n, 0, 1);
}

atlas_status cpu_matmul_plain(atlas_backend *be, void *out, const void *x,
                              const atlas_weight *w, const atlas_weight *bias, int n) {
    return matmul(be, out, x, w, bias, n, 1, 1);
}

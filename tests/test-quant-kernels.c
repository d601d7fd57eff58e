/* tests/test-quant-kernels.c — the CPU's INT4 kernels (backend/cpu: the AVX2, AVX-512 VNNI
 * and NEON paths with int8 or float activations, one token and tiles of several) against its
 * plain C path, on random weights of two fused parts with fractional and integer zero points.
 * Seconds under qemu, where test-quant's end-to-end runs take minutes: the aarch64 step runs
 * this one for the NEON kernels. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atlas/model.h"
#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "core/dtype.h"
#include "core/error.h"
#include "harness.h"

/* ---- the INT4 kernels against the plain path --------------------------------------------- */

static uint64_t krng = 0x9e3779b97f4a7c15ull;
static uint32_t knext(void) {
    krng ^= krng << 13;
    krng ^= krng >> 7;
    krng ^= krng << 17;
    return (uint32_t)(krng >> 32);
}

/* A random INT4 weight of two fused parts (rows0 + rows1 rows, k columns, groups of g; part
 * 0's zero points fractional, part 1's integer) loaded on a new CPU backend of n threads. */
typedef struct int4_case {
    atlas_backend *be;
    atlas_weight *w;
    uint8_t *packed[2];
    float *scales[2], *zeros[2];
    int64_t sc; /* groups a row */
} int4_case;

static void int4_make(int4_case *c, int64_t rows0, int64_t rows1, int64_t k, int g, int threads) {
    memset(c, 0, sizeof *c);
    atlas_backend_geom geom = {.hidden = 512, .n_heads = 1, .n_kv_heads = 1, .head_dim = 8,
                               .intermediate = 512, .vocab_size = 8, .n_layers = 1,
                               .rms_eps = 1e-5, .max_position = 16};
    double inv[4] = {1, 1, 1, 1};
    geom.rope_inv_freq = inv;
    CHECK_OK(atlas_backend_cpu_create(&geom, threads, &c->be));
    if (!c->be) return;
    int64_t rows[2] = {rows0, rows1}, sc = (k + g - 1) / g;
    c->sc = sc;
    atlas_wquant wq[2];
    atlas_weight_src src[2];
    const atlas_weight_src *sp[2] = {&src[0], &src[1]};
    for (int p = 0; p < 2; p++) {
        size_t nb = (size_t)(rows[p] * k / 2), ns = (size_t)(rows[p] * sc);
        c->packed[p] = malloc(nb);
        c->scales[p] = malloc(ns * sizeof(float));
        c->zeros[p] = malloc(ns * sizeof(float));
        for (size_t i = 0; i < nb; i++) c->packed[p][i] = (uint8_t)knext();
        for (size_t i = 0; i < ns; i++) {
            c->scales[p][i] = (float)(knext() % 1000 + 1) * 1e-4f;
            c->zeros[p][i] = p ? (float)(knext() % 16) : (float)(knext() % 1600) / 100.0f;
        }
        wq[p] = (atlas_wquant){.format = ATLAS_WFMT_INT4, .block_rows = 1, .block_cols = g,
                               .scale_cols = (int)sc, .scales = c->scales[p],
                               .zeros = c->zeros[p]};
        src[p] = (atlas_weight_src){.name = p ? "w1" : "w0", .dtype = ATLAS_DTYPE_U8,
                                    .n_dims = 2, .shape = {rows[p], k}, .nbytes = nb,
                                    .data = c->packed[p], .quant = &wq[p]};
    }
    CHECK_OK(c->be->ops->weight_load(c->be, sp, 2, &c->w));
}

static void int4_free(int4_case *c) {
    if (c->be) {
        c->be->ops->weight_free(c->be, c->w);
        CHECK_OK(c->be->ops->destroy(c->be));
    }
    for (int p = 0; p < 2; p++) {
        free(c->packed[p]);
        free(c->scales[p]);
        free(c->zeros[p]);
    }
}

/* An INT4 weight of two fused parts (rows0 + rows1 rows, k columns, groups of g) through the
 * CPU backend's matmul and through its plain path (cpu_dequant_row, then the tile): the
 * results must be the same bits for decode and prefill, with 1 and 2 threads. Zero points
 * integer or not; k with and without a tail past the last 8-lane step. */
static void check_int4_kernel(int64_t rows0, int64_t rows1, int64_t k, int g, int threads) {
    int4_case c;
    int4_make(&c, rows0, rows1, k, g, threads);
    if (!c.be) return;
    atlas_backend *be = c.be;
    atlas_weight *w = c.w;
    int64_t m = rows0 + rows1;
    uint8_t **packed = c.packed;
    float **scales = c.scales, **zeros = c.zeros;
#if defined(__AVX2__) && defined(__FMA__)
    if (w) CHECK_MSG(g % 8 || cpu_int4_fast(&w->parts[0]), "groups of %d: no INT4 kernel", g);
#endif
    enum { NMAX = 5 };
    float *x = malloc((size_t)(NMAX * k) * sizeof(float));
    float *a = malloc((size_t)(NMAX * m) * sizeof(float)), *b = malloc((size_t)(NMAX * m) * sizeof(float));
    for (int64_t i = 0; i < NMAX * k; i++) x[i] = (float)((int)(knext() % 2001) - 1000) / 1000.0f;
    static const int ns[] = {1, 2, 3, NMAX};
    for (size_t t = 0; w && t < sizeof ns / sizeof ns[0]; t++) {
        memset(a, 0xff, (size_t)(NMAX * m) * sizeof(float));
        memset(b, 0, (size_t)(NMAX * m) * sizeof(float));
        CHECK_OK(be->ops->matmul(be, a, x, w, NULL, ns[t]));
        CHECK_OK(cpu_matmul_plain(be, b, x, w, NULL, ns[t]));
        int64_t bad = -1;
        for (int64_t i = 0; i < ns[t] * m && bad < 0; i++)
            if (memcmp(&a[i], &b[i], sizeof(float))) bad = i;
        CHECK_MSG(bad < 0, "INT4 %lld+%lld x %lld, groups of %d, %d threads, %d tokens: "
                  "out[%lld] = %.9g, the plain path %.9g", (long long)rows0, (long long)rows1,
                  (long long)k, g, threads, ns[t], (long long)bad, bad < 0 ? 0 : a[bad],
                  bad < 0 ? 0 : b[bad]);
    }
    /* each decode kernel on its own (AVX2, AVX-512VL where the CPU has it), part by part */
    for (int v = 0; w && v < 2; v++)
        for (int p = 0; p < 2; p++) {
            const cpu_part *part = &w->parts[p];
            if (!cpu_int4_fast(part)) continue;
            cpu_int4_gemv_at(part, x, k, 0, part->rows, a, v);
            CHECK_MSG(!memcmp(a, b + part->row0, (size_t)part->rows * sizeof(float)),
                      "INT4 kernel %s, part %d of %lld x %lld, groups of %d: not the plain "
                      "path's bits", v ? "AVX-512VL" : "AVX2", p, (long long)part->rows,
                      (long long)k, g);
        }
    /* one output against a double sum of the weights' values: the plain path itself */
    if (w) {
        double want = 0;
        for (int64_t j = 0; j < k; j++) {
            int q = (packed[0][j / 2] >> ((j & 1) * 4)) & 0xf;
            want += (double)(((float)q - zeros[0][j / g]) * scales[0][j / g]) * x[j];
        }
        CHECK_MSG(fabs(b[0] - want) <= 1e-4 * (1 + fabs(want)), "out[0] = %g, want %g", b[0], want);
    }
    int4_free(&c);
    free(x);
    free(a);
    free(b);
}

/* The same weight with int8 activations (`--cpu-activations int8`): each kernel this CPU runs
 * against the plain C one (the same integer sums; only the fp32 summation order differs),
 * and the backend's matmul against the fp32 result within what rounding x to int8 can move it:
 * each block's step max|x| / 127, half of it a value, times the weights' magnitudes. */
static void check_q8_kernel(int64_t rows0, int64_t rows1, int64_t k, int g, int threads) {
    int4_case c;
    int4_make(&c, rows0, rows1, k, g, threads);
    if (!c.be) return;
    atlas_backend *be = c.be;
    atlas_weight *w = c.w;
    int64_t sc = c.sc, m = rows0 + rows1;
    uint8_t **packed = c.packed;
    float **scales = c.scales, **zeros = c.zeros;
    CHECK_MSG(!w || cpu_q8_fits(w), "INT4 %lld x %lld, groups of %d: no int8 kernel",
              (long long)m, (long long)k, g);
    enum { NMAX = 5 };
    float *x = malloc((size_t)(NMAX * k) * sizeof(float));
    float *a = malloc((size_t)(NMAX * m) * sizeof(float)), *b = malloc((size_t)(NMAX * m) * sizeof(float));
    for (int64_t i = 0; i < NMAX * k; i++) x[i] = (float)((int)(knext() % 2001) - 1000) / 1000.0f;
    x[7] = 0;
    for (int64_t i = 32; i < 64 && i < k; i++) x[i] = 0; /* a block of zeros: scale 0 */
    size_t xs = (cpu_q8_pack_bytes(k, g) + 63) / 64 * 64;
    void *xp = aligned_alloc(64, xs * NMAX);
    float *ref = malloc((size_t)(NMAX * m) * sizeof(float));
    for (int t = 0; t < NMAX; t++) cpu_q8_pack(x + t * k, k, g, (char *)xp + xs * t);
    /* the SIMD packing writes the plain C one's bytes */
    void *xq = aligned_alloc(64, xs);
    for (int t = 0; t < NMAX; t++) {
        cpu_q8_pack_at(x + t * k, k, g, xq, 0);
        CHECK_MSG(!memcmp(xq, (char *)xp + xs * t, cpu_q8_pack_bytes(k, g)),
                  "int8 packing of %lld columns, groups of %d, token %d: SIMD differs from C",
                  (long long)k, g, t);
    }
    free(xq);
    /* the plain C kernel, then each kernel this CPU has, on both parts, 1 and NMAX tokens */
    for (int kind = CPU_Q8_PLAIN; w && kind <= CPU_Q8_NEON; kind++) {
        if (!cpu_q8_kind_supported((cpu_q8_kind)kind)) continue;
        float *o = kind == CPU_Q8_PLAIN ? ref : a;
        for (int p = 0; p < 2; p++) {
            const cpu_part *part = &w->parts[p];
            cpu_q8_gemm((cpu_q8_kind)kind, part, k, 0, part->rows, xp, xs, NMAX, o + part->row0, m);
        }
        for (int64_t i = 0; kind != CPU_Q8_PLAIN && i < NMAX * m; i++)
            CHECK_MSG(fabsf(a[i] - ref[i]) <= 1e-5f * (1 + fabsf(ref[i])),
                      "int8 kernel %d, %lld x %lld, groups of %d: out[%lld] = %.9g, plain C %.9g",
                      kind, (long long)m, (long long)k, g, (long long)i, a[i], ref[i]);
    }
    /* through the backend: the best kernel, every token count, against fp32 */
    CHECK_OK(atlas_backend_cpu_set_activations(be, ATLAS_CPU_ACT_INT8));
    static const int ns[] = {1, 2, NMAX};
    for (size_t t = 0; w && t < sizeof ns / sizeof ns[0]; t++) {
        CHECK_OK(be->ops->matmul(be, a, x, w, NULL, ns[t]));
        CHECK_OK(cpu_matmul_plain(be, b, x, w, NULL, ns[t]));
        for (int64_t i = 0; i < ns[t] * m; i++) {
            int64_t tok = i / m, r = i % m;
            int p = r >= rows0;
            int64_t pr = r - (p ? rows0 : 0);
            const float *xt = x + tok * k;
            double bound = 1e-5 * (1 + fabs(b[i]));
            for (int64_t blk = 0; blk < k / 32; blk++) {
                float amax = 0;
                for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xt[blk * 32 + j]));
                for (int j = 0; j < 32; j++) {
                    int64_t c = blk * 32 + j;
                    int q = (packed[p][(pr * k + c) / 2] >> ((c & 1) * 4)) & 0xf;
                    double wv = ((double)q - zeros[p][pr * sc + c / g]) * scales[p][pr * sc + c / g];
                    bound += fabs(wv) * amax / 254.0 * 1.0001;
                }
            }
            CHECK_MSG(fabs(a[i] - b[i]) <= bound && fabsf(a[i] - ref[(size_t)tok * m + r]) <=
                                                      1e-5f * (1 + fabsf(b[i])) + 1e-4f * (float)bound,
                      "int8 matmul %lld x %lld, groups of %d, %d threads, %d tokens: out[%lld] "
                      "= %.9g, fp32 %.9g (bound %.3g), the int8 reference %.9g", (long long)m,
                      (long long)k, g, threads, ns[t], (long long)i, a[i], b[i], bound,
                      ref[(size_t)tok * m + r]);
        }
    }
    int4_free(&c);
    free(x);
    free(a);
    free(b);
    free(ref);
    free(xp);
}

static void test_int4_kernels(void) {
    check_int4_kernel(4, 8, 256, 128, 1);  /* whole 4-row blocks, k a multiple of the group */
    check_int4_kernel(7, 5, 200, 32, 1);   /* odd rows; the last group short */
    check_int4_kernel(9, 3, 70, 16, 2);    /* a 6-column tail past the last 8-lane step */
    check_int4_kernel(200, 202, 512, 64, 2); /* enough rows to be split over the threads */
    check_int4_kernel(5, 6, 130, 130, 1);  /* one group a row (GPTQ's -1) */
    check_int4_kernel(6, 2, 48, 12, 1);    /* groups of 12: the plain path */
    check_q8_kernel(4, 8, 256, 128, 1);    /* whole chunks and groups */
    check_q8_kernel(7, 5, 352, 32, 1);     /* groups of 32; a chunk cut at 96 columns */
    check_q8_kernel(9, 3, 352, 64, 2);     /* groups of 64, the last one short */
    check_q8_kernel(200, 202, 512, 128, 2); /* rows split over the threads */
    check_q8_kernel(5, 6, 160, 160, 1);    /* one group a row, not a whole number of chunks */
    check_q8_kernel(3, 2, 512, 256, 1);    /* groups of two chunks */
}

int main(void) {
    test_int4_kernels();
    return harness_finish();
}

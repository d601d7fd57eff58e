/* kernels/quant.cuh — what every kernel of kernels/quant.cu shares: the formats' codes
 * dequantized with bit operations (see quant.cu's head), x loaded with the norm fusion, the
 * scale grid's arguments (qargs), the decode fusions' (qfuse), and one load's dot products. */
#ifndef ATLAS_KERNELS_QUANT_CUH
#define ATLAS_KERNELS_QUANT_CUH

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "mma.cuh"

enum { QF_FP8 = 1, QF_INT4 = 2, QF_FP4 = 3 }; /* atlas_wformat's values */

/* A block of QG_THREADS threads owns QG_ROWS weight rows and spans k, each thread QG_ROWS
 * 16-byte loads a step, all issued before any is used; the activations a thread reads (its
 * columns of x) serve all the rows. */
enum { QG_ROWS = 4, QG_THREADS = 128, QG_WARPS = QG_THREADS / 32 };

/* 4 e4m3 codes (one 32-bit word, the first in the low byte) as floats: every e4m3 value is a
 * half exactly, and sm_89+ converts two at a time in one instruction. */
__device__ __forceinline__ void fp8x4(uint32_t v, float *f) {
    __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v & 0xffffu), __NV_E4M3);
    __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v >> 16), __NV_E4M3);
    float2 a = __half22float2(*reinterpret_cast<__half2 *>(&lo));
    float2 b = __half22float2(*reinterpret_cast<__half2 *>(&hi));
    f[0] = a.x; f[1] = a.y; f[2] = b.x; f[3] = b.y;
}

/* (t & MASK) | 1.0f's bits in one LOP3 (C's expression compiles to two: both constants are
 * immediates, and a LOP3 holds one); MASK picks 4 mantissa bits, so the value is 1 + q 2^-n. */
template <uint32_t MASK> __device__ __forceinline__ float nib_or1(uint32_t t) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(t), "n"(MASK), "r"(0x3F800000u));
    return __uint_as_float(r);
}

/* 1 + q / 16 for nibble j of v (q in mantissa bits 19..22 of 1.0f: exact): a shift and one
 * AND-OR. */
__device__ __forceinline__ float nib1q(uint32_t v, int j) {
    return nib_or1<0x00780000u>(j < 5 ? v << (19 - 4 * j) : v >> (4 * j - 19));
}

/* Σ (1 + q_j / 256) x_j over word v's even nibbles j (lo) and Σ (1 + q_j / 16) x_j over its
 * odd ones (hi), x the word's 8 columns: one shift serves two nibbles, the even one landing
 * in mantissa bits 15..18 and the odd in 19..22 (exact either way; the even sum cancels 4
 * bits more against Σ x, far below the bf16 rounding elsewhere), so a weight costs half a
 * shift, one LOP3 and one FMA where nib1q costs a shift, two LOP3s and an FMA. */
__device__ __forceinline__ void nib_dot8(uint32_t v, const float *x, float &lo, float &hi) {
    const uint32_t t[4] = {v << 15, v << 7, v >> 1, v >> 9};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        lo = fmaf(nib_or1<0x00078000u>(t[i]), x[2 * i], lo);
        hi = fmaf(nib_or1<0x00780000u>(t[i]), x[2 * i + 1], hi);
    }
}

/* The 8 e2m1 codes of v (nibble j: column j) times 2^-14: nibbles j and j + 4 at once as a
 * half2, the magnitude (e1 e0 m) in bits 9..11 (the half's two low exponent bits and its top
 * mantissa bit; e = 0 a subnormal, as e2m1's 0 and 0.5 are) and the sign in bit 15. */
__device__ __forceinline__ void fp4x8(uint32_t v, float *f) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint32_t u = v >> (4 * j);
        uint32_t h = ((u << 9) & 0x0E000E00u) | ((u << 12) & 0x80008000u);
        float2 p = __half22float2(*reinterpret_cast<__half2 *>(&h));
        f[j] = p.x;
        f[j + 4] = p.y;
    }
}
enum { FP4_UNIT_LOG2 = 14 }; /* fp4x8's values are the codes' times 2^-14 */

/* The 16 codes of half h (columns 16h .. 16h + 15 of the load) in the encoding the fp32 GEMV
 * multiplies: FP8 their values, INT4 1 + q / 16, FP4 the value times 2^-14. FP8's load holds
 * one half, the 4-bit ones two. */
template <int FMT> __device__ __forceinline__ void raw16(const uint4 &u, int h, float *f) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
    if (FMT == QF_FP8) {
#pragma unroll
        for (int i = 0; i < 4; i++) fp8x4(w[i], f + 4 * i);
    } else {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            uint32_t v = w[2 * h + i];
            if (FMT == QF_FP4) {
                fp4x8(v, f + 8 * i);
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) f[8 * i + j] = nib1q(v, j);
            }
        }
    }
}

/* The same codes as values: FP8 and FP4 their values, INT4 q (0..15), all exact. */
template <int FMT> __device__ __forceinline__ void codes16(const uint4 &u, int h, float *f) {
    raw16<FMT>(u, h, f);
    if (FMT == QF_INT4)
#pragma unroll
        for (int i = 0; i < 16; i++) f[i] = fmaf(f[i], 16.0f, -16.0f);
    if (FMT == QF_FP4)
#pragma unroll
        for (int i = 0; i < 16; i++) f[i] *= (float)(1 << FP4_UNIT_LOG2);
}

/* x[c, c + E) as floats (16-byte aligned: k and c are multiples of 16), times nw[c, c + E)
 * when nw is set (the norm fusion; ss gets the sum of x^2). */
template <int E>
__device__ __forceinline__ void load_x(float *xf, const float *x, const bf16_t *nw, float &ss) {
#pragma unroll
    for (int i = 0; i < E / 4; i++) {
        float4 v = __ldg(reinterpret_cast<const float4 *>(x) + i);
        xf[4 * i] = v.x; xf[4 * i + 1] = v.y; xf[4 * i + 2] = v.z; xf[4 * i + 3] = v.w;
    }
    if (!nw) return;
#pragma unroll
    for (int i = 0; i < E / 8; i++) {
        uint4 u = __ldg(reinterpret_cast<const uint4 *>(nw) + i);
        float g[8];
        unpack8(u, g);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            ss += xf[8 * i + j] * xf[8 * i + j];
            xf[8 * i + j] *= g[j];
        }
    }
}

struct qargs {
    const float *scales, *zeros;
    const int32_t *g_idx;
    int rsh, csh, scols, p1, p2;
    const float *rowscale;
};

__device__ __forceinline__ float row_factor(const qargs &q, int row) {
    return q.rowscale ? __ldg(q.rowscale + row) : 1.0f;
}

/* Decode's fusions around one-row GEMVs (ops_cuda.c cuda_exec_fused), as kernels/gemv.cu's
 * for bf16, each on when its pointer is set: nw (with eps, h): the input is rmsnorm(x) * nw,
 * x being the residual stream (the block sums x^2 and scales its dot products at the end;
 * block 0 writes h, the norm's output); resid: the output is also added into resid; act: the
 * block's rows are gate rows 2b, 2b + 1 and up rows f + 2b, f + 2b + 1 (m = 2f) and
 * act[i] = act(gate i) * up i (ga: glu_mul's) is written beside the
 * output. */
struct qfuse {
    const bf16_t *nw;
    float eps;
    float *h, *resid, *act;
    glu_act ga;
};

/* One row's share of one load (E columns from c) against x's: acc += scale * dot, in fp32.
 * INT4's raw values are 1 + q / 16, so sum (q - z) x = 16 dot - (16 + z) sum x; FP4's are
 * the values times 2^-14. A scale covering 32 columns is read once for both halves. */
template <int FMT>
__device__ __forceinline__ float qdot(const uint4 &u, const float *xf, const float *sx, int row,
                                      int c, const qargs &q) {
    constexpr int HALVES = FMT == QF_FP8 ? 1 : 2;
    float d[HALVES];
#pragma unroll
    for (int h = 0; h < HALVES; h++) {
        float f[16];
        raw16<FMT>(u, h, f);
        float a = 0.0f, b = 0.0f; /* two chains: the FMAs' latency */
#pragma unroll
        for (int i = 0; i < 16; i += 2) {
            a = fmaf(f[i], xf[16 * h + i], a);
            b = fmaf(f[i + 1], xf[16 * h + i + 1], b);
        }
        d[h] = a + b;
    }
    const float unit = FMT == QF_FP4 ? (float)(1 << FP4_UNIT_LOG2) : 1.0f;
    size_t base = (size_t)(row >> q.rsh) * q.scols;
    if (HALVES == 1 || q.csh >= 5) {
        size_t si = base + (c >> q.csh);
        float s = __ldg(q.scales + si) * unit, dd = d[0] + (HALVES == 2 ? d[HALVES - 1] : 0.0f);
        if (FMT == QF_INT4)
            dd = 16.0f * dd - (16.0f + __ldg(q.zeros + si)) * (sx[0] + sx[HALVES - 1]);
        return s * dd;
    }
    float r = 0.0f;
#pragma unroll
    for (int h = 0; h < HALVES; h++) {
        size_t si = base + ((c + 16 * h) >> q.csh);
        float dd = d[h];
        if (FMT == QF_INT4) dd = 16.0f * dd - (16.0f + __ldg(q.zeros + si)) * sx[h];
        r = fmaf(__ldg(q.scales + si) * unit, dd, r);
    }
    return r;
}

/* The same with act-order (INT4): a scale and zero looked up a column. */
__device__ __forceinline__ float qdot_gidx(const uint4 &u, const float *xf, int row, int c,
                                           int k, const qargs &q) {
    int part = (row >= q.p1) + (row >= q.p2);
    const int32_t *gi = q.g_idx + (size_t)part * k + c;
    const float *sr = q.scales + (size_t)row * q.scols, *zr = q.zeros + (size_t)row * q.scols;
    float d = 0.0f;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float f[16];
        codes16<QF_INT4>(u, h, f);
#pragma unroll
        for (int i = 0; i < 16; i++) {
            int g = __ldg(gi + 16 * h + i);
            d += (f[i] - __ldg(zr + g)) * __ldg(sr + g) * xf[16 * h + i];
        }
    }
    return d;
}

/* x's 32 columns of one load as int8 (X8: the INT4 kernel with int8 activations): q = round(x
 * * 127 / amax), x ~ d * q with d = amax / 127, packed as the weights' nibbles lie (word i of
 * a load holds columns 8i .. 8i + 7, byte t's low nibble column 8i + 2t, its high one 8i + 2t
 * + 1): xe[i] the even columns' bytes, xo[i] the odd ones'; sq[h] the sum of half h's q.
 * Each 4-bit dot product is then 8 dp4a where it was 32 conversions and FMAs. */
struct qx8 {
    int xe[4], xo[4], sq[2];
    float d;
};

__device__ __forceinline__ qx8 quantize_x8(const float *xf) {
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xf[i]));
    qx8 r;
    r.d = amax * (1.0f / 127.0f);
    float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int v[8];
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = __float2int_rn(xf[8 * i + j] * inv);
        r.xe[i] = (int)__byte_perm(__byte_perm(v[0], v[2], 0x0040), __byte_perm(v[4], v[6], 0x0040),
                                   0x5410);
        r.xo[i] = (int)__byte_perm(__byte_perm(v[1], v[3], 0x0040), __byte_perm(v[5], v[7], 0x0040),
                                   0x5410);
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int t = __dp4a(r.xe[2 * h], 0x01010101, 0);
        t = __dp4a(r.xo[2 * h], 0x01010101, t);
        t = __dp4a(r.xe[2 * h + 1], 0x01010101, t);
        r.sq[h] = __dp4a(r.xo[2 * h + 1], 0x01010101, t);
    }
    return r;
}

/* qdot for INT4 against int8 x: sum (q - z) x = d (sum q xq - z sum xq), a scale (and zero)
 * for both halves or one each, as qdot. */
__device__ __forceinline__ float qdot_x8(const uint4 &u, const qx8 &x, int row, int c,
                                         const qargs &q) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
    int dq[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int t = 0;
#pragma unroll
        for (int i = 2 * h; i < 2 * h + 2; i++) {
            t = __dp4a((int)(w[i] & 0x0F0F0F0Fu), x.xe[i], t);
            t = __dp4a((int)((w[i] >> 4) & 0x0F0F0F0Fu), x.xo[i], t);
        }
        dq[h] = t;
    }
    size_t base = (size_t)(row >> q.rsh) * q.scols;
    if (q.csh >= 5) {
        size_t si = base + (c >> q.csh);
        float z = __ldg(q.zeros + si);
        return __ldg(q.scales + si) * x.d * ((float)(dq[0] + dq[1]) - z * (float)(x.sq[0] + x.sq[1]));
    }
    float r = 0.0f;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        size_t si = base + ((c + 16 * h) >> q.csh);
        r = fmaf(__ldg(q.scales + si) * x.d, (float)dq[h] - __ldg(q.zeros + si) * (float)x.sq[h], r);
    }
    return r;
}

/* (lo, hi) rounded to nearest even into one bf16x2 register (lo in the low half), in one
 * instruction (sm_80+). */
__device__ __forceinline__ uint32_t cvt_bf16x2(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* The E (16 or 32) weights of one 16-byte load of row `row` from column c: the codes minus
 * INT4's zero (exact in bf16 for the integral zeros the formats store), times the scale when
 * `scaled`. */
template <int FMT>
__device__ __forceinline__ void qrow(const uint4 &u, float *f, int row, int c, int k,
                                     const qargs &q, bool scaled) {
    constexpr int HALVES = FMT == QF_FP8 ? 1 : 2;
#pragma unroll
    for (int h = 0; h < HALVES; h++) {
        codes16<FMT>(u, h, f + 16 * h);
        int cc = c + 16 * h;
        size_t si = (size_t)(row >> q.rsh) * q.scols + ((cc < k ? cc : 0) >> q.csh);
        float s = scaled ? __ldg(q.scales + si) : 1.0f;
        float z = FMT == QF_INT4 ? __ldg(q.zeros + si) : 0.0f;
#pragma unroll
        for (int i = 0; i < 16; i++) f[16 * h + i] = (f[16 * h + i] - z) * s;
    }
}

#endif

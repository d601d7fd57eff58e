/* kernels/quant.cu — matmul of quantized weights (backend/backend.h, atlas_wformat):
 *   atlas_qgemv1_<fmt>    out[1, m] = x[1, k] @ w[m, k]^T (+ bias) (decode at batch 1): the
 *                         packed bytes read once with streaming loads and dequantized in
 *                         registers, in fp32 (weight-only: the activations are not rounded);
 *                         atlas_qgemv8_int4g the same for 2..8 rows with act-order
 *   atlas_qgemv1c_<fmt>   the same one row with several row groups a block (not act-order)
 *   atlas_qgemv1s_<fmt>   the same one row streamed: x held in registers, each row's codes and
 *                         scales loaded rows ahead through a ring of register stages, one wave
 *                         of blocks (cuda_qgemv1's CUDA_QGEMV_S, _S4, _SX); atlas_qgemv1sp_<fmt>
 *                         the ring in shared memory, by cp.async (CUDA_QGEMV_SP)
 *   atlas_qmma<NG>_<fmt>  2..8 NG rows (serving steps) on the tensor cores, below
 *   atlas_qdequant_<fmt>  w as bf16 [m, k] into a scratch buffer, for the bf16 matmuls of
 *                         larger batches (prefill: compute-bound, so the extra pass is small)
 *   atlas_qrowscale       out[j, r] = out[j, r] * rowscale[r] (+ bias[r]) after such a matmul
 * fmt: fp8 (e4m3 codes [m, k]), int4 ([m, k/2] bytes, column 2j in the low nibble of byte j;
 * w = (q - zero) * scale), int4g (the same with GPTQ's act-order g_idx), fp4 (e2m1 codes packed
 * as int4; w = e2m1 * scale). Scales (and zeros) are float32 over the grid
 * [ceil(m / br), scols]: element (r, c) takes entry (r >> rsh) * scols + (c >> csh), a scale
 * covering 2^rsh rows and 2^csh >= 16 columns (a shift of 31: all of them). int4g instead
 * takes entry r * scols + g_idx[part(r) * k + c], where the rows of a fused weight's parts
 * (each with its own g_idx) begin at 0, p1 and p2. rowscale, when not NULL, multiplies row r
 * of the product in fp32 (NVFP4's global scale, kept out of the scale grid so that a code
 * times its e4m3 scale is exact in bf16). k % 16 == 0 (fp8) or k % 32 == 0.
 *
 * The codes are dequantized with bit operations, not tables or integer conversions: a 4-bit
 * q placed in the top of a float's mantissa is 1 + q / 16 in one AND-OR (the 1 and the 16
 * folded into a sum of x a group), an e2m1 code placed in a half's exponent and mantissa is
 * its value times 2^-14 (subnormals included; the 2^14 folded into the scale), and e4m3 goes
 * through the two-at-a-time conversion of sm_89+. */
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

/* 1 + q / 16 for nibble j of v (q in mantissa bits 19..22 of 1.0f: exact): a shift and one
 * AND-OR. */
__device__ __forceinline__ float nib1q(uint32_t v, int j) {
    uint32_t t = j < 5 ? v << (19 - 4 * j) : v >> (4 * j - 19);
    return __uint_as_float((t & 0x00780000u) | 0x3F800000u);
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

/* N: the most activation rows (n <= N). GIDX: INT4 with a g_idx. X8: INT4 against int8 x
 * (quantize_x8; one row, no g_idx). */
template <int FMT, int N, bool GIDX, bool X8 = false>
__device__ __forceinline__ void qgemv_body(float *out, const float *x, const uint8_t *w,
                                           const bf16_t *bias, int n, int m, int k, qargs q,
                                           qfuse fx = qfuse{0, 0.0f, 0, 0, 0, 0}) {
    constexpr int E = FMT == QF_FP8 ? 16 : 32; /* columns a 16-byte load holds */
    constexpr int HALVES = E / 16;
    __shared__ float red[QG_WARPS][QG_ROWS][N];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const size_t rbytes = FMT == QF_FP8 ? (size_t)k : (size_t)k / 2;
    int rows[QG_ROWS]; /* the block's weight rows */
#pragma unroll
    for (int r = 0; r < QG_ROWS; r++)
        rows[r] = fx.act ? (r >> 1) * (m / 2) + 2 * blockIdx.x + (r & 1) : blockIdx.x * QG_ROWS + r;
    const uint8_t *wr[QG_ROWS];
#pragma unroll
    for (int r = 0; r < QG_ROWS; r++) wr[r] = w + (size_t)min(rows[r], m - 1) * rbytes;
    float ss = 0.0f; /* the norm fusion's sum of x^2 */
    float acc[QG_ROWS][N];
#pragma unroll
    for (int r = 0; r < QG_ROWS; r++)
#pragma unroll
        for (int j = 0; j < N; j++) acc[r][j] = 0.0f;

    int c = tid * E;
    uint4 cur[QG_ROWS];
#pragma unroll
    for (int r = 0; r < QG_ROWS; r++) /* the weights do not depend on the previous kernel */
        cur[r] = c < k ? ld_stream16(wr[r] + (FMT == QF_FP8 ? c : c / 2)) : make_uint4(0, 0, 0, 0);
    pdl_trigger();
    pdl_wait();
    for (; c < k; c += QG_THREADS * E) {
        int cn = c + QG_THREADS * E;
        uint4 nxt[QG_ROWS];
#pragma unroll
        for (int r = 0; r < QG_ROWS; r++)
            nxt[r] = cn < k ? ld_stream16(wr[r] + (FMT == QF_FP8 ? cn : cn / 2))
                            : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int j = 0; j < N; j++) {
            if (j >= n) break;
            float xf[E];
            load_x<E>(xf, x + (size_t)j * k + c, fx.nw ? fx.nw + c : nullptr, ss); /* nw: n 1 */
            if constexpr (X8) {
                qx8 xq = quantize_x8(xf);
#pragma unroll
                for (int r = 0; r < QG_ROWS; r++)
                    acc[r][j] += qdot_x8(cur[r], xq, min(rows[r], m - 1), c, q);
            } else {
                float sx[HALVES];
#pragma unroll
                for (int h = 0; h < HALVES; h++) {
                    float a = 0.0f, b = 0.0f;
                    if (FMT == QF_INT4 && !GIDX)
#pragma unroll
                        for (int i = 0; i < 16; i += 2) {
                            a += xf[16 * h + i];
                            b += xf[16 * h + i + 1];
                        }
                    sx[h] = a + b;
                }
#pragma unroll
                for (int r = 0; r < QG_ROWS; r++) {
                    int row = min(rows[r], m - 1);
                    if (GIDX) acc[r][j] += qdot_gidx(cur[r], xf, row, c, k, q);
                    else acc[r][j] += qdot<FMT>(cur[r], xf, sx, row, c, q);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < QG_ROWS; r++) cur[r] = nxt[r];
    }
    /* rsqrt(mean(x^2) + eps) of the norm fusion (every thread gets it) */
    float scale = fx.nw ? rsqrtf(block_sum(ss) / (float)k + fx.eps) : 1.0f;
#pragma unroll
    for (int r = 0; r < QG_ROWS; r++)
#pragma unroll
        for (int j = 0; j < N; j++) {
            float s = warp_sum(acc[r][j]);
            if (lane == 0) red[warp][r][j] = s;
        }
    __syncthreads();
    if (warp == 0) {
        int r = lane / N, j = lane % N, row = r < QG_ROWS ? rows[r] : m;
        float s = 0.0f;
        if (lane < QG_ROWS * N) {
#pragma unroll
            for (int i = 0; i < QG_WARPS; i++) s += red[i][r][j];
            s = s * scale * (row < m ? row_factor(q, row) : 1.0f) +
                (bias && row < m ? bf2f(bias[row]) : 0.0f);
        }
        if (lane < QG_ROWS * N && j < n && row < m) {
            out[(size_t)j * m + row] = s;
            if (fx.resid) fx.resid[row] += s;
        }
        if (fx.act) { /* N = 1: lanes 0, 1 hold gate rows 2b, 2b + 1; lanes 2, 3 their up rows */
            float u = __shfl_down_sync(0xffffffffu, s, 2);
            if (lane < 2 && rows[lane] < m / 2) fx.act[rows[lane]] = glu_mul(s, u, fx.ga);
        }
    }
    if (fx.nw && fx.h && blockIdx.x == 0 && warp == 1) /* (warp 0 is busy above) */
        for (int i = lane * 4; i < k; i += 32 * 4) {
            float4 v = *reinterpret_cast<const float4 *>(x + i);
            v.x *= scale * bf2f(fx.nw[i]); v.y *= scale * bf2f(fx.nw[i + 1]);
            v.z *= scale * bf2f(fx.nw[i + 2]); v.w *= scale * bf2f(fx.nw[i + 3]);
            *reinterpret_cast<float4 *>(fx.h + i) = v;
        }
}

/* grid ceil(m / QG_ROWS), block QG_THREADS; N 1 for one row, else 8. */
#define ATLAS_QGEMV(NAME, FMT, N, GIDX)                                                           \
    extern "C" __global__ void __launch_bounds__(QG_THREADS)                                      \
        NAME(float *out, const float *x, const uint8_t *w, const bf16_t *bias, int n, int m,       \
             int k, const float *scales, const float *zeros, const int32_t *g_idx, int rsh,        \
             int csh, int scols, int p1, int p2, const float *rowscale) {                          \
        qgemv_body<FMT, N, GIDX>(out, x, w, bias, n, m, k,                                         \
                                 qargs{scales, zeros, g_idx, rsh, csh, scols, p1, p2, rowscale});  \
    }
ATLAS_QGEMV(atlas_qgemv8_int4g, QF_INT4, 8, true) /* act-order's 2..8 rows (no qmma for it) */

/* One row, with the fusions of qfuse (NULL pointers: off): the arguments of atlas_qgemv, then
 * nw, eps, h, resid, act, ga. grid ceil(m / QG_ROWS) (with act: m / QG_ROWS, m % 4 == 0). */
#define ATLAS_QGEMV1(NAME, FMT, GIDX)                                                             \
    extern "C" __global__ void __launch_bounds__(QG_THREADS)                                      \
        NAME(float *out, const float *x, const uint8_t *w, const bf16_t *bias, int n, int m,       \
             int k, const float *scales, const float *zeros, const int32_t *g_idx, int rsh,        \
             int csh, int scols, int p1, int p2, const float *rowscale, const bf16_t *nw,          \
             float eps, float *h, float *resid, float *act, glu_act ga) {                          \
        qgemv_body<FMT, 1, GIDX>(out, x, w, bias, 1, m, k,                                         \
                                 qargs{scales, zeros, g_idx, rsh, csh, scols, p1, p2, rowscale},   \
                                 qfuse{nw, eps, h, resid, act, ga});                               \
    }
/* atlas_qgemv1x_int4: atlas_qgemv1_int4 with x rounded to int8 a 32 columns (quantize_x8) */
extern "C" __global__ void __launch_bounds__(QG_THREADS)
    atlas_qgemv1x_int4(float *out, const float *x, const uint8_t *w, const bf16_t *bias, int n,
                       int m, int k, const float *scales, const float *zeros,
                       const int32_t *g_idx, int rsh, int csh, int scols, int p1, int p2,
                       const float *rowscale, const bf16_t *nw, float eps, float *h, float *resid,
                       float *act, glu_act ga) {
    qgemv_body<QF_INT4, 1, false, true>(out, x, w, bias, 1, m, k,
                                        qargs{scales, zeros, g_idx, rsh, csh, scols, p1, p2, rowscale},
                                        qfuse{nw, eps, h, resid, act, ga});
}
ATLAS_QGEMV1(atlas_qgemv1_fp8, QF_FP8, false)
ATLAS_QGEMV1(atlas_qgemv1_int4, QF_INT4, false)
ATLAS_QGEMV1(atlas_qgemv1_int4g, QF_INT4, true)
ATLAS_QGEMV1(atlas_qgemv1_fp4, QF_FP4, false)

/* --- several row groups a block (the default for one row, not act-order) ---------------------
 * One group's work is small in 4 bits (the 8B shape's o rows: 2 KB each, one 16-byte load a
 * thread), so a block that ends after one group leaves the memory idle while the next wave of
 * blocks starts, and a kernel boundary costs more than the bytes it reads. As gemv.cu's
 * gemv1c: a block owns ng groups of QG_ROWS rows and walks (group, QG_THREADS * E columns)
 * items from two register buffers used in turn, each item's loads issued two items ahead and
 * the first two before the wait for the previous kernel.  With the norm fusion the squares
 * are summed over the first group's items (every group reads the same x) and the scale kept
 * for the later ones; block 0 writes h at the end. */
template <int FMT>
__device__ __forceinline__ void qgemv1c_body(float *out, const float *x, const uint8_t *w,
                                             const bf16_t *bias, int m, int k, qargs q,
                                             qfuse fx, int groups, int ng) {
    constexpr int E = FMT == QF_FP8 ? 16 : 32, HALVES = E / 16, CH = QG_THREADS * E;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const size_t rbytes = FMT == QF_FP8 ? (size_t)k : (size_t)k / 2;
    const int nch = (k + CH - 1) / CH, b0 = blockIdx.x * ng;
    const int items = max(0, min(ng, groups - b0)) * nch;
    __shared__ float part[2][QG_WARPS][QG_ROWS + 1];
    __shared__ float scale_s;
    /* row r of group b: with act, gate rows 2b, 2b + 1 and their up rows m/2 + 2b, + 1 */
    auto row_of = [&](int b, int r) {
        return fx.act ? (r >> 1) * (m / 2) + 2 * b + (r & 1) : b * QG_ROWS + r;
    };
    auto load = [&](uint4 (&buf)[QG_ROWS], int it) {
        int b = b0 + it / nch, c = (it % nch) * CH + tid * E;
#pragma unroll
        for (int r = 0; r < QG_ROWS; r++) {
            const uint8_t *wr = w + (size_t)min(row_of(b, r), m - 1) * rbytes;
            buf[r] = c < k ? ld_stream16(wr + (FMT == QF_FP8 ? c : c / 2)) : make_uint4(0, 0, 0, 0);
        }
    };
    float acc[QG_ROWS] = {0.0f, 0.0f, 0.0f, 0.0f}, ss = 0.0f, scale = 1.0f;
    auto item = [&](uint4 (&buf)[QG_ROWS], int it) {
        int j = it / nch, b = b0 + j, c = (it % nch) * CH + tid * E;
        if (c < k) {
            float xf[E], ss_item = 0.0f;
            load_x<E>(xf, x + c, fx.nw ? fx.nw + c : nullptr, ss_item);
            if (j == 0) ss += ss_item; /* every group reads the same x: count it once */
            float sx[HALVES];
#pragma unroll
            for (int h = 0; h < HALVES; h++) {
                float a = 0.0f, bb = 0.0f;
                if (FMT == QF_INT4)
#pragma unroll
                    for (int i = 0; i < 16; i += 2) {
                        a += xf[16 * h + i];
                        bb += xf[16 * h + i + 1];
                    }
                sx[h] = a + bb;
            }
#pragma unroll
            for (int r = 0; r < QG_ROWS; r++)
                acc[r] += qdot<FMT>(buf[r], xf, sx, min(row_of(b, r), m - 1), c, q);
        }
        if (it + 2 < items) load(buf, it + 2);
        if (it % nch != nch - 1) return;
        /* the group's last item: its rows' sums, then the epilogue by warp 0 */
        float (*pp)[QG_ROWS + 1] = part[j & 1]; /* by parity: one barrier a group */
#pragma unroll
        for (int r = 0; r < QG_ROWS; r++) {
            float v = warp_sum(acc[r]);
            if (lane == 0) pp[warp][r] = v;
            acc[r] = 0.0f;
        }
        if (fx.nw && j == 0) {
            float v = warp_sum(ss);
            if (lane == 0) pp[warp][QG_ROWS] = v;
        }
        __syncthreads();
        if (warp != 0) return;
        if (fx.nw && j == 0) {
            float t = 0.0f;
#pragma unroll
            for (int i = 0; i < QG_WARPS; i++) t += pp[i][QG_ROWS];
            scale = rsqrtf(t / (float)k + fx.eps);
            if (lane == 0) scale_s = scale;
        }
        int r = lane & (QG_ROWS - 1), row = row_of(b, r);
        bool mine = lane < QG_ROWS && row < m;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < QG_WARPS; i++) s += pp[i][r];
        s = s * scale * (mine ? row_factor(q, row) : 1.0f) + (bias && mine ? bf2f(bias[row]) : 0.0f);
        if (mine) {
            out[row] = s;
            if (fx.resid) fx.resid[row] += s;
        }
        if (fx.act) { /* lanes 0, 1 hold gate rows 2b, 2b + 1; lanes 2, 3 their up rows */
            float u = __shfl_down_sync(0xffffffffu, s, 2);
            if (lane < 2 && row < m / 2) fx.act[row] = glu_mul(s, u, fx.ga);
        }
    };
    uint4 wa[QG_ROWS], wb[QG_ROWS];
    if (items > 0) load(wa, 0); /* before the wait: weights only */
    if (items > 1) load(wb, 1);
    pdl_trigger();
    pdl_wait();
    for (int it = 0; it < items; it += 2) {
        item(wa, it);
        if (it + 1 < items) item(wb, it + 1);
    }
    if (fx.nw && fx.h && blockIdx.x == 0) {
        __syncthreads();
        float sc = scale_s;
        for (int i = tid * 4; i < k; i += QG_THREADS * 4) {
            float4 v = *reinterpret_cast<const float4 *>(x + i);
            v.x *= sc * bf2f(fx.nw[i]); v.y *= sc * bf2f(fx.nw[i + 1]);
            v.z *= sc * bf2f(fx.nw[i + 2]); v.w *= sc * bf2f(fx.nw[i + 3]);
            *reinterpret_cast<float4 *>(fx.h + i) = v;
        }
    }
}

/* The arguments of atlas_qgemv1_<fmt>, then groups (ceil(m / QG_ROWS), with act m / QG_ROWS)
 * and ng; grid ceil(groups / ng), block QG_THREADS. */
#define ATLAS_QGEMV1C(NAME, FMT)                                                                  \
    extern "C" __global__ void __launch_bounds__(QG_THREADS)                                      \
        NAME(float *out, const float *x, const uint8_t *w, const bf16_t *bias, int n, int m,       \
             int k, const float *scales, const float *zeros, const int32_t *g_idx, int rsh,        \
             int csh, int scols, int p1, int p2, const float *rowscale, const bf16_t *nw,          \
             float eps, float *h, float *resid, float *act, glu_act ga, int groups, int ng) {      \
        qgemv1c_body<FMT>(out, x, w, bias, m, k,                                                   \
                          qargs{scales, zeros, g_idx, rsh, csh, scols, p1, p2, rowscale},          \
                          qfuse{nw, eps, h, resid, act, ga}, groups, ng);                          \
    }
ATLAS_QGEMV1C(atlas_qgemv1c_fp8, QF_FP8)
ATLAS_QGEMV1C(atlas_qgemv1c_int4, QF_INT4)
ATLAS_QGEMV1C(atlas_qgemv1c_fp4, QF_FP4)

/* --- one row, the weights streamed through a ring of register stages (qgemv1s) --------------
 * The kernels above keep too few bytes in flight at the decode shapes (bench/RESULTS.md: 25-36%
 * of the read rate at the 8B shape, latency-bound): after its weights arrive each item waits
 * for x and then for its scales, a round trip each, and a grid of several waves pays the
 * kernel's head and tail once a wave. Here a thread owns E columns of x for the whole kernel
 * (read once, after the wait) and walks the block's rows, the block spanning k (32 ceil(k /
 * 32E) threads); each row's codes, scale and zero are loaded D rows ahead through D register
 * stages used in turn (the first D before the wait for the previous kernel), so D loads a
 * thread stay in flight while a row is reduced. The grid is one wave (blocks an SM from the
 * occupancy), the rows split evenly between its blocks; with act a block's rows run gate i, up
 * f + i in turn. A turn's D row sums are halved across a warp (D - 1 + log2(32 / D) shuffles
 * for D rows), then summed over the warps through shared memory: one barrier a turn. One scale
 * a load: groups of E columns or more (csh >= log2(E)), which the host checks; or G16, FP4's
 * groups of 16 (NVFP4), a scale a half. */
template <int D>
__device__ __forceinline__ float turn_sum(float (&v)[D], int lane) {
#pragma unroll
    for (int n = D, o = 16; n > 1; n >>= 1, o >>= 1) {
        bool up = lane & o; /* this lane keeps the upper half of the rows and sends the lower */
#pragma unroll
        for (int i = 0; i < n / 2; i++) {
            float send = up ? v[i] : v[i + n / 2], keep = up ? v[i + n / 2] : v[i];
            v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
    }
    float r = v[0]; /* row lane / (32 / D)'s sum over the lanes that share it */
#pragma unroll
    for (int o = 16 / D; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
    return r;
}

/* cp.async of 4 bytes (zeros where bytes is 0), through L1 as a scale is read by the block's
 * neighbouring threads too. */
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem, int bytes) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(s), "l"(gmem), "r"(bytes));
}

/* S = 0: the ring of D register stages described above. S > 0 (a power of two), the ring in
 * shared memory: a thread's codes, scales and zero go by cp.async into its own slots of S
 * stages (dynamic shared memory, cuda_qstream_slot's bytes a thread a stage), so that S - 1
 * items a thread are in flight without registers to hold them: the register ring's 8 x 16
 * bytes and x's 32 registers left 4 blocks of 128 threads an SM, 64 KB in flight, less than
 * the memory's latency wants at its rate. A thread reads only the slots it fills: no
 * barrier. */
template <int FMT, int D, bool X8, bool G16 = false, int S = 0>
__device__ __forceinline__ void qgemv1s_body(float *out, const float *x, const uint8_t *w,
                                             const bf16_t *bias, int m, int k, qargs q,
                                             qfuse fx) {
    constexpr int E = FMT == QF_FP8 ? 16 : 32, HALVES = E / 16;
    static_assert(D >= 2 && D <= 32 && (D & (D - 1)) == 0, "D: an even power of two");
    static_assert(S == 0 || (S >= 4 && (S & (S - 1)) == 0), "S: 0, or a power of two >= 4");
    static_assert(!X8 || FMT == QF_INT4, "int8 x: INT4 only");
    static_assert(!G16 || FMT == QF_FP4, "a scale a half: FP4 only");
    constexpr int SL = G16 ? 2 : 1; /* scales a load */
    constexpr int NF = SL + (FMT == QF_INT4 ? 1 : 0); /* floats a slot: scales, then zero */
    constexpr int RD = S > 0 ? 1 : D;                  /* register stages */
    __shared__ float red[2][32][D]; /* a turn's row sums by warp, by the turn's parity */
    extern __shared__ __align__(16) unsigned char qs_ring[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
    const int c = tid * E; /* this thread's columns */
    const bool on = c < k;
    const size_t rbytes = FMT == QF_FP8 ? (size_t)k : (size_t)k / 2;
    const int units = fx.act ? m / 2 : m; /* rows, or (gate, up) pairs */
    const int u0 = (int)((long long)blockIdx.x * units / gridDim.x);
    const int u1 = (int)((long long)(blockIdx.x + 1) * units / gridDim.x);
    const int items = (u1 - u0) * (fx.act ? 2 : 1);
    auto row_of = [&](int it) { return fx.act ? (it & 1) * (m / 2) + u0 + (it >> 1) : u0 + it; };
    const uint8_t *wc = w + (FMT == QF_FP8 ? c : c / 2);
    const size_t cg = on ? (size_t)(c >> q.csh) : 0, cg1 = on ? (size_t)((c + 16) >> q.csh) : 0;
    uint4 wv[RD];
    float sv[RD][SL], zv[RD];
    auto load = [&](int s, int it) { /* register stage s (unrolled: registers) <- item it */
        bool ok = on && it < items;
        int row = ok ? row_of(it) : 0;
        size_t si = (size_t)(row >> q.rsh) * q.scols + cg;
        wv[s] = ok ? ld_stream16(wc + (size_t)row * rbytes) : make_uint4(0, 0, 0, 0);
        sv[s][0] = ok ? __ldg(q.scales + si) : 0.0f;
        if constexpr (G16) sv[s][SL - 1] = ok ? __ldg(q.scales + si - cg + cg1) : 0.0f;
        zv[s] = FMT == QF_INT4 && ok ? __ldg(q.zeros + si) : 0.0f;
    };
    uint4 *ring_w = reinterpret_cast<uint4 *>(qs_ring);                 /* [S][blockDim] */
    float *ring_f = reinterpret_cast<float *>(ring_w + S * blockDim.x); /* [S][NF][blockDim] */
    auto issue = [&](int it) { /* item it into its ring slot, one commit group (even empty) */
        bool ok = on && it < items;
        int row = ok ? row_of(it) : 0, slot = it & (S - 1);
        size_t si = (size_t)(row >> q.rsh) * q.scols + cg;
        float *f = ring_f + (size_t)slot * NF * blockDim.x + tid;
        cp_async16(ring_w + (size_t)slot * blockDim.x + tid, ok ? wc + (size_t)row * rbytes : w,
                   ok ? 16 : 0);
        cp_async4(f, ok ? q.scales + si : q.scales, ok ? 4 : 0);
        if constexpr (G16)
            cp_async4(f + blockDim.x, ok ? q.scales + si - cg + cg1 : q.scales, ok ? 4 : 0);
        if constexpr (FMT == QF_INT4)
            cp_async4(f + (NF - 1) * blockDim.x, ok ? q.zeros + si : q.zeros, ok ? 4 : 0);
        asm volatile("cp.async.commit_group;");
    };
    auto take = [&](int it) { /* item it from its slot into register stage 0 */
        asm volatile("cp.async.wait_group %0;" ::"n"(S > 1 ? S - 2 : 0));
        int slot = it & (S - 1);
        const float *f = ring_f + (size_t)slot * NF * blockDim.x + tid;
        wv[0] = ring_w[(size_t)slot * blockDim.x + tid];
        sv[0][0] = f[0];
        if constexpr (G16) sv[0][SL - 1] = f[blockDim.x];
        zv[0] = FMT == QF_INT4 ? f[(NF - 1) * blockDim.x] : 0.0f;
    };
    if constexpr (S > 0) {
#pragma unroll 1
        for (int i = 0; i < S - 1; i++) issue(i); /* the weights: not the previous kernel's */
    } else {
#pragma unroll
        for (int s = 0; s < D; s++) load(s, s);
    }
    pdl_trigger();
    pdl_wait();
    float xf[E], ss = 0.0f, sx = 0.0f;
    if (on) {
        load_x<E>(xf, x + c, fx.nw ? fx.nw + c : nullptr, ss);
    } else {
#pragma unroll
        for (int i = 0; i < E; i++) xf[i] = 0.0f;
    }
#pragma unroll
    for (int h = 0; h < HALVES && FMT == QF_INT4; h++) { /* as qgemv_body sums them */
        float a = 0.0f, b = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; i += 2) {
            a += xf[16 * h + i];
            b += xf[16 * h + i + 1];
        }
        sx += a + b;
    }
    float scale = 1.0f; /* the norm fusion's rsqrt(mean(x^2) + eps); block 0 writes h */
    if (fx.nw) {
        scale = rsqrtf(block_sum(ss) / (float)k + fx.eps);
        if (fx.h && blockIdx.x == 0 && on)
#pragma unroll
            for (int i = 0; i < E; i += 4)
                *reinterpret_cast<float4 *>(fx.h + c + i) =
                    make_float4(xf[i] * scale, xf[i + 1] * scale, xf[i + 2] * scale,
                                xf[i + 3] * scale);
    }
    const float unit = FMT == QF_FP4 ? (float)(1 << FP4_UNIT_LOG2) : 1.0f;
    qx8 xq; /* X8: x rounded to int8 (quantize_x8), the floats no longer needed */
    if constexpr (X8) xq = quantize_x8(xf);
    for (int base = 0; base < items; base += D) {
        float v[D];
#pragma unroll
        for (int j = 0; j < D; j++) {
            const int s = S > 0 ? 0 : j; /* the register stage item base + j is in */
            if constexpr (S > 0) {
                take(base + j);
                issue(base + j + S - 1); /* into the slot the item before emptied */
            }
            if constexpr (X8) { /* as qdot_x8 with one scale a load */
                const uint32_t wd[4] = {wv[s].x, wv[s].y, wv[s].z, wv[s].w};
                int t = 0;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    t = __dp4a((int)(wd[i] & 0x0F0F0F0Fu), xq.xe[i], t);
                    t = __dp4a((int)((wd[i] >> 4) & 0x0F0F0F0Fu), xq.xo[i], t);
                }
                v[j] = sv[s][0] * xq.d * ((float)t - zv[s] * (float)(xq.sq[0] + xq.sq[1]));
            } else {
                float d = 0.0f; /* as qdot: two chains a half, INT4's 1 + q / 16 folded below */
#pragma unroll
                for (int h = 0; h < HALVES; h++) {
                    float f[16], a = 0.0f, b = 0.0f;
                    raw16<FMT>(wv[s], h, f);
#pragma unroll
                    for (int i = 0; i < 16; i += 2) {
                        a = fmaf(f[i], xf[16 * h + i], a);
                        b = fmaf(f[i + 1], xf[16 * h + i + 1], b);
                    }
                    d += G16 ? sv[s][h] * (a + b) : a + b;
                }
                if (FMT == QF_INT4) d = 16.0f * d - (16.0f + zv[s]) * sx;
                v[j] = (G16 ? 1.0f : sv[s][0]) * unit * d;
            }
            if constexpr (S == 0) load(j, base + D + j); /* the stage is free: the item D ahead */
        }
        float r = turn_sum<D>(v, lane);
        float (*rp)[D] = red[(base / D) & 1];
        if ((lane & (32 / D - 1)) == 0) rp[warp][lane / (32 / D)] = r;
        __syncthreads();
        if (warp != 0) continue;
        int it = base + lane;
        bool mine = lane < D && it < items;
        int row = mine ? row_of(it) : 0;
        float t = 0.0f;
        for (int i = 0; lane < D && i < nwarps; i++) t += rp[i][lane];
        t = t * scale * (mine ? row_factor(q, row) : 1.0f) + (bias && mine ? bf2f(bias[row]) : 0.0f);
        if (mine) {
            out[row] = t;
            if (fx.resid) fx.resid[row] += t;
        }
        if (fx.act) { /* even lanes hold gate rows, the odd lane after each its up row */
            float u = __shfl_down_sync(0xffffffffu, t, 1);
            if (mine && !(it & 1)) fx.act[row] = glu_mul(t, u, fx.ga);
        }
    }
    if constexpr (S > 0) asm volatile("cp.async.wait_all;"); /* the ring's empty tail groups */
}

/* The arguments of atlas_qgemv1_<fmt>; grid: at most one wave of blocks and no more blocks
 * than rows (with act: row pairs, m even); block 32 ceil(k / 32E) threads, at most 512.
 * atlas_qgemv1s_<fmt> D = 8 stages, atlas_qgemv1s4_int4 4 (more blocks an SM, fewer bytes in
 * flight), atlas_qgemv1sx_int4 8 with x rounded to int8 a 32 columns (quantize_x8, dp4a),
 * atlas_qgemv1s16_fp4 8 with a scale a 16 columns (NVFP4); atlas_qgemv1sp_<fmt> and
 * atlas_qgemv1sp16_fp4 the same through a ring of QS_STAGES in shared memory: dynamic shared
 * memory QS_STAGES x blockDim x (16 + 4 x the floats a slot) bytes (cuda_backend.h
 * CUDA_QSTREAM_STAGES: the host's copy). */
enum { QS_STAGES = 16 };
#define ATLAS_QGEMV1S(NAME, FMT, D, X8, ...)                                                      \
    extern "C" __global__ void __launch_bounds__(512)                                             \
        NAME(float *out, const float *x, const uint8_t *w, const bf16_t *bias, int n, int m,       \
             int k, const float *scales, const float *zeros, const int32_t *g_idx, int rsh,        \
             int csh, int scols, int p1, int p2, const float *rowscale, const bf16_t *nw,          \
             float eps, float *h, float *resid, float *act, glu_act ga) {                          \
        qgemv1s_body<FMT, D, X8, ##__VA_ARGS__>(out, x, w, bias, m, k,                             \
                                 qargs{scales, zeros, g_idx, rsh, csh, scols, p1, p2, rowscale},   \
                                 qfuse{nw, eps, h, resid, act, ga});                               \
    }
ATLAS_QGEMV1S(atlas_qgemv1s_fp8, QF_FP8, 8, false)
ATLAS_QGEMV1S(atlas_qgemv1s_int4, QF_INT4, 8, false)
ATLAS_QGEMV1S(atlas_qgemv1s_fp4, QF_FP4, 8, false)
ATLAS_QGEMV1S(atlas_qgemv1s4_int4, QF_INT4, 4, false)
ATLAS_QGEMV1S(atlas_qgemv1sx_int4, QF_INT4, 8, true)
ATLAS_QGEMV1S(atlas_qgemv1s16_fp4, QF_FP4, 8, false, true)
ATLAS_QGEMV1S(atlas_qgemv1sp_fp8, QF_FP8, 8, false, false, QS_STAGES)
ATLAS_QGEMV1S(atlas_qgemv1sp_int4, QF_INT4, 8, false, false, QS_STAGES)
ATLAS_QGEMV1S(atlas_qgemv1sp_fp4, QF_FP4, 8, false, false, QS_STAGES)
ATLAS_QGEMV1S(atlas_qgemv1sp16_fp4, QF_FP4, 8, false, true, QS_STAGES)

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

/* w as bf16 [m, k]: a thread a 16-byte load of codes (grid-stride). A rowscale is left to
 * atlas_qrowscale after the matmul. */
template <int FMT, bool GIDX>
__device__ __forceinline__ void dequant_body(bf16_t *out, const uint8_t *w, int m, int k,
                                             qargs q) {
    constexpr int E = FMT == QF_FP8 ? 16 : 32;
    constexpr int HALVES = E / 16;
    pdl_wait(); /* the scratch may still be read by the previous matmul */
    const long long per_row = k / E, total = (long long)m * per_row;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        int row = (int)(i / per_row), c0 = (int)(i % per_row) * E;
        uint4 u = ld_stream16(w + (size_t)row * (FMT == QF_FP8 ? k : k / 2) +
                              (FMT == QF_FP8 ? c0 : c0 / 2));
        float f[E];
        if (GIDX) { /* a scale and zero a column */
            const int32_t *gi = q.g_idx + (size_t)((row >= q.p1) + (row >= q.p2)) * k + c0;
#pragma unroll
            for (int h = 0; h < HALVES; h++) codes16<FMT>(u, h, f + 16 * h);
#pragma unroll
            for (int j = 0; j < E; j++) {
                size_t si = (size_t)row * q.scols + __ldg(gi + j);
                f[j] = (f[j] - __ldg(q.zeros + si)) * __ldg(q.scales + si);
            }
        } else {
            qrow<FMT>(u, f, row, c0, k, q, true);
        }
        uint4 *dst = reinterpret_cast<uint4 *>(out + (size_t)row * k + c0);
#pragma unroll
        for (int j = 0; j < E / 8; j++)
            dst[j] = make_uint4(cvt_bf16x2(f[8 * j], f[8 * j + 1]),
                                cvt_bf16x2(f[8 * j + 2], f[8 * j + 3]),
                                cvt_bf16x2(f[8 * j + 4], f[8 * j + 5]),
                                cvt_bf16x2(f[8 * j + 6], f[8 * j + 7]));
    }
    pdl_trigger();
}

/* grid-stride; any grid, block 256. */
#define ATLAS_QDEQUANT(NAME, FMT, GIDX)                                                           \
    extern "C" __global__ void __launch_bounds__(256)                                             \
        NAME(bf16_t *out, const uint8_t *w, int m, int k, const float *scales,                     \
             const float *zeros, const int32_t *g_idx, int rsh, int csh, int scols, int p1,        \
             int p2) {                                                                             \
        dequant_body<FMT, GIDX>(out, w, m, k,                                                      \
                                qargs{scales, zeros, g_idx, rsh, csh, scols, p1, p2, nullptr});    \
    }
ATLAS_QDEQUANT(atlas_qdequant_fp8, QF_FP8, false)
ATLAS_QDEQUANT(atlas_qdequant_int4, QF_INT4, false)
ATLAS_QDEQUANT(atlas_qdequant_int4g, QF_INT4, true)
ATLAS_QDEQUANT(atlas_qdequant_fp4, QF_FP4, false)

/* out[j, r] = out[j, r] * rowscale[r] + bias[r] (bias may be NULL) over [n, m]: the rowscale
 * of a weight multiplied through its bf16 scratch copy. grid-stride, block 256. */
extern "C" __global__ void __launch_bounds__(256)
    atlas_qrowscale(float *out, const float *rowscale, const bf16_t *bias, int n, int m) {
    pdl_wait();
    long long total = (long long)n * m;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        int r = (int)(i % m);
        out[i] = out[i] * __ldg(rowscale + r) + (bias ? bf2f(bias[r]) : 0.0f);
    }
    pdl_trigger();
}

/* --- 2 to 64 rows on the tensor cores ----------------------------------------------------------
 * atlas_qmma<NG>_<fmt>: out[n, m] = x[n, k] @ w^T (+ bias), n <= 8 NG, as atlas_gemv_mma
 * (kernels/gemv.cu) does for bf16: a block owns 16 weight rows and its 4 warps share k; each
 * lane loads 16 bytes of codes of rows g and g + 8 (g = lane / 4) a chunk, dequantizes them in
 * registers into the A fragments of mma.sync m16n8k16, and multiplies them with x rows g,
 * g + 8, ... of the same columns (x split into hi + lo bf16, as there). The k order inside a
 * lane's columns is permuted the same way for w and x, so a chunk's k steps mix its CH
 * columns. When one scale covers a whole chunk (groups of CH columns or more: FP8 blocks of
 * 128, INT4 groups of 128, per channel), the codes go into the fragments unscaled (exact in
 * bf16: e4m3, e2m1, q - zero) and the chunk's fp32 partial sums are scaled, as block-scaled
 * GEMMs do, so the product is as exact as the fp32 GEMV's but for x's split; smaller groups
 * round code x scale to bf16 (exact for MXFP4's powers of two and NVFP4's e4m3 scales, whose
 * fp32 global factor is the rowscale). Every weight byte is read once whatever n is. */
enum { QM_WARPS = 4 };

/* (q - z) of nibbles j and j + 4 of v (columns j, j + 4 of its 8) as bf16x2 (j's low): 128 + q
 * is the nibble under bf16 128.0's exponent, z128 is 128 + z in both halves, and the
 * difference of such small integers is exact. */
__device__ __forceinline__ uint32_t int4_pair(uint32_t v, int j, uint32_t z128) {
    uint32_t c = ((v >> (4 * j)) & 0x000F000Fu) | 0x43004300u, d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(z128), "r"(0xBF80BF80u), "r"(c));
    return d;
}

/* The pairs of columns the tensor-core kernels put in one bf16x2, of a lane's E columns, for
 * k step s (four columns): FP8 (4s, 4s + 1) and (4s + 2, 4s + 3); the 4-bit formats the
 * nibbles int4_pair takes, (8w + j, 8w + j + 4) and (8w + j + 1, 8w + j + 5) with w = s / 2,
 * j = 2 (s % 2). first: the first pair's first column; the second pair starts one (4-bit)
 * or two (FP8) after it, each pair's second column one (FP8) or four after its first. */
template <int FMT> __device__ __forceinline__ int pair_first(int s) {
    return FMT == QF_FP8 ? 4 * s : 8 * (s >> 1) + 2 * (s & 1);
}
template <int FMT> __host__ __device__ constexpr int pair_next() { return FMT == QF_FP8 ? 2 : 1; }
template <int FMT> __host__ __device__ constexpr int pair_gap() { return FMT == QF_FP8 ? 1 : 4; }

/* x [n, k] split into bf16 hi + lo (split_bf16x2) once for every block of a tensor-core matmul
 * (each re-split its x: about 6 instructions a pair of values, a block of 16 weight rows,
 * bench/RESULTS.md): xs[t, c / 4 + s] for the E columns from c (a multiple of E) is
 * (hi, lo) of the first pair of k step s, then (hi, lo) of the second, in pair_first's
 * order. grid-stride over n k / 4 slots, block 256. */
template <int FMT>
__device__ __forceinline__ void qsplit_body(uint4 *xs, const float *x, int n, int k) {
    constexpr int E = FMT == QF_FP8 ? 16 : 32;
    pdl_wait(); /* x is the previous kernel's; xs may still be read by the previous matmul */
    const long long per_row = k / 4, total = (long long)n * per_row;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        int t = (int)(i / per_row), c4 = (int)(i % per_row) * 4;
        int c0 = c4 / E * E, st = (c4 - c0) / 4, f = c0 + pair_first<FMT>(st);
        const float *xr = x + (size_t)t * k;
        int f2 = f + pair_next<FMT>();
        uint32_t h0, l0, h1, l1;
        split_bf16x2(xr[f], xr[f + pair_gap<FMT>()], h0, l0);
        split_bf16x2(xr[f2], xr[f2 + pair_gap<FMT>()], h1, l1);
        xs[i] = make_uint4(h0, l0, h1, l1);
    }
    pdl_trigger();
}
#define ATLAS_QSPLIT(NAME, FMT)                                                                   \
    extern "C" __global__ void __launch_bounds__(256)                                             \
        NAME(uint4 *xs, const float *x, int n, int k) {                                            \
        qsplit_body<FMT>(xs, x, n, k);                                                             \
    }
ATLAS_QSPLIT(atlas_qsplit_fp8, QF_FP8)
ATLAS_QSPLIT(atlas_qsplit_q4, QF_INT4) /* INT4 and FP4: the same nibble order */

/* SPLIT: x comes split (atlas_qsplit_*, xs) and the A fragments pair columns as
 * pair_first says; INT4 with a scale a chunk takes its codes straight into bf16x2 pairs
 * (int4_pair) instead of floats one at a time. */
template <int FMT, int NG, bool SPLIT = false>
__device__ __forceinline__ void qmma_body(float *out, const float *x, const uint8_t *w,
                                          const bf16_t *bias, int n, int m, int k, qargs q,
                                          const uint4 *xs = nullptr) {
    constexpr int E = FMT == QF_FP8 ? 16 : 32;
    constexpr int CH = 4 * E; /* columns a warp takes a chunk */
    constexpr int CH_LOG2 = FMT == QF_FP8 ? 6 : 7;
    __shared__ float red[QM_WARPS][NG][4][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, qq = lane & 3;
    const int r0 = blockIdx.x * 16, rl = min(r0 + g, m - 1), rh = min(r0 + g + 8, m - 1);
    const size_t rbytes = FMT == QF_FP8 ? (size_t)k : (size_t)k / 2;
    const uint8_t *wl = w + (size_t)rl * rbytes, *wh = w + (size_t)rh * rbytes;
    const int nch = (k + CH - 1) / CH;
    const bool chunk_scaled = q.csh >= CH_LOG2; /* one scale a chunk and row (31: a row) */
    float c[NG][4];
#pragma unroll
    for (int j = 0; j < NG; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) c[j][i] = 0.0f;
    auto col_of = [&](int ch) { return ch * CH + qq * E; };
    auto load = [&](const uint8_t *wr, int ch) {
        int cb = col_of(ch);
        return ch < nch && cb < k ? ld_stream16(wr + (FMT == QF_FP8 ? cb : cb / 2))
                                  : make_uint4(0, 0, 0, 0);
    };
    uint4 cl = load(wl, warp), chh = load(wh, warp);
    pdl_trigger();
    pdl_wait();
    for (int ch = warp; ch < nch; ch += QM_WARPS) {
        uint4 nl = load(wl, ch + QM_WARPS), nh = load(wh, ch + QM_WARPS);
        /* mma.sync wants the whole warp: lanes past k multiply zeros of x */
        int cb = col_of(ch);
        bool in = cb < k;
        /* INT4's codes straight into pairs: a scale a chunk, the zero subtracted in bf16 */
        constexpr bool PAIRS = SPLIT && FMT == QF_INT4;
        const bool pairs = PAIRS && chunk_scaled;
        float fl[E], fh[E], t[NG][4];
        uint32_t zl = 0, zh = 0; /* 128 + the chunk's zero of rows g and g + 8, bf16x2 */
        if (pairs) {
            int cs = in ? cb : 0;
            float z0 = __ldg(q.zeros + (size_t)(rl >> q.rsh) * q.scols + (cs >> q.csh));
            float z1 = __ldg(q.zeros + (size_t)(rh >> q.rsh) * q.scols + (cs >> q.csh));
            zl = pack_bf16x2(128.0f + z0, 128.0f + z0);
            zh = pack_bf16x2(128.0f + z1, 128.0f + z1);
        } else {
            qrow<FMT>(cl, fl, rl, cb, k, q, !chunk_scaled);
            qrow<FMT>(chh, fh, rh, cb, k, q, !chunk_scaled);
        }
#pragma unroll
        for (int j = 0; j < NG; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) t[j][i] = 0.0f;
#pragma unroll
        for (int s = 0; s < E / 4; s++) {
            uint32_t a[4];
            if (!SPLIT) {
                a[0] = cvt_bf16x2(fl[4 * s], fl[4 * s + 1]);
                a[1] = cvt_bf16x2(fh[4 * s], fh[4 * s + 1]);
                a[2] = cvt_bf16x2(fl[4 * s + 2], fl[4 * s + 3]);
                a[3] = cvt_bf16x2(fh[4 * s + 2], fh[4 * s + 3]);
            } else if (pairs) {
                const uint32_t wl[4] = {cl.x, cl.y, cl.z, cl.w};
                const uint32_t wh[4] = {chh.x, chh.y, chh.z, chh.w};
                const int jj = 2 * (s & 1);
                a[0] = int4_pair(wl[s >> 1], jj, zl);
                a[1] = int4_pair(wh[s >> 1], jj, zh);
                a[2] = int4_pair(wl[s >> 1], jj + 1, zl);
                a[3] = int4_pair(wh[s >> 1], jj + 1, zh);
            } else {
                const int f = pair_first<FMT>(s), f2 = f + pair_next<FMT>(), d = pair_gap<FMT>();
                a[0] = cvt_bf16x2(fl[f], fl[f + d]);
                a[1] = cvt_bf16x2(fh[f], fh[f + d]);
                a[2] = cvt_bf16x2(fl[f2], fl[f2 + d]);
                a[3] = cvt_bf16x2(fh[f2], fh[f2 + d]);
            }
#pragma unroll
            for (int j = 0; j < NG; j++) {
                int xr = j * 8 + g;
                if (j * 8 >= n) break;
                uint32_t h0, l0, h1, l1;
                if (SPLIT) {
                    uint4 xv = xr < n && in ? __ldg(xs + (size_t)xr * (k / 4) + cb / 4 + s)
                                            : make_uint4(0, 0, 0, 0);
                    h0 = xv.x, l0 = xv.y, h1 = xv.z, l1 = xv.w;
                } else {
                    float4 xv = xr < n && in ? __ldg(reinterpret_cast<const float4 *>(
                                                   x + (size_t)xr * k + cb + 4 * s))
                                             : make_float4(0.f, 0.f, 0.f, 0.f);
                    split_bf16x2(xv.x, xv.y, h0, l0);
                    split_bf16x2(xv.z, xv.w, h1, l1);
                }
                mma_bf16_16816(t[j], a, h0, h1);
                mma_bf16_16816(t[j], a, l0, l1);
            }
        }
        float sl = 1.0f, sh = 1.0f; /* the chunk's scales of rows g and g + 8 */
        if (chunk_scaled) {
            int cs = in ? cb : 0;
            sl = __ldg(q.scales + (size_t)(rl >> q.rsh) * q.scols + (cs >> q.csh));
            sh = __ldg(q.scales + (size_t)(rh >> q.rsh) * q.scols + (cs >> q.csh));
        }
#pragma unroll
        for (int j = 0; j < NG; j++) {
            c[j][0] = fmaf(sl, t[j][0], c[j][0]);
            c[j][1] = fmaf(sl, t[j][1], c[j][1]);
            c[j][2] = fmaf(sh, t[j][2], c[j][2]);
            c[j][3] = fmaf(sh, t[j][3], c[j][3]);
        }
        cl = nl;
        chh = nh;
    }
    /* c[j][0..1]: row r0 + g, x rows 8j + 2qq, + 1; c[j][2..3]: row r0 + g + 8 */
#pragma unroll
    for (int j = 0; j < NG; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) red[warp][j][i][lane] = c[j][i];
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int j = 0; j < NG; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float v = red[0][j][i][lane] + red[1][j][i][lane] + red[2][j][i][lane] +
                      red[3][j][i][lane];
            int row = r0 + g + (i >= 2 ? 8 : 0), col = 8 * j + 2 * qq + (i & 1);
            if (row < m && col < n)
                out[(size_t)col * m + row] =
                    v * row_factor(q, row) + (bias ? bf2f(bias[row]) : 0.0f);
        }
}

/* grid ceil(m / 16), block 128; the arguments of atlas_qgemv (g_idx, p1, p2 unused). */
#define ATLAS_QMMA(NAME, FMT, NG)                                                                 \
    extern "C" __global__ void __launch_bounds__(QM_WARPS * 32)                                   \
        NAME(float *out, const float *x, const uint8_t *w, const bf16_t *bias, int n, int m,       \
             int k, const float *scales, const float *zeros, const int32_t *g_idx, int rsh,        \
             int csh, int scols, int p1, int p2, const float *rowscale) {                          \
        qmma_body<FMT, NG>(out, x, w, bias, n, m, k,                                               \
                           qargs{scales, zeros, g_idx, rsh, csh, scols, p1, p2, rowscale});        \
    }
/* atlas_qmmp<NG>_<fmt>: the same with x split beforehand (atlas_qsplit_*), xs last */
#define ATLAS_QMMP(NAME, FMT, NG)                                                                 \
    extern "C" __global__ void __launch_bounds__(QM_WARPS * 32)                                   \
        NAME(float *out, const float *x, const uint8_t *w, const bf16_t *bias, int n, int m,       \
             int k, const float *scales, const float *zeros, const int32_t *g_idx, int rsh,        \
             int csh, int scols, int p1, int p2, const float *rowscale, const uint4 *xs) {         \
        qmma_body<FMT, NG, true>(out, x, w, bias, n, m, k,                                         \
                                 qargs{scales, zeros, g_idx, rsh, csh, scols, p1, p2, rowscale},   \
                                 xs);                                                              \
    }
#define ATLAS_QMMA_ALL(FMTNAME, FMT)                                                              \
    ATLAS_QMMA(atlas_qmma1_##FMTNAME, FMT, 1)                                                      \
    ATLAS_QMMA(atlas_qmma2_##FMTNAME, FMT, 2)                                                      \
    ATLAS_QMMA(atlas_qmma4_##FMTNAME, FMT, 4)                                                      \
    ATLAS_QMMA(atlas_qmma8_##FMTNAME, FMT, 8)                                                      \
    ATLAS_QMMP(atlas_qmmp1_##FMTNAME, FMT, 1)                                                      \
    ATLAS_QMMP(atlas_qmmp2_##FMTNAME, FMT, 2)                                                      \
    ATLAS_QMMP(atlas_qmmp4_##FMTNAME, FMT, 4)                                                      \
    ATLAS_QMMP(atlas_qmmp8_##FMTNAME, FMT, 8)
ATLAS_QMMA_ALL(fp8, QF_FP8)
ATLAS_QMMA_ALL(int4, QF_INT4)
ATLAS_QMMA_ALL(fp4, QF_FP4)

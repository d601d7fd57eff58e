/* kernels/quant.cu — matmul of quantized weights (backend/backend.h, atlas_wformat):
 *   atlas_qgemv1_<fmt>    out[1, m] = x[1, k] @ w[m, k]^T (+ bias) (decode at batch 1): the
 *                         packed bytes read once with streaming loads and dequantized in
 *                         registers, in fp32 (weight-only: the activations are not rounded);
 *                         atlas_qgemv8_int4g the same for 2..8 rows with act-order
 *   atlas_qgemv1c_<fmt>   the same one row with several row groups a block (not act-order)
 *   atlas_qgemv1s_<fmt>   the same one row streamed: x held in registers, each row's codes and
 *                         scales loaded rows ahead through a ring of register stages, one wave
 *                         of blocks (cuda_qgemv1's CUDA_QGEMV_S, _S4, _SX)
 *   atlas_qmma<NG>_<fmt>  2..8 NG rows (serving steps) on the tensor cores, below;
 *                         atlas_qmmp<NG>_<fmt> on x split once, atlas_qmmq<NG>_int4 the same
 *                         for INT4 groups of 128 columns or more
 *   atlas_qdequant_<fmt>  w as bf16 [m, k] into a scratch buffer, for the bf16 matmuls of
 *                         larger batches (prefill: compute-bound, so the extra pass is small)
 *   atlas_qrowscale       out[j, r] = out[j, r] * rowscale[r] (+ bias[r]) after such a matmul
 *   atlas_fp8_actq        x as e4m3 with a float scale a row and 128 columns, for cuBLASLt's
 *                         FP8 matmul of FP8 weights in 128 x 128 blocks (plan.fp8_act)
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
 * folded into a sum of x a group; the streaming kernel places two nibbles with one shift,
 * the second at 1 + q / 256: nib_dot8), an e2m1 code placed in a half's exponent and mantissa is
 * its value times 2^-14 (subnormals included; the 2^14 folded into the scale), and e4m3 goes
 * through the two-at-a-time conversion of sm_89+.
 *
 * One module, its device code in three headers: quant.cuh (the codes, the scale grid, a
 * load's dot products: every kernel's), quant_stream.cuh (the streaming one-row body),
 * quant_mma.cuh (the tensor-core bodies and x's split); this file the one-row and
 * dequantizing bodies and every kernel's entry point. */
#include "quant.cuh"
#include "quant_mma.cuh"
#include "quant_stream.cuh"

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

/* --- one row streamed (quant_stream.cuh) -------------------------------------------------------
 * The arguments of atlas_qgemv1_<fmt>; grid: at most one wave of blocks and no more blocks
 * than rows (with act: row pairs, m even); block 32 ceil(k / 32E) threads, at most 512.
 * atlas_qgemv1s_<fmt> D = 8 stages, atlas_qgemv1s4_int4 4 (more blocks an SM, fewer bytes in
 * flight), atlas_qgemv1sx_int4 8 with x rounded to int8 a 32 columns (quantize_x8, dp4a),
 * atlas_qgemv1s16_fp4 8 with a scale a 16 columns (NVFP4). */
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

/* xq[r, c] = e4m3(x[r, c] / s) with s = max(amax, 1e-10) / 448 over the 128 columns of c's
 * group (vLLM's and DeepSeek's per-token-group quantization; transformers' FP8 linear does
 * the same), s into xs at [g, r] (row fastest: cuBLASLt's VEC128 layout). A warp a (row,
 * group), 4 columns a lane; k % 128 == 0; grid-stride, block 256. */
extern "C" __global__ void __launch_bounds__(256)
    atlas_fp8_actq(uint32_t *xq, float *xs, const float *x, int n, int k) {
    pdl_wait();
    const int lane = threadIdx.x & 31, groups = k / 128;
    const long long warps = (long long)n * groups;
    for (long long wi = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5; wi < warps;
         wi += ((long long)gridDim.x * blockDim.x) >> 5) {
        const int r = (int)(wi / groups), g = (int)(wi % groups);
        const size_t at = (size_t)r * k + (size_t)g * 128 + lane * 4;
        const float4 v = *(const float4 *)(x + at);
        float a = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
        const float s = fmaxf(a, 1e-10f) / 448.0f;
        const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v.x / s, v.y / s),
                                                     __NV_SATFINITE, __NV_E4M3);
        const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(v.z / s, v.w / s),
                                                     __NV_SATFINITE, __NV_E4M3);
        xq[at / 4] = lo | hi << 16;
        if (lane == 0) xs[(size_t)g * n + r] = s;
    }
    pdl_trigger();
}

/* --- 2 to 64 rows on the tensor cores (quant_mma.cuh) ------------------------------------------
 * x split once (atlas_qsplit_*): grid-stride over n k / 4 slots, block 256 */
#define ATLAS_QSPLIT(NAME, FMT)                                                                   \
    extern "C" __global__ void __launch_bounds__(256)                                             \
        NAME(uint4 *xs, const float *x, int n, int k) {                                            \
        qsplit_body<FMT>(xs, x, n, k);                                                             \
    }
ATLAS_QSPLIT(atlas_qsplit_fp8, QF_FP8)
ATLAS_QSPLIT(atlas_qsplit_q4, QF_INT4) /* INT4 and FP4: the same nibble order */


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
/* atlas_qmmq<NG>_int4: atlas_qmmp<NG>_int4 for groups of a chunk (128 columns) or more only */
#define ATLAS_QMMQ(NAME, NG)                                                                      \
    extern "C" __global__ void __launch_bounds__(QM_WARPS * 32)                                   \
        NAME(float *out, const float *x, const uint8_t *w, const bf16_t *bias, int n, int m,       \
             int k, const float *scales, const float *zeros, const int32_t *g_idx, int rsh,        \
             int csh, int scols, int p1, int p2, const float *rowscale, const uint4 *xs) {         \
        qmma_body<QF_INT4, NG, true, true>(out, x, w, bias, n, m, k,                               \
                                           qargs{scales, zeros, g_idx, rsh, csh, scols, p1, p2,    \
                                                 rowscale},                                        \
                                           xs);                                                    \
    }
ATLAS_QMMQ(atlas_qmmq1_int4, 1)
ATLAS_QMMQ(atlas_qmmq2_int4, 2)
ATLAS_QMMQ(atlas_qmmq4_int4, 4)
ATLAS_QMMQ(atlas_qmmq8_int4, 8)
/* atlas_qmmw<NG>x<RT>_int4: qmmq's path with RT tiles of 16 rows a block (qmmw_body), for up to
 * 16 rows of x (plan.qmma_wide) */
#define ATLAS_QMMW(NAME, NG, RT)                                                                  \
    extern "C" __global__ void __launch_bounds__(QM_WARPS * 32)                                   \
        NAME(float *out, const float *x, const uint8_t *w, const bf16_t *bias, int n, int m,       \
             int k, const float *scales, const float *zeros, const int32_t *g_idx, int rsh,        \
             int csh, int scols, int p1, int p2, const float *rowscale, const uint4 *xs) {         \
        (void)x;                                                                                   \
        qmmw_body<NG, RT>(out, w, bias, n, m, k,                                                   \
                          qargs{scales, zeros, g_idx, rsh, csh, scols, p1, p2, rowscale}, xs);     \
    }
ATLAS_QMMW(atlas_qmmw1x2_int4, 1, 2)
ATLAS_QMMW(atlas_qmmw2x2_int4, 2, 2)
ATLAS_QMMW(atlas_qmmw1x4_int4, 1, 4)
ATLAS_QMMW(atlas_qmmw2x4_int4, 2, 4)
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

/* --- INT4 as GPTQ and AWQ store it, repacked on the device at load --------------------------
 * A load uploads a part's codes and grids as stored (backend.h atlas_int4_order) into the
 * regions they end in, copies each region to a scratch buffer and repacks it back, so that
 * the host only moves bytes. The same layout as model/quant.c's host repack, byte for byte. */

/* GPTQ: src [k8][rows] words (input 8i + t in nibble t) -> dst [rows][k8] words: a transpose
 * of 32-bit words (atlas's byte j of a row holds columns 2j and 2j + 1, as GPTQ's word does).
 * Tiles of 32 x 32; grid (ceil(rows / 32), ceil(k8 / 32)), block 256. */
extern "C" __global__ void __launch_bounds__(256)
    atlas_int4_repack_gptq(uint32_t *dst, const uint32_t *src, int k8, int rows) {
    __shared__ uint32_t t[32][33];
    pdl_wait();
    const int x = threadIdx.x & 31, y = threadIdx.x >> 5;
    const int r0 = blockIdx.x * 32, j0 = blockIdx.y * 32;
    for (int i = y; i < 32; i += 8)
        if (j0 + i < k8 && r0 + x < rows) t[i][x] = src[(size_t)(j0 + i) * rows + r0 + x];
    __syncthreads();
    for (int i = y; i < 32; i += 8)
        if (r0 + i < rows && j0 + x < k8) dst[(size_t)(r0 + i) * k8 + j0 + x] = t[x][i];
    pdl_trigger();
}

__constant__ int awq_nibble[8] = {0, 4, 1, 5, 2, 6, 3, 7}; /* row 8j + k in nibble [k] */

/* AWQ: src [cols][rows / 8] words -> dst [rows][cols / 8] words, dst word (r, q) holding
 * columns 8q .. 8q + 7 of row r, column 8q + t in nibble t. A block: 64 columns (8 dst words
 * a row) x 32 src words (256 rows); grid (ceil(rows / 256), ceil(cols / 64)), block 256. */
extern "C" __global__ void __launch_bounds__(256)
    atlas_int4_repack_awq(uint32_t *dst, const uint32_t *src, int cols, int rows) {
    __shared__ uint32_t t[64][33];
    pdl_wait();
    const int w8 = rows / 8, q8 = cols / 8, tid = threadIdx.x;
    const int u0 = blockIdx.x * 32, c0 = blockIdx.y * 64;
    for (int i = tid; i < 64 * 32; i += 256) {
        int c = i / 32, u = i % 32;
        if (c0 + c < cols && u0 + u < w8) t[c][u] = src[(size_t)(c0 + c) * w8 + u0 + u];
    }
    __syncthreads();
    for (int i = tid; i < 256 * 8; i += 256) {
        int rr = i / 8, qq = i % 8, u = rr / 8, sh = 4 * awq_nibble[rr % 8];
        if (u0 + u >= w8 || c0 / 8 + qq >= q8) continue;
        uint32_t v = 0;
#pragma unroll
        for (int k = 0; k < 8; k++) v |= ((t[8 * qq + k][u] >> sh) & 0xfu) << (4 * k);
        dst[(size_t)(8 * u0 + rr) * q8 + c0 / 8 + qq] = v;
    }
    pdl_trigger();
}

/* The grids: scales s [groups][rows] (sdt 0 f32, 1 f16, 2 bf16) and zeros z [groups][rows / 8]
 * words (row 8j + k in nibble k, or awq_nibble[k] when awq) -> float32 [rows][groups] each, a
 * zero plus zero_add. Grid-stride, block 256. */
extern "C" __global__ void __launch_bounds__(256)
    atlas_int4_repack_grids(float *scales, float *zeros, const void *s, const uint32_t *z,
                            int groups, int rows, int sdt, int awq, float zero_add) {
    pdl_wait();
    const long long n = (long long)rows * groups;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const int r = (int)(i / groups), g = (int)(i % groups);
        const size_t si = (size_t)g * rows + r;
        const uint16_t h = sdt ? ((const uint16_t *)s)[si] : 0;
        scales[i] = sdt == 0   ? ((const float *)s)[si]
                    : sdt == 1 ? __half2float(__ushort_as_half(h))
                               : bf2f(h);
        const int nib = awq ? awq_nibble[r & 7] : (r & 7);
        zeros[i] = (float)((z[(size_t)g * (rows / 8) + r / 8] >> (4 * nib)) & 0xfu) + zero_add;
    }
    pdl_trigger();
}

/* kernels/quant_stream.cuh — the body of the streaming one-row GEMVs (atlas_qgemv1s*:
 * kernels/quant.cu instantiates them). */
#ifndef ATLAS_KERNELS_QUANT_STREAM_CUH
#define ATLAS_KERNELS_QUANT_STREAM_CUH

#include "quant.cuh"

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

template <int FMT, int D, bool X8, bool G16 = false>
__device__ __forceinline__ void qgemv1s_body(float *out, const float *x, const uint8_t *w,
                                             const bf16_t *bias, int m, int k, qargs q,
                                             qfuse fx) {
    constexpr int E = FMT == QF_FP8 ? 16 : 32, HALVES = E / 16;
    static_assert(D >= 2 && D <= 32 && (D & (D - 1)) == 0, "D: an even power of two");
    static_assert(!X8 || FMT == QF_INT4, "int8 x: INT4 only");
    static_assert(!G16 || FMT == QF_FP4, "a scale a half: FP4 only");
    constexpr int SL = G16 ? 2 : 1; /* scales a load */
    __shared__ float red[2][32][D]; /* a turn's row sums by warp, by the turn's parity */
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
    uint4 wv[D];
    float sv[D][SL], zv[D];
    auto load = [&](int s, int it) { /* stage s (unrolled: registers) <- item it */
        bool ok = on && it < items; /* predicated loads: no branch a stage */
        int row = row_of(ok ? it : 0);
        size_t si = (size_t)(row >> q.rsh) * q.scols + cg;
        wv[s] = ld_stream16_if(wc + (size_t)row * rbytes, ok);
        sv[s][0] = ldg_if(q.scales + si, ok);
        if constexpr (G16) sv[s][SL - 1] = ldg_if(q.scales + si - cg + cg1, ok);
        zv[s] = FMT == QF_INT4 ? ldg_if(q.zeros + si, ok) : 0.0f;
    };
#pragma unroll
    for (int s = 0; s < D; s++) load(s, s); /* the weights: not the previous kernel's */
    pdl_trigger();
    pdl_wait();
    float xf[E], ss = 0.0f, sx = 0.0f, sxe = 0.0f, sxo = 0.0f;
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
        sxe += a;
        sxo += b;
    }
    const float lohi = 256.0f * sxe + 16.0f * sxo; /* what nib_dot8's 1s add, scaled as below */
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
        for (int s = 0; s < D; s++) {
            if constexpr (X8) { /* as qdot_x8 with one scale a load */
                const uint32_t wd[4] = {wv[s].x, wv[s].y, wv[s].z, wv[s].w};
                int t = 0;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    t = __dp4a((int)(wd[i] & 0x0F0F0F0Fu), xq.xe[i], t);
                    t = __dp4a((int)((wd[i] >> 4) & 0x0F0F0F0Fu), xq.xo[i], t);
                }
                v[s] = sv[s][0] * xq.d * ((float)t - zv[s] * (float)(xq.sq[0] + xq.sq[1]));
            } else if constexpr (FMT == QF_INT4) { /* s (Σ q x - z Σ x) through nib_dot8 */
                const uint32_t wd[4] = {wv[s].x, wv[s].y, wv[s].z, wv[s].w};
                float lo = 0.0f, hi = 0.0f;
#pragma unroll
                for (int i = 0; i < 4; i++) nib_dot8(wd[i], xf + 8 * i, lo, hi);
                v[s] = sv[s][0] * (fmaf(256.0f, lo, 16.0f * hi) - lohi - zv[s] * sx);
            } else {
                float d = 0.0f; /* as qdot: two chains a half */
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
                v[s] = (G16 ? 1.0f : sv[s][0]) * unit * d;
            }
            load(s, base + D + s); /* the stage is free: the item D ahead */
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
}

#endif

/* kernels/quant_stream.cuh — the body of the streaming one-row GEMVs (atlas_qgemv1s*,
 * atlas_qgemv1sp*: kernels/quant.cu instantiates them). */
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

#endif

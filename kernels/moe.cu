/* kernels/moe.cu — mixture-of-experts layers (src/backend/cuda/ops_moe.c; the op contract is
 * src/backend/backend.h's moe_route and moe_experts).
 *
 * Routing: atlas_moe_logits (h @ router^T (+ bias): fp32 inputs, bf16 weights, fp32 products
 * and sums, a warp an expert) then atlas_moe_topk (a block a token: softmax over all E, the k
 * largest in decreasing order, an equal probability keeping the lower index, renormalised on
 * request; or gpt-oss's order, the k largest logits then their softmax), as
 * src/backend/cpu/cpu_moe.c computes them.
 *
 * The experts' biases (gpt-oss; NULL: none) are added to each expert's products before the
 * gate activation (gate_up's) and before the routing weight (down's), and the activation is
 * glu_mul's (common.cuh) of the model's kind.
 *
 * MXFP4 experts (gpt-oss as published; the _fp4 instances of the expert kernels): the codes
 * stay packed as the dense FP4 path keeps them (kernels/quant.cu: e2m1 nibbles, column 2j in
 * the low nibble of byte j, [rows, cols / 2] bytes a stacked weight) with a float32 scale a
 * row's 32 columns ([rows, cols / 32]); the GEMVs dequantize 32 columns a lane-load in
 * registers, the grouped kernels dequantize their weight tiles into bf16 in shared memory
 * (exact: an e2m1 value times a power of two). Every expert kernel takes the scales (sc;
 * NULL and unused for bf16 weights).
 *
 * Experts, few rows (decode): each (token, choice) slot reads only its expert's rows:
 * atlas_moe_gu_slots (a warp the gate row i and the up row i of the slot's expert, SwiGLU in
 * the epilogue, fp32 out), atlas_moe_down_slots (a warp an output row, the token's k choices
 * summed in increasing expert index, each times its routing weight).
 *
 * Experts, many rows (prefill, large decode batches): the slots are grouped by expert on the
 * device, so no host sync breaks a captured graph: atlas_moe_plan (counts, prefix sums, each
 * slot's row in the permuted order and a table of 64-row tiles, one expert a tile), then one
 * grouped GEMM for every expert's gate|up (atlas_moe_gu_grouped: mma.sync, the A rows
 * gathered from h by the permutation, SwiGLU in the epilogue, bf16 out), one for down
 * (atlas_moe_down_grouped, fp32 out), and atlas_moe_combine (each token's rows times their
 * weights, summed in increasing expert index). The grids are sized for the most tiles n * k
 * slots can make; blocks past the table's count return at once. */
#include "mma.cuh"

enum { MOE_MAX_E = 1024, MOE_MAX_K = 64 };

/* The dot product of 8 bf16 weights (one 16-byte load) with 8 inputs (a, b). */
__device__ __forceinline__ float moe_dot8(uint4 wv, float4 a, float4 b) {
    float f[8];
    unpack8(wv, f);
    return f[0] * a.x + f[1] * a.y + f[2] * a.z + f[3] * a.w + f[4] * b.x + f[5] * b.y +
           f[6] * b.z + f[7] * b.w;
}

/* A 16-byte weight load: streamed past L1 (read once a step), or through it (the router's
 * rows, read again for each token of a block). */
template <bool STREAM> __device__ __forceinline__ uint4 moe_ld16(const bf16_t *p) {
    return STREAM ? ld_stream16(p) : __ldg((const uint4 *)p);
}

/* A warp's dot products of x[0, len) with weight rows w0 and w1 (w1 NULL: one row), 8
 * elements a lane a step, U steps of loads issued before any is used. len % 8 == 0. */
template <int U, bool STREAM = true>
__device__ __forceinline__ void warp_dot2(const bf16_t *w0, const bf16_t *w1, const float *x,
                                          int len, float &s0, float &s1) {
    int lane = threadIdx.x & 31;
    s0 = s1 = 0.0f;
    for (int base = lane * 8; base < len; base += 256 * U) {
        uint4 a[U], b[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int kk = base + u * 256;
            a[u] = kk < len ? moe_ld16<STREAM>(w0 + kk) : make_uint4(0, 0, 0, 0);
            b[u] = kk < len && w1 ? moe_ld16<STREAM>(w1 + kk) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int kk = base + u * 256;
            if (kk < len) {
                float4 xa = __ldg((const float4 *)(x + kk)), xb = __ldg((const float4 *)(x + kk + 4));
                s0 += moe_dot8(a[u], xa, xb);
                s1 += moe_dot8(b[u], xa, xb);
            }
        }
    }
    s0 = warp_sum(s0);
    s1 = warp_sum(s1);
}

/* The e2m1 code in the low 4 bits of c as a float (sign, 2 exponent bits, 1 mantissa bit:
 * 0, 0.5, 1, 1.5, 2, 3, 4, 6), built from its bits without a table or a subnormal. */
__device__ __forceinline__ float e2m1(uint32_t c) {
    uint32_t m = c & 7u, b = m == 0 ? 0u : m == 1 ? 0x3f000000u : (m << 22) + (126u << 23);
    return __uint_as_float(b | ((c & 8u) << 28));
}

/* The dot product of 32 e2m1 codes (one 16-byte load) with x[0, 32), times their scale. */
__device__ __forceinline__ float moe_dot32q(uint4 wv, float scale, const float *x) {
    const uint32_t w[4] = {wv.x, wv.y, wv.z, wv.w};
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float4 a = __ldg((const float4 *)(x + 8 * i)), b = __ldg((const float4 *)(x + 8 * i + 4));
        acc += e2m1(w[i]) * a.x + e2m1(w[i] >> 4) * a.y + e2m1(w[i] >> 8) * a.z +
               e2m1(w[i] >> 12) * a.w + e2m1(w[i] >> 16) * b.x + e2m1(w[i] >> 20) * b.y +
               e2m1(w[i] >> 24) * b.z + e2m1(w[i] >> 28) * b.w;
    }
    return acc * scale;
}

/* warp_dot2 of MXFP4 rows: rows r0 and r1 (r1 < 0: one row) of codes w [.., len / 2] bytes
 * with scales sc [.., len / 32], 32 columns a lane a step. len % 32 == 0. */
template <int U>
__device__ __forceinline__ void warp_dot2q(const uint8_t *w, const float *sc, long long r0,
                                           long long r1, const float *x, int len, float &s0,
                                           float &s1) {
    int lane = threadIdx.x & 31;
    long long r1s = r1 >= 0 ? r1 : r0; /* (a row's pointers; r1 < 0 reads nothing) */
    const uint8_t *w0 = w + r0 * (len / 2), *w1 = w + r1s * (len / 2);
    const float *c0 = sc + r0 * (len / 32), *c1 = sc + r1s * (len / 32);
    s0 = s1 = 0.0f;
    for (int base = lane * 32; base < len; base += 1024 * U) {
        uint4 a[U], b[U];
        float sa[U], sb[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int kk = base + u * 1024;
            bool ok = kk < len, two = ok && r1 >= 0;
            a[u] = ok ? ld_stream16(w0 + kk / 2) : make_uint4(0, 0, 0, 0);
            sa[u] = ok ? __ldg(c0 + kk / 32) : 0.0f;
            b[u] = two ? ld_stream16(w1 + kk / 2) : make_uint4(0, 0, 0, 0);
            sb[u] = two ? __ldg(c1 + kk / 32) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int kk = base + u * 1024;
            if (kk < len) {
                s0 += moe_dot32q(a[u], sa[u], x + kk);
                if (r1 >= 0) s1 += moe_dot32q(b[u], sb[u], x + kk);
            }
        }
    }
    s0 = warp_sum(s0);
    s1 = warp_sum(s1);
}

/* Rows r0 and r1 (r1 < 0: one) of an expert weight, bf16 [.., len] or (Q) MXFP4, against x. */
template <bool Q>
__device__ __forceinline__ void row_dot2(const void *w, const float *sc, long long r0,
                                         long long r1, const float *x, int len, float &s0,
                                         float &s1) {
    if (Q) {
        warp_dot2q<2>((const uint8_t *)w, sc, r0, r1, x, len, s0, s1);
    } else {
        const bf16_t *b = (const bf16_t *)w;
        warp_dot2<4>(b + r0 * len, r1 >= 0 ? b + r1 * len : NULL, x, len, s0, s1);
    }
}

/* --- routing ------------------------------------------------------------------------------ */

enum { RL_WARPS = 4, RL_TOK = 16 };

/* logits[n, E] = h[n, d] @ router[E, d]^T (+ bias[E], NULL: none). grid (ceil(E / 4),
 * ceil(n / 16)), block 128: a warp an expert over 16 tokens (its router row stays in L1;
 * small blocks spread a decode step's router over more SMs). d % 8 == 0. */
extern "C" __global__ void __launch_bounds__(RL_WARPS * 32)
atlas_moe_logits(float *logits, const float *h, const bf16_t *router, const bf16_t *bias, int n,
                 int E, int d) {
    pdl_trigger();
    pdl_wait();
    int e = blockIdx.x * RL_WARPS + (threadIdx.x >> 5);
    int t0 = blockIdx.y * RL_TOK, t1 = min(t0 + RL_TOK, n);
    if (e >= E) return;
    const bf16_t *w = router + (size_t)e * d;
    float b = bias ? bf2f(bias[e]) : 0.0f;
    for (int t = t0; t < t1; t++) {
        float s, unused;
        warp_dot2<4, false>(w, NULL, h + (size_t)t * d, d, s, unused);
        if ((threadIdx.x & 31) == 0) logits[(size_t)t * E + e] = s + b;
    }
}

/* ids[n, k], wts[n, k] from logits[n, E] as atlas_moe_route_kind (backend.h) `order` says:
 * 0: p = softmax over all E (expf, the sum divided as the CPU divides it), the k largest p in
 * decreasing order, an equal p keeping the lower index, divided by their sum when norm;
 * 1: the k largest logits picked the same way, then their softmax over the k as the weights.
 * grid n, block 128. E <= 1024, k <= 64, k <= E. */
extern "C" __global__ void __launch_bounds__(128)
atlas_moe_topk(int *ids, float *wts, const float *logits, int E, int k, int norm, int order) {
    __shared__ float p[MOE_MAX_E];
    __shared__ float red[4];
    __shared__ float cw[MOE_MAX_K];
    __shared__ int ci[MOE_MAX_K];
    pdl_trigger();
    pdl_wait();
    int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float *l = logits + (size_t)t * E;
    float mx = -INFINITY;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        float v = l[e];
        p[e] = v;
        mx = fmaxf(mx, v);
    }
    mx = warp_max(mx);
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    mx = fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
    if (order == 0) { /* (block-uniform) */
        float s = 0.0f;
        for (int e = threadIdx.x; e < E; e += blockDim.x) s += (p[e] = expf(p[e] - mx));
        s = block_sum(s);
        for (int e = threadIdx.x; e < E; e += blockDim.x) p[e] = p[e] / s;
    }
    __syncthreads();
    if (warp != 0) return;
    float sum = 0.0f;
    for (int j = 0; j < k; j++) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int e = lane; e < E; e += 32) /* increasing e: only a larger value displaces */
            if (p[e] > bv) bv = p[e], bi = e;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        }
        if (lane == 0) {
            cw[j] = bv;
            ci[j] = bi;
            p[bi] = -INFINITY; /* taken: below every probability and logit */
        }
        __syncwarp();
        sum += bv;
    }
    if (order == 1) { /* the softmax of the k logits, summed in choice order as the CPU */
        sum = 0.0f;
        for (int j = 0; j < k; j++) sum += expf(cw[j] - cw[0]);
    }
    for (int j = lane; j < k; j += 32) {
        ids[(size_t)t * k + j] = ci[j];
        wts[(size_t)t * k + j] = order == 1 ? expf(cw[j] - cw[0]) / sum
                                 : norm     ? cw[j] / sum
                                            : cw[j];
    }
}

/* --- experts, one slot at a time (decode) ------------------------------------------------ */

/* The order of the token's k choices by increasing expert index (ties: choice order), into
 * order[k]; by the first k threads, then a barrier. */
__device__ __forceinline__ void moe_order(int *order, const int *id, int k) {
    if ((int)threadIdx.x < k) {
        int j = threadIdx.x, e = id[j], r = 0;
        for (int i = 0; i < k; i++) r += id[i] < e || (id[i] == e && i < j);
        order[r] = j;
    }
    __syncthreads();
}

/* act[s, f] = glu(gate_e . h[s / k] + gb, up_e . h[s / k] + ub), e = ids[s], for the n * k
 * slots (gb, ub: the expert's gate_up bias, gub[E * 2f], or 0). grid (ceil(f / 8), n * k),
 * block 256: a warp the gate row i and up row i of the slot's expert (rows e * 2f + i and
 * e * 2f + f + i of gu). */
template <bool Q>
__device__ __forceinline__ void gu_slots(float *act, const float *h, const void *gu,
                                         const float *sc, const bf16_t *gub, const int *ids,
                                         int k, int d, int f, int E, glu_act ga) {
    pdl_trigger();
    pdl_wait(); /* the expert ids come from the routing kernel */
    int s = blockIdx.y, i = blockIdx.x * 8 + (threadIdx.x >> 5), e = ids[s];
    if (i >= f) return;
    float g = 0.0f, u = 0.0f;
    if (e >= 0 && e < E) {
        long long r = (long long)e * 2 * f + i;
        row_dot2<Q>(gu, sc, r, r + f, h + (size_t)(s / k) * d, d, g, u);
        if (gub) {
            g += bf2f(gub[(size_t)e * 2 * f + i]);
            u += bf2f(gub[(size_t)e * 2 * f + f + i]);
        }
    }
    if ((threadIdx.x & 31) == 0) act[(size_t)s * f + i] = glu_mul(g, u, ga);
}

/* out[t, r] = sum over the token's choices j, in increasing expert index, of
 * wts[t, j] * (down_e[r] . act[t * k + j] + db[e * d + r]) (db NULL: no bias). grid
 * (ceil(d / 8), n), block 256: a warp a row. */
template <bool Q>
__device__ __forceinline__ void down_slots(float *out, const float *act, const void *down,
                                           const float *sc, const bf16_t *db, const int *ids,
                                           const float *wts, int k, int d, int f, int E) {
    __shared__ int order[MOE_MAX_K];
    pdl_trigger();
    pdl_wait();
    int t = blockIdx.y, r = blockIdx.x * 8 + (threadIdx.x >> 5);
    const int *id = ids + (size_t)t * k;
    moe_order(order, id, k);
    if (r >= d) return;
    float acc = 0.0f, s, unused;
    for (int q = 0; q < k; q++) {
        int j = order[q], e = id[j];
        if (e < 0 || e >= E) continue;
        row_dot2<Q>(down, sc, (long long)e * d + r, -1, act + ((size_t)t * k + j) * f, f, s,
                    unused);
        if (db) s += bf2f(db[(size_t)e * d + r]);
        acc += s * wts[(size_t)t * k + j];
    }
    if ((threadIdx.x & 31) == 0) out[(size_t)t * d + r] = acc;
}

/* The slot kernels, bf16 and MXFP4 (sc: the scales; unused by the bf16 ones). */
#define ATLAS_MOE_SLOTS(SFX, Q)                                                                   \
    extern "C" __global__ void __launch_bounds__(256) atlas_moe_gu_slots##SFX(                   \
        float *act, const float *h, const void *gu, const float *sc, const bf16_t *gub,         \
        const int *ids, int k, int d, int f, int E, glu_act ga) {                               \
        gu_slots<Q>(act, h, gu, sc, gub, ids, k, d, f, E, ga);                                 \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(256) atlas_moe_down_slots##SFX(                 \
        float *out, const float *act, const void *down, const float *sc, const bf16_t *db,      \
        const int *ids, const float *wts, int k, int d, int f, int E) {                         \
        down_slots<Q>(out, act, down, sc, db, ids, wts, k, d, f, E);                           \
    }
ATLAS_MOE_SLOTS(, false)
ATLAS_MOE_SLOTS(_fp4, true)

/* --- experts grouped by expert (prefill) --------------------------------------------------- */

/* The slots s = t * k + j (`slots` of them) grouped by expert: pos[s] is the slot's row in
 * the permuted order (-1: an id out of range), rows[p] the slot of row p; and the tiles of
 * at most bm rows of one expert: tiles[0] their count, tile i at tiles[1 + 3i] as (expert,
 * first row, the expert's end row). One block of 1024 threads; E <= 1024. Rows within an
 * expert's group come in any order: each row's products do not depend on its neighbours. */
extern "C" __global__ void __launch_bounds__(1024)
atlas_moe_plan(int *pos, int *rows, int *tiles, const int *ids, int slots, int E, int bm) {
    __shared__ int cnt[MOE_MAX_E], rsum[MOE_MAX_E], tsum[MOE_MAX_E];
    pdl_trigger();
    pdl_wait();
    int tid = threadIdx.x;
    cnt[tid] = 0;
    __syncthreads();
    for (int s = tid; s < slots; s += 1024) {
        int e = ids[s];
        if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    int c = cnt[tid], tc = (c + bm - 1) / bm;
    rsum[tid] = c;
    tsum[tid] = tc;
    __syncthreads();
    for (int off = 1; off < 1024; off <<= 1) { /* inclusive scans (Hillis-Steele) */
        int a = tid >= off ? rsum[tid - off] : 0, b = tid >= off ? tsum[tid - off] : 0;
        __syncthreads();
        rsum[tid] += a;
        tsum[tid] += b;
        __syncthreads();
    }
    int r0 = rsum[tid] - c, t0 = tsum[tid] - tc;
    if (tid == 1023) tiles[0] = tsum[1023];
    for (int i = 0; i < tc; i++) {
        int *ti = tiles + 1 + 3 * (t0 + i);
        ti[0] = tid;
        ti[1] = r0 + i * bm;
        ti[2] = r0 + c;
    }
    cnt[tid] = r0; /* now the next free row of each group */
    __syncthreads();
    for (int s = tid; s < slots; s += 1024) {
        int e = ids[s], p = e >= 0 && e < E ? atomicAdd(&cnt[e], 1) : -1;
        pos[s] = p;
        if (p >= 0) rows[p] = s;
    }
}

/* Grouped GEMM tiles: 64 permuted rows x 128 weight rows x 32 columns, 8 warps of 32 x 32;
 * rows padded to 40 bf16 so that ldmatrix reads are free of bank conflicts (as gemm.cu). */
enum { GM = 64, GN = 128, GK = 32, GLDS = GK + 8, G_THREADS = 256 };

/* acc += the A tile (64 rows) x the B tile (128 rows) over GK columns; warp (wm, wn) owns
 * rows wm * 32 .. + 32 and columns wn * 32 .. + 32 of the output tile. */
__device__ __forceinline__ void moe_mma_tile(float (&acc)[2][4][4], const bf16_t *as,
                                             const bf16_t *bs, int wm, int wn) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int ks = 0; ks < GK; ks += 16) {
        uint32_t a[2][4], b[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
            ldmatrix_x4(a[mt], as + (wm * 32 + mt * 16 + (lane & 15)) * GLDS + ks + (lane >> 4) * 8);
#pragma unroll
        for (int p = 0; p < 2; p++)
            ldmatrix_x4(b[p], bs + (wn * 32 + p * 16 + (lane & 7) + (lane >> 4) * 8) * GLDS + ks +
                                  ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
                mma_bf16_16816(acc[mt][nt], a[mt], b[nt >> 1][(nt & 1) * 2],
                               b[nt >> 1][(nt & 1) * 2 + 1]);
    }
}

/* The tile of blockIdx.y in the plan's table: false when past its count. */
__device__ __forceinline__ bool moe_tile(const int *tiles, int &e, int &r0, int &r1) {
    if ((int)blockIdx.y >= tiles[0]) return false;
    const int *ti = tiles + 1 + 3 * blockIdx.y;
    e = ti[0];
    r0 = ti[1];
    r1 = min(ti[2], r0 + GM);
    return true;
}

/* The gate_up B tile: tile row r (warp column block wn = r / 32, c = r % 32) is the gate row
 * i = f0 + wn * 16 + c % 16 of expert e when c < 16, else its up row (f + i), so that each
 * warp's accumulators hold a gate column and its up column in the same thread (n-tiles nt
 * and nt + 2). Rows past f read zeros. */
__device__ __forceinline__ void gu_load_b(bf16_t *bs, const bf16_t *w, int f, int d, int f0,
                                          int k0) {
#pragma unroll
    for (int it = 0; it < 2; it++) {
        int idx = threadIdx.x + it * G_THREADS, r = idx >> 2, c = (idx & 3) * 8;
        int i = f0 + (r >> 5) * 16 + (r & 15), row = (r & 16) ? f + i : i;
        bool ok = i < f && k0 + c < d;
        cp_async16(bs + r * GLDS + c, ok ? w + (size_t)row * d + k0 + c : w, ok ? 16 : 0);
    }
}

/* The gate_up A tile: permuted rows r0 .. r0 + 63 (the token of each in tok[], -1 past the
 * group) of h, fp32 -> bf16 through registers. */
__device__ __forceinline__ void gu_load_a(float4 (&ra)[2], const float *h, const int *tok, int d,
                                          int k0) {
#pragma unroll
    for (int it = 0; it < 2; it++) {
        int idx = threadIdx.x + it * G_THREADS, r = idx >> 3, c = k0 + (idx & 7) * 4;
        ra[it] = tok[r] >= 0 && c < d ? *(const float4 *)(h + (size_t)tok[r] * d + c)
                                      : make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

__device__ __forceinline__ void gu_store_a(bf16_t *as, const float4 (&ra)[2]) {
#pragma unroll
    for (int it = 0; it < 2; it++) {
        int idx = threadIdx.x + it * G_THREADS, r = idx >> 3, c = (idx & 7) * 4;
        *(uint2 *)(as + r * GLDS + c) =
            make_uint2(pack_bf16x2(ra[it].x, ra[it].y), pack_bf16x2(ra[it].z, ra[it].w));
    }
}

/* An MXFP4 B tile through registers: thread t holds tile row t / 2's 16 codes from column
 * (t % 2) * 16 (8 bytes) and the scale of their 32, for the weight row `row` of an expert's
 * codes w [.., len / 2] and scales sc [.., len / 32] (ok false: zeros). len % 32 == 0 and k0
 * a multiple of GK = 32, so a load never crosses a row or a scale group. */
struct qtile {
    uint2 c;
    float s;
};

__device__ __forceinline__ void q_load(qtile &t, const uint8_t *w, const float *sc,
                                       long long row, bool ok, int len, int k0) {
    int c = k0 + (threadIdx.x & 1) * 16;
    t.c = ok ? __ldg((const uint2 *)(w + row * (len / 2) + c / 2)) : make_uint2(0, 0);
    t.s = ok ? __ldg(sc + row * (len / 32) + k0 / 32) : 0.0f;
}

/* The tile's codes times their scale into bf16 (exact: an e2m1 value times a power of two). */
__device__ __forceinline__ void q_store(bf16_t *bs, const qtile &t) {
    int r = threadIdx.x >> 1, c = (threadIdx.x & 1) * 16;
    const uint32_t v[2] = {t.c.x, t.c.y};
    uint32_t o[8];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            o[4 * i + j] =
                pack_bf16x2(e2m1(v[i] >> (8 * j)) * t.s, e2m1(v[i] >> (8 * j + 4)) * t.s);
    *(uint4 *)(bs + r * GLDS + c) = make_uint4(o[0], o[1], o[2], o[3]);
    *(uint4 *)(bs + r * GLDS + c + 8) = make_uint4(o[4], o[5], o[6], o[7]);
}

__device__ __forceinline__ void acc_zero(float (&acc)[2][4][4]) {
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[i][j][q] = 0.0f;
}

/* act[p, f] (bf16) = glu(gate_e . h[tok] + gb, up_e . h[tok] + ub) for the permuted rows p
 * of each tile (expert e, token rows[p] / k; gb, ub from gub[E * 2f] as atlas_moe_gu_slots).
 * grid (ceil(f / 64), the most tiles), block 256. d % 8 == 0, f % 8 == 0 (Q: d % 32 == 0). */
template <bool Q>
__device__ __forceinline__ void gu_grouped(bf16_t *act, const float *h, const void *gu,
                                           const float *sc, const bf16_t *gub, const int *tiles,
                                           const int *rows, int k, int d, int f, glu_act ga) {
    __shared__ __align__(16) bf16_t As[2][GM * GLDS];
    __shared__ __align__(16) bf16_t Bs[2][GN * GLDS];
    __shared__ int tok[GM];
    pdl_trigger();
    pdl_wait();
    int e, r0, r1;
    if (!moe_tile(tiles, e, r0, r1)) return;
    int f0 = blockIdx.x * 64, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int wm = warp >> 2, wn = warp & 3;
    if (threadIdx.x < GM) tok[threadIdx.x] = r0 + (int)threadIdx.x < r1 ? rows[r0 + threadIdx.x] / k : -1;
    __syncthreads();
    const bf16_t *w = (const bf16_t *)gu + (size_t)e * 2 * f * d;
    const uint8_t *wq = (const uint8_t *)gu + (size_t)e * 2 * f * (d / 2);
    const float *sq = Q ? sc + (size_t)e * 2 * f * (d / 32) : NULL;
    int qr = threadIdx.x >> 1, qi = f0 + (qr >> 5) * 16 + (qr & 15); /* as gu_load_b's rows */
    long long qrow = (qr & 16) ? f + qi : qi;
    qtile qt;
    float acc[2][4][4];
    acc_zero(acc);
    float4 ra[2];
    if (Q) {
        q_load(qt, wq, sq, qrow, qi < f, d, 0);
        q_store(Bs[0], qt);
    } else {
        gu_load_b(Bs[0], w, f, d, f0, 0);
    }
    asm volatile("cp.async.commit_group;");
    gu_load_a(ra, h, tok, d, 0);
    gu_store_a(As[0], ra);
    asm volatile("cp.async.wait_all;");
    __syncthreads();
    int kt_count = (d + GK - 1) / GK;
    for (int kt = 0; kt < kt_count; kt++) {
        int cur = kt & 1;
        bool more = kt + 1 < kt_count;
        if (more) {
            if (Q) q_load(qt, wq, sq, qrow, qi < f, d, (kt + 1) * GK);
            else gu_load_b(Bs[cur ^ 1], w, f, d, f0, (kt + 1) * GK);
            asm volatile("cp.async.commit_group;");
            gu_load_a(ra, h, tok, d, (kt + 1) * GK);
        }
        moe_mma_tile(acc, As[cur], Bs[cur], wm, wn);
        if (more) {
            gu_store_a(As[cur ^ 1], ra);
            if (Q) q_store(Bs[cur ^ 1], qt);
            asm volatile("cp.async.wait_all;");
        }
        __syncthreads();
    }
    int g = lane >> 2, q = lane & 3;
    const bf16_t *be = gub ? gub + (size_t)e * 2 * f : NULL;
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                int p = r0 + wm * 32 + mt * 16 + g + hh * 8, i = f0 + wn * 16 + nt * 8 + q * 2;
                if (p >= r1 || i >= f) continue; /* f % 8 == 0: i + 1 < f too */
                float g0 = acc[mt][nt][hh * 2], g1 = acc[mt][nt][hh * 2 + 1];
                float u0 = acc[mt][nt + 2][hh * 2], u1 = acc[mt][nt + 2][hh * 2 + 1];
                if (be) {
                    g0 += bf2f(be[i]), g1 += bf2f(be[i + 1]);
                    u0 += bf2f(be[f + i]), u1 += bf2f(be[f + i + 1]);
                }
                float a0 = glu_mul(g0, u0, ga), a1 = glu_mul(g1, u1, ga);
                *(uint32_t *)(act + (size_t)p * f + i) = pack_bf16x2(a0, a1);
            }
}

/* The down tiles by cp.async, GK columns from k0 of f: A = act rows r0 .. r0 + 63 (zeros
 * past r1), B = down rows e * d + m0 .. + 127 (zeros past d). The caller commits. */
__device__ __forceinline__ void dn_load_a(bf16_t *as, const bf16_t *act, int r0, int r1, int f,
                                          int k0) {
    int r = threadIdx.x >> 2, c = (threadIdx.x & 3) * 8;
    bool ok = r0 + r < r1 && k0 + c < f;
    cp_async16(as + r * GLDS + c, ok ? act + (size_t)(r0 + r) * f + k0 + c : act, ok ? 16 : 0);
}

__device__ __forceinline__ void dn_load_b(bf16_t *bs, const bf16_t *w, int m0, int d, int f,
                                          int k0) {
#pragma unroll
    for (int it = 0; it < 2; it++) {
        int idx = threadIdx.x + it * G_THREADS, r = idx >> 2, c = (idx & 3) * 8;
        bool ok = m0 + r < d && k0 + c < f;
        cp_async16(bs + r * GLDS + c, ok ? w + (size_t)(m0 + r) * f + k0 + c : w, ok ? 16 : 0);
    }
}

/* y[p, d] (fp32) = act[p, :f] @ down_e^T for the permuted rows p of each tile. grid
 * (ceil(d / 128), the most tiles), block 256. f % 8 == 0 (Q: f % 32 == 0). */
template <bool Q>
__device__ __forceinline__ void down_grouped(float *y, const bf16_t *act, const void *down,
                                             const float *sc, const int *tiles, int d, int f) {
    __shared__ __align__(16) bf16_t As[2][GM * GLDS];
    __shared__ __align__(16) bf16_t Bs[2][GN * GLDS];
    pdl_trigger();
    pdl_wait();
    int e, r0, r1;
    if (!moe_tile(tiles, e, r0, r1)) return;
    int m0 = blockIdx.x * GN, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int wm = warp >> 2, wn = warp & 3;
    const bf16_t *w = (const bf16_t *)down + (size_t)e * d * f;
    const uint8_t *wq = (const uint8_t *)down + (size_t)e * d * (f / 2);
    const float *sq = Q ? sc + (size_t)e * d * (f / 32) : NULL;
    int qrow = m0 + (threadIdx.x >> 1);
    qtile qt;
    float acc[2][4][4];
    acc_zero(acc);
    dn_load_a(As[0], act, r0, r1, f, 0);
    if (Q) {
        q_load(qt, wq, sq, qrow, qrow < d, f, 0);
        q_store(Bs[0], qt);
    } else {
        dn_load_b(Bs[0], w, m0, d, f, 0);
    }
    asm volatile("cp.async.commit_group;");
    asm volatile("cp.async.wait_all;");
    __syncthreads();
    int kt_count = (f + GK - 1) / GK;
    for (int kt = 0; kt < kt_count; kt++) {
        int cur = kt & 1, k1 = (kt + 1) * GK;
        bool more = kt + 1 < kt_count;
        if (more) {
            dn_load_a(As[cur ^ 1], act, r0, r1, f, k1);
            if (Q) q_load(qt, wq, sq, qrow, qrow < d, f, k1);
            else dn_load_b(Bs[cur ^ 1], w, m0, d, f, k1);
            asm volatile("cp.async.commit_group;");
        }
        moe_mma_tile(acc, As[cur], Bs[cur], wm, wn);
        if (more) {
            if (Q) q_store(Bs[cur ^ 1], qt);
            asm volatile("cp.async.wait_all;");
        }
        __syncthreads();
    }
    int g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                int p = r0 + wm * 32 + mt * 16 + g + hh * 8, c = m0 + wn * 32 + nt * 8 + q * 2;
                if (p >= r1 || c >= d) continue; /* d % 8 == 0: c + 1 < d too */
                *(float2 *)(y + (size_t)p * d + c) =
                    make_float2(acc[mt][nt][hh * 2], acc[mt][nt][hh * 2 + 1]);
            }
}

/* The grouped GEMMs, bf16 and MXFP4 (sc: the scales; unused by the bf16 ones). */
#define ATLAS_MOE_GROUPED(SFX, Q)                                                                 \
    extern "C" __global__ void __launch_bounds__(G_THREADS) atlas_moe_gu_grouped##SFX(           \
        bf16_t *act, const float *h, const void *gu, const float *sc, const bf16_t *gub,        \
        const int *tiles, const int *rows, int k, int d, int f, glu_act ga) {                   \
        gu_grouped<Q>(act, h, gu, sc, gub, tiles, rows, k, d, f, ga);                          \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(G_THREADS) atlas_moe_down_grouped##SFX(         \
        float *y, const bf16_t *act, const void *down, const float *sc, const int *tiles, int d, \
        int f) {                                                                                \
        down_grouped<Q>(y, act, down, sc, tiles, d, f);                                        \
    }
ATLAS_MOE_GROUPED(, false)
ATLAS_MOE_GROUPED(_fp4, true)

/* out[t, :] = sum over the token's choices j, in increasing expert index, of
 * wts[t, j] * (y[pos[t * k + j], :] + db[e * d, :]), e = ids[t, j] (db NULL: no bias). grid
 * n, block 256. d % 4 == 0. */
extern "C" __global__ void __launch_bounds__(256)
atlas_moe_combine(float *out, const float *y, const bf16_t *db, const int *ids, const float *wts,
                  const int *pos, int k, int d) {
    __shared__ int order[MOE_MAX_K];
    pdl_trigger();
    pdl_wait();
    int t = blockIdx.x;
    const int *id = ids + (size_t)t * k;
    moe_order(order, id, k);
    for (int c = threadIdx.x * 4; c < d; c += blockDim.x * 4) {
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int q = 0; q < k; q++) {
            int j = order[q], p = pos[(size_t)t * k + j];
            if (p < 0) continue;
            float w = wts[(size_t)t * k + j];
            float4 v = *(const float4 *)(y + (size_t)p * d + c);
            if (db) {
                const bf16_t *b = db + (size_t)id[j] * d + c;
                v.x += bf2f(b[0]), v.y += bf2f(b[1]), v.z += bf2f(b[2]), v.w += bf2f(b[3]);
            }
            acc.x += v.x * w;
            acc.y += v.y * w;
            acc.z += v.z * w;
            acc.w += v.w * w;
        }
        *(float4 *)(out + (size_t)t * d + c) = acc;
    }
}

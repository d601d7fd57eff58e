/* kernels/gemv.cu — matmul for decode: out[n, m] = x[n, k] @ w[m, k]^T (+ bias), n <= 8.
 *
 * Bandwidth-bound: every weight byte is read once per step, so each kernel keeps many 16-byte
 * loads in flight. Families (which one runs: ops_cuda.c op_matmul, kernels/README.md):
 *   atlas_gemv4/8         2..8 rows when k % 32 != 0: a warp owns R rows, each lane reads 8
 *                         bf16 of each row per 256-wide chunk, U chunks loaded before any is
 *                         used; x (fp32) from L1/L2
 *   atlas_gemv1b          one row: a block of 256 threads spans k for 4 rows
 *   atlas_gemv1c          the same, a block owning ng groups of 4 rows (the default)
 *   *_norm, *_resid       the same with RMSNorm / the residual add folded in (decode fusions)
 *   atlas_gemv1[bc]_[norm_]swiglu, _qkv  the block kernels with swiglu / rope + kv_store in
 *                         their epilogue (decode fusions)
 *   atlas_gemv_mma        2..8 rows on the tensor cores
 * k % 8 == 0 (k % 32 for the mma kernel). */
#include "kv8.cuh"
#include "mma.cuh"

enum { GEMV_WARPS = 4, GEMV_U = 4 };

/* 8 inputs (a, b) of an on-the-fly RMSNorm: their squares into ss, then times the norm
 * weights nw[0, 8). */
__device__ __forceinline__ void norm_in(float4 &a, float4 &b, const bf16_t *nw, float &ss) {
    ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + b.x * b.x + b.y * b.y + b.z * b.z +
          b.w * b.w;
    float g[8];
    unpack8(__ldg((const uint4 *)nw), g);
    a.x *= g[0]; a.y *= g[1]; a.z *= g[2]; a.w *= g[3];
    b.x *= g[4]; b.y *= g[5]; b.z *= g[6]; b.w *= g[7];
}

/* The dot product of 8 bf16 weights (one 16-byte load) with 8 inputs (a, b). */
__device__ __forceinline__ float dot8(uint4 wv, float4 a, float4 b) {
    float f[8];
    unpack8(wv, f);
    return f[0] * a.x + f[1] * a.y + f[2] * a.z + f[3] * a.w + f[4] * b.x + f[5] * b.y +
           f[6] * b.z + f[7] * b.w;
}

/* NORM (n = 1): x is the residual stream and the input is rmsnorm(x) * nw: x is multiplied by
 * nw here and its squares summed into ss; the caller scales the dot products by
 * rsqrt(mean(x^2) + eps) at the end (see "Decode's fusions around RMSNorm" below). */
template <int N, int GEMV_R, bool NORM>
__device__ __forceinline__ void gemv_chunk(float (&acc)[GEMV_R][N], const uint4 (&wv)[GEMV_R],
                                           const float *x, int n, int k, int kk,
                                           const bf16_t *nw, float &ss) {
#pragma unroll
    for (int j = 0; j < N; j++) {
        if (j < n) {
            const float4 *xp = (const float4 *)(x + (size_t)j * k + kk);
            float4 a = __ldg(xp), b = __ldg(xp + 1);
            if (NORM) norm_in(a, b, nw + kk, ss);
#pragma unroll
            for (int r = 0; r < GEMV_R; r++) acc[r][j] += dot8(wv[r], a, b);
        }
    }
}

/* The fusions' extra operands (unused by the plain kernels): nw/eps/h for NORM (h receives
 * rmsnorm(x) * nw, the fused op's own output, written by one warp), resid for the residual
 * add of the output (resid[row] += out[row]). */
struct gemv_fx {
    const bf16_t *nw;
    float eps;
    float *h, *resid;
};

/* h[0, k) = x * scale * nw by the calling threads (nthreads of them, from index tid). */
__device__ __forceinline__ void gemv_write_norm(float *h, const float *x, const bf16_t *nw,
                                                float scale, int k, int tid, int nthreads) {
    for (int i = tid * 4; i < k; i += nthreads * 4) {
        float4 v = *(const float4 *)(x + i);
        v.x *= scale * bf2f(nw[i]); v.y *= scale * bf2f(nw[i + 1]);
        v.z *= scale * bf2f(nw[i + 2]); v.w *= scale * bf2f(nw[i + 3]);
        *(float4 *)(h + i) = v;
    }
}

template <int N, int GEMV_R, bool NORM = false>
__device__ __forceinline__ void gemv_body(float *out, const float *x, const bf16_t *w,
                                          const bf16_t *bias, int n, int m, int k,
                                          gemv_fx fx = gemv_fx{0, 0.0f, 0, 0}) {
    int lane = threadIdx.x & 31;
    int row0 = (blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * GEMV_R;
    if (row0 >= m) return;
    const bf16_t *wr[GEMV_R];
#pragma unroll
    for (int r = 0; r < GEMV_R; r++) wr[r] = w + (size_t)min(row0 + r, m - 1) * k;
    float acc[GEMV_R][N];
#pragma unroll
    for (int r = 0; r < GEMV_R; r++)
#pragma unroll
        for (int j = 0; j < N; j++) acc[r][j] = 0.0f;

    /* software pipeline: the next U chunks load while these are used; the first ones are
     * requested before waiting for the previous kernel (weights do not depend on it) */
    int kk = lane * 8;
    float ss = 0.0f;
    uint4 cur[GEMV_U][GEMV_R];
#pragma unroll
    for (int u = 0; u < GEMV_U; u++)
#pragma unroll
        for (int r = 0; r < GEMV_R; r++)
            cur[u][r] = kk + u * 256 < k ? ld_stream16(wr[r] + kk + u * 256) : make_uint4(0, 0, 0, 0);
    pdl_trigger();
    pdl_wait();
    while (kk < k) {
        int kn = kk + GEMV_U * 256;
        uint4 nxt[GEMV_U][GEMV_R];
#pragma unroll
        for (int u = 0; u < GEMV_U; u++)
#pragma unroll
            for (int r = 0; r < GEMV_R; r++)
                nxt[u][r] = kn + u * 256 < k ? ld_stream16(wr[r] + kn + u * 256) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < GEMV_U; u++)
            if (kk + u * 256 < k)
                gemv_chunk<N, GEMV_R, NORM>(acc, cur[u], x, n, k, kk + u * 256, fx.nw, ss);
#pragma unroll
        for (int u = 0; u < GEMV_U; u++)
#pragma unroll
            for (int r = 0; r < GEMV_R; r++) cur[u][r] = nxt[u][r];
        kk = kn;
    }
    float scale = NORM ? rsqrtf(warp_sum(ss) / (float)k + fx.eps) : 1.0f;
#pragma unroll
    for (int r = 0; r < GEMV_R; r++) {
#pragma unroll
        for (int j = 0; j < N; j++) {
            float s = warp_sum(acc[r][j]) * scale + (bias ? bf2f(bias[row0 + r < m ? row0 + r : 0]) : 0.0f);
            if (lane == 0 && j < n && row0 + r < m) {
                out[(size_t)j * m + row0 + r] = s;
                if (fx.resid) fx.resid[(size_t)j * m + row0 + r] += s;
            }
        }
    }
    if (NORM && fx.h && blockIdx.x == 0 && threadIdx.x < 32)
        gemv_write_norm(fx.h, x, fx.nw, scale, k, lane, 32);
}

/* 2..8 rows of a k that the mma kernel does not take (k % 32 != 0): grid
 * ceil(m / (GEMV_WARPS * 2)), block 32 * GEMV_WARPS (R = 2 rows a warp). */
extern "C" __global__ void __launch_bounds__(128) atlas_gemv4(float *out, const float *x,
                                                              const bf16_t *w, const bf16_t *bias,
                                                              int n, int m, int k) {
    gemv_body<4, 2>(out, x, w, bias, n, m, k);
}

extern "C" __global__ void __launch_bounds__(128) atlas_gemv8(float *out, const float *x,
                                                              const bf16_t *w, const bf16_t *bias,
                                                              int n, int m, int k) {
    gemv_body<8, 2>(out, x, w, bias, n, m, k);
}

/* Decode's fusions around RMSNorm (ops_cuda.c exec_fused, the norm fusion), one row: an
 * o or down projection followed by add_rmsnorm and the next projection becomes two GEMVs:
 * *_resid adds its output into the residual stream, *_norm reads the residual stream and
 * normalises it on the fly (every warp or block reads all of x anyway, so summing its squares
 * costs nothing that shows), and writes the norm's output h from one warp. On the one-group
 * kernels a decode step with them measured slower; on gemv1c faster, and they are on by
 * default (bench/RESULTS.md). Arguments: the GEMV's, then nw, eps, h, resid (unused ones 0). */
#define ATLAS_GEMV_FX(NAME, THREADS, BODY)                                                         \
    extern "C" __global__ void __launch_bounds__(THREADS) NAME(float *out, const float *x,        \
                                                               const bf16_t *w,                    \
                                                               const bf16_t *bias, int m, int k,   \
                                                               const bf16_t *nw, float eps,        \
                                                               float *h, float *resid) {           \
        BODY;                                                                                      \
    }

/* Variant for n = 1: a block of 256 threads owns 4 rows and spans k;
 * each thread issues all its loads (up to 4 rows x 4 chunks of 16 bytes) before using any,
 * then the block reduces. grid ceil(m / 4). */
enum { GB_ROWS = 4, GB_U = 4, GB_THREADS = 256 };

__device__ __forceinline__ void gemv1b_load(uint4 (&wv)[GB_U][GB_ROWS], const bf16_t *const (&wr)[GB_ROWS],
                                            int base, int k) {
#pragma unroll
    for (int u = 0; u < GB_U; u++)
#pragma unroll
        for (int r = 0; r < GB_ROWS; r++)
            wv[u][r] = base + u * GB_THREADS * 8 < k ? ld_stream16(wr[r] + base + u * GB_THREADS * 8)
                                                     : make_uint4(0, 0, 0, 0);
}

/* Which 4 weight rows a block (b: blockIdx.x, or a group of gemv1c_body) owns (rows(b, r), r = 0..3) and what its epilogue does with their
 * results. The plain kernel: rows 4b .. 4b + 3. */
struct gb_rows {
    __device__ int operator()(int b, int r) const { return b * GB_ROWS + r; }
};

/* Two pairs of rows dist apart, for epilogues that combine row i with row i + dist: rows
 * base + {0, 1, dist, dist + 1}, base = (b / per) * span + (b % per) * 2. swiglu: gate rows
 * i, i + 1 with up rows f + i, f + i + 1 (per f/2, dist f). */
struct gb_pairs {
    int per, span, dist;
    __device__ int operator()(int b, int r) const {
        return (b / per) * span + (b % per) * 2 + (r & 1) + (r >> 1) * dist;
    }
};

/* The rows of heads of hd rows for rope, hd / 4 blocks a head: the first rot / 2 take rows
 * j, j + 1 with j + rot, j + 1 + rot (j = 2 * (b % (hd / 4)) < rot: the pairs that rotate),
 * the rest 4 consecutive rows from 2 * rot on (partial rotary's dimensions that pass
 * through; none when 2 * rot = hd). rot even. */
struct gb_heads {
    int hd, rot;
    __device__ int operator()(int b, int r) const {
        int per = hd / 4, head = b / per, j = b - head * per, pairs = rot / 2;
        if (j < pairs) return head * hd + 2 * j + (r & 1) + (r >> 1) * rot;
        return head * hd + 2 * rot + (j - pairs) * 4 + r;
    }
};

/* Epilogues: called by all of warp 0, lane l with v, the result (bias added) of the block's
 * row rows(b, l & 3), at that row. */
struct gb_store { /* out[row] = v, resid[row] += v when resid */
    float *out, *resid;
    int m;
    __device__ void operator()(float v, int row, int lane) const {
        if (lane < GB_ROWS && row < m) {
            out[row] = v;
            if (resid) resid[row] += v;
        }
    }
};

struct gb_swiglu { /* gu[row] = v; act[i] = act(gate i) * up i as kernels/swiglu.cu */
    float *gu, *act;
    glu_act ga;
    __device__ void operator()(float v, int row, int lane) const {
        float u = __shfl_down_sync(0xffffffffu, v, 2); /* lanes 0, 1: their up row's result */
        if (lane < GB_ROWS) gu[row] = v;
        if (lane < 2) act[row] = glu_mul(v, u, ga);
    }
};

/* rope + kv_store of one token as kernels/kv.cu atlas_rope_kv_store, by the rows of gb_heads:
 * in a block of rotating rows, lanes 0, 1 hold x[i] and (from lane + 2) x[i + rot] of a q or
 * k head, rotated into qkv and, for a k head, into the cache at slots[0]; every other row
 * (v heads', and the dimensions partial rotary passes through) is its lane's own, copied
 * into qkv and, for k and v heads, into the cache unrotated. cs: the layer's rope table. */
template <class T> /* the cache's element: bf16, or e4m3 codes of x / ks (k) and x / vs (v) */
struct gb_rope_kv {
    float *qkv;
    T *kc, *vc;
    const int *slots;
    const float2 *cs;
    int H, K, hd, rot;
    float ks, vs;
    __device__ void operator()(float v, int row, int lane) const {
        float b = __shfl_down_sync(0xffffffffu, v, 2);
        if (lane >= GB_ROWS) return;
        int head = row / hd, i = row - head * hd;
        size_t dst = (size_t)slots[0] * K * hd;
        float *x = qkv + (size_t)head * hd;
        if (head < H + K && i < 2 * rot) { /* lanes 2, 3: the rows lanes 0, 1 rotate */
            if (lane < 2)
                rope_pair(x, head >= H ? kc + dst + (size_t)(head - H) * hd : (T *)NULL, i, rot,
                          v, b, cs[i], ks);
            return;
        }
        x[i] = v;
        if (head >= H + K) kv_put(vc + dst + (size_t)(head - H - K) * hd + i, v, vs);
        else if (head >= H) kv_put(kc + dst + (size_t)(head - H) * hd + i, v, ks);
    }
};

/* The block's 4 row sums: each warp's into part[warp][0..3] (lane 0 writes; column 4 is
 * free for the norm's sum of squares). */
typedef float gb_part[GB_ROWS + 1];
__device__ __forceinline__ void gb_partials(const float (&acc)[GB_ROWS], gb_part *part) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < GB_ROWS; r++) {
        float v = warp_sum(acc[r]);
        if (lane == 0) part[warp][r] = v;
    }
}

/* After a barrier, by the whole of warp 0 (so that an epilogue can exchange rows by
 * shuffles): row rows(b, lane & 3)'s total from the warps' partials, times scale, plus its
 * bias, through epi. */
template <class Rows, class Epi>
__device__ __forceinline__ void gb_finish(const gb_part *part, float scale, const bf16_t *bias,
                                          int m, int b, Rows rows, Epi epi) {
    int lane = threadIdx.x & 31, r = lane & (GB_ROWS - 1), row = rows(b, r);
    float v = 0.f;
#pragma unroll
    for (int i = 0; i < GB_THREADS / 32; i++) v += part[i][r];
    v = v * scale + (bias ? bf2f(bias[min(row, m - 1)]) : 0.0f);
    epi(v, row, lane);
}

template <bool NORM, class Rows, class Epi>
__device__ __forceinline__ void gemv1b_body(const float *x, const bf16_t *w, const bf16_t *bias,
                                            int m, int k, gemv_fx fx, Rows rows, Epi epi) {
    const bf16_t *wr[GB_ROWS];
#pragma unroll
    for (int r = 0; r < GB_ROWS; r++) wr[r] = w + (size_t)min(rows(blockIdx.x, r), m - 1) * k;
    float acc[GB_ROWS] = {0.f, 0.f, 0.f, 0.f}, ss = 0.0f;
    int base = threadIdx.x * 8;
    uint4 wv[GB_U][GB_ROWS];
    gemv1b_load(wv, wr, base, k); /* before waiting: weights do not depend on the previous kernel */
    pdl_trigger();
    pdl_wait();
    while (base < k) {
#pragma unroll
        for (int u = 0; u < GB_U; u++) {
            int kk = base + u * GB_THREADS * 8;
            if (kk >= k) break;
            const float4 *xp = (const float4 *)(x + kk);
            float4 a = __ldg(xp), b = __ldg(xp + 1);
            if (NORM) norm_in(a, b, fx.nw + kk, ss);
#pragma unroll
            for (int r = 0; r < GB_ROWS; r++) acc[r] += dot8(wv[u][r], a, b);
        }
        base += GB_THREADS * 8 * GB_U;
        if (base < k) gemv1b_load(wv, wr, base, k);
    }
    __shared__ gb_part part[GB_THREADS / 32];
    __shared__ float scale_s;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    gb_partials(acc, part);
    if (NORM) {
        float v = warp_sum(ss);
        if (lane == 0) part[warp][GB_ROWS] = v;
    }
    __syncthreads();
    if (NORM && threadIdx.x == 0) {
        float t = 0.f;
#pragma unroll
        for (int i = 0; i < GB_THREADS / 32; i++) t += part[i][GB_ROWS];
        scale_s = rsqrtf(t / (float)k + fx.eps);
    }
    if (NORM) __syncthreads();
    float scale = NORM ? scale_s : 1.0f;
    if (warp == 0) gb_finish(part, scale, bias, m, blockIdx.x, rows, epi);
    if (NORM && fx.h && blockIdx.x == 0)
        gemv_write_norm(fx.h, x, fx.nw, scale, k, threadIdx.x, GB_THREADS);
}

extern "C" __global__ void __launch_bounds__(GB_THREADS) atlas_gemv1b(float *out, const float *x,
                                                                      const bf16_t *w,
                                                                      const bf16_t *bias, int n,
                                                                      int m, int k) {
    gemv1b_body<false>(x, w, bias, m, k, gemv_fx{0, 0.0f, 0, 0}, gb_rows{}, gb_store{out, 0, m});
}

/* The block kernel's fused variants (see ATLAS_GEMV_FX above). */
ATLAS_GEMV_FX(atlas_gemv1b_norm, GB_THREADS,
              (gemv1b_body<true>(x, w, bias, m, k, gemv_fx{nw, eps, h, 0}, gb_rows{},
                                 gb_store{out, resid, m})))
ATLAS_GEMV_FX(atlas_gemv1b_resid, GB_THREADS,
              (gemv1b_body<false>(x, w, bias, m, k, gemv_fx{0, 0.0f, 0, 0}, gb_rows{},
                                  gb_store{out, resid, m})))

/* --- several row groups a block, loads one item ahead (the default) ---------------------------
 * A kernel boundary costs about 2.7 us in the decode graph even with programmatic launch
 * (one GEMV split in two launches: bench/RESULTS.md): the next kernel's resident blocks have
 * their first weights before the wait, but once they are used the memory idles until the
 * next wave of blocks has started and its loads come back. Here a block owns ng groups of 4
 * rows and walks (group, 4096-column chunk) items, each item's loads issued before the
 * previous item is used (the first two before the wait), and within the kernel a block
 * never waits for a new block to start. grid ceil(groups / ng). */
enum { GC_U = 2, GC_CH = GB_THREADS * 8 * GC_U };

template <class Rows>
__device__ __forceinline__ void gemv1c_load(uint4 (&wv)[GC_U][GB_ROWS], const bf16_t *w, int m,
                                            int k, int nch, int b0, int item, Rows rows) {
    int b = b0 + item / nch, base = (item % nch) * GC_CH + threadIdx.x * 8;
#pragma unroll
    for (int r = 0; r < GB_ROWS; r++) {
        const bf16_t *wr = w + (size_t)min(rows(b, r), m - 1) * k;
#pragma unroll
        for (int u = 0; u < GC_U; u++) {
            int kk = base + u * GB_THREADS * 8;
            wv[u][r] = kk < k ? ld_stream16(wr + kk) : make_uint4(0, 0, 0, 0);
        }
    }
}

/* NORM: x is the residual stream, normalised on the fly as in gemv1b_body: the squares are
 * summed over the first group's chunks (every group reads the same x), warp 0 turns them
 * into the scale at that group's end and keeps it for the later groups; block 0 writes h at
 * the end. */
template <bool NORM, class Rows, class Epi>
__device__ __forceinline__ void gemv1c_body(const float *x, const bf16_t *w, const bf16_t *bias,
                                            int m, int k, int groups, int ng, gemv_fx fx,
                                            Rows rows, Epi epi) {
    /* ng's high half (cuda_gemv_rows): 1 when the second item's loads go out before the wait
     * too (always, from the host; 0 measured slower): the memory then has two items of each block
     * to serve across the boundary with the previous kernel, not one */
    int early2 = ng >> 16;
    ng &= 0xffff;
    int b0 = blockIdx.x * ng, nch = (k + GC_CH - 1) / GC_CH;
    int items = min(ng, groups - b0) * nch;
    __shared__ gb_part part[2][GB_THREADS / 32];
    __shared__ float scale_s;
    float acc[GB_ROWS] = {0.f, 0.f, 0.f, 0.f}, ss = 0.0f, scale = 1.0f;
    /* Item it from buf, whose registers then take item it + 2: two buffers used in turn, so
     * that no register copy waits for a load and both buffers' loads are in flight while
     * one item is reduced (a cur = nxt copy at the loop's end waits for nxt, leaving one
     * item in flight a block; bench/RESULTS.md). */
    auto item = [&](uint4 (&buf)[GC_U][GB_ROWS], int it) {
        int c = it % nch, base = c * GC_CH + threadIdx.x * 8;
#pragma unroll
        for (int u = 0; u < GC_U; u++) {
            int kk = base + u * GB_THREADS * 8;
            if (kk < k) {
                const float4 *xp = (const float4 *)(x + kk);
                float4 a = __ldg(xp), b = __ldg(xp + 1);
                if (NORM) norm_in(a, b, fx.nw + kk, ss); /* ss used from group 0 only */
#pragma unroll
                for (int r = 0; r < GB_ROWS; r++) acc[r] += dot8(buf[u][r], a, b);
            }
        }
        if (it + 2 < items) gemv1c_load(buf, w, m, k, nch, b0, it + 2, rows);
        if (c == nch - 1) { /* the group's last chunk: reduce, then the epilogue */
            int j = it / nch, lane = threadIdx.x & 31;
            gb_part *pp = part[j & 1]; /* by parity: one barrier a group */
            gb_partials(acc, pp);
            if (NORM && j == 0) {
                float v = warp_sum(ss);
                if (lane == 0) pp[threadIdx.x >> 5][GB_ROWS] = v;
            }
#pragma unroll
            for (int r = 0; r < GB_ROWS; r++) acc[r] = 0.0f;
            __syncthreads();
            if (threadIdx.x < 32) {
                if (NORM && j == 0) {
                    float t = 0.f;
#pragma unroll
                    for (int i = 0; i < GB_THREADS / 32; i++) t += pp[i][GB_ROWS];
                    scale = rsqrtf(t / (float)k + fx.eps);
                    if (lane == 0) scale_s = scale;
                }
                gb_finish(pp, scale, bias, m, b0 + j, rows, epi);
            }
        }
    };
    uint4 wa[GC_U][GB_ROWS], wb[GC_U][GB_ROWS];
    gemv1c_load(wa, w, m, k, nch, b0, 0, rows); /* before the wait: weights only */
    if (early2 && items > 1) gemv1c_load(wb, w, m, k, nch, b0, 1, rows);
    pdl_trigger();
    pdl_wait();
    if (!early2 && items > 1) gemv1c_load(wb, w, m, k, nch, b0, 1, rows);
    for (int it = 0; it < items; it += 2) {
        item(wa, it);
        if (it + 1 < items) item(wb, it + 1);
    }
    if (NORM && fx.h && blockIdx.x == 0) {
        __syncthreads();
        gemv_write_norm(fx.h, x, fx.nw, scale_s, k, threadIdx.x, GB_THREADS);
    }
}

/* atlas_gemv1c, atlas_gemv1c_norm, atlas_gemv1c_resid: the arguments of atlas_gemv1b[_norm|
 * _resid], then ng. */
extern "C" __global__ void __launch_bounds__(GB_THREADS) atlas_gemv1c(float *out, const float *x,
                                                                      const bf16_t *w,
                                                                      const bf16_t *bias, int n,
                                                                      int m, int k, int ng) {
    (void)n;
    gemv1c_body<false>(x, w, bias, m, k, (m + GB_ROWS - 1) / GB_ROWS, ng, gemv_fx{0, 0.0f, 0, 0},
                       gb_rows{}, gb_store{out, 0, m});
}
#define ATLAS_GEMV1C_FX(NAME, NORM, STORE)                                                        \
    extern "C" __global__ void __launch_bounds__(GB_THREADS) NAME(                                 \
        float *out, const float *x, const bf16_t *w, const bf16_t *bias, int m, int k,             \
        const bf16_t *nw, float eps, float *h, float *resid, int ng) {                             \
        gemv1c_body<NORM>(x, w, bias, m, k, (m + GB_ROWS - 1) / GB_ROWS, ng,                       \
                          gemv_fx{nw, eps, h, 0}, gb_rows{}, STORE);                               \
    }
ATLAS_GEMV1C_FX(atlas_gemv1c_norm, true, (gb_store{out, resid, m}))
ATLAS_GEMV1C_FX(atlas_gemv1c_resid, false, (gb_store{out, resid, m}))
/* Decode's GEMV + epilogue fusions (ops_cuda.c exec_fused: swiglu, qkv), one
 * row, each as atlas_gemv1b_NAME, atlas_gemv1c_NAME and, with the input normalised on the fly
 * as in atlas_gemv1b_norm, atlas_gemv1[bc]_norm_NAME (the norm fusion's second GEMV).
 * Arguments: atlas_gemv1b_norm's up to h, then the epilogue's, then ng for gemv1c. grid m / 4
 * (gemv1b), ceil(m / 4 / ng) (gemv1c).
 *   swiglu  out = gate_up [2f] (kept), act[f] = act(gate) * up (ga: glu_mul's)
 *   qkv     out = qkv [(H + 2K) hd] roped over 2 * rot dimensions a head (rot even), and its
 *           k and v heads into the cache (hd % 4 == 0) */
#define ATLAS_GEMV_EPI1(NAME, BODY, ...)                                                          \
    extern "C" __global__ void __launch_bounds__(GB_THREADS) NAME(                                 \
        float *out, const float *x, const bf16_t *w, const bf16_t *bias, int m, int k,             \
        const bf16_t *nw, float eps, float *h, __VA_ARGS__) {                                      \
        BODY;                                                                                      \
    }
#define ATLAS_GEMV_EPI_B(NAME, NORM, ROWS, EPI, ...)                                              \
    ATLAS_GEMV_EPI1(NAME, (gemv1b_body<NORM>(x, w, bias, m, k, gemv_fx{nw, eps, h, 0}, ROWS, EPI)), \
                    __VA_ARGS__)
#define ATLAS_GEMV_EPI_C(NAME, NORM, ROWS, EPI, ...)                                              \
    ATLAS_GEMV_EPI1(NAME, (gemv1c_body<NORM>(x, w, bias, m, k, m / GB_ROWS, ng,                   \
                                             gemv_fx{nw, eps, h, 0}, ROWS, EPI)),                  \
                    __VA_ARGS__, int ng)
#define ATLAS_GEMV_EPI(NAME, ROWS, EPI, ...)                                                      \
    ATLAS_GEMV_EPI_B(atlas_gemv1b_##NAME, false, ROWS, EPI, __VA_ARGS__)                          \
    ATLAS_GEMV_EPI_B(atlas_gemv1b_norm_##NAME, true, ROWS, EPI, __VA_ARGS__)                      \
    ATLAS_GEMV_EPI_C(atlas_gemv1c_##NAME, false, ROWS, EPI, __VA_ARGS__)                          \
    ATLAS_GEMV_EPI_C(atlas_gemv1c_norm_##NAME, true, ROWS, EPI, __VA_ARGS__)
ATLAS_GEMV_EPI(swiglu, (gb_pairs{m / 4, 0, m / 2}), (gb_swiglu{out, act, ga}), float *act,
               glu_act ga)
ATLAS_GEMV_EPI(qkv, (gb_heads{hd, rot}),
               (gb_rope_kv<bf16_t>{out, kc, vc, slots, cs, H, K, hd, rot, 1.0f, 1.0f}),
               bf16_t *kc, bf16_t *vc, const int *slots, const float2 *cs, int H, int K, int hd,
               int rot)
/*   qkv_fp8 qkv's, into an FP8 cache: ks, vs the layer's K and V scales */
ATLAS_GEMV_EPI(qkv_fp8, (gb_heads{hd, rot}),
               (gb_rope_kv<fp8_t>{out, kc, vc, slots, cs, H, K, hd, rot, ks, vs}), fp8_t *kc,
               fp8_t *vc, const int *slots, const float2 *cs, int H, int K, int hd, int rot,
               float ks, float vs)

/* --- small batches on the tensor cores ----------------------------------------------------------
 * atlas_gemv_mma: out[n, m] = x[n, k] @ w[m, k]^T (+ bias), n <= 8, k % 32 == 0. Still bound by
 * reading w once, but the fp32 kernels above re-read x once per row pair and multiply on the
 * FMA units: at n = 8 they read 8x more x than w through L1 and ran 2.7x slower than n = 1.
 * Here a block owns 16 rows and its 4 warps share k, a warp taking 32 columns at a time:
 * each lane loads 16 bytes of 2 rows (rows g and g + 8, g = lane / 4) and 8 floats of x row g,
 * and mma.sync m16n8k16 multiplies them. The k order inside a 32-column block is permuted the
 * same way for w and x (a sum does not care), so that every load is a plain 16-byte vector.
 * x is split as hi + lo bf16 pairs and multiplied twice, which keeps about 16 bits of it
 * (near the fp32 kernels' results) at no cost that shows: the tensor cores are idle anyway. */
enum { GM_WARPS = 4, GM_U = 4 };

/* One 32-column block: rows g, g + 8 of the tile (wl, wh: 8 bf16 at column q * 8 each) times
 * x row g (xa, xb: the same 8 columns). Step s covers physical columns q*8 + s*4 + 0..3,
 * as logical k (2q, 2q+1) and (2q+8, 2q+9) of the m16n8k16 fragments. */
__device__ __forceinline__ void gemv_mma_block(float (&c)[4], float (&c2)[4], uint4 wl, uint4 wh,
                                               float4 xa, float4 xb) {
    uint32_t h0, l0, h1, l1, a[4] = {wl.x, wh.x, wl.y, wh.y};
    split_bf16x2(xa.x, xa.y, h0, l0);
    split_bf16x2(xa.z, xa.w, h1, l1);
    mma_bf16_16816(c, a, h0, h1); /* two accumulators: shorter chains */
    mma_bf16_16816(c2, a, l0, l1);
    uint32_t a2[4] = {wl.z, wh.z, wl.w, wh.w};
    split_bf16x2(xb.x, xb.y, h0, l0);
    split_bf16x2(xb.z, xb.w, h1, l1);
    mma_bf16_16816(c, a2, h0, h1);
    mma_bf16_16816(c2, a2, l0, l1);
}

/* grid ceil(m / 16), block 128. */
extern "C" __global__ void __launch_bounds__(GM_WARPS * 32) atlas_gemv_mma(float *out, const float *x,
                                                                         const bf16_t *w,
                                                                         const bf16_t *bias, int n,
                                                                         int m, int k) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    int r0 = blockIdx.x * 16, nk = k / 32;
    const bf16_t *wl = w + (size_t)min(r0 + g, m - 1) * k + q * 8;
    const bf16_t *wh = w + (size_t)min(r0 + g + 8, m - 1) * k + q * 8;
    const float *xr = x + (size_t)min(g, n - 1) * k + q * 8;
    bool has_x = g < n;
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f}, c2[4] = {0.0f, 0.0f, 0.0f, 0.0f};

    /* warp takes 32-column blocks warp, warp + 4, ...; U of them in flight, the first ones
     * requested before waiting for the previous kernel (weights do not depend on it) */
    uint4 cl[GM_U], ch[GM_U];
#pragma unroll
    for (int u = 0; u < GM_U; u++) {
        int kb = warp + u * GM_WARPS;
        cl[u] = kb < nk ? ld_stream16(wl + kb * 32) : make_uint4(0, 0, 0, 0);
        ch[u] = kb < nk ? ld_stream16(wh + kb * 32) : make_uint4(0, 0, 0, 0);
    }
    pdl_trigger();
    pdl_wait();
    for (int it = warp; it < nk; it += GM_U * GM_WARPS) {
        uint4 nl[GM_U], nh[GM_U];
#pragma unroll
        for (int u = 0; u < GM_U; u++) {
            int kb = it + (GM_U + u) * GM_WARPS;
            nl[u] = kb < nk ? ld_stream16(wl + kb * 32) : make_uint4(0, 0, 0, 0);
            nh[u] = kb < nk ? ld_stream16(wh + kb * 32) : make_uint4(0, 0, 0, 0);
        }
        /* x of these U blocks, all requested before any is used (one L2 round trip a pass,
         * not one a block) */
        float4 xa[GM_U], xb[GM_U];
#pragma unroll
        for (int u = 0; u < GM_U; u++) {
            int kb = it + u * GM_WARPS;
            xa[u] = xb[u] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (has_x && kb < nk) {
                xa[u] = __ldg((const float4 *)(xr + kb * 32));
                xb[u] = __ldg((const float4 *)(xr + kb * 32 + 4));
            }
        }
#pragma unroll
        for (int u = 0; u < GM_U; u++)
            if (it + u * GM_WARPS < nk) gemv_mma_block(c, c2, cl[u], ch[u], xa[u], xb[u]);
#pragma unroll
        for (int u = 0; u < GM_U; u++) {
            cl[u] = nl[u];
            ch[u] = nh[u];
        }
    }
    /* c[0..1]: row r0 + g, columns (x rows) 2q, 2q + 1; c[2..3]: row r0 + g + 8 */
    __shared__ float red[GM_WARPS][4][32];
#pragma unroll
    for (int i = 0; i < 4; i++) red[warp][i][lane] = c[i] + c2[i];
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float v = red[0][i][lane] + red[1][i][lane] + red[2][i][lane] + red[3][i][lane];
        int row = r0 + g + (i >= 2 ? 8 : 0), col = 2 * q + (i & 1);
        if (row < m && col < n) out[(size_t)col * m + row] = v + (bias ? bf2f(bias[row]) : 0.0f);
    }
}

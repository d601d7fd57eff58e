/* kernels/attn_prefill.cu — causal flash attention for prefill on the tensor cores
 * (mma.sync m16n8k16 bf16, fp32 softmax and accumulators), reading K/V from the paged cache.
 *
 * One block: 64 consecutive query tokens of one sequence (a "tile", listed by begin_batch)
 * and one query head; 4 warps of 16 query rows. Keys are walked in tiles of 64 (K and V
 * tiles gathered from their cache slots by cp.async); scores get the causal / sliding-window
 * mask, an online softmax in base 2 (the scale and log2(e) are folded into Q), and P (bf16)
 * multiplies V through ldmatrix.trans. A head's sink (gpt-oss; sinks NULL: none) joins the
 * denominator at the end, as in kernels/attention.cu. Q is staged through the K buffer once
 * and kept in registers. head_dim 64, 80, 96 or 128 (template: a multiple of 16, whose rows
 * of HD + 8 bf16 stay 16-byte aligned for ldmatrix); others (256: its registers and 67 KiB
 * of shared memory) use kernels/attention.cu.
 *
 * An FP8 cache (atlas_attn_prefill<HD>_fp8, kv8.cuh): a K or V tile's e4m3 codes are loaded
 * and widened to bf16 (exact) into the same shared tiles, with plain loads instead of
 * cp.async (a tile is written where the bf16 kernel issues its copy, after the barrier that
 * frees the buffer, and read after the next barrier); the layer's K scale comes folded into
 * qscale and the V scale, vscale, multiplies the output. */
#include "kv8.cuh"
#include "mma.cuh"

enum { PF_Q = 64, PF_K = 64, PF_THREADS = 128 };

/* Gathers keys [k0, k0 + 64) (those <= kend; the rest read zeros) of kv head g into s. */
template <int HD>
__device__ __forceinline__ void pf_load_kv(bf16_t *s, const bf16_t *cache, const int *bt, int bs,
                                           int K, int g, int k0, int kend) {
    constexpr int CH = HD / 8, LD = HD + 8;
    for (int c = threadIdx.x; c < PF_K * CH; c += PF_THREADS) {
        int r = c / CH, col = (c % CH) * 8, kp = k0 + r;
        bool ok = kp <= kend;
        const bf16_t *src = cache;
        if (ok) src = cache + ((size_t)(bt[kp / bs] * bs + kp % bs) * K + g) * HD + col;
        cp_async16(s + r * LD + col, src, ok ? 16 : 0);
    }
    asm volatile("cp.async.commit_group;");
}

/* The same from an FP8 cache: 8 codes a thread's load, widened to bf16 into s. */
template <int HD>
__device__ __forceinline__ void pf_load_kv(bf16_t *s, const fp8_t *cache, const int *bt, int bs,
                                           int K, int g, int k0, int kend) {
    constexpr int CH = HD / 8, LD = HD + 8;
    for (int c = threadIdx.x; c < PF_K * CH; c += PF_THREADS) {
        int r = c / CH, col = (c % CH) * 8, kp = k0 + r;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (kp <= kend)
            v = fp8x8_to_bf16(*(const uint2 *)(cache + ((size_t)(bt[kp / bs] * bs + kp % bs) * K + g) * HD + col));
        *(uint4 *)(s + r * LD + col) = v;
    }
    asm volatile("cp.async.commit_group;"); /* an empty group: the waits count as for bf16 */
}

template <int HD, class KT>
__device__ __forceinline__ void pf_body(float *out, const float *qkv, const KT *kc,
                                        const KT *vc, const int *tiles, const int *tok_seq,
                                        const int *positions, const int *block_table,
                                        int max_blocks, int bs, int H, int K, int window,
                                        float qscale, const bf16_t *sinks, float vscale) {
    constexpr int LD = HD + 8, KS = HD / 16, NT = HD / 8;
    extern __shared__ __align__(16) bf16_t pf_smem[];
    bf16_t *ks = pf_smem, *vs = pf_smem + PF_K * LD;
    int tile = gridDim.x - 1 - blockIdx.x; /* the last tiles see the most keys: start them first */
    int t0 = tiles[2 * tile], cnt = tiles[2 * tile + 1], h = blockIdx.y;
    int g = h / (H / K), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int qr = lane >> 2, qc = (lane & 3) * 2; /* fragment row / column within 16 x 8 */
    int p0 = positions[t0], kend = p0 + cnt - 1;
    int klo = window > 0 ? max(0, p0 - window + 1) : 0;
    const int *bt = block_table + (size_t)tok_seq[t0] * max_blocks;
    size_t row_stride = (size_t)(H + 2 * K) * HD;

    /* Q (scaled, bf16) through the K buffer into registers */
    for (int c = threadIdx.x; c < PF_Q * HD / 4; c += PF_THREADS) {
        int r = c / (HD / 4), col = (c % (HD / 4)) * 4;
        float4 v = r < cnt ? *(const float4 *)(qkv + (size_t)(t0 + r) * row_stride +
                                               (size_t)h * HD + col)
                           : make_float4(0.f, 0.f, 0.f, 0.f);
        *(uint2 *)(ks + r * LD + col) =
            make_uint2(pack_bf16x2(v.x * qscale, v.y * qscale), pack_bf16x2(v.z * qscale, v.w * qscale));
    }
    __syncthreads();
    uint32_t qa[KS][4];
#pragma unroll
    for (int kk = 0; kk < KS; kk++)
        ldmatrix_x4(qa[kk], ks + (warp * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
    __syncthreads();

    float o[NT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < NT; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    int qp[2] = {p0 + warp * 16 + qr, p0 + warp * 16 + qr + 8};

    /* one K and one V buffer, loads overlapped with compute: the next K tile loads during
     * softmax and P V, the next V tile during the next Q K^T */
    int k0 = klo - klo % PF_K;
    pf_load_kv<HD>(ks, kc, bt, bs, K, g, k0, kend);
    pf_load_kv<HD>(vs, vc, bt, bs, K, g, k0, kend);
    for (; k0 <= kend; k0 += PF_K) {
        bool more = k0 + PF_K <= kend;
        asm volatile("cp.async.wait_group 1;"); /* K(k0) is in; V(k0) may still be coming */
        __syncthreads();
        float s[8][4];
#pragma unroll
        for (int j = 0; j < 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
#pragma unroll
            for (int p = 0; p < 4; p++) {
                uint32_t b[4];
                ldmatrix_x4(b, ks + (p * 16 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 +
                               ((lane >> 3) & 1) * 8);
                mma_bf16_16816(s[2 * p], qa[kk], b[0], b[1]);
                mma_bf16_16816(s[2 * p + 1], qa[kk], b[2], b[3]);
            }
        }
        __syncthreads(); /* every warp is done with K(k0) */
        if (more) pf_load_kv<HD>(ks, kc, bt, bs, K, g, k0 + PF_K, kend);
        /* mask, online softmax (rows qr and qr + 8 of this warp's 16) */
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int kp = k0 + j * 8 + qc + (e & 1), q = qp[e >> 1];
                bool ok = kp <= q && kp >= klo && (window <= 0 || kp > q - window);
                s[j][e] = ok ? s[j][e] : -INFINITY;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
            }
        float sc[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            float base = mx[r] == -INFINITY ? 0.f : mx[r];
            sc[r] = exp2f(m[r] - base); /* 0 while m is -inf */
            m[r] = mx[r];
            l[r] *= sc[r];
        }
        uint32_t pa[4][4];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float b0 = m[0] == -INFINITY ? 0.f : m[0], b1 = m[1] == -INFINITY ? 0.f : m[1];
            float e0 = exp2f(s[j][0] - b0), e1 = exp2f(s[j][1] - b0);
            float e2 = exp2f(s[j][2] - b1), e3 = exp2f(s[j][3] - b1);
            l[0] += e0 + e1;
            l[1] += e2 + e3;
            pa[j >> 1][(j & 1) * 2] = pack_bf16x2(e0, e1);
            pa[j >> 1][(j & 1) * 2 + 1] = pack_bf16x2(e2, e3);
        }
#pragma unroll
        for (int i = 0; i < NT; i++) {
            o[i][0] *= sc[0]; o[i][1] *= sc[0];
            o[i][2] *= sc[1]; o[i][3] *= sc[1];
        }
        if (more) asm volatile("cp.async.wait_group 1;"); /* V(k0) is in */
        else asm volatile("cp.async.wait_group 0;");
        __syncthreads();
        /* O += P V: k = keys (4 steps of 16), n = head dims (pairs of 8-wide tiles) */
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                uint32_t b[4];
                int mi = lane >> 3;
                ldmatrix_x4_trans(b, vs + (kk * 16 + (mi & 1) * 8 + (lane & 7)) * LD + np * 16 + (mi >> 1) * 8);
                mma_bf16_16816(o[2 * np], pa[kk], b[0], b[1]);
                mma_bf16_16816(o[2 * np + 1], pa[kk], b[2], b[3]);
            }
        }
        __syncthreads(); /* every warp is done with V(k0) */
        if (more) pf_load_kv<HD>(vs, vc, bt, bs, K, g, k0 + PF_K, kend);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        if (sinks) /* m is in log2 units (log2 e is folded into qscale) */
            l[r] += exp2f(bf2f(sinks[h]) * 1.4426950408889634f - m[r]);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = warp * 16 + qr + r * 8;
        if (row >= cnt) continue;
        float inv = l[r] > 0.f ? vscale / l[r] : 0.f; /* vscale: an FP8 cache's V scale */
        float *dst = out + (size_t)(t0 + row) * H * HD + (size_t)h * HD;
#pragma unroll
        for (int i = 0; i < NT; i++)
            *(float2 *)(dst + i * 8 + qc) = make_float2(o[i][r * 2] * inv, o[i][r * 2 + 1] * inv);
    }
}

/* atlas_attn_prefill<HD>: grid (n_tiles, H), block 128, dynamic smem 2 * 64 * (HD + 8) * 2
 * bytes (34 KiB at 128). */
#define ATLAS_ATTN_PREFILL(HD)                                                                    \
    extern "C" __global__ void __launch_bounds__(PF_THREADS) atlas_attn_prefill##HD(             \
        float *out, const float *qkv, const bf16_t *kc, const bf16_t *vc, const int *tiles,       \
        const int *tok_seq, const int *positions, const int *block_table, int max_blocks, int bs, \
        int H, int K, int window, float qscale, const bf16_t *sinks) {                           \
        pdl_trigger();                                                                           \
        pdl_wait();                                                                              \
        pf_body<HD, bf16_t>(out, qkv, kc, vc, tiles, tok_seq, positions, block_table,          \
                            max_blocks, bs, H, K, window, qscale, sinks, 1.0f);                  \
    }                                                                                            \
    /* over an FP8 cache: qscale holds the K scale, vscale is the V scale */                    \
    extern "C" __global__ void __launch_bounds__(PF_THREADS) atlas_attn_prefill##HD##_fp8(       \
        float *out, const float *qkv, const fp8_t *kc, const fp8_t *vc, const int *tiles,         \
        const int *tok_seq, const int *positions, const int *block_table, int max_blocks, int bs, \
        int H, int K, int window, float qscale, const bf16_t *sinks, float vscale) {             \
        pdl_trigger();                                                                           \
        pdl_wait();                                                                              \
        pf_body<HD, fp8_t>(out, qkv, kc, vc, tiles, tok_seq, positions, block_table,           \
                           max_blocks, bs, H, K, window, qscale, sinks, vscale);                 \
    }
ATLAS_ATTN_PREFILL(64) ATLAS_ATTN_PREFILL(80) ATLAS_ATTN_PREFILL(96) ATLAS_ATTN_PREFILL(128)

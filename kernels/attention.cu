/* kernels/attention.cu — causal attention over the paged KV cache, split over the context
 * ("flash decoding") and GQA-aware.
 *
 * atlas_attn_split: one block per (token, kv head, context chunk). The G = H / K query heads
 * that share the kv head are done together, so each K/V row is read once for all of them.
 * It writes the chunk's unnormalised output with its running max and sum; atlas_attn_combine
 * merges the chunks. The chunk count depends only on the cache capacity of the batch, so a
 * decode step keeps the same launch shape from step to step (CUDA graph replay); chunks past
 * a token's context exit at once.
 *
 * Token t of sequence s = tok_seq[t] at position p attends to positions [p - window + 1, p]
 * (window 0: [0, p]), each at slot block_table[s * max_blocks + q / bs] * bs + q % bs.
 *
 * Sinks (gpt-oss; NULL: none): a logit per query head, sinks[H] (bf16, in the units of the
 * scaled scores), that joins each softmax's denominator and adds no value. Every kernel adds
 * it where it normalises: with the running max M and sum L of the keys, the output is
 * o / (L + exp(sink - M)) (sink_sum); an exp that overflows gives 0, the limit.
 *
 * An FP8 cache (the _fp8 kernels of atlas_attn_split and atlas_attn_dec, kv8.cuh): K and V are
 * e4m3 codes read into floats; the layer's K scale comes folded into the scale of q (the host
 * multiplies them) and its V scale, vscale, multiplies each split's output before it is
 * written (the merges are linear in it). The cluster kernels take bf16 only. */
#include "common.cuh"
#include "kv8.cuh"

#include <cooperative_groups.h>

enum { ATTN_THREADS = 128 };

/* The denominator L of a head whose keys' max is M, with head h's sink (natural log units). */
__device__ __forceinline__ float sink_sum(float L, float M, const bf16_t *sinks, int h) {
    return sinks ? L + __expf(bf2f(sinks[h]) - M) : L;
}

/* The last split of (t, kv head g) to finish merges all of them into out (the counters
 * return to 0 for the next launch). Called by every thread of each split's block after its
 * part_o / part_ml are written. */
__device__ void merge_last_split(const float *part_o, const float *part_ml, float *out,
                                 int *counters, int t, int g, int H, int K, int G, int hd,
                                 int n_split, const bf16_t *sinks) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        int *ctr = counters + (size_t)t * K + g;
        last = atomicAdd(ctr, 1) == n_split - 1;
        if (last) *ctr = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    size_t base = ((size_t)t * H + (size_t)g * G) * n_split;
    /* the weight of every (head, split) first, all loads at once, into shared memory; then
     * each output sums its splits' partials with independent loads (the loop-carried version
     * chained 2 x n_split L2 round trips an output, ~20 us at 16 splits) */
    enum { MERGE_MAX = 512 }; /* wgt + sums: the 4 KiB attn_tile (ops_cuda.c) leaves for them */
    __shared__ float wgt[MERGE_MAX], sums[MERGE_MAX], norm[8];
    if (G * n_split <= MERGE_MAX && G <= 8) {
        for (int j = threadIdx.x; j < G * n_split; j += blockDim.x) {
            float2 ml = __ldcg((const float2 *)part_ml + base + j); /* (m, l) of (head j / n_split, split j % n_split) */
            wgt[j] = ml.x;
            sums[j] = ml.y;
        }
        __syncthreads();
        for (int h = threadIdx.x; h < G; h += blockDim.x) {
            float M = -INFINITY;
            for (int x = 0; x < n_split; x++) M = fmaxf(M, wgt[h * n_split + x]);
            float L = 0.0f;
            for (int x = 0; x < n_split; x++) {
                float m = wgt[h * n_split + x];
                float e = m == -INFINITY ? 0.0f : __expf(m - M);
                L += sums[h * n_split + x] * e;
                wgt[h * n_split + x] = e;
            }
            L = sink_sum(L, M, sinks, g * G + h);
            norm[h] = L > 0.0f ? 1.0f / L : 0.0f;
        }
        __syncthreads();
        for (int idx = threadIdx.x; idx < G * hd; idx += blockDim.x) {
            int h = idx / hd, i = idx - h * hd;
            const float *po = part_o + (base + (size_t)h * n_split) * hd + i;
            const float *wh = wgt + h * n_split;
            float acc = 0.0f;
#pragma unroll 8
            for (int x = 0; x < n_split; x++) acc += __ldcg(po + (size_t)x * hd) * wh[x];
            out[((size_t)t * H + (size_t)g * G + h) * hd + i] = acc * norm[h];
        }
        return;
    }
    for (int idx = threadIdx.x; idx < G * hd; idx += blockDim.x) {
        int h = idx / hd, i = idx - h * hd;
        size_t b = base + (size_t)h * n_split;
        float M = -INFINITY, L = 0.0f, acc = 0.0f;
        for (int x = 0; x < n_split; x++) M = fmaxf(M, __ldcg(part_ml + (b + x) * 2));
        for (int x = 0; x < n_split; x++) {
            float m = __ldcg(part_ml + (b + x) * 2);
            if (m == -INFINITY) continue;
            float e = __expf(m - M);
            L += __ldcg(part_ml + (b + x) * 2 + 1) * e;
            acc += __ldcg(part_o + (b + x) * hd + i) * e;
        }
        L = sink_sum(L, M, sinks, g * G + h);
        out[((size_t)t * H + (size_t)g * G + h) * hd + i] = L > 0.0f ? acc / L : 0.0f;
    }
}

/* One block: token t, GB query heads hb .. hb + GB - 1 (hb = blockIdx.y * GB; GB divides
 * G = H / K, so they share kv head g = hb / G: GB = G reads each K/V row once for the whole
 * group, a smaller GB bounds the shared memory of large groups, as MQA's), split s covering
 * context positions [start + s*chunk, ..), walked in tiles of `tile` keys with an online
 * softmax. grid (n, H / GB, n_split); counters [n, H / GB].
 * smem: q[GB*hd], o[GB*hd], scores[GB*tile], slots[tile] (int), m[GB], l[GB], alpha[GB]. */
/* 8 elements of a cache row at p as floats: bf16 (one 16-byte load) or e4m3 (8 bytes). */
__device__ __forceinline__ void kv_row8(const bf16_t *p, float f[8]) {
    unpack8(*(const uint4 *)p, f);
}
__device__ __forceinline__ void kv_row8(const fp8_t *p, float f[8]) {
    float (&g)[8] = *reinterpret_cast<float (*)[8]>(f);
    load_fp8<8>(p, g);
}
__device__ __forceinline__ float kv_elem(const bf16_t *p) { return bf2f(*p); }
__device__ __forceinline__ float kv_elem(const fp8_t *p) { return fp8x2(*p).x; }

template <class KT>
__device__ __forceinline__ void attn_split_body(float *part_o, float *part_ml, const float *qkv,
                                                const KT *kc, const KT *vc, const int *tok_seq,
                                                const int *positions, const int *block_table,
                                                int max_blocks, int bs, int H, int K, int hd,
                                                int GB, int window, int chunk, int tile,
                                                float scale, float *out, int *counters,
                                                const bf16_t *sinks, float vscale) {
    pdl_trigger();
    pdl_wait();
    extern __shared__ __align__(16) float smem[];
    int t = blockIdx.x, s = blockIdx.z, n_split = gridDim.z;
    int hb = blockIdx.y * GB, g = hb / (H / K), G = GB; /* G: the block's heads from here on */
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float *q = smem, *o = q + G * hd, *sc = o + G * hd;
    int *slots = (int *)(sc + G * tile);
    float *mrun = (float *)(slots + tile), *lrun = mrun + G, *alpha = lrun + G;

    int pos = positions[t];
    int start = window > 0 ? max(0, pos - window + 1) : 0;
    int j0 = start + s * chunk, j1 = min(j0 + chunk, pos + 1);
    size_t po = ((size_t)t * H + hb) * n_split + s; /* (t, head hb, split s) */
    const float *qrow = qkv + (size_t)t * (H + 2 * K) * hd + (size_t)hb * hd;
    for (int i = tid; i < G * hd; i += ATTN_THREADS) {
        q[i] = qrow[i] * scale;
        o[i] = 0.0f;
    }
    for (int h = tid; h < G; h += ATTN_THREADS) { mrun[h] = -INFINITY; lrun[h] = 0.0f; }
    const int *bt = block_table + (size_t)tok_seq[t] * max_blocks;

    for (int a0 = j0; a0 < j1; a0 += tile) {
        int len = min(tile, j1 - a0);
        __syncthreads(); /* the previous tile's readers are done */
        for (int j = tid; j < len; j += ATTN_THREADS) {
            int p = a0 + j;
            slots[j] = bt[p / bs] * bs + p % bs;
        }
        __syncthreads();
        for (int idx = tid; idx < G * len; idx += ATTN_THREADS) { /* scores[h][j] = q_h . k_j */
            int h = idx / len, j = idx - h * len;
            const KT *kr = kc + ((size_t)slots[j] * K + g) * hd;
            const float *qh = q + h * hd;
            float d = 0.0f;
#pragma unroll 4
            for (int i = 0; i < hd; i += 8) {
                float f[8];
                kv_row8(kr + i, f);
#pragma unroll
                for (int e = 0; e < 8; e++) d += f[e] * qh[i + e];
            }
            sc[h * tile + j] = d;
        }
        __syncthreads();
        for (int h = warp; h < G; h += ATTN_THREADS / 32) { /* online softmax, a warp a head */
            float mx = mrun[h];
            for (int j = lane; j < len; j += 32) mx = fmaxf(mx, sc[h * tile + j]);
            mx = warp_max(mx);
            float sum = 0.0f;
            for (int j = lane; j < len; j += 32) {
                float e = __expf(sc[h * tile + j] - mx);
                sc[h * tile + j] = e;
                sum += e;
            }
            sum = warp_sum(sum);
            if (lane == 0) {
                float al = __expf(mrun[h] - mx); /* 0 on the first tile (-inf) */
                alpha[h] = al;
                lrun[h] = lrun[h] * al + sum;
                mrun[h] = mx;
            }
        }
        __syncthreads();
        for (int idx = tid; idx < G * hd; idx += ATTN_THREADS) { /* o = o*alpha + p v */
            int h = idx / hd, i = idx - h * hd;
            const float *p = sc + h * tile;
            const KT *vb = vc + (size_t)g * hd + i;
            float acc = 0.0f;
#pragma unroll 8
            for (int j = 0; j < len; j++) acc += p[j] * kv_elem(vb + (size_t)slots[j] * K * hd);
            o[idx] = o[idx] * alpha[h] + acc;
        }
    }
    __syncthreads();
    for (int idx = tid; idx < G * hd; idx += ATTN_THREADS)
        part_o[(po + (size_t)(idx / hd) * n_split) * hd + idx % hd] = o[idx] * vscale;
    for (int h = tid; h < G; h += ATTN_THREADS) {
        part_ml[(po + (size_t)h * n_split) * 2] = mrun[h];
        part_ml[(po + (size_t)h * n_split) * 2 + 1] = lrun[h];
    }
    /* merge_last_split's (kv head g of K, G heads) are this block's (head group y of H / GB) */
    if (counters)
        merge_last_split(part_o, part_ml, out, counters, t, blockIdx.y, H, gridDim.y, G, hd,
                         n_split, sinks);
}

extern "C" __global__ void __launch_bounds__(ATTN_THREADS)
atlas_attn_split(float *part_o, float *part_ml, const float *qkv, const bf16_t *kc,
                 const bf16_t *vc, const int *tok_seq, const int *positions,
                 const int *block_table, int max_blocks, int bs, int H, int K, int hd, int GB,
                 int window, int chunk, int tile, float scale, float *out, int *counters,
                 const bf16_t *sinks) {
    attn_split_body<bf16_t>(part_o, part_ml, qkv, kc, vc, tok_seq, positions, block_table,
                            max_blocks, bs, H, K, hd, GB, window, chunk, tile, scale, out,
                            counters, sinks, 1.0f);
}

/* atlas_attn_split over an FP8 cache: scale holds the layer's K scale, vscale its V scale. */
extern "C" __global__ void __launch_bounds__(ATTN_THREADS)
atlas_attn_split_fp8(float *part_o, float *part_ml, const float *qkv, const fp8_t *kc,
                     const fp8_t *vc, const int *tok_seq, const int *positions,
                     const int *block_table, int max_blocks, int bs, int H, int K, int hd, int GB,
                     int window, int chunk, int tile, float scale, float *out, int *counters,
                     const bf16_t *sinks, float vscale) {
    attn_split_body<fp8_t>(part_o, part_ml, qkv, kc, vc, tok_seq, positions, block_table,
                           max_blocks, bs, H, K, hd, GB, window, chunk, tile, scale, out,
                           counters, sinks, vscale);
}

/* out[t, h*hd + i] = merged chunks. grid (n, H), block >= 32. */
extern "C" __global__ void atlas_attn_combine(float *out, const float *part_o, const float *part_ml,
                                              int H, int hd, int n_split, const bf16_t *sinks) {
    pdl_trigger();
    pdl_wait();
    int t = blockIdx.x, h = blockIdx.y;
    size_t base = ((size_t)t * H + h) * n_split;
    float M = -INFINITY;
    for (int s = 0; s < n_split; s++) M = fmaxf(M, part_ml[(base + s) * 2]);
    float L = 0.0f;
    for (int s = 0; s < n_split; s++) {
        float m = part_ml[(base + s) * 2];
        if (m > -INFINITY) L += part_ml[(base + s) * 2 + 1] * __expf(m - M);
    }
    L = sink_sum(L, M, sinks, h);
    float inv = L > 0.0f ? 1.0f / L : 0.0f;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < n_split; s++) {
            float m = part_ml[(base + s) * 2];
            if (m > -INFINITY) o += part_o[(base + s) * hd + i] * __expf(m - M);
        }
        out[((size_t)t * H + h) * hd + i] = o * inv;
    }
}

/* --- decode attention, a warp per key ---------------------------------------------------------
 * Same grid and outputs as atlas_attn_split (but split s covers the s-th n_split-th of the
 * token's own context, whatever the batch's capacity), for head_dim HD in {64, 128, 256}
 * and up to GM query heads per kv head. The split kernel above walks a tile's dot products
 * one thread each and its p.v loop one key after another, so a block spends its time waiting
 * on loads; here each of the 4 warps takes a contiguous quarter of the block's keys, a lane
 * holds HD/32 dimensions of every query head, and U keys' K and V rows (HD*2 bytes each,
 * coalesced across the warp) are requested before any is used. Scores are reduced across the
 * warp with shuffles, the softmax is online per warp, and the 4 warps merge through shared
 * memory. With one split the block writes the output; otherwise its partials, merged by the
 * last split to finish (counters) or by atlas_attn_combine. */
enum { DEC_WARPS = 4 };

/* The keys [a0, a1) of warp `warp` (of `warps`) in split s (of n_split) of a token at pos:
 * the splits share the token's own context (the last `window` keys when window > 0), the
 * warps share their split. */
__device__ __forceinline__ void dec_warp_keys(int pos, int window, int s, int n_split, int warp,
                                              int warps, int *a0, int *a1) {
    int start = window > 0 ? max(0, pos - window + 1) : 0;
    int ch = (pos + 1 - start + n_split - 1) / n_split;
    int j0 = start + s * ch, j1 = min(j0 + ch, pos + 1);
    int per = j1 > j0 ? (j1 - j0 + warps - 1) / warps : 0;
    *a0 = j0 + warp * per;
    *a1 = min(*a0 + per, j1);
}

/* The slots of a warp's keys [a0, a1): the warp keeps 32 of its block-table entries, one a
 * lane (from block wb), so that a key's slot bt[p / bs] * bs + p % bs is a shuffle away
 * instead of a load before its K/V loads; shifts for the usual power-of-two bs. */
struct dec_slots {
    const int *bt;
    int bs, bsh, nb, wb, btv;
    __device__ dec_slots(const int *table, int block_size, int a0, int a1)
        : bt(table), bs(block_size) {
        bsh = (bs & (bs - 1)) == 0 ? __ffs(bs) - 1 : -1;
        nb = a1 > a0 ? (a1 - 1) / bs + 1 : 0;
        wb = a0 / bs;
        btv = fetch();
    }
    __device__ int fetch() const {
        int lane = threadIdx.x & 31;
        return wb + lane < nb ? bt[wb + lane] : 0;
    }
    /* keys a .. last are to be looked up (warp-uniform): refill past the 32 held entries */
    __device__ void cover(int a, int last) {
        if (last / bs - wb >= 32) {
            wb = a / bs;
            btv = fetch();
        }
    }
    /* the cache block of key pc (a key of the covered range); every lane calls it */
    __device__ int block(int pc) const {
        return __shfl_sync(0xffffffffu, btv, (bsh >= 0 ? pc >> bsh : pc / bs) - wb);
    }
    /* key p's slot, blk = block(p) */
    __device__ size_t slot(int blk, int p) const {
        return (size_t)blk * bs + (bsh >= 0 ? p & (bs - 1) : p % bs);
    }
    /* N keys p = key(u) of the covered range (u < N, unrolled: each u is registers): those
     * in [lo, hi) and before a1 by load(u, slot), those past a1 by zero(u); the rest are
     * left as they are (loaded by another call). Every lane takes part in the shuffles. */
    template <int N, class Key, class Load, class Zero>
    __device__ __forceinline__ void load(int a1, int lo, int hi, Key key, Load ld,
                                         Zero zero) const {
#pragma unroll
        for (int u = 0; u < N; u++) {
            int p = key(u), blk = block(min(p, a1 - 1));
            if (p < a1 && p >= lo && p < hi) ld(u, slot(blk, p));
            else if (p >= a1) zero(u);
        }
    }
};

template <int D>
__device__ __forceinline__ void load_bf16(const bf16_t *p, float (&f)[D]) {
    if constexpr (D == 2) {
        uint32_t u = *(const uint32_t *)p;
        f[0] = __uint_as_float(u << 16);
        f[1] = __uint_as_float(u & 0xffff0000u);
    } else if constexpr (D == 4) {
        uint2 u = *(const uint2 *)p;
        f[0] = __uint_as_float(u.x << 16); f[1] = __uint_as_float(u.x & 0xffff0000u);
        f[2] = __uint_as_float(u.y << 16); f[3] = __uint_as_float(u.y & 0xffff0000u);
    } else {
        unpack8(*(const uint4 *)p, (float *)f);
    }
}

/* D elements of a cache row into floats, as the cache holds them. */
template <int D>
__device__ __forceinline__ void load_kv(const bf16_t *p, float (&f)[D]) { load_bf16<D>(p, f); }
template <int D>
__device__ __forceinline__ void load_kv(const fp8_t *p, float (&f)[D]) { load_fp8<D>(p, f); }

template <int HD, int GM, class KT>
__device__ __forceinline__ void attn_decode_body(float *part_o, float *part_ml, const float *qkv,
                                                 const KT *kc, const KT *vc,
                                                 const int *tok_seq, const int *positions,
                                                 const int *block_table, int max_blocks, int bs,
                                                 int H, int K, int window, int chunk, float scale,
                                                 float *out, int *counters, int early,
                                                 const bf16_t *sinks, float vscale) {
    constexpr int D = HD / 32, U = HD >= 256 ? 4 : 8;
    pdl_trigger();
    int t = blockIdx.x, s = blockIdx.z, n_split = gridDim.z;
    int G = H / K, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int g = blockIdx.y; /* the block's query heads: all G of kv head g */
    /* the splits share the token's own context, not the batch's capacity (chunk, unused
     * here): with a cache sized for 4096 slots and 516 keys, a capacity-sized chunk put all
     * of them in one block of each kv head (16 us a layer in the 8B decode step) */
    (void)chunk;
    int pos = positions[t], a0, a1;
    dec_warp_keys(pos, window, s, n_split, warp, DEC_WARPS, &a0, &a1);

    size_t row = (size_t)K * HD; /* elements between consecutive slots */
    const KT *kbase = kc + (size_t)g * HD + lane * D, *vbase = vc + (size_t)g * HD + lane * D;
    dec_slots keys(block_table + (size_t)tok_seq[t] * max_blocks, bs, a0, a1);

    /* K and V rows of keys [a, a + U) with lo <= p < hi into kf, vf (0 past a1) */
    float kf[U][D], vf[U][D];
    auto load_keys = [&](int a, int lo, int hi) {
        keys.cover(a, min(a + U, a1) - 1);
        keys.load<U>(
            a1, lo, hi, [&](int u) { return a + u; },
            [&](int u, size_t slot) {
                load_kv<D>(kbase + slot * row, kf[u]);
                load_kv<D>(vbase + slot * row, vf[u]);
            },
            [&](int u) {
#pragma unroll
                for (int i = 0; i < D; i++) kf[u][i] = vf[u][i] = 0.0f;
            });
    };
    /* early (every token of the batch its own sequence): the keys before the token's own
     * were written by earlier batches, so their loads go out before the wait for the
     * previous kernel, which writes this token's key and q (staged indices and block
     * tables come before every kernel of the batch) */
    if (a0 < a1) load_keys(a0, 0, early ? pos : 0);
    pdl_wait();
    float q[GM][D], acc[GM][D], m[GM], l[GM];
    const float *qrow = qkv + (size_t)t * (H + 2 * K) * HD + (size_t)g * G * HD + lane * D;
#pragma unroll
    for (int h = 0; h < GM; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
        if (h < G) { /* D consecutive floats: one or two vector loads */
            if constexpr (D == 2) {
                float2 v = *(const float2 *)(qrow + (size_t)h * HD);
                q[h][0] = v.x, q[h][1] = v.y;
            } else {
#pragma unroll
                for (int i = 0; i < D; i += 4) {
                    float4 v = *(const float4 *)(qrow + (size_t)h * HD + i);
                    q[h][i] = v.x, q[h][i + 1] = v.y, q[h][i + 2] = v.z, q[h][i + 3] = v.w;
                }
            }
        }
#pragma unroll
        for (int i = 0; i < D; i++) {
            q[h][i] = h < G ? q[h][i] * scale : 0.0f;
            acc[h][i] = 0.0f;
        }
    }
    if (a0 < a1) load_keys(a0, early ? pos : 0, 1 << 30);
    for (int a = a0; a < a1; a += U) {
        if (a > a0) load_keys(a, 0, 1 << 30);
#pragma unroll
        for (int h = 0; h < GM; h++) {
            if (h >= G) break;
            float sc[U], mx = m[h];
#pragma unroll
            for (int u = 0; u < U; u++) {
                float d = 0.0f;
#pragma unroll
                for (int i = 0; i < D; i++) d += q[h][i] * kf[u][i];
                d = warp_sum(d);
                sc[u] = a + u < a1 ? d : -INFINITY;
                mx = fmaxf(mx, sc[u]);
            }
            float alpha = __expf(m[h] - mx); /* 0 on the first keys (m = -inf, mx finite) */
            m[h] = mx;
            l[h] *= alpha;
#pragma unroll
            for (int i = 0; i < D; i++) acc[h][i] *= alpha;
#pragma unroll
            for (int u = 0; u < U; u++) {
                float e = __expf(sc[u] - mx); /* 0 past a1 */
                l[h] += e;
#pragma unroll
                for (int i = 0; i < D; i++) acc[h][i] += e * vf[u][i];
            }
        }
    }

    /* merge the warps: (m, l, acc) of each through shared memory */
    __shared__ float sm[DEC_WARPS][GM], sl[DEC_WARPS][GM];
    __shared__ __align__(16) float so[DEC_WARPS][GM][HD];
#pragma unroll
    for (int h = 0; h < GM; h++) {
        if (lane == 0) {
            sm[warp][h] = m[h];
            sl[warp][h] = l[h];
        }
#pragma unroll
        for (int i = 0; i < D; i++) so[warp][h][lane * D + i] = acc[h][i];
    }
    __syncthreads();
    size_t po = ((size_t)t * H + (size_t)g * G) * n_split + s; /* (t, head g*G, split s) */
    for (int idx = threadIdx.x; idx < G * HD; idx += DEC_WARPS * 32) {
        int h = idx / HD, i = idx - h * HD;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; w++) M = fmaxf(M, sm[w][h]);
        float L = 0.0f, o = 0.0f;
        if (M > -INFINITY) {
#pragma unroll
            for (int w = 0; w < DEC_WARPS; w++) {
                float e = __expf(sm[w][h] - M); /* 0 for a warp without keys */
                L += sl[w][h] * e;
                o += so[w][h][i] * e;
            }
        }
        o *= vscale; /* an FP8 cache's V scale (1 for bf16) */
        if (n_split == 1) {
            L = sink_sum(L, M, sinks, g * G + h);
            out[((size_t)t * H + (size_t)g * G + h) * HD + i] = L > 0.0f ? o / L : 0.0f;
        } else {
            part_o[(po + (size_t)h * n_split) * HD + i] = o;
            if (i == 0) {
                part_ml[(po + (size_t)h * n_split) * 2] = M;
                part_ml[(po + (size_t)h * n_split) * 2 + 1] = L;
            }
        }
    }
    if (n_split > 1 && counters)
        merge_last_split(part_o, part_ml, out, counters, t, g, H, K, G, HD, n_split, sinks);
}

/* atlas_attn_dec<HD>_g<GM>: grid (n, K, n_split), block 128, up to GM query heads a kv head,
 * the arguments of atlas_attn_split without hd and tile, and early (chunk is unused: each
 * split covers its share of the token's own context). With one split, out is written
 * directly (no combine needed). */
#define ATLAS_ATTN_DEC(HD, GM)                                                                    \
    extern "C" __global__ void __launch_bounds__(DEC_WARPS * 32) atlas_attn_dec##HD##_g##GM(     \
        float *part_o, float *part_ml, const float *qkv, const bf16_t *kc, const bf16_t *vc,     \
        const int *tok_seq, const int *positions, const int *block_table, int max_blocks, int bs, \
        int H, int K, int window, int chunk, float scale, float *out, int *counters,            \
        int early, const bf16_t *sinks) {                                                        \
        attn_decode_body<HD, GM, bf16_t>(part_o, part_ml, qkv, kc, vc, tok_seq, positions,     \
                                         block_table, max_blocks, bs, H, K, window, chunk, scale, \
                                         out, counters, early, sinks, 1.0f);                    \
    }                                                                                            \
    /* over an FP8 cache: scale holds the K scale, vscale is the V scale */                     \
    extern "C" __global__ void __launch_bounds__(DEC_WARPS * 32)                                 \
        atlas_attn_dec##HD##_g##GM##_fp8(                                                        \
            float *part_o, float *part_ml, const float *qkv, const fp8_t *kc, const fp8_t *vc,   \
            const int *tok_seq, const int *positions, const int *block_table, int max_blocks,    \
            int bs, int H, int K, int window, int chunk, float scale, float *out, int *counters, \
            int early, const bf16_t *sinks, float vscale) {                                      \
        attn_decode_body<HD, GM, fp8_t>(part_o, part_ml, qkv, kc, vc, tok_seq, positions,      \
                                        block_table, max_blocks, bs, H, K, window, chunk, scale, \
                                        out, counters, early, sinks, vscale);                    \
    }
ATLAS_ATTN_DEC(64, 1) ATLAS_ATTN_DEC(64, 2) ATLAS_ATTN_DEC(64, 4) ATLAS_ATTN_DEC(64, 8)
ATLAS_ATTN_DEC(128, 1) ATLAS_ATTN_DEC(128, 2) ATLAS_ATTN_DEC(128, 4) ATLAS_ATTN_DEC(128, 8)
ATLAS_ATTN_DEC(256, 1) ATLAS_ATTN_DEC(256, 2) ATLAS_ATTN_DEC(256, 4) ATLAS_ATTN_DEC(256, 8)

/* --- decode attention in thread-block clusters ------------------------------------------------
 * atlas_attn_dcl<HD>_g<GM>[_w4]: grid (n, H / GM, n_split), 8 (4) warps a block, GM query
 * heads of one kv head a block, the n_split <= 8 splits of each (token, kv head group) one cluster
 * (sm_90+, cluster (1, 1, n_split)) that merges through distributed shared memory at the
 * end. The kernel above gives a key to a whole warp (D = HD / 32 dimensions a lane), so each
 * score costs a 5-step shuffle reduction per query head, and a warp's 8 keys a pass left its
 * second pass mostly idle at 9-10 keys a warp (516-640 keys, 8 splits, 8 warps): ncu counted
 * 3,030 instructions a warp at 7.4 cycles each, 16.7 us, for 2.6 MB of keys and values. Here
 * a warp is 4 groups of 8 lanes, each group its own key (a lane holds HD / 8 dimensions):
 * 3 shuffle steps a score, UK keys a group in a pass (4 UK a warp; UK = 3 took 0.055 ms off
 * the 8B step against 2: one pass up to 768 keys), scores in the log2 domain (q pre-scaled
 * by log2 e, in shared memory so that registers hold acc and keys: 231 at GM 4), and the
 * groups merge by shuffles once at the end. HD 64 and 128, GM <= 4. */
template <int HD, int GM, int UK, int WARPS>
__device__ __forceinline__ void attn_dcl_body(const float *qkv, const bf16_t *kc,
                                              const bf16_t *vc, const int *tok_seq,
                                              const int *positions, const int *block_table,
                                              int max_blocks, int bs, int H, int K, int window,
                                              float scale, float *out, int early,
                                              const bf16_t *sinks) {
    constexpr int LG = 8, NG = 32 / LG, DL = HD / LG, NV = DL / 8, KP = NG * UK;
    pdl_trigger();
    int t = blockIdx.x, s = blockIdx.z, n_split = gridDim.z;
    int G = H / K, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, grp = lane / LG,
        li = lane % LG;
    int hb = blockIdx.y * GM, g = hb / G;
    int pos = positions[t], a0, a1;
    dec_warp_keys(pos, window, s, n_split, warp, WARPS, &a0, &a1);

    size_t row = (size_t)K * HD;
    const bf16_t *kbase = kc + (size_t)g * HD + li * DL, *vbase = vc + (size_t)g * HD + li * DL;
    dec_slots keys(block_table + (size_t)tok_seq[t] * max_blocks, bs, a0, a1);
    /* a pass: keys a + u * NG + grp (u < UK) of group grp, their K and V slices packed */
    uint4 kr[UK][NV], vr[UK][NV];
    auto load_keys = [&](int a, int lo, int hi) {
        keys.cover(a, min(a + KP, a1) - 1);
        keys.load<UK>(
            a1, lo, hi, [&](int u) { return a + u * NG + grp; },
            [&](int u, size_t slot) {
#pragma unroll
                for (int v = 0; v < NV; v++) {
                    kr[u][v] = *(const uint4 *)(kbase + slot * row + v * 8);
                    vr[u][v] = *(const uint4 *)(vbase + slot * row + v * 8);
                }
            },
            [&](int u) {
#pragma unroll
                for (int v = 0; v < NV; v++) kr[u][v] = vr[u][v] = make_uint4(0, 0, 0, 0);
            });
    };
    /* keys older than the batch before the wait (see attn_decode_body) */
    if (a0 < a1) load_keys(a0, 0, early ? pos : 0);
    pdl_wait();
    /* the block's GM query rows, scaled, in shared memory: registers go to acc and keys */
    __shared__ __align__(16) float sq[GM][HD];
    const float *qrow = qkv + (size_t)t * (H + 2 * K) * HD + (size_t)hb * HD;
    const float qs = scale * 1.4426950408889634f;
    for (int i = threadIdx.x; i < GM * HD; i += WARPS * 32) sq[i / HD][i % HD] = qrow[i] * qs;
    float acc[GM][DL], m[GM], l[GM];
#pragma unroll
    for (int h = 0; h < GM; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
#pragma unroll
        for (int i = 0; i < DL; i++) acc[h][i] = 0.0f;
    }
    __syncthreads();
    if (a0 < a1) load_keys(a0, early ? pos : 0, 1 << 30);
    for (int a = a0; a < a1; a += KP) {
        if (a > a0) load_keys(a, 0, 1 << 30);
        float kf[UK][DL];
#pragma unroll
        for (int u = 0; u < UK; u++)
#pragma unroll
            for (int v = 0; v < NV; v++) unpack8(kr[u][v], &kf[u][v * 8]);
        float sc[GM][UK];
#pragma unroll
        for (int h = 0; h < GM; h++) {
            float q[DL];
#pragma unroll
            for (int i = 0; i < DL; i += 4) {
                float4 v = *(const float4 *)&sq[h][li * DL + i];
                q[i] = v.x, q[i + 1] = v.y, q[i + 2] = v.z, q[i + 3] = v.w;
            }
#pragma unroll
            for (int u = 0; u < UK; u++) {
                float d = 0.0f;
#pragma unroll
                for (int i = 0; i < DL; i++) d += q[i] * kf[u][i];
                sc[h][u] = d;
            }
        }
#pragma unroll
        for (int off = LG / 2; off >= 1; off /= 2) /* within the group: xor < LG */
#pragma unroll
            for (int h = 0; h < GM; h++)
#pragma unroll
                for (int u = 0; u < UK; u++) sc[h][u] += __shfl_xor_sync(0xffffffffu, sc[h][u], off);
        float vf[UK][DL];
#pragma unroll
        for (int u = 0; u < UK; u++)
#pragma unroll
            for (int v = 0; v < NV; v++) unpack8(vr[u][v], &vf[u][v * 8]);
#pragma unroll
        for (int h = 0; h < GM; h++) {
            float mx = m[h];
#pragma unroll
            for (int u = 0; u < UK; u++) {
                if (a + u * NG + grp >= a1) sc[h][u] = -INFINITY;
                mx = fmaxf(mx, sc[h][u]);
            }
            float base = mx == -INFINITY ? 0.0f : mx; /* a group with no key yet */
            float alpha = exp2f(m[h] - base);         /* 0 while m is -inf */
            m[h] = mx;
            l[h] *= alpha;
            float e[UK];
#pragma unroll
            for (int u = 0; u < UK; u++) {
                e[u] = exp2f(sc[h][u] - base); /* 0 past a1 */
                l[h] += e[u];
            }
#pragma unroll
            for (int i = 0; i < DL; i++) {
                float o = acc[h][i] * alpha;
#pragma unroll
                for (int u = 0; u < UK; u++) o += e[u] * vf[u][i];
                acc[h][i] = o;
            }
        }
    }
    /* the 4 groups of the warp into one (every group ends with the same result) */
#pragma unroll
    for (int off = LG; off < 32; off *= 2)
#pragma unroll
        for (int h = 0; h < GM; h++) {
            float mo = __shfl_xor_sync(0xffffffffu, m[h], off);
            float lo = __shfl_xor_sync(0xffffffffu, l[h], off);
            float M = fmaxf(m[h], mo), base = M == -INFINITY ? 0.0f : M;
            float ea = exp2f(m[h] - base), eb = exp2f(mo - base);
            l[h] = l[h] * ea + lo * eb;
            m[h] = M;
#pragma unroll
            for (int i = 0; i < DL; i++)
                acc[h][i] = acc[h][i] * ea + __shfl_xor_sync(0xffffffffu, acc[h][i], off) * eb;
        }
    __shared__ float sm[WARPS][GM], sl[WARPS][GM];
    __shared__ __align__(16) float so[WARPS][GM][HD];
    if (grp == 0) {
#pragma unroll
        for (int h = 0; h < GM; h++) {
            if (li == 0) sm[warp][h] = m[h], sl[warp][h] = l[h];
#pragma unroll
            for (int i = 0; i < DL; i += 4)
                *(float4 *)&so[warp][h][li * DL + i] =
                    make_float4(acc[h][i], acc[h][i + 1], acc[h][i + 2], acc[h][i + 3]);
        }
    }
    __syncthreads();
    /* the warps into the block's (m, l, o), kept in shared memory for the cluster */
    __shared__ float cm[GM], cl[GM];
    __shared__ __align__(16) float co[GM][HD];
    for (int idx = threadIdx.x; idx < GM * HD; idx += WARPS * 32) {
        int h = idx / HD, i = idx - h * HD;
        float M = -INFINITY, L = 0.0f, o = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; w++) M = fmaxf(M, sm[w][h]);
        float base = M == -INFINITY ? 0.0f : M;
#pragma unroll
        for (int w = 0; w < WARPS; w++) {
            float e = exp2f(sm[w][h] - base); /* 0 for a warp without keys */
            L += sl[w][h] * e;
            o += so[w][h][i] * e;
        }
        co[h][i] = o;
        if (i == 0) cm[h] = M, cl[h] = L;
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    /* the cluster's blocks are the splits of (t, g): each merges a share of the GM * HD
     * outputs from every block's shared memory, with no global round trip */
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    int ranks = (int)cluster.num_blocks(), rank = (int)cluster.block_rank();
    int share = (GM * HD + ranks - 1) / ranks;
    for (int idx = rank * share + threadIdx.x; idx < min((rank + 1) * share, GM * HD);
         idx += WARPS * 32) {
        int h = idx / HD, i = idx - h * HD;
        float mr[8], lr[8], orr[8], M = -INFINITY, L = 0.0f, o = 0.0f;
#pragma unroll
        for (int r = 0; r < 8; r++) { /* every rank's loads at once (ranks <= 8) */
            bool in = r < ranks;
            mr[r] = in ? cluster.map_shared_rank(cm, r)[h] : -INFINITY;
            lr[r] = in ? cluster.map_shared_rank(cl, r)[h] : 0.0f;
            orr[r] = in ? cluster.map_shared_rank(&co[0][0], r)[h * HD + i] : 0.0f;
            M = fmaxf(M, mr[r]);
        }
        float base = M == -INFINITY ? 0.0f : M;
#pragma unroll
        for (int r = 0; r < 8; r++) {
            float e = exp2f(mr[r] - base); /* 0 for a rank without keys */
            L += lr[r] * e;
            o += orr[r] * e;
        }
        if (sinks) /* M is in log2 units here */
            L += exp2f(bf2f(sinks[hb + h]) * 1.4426950408889634f - M);
        out[((size_t)t * H + (size_t)hb + h) * HD + i] = L > 0.0f ? o / L : 0.0f;
    }
    cluster.sync(); /* no block leaves while another may still read its shared memory */
#endif
}

/* atlas_attn_dcl<HD>_g1_w4: 4 warps a block and 5 keys a group a pass (one pass up to 640
 * keys at 8 splits), a query head a block: two blocks fit an SM, which doubles the clusters
 * that can run at once (15 of 8 at one 8-warp block an SM); the 8B decode step took 3.866 ms
 * against 3.914 with 8 warps and 3 keys a group, and a replay 3.843 against 3.864-3.872 with
 * 2 heads a block (bench/RESULTS.md; those instances were removed). */
#define ATLAS_ATTN_DCL(HD, GM, UK, WARPS, SFX)                                                    \
    extern "C" __global__ void __launch_bounds__(WARPS * 32, 1) atlas_attn_dcl##HD##_g##GM##SFX( \
        float *part_o, float *part_ml, const float *qkv, const bf16_t *kc, const bf16_t *vc,     \
        const int *tok_seq, const int *positions, const int *block_table, int max_blocks, int bs, \
        int H, int K, int window, int chunk, float scale, float *out, int *counters,            \
        int early, const bf16_t *sinks) {                                                        \
        (void)part_o, (void)part_ml, (void)chunk, (void)counters;                                \
        attn_dcl_body<HD, GM, UK, WARPS>(qkv, kc, vc, tok_seq, positions, block_table,          \
                                         max_blocks, bs, H, K, window, scale, out, early,       \
                                         sinks);                                                 \
    }
ATLAS_ATTN_DCL(64, 1, 5, 4, _w4)
ATLAS_ATTN_DCL(128, 1, 5, 4, _w4)

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
 * (window 0: [0, p]), each at slot block_table[s * max_blocks + q / bs] * bs + q % bs. */
#include "common.cuh"

enum { ATTN_THREADS = 128 };

/* One block: token t, kv head g, split s covering context positions [start + s*chunk, ..),
 * walked in tiles of `tile` keys with an online softmax.
 * smem: q[G*hd], o[G*hd], scores[G*tile], slots[tile] (int), m[G], l[G], alpha[G]. */
extern "C" __global__ void __launch_bounds__(ATTN_THREADS)
atlas_attn_split(float *part_o, float *part_ml, const float *qkv, const bf16_t *kc,
                 const bf16_t *vc, const int *tok_seq, const int *positions,
                 const int *block_table, int max_blocks, int bs, int H, int K, int hd,
                 int window, int chunk, int tile, float scale, float *out, int *counters) {
    pdl_trigger();
    pdl_wait();
    extern __shared__ __align__(16) float smem[];
    int t = blockIdx.x, g = blockIdx.y, s = blockIdx.z, n_split = gridDim.z;
    int G = H / K, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float *q = smem, *o = q + G * hd, *sc = o + G * hd;
    int *slots = (int *)(sc + G * tile);
    float *mrun = (float *)(slots + tile), *lrun = mrun + G, *alpha = lrun + G;

    int pos = positions[t];
    int start = window > 0 ? max(0, pos - window + 1) : 0;
    int j0 = start + s * chunk, j1 = min(j0 + chunk, pos + 1);
    size_t po = ((size_t)t * H + (size_t)g * G) * n_split + s; /* (t, head g*G, split s) */
    const float *qrow = qkv + (size_t)t * (H + 2 * K) * hd + (size_t)g * G * hd;
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
            const bf16_t *kr = kc + ((size_t)slots[j] * K + g) * hd;
            const float *qh = q + h * hd;
            float d = 0.0f;
#pragma unroll 4
            for (int i = 0; i < hd; i += 8) {
                float f[8];
                unpack8(*(const uint4 *)(kr + i), f);
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
            const bf16_t *vb = vc + (size_t)g * hd + i;
            float acc = 0.0f;
#pragma unroll 8
            for (int j = 0; j < len; j++) acc += p[j] * bf2f(vb[(size_t)slots[j] * K * hd]);
            o[idx] = o[idx] * alpha[h] + acc;
        }
    }
    __syncthreads();
    for (int idx = tid; idx < G * hd; idx += ATTN_THREADS)
        part_o[(po + (size_t)(idx / hd) * n_split) * hd + idx % hd] = o[idx];
    for (int h = tid; h < G; h += ATTN_THREADS) {
        part_ml[(po + (size_t)h * n_split) * 2] = mrun[h];
        part_ml[(po + (size_t)h * n_split) * 2 + 1] = lrun[h];
    }
    if (!counters) return;
    /* the last split of (t, g) to finish merges them all (counters return to 0) */
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        int *ctr = counters + (size_t)t * K + g;
        last = atomicAdd(ctr, 1) == n_split - 1;
        if (last) *ctr = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    size_t base = ((size_t)t * H + (size_t)g * G) * n_split;
    for (int idx = tid; idx < G * hd; idx += ATTN_THREADS) {
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
        out[((size_t)t * H + (size_t)g * G + h) * hd + i] = L > 0.0f ? acc / L : 0.0f;
    }
}

/* out[t, h*hd + i] = merged chunks. grid (n, H), block >= 32. */
extern "C" __global__ void atlas_attn_combine(float *out, const float *part_o, const float *part_ml,
                                              int H, int hd, int n_split) {
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

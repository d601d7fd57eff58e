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

/* smem: q[G * hd] f32, scores[G * chunk] f32, slots[chunk] i32, ml[2 * G] f32. */
extern "C" __global__ void __launch_bounds__(ATTN_THREADS)
atlas_attn_split(float *part_o, float *part_ml, const float *qkv, const bf16_t *kc,
                 const bf16_t *vc, const int *tok_seq, const int *positions,
                 const int *block_table, int max_blocks, int bs, int H, int K, int hd,
                 int window, int chunk, float scale) {
    extern __shared__ __align__(16) float smem[];
    int t = blockIdx.x, g = blockIdx.y, s = blockIdx.z, n_split = gridDim.z;
    int G = H / K, tid = threadIdx.x;
    float *q = smem, *sc = q + G * hd, *ml = sc + G * chunk;
    int *slots = (int *)(ml + 2 * G);

    int pos = positions[t];
    int start = window > 0 ? max(0, pos - window + 1) : 0;
    int j0 = start + s * chunk, j1 = min(j0 + chunk, pos + 1), len = j1 - j0;
    size_t po = ((size_t)t * H + (size_t)g * G) * n_split + s; /* (t, head g*G, split s) */
    if (len <= 0) {
        for (int i = tid; i < G * hd; i += ATTN_THREADS)
            part_o[(po + (size_t)(i / hd) * n_split) * hd + i % hd] = 0.0f;
        for (int h = tid; h < G; h += ATTN_THREADS) {
            part_ml[(po + (size_t)h * n_split) * 2] = -INFINITY;
            part_ml[(po + (size_t)h * n_split) * 2 + 1] = 0.0f;
        }
        return;
    }
    const float *qrow = qkv + (size_t)t * (H + 2 * K) * hd + (size_t)g * G * hd;
    for (int i = tid; i < G * hd; i += ATTN_THREADS) q[i] = qrow[i] * scale;
    const int *bt = block_table + (size_t)tok_seq[t] * max_blocks;
    for (int j = tid; j < len; j += ATTN_THREADS) {
        int p = j0 + j;
        slots[j] = bt[p / bs] * bs + p % bs;
    }
    __syncthreads();

    /* scores[h][j] = q_h . k_j */
    for (int idx = tid; idx < G * len; idx += ATTN_THREADS) {
        int h = idx / len, j = idx - h * len;
        const bf16_t *kr = kc + ((size_t)slots[j] * K + g) * hd;
        const float *qh = q + h * hd;
        float d = 0.0f;
        for (int i = 0; i < hd; i += 8) {
            float f[8];
            unpack8(*(const uint4 *)(kr + i), f);
#pragma unroll
            for (int e = 0; e < 8; e++) d += f[e] * qh[i + e];
        }
        sc[h * chunk + j] = d;
    }
    __syncthreads();

    /* softmax pieces per head: one warp a head */
    int lane = tid & 31, warp = tid >> 5;
    for (int h = warp; h < G; h += ATTN_THREADS / 32) {
        float mx = -INFINITY;
        for (int j = lane; j < len; j += 32) mx = fmaxf(mx, sc[h * chunk + j]);
        mx = warp_max(mx);
        float sum = 0.0f;
        for (int j = lane; j < len; j += 32) {
            float e = __expf(sc[h * chunk + j] - mx);
            sc[h * chunk + j] = e;
            sum += e;
        }
        sum = warp_sum(sum);
        if (lane == 0) { ml[2 * h] = mx; ml[2 * h + 1] = sum; }
    }
    __syncthreads();

    /* o[h][i] = sum_j p[h][j] v_j[i] */
    for (int idx = tid; idx < G * hd; idx += ATTN_THREADS) {
        int h = idx / hd, i = idx - h * hd;
        const float *p = sc + h * chunk;
        const bf16_t *vb = vc + (size_t)g * hd + i;
        float o = 0.0f;
        for (int j = 0; j < len; j++) o += p[j] * bf2f(vb[(size_t)slots[j] * K * hd]);
        part_o[(po + (size_t)h * n_split) * hd + i] = o;
    }
    for (int h = tid; h < G; h += ATTN_THREADS) {
        part_ml[(po + (size_t)h * n_split) * 2] = ml[2 * h];
        part_ml[(po + (size_t)h * n_split) * 2 + 1] = ml[2 * h + 1];
    }
}

/* out[t, h*hd + i] = merged chunks. grid (n, H), block >= 32. */
extern "C" __global__ void atlas_attn_combine(float *out, const float *part_o, const float *part_ml,
                                              int H, int hd, int n_split) {
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

/* kernels/sample.cu — the sample op (backend.h): a block of SAMPLE_THREADS a row of logits, over
 * any vocabulary (256k and more: the row stays in global memory and L2, read a few times).
 *
 * A row: the raw row's log-sum-exp and its n_top most likely ids (n_top rounds of a block
 * argmax below the last pick); then the adjustments in place (logit_bias, the repetition
 * penalty, presence and frequency: each adjusted id is one thread's, its raw value kept in
 * raw[]); y = logit / temperature; the top-k and top-p thresholds by radix selection on the
 * order-preserving keys of y (four passes of 8 bits: the count, or the mass exp(y - max),
 * above each digit, the ties at the threshold taken lowest id first as the CPU's sort does);
 * min-p as exp(y - max) >= min_p; then one draw by inverse CDF over the kept ids in the
 * order thread t walks ids t, t + blockDim, ... (a block scan of the threads' sums finds the
 * thread, the thread its id). The uniform is the host's atlas_sampler_uniform(seed, counter):
 * Philox-4x32-10. No sort, no scratch beyond raw[]. */
#include "common.cuh"

enum { SAMPLE_THREADS = 1024, SAMPLE_MAX_TOP = 20, SAMPLE_LOGPROB = 1, SAMPLE_SKIP = 2 };

/* backend.h's atlas_sample_row, atlas_sample_adj and atlas_sample_out, field for field. */
struct sample_row {
    unsigned long long seed, counter;
    float temperature, top_p, min_p, rep, pres, freq;
    int top_k, adj0, n_adj, n_top, flags, pad;
};
struct sample_adj {
    int id, seen, count;
    float bias;
};
struct sample_out {
    int id;
    float logprob;
    int n_top;
    int top_ids[SAMPLE_MAX_TOP];
    float top_logprobs[SAMPLE_MAX_TOP];
};

/* Order-preserving key of a float (larger value, larger key); NaN is 0, below everything. */
__device__ __forceinline__ unsigned fkey(float v) {
    unsigned u = __float_as_uint(v);
    return v != v ? 0u : (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

/* (v, i) before (bv, bi): larger value, then lower id. */
__device__ __forceinline__ bool before(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

/* The block's first (v, i) in that order, to every thread. */
__device__ float block_best(float v, int &i) {
    __shared__ float sv[32];
    __shared__ int si[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (before(ov, oi, v, i)) v = ov, i = oi;
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) sv[warp] = v, si[warp] = i;
    __syncthreads();
    v = sv[0], i = si[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); w++)
        if (before(sv[w], si[w], v, i)) v = sv[w], i = si[w];
    return v;
}

/* Exclusive prefix of the threads' x in thread order; the total into *total. */
__device__ double block_scan(double x, double *total) {
    __shared__ double ws[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    double inc = x;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        double y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += y;
    }
    __syncthreads();
    if (lane == 31) ws[warp] = inc;
    __syncthreads();
    double before_w = 0, all = 0;
    for (int w = 0; w < nw; w++) {
        if (w < warp) before_w += ws[w];
        all += ws[w];
    }
    *total = all;
    return before_w + inc - x;
}

__device__ void philox(unsigned c[4], unsigned k0, unsigned k1) {
    for (int r = 0; r < 10; r++) {
        if (r > 0) k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
        unsigned h0 = __umulhi(0xD2511F53u, c[0]), l0 = 0xD2511F53u * c[0];
        unsigned h1 = __umulhi(0xCD9E8D57u, c[2]), l1 = 0xCD9E8D57u * c[2];
        unsigned n0 = h1 ^ c[1] ^ k0, n2 = h0 ^ c[3] ^ k1;
        c[0] = n0, c[1] = l1, c[2] = n2, c[3] = l0;
    }
}

/* The row's view for the selections: y = x * inv_t, its weight exp(y - mx), and which ids
 * are still candidates (top-k's threshold key kkey, ties up to id kid). */
struct view {
    const float *x;
    int n, kid;
    float inv_t, mx;
    unsigned kkey;
};

__device__ __forceinline__ bool in_topk(const view &v, unsigned key, int i) {
    return key > v.kkey || (key == v.kkey && i <= v.kid);
}

__device__ __forceinline__ float weight(const view &v, float y) {
    return y != y ? 0.0f : expf(y - v.mx);
}

/* Radix selection, largest keys first: the key at which the candidates' cumulative weight
 * (1 each when count, else exp(y - mx)) first reaches want (times the total when relative),
 * the weight still wanted at that key, and the count and weight of the candidates with it.
 * Weights add up in fixed point (2^32 for exp(0) = 1, rounded), so that the sums, and with
 * them a row's draw, do not depend on the order the threads' atomics land in. */
typedef unsigned long long u64;

struct sel {
    unsigned key;
    u64 left, eq_w; /* left: the weight still wanted at key (want - the weight above) */
    int eq_c;
};

__device__ __forceinline__ u64 fixed_weight(const view &v, float y, bool count) {
    return count ? 1ull : (u64)__float2ll_rn(weight(v, y) * 4294967296.0f);
}

/* Warp 0: the bin of this digit where the running weight reaches the want, from the top
 * (lane l holds bins 255 - 8l down to 248 - 8l); the prefix and the weight above updated. */
__device__ void pick_bin(const u64 *hw, int shift, bool first, double want, unsigned *prefix,
                         u64 *above, u64 *need_total) {
    int l = threadIdx.x;
    u64 w[8], sum = 0;
    for (int j = 0; j < 8; j++) sum += w[j] = hw[255 - 8 * l - j];
    u64 inc = sum;
    for (int o = 1; o < 32; o <<= 1) {
        u64 y = __shfl_up_sync(0xffffffffu, inc, o);
        if (l >= o) inc += y;
    }
    u64 total = __shfl_sync(0xffffffffu, inc, 31);
    if (first) *need_total = want < 0 ? (u64)(-want * (double)total) : (u64)want;
    __syncwarp();
    u64 need = *need_total > *above ? *need_total - *above : 1;
    unsigned hit = __ballot_sync(0xffffffffu, inc >= need && sum > 0);
    /* nothing reaches it (rounding of the relative want): the lowest non-empty bin */
    unsigned any = __ballot_sync(0xffffffffu, sum > 0);
    int owner = hit ? __ffs(hit) - 1 : 31 - __clz(any);
    if (l != owner) return;
    u64 acc = inc - sum; /* then: the weight above bin pick */
    int pick = 0;
    bool found = false;
    for (int j = 0; j < 8 && !found; j++) {
        if (w[j] > 0) pick = j;
        found = hit && w[j] > 0 && acc + w[j] >= need;
        if (!found) acc += w[j];
    }
    if (!found) acc -= w[pick];
    *prefix |= (unsigned)(255 - 8 * l - pick) << shift;
    *above += acc;
}

/* want < 0: -want times the candidates' total weight. */
__device__ sel radix_select(const view &v, bool count, double want) {
    __shared__ u64 hw[256], s_above, s_need;
    __shared__ int hc[256];
    __shared__ unsigned s_prefix;
    if (threadIdx.x == 0) s_prefix = 0, s_above = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x) hw[b] = 0, hc[b] = 0;
        __syncthreads();
        unsigned prefix = s_prefix, hi = shift == 24 ? 0u : 0xffffffffu << (shift + 8);
        /* a thread's run of ids in one bin goes in as one add: a row's values share a few
         * sign-and-exponent bins, where every id's own add (the 64-bit one a compare-and-swap
         * loop) waited on the block's others */
        int run_b = -1, run_c = 0;
        u64 run_w = 0;
        for (int i = threadIdx.x; i < v.n; i += blockDim.x) {
            float y = v.x[i] * v.inv_t;
            unsigned key = fkey(y);
            if ((key & hi) != (prefix & hi) || !in_topk(v, key, i)) continue;
            int b = (key >> shift) & 255;
            if (b != run_b) {
                if (run_c) atomicAdd(&hc[run_b], run_c), atomicAdd(&hw[run_b], run_w);
                run_b = b, run_c = 0, run_w = 0;
            }
            run_c++;
            run_w += fixed_weight(v, y, count);
        }
        if (run_c) atomicAdd(&hc[run_b], run_c), atomicAdd(&hw[run_b], run_w);
        __syncthreads();
        if (threadIdx.x < 32) pick_bin(hw, shift, shift == 24, want, &s_prefix, &s_above, &s_need);
        __syncthreads();
    }
    int b = s_prefix & 255;
    sel r = {s_prefix, s_need > s_above ? s_need - s_above : 1, hw[b], hc[b]};
    __syncthreads();
    return r;
}

/* The id of the need-th (from 1) candidate with key `key` in increasing id order. */
__device__ int nth_equal(const view &v, unsigned key, int need) {
    __shared__ int wc[32], s_found, s_seen;
    if (threadIdx.x == 0) s_found = -1, s_seen = 0;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int base = 0; base < v.n; base += blockDim.x) {
        int i = base + threadIdx.x;
        bool m = false;
        if (i < v.n) {
            unsigned k = fkey(v.x[i] * v.inv_t);
            m = k == key && in_topk(v, k, i);
        }
        unsigned bal = __ballot_sync(0xffffffffu, m);
        __syncthreads();
        if (lane == 0) wc[warp] = __popc(bal);
        __syncthreads();
        int before_w = s_seen;
        for (int w = 0; w < warp; w++) before_w += wc[w];
        if (m && before_w + __popc(bal & ((1u << lane) - 1)) + 1 == need) s_found = i;
        __syncthreads();
        if (threadIdx.x == 0)
            for (int w = 0; w < (int)(blockDim.x >> 5); w++) s_seen += wc[w];
        __syncthreads();
        if (s_found >= 0) break;
    }
    return s_found;
}

/* The raw row's log-sum-exp, and its n_top most likely ids with their logprobs into o. */
__device__ float raw_logprobs(const float *x, int n, int n_top, sample_out *o) {
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < n; i += blockDim.x) mx = fmaxf(mx, x[i]);
    int dummy = 0;
    mx = block_best(mx, dummy);
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += expf(x[i] - mx);
    float lse = mx + logf(block_sum(s));
    float pv = INFINITY;
    int pi = -1, k = min(n_top, n), t = 0;
    for (; t < k; t++) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            float xv = x[i];
            if (before(pv, pi, xv, i) && before(xv, i, bv, bi)) bv = xv, bi = i;
        }
        bv = block_best(bv, bi);
        if (bi == 0x7fffffff) break; /* the rest are NaN */
        if (threadIdx.x == 0) o->top_ids[t] = bi, o->top_logprobs[t] = bv - lse;
        pv = bv, pi = bi;
    }
    if (threadIdx.x == 0) o->n_top = t;
    return lse;
}

/* The row's adjustments, in place, in the CPU sampler's order; raw[j] keeps the value
 * before. */
__device__ void adjust(float *x, const sample_row &q, const sample_adj *adj, float *raw) {
    for (int j = threadIdx.x; j < q.n_adj; j += blockDim.x) {
        sample_adj a = adj[q.adj0 + j];
        float v = x[a.id];
        raw[q.adj0 + j] = v;
        v += a.bias;
        if (a.seen && q.rep != 1.0f) v = v > 0 ? v / q.rep : v * q.rep;
        if (a.count > 0) v -= q.pres + q.freq * (float)a.count;
        x[a.id] = v;
    }
    __syncthreads();
}

/* One draw over the kept candidates (top-k, top-p's threshold ptop/pid, min-p) with the
 * uniform u; fallback: the largest. */
__device__ int draw(const view &v, unsigned pkey, int pid, float min_p, double u, int fallback) {
    __shared__ int s_id, s_last;
    if (threadIdx.x == 0) s_id = -1, s_last = -1;
    float local = 0.0f;
    for (int i = threadIdx.x; i < v.n; i += blockDim.x) {
        float y = v.x[i] * v.inv_t, w = weight(v, y);
        unsigned key = fkey(y);
        if (in_topk(v, key, i) && (key > pkey || (key == pkey && i <= pid)) && w >= min_p)
            local += w;
    }
    double total, ex = block_scan((double)local, &total);
    if (local > 0.0f) atomicMax(&s_last, (int)threadIdx.x);
    double target = u * total;
    __syncthreads();
    bool mine = local > 0.0f && (target < ex + local || (int)threadIdx.x == s_last) &&
                target >= ex;
    if (mine) {
        float rem = (float)(target - ex), acc = 0.0f;
        int pick = -1;
        for (int i = threadIdx.x; i < v.n; i += blockDim.x) {
            float y = v.x[i] * v.inv_t, w = weight(v, y);
            unsigned key = fkey(y);
            if (!(in_topk(v, key, i) && (key > pkey || (key == pkey && i <= pid)) && w >= min_p))
                continue;
            pick = i;
            acc += w;
            if (rem < acc) break;
        }
        s_id = pick;
    }
    __syncthreads();
    return s_id >= 0 ? s_id : fallback;
}

/* The candidates of key s.key needed to reach the want (equal keys: equal weights), as a
 * bound on their ids (all of them: no bound). */
__device__ int tie_bound(const view &v, const sel &s) {
    int need = s.eq_c;
    if (s.eq_c > 1 && s.eq_w > 0) {
        double each = (double)s.eq_w / s.eq_c;
        need = (int)fmin(ceil((double)s.left / each), (double)s.eq_c);
        need = max(1, need);
    }
    return need >= s.eq_c ? 0x7fffffff : nth_equal(v, s.key, need);
}

/* Sampled id of row q (x adjusted in place). */
__device__ int sample_id(float *x, int n, const sample_row &q) {
    float inv_t = q.temperature > 0.0f ? 1.0f / q.temperature : 1.0f;
    float mx = -INFINITY;
    int am = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        if (before(x[i], i, mx, am)) mx = x[i], am = i;
    block_best(mx, am);
    if (q.temperature == 0.0f || am == 0x7fffffff) return am == 0x7fffffff ? 0 : am;
    view v = {x, n, 0x7fffffff, inv_t, x[am] * inv_t, 0u};
    if (q.top_k > 0 && q.top_k < n) {
        sel s = radix_select(v, true, (double)q.top_k);
        v.kid = tie_bound(v, s);
        v.kkey = s.key;
    }
    unsigned pkey = 0u;
    int pid = 0x7fffffff;
    if (q.top_p < 1.0f) {
        sel s = radix_select(v, false, -(double)q.top_p);
        pid = tie_bound(v, s);
        pkey = s.key;
    }
    unsigned c[4] = {(unsigned)q.counter, (unsigned)(q.counter >> 32), 0u, 0u};
    philox(c, (unsigned)q.seed, (unsigned)(q.seed >> 32));
    double u = (double)(((unsigned long long)c[0] << 21) ^ (c[1] >> 11)) * 0x1.0p-53;
    return draw(v, pkey, pid, q.min_p, u, am);
}

/* grid: a block a row of logits[rows, vocab]; raw [n_adj]: scratch. */
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
atlas_sample(sample_out *out, float *logits, int vocab, const sample_row *rows,
             const sample_adj *adj, float *raw) {
    pdl_wait();
    sample_row q = rows[blockIdx.x];
    if (q.flags & SAMPLE_SKIP) return;
    float *x = logits + (size_t)blockIdx.x * vocab;
    sample_out *o = out + blockIdx.x;
    bool lp = (q.flags & SAMPLE_LOGPROB) != 0;
    float lse = lp || q.n_top > 0 ? raw_logprobs(x, vocab, q.n_top, o) : 0.0f;
    if (!(lp || q.n_top > 0) && threadIdx.x == 0) o->n_top = 0;
    adjust(x, q, adj, raw);
    int id = sample_id(x, vocab, q);
    if (threadIdx.x == 0) {
        float v = x[id];
        const sample_adj *a = adj + q.adj0;
        int lo = 0, hi = q.n_adj; /* the raw value of an adjusted id */
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (a[mid].id < id) lo = mid + 1;
            else hi = mid;
        }
        if (lo < q.n_adj && a[lo].id == id) v = raw[q.adj0 + lo];
        o->id = id;
        o->logprob = lp ? v - lse : 0.0f;
    }
}

/* A queued step's draw (the sample_queue op): rows without adjustments, logprobs or top ids,
 * so the logits stay as they are; each id to ids (the next step's tokens on the device) and
 * to host_ids (pinned, mapped), as atlas_argmax writes them. */
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
atlas_sample_ids(int *ids, int *host_ids, float *logits, int vocab, const sample_row *rows) {
    pdl_wait();
    sample_row q = rows[blockIdx.x];
    int id = sample_id(logits + (size_t)blockIdx.x * vocab, vocab, q);
    if (threadIdx.x == 0) {
        ids[blockIdx.x] = id;
        if (host_ids) host_ids[blockIdx.x] = id;
    }
}

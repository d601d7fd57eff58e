/* kernels/argmax.cu — greedy pick on the device: ids[r] = argmax(logits[r, :vocab]).
 * Ties go to the smaller id (as torch.argmax); NaN never wins. Each id also goes to
 * host_ids[r] when it is not NULL: pinned host memory, mapped, which the host reads once the
 * stream has passed the kernel (no copy to queue and wait for). */
#include "common.cuh"

/* (bv, bi) becomes (ov, oi) when that is larger, or equal with a smaller id. */
__device__ __forceinline__ void argmax_fold(float &bv, int &bi, float ov, int oi) {
    if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
}

/* The block's (value, id) pair into warp 0 (every lane of it holds the result). */
__device__ __forceinline__ void block_argmax(float &bv, int &bi) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        argmax_fold(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
    __shared__ float sv[32];
    __shared__ int si[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { sv[warp] = bv; si[warp] = bi; }
    __syncthreads();
    if (warp == 0) {
        int nw = blockDim.x >> 5;
        bv = lane < nw ? sv[lane] : -INFINITY;
        bi = lane < nw ? si[lane] : 0x7fffffff;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            argmax_fold(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o),
                        __shfl_xor_sync(0xffffffffu, bi, o));
    }
}

extern "C" __global__ void atlas_argmax(int *ids, int *host_ids, const float *logits, int vocab) {
    pdl_trigger();
    pdl_wait();
    const float *row = logits + (size_t)blockIdx.x * vocab;
    float best = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = row[i];
        if (v > best) { best = v; bi = i; } /* i rises: the first of equals stays */
    }
    block_argmax(best, bi);
    if (threadIdx.x == 0) {
        int id = bi == 0x7fffffff ? 0 : bi;
        ids[blockIdx.x] = id;
        if (host_ids) host_ids[blockIdx.x] = id;
    }
}

/* Order-preserving unsigned key of a float; NaN gets 0 and never wins. */
__device__ __forceinline__ unsigned argmax_key(float v) {
    unsigned u = __float_as_uint(v);
    return v != v ? 0u : (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

/* The same over gridDim.y blocks a row (one block read a 128k vocabulary at ~50 us, a
 * fiftieth of a decode step): each block reduces its slice with all its loads in flight and
 * folds (key, ~id) into best[r] with atomicMax (larger value, then smaller id, wins); the
 * last block of the row writes ids[r] and zeroes best[r] and count[r] for the next launch.
 * grid (rows, S), block ARGMAX_THREADS; best and count zero before the first launch. */
enum { ARGMAX_THREADS = 256, ARGMAX_PER = 16 };
extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)
atlas_argmax_wide(int *ids, int *host_ids, unsigned long long *best, int *count, const float *logits,
                  int vocab) {
    pdl_trigger();
    pdl_wait();
    const float *row = logits + (size_t)blockIdx.x * vocab;
    int span = (vocab + gridDim.y - 1) / gridDim.y, lo = blockIdx.y * span;
    int hi = min(lo + span, vocab);
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int base = lo + threadIdx.x; base < hi; base += ARGMAX_THREADS * ARGMAX_PER) {
        float v[ARGMAX_PER];
#pragma unroll
        for (int k = 0; k < ARGMAX_PER; k++) {
            int i = base + k * ARGMAX_THREADS;
            v[k] = i < hi ? row[i] : -INFINITY;
        }
#pragma unroll
        for (int k = 0; k < ARGMAX_PER; k++) { /* indices rise: the first of equals stays */
            int i = base + k * ARGMAX_THREADS;
            if (i < hi && (v[k] > bv || (bi == 0x7fffffff && v[k] == v[k]))) { bv = v[k]; bi = i; }
        }
    }
    block_argmax(bv, bi);
    if (threadIdx.x == 0) {
        if (bi != 0x7fffffff)
            atomicMax(best + blockIdx.x,
                      ((unsigned long long)argmax_key(bv) << 32) | (0xffffffffu - (unsigned)bi));
        __threadfence();
        if (atomicAdd(count + blockIdx.x, 1) == (int)gridDim.y - 1) {
            unsigned long long k = atomicExch(best + blockIdx.x, 0ull);
            int id = k ? (int)(0xffffffffu - (unsigned)(k & 0xffffffffu)) : 0;
            ids[blockIdx.x] = id;
            if (host_ids) host_ids[blockIdx.x] = id;
            count[blockIdx.x] = 0;
        }
    }
}

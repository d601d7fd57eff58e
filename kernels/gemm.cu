/* kernels/gemm.cu — matmul for prefill on the tensor cores (mma.sync m16n8k16, bf16 in,
 * fp32 accumulate; runs on sm_80 and later): out[n, m] = x[n, k] @ w[m, k]^T (+ bias).
 *
 * Block tile 128 (tokens) x 128 (weight rows) x 32 (k), 8 warps of 64 x 32. x is fp32 and is
 * rounded to bf16 on its way into shared memory (loaded through registers one tile ahead);
 * w tiles arrive by cp.async, double-buffered. Rows are padded to 40 bf16 (80 bytes) so that
 * ldmatrix reads are free of bank conflicts. k % 8 == 0. */
#include "mma.cuh"

enum { BM = 128, BN = 128, BK = 32, LDS = BK + 8, GEMM_THREADS = 256 };

/* The A tile (x rows n0.., cols k0..) into registers: 4 float4 a thread. */
__device__ __forceinline__ void load_a(float4 (&ra)[4], const float *x, int n, int k, int n0,
                                       int k0) {
#pragma unroll
    for (int it = 0; it < 4; it++) {
        int idx = threadIdx.x + it * GEMM_THREADS, r = idx >> 3, c = k0 + (idx & 7) * 4;
        ra[it] = (n0 + r < n && c < k) ? *(const float4 *)(x + (size_t)(n0 + r) * k + c)
                                       : make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

__device__ __forceinline__ void store_a(bf16_t *as, const float4 (&ra)[4]) {
#pragma unroll
    for (int it = 0; it < 4; it++) {
        int idx = threadIdx.x + it * GEMM_THREADS, r = idx >> 3, c = (idx & 7) * 4;
        uint2 v = make_uint2(pack_bf16x2(ra[it].x, ra[it].y), pack_bf16x2(ra[it].z, ra[it].w));
        *(uint2 *)(as + r * LDS + c) = v;
    }
}

/* The B tile (w rows m0.., cols k0..) by cp.async; rows past m and cols past k read zeros. */
__device__ __forceinline__ void load_b(bf16_t *bs, const bf16_t *w, int m, int k, int m0, int k0) {
#pragma unroll
    for (int it = 0; it < 2; it++) {
        int idx = threadIdx.x + it * GEMM_THREADS, r = idx >> 2, c = (idx & 3) * 8;
        bool ok = m0 + r < m && k0 + c < k;
        const bf16_t *src = ok ? w + (size_t)(m0 + r) * k + k0 + c : w;
        cp_async16(bs + r * LDS + c, src, ok ? 16 : 0);
    }
    asm volatile("cp.async.commit_group;");
}

__device__ __forceinline__ void mma_tile(float (&acc)[4][4][4], const bf16_t *as,
                                         const bf16_t *bs, int wm, int wn) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int ks = 0; ks < BK; ks += 16) {
        uint32_t a[4][4], b[2][4];
#pragma unroll
        for (int mt = 0; mt < 4; mt++)
            ldmatrix_x4(a[mt], as + (wm * 64 + mt * 16 + (lane & 15)) * LDS + ks + (lane >> 4) * 8);
#pragma unroll
        for (int p = 0; p < 2; p++)
            ldmatrix_x4(b[p], bs + (wn * 32 + p * 16 + (lane & 7) + (lane >> 4) * 8) * LDS + ks +
                                  ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int mt = 0; mt < 4; mt++)
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
                mma_bf16_16816(acc[mt][nt], a[mt], b[nt >> 1][(nt & 1) * 2], b[nt >> 1][(nt & 1) * 2 + 1]);
    }
}

/* grid (ceil(m / BN), ceil(n / BM)), block 256. */
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
atlas_gemm(float *out, const float *x, const bf16_t *w, const bf16_t *bias, int n, int m, int k) {
    pdl_trigger();
    pdl_wait();
    __shared__ __align__(16) bf16_t As[2][BM * LDS];
    __shared__ __align__(16) bf16_t Bs[2][BN * LDS];
    int m0 = blockIdx.x * BN, n0 = blockIdx.y * BM;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wm = warp >> 2, wn = warp & 3;
    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

    float4 ra[4];
    load_b(Bs[0], w, m, k, m0, 0);
    load_a(ra, x, n, k, n0, 0);
    store_a(As[0], ra);
    asm volatile("cp.async.wait_all;");
    __syncthreads();
    int kt_count = (k + BK - 1) / BK;
    for (int kt = 0; kt < kt_count; kt++) {
        int cur = kt & 1;
        bool more = kt + 1 < kt_count;
        if (more) {
            load_b(Bs[cur ^ 1], w, m, k, m0, (kt + 1) * BK);
            load_a(ra, x, n, k, n0, (kt + 1) * BK);
        }
        mma_tile(acc, As[cur], Bs[cur], wm, wn);
        if (more) {
            store_a(As[cur ^ 1], ra);
            asm volatile("cp.async.wait_all;");
        }
        __syncthreads();
    }

    int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < 4; mt++) {
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            int col = m0 + wn * 32 + nt * 8 + t * 2;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int row = n0 + wm * 64 + mt * 16 + g + h * 8;
                if (row >= n) continue;
                float *o = out + (size_t)row * m;
                if (col < m) o[col] = acc[mt][nt][h * 2] + (bias ? bf2f(bias[col]) : 0.0f);
                if (col + 1 < m)
                    o[col + 1] = acc[mt][nt][h * 2 + 1] + (bias ? bf2f(bias[col + 1]) : 0.0f);
            }
        }
    }
}

/* x[count] fp32 -> bf16 (feeds cuBLASLt when it is used). count % 4 == 0. */
extern "C" __global__ void atlas_f32_to_bf16(bf16_t *dst, const float *src, long long count) {
    pdl_trigger();
    pdl_wait();
    for (long long i = (blockIdx.x * (long long)blockDim.x + threadIdx.x) * 4; i < count;
         i += (long long)gridDim.x * blockDim.x * 4) {
        float4 v = *(const float4 *)(src + i);
        *(uint2 *)(dst + i) = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
    }
}

/* out[n, m] += bias[m] (after cuBLASLt). */
extern "C" __global__ void atlas_add_bias(float *out, const bf16_t *bias, int m, long long total) {
    pdl_trigger();
    pdl_wait();
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x)
        out[i] += bf2f(bias[i % m]);
}

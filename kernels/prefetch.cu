/* kernels/prefetch.cu — weights pulled into L2 ahead of the kernel that reads them.
 * A decode step is a chain of bandwidth-bound GEMVs broken by latency-bound kernels
 * (attention, norms) during which the memory sits idle; a prefetch launched before such a
 * kernel fetches the next GEMV's first bytes in that idle time, and the GEMV then finds them
 * in L2 (ops_cuda.c, l2_prefetch_ahead). */
#include "common.cuh"

enum { PF_RANGES = 4 };

/* Up to PF_RANGES byte ranges; their concatenation is cut into gridDim.x equal shares. */
struct pf_ranges {
    unsigned long long ptr[PF_RANGES], bytes[PF_RANGES];
    int n;
};

/* grid: any number of blocks of 32 threads. The prefetches depend on nothing, so they are
 * issued before the wait for the previous kernel; the wait keeps the stream's order for
 * the kernel after this one (with PDL it waits on this kernel only). */
extern "C" __global__ void __launch_bounds__(32) atlas_l2_prefetch(pf_ranges r) {
    pdl_trigger();
    unsigned long long total = 0;
    for (int i = 0; i < r.n; i++) total += r.bytes[i];
    unsigned long long share = (total / gridDim.x + 4095) & ~4095ull;
    unsigned long long lo = blockIdx.x * share, hi = min(lo + share, total), at = 0;
    for (int i = 0; i < r.n && lo < hi; at += r.bytes[i], i++) {
        unsigned long long a = max(lo, at), b = min(hi, at + r.bytes[i]);
        if (a >= b) continue;
        const char *p = (const char *)r.ptr[i] + (a - at);
        unsigned long long len = b - a;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        /* the copy engine of the SM (TMA) fetches 64 KiB a request; one lane issues them */
        if (threadIdx.x == 0)
            for (unsigned long long o = 0; o < len; o += 65536) {
                unsigned n = (unsigned)min(65536ull, len - o) & ~15u;
                if (n)
                    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + o), "r"(n)
                                 : "memory");
            }
#else
        for (unsigned long long o = threadIdx.x * 128ull; o < len; o += 32 * 128ull)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
#endif
    }
    pdl_wait();
}

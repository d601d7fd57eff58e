/* kernels/bench.cu — the read-bandwidth probe of `atlas bench`: reads a buffer once with
 * 16-byte loads (several in flight a thread) and folds it into one word a block so the
 * loads cannot be dropped. */
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(512) atlas_read_probe(unsigned *sink, const uint4 *buf,
                                                                   long long n16) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    unsigned acc = 0;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        uint4 a = ld_stream16(buf + i), b = ld_stream16(buf + i + stride);
        uint4 c = ld_stream16(buf + i + 2 * stride), d = ld_stream16(buf + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^
               d.z ^ d.w;
    }
    for (; i < n16; i += stride) {
        uint4 a = ld_stream16(buf + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    acc = __reduce_xor_sync(0xffffffffu, acc);
    if ((threadIdx.x & 31) == 0) atomicXor(sink + blockIdx.x, acc);
}

/* Fills a buffer with a cheap hash of the index (timing on zeros flatters). */
extern "C" __global__ void atlas_fill_pattern(unsigned *buf, long long n, unsigned seed) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        unsigned x = (unsigned)i * 2654435761u ^ seed;
        x ^= x >> 15; x *= 2246822519u; x ^= x >> 13;
        /* keep it a sane bf16 pair (exponent bits limited) when read as weights */
        buf[i] = x & 0xbfffbfffu & ~0x40004000u;
    }
}

/* backend/cuda/bench_cuda.h — the device's ceilings, measured for `atlas bench` in the same
 * run as the model: read bandwidth (kernels/bench.cu reads a buffer once with 16-byte loads)
 * and the bf16 matrix rate of each GEMM the backend has.  Internal. */
#ifndef ATLAS_CUDA_BENCH_H
#define ATLAS_CUDA_BENCH_H

#include <stddef.h>

#include "backend/backend.h"

typedef struct atlas_cuda_ceilings {
    char device[256];
    size_t read_bytes;     /* buffer the probe read */
    double read_gbps;      /* median of the timed reads, 1e9 bytes/s */
    size_t h2d_bytes;      /* pinned host buffer copied to the device */
    double h2d_gbps;       /* median host-to-device copy rate from pinned memory, 1e9 B/s */
    int gemm_size;         /* n = m = k */
    double own_tflops;     /* kernels/gemm.cu (mma.sync, fp32 activations in) */
    double lt_tflops;      /* cuBLASLt bf16 x bf16 -> fp32; 0 when absent */
    char lt_version[32];
} atlas_cuda_ceilings;

/* Memory the backend holds, by kind (bytes). */
typedef struct atlas_cuda_memory {
    size_t weights, kv, workspace, total;
} atlas_cuda_memory;

/* Measures on be's device (be must be the CUDA backend; ATLAS_ERR_INVALID otherwise).
 * Allocates read_bytes + 3 * gemm_size^2 * 4 bytes for the time of the call. */
atlas_status atlas_cuda_measure_ceilings(atlas_backend *be, size_t read_bytes, int gemm_size,
                                         atlas_cuda_ceilings *out);

atlas_status atlas_cuda_memory_use(atlas_backend *be, atlas_cuda_memory *out);

/* Where a model load's time went, ms from the backend's creation (cuda_backend.h keeps it). */
typedef struct atlas_cuda_load_times {
    double first_ms;   /* the first weight_load */
    double last_ms;    /* the last weight_load's return (every weight queued) */
    double alloc_ms;   /* of those, in device allocations for weights */
    double done_ms;    /* then in weights_done, until the copies landed */
    double ready_ms;   /* making the kernels and cuBLASLt (cuda_ready): part of first_ms, or
                        * of done_ms with ATLAS_LOAD_KERNELS=overlap */
    double kernels_ms; /* of ready_ms: the kernel modules and their functions */
} atlas_cuda_load_times;

/* How the backend's weights reached the device (ATLAS_LOAD; backend/cuda/direct.h). */
typedef struct atlas_cuda_load_info {
    const char *mode;        /* "direct", "stage", "mix" */
    size_t direct_bytes;     /* the copy engine read out of the registered file mapping */
    size_t staged_bytes;     /* through the pinned staging pool (bf16 bytes) */
    int pieces, pieces_staged;
    size_t piece_bytes;
    int threads, window, stage_pct;
    double direct_ms;        /* the direct runs (registration, copies, unregistration) */
    size_t run_bytes;        /* copied in those runs, by either path */
    const char *refused;     /* why registration is off in this process, "" if it is not */
    atlas_cuda_load_times t;
} atlas_cuda_load_info;

atlas_status atlas_cuda_load_info_get(atlas_backend *be, atlas_cuda_load_info *out);

/* The loader the issue sets as the reference for staged loads: `threads` threads each take
 * the next 64 MiB piece of the files, pread it into a pinned buffer of their own (two each,
 * made before the clock starts) and queue its copy on a stream of their own.  What this
 * machine's CPU, page cache and bus give a loader, measured in the same run as the loads. */
typedef struct atlas_cuda_file_load {
    size_t bytes;            /* of the files */
    double seconds, gbps;    /* from the first read to the last copy's end */
    double setup_s;          /* making the pinned buffers (not in seconds) */
    int threads;
    size_t piece_bytes;
} atlas_cuda_file_load;

atlas_status atlas_cuda_measure_file_load(atlas_backend *be, const char *const *paths,
                                          int n_paths, int threads, atlas_cuda_file_load *out);

/* Where a decode step's time goes: each GEMV shape of the model (its own geometry, on
 * synthetic weights) with both n = 1 kernels, and the replay of the last decode graph. */
enum { ATLAS_CUDA_SHAPES = 5 };
enum { ATLAS_CUDA_HOST_PARTS = 7 }; /* atlas_cuda_decode_profile.host_us */

typedef struct atlas_cuda_decode_profile {
    const char *name[ATLAS_CUDA_SHAPES]; /* "qkv", "o", "gate_up", "down", "lm_head" */
    int m[ATLAS_CUDA_SHAPES], k[ATLAS_CUDA_SHAPES];
    /* GEMV rates: [0] warp kernel n = 1, [1] block kernel n = 1, [2] mma kernel n = 1,
     * [3] fp32 warp kernel n = 8, [4] mma kernel n = 8, [5] warp kernel with 4 rows a warp
     * n = 1 (weight bytes / time) */
    double gbps[6][ATLAS_CUDA_SHAPES];
    /* GEMVs as a decode graph runs them: chain_len[i] launches of shape chain_shape[i] back
     * to back in one graph (programmatic launch, each on its own weights): microseconds a
     * GEMV, [0] the block kernel, [1..3] gemv1c with 2 / 4 / 8 row groups a block, [4..5]
     * gemv1c with ng from a grid of 2 (the decode's) / 4 blocks an SM. Against the weight
     * bytes at the read bandwidth this is what a kernel boundary costs. */
    int chain_shape[2], chain_len[2];
    double chain_us[6][2];
    double graph_ms;                     /* one replay of the last decode graph (0: none) */
    int graph_nodes;                     /* commands in it */
    /* the host's side of the plain greedy steps so far (atlas_model_forward_argmax on a
     * replayed graph), microseconds a step: [0] from one step's return to the next step's
     * begin_batch (the caller's and the model's code); begin_batch's staging: [1] its checks
     * and the wait for its staging buffer, [2] writing the batch into it; [3] recording the
     * commands, [4] finding their graph, [5] cuGraphLaunch, [6] waiting for the GPU (the
     * replay and the latency of the launch and of the wake-up) */
    double host_us[ATLAS_CUDA_HOST_PARTS];
    long host_steps;
} atlas_cuda_decode_profile;

atlas_status atlas_cuda_profile_decode(atlas_backend *be, atlas_cuda_decode_profile *out);

/* Where the calling thread runs against the GPU's NUMA node (sysfs; what the kernel does not
 * say stays unknown: -1 or ""): the host's part of a decode step is driver calls that write
 * to the GPU, and its time varies threefold between runs of one binary (bench/RESULTS.md,
 * tenth session). */
typedef struct atlas_cuda_cpu_info {
    char pci[32];       /* the GPU's PCI address, dddd:bb:dd.0 */
    int gpu_node;       /* its NUMA node */
    char gpu_cpus[256]; /* the CPUs local to it (local_cpulist) */
    int cpu, cpu_node;  /* the calling thread's CPU now, and that CPU's node */
    char allowed[256];  /* the CPUs this thread may run on, as a list of ranges */
} atlas_cuda_cpu_info;

atlas_status atlas_cuda_cpu_info_get(atlas_backend *be, atlas_cuda_cpu_info *out);

/* Decode graphs the backend has captured and replayed so far: a capture among timed steps
 * is a step recorded and instantiated instead of replayed (milliseconds, not microseconds). */
atlas_status atlas_cuda_graph_counts(atlas_backend *be, uint64_t *captures, uint64_t *replays);

#endif

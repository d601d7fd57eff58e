/* bench/cmd/bench_internal.h — the one internal header the `atlas bench` command (bench.c)
 * may include besides include/atlas/: the bench times single forward passes without the
 * engine's scheduler (model/forward.h), makes models with the backend's diagnostics off
 * (atlas_model_load_opts), and measures the device's ceilings in the same run
 * (bench_cuda.c, which alone reaches into the CUDA backend's state). Nothing in the library
 * calls these; they are built into the `atlas_bench` library for the command and the tests.
 *
 * Ceilings: read bandwidth (kernels/bench.cu reads a buffer once with 16-byte loads), the
 * pinned host-to-device copy rate, and the bf16 matrix rate of each GEMM the backend has.
 * Every function takes a model on the CUDA backend (ATLAS_ERR_INVALID on another). */
#ifndef ATLAS_BENCH_INTERNAL_H
#define ATLAS_BENCH_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "atlas/model.h"
#include "cli/cli.h"
#include "model/forward.h"

typedef struct atlas_bench_ceilings {
    char device[256];
    size_t read_bytes;     /* buffer the probe read */
    double read_gbps;      /* median of the timed reads, 1e9 bytes/s */
    size_t h2d_bytes;      /* pinned host buffer copied to the device */
    double h2d_gbps;       /* median host-to-device copy rate from pinned memory, 1e9 B/s */
    int gemm_size;         /* n = m = k */
    double own_tflops;     /* kernels/gemm.cu (mma.sync, fp32 activations in) */
    double lt_tflops;      /* cuBLASLt bf16 x bf16 -> fp32; 0 when absent */
    char lt_version[32];
} atlas_bench_ceilings;

/* Measures on m's device. Allocates read_bytes + 3 * gemm_size^2 * 4 bytes for the time of
 * the call. */
atlas_status atlas_bench_ceilings_measure(atlas_model *m, size_t read_bytes, int gemm_size,
                                          atlas_bench_ceilings *out);

/* Memory the backend holds, by kind (bytes), and what its weight upload sent through the
 * pinned staging pool (bf16 bytes: every weight). */
typedef struct atlas_bench_memory {
    size_t weights, kv, workspace, total;
    size_t staged_bytes;
} atlas_bench_memory;

atlas_status atlas_bench_memory_get(atlas_model *m, atlas_bench_memory *out);

/* The loader the issue sets as the reference for staged loads: `threads` threads (0: one a
 * core, up to 16) each take the next 64 MiB piece of the model's shards, pread it into a
 * pinned buffer of their own (two each, made before the clock starts) and queue its copy on
 * a stream of their own. What this machine's CPU, page cache and bus give a loader, measured
 * in the same run as the loads. */
typedef struct atlas_bench_file_load {
    size_t bytes;            /* of the files */
    int files;
    double seconds, gbps;    /* from the first read to the last copy's end */
    double setup_s;          /* making the pinned buffers (not in seconds) */
    int threads;
    size_t piece_bytes;
} atlas_bench_file_load;

/* Over the shards of dir that atlas_st_open_dir maps (the index's, not every .safetensors
 * file in the directory). */
atlas_status atlas_bench_file_load_measure(atlas_model *m, const char *dir, int threads,
                                           atlas_bench_file_load *out);

/* The page cache's rate, which the CPU backend's load is judged against: `threads`
 * threads take the next 4 MiB piece of the model's shards in turn (as the backend's readers
 * do) and pread it into a buffer of their own, written before the clock starts; the median
 * of `passes` passes over every shard. Run it after a load, when the files are cached. */
typedef struct atlas_bench_read {
    size_t bytes;      /* of the files */
    int files, threads;
    double seconds, gbps;
    size_t piece_bytes;
} atlas_bench_read;

atlas_status atlas_bench_read_measure(const char *dir, int threads, int passes,
                                      atlas_bench_read *out);

/* Where a decode step's time goes: each GEMV shape of the model (its own geometry, on
 * synthetic weights), and the replay of the last decode graph. */
enum { ATLAS_BENCH_SHAPES = 5, ATLAS_BENCH_GEMVS = 3, ATLAS_BENCH_CHAINS = 6, ATLAS_BENCH_QCHAINS = 5,
       ATLAS_BENCH_QRUNS = 17 };

typedef struct atlas_bench_profile {
    const char *name[ATLAS_BENCH_SHAPES]; /* "qkv", "o", "gate_up", "down", "lm_head" */
    int m[ATLAS_BENCH_SHAPES], k[ATLAS_BENCH_SHAPES];
    /* GEMV rates (weight bytes / time): [0] the one-group block kernel n = 1, [1] the fp32
     * warp kernel n = 8, [2] the mma kernel n = 8 */
    double gbps[ATLAS_BENCH_GEMVS][ATLAS_BENCH_SHAPES];
    /* GEMVs as a decode graph runs them: chain_len[i] launches of shape chain_shape[i] back
     * to back in one graph (programmatic launch, each on its own weights): microseconds a
     * GEMV, [0] the block kernel, [1..3] gemv1c with 2 / 4 / 8 row groups a block, [4..5]
     * gemv1c with ng from a grid of 2 (the decode's) / 4 blocks an SM. Against the weight
     * bytes at the read bandwidth this is what a kernel boundary costs. */
    int chain_shape[2], chain_len[2];
    double chain_us[ATLAS_BENCH_CHAINS][2];
    double graph_ms;                     /* one replay of the last decode graph (0: none) */
    int graph_nodes;                     /* commands in it */
    /* A quantized model: its layout (qfmt NULL: none) on synthetic weights of the first four
     * shapes, packed bytes (codes, scales, zeros) / time of one matmul: [0] n = 1, [1] n = 16
     * and [2] n = 64 on the tensor-core kernels, [3] n = 16 and [4] n = 64 through the bf16
     * scratch copy (dequantize, then the bf16 matmul), [5] and [6] n = 32 each way (the rows
     * between CUDA_QMMA_DEFAULT and CUDA_QMMA_MAX), [7..9] n = 16, 32, 64 on the tensor-core
     * kernels with x split once (cuda_plan.qmma_split) */
    const char *qfmt;
    int q_bc;
    double qgbps[ATLAS_BENCH_QRUNS][ATLAS_BENCH_SHAPES];
    /* One row of the same layout as a decode graph runs it: qchain_len[c] matmuls of shape
     * 1 + c (o, gate_up, down), each on its own weights, in one graph; microseconds a matmul, [0]
     * the one-group kernel, [1] INT4 against int8 x, [2..4] the streaming kernels: 8 stages
     * (the decode's), 4 stages, 8 with int8 x (cuda_qgemv1's CUDA_QGEMV_S, _S4, _SX; a layout
     * one does not take runs the one-group kernel there), and each matmul's packed bytes */
    int qchain_len[3];
    double qchain_us[ATLAS_BENCH_QCHAINS][3], qchain_bytes[3];
} atlas_bench_profile;

atlas_status atlas_bench_profile_decode(atlas_model *m, atlas_bench_profile *out);

/* Where the calling thread runs against the GPU's NUMA node (sysfs; what the kernel does not
 * say stays unknown: -1 or ""): the host's part of a decode step is driver calls that write
 * to the GPU, and its time varies threefold between runs of one binary (bench/RESULTS.md,
 * 2026-12-03). */
typedef struct atlas_bench_cpu_info {
    char pci[32];       /* the GPU's PCI address, dddd:bb:dd.0 */
    int gpu_node;       /* its NUMA node */
    char gpu_cpus[256]; /* the CPUs local to it (local_cpulist) */
    int cpu, cpu_node;  /* the calling thread's CPU now, and that CPU's node */
    char allowed[256];  /* the CPUs this thread may run on, as a list of ranges */
} atlas_bench_cpu_info;

atlas_status atlas_bench_cpu_info_get(atlas_model *m, atlas_bench_cpu_info *out);

/* Decode graphs the backend has captured and replayed so far: a capture among timed steps
 * is a step recorded and instantiated instead of replayed (milliseconds, not microseconds). */
atlas_status atlas_bench_graph_counts(atlas_model *m, uint64_t *captures, uint64_t *replays);

/* Turns cuda_plan.fp8_act on or off for m (ATLAS_ERR_INVALID: not the CUDA backend, or no FP8
 * weights in 128 x 128 blocks); *on_after: whether it is on after a run (cleared where
 * cuBLASLt has no FP8 block matmul). */
atlas_status atlas_bench_fp8_act(atlas_model *m, bool on, bool *on_after);

/* The one-row GEMVs of m's INT4 weights with x rounded to int8 (the streaming kernel's dp4a
 * form, cuda_plan.int8_x, as `--gpu-activations int8` makes it) or not, *was (NULL: not
 * asked) set to what it was: the decode graphs are dropped so that the next steps capture
 * the kernel asked for. ATLAS_ERR_INVALID: not the CUDA backend, or no INT4 weights in
 * groups (act-order has no such kernel). */
atlas_status atlas_bench_int8_x(atlas_model *m, bool on, bool *was);

#endif

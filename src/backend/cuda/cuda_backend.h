/* backend/cuda/cuda_backend.h — the CUDA backend's state, shared by its files.  Internal to
 * backend/cuda.
 *
 *   backend_cuda.c  create/destroy, the op table, memory, KV cache, ops recorded as commands
 *   modules.c       the model's module set: kernels looked up, cuBLASLt opened (cuda_ready)
 *   weight_load.c   weights (upload through the host's staging pool), weights_done
 *   stage.c         the workspace, batch staging (begin_batch), the argmax id ring,
 *                   download/argmax/sync
 *   plan.c          the command queue, the exec list and CUDA-graph capture and replay
 *   ops_cuda.c      one launch function per op (grid shapes, kernel choice), the fusions
 *   ops_moe.c       the mixture-of-experts commands run (routing, experts: kernels/moe.cu)
 *   arch.c          the choices by compute capability and shared memory (portable mode)
 *   cublaslt.c      optional cuBLASLt (dlopen) for large prefill matmuls
 *   weight_fill.c   the bytes of a fused bf16 weight for the staging buffers (pread, convert)
 *   sample_cuda.c   the sample op: its arguments up, kernels/sample.cu, its results down
 *
 * The state (cuda_backend) is a sub-struct a lifetime: dev (from the process host), mod (the
 * module set, made at create), wt (the weights' upload), ws (the workspace, grown for the
 * largest batch), batch (the staged batch and the steps in flight), plan (the queue, graphs
 * and counters).
 *
 * Memory: weights bf16 [rows, cols]; KV cache bf16, per layer K and V pools of
 * [n_blocks * block_size, K, hd]; activations fp32 (act_size 4).
 *
 * Ops are recorded as commands (cuda_cmd). Outside decode they run at once. In a decode
 * batch (one token a sequence) they are queued; the first op that must wait (download,
 * argmax, sync) replays the CUDA graph captured for the same command list, or captures one.
 * Every kernel argument that changes from step to step (tokens, positions, slots, context
 * lengths) is read from the fixed device buffers that begin_batch fills, so a command list
 * that compares equal is the same work. */
#ifndef ATLAS_CUDA_BACKEND_H
#define ATLAS_CUDA_BACKEND_H

#include <stdint.h>

#include <stdbool.h>

#include "backend/backend.h"
#include "backend/cuda/arch.h"
#include "backend/cuda/registry.h"

/* A weight: dense bf16, or quantized (fmt != ATLAS_WFMT_DENSE) as kernels/quant.cu reads it:
 * the codes as stored (FP8 [rows, cols] bytes, INT4 / FP4 [rows, cols / 2]), float32 scales
 * (and INT4's zeros) over the grid [ceil(rows / 2^rsh), scols], a scale covering 2^csh
 * columns (shift 31: all), or with g_idx (GPTQ act-order) a column's group from
 * g_idx[part][cols], the parts of a fused weight beginning at rows 0, p1, p2. rowscale
 * (NVFP4: each part's global factor, taken out of its scales) multiplies the product's rows. */
struct atlas_weight {
    CUdeviceptr ptr; /* bf16 [rows, cols] (1-D: rows 1), or the codes */
    int64_t rows, cols;
    size_t bytes;    /* device bytes held (codes, scales, zeros, g_idx, rowscale) */
    int fmt;         /* atlas_wformat */
    CUdeviceptr scales, zeros, g_idx, rowscale;
    int rsh, csh, scols, p1, p2;
    float *host;     /* the scales and rowscale made at load, kept until the upload is done */
};

struct atlas_kv {
    CUdeviceptr base;  /* [n_layers][2][n_blocks * block_size, K, hd] bf16, or FP8 e4m3 codes */
    int n_blocks, block_size;
    size_t layer_elems; /* n_blocks * block_size * K * hd */
    int es;             /* bytes an element: 2 bf16, 1 FP8 (kv_size at kv_create) */
};

typedef enum cuda_op {
    CUDA_OP_EMBED = 1, CUDA_OP_ADD_RMSNORM, CUDA_OP_MATMUL, CUDA_OP_QK_NORM, CUDA_OP_ROPE,
    CUDA_OP_KV_STORE, CUDA_OP_ATTENTION, CUDA_OP_SWIGLU, CUDA_OP_GATHER, CUDA_OP_ARGMAX,
    CUDA_OP_STAGE, /* the batch's staged ints to the device, and its rope tables (begin_batch) */
    CUDA_OP_MOE_ROUTE, CUDA_OP_MOE_EXPERTS, /* ops_moe.c */
} cuda_op;

/* How a command goes with its neighbours, as the model said it through a fused op of
 * backend.h (backend_cuda.c sets them; cuda_exec_fused links commands by them and by
 * position only, never by comparing their buffers). */
enum {
    CUDA_LINK_RESID = 1 << 0,   /* MATMUL (matmul_residual): the next command, a norm, adds
                                   its output into the residual */
    CUDA_LINK_FEEDS = 1 << 1,   /* ADD_RMSNORM (rmsnorm_matmul): the next command, a MATMUL,
                                   reads its output */
    CUDA_LINK_MIRROR = 1 << 2,  /* MATMUL: its input is rows [row0, row0 + n) of the last
                                   norm's output (cuda_plan.mirror_rows) */
    CUDA_LINK_SWIGLU = 1 << 3,  /* MATMUL: the next command is swiglu of its output */
    CUDA_LINK_ROPE_KV = 1 << 4, /* MATMUL: the next two are rope and kv_store of its output */
    CUDA_LINK_KV = 1 << 5,      /* ROPE: the next command is kv_store of the same qkv */
    CUDA_LINK_CHAIN = 1 << 6,   /* SWIGLU (a swiglu epilogue): the next command is a MATMUL
                                   of its output over the same rows */
};

/* One recorded op. Zero-filled before use so that lists compare with memcmp. */
typedef struct cuda_cmd {
    int op;
    int n, d, layer;  /* layer: SWIGLU's gate activation instead (atlas_glu_kind) */
    int link, row0;   /* CUDA_LINK_* bits; MIRROR's first row */
    const void *p[8]; /* device pointers (activations) and weights/kv handles */
} cuda_cmd;

typedef struct cuda_graph {
    cuda_cmd *cmds;
    int n_cmds;
    CUgraphExec exec;
    uint64_t last_use;
} cuda_graph;

enum { CUDA_MAX_GRAPHS = 8, CUDA_GRAPH_MAX_TOKENS = 64 };

/* The quantized kernels' variants (kernels/quant.cu): a format, INT4 with or without g_idx. */
typedef enum { CUDA_Q_FP8, CUDA_Q_INT4, CUDA_Q_INT4G, CUDA_Q_FP4, CUDA_QKINDS } cuda_qkind;
/* The most activation rows the quantized kernels take (CUDA_QGEMV_MAX with act-order); more
 * are dequantized into the scratch buffer (cuda_workspace.deq) for the bf16 matmuls.  The
 * tensor-core kernels take up to CUDA_QMMA_MAX, but by default only CUDA_QMMA_DEFAULT: each
 * block reads all of x for its 16 weight rows, so at 64 rows they ran at 54-146 GB/s of
 * packed bytes on the 8B shapes against the scratch path's 215-472 (bench/RESULTS.md). */
enum { CUDA_QGEMV_MAX = 8, CUDA_QMMA_MAX = 64, CUDA_QMMA_DEFAULT = 16, CUDA_QGEMV_BPS = 4 };
/* log2 of the columns an INT4 tensor-core kernel's warp takes a step (kernels/quant_mma.cuh
 * CH): a weight whose scale groups are at least this wide takes atlas_qmmq* */
enum { CUDA_QMMA_CHUNK_LOG2 = 7 };
/* cuda_qgemv1's ng for atlas_qgemv1x_int4: INT4 against x rounded to int8 (other formats and
 * act-order take the one-group kernel) */
enum { CUDA_QGEMV_X8 = 1 << 30 };
/* cuda_qgemv1's ng for the streaming kernels (kernels/quant.cu atlas_qgemv1s*: one wave of
 * blocks spanning k, each row's codes and scales loaded rows ahead through a ring of register
 * stages): S 8 stages (FP8, INT4, FP4), S4 4 stages, SX 8 stages with x rounded to int8
 * (INT4); FP4 with a scale a 16 columns (NVFP4) S through a kernel of its own, a scale a half
 * load. A weight they do not take (act-order, a scale group narrower than a load: INT4 groups
 * under 32 columns; more than 512 loads a row; a block that does not fit an SM) takes the
 * one-group kernel. */
enum { CUDA_QGEMV_S = 1 << 29, CUDA_QGEMV_S4, CUDA_QGEMV_SX, CUDA_QSTREAMS = 3 };

/* Kernels looked up once at create. */
typedef struct cuda_fns {
    CUfunction embed, gather_rows, add_rmsnorm, qk_norm, rope, kv_store, swiglu, argmax;
    CUfunction argmax_wide;    /* many blocks a row (ops_cuda.c) */
    CUfunction swiglu_bf16;    /* prefill: bf16 gate_up in, bf16 matmul input out */
    CUfunction gemv4, gemv8, gemm, f32_to_bf16, add_bias; /* gemv4/8: 2-8 rows, k % 32 != 0 */
    CUfunction attn_split, attn_combine, rope_kv, stage;
    CUfunction attn_prefill;   /* the tiled prefill kernel of the model's head_dim; NULL: none */
    CUfunction gemv1b;         /* 1 row, a block of 256 threads for 4 weight rows */
    CUfunction gemv1c[3];      /* ng row groups a block: plain, swiglu, qkv (kernels/gemv.cu) */
    CUfunction gemv1c_norm[3], gemv1c_resid; /* the same with the norm / residual fusions */
    CUfunction gemv_mma;       /* 2..8 rows on the tensor cores (kernels/gemv.cu) */
    CUfunction gemv1b_norm, gemv1b_resid; /* decode's fusions */
    CUfunction gemv1b_swiglu[2], gemv1b_qkv[2]; /* [norm]: GEMV + swiglu / rope + kv_store */
    CUfunction attn_dec[3][4]; /* head_dim 64/128/256 x up to 1/2/4/8 query heads a kv head */
    CUfunction attn_dcl[2];    /* clusters of 4-warp blocks, head_dim 64/128, a query head a
                                  block (sm_90+) */
    /* an FP8 KV cache's kernels (the _fp8 ones; looked up by its first kv_create): the
     * stores, the split and prefill attention, the decode kernels as attn_dec (no cluster
     * kernel: the dec kernels run there) */
    CUfunction kv_store8, rope_kv8, attn_split8, attn_prefill8, attn_dec8[3][4];
    CUfunction gemv1b_qkv8[2], gemv1c_qkv8[2]; /* [norm]: the qkv epilogue into FP8 */
    /* quantized weights (kernels/quant.cu), by cuda_qkind: one row; 2..8 rows with g_idx;
     * up to 8, 16, 32, 64 rows on the tensor cores (no g_idx); the bf16 scratch copy */
    CUfunction qgemv1[CUDA_QKINDS], qgemv1c[CUDA_QKINDS], qgemv1x, qgemv8_g;
    CUfunction qmma[CUDA_QKINDS][4], qdequant[CUDA_QKINDS];
    /* the same on x split beforehand (plan.qmma_split), and the split: FP8's pairs, then the
     * 4-bit formats' */
    CUfunction qmmp[CUDA_QKINDS][4], qsplit[2];
    /* atlas_qmmq<NG>_int4: qmmp of INT4 with a scale a 128-column chunk only (fewer
     * registers: plan.qmma_chunk) */
    CUfunction qmmq[4];
    /* atlas_qmmw<NG>x<RT>_int4 by NG 1, 2 and RT 2, 4: qmmq with RT tiles of 16 rows a block
     * (plan.qmma_wide) */
    CUfunction qmmw[2][2];
    /* the streaming one-row kernels by kind and CUDA_QGEMV_S + i (NULL: none), and their
     * blocks an SM by warps a block (-1: the block does not fit) */
    CUfunction qgemv1s[CUDA_QKINDS][CUDA_QSTREAMS];
    int qgemv1s_bps[CUDA_QKINDS][CUDA_QSTREAMS][17];
    CUfunction qgemv1s16;      /* the streaming kernel of FP4 with a scale a 16 columns */
    int qgemv1s16_bps[17];
    CUfunction qrowscale;
    CUfunction fp8_actq; /* x as e4m3 a row and 128 columns, for plan.fp8_act */
    /* INT4 as stored, repacked at load (weight_load.c): GPTQ's codes, AWQ's, the grids */
    CUfunction repack_gptq, repack_awq, repack_grids;
    /* mixture-of-experts layers (kernels/moe.cu; loaded for a model with experts) */
    CUfunction moe_logits, moe_topk, moe_plan, moe_combine;
    /* the expert kernels, [0] bf16 and [1] MXFP4 experts (kernels/moe.cu) */
    CUfunction moe_gu_slots[2], moe_down_slots[2], moe_gu_grouped[2], moe_down_grouped[2];
    CUfunction sample;         /* the sample op (kernels/sample.cu; looked up at its first use) */
    CUfunction sample_ids;     /* its queued steps' draw (sample_queue) */
} cuda_fns;

typedef struct cuda_lt cuda_lt; /* cublaslt.c */

/* One part of an INT4 weight uploaded as stored (backend.h atlas_int4_order) into the regions
 * it ends in (its rows of the codes and of both grids), repacked there at weights_done. */
typedef struct cuda_repack {
    const struct atlas_weight *w; /* whose regions these are (dropped when it is freed) */
    CUdeviceptr codes, scales, zeros;
    int rows, cols, groups;
    int awq;         /* the order: AWQ's, else GPTQ's */
    int sdt;         /* the stored scales: 0 f32, 1 f16, 2 bf16 */
    float zero_add;
} cuda_repack;

/* The weight upload: every weight is queued for the host's loader threads (host.h). */
typedef struct cuda_load {
    size_t staged_bytes;      /* bytes weight_load sent through the staging pool: the
                                 backend's count of what it uploaded (atlas bench prints it) */
    bool pending;             /* weights queued since the last weights_done: some may be in
                                 flight (wait before freeing one) */
    struct atlas_tier_use *tier; /* this load's use of the host tier (host_tier.h), until
                                    weights_done or destroy; NULL: none */
    struct atlas_tier_use *tier_fill; /* the image's fill after the load (atlas_tier_close),
                                    started by the op tier_fill once the model serves, ended
                                    before the first weight is freed; NULL: none */
    cuda_repack *repacks;     /* the load's INT4 parts to repack at weights_done */
    int n_repacks, cap_repacks;
} cuda_load;

/* The most sources weight_load fuses into one queued upload (qkv: 3). */
#define CUDA_FUSE_MAX 4

/* From the process host (host.h): set at create and never changed. The host and its stream
 * outlive every backend; nothing here is freed at destroy. */
typedef struct cuda_device {
    atlas_host *host;
    CUstream stream;        /* the host's model stream (atlas_host_stream) */
    void *launch_ex;        /* cuLaunchKernelEx when programmatic dependent launch is on
                               (Hopper and later, unless atlas_backend_options.no_pdl) */
    void *cluster_ex;       /* cuLaunchKernelEx for the cluster attention kernels (sm_90+);
                               NULL: none */
    cuda_arch arch;         /* the kernel choices for this device (arch.h) */
} cuda_device;

/* The model's module set and constants: made once at create (cuda_setup, cuda_ready) for the
 * model's geometry; freed at destroy (atlas_registry_release unloads the modules and frees
 * every device allocation left, the other sub-structs' included). */
typedef struct cuda_modules {
    atlas_registry *reg;
    cuda_fns fn;
    bool ready;             /* kernels and cuBLASLt loaded (cuda_ready) */
    bool quant_ready;       /* the quantized formats' kernels loaded (cuda_quant_ready) */
    bool kv8_ready;         /* the FP8 KV cache's kernels looked up (cuda_kv8_ready) */
    bool sample_ready;      /* the sample op's kernel loaded (cuda_sample_ready) */
    bool want_lt;           /* cuBLASLt wanted (not atlas_backend_options.no_cublaslt) */
    cuda_lt *lt;            /* NULL when cuBLASLt is absent or disabled */
    double *inv_freq;       /* [3][hd/2] host copy: set 0's frequencies, longrope's long ones,
                               set 1's (geom's pointers point here; zeros past rope_dim/2) */
    int32_t *layer_window;  /* [n_layers] host copy of geom.layer_window, or NULL */
    uint8_t *layer_rope_set; /* [n_layers] host copy of geom.layer_rope_set, or NULL */
    float *kv_scales;       /* [2 * n_layers] host copy of geom.kv_scales, or NULL (all 1) */
    CUdeviceptr d_inv_freq; /* [3][hd/2] float, as inv_freq */
} cuda_modules;

/* The weights and KV caches the caller holds (it frees each handle before destroy): the
 * upload in flight and the bytes held. */
typedef struct cuda_weights {
    cuda_load load;
    size_t weight_bytes, kv_bytes; /* held now, for `atlas bench` */
    size_t deq_need; /* bytes of the largest quantized weight as bf16 (the scratch it needs) */
    bool has_q;      /* a quantized weight was loaded: qlayout is the first one's layout (its
                        pointers not kept), which `atlas bench` times on the model's shapes */
    atlas_wquant qlayout;
} cuda_weights;

/* The workspace: device and pinned buffers for the largest batch seen, grown by begin_batch
 * (stage_grow and the attention and cuBLASLt buffers after it; never shrunk: the graphs hold
 * their addresses, so they go first, graphs_release) except lt_a and lt_ws, made with the
 * cuBLASLt handle at create; freed at destroy. */
typedef struct cuda_workspace {
    int cap_tok, cap_table; /* tokens and block-table ints the staging buffers take */
    CUdeviceptr d_rope;     /* [1 + n_rope_sets][cap_tok, hd/2] (cos, sin) of the batch's
                               positions, a table a RoPE set (cuda_rope_table) */
    int32_t *h_stage[2];    /* pinned and mapped, [CUDA_STAGE_TABLE * cap_tok + cap_table]
                               each: a batch's
                               CUDA_OP_STAGE command (the first of its list, so the first node
                               of a decode graph) reads it; batches take turns only when the
                               last one's may still be read (a queued step), so plain steps
                               use one buffer and so one graph */
    CUdeviceptr m_stage[2]; /* h_stage as the device addresses it */
    CUevent stage_sent[2];  /* recorded after a buffer's batch when the next one begins before
                               the stream was waited for */
    CUdeviceptr d_stage;    /* same layout, regions of stage_stride ints: tokens, positions,
                               slots, tok_seq, logit_rows, tiles (first token, count) [2 x],
                               longrope's choice a token (1: the long set), then
                               block_table */
    CUdeviceptr d_ids;      /* [cap_tok] argmax results, then the wide argmax's scratch
                               (cuda_ids_bytes) */
    /* the argmax kernels write their ids into h_ids too (pinned and mapped, [3][ids_cap]):
     * slot 2 a plain argmax's (IDS_PLAIN, stage.c); slots 0 and 1 the greedy steps queued a
     * step ahead (argmax_queue): cuda_batch's aq_n slots from aq_head wait to be collected,
     * aq_done marks each one's kernel done */
    int32_t *h_ids;
    CUdeviceptr m_ids;      /* h_ids as the device addresses it */
    int ids_cap;            /* ids a slot of h_ids */
    CUevent aq_done[2];
    /* attention split-K workspace */
    CUdeviceptr part_o, part_ml;
    CUdeviceptr attn_counters; /* [counter_cap, H] ints (a block of heads a counter, at most
                                  H of them), zero between launches */
    int counter_cap;
    size_t part_bytes;
    CUdeviceptr lt_a;       /* bf16 copy of x for cuBLASLt */
    size_t lt_a_bytes;
    CUdeviceptr lt_ws;      /* cuBLASLt workspace */
    size_t lt_ws_bytes;
    CUdeviceptr lt_h;       /* bf16 copy of the last RMSNorm's output [cap, d] (begin_batch) */
    size_t lt_h_bytes;
    CUdeviceptr deq;        /* a quantized weight as bf16, for batches of more than
                               CUDA_QGEMV_MAX rows (begin_batch) */
    size_t deq_bytes;
    CUdeviceptr moe;        /* mixture-of-experts routing and expert buffers (ops_moe.c
                               cuda_moe_ws_bytes; begin_batch) */
    size_t moe_bytes;
    int moe_chunk;          /* tokens of one grouped expert pass; 0: as many as fit
                               CUDA_MOE_WS_MAX (tests set it, to reach the chunking) */
    /* the sample op's arguments and results (sample_cuda.c): rows and adjustments in, the
     * raw values of the adjusted logits, outputs; on the device and pinned on the host */
    CUdeviceptr d_smp;
    void *h_smp;
    size_t smp_bytes;
    /* the rows of the sampled steps queued a step ahead (sample_queue, stage.c): pinned and
     * mapped, [2][sq_cap = cap_tok], a slot each as h_ids' 0 and 1; made with h_ids */
    void *h_sq;
    CUdeviceptr m_sq;
    int sq_cap;
} cuda_workspace;

/* The staged batch, set by begin_batch and read by its commands until the next one; and the
 * steps in flight across batches: which staging buffer may still be read, the argmax steps
 * queued a step ahead (argmax_queue until argmax_collect). */
typedef struct cuda_batch {
    /* the staged batch (its host mirror and fixed device buffers of cap_tok / cap_table ints
     * are the workspace's h_stage and d_stage) */
    int n_tokens, n_seqs, n_logits, max_blocks, block_size;
    int n_tiles;            /* prefill attention tiles (<= 64 tokens of one sequence) */
    int stage_stride;       /* ints a staged region takes in this batch: its tokens rounded up
                               to 16, at most cap_tok (a function of the batch's size, so that
                               a graph replayed for the same size finds its regions where it
                               was recorded), so a step of one token copies 0.5 KB and not
                               7 x cap_tok ints */
    bool stage_busy[2];     /* its batch was queued and the stream not waited for since */
    int stage_cur;          /* the last batch's */
    CUdeviceptr tok_ids;    /* d_ids when staged tokens v < 0 name the step before's ids
                               (atlas_batch.tokens), else 0 */
    int n_split, chunk;     /* the attention split-K plan of the batch */
    int aq_head, aq_n, aq_rows[2]; /* the queued argmax steps in h_ids (cuda_workspace) */
    bool ids_queued;        /* d_ids holds the last queued argmax's ids (argmax_queue) */
} cuda_batch;

/* The plan: how recorded commands run (options fixed at create), the queue of a batch's
 * commands and the CUDA graphs captured of decode steps (dropped before the workspace moves
 * and at destroy), and what ran, counted.
 * Commands and graphs: inside a batch the ops are queued and run at the next flush
 * (download, argmax, sync), so that cuda_exec_fused sees what follows each op; a decode batch's
 * list runs as a CUDA graph. */
typedef struct cuda_plan {
    int deferring;          /* 1 inside a batch */
    int graphing;           /* 1 inside a decode batch: the queue is captured / replayed */
    cuda_cmd *queue;
    int n_queue, cap_queue;
    cuda_graph graphs[CUDA_MAX_GRAPHS];
    uint64_t clock;
    int use_graphs;         /* 0 with atlas_backend_options.no_graphs */
    bool pdl_fence;         /* the next launch without PDL (after the staging kernel) */
    int gemv_ng;            /* row groups a block of the one-row GEMVs: 0 (every model) from
                               a grid of 2 blocks an SM (gemv1c, or gemv1b when that gives one
                               group a block: bench/RESULTS.md); > 0 fixed, set by tests only,
                               so that their small shapes reach gemv1c */
    int qgemv_ng;           /* the quantized one-row GEMVs' ng as cuda_qgemv1 takes it:
                               CUDA_QGEMV_S (every model) the streaming kernel where the
                               layout has one scale a load, else the one-group kernel; other
                               values set by tests only */
    int qmma_max;           /* rows above which a quantized weight's matmul goes through its
                               bf16 scratch copy: 0 (every model) CUDA_QMMA_DEFAULT, else
                               this up to CUDA_QMMA_MAX; set by `atlas bench` to time both
                               ways */
    bool qmma_split;        /* those tensor-core kernels on x split once a matmul
                               (atlas_qsplit_*, atlas_qmmp*) where the scratch buffer holds
                               it; on (every model); set by tests and `atlas bench`
                               to time and check both ways */
    int qmma_wide;          /* atlas_qmmq's matmuls of up to 16 rows through atlas_qmmw*x<rt>
                               (rt tiles of 16 weight rows a block, x loaded once for them):
                               -1 (every model) rt by the weight's rows (cuda_qmmw_tiles),
                               2 or 4 that rt, 0 not; set by tests and `atlas bench` */
    bool qmma_chunk;        /* INT4 with groups of 128 columns or more through atlas_qmmq*
                               instead of atlas_qmmp*: on (every model); set by tests and
                               `atlas bench` to check and time both */
    bool fp8_act;           /* FP8 weights in 128 x 128 blocks multiplied past cuda_qmma_max
                               rows on FP8 tensor cores, x rounded to e4m3 a row and 128
                               columns (as the checkpoints' dynamic activations ask): off
                               (every model) until measured; set by tests and `atlas bench`;
                               cleared where cuBLASLt has no such matmul */
    bool int8_x;            /* INT4 weights' one-row GEMVs with x in int8 (CUDA_QGEMV_SX, the
                               streaming kernel's dp4a form) whatever qgemv_ng says:
                               atlas_backend_options.int8_x (`--gpu-activations int8`) */
    unsigned skip_ops;      /* 1 << op of ops not run (atlas_backend_options.skip_ops; timing
                               only) */
    int mirror_rows;        /* rows of the last norm's output that lt_h mirrors in bf16 (0:
                               none: that norm wrote no copy); exec_list scope */
    int mirror_d;
    const void *pending_delta; /* a residual add deferred by add or matmul_residual into the
                                  next norm (backend.h's hand-off); NULL: none */
    /* counted as part of the backend's job (no clocks: `atlas bench` times around the
     * calls): tests check that decode steps replay graphs and that the fusions ran */
    uint64_t graph_captures, graph_replays;
    uint64_t fused_away;    /* commands that ran inside another's kernel (cuda_exec_fused) */
} cuda_plan;

typedef struct cuda_backend {
    atlas_backend base; /* first: the op table sees this */
    cuda_device dev;
    cuda_modules mod;
    cuda_weights wt;
    cuda_workspace ws;
    cuda_batch batch;
    cuda_plan plan;
} cuda_backend;

/* d_ids: ids [ct] (int), best [ct] (u64, from a 16-byte boundary), count [ct] (int) */
static inline size_t cuda_ids_best(int ct) { return ((size_t)ct * 4 + 15) & ~(size_t)15; }
static inline size_t cuda_ids_bytes(int ct) { return cuda_ids_best(ct) + (size_t)ct * 12; }

/* device pointers held in void* */
#define CUDA_PTR(p) ((CUdeviceptr)(uintptr_t)(p))

static inline CUdeviceptr cuda_stage_ptr(const cuda_backend *cb, int which) {
    return cb->ws.d_stage + (size_t)which * cb->batch.stage_stride * sizeof(int32_t);
}
enum { CUDA_STAGE_TOKENS, CUDA_STAGE_POS, CUDA_STAGE_SLOTS, CUDA_STAGE_SEQ, CUDA_STAGE_ROWS,
       CUDA_STAGE_TILES, CUDA_STAGE_LONG = 7, CUDA_STAGE_TABLE = 8 };

/* The rope table of layer's RoPE set (geom.layer_rope_set) in d_rope. */
static inline CUdeviceptr cuda_rope_table(const cuda_backend *cb, int layer) {
    const uint8_t *set = cb->base.geom.layer_rope_set;
    return cb->ws.d_rope + (size_t)(set ? set[layer] : 0) * cb->ws.cap_tok *
                               (cb->base.geom.head_dim / 2) * 2 * sizeof(float);
}

static inline cuda_backend *cuda_of(atlas_backend *be) { return (cuda_backend *)be; }

/* A gate activation as the kernels take it, by value (kernels/common.cuh glu_act, the same
 * layout): kind (atlas_glu_kind, a command's layer for SWIGLU) with the model's clamp
 * parameters, which only ATLAS_GLU_SWIGLU_CLAMP reads. */
typedef struct cuda_glu_act {
    int kind;
    float alpha, limit;
} cuda_glu_act;

static inline cuda_glu_act cuda_glu_of(const cuda_backend *cb, int kind) {
    return (cuda_glu_act){kind, cb->base.geom.glu_alpha, cb->base.geom.glu_limit};
}

/* ops_cuda.c: runs one command now (on the stream; captured when capturing). */
atlas_status cuda_exec(cuda_backend *cb, const cuda_cmd *c);
/* ops_cuda.c: runs the head of the list c[0, n), fusing neighbours where it can (decode
 * graphs); returns how many commands ran, *st the status. */
int cuda_exec_fused(cuda_backend *cb, const cuda_cmd *c, int n, atlas_status *st);
/* ops_cuda.c: a one-row block GEMV over `groups` groups of 4 rows, launched as the ops
 * launch (PDL when it is on): `multi` (a gemv1c kernel, which takes ng, a[na - 1], after the
 * arguments of `single`; set here, the caller leaves it NULL) with ng > 1 row groups a block,
 * else `single`, a group a block (which reads no extra argument). multi NULL: always single.
 * `atlas bench` chains GEMVs with it. */
atlas_status cuda_gemv_rows(cuda_backend *cb, CUfunction single, CUfunction multi, int groups,
                            int ng, void **a, int na);
/* ops_cuda.c: the row groups a block when `groups` are spread over a grid of bps blocks an
 * SM. */
int cuda_gemv_ng_for_grid(const cuda_backend *cb, int groups, int bps);
/* ops_cuda.c: the most rows a quantized weight's tensor-core kernels take (cuda_plan.qmma_max,
 * else CUDA_QMMA_DEFAULT); more go through its bf16 scratch copy. */
int cuda_qmma_max(const cuda_backend *cb);
/* ops_cuda.c: tiles of 16 rows a block atlas_qmmw takes for a weight of m rows (2 or 4). */
int cuda_qmmw_tiles(const cuda_backend *cb, int m);
/* One row of quantized w (no fusions): out[m] = x[k] @ w^T (+ bias).  ng 0: the one-group
 * kernel (atlas_qgemv1_<fmt>); > 0: atlas_qgemv1c_<fmt> with ng row groups a block; -B: ng
 * from a grid of B blocks an SM; CUDA_QGEMV_X8: atlas_qgemv1x_int4; CUDA_QGEMV_S, _S4, _SX:
 * the streaming kernels (atlas_qgemv1s*) where they take w.  Act-order weights always take
 * the one-group kernel. */
atlas_status cuda_qgemv1(cuda_backend *cb, const atlas_weight *w, CUdeviceptr out, CUdeviceptr x,
                         int ng);
/* ops_cuda.c: launches f on the backend's stream as every op does (PDL when it is on; an
 * empty grid does nothing). */
atlas_status cuda_launch(cuda_backend *cb, CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                         unsigned block, unsigned smem, void **args);
/* ops_cuda.c: cuLaunchKernelEx from the loaded driver, or NULL. */
void *cuda_pdl_resolve(void);
/* ops_cuda.c: query heads a block of the split attention kernel for groups of G heads of
 * head_dim hd (a divisor of G that fits its shared memory); 0: none fits. */
int cuda_attn_split_heads(int G, int hd, int smem_budget);
/* ops_cuda.c: split count and chunk for attention over `cap` positions with n tokens;
 * false when the kernel merges its splits without the partials buffers (clusters). */
bool cuda_attn_split_plan(const cuda_backend *cb, int n, int cap, int *n_split, int *chunk);

/* ops_moe.c: a mixture-of-experts command run (backend_cuda.c records moe_route and
 * moe_experts as CUDA_OP_MOE_*; plan.c runs them here, never fused), the workspace bytes a
 * batch of n tokens needs (begin_batch reserves them: nothing is allocated inside a captured
 * graph), and the kernels, loaded at create for a model with experts. */
enum { CUDA_MOE_WS_MAX = 256 << 20 };
atlas_status cuda_moe_exec(cuda_backend *cb, const cuda_cmd *c);
size_t cuda_moe_ws_bytes(const cuda_backend *cb, int n);
atlas_status cuda_moe_ready(cuda_backend *cb);

/* modules.c: loads the kernels and cuBLASLt on first use: before anything launches. */
atlas_status cuda_ready(cuda_backend *cb);
/* modules.c: fn(cb) where the device is quiet (atlas_host_quiet_call): the ready functions
 * load kernel modules through it, which waits for an idle device holding the context. */
atlas_status cuda_quietly(cuda_backend *cb, atlas_status (*fn)(cuda_backend *));

/* modules.c: loads the quantized formats' kernels (kernels/quant.cu) on first use. */
atlas_status cuda_quant_ready(cuda_backend *cb);
/* modules.c: looks up the FP8 KV cache's kernels (cuda_fns.kv_store8 ...) on first use. */
atlas_status cuda_kv8_ready(cuda_backend *cb);
enum { CUDA_SAMPLE_THREADS = 1024 }; /* kernels/sample.cu's block */
/* modules.c: loads the sample op's kernel (kernels/sample.cu) on first use: a model that
 * only decodes greedily never pays for its lookup. */
atlas_status cuda_sample_ready(cuda_backend *cb);
/* sample_cuda.c: backend.h's sample op. */
atlas_status cuda_sample(atlas_backend *be, atlas_sample_out *out, void *logits, int rows,
                         int vocab, const atlas_sample_row *p, const atlas_sample_adj *adj,
                         int n_adj);

/* weight_load.c: the op table's weight_load, weight_free and weights_done. */
atlas_status cuda_weight_load(atlas_backend *be, const atlas_weight_src *const *srcs, int n,
                              atlas_weight **out);
void cuda_weight_free(atlas_backend *be, atlas_weight *w);
atlas_status cuda_weights_done(atlas_backend *be);
/* The load is over: the registry's stream becomes the serving stream (backend.h's loaded);
 * the first op or batch does it where no load called it (tests, atlas bench).  Cheap once
 * done. */
atlas_status cuda_loaded(atlas_backend *be);
void cuda_tier_fill(atlas_backend *be);
atlas_status cuda_serving(cuda_backend *cb);
atlas_status cuda_host_tier(atlas_backend *be, uint64_t key, size_t budget, size_t expect,
                            int *hit, const char **off);

/* plan.c: runs the queued commands (a decode step's as a CUDA graph). */
atlas_status cuda_flush(cuda_backend *cb);
/* plan.c: runs c now, or queues it inside a batch. */
atlas_status cuda_submit(cuda_backend *cb, const cuda_cmd *c);
/* plan.c: cuda_submit of the command with these fields (the rest zero). */
atlas_status cuda_cmd4(cuda_backend *cb, int op, int n, int d, int layer, const void *p0,
                       const void *p1, const void *p2, const void *p3);
/* plan.c: the same with links (CUDA_LINK_*) and a mirror row. */
atlas_status cuda_cmd_linked(cuda_backend *cb, int op, int n, int d, int layer, int link,
                             int row0, const void *p0, const void *p1, const void *p2,
                             const void *p3);
/* plan.c: runs a list, fusing neighbours where it can (decode graphs). */
atlas_status cuda_exec_list(cuda_backend *cb, const cuda_cmd *c, int n);
/* plan.c: destroys every captured graph. */
void cuda_plan_drop_graphs(cuda_backend *cb);
/* plan.c: at destroy, the graphs (when the registry was made) and the queue. */
void cuda_plan_release(cuda_backend *cb);

/* stage.c: the scratch buffer (cuda_workspace.deq) for the largest quantized weight loaded,
 * made (or grown) by begin_batch, inside the workspace reserve the engine keeps beside the KV
 * pool. */
atlas_status cuda_deq_reserve(cuda_backend *cb);
/* stage.c: the op table's begin_batch, download, argmax, argmax_queue, sample_queue,
 * argmax_collect, argmax_ready and sync. */
atlas_status cuda_begin_batch(atlas_backend *be, const atlas_batch *b, int block_size);
atlas_status cuda_download(atlas_backend *be, float *host, const void *x, size_t count);
atlas_status cuda_argmax(atlas_backend *be, int32_t *ids, const void *logits, int rows,
                         int vocab);
atlas_status cuda_argmax_queue(atlas_backend *be, const void *logits, int row0, int rows,
                               int vocab);
atlas_status cuda_argmax_collect(atlas_backend *be, int32_t *ids, int rows);
int cuda_argmax_ready(atlas_backend *be);
atlas_status cuda_sample_queue(atlas_backend *be, const void *logits, int row0, int rows,
                               int vocab, const atlas_sample_row *p);
atlas_status cuda_sync(atlas_backend *be);
/* stage.c: at destroy, the workspace's pinned buffers and events (the registry's release
 * frees its device buffers); a failure is kept for that release to report. */
void cuda_workspace_release(cuda_backend *cb);

/* cublaslt.c (optional; every function is safe with lt NULL). */
atlas_status cuda_lt_create(cuda_lt **out); /* ATLAS_ERR_NOT_FOUND when absent */
/* Opens the library once for the process (what cuda_lt_create would at the first load: 100-300
 * ms), so that atlas_host_start can do it beside the first load; ATLAS_ERR_NOT_FOUND. */
atlas_status cuda_lt_open_library(void);
atlas_status cuda_lt_free(cuda_lt *lt); /* ATLAS_ERR_DEVICE when cublasLtDestroy fails */
/* out[n, m] (fp32, or bf16 with out_bf16) = a[n, k] (bf16) @ w[m, k]^T (bf16) on stream. */
atlas_status cuda_lt_matmul(cuda_lt *lt, CUstream stream, CUdeviceptr out, int out_bf16,
                            CUdeviceptr a, CUdeviceptr w, int n, int m, int k, CUdeviceptr ws,
                            size_t ws_bytes);
/* out[n, m] (fp32) = a[n, k] @ w[m, k]^T on FP8 tensor cores: a e4m3 with a_scales a float a
 * row and 128 columns ([k / 128][n], row fastest), w e4m3 with w_scales one a 128 x 128 block
 * ([m / 128][k / 128]); k % 128 == 0, m % 16 == 0, n % 4 == 0 (cuBLASLt 12.9+ on sm_90+:
 * ATLAS_ERR_UNSUPPORTED where it has no algorithm for them). */
atlas_status cuda_lt_matmul_fp8(cuda_lt *lt, CUstream stream, CUdeviceptr out, CUdeviceptr a,
                                CUdeviceptr a_scales, CUdeviceptr w, CUdeviceptr w_scales, int n,
                                int m, int k, CUdeviceptr ws, size_t ws_bytes);
const char *cuda_lt_version(const cuda_lt *lt);

#endif

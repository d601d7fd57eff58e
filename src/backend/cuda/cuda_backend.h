/* backend/cuda/cuda_backend.h — the CUDA backend's state, shared by its files.  Internal to
 * backend/cuda.
 *
 *   backend_cuda.c  create/destroy, memory, weights (upload), KV cache, batch staging, the
 *                   command queue and CUDA-graph replay, download/argmax/sync
 *   ops_cuda.c      one launch function per op (grid shapes, kernel choice)
 *   cublaslt.c      optional cuBLASLt (dlopen) for large prefill matmuls
 *   weight_fill.c   the bytes of a fused bf16 weight for the staging buffers (pread, convert)
 *   direct.c        bf16 weights copied by the copy engine out of the registered file mapping
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

#include "backend/backend.h"
#include "backend/cuda/bench_cuda.h"
#include "backend/cuda/direct.h"
#include "backend/cuda/registry.h"
#include "core/threadpool.h"

struct atlas_weight {
    CUdeviceptr ptr; /* bf16 [rows, cols] (1-D: rows 1) */
    int64_t rows, cols;
};

struct atlas_kv {
    CUdeviceptr base;  /* [n_layers][2][n_blocks * block_size, K, hd] bf16 */
    int n_blocks, block_size;
    size_t layer_elems; /* n_blocks * block_size * K * hd */
};

typedef enum cuda_op {
    CUDA_OP_EMBED = 1, CUDA_OP_ADD_RMSNORM, CUDA_OP_MATMUL, CUDA_OP_QK_NORM, CUDA_OP_ROPE,
    CUDA_OP_KV_STORE, CUDA_OP_ATTENTION, CUDA_OP_SWIGLU, CUDA_OP_GATHER, CUDA_OP_ARGMAX,
    CUDA_OP_STAGE, /* the batch's staged ints to the device, and its rope table (begin_batch) */
} cuda_op;

/* One recorded op. Zero-filled before use so that lists compare with memcmp. */
typedef struct cuda_cmd {
    int op;
    int n, d, layer;
    const void *p[4]; /* device pointers (activations) and weights/kv handles */
} cuda_cmd;

typedef struct cuda_graph {
    cuda_cmd *cmds;
    int n_cmds;
    CUgraphExec exec;
    uint64_t last_use;
} cuda_graph;

enum { CUDA_MAX_GRAPHS = 8, CUDA_GRAPH_MAX_TOKENS = 64 };

/* Kernels looked up once at create. */
typedef struct cuda_fns {
    CUfunction embed, gather_rows, add_rmsnorm, qk_norm, rope, kv_store, swiglu, argmax;
    CUfunction argmax_wide;    /* many blocks a row (ops_cuda.c) */
    CUfunction swiglu_bf16;    /* prefill: bf16 gate_up in, bf16 matmul input out */
    CUfunction gemv1, gemv4, gemv8, gemm, f32_to_bf16, add_bias;
    CUfunction attn_split, attn_combine, rope_kv, stage;
    CUfunction attn_prefill;   /* the tiled prefill kernel of the model's head_dim; NULL: none */
    CUfunction gemv1b;         /* 1 row, a block of 256 threads for 4 weight rows */
    CUfunction gemv1c[3];      /* ng row groups a block: plain, swiglu, qkv (kernels/gemv.cu) */
    CUfunction gemv1c_norm[3], gemv1c_resid; /* the same with the norm / residual fusions */
    CUfunction gemv_mma;       /* 2..8 rows on the tensor cores (kernels/gemv.cu) */
    CUfunction gemv1r4;        /* 1 row, 4 weight rows a warp */
    CUfunction gemv1_norm, gemv1_resid, gemv1b_norm, gemv1b_resid; /* decode's fusions */
    CUfunction gemv1b_swiglu[2], gemv1b_qkv[2]; /* [norm]: GEMV + swiglu / rope + kv_store */
    CUfunction attn_dec[3][4]; /* head_dim 64/128/256 x up to 1/2/4/8 query heads a kv head */
    CUfunction attn_dcl[2][3]; /* clusters, head_dim 64/128, 1/2/4 heads a block (sm_90+) */
    CUfunction attn_dcl_w4[2][2]; /* the same, 4 warps a block, 1/2 heads (ATLAS_CUDA_ATTN_WARPS) */
} cuda_fns;

typedef struct cuda_lt cuda_lt; /* cublaslt.c */

/* How weights reach the device (ATLAS_LOAD; kernels/README.md): all through the pinned
 * staging pool, bf16 views from a file by the copy engine out of the page cache (the rest
 * staged), or that with a share of the pieces staged at the same time. */
typedef enum cuda_load_mode { CUDA_LOAD_DIRECT, CUDA_LOAD_STAGE, CUDA_LOAD_MIX } cuda_load_mode;

typedef struct cuda_load {
    int configured;           /* the switches below were read (first weight_load) */
    cuda_load_mode mode;
    atlas_direct_opts opts;   /* ATLAS_LOAD_PIECE_MB, _THREADS, _STAGE_PCT */
    atlas_direct *direct;     /* copies weight_load queued for weights_done; NULL: none yet */
    size_t staged_bytes;      /* bf16 bytes weight_load sent through the staging pool */
    atlas_direct_stats runs;  /* the direct runs, bytes, pieces and ms summed */
    size_t fill_piece;        /* bytes a pool thread reads at a time into a staging chunk */
    bool queue;               /* staged views go to the host's loader threads (ATLAS_LOAD_QUEUE) */
    bool pending;             /* weights uploaded or queued since the last weights_done: some
                                 may be in flight (wait before freeing one) */
    double made_ms;           /* when the backend was created (atlas_now_ms) */
    atlas_cuda_load_times t;  /* where the load's time went, for atlas bench */
} cuda_load;

/* The most views weight_load fuses into one queued upload (qkv: 3); more are staged here. */
#define CUDA_FUSE_MAX 4

/* stamps of a plain decode step (cuda_backend.hs): begin_batch entered, its staging buffer
 * free (normally: the stream was waited for), the batch written into it (staged), flush
 * entered (commands recorded), graph found, launched; then the wait's end (index CUDA_HS_N) */
enum { CUDA_HS_BEGIN, CUDA_HS_BUFFER, CUDA_HS_STAGED, CUDA_HS_RECORDED, CUDA_HS_FOUND,
       CUDA_HS_LAUNCHED, CUDA_HS_N };

typedef struct cuda_backend {
    atlas_backend base; /* first: the op table sees this */
    atlas_host *host;
    atlas_registry *reg;
    CUstream stream;
    cuda_fns fn;
    atlas_threadpool *pool; /* converts and copies weights into the staging buffers */
    double *inv_freq;       /* [hd/2] host copy */
    CUdeviceptr d_inv_freq; /* [hd/2] float */
    CUdeviceptr d_rope;     /* [cap_tok, hd/2] (cos, sin) of the batch's positions */

    /* the staged batch: host mirror and fixed device buffers of cap_tok / cap_table ints */
    int n_tokens, n_seqs, n_logits, max_blocks, block_size;
    int cap_tok, cap_table;
    int n_tiles;            /* prefill attention tiles (<= 64 tokens of one sequence) */
    int32_t *h_stage[2];    /* pinned and mapped, [7 * cap_tok + cap_table] each: a batch's
                               CUDA_OP_STAGE command (the first of its list, so the first node
                               of a decode graph) reads it; batches take turns only when the
                               last one's may still be read (a queued step), so plain steps
                               use one buffer and so one graph */
    CUdeviceptr m_stage[2]; /* h_stage as the device addresses it */
    int stage_stride;       /* ints a staged region takes in this batch: its tokens rounded up
                               to 16, at most cap_tok (a function of the batch's size, so that
                               a graph replayed for the same size finds its regions where it
                               was recorded), so a step of one token copies 0.5 KB and not
                               7 x cap_tok ints (bench/RESULTS.md, tenth session) */
    CUevent stage_sent[2];  /* recorded after a buffer's batch when the next one begins before
                               the stream was waited for */
    bool stage_busy[2];     /* its batch was queued and the stream not waited for since */
    int stage_cur;          /* the last batch's */
    CUdeviceptr d_stage;    /* same layout, regions of stage_stride ints: tokens, positions,
                               slots, tok_seq, logit_rows, tiles (first token, count) [2 x],
                               then block_table */
    CUdeviceptr d_ids;      /* [cap_tok] argmax results, then the wide argmax's scratch
                               (cuda_ids_bytes) */
    /* the argmax kernels write their ids into h_ids too (pinned and mapped, [3][ids_cap]):
     * slot 2 a plain argmax's (IDS_PLAIN, backend_cuda.c); slots 0 and 1 the greedy steps queued a step ahead
     * (argmax_queue): aq_n slots from aq_head wait to be collected, aq_done marks each one's
     * kernel done */
    int32_t *h_ids;
    CUdeviceptr m_ids;      /* h_ids as the device addresses it */
    int ids_cap;            /* ids a slot of h_ids */
    CUevent aq_done[2];
    int aq_head, aq_n, aq_rows[2];
    bool ids_queued;        /* d_ids holds the last queued argmax's ids (argmax_queue) */
    CUdeviceptr tok_src;    /* the batch's tokens: 0 the staged ones, else d_ids (a batch
                               whose tokens are the step before's ids) */
    /* attention split-K workspace */
    int n_split, chunk;
    CUdeviceptr part_o, part_ml;
    CUdeviceptr attn_counters; /* [counter_cap, H] ints (a block of heads a counter, at most
                                  H of them), zero between launches */
    int counter_cap;
    size_t part_bytes;

    /* commands and graphs: inside a batch the ops are queued and run at the next flush
     * (download, argmax, sync), so that exec_fused sees what follows each op; a decode
     * batch's list runs as a CUDA graph */
    int deferring;          /* 1 inside a batch */
    int graphing;           /* 1 inside a decode batch: the queue is captured / replayed */
    cuda_cmd *queue;
    int n_queue, cap_queue;
    cuda_graph graphs[CUDA_MAX_GRAPHS];
    uint64_t clock;
    int use_graphs;         /* 0 with ATLAS_CUDA_GRAPHS=0 */
    bool ready;             /* kernels and cuBLASLt loaded (cuda_ready) */
    bool want_lt;           /* cuBLASLt wanted (not ATLAS_CUBLASLT=0) */
    bool pdl_fence;         /* the next launch without PDL (after the staging kernel) */
    void *launch_ex;        /* cuLaunchKernelEx when programmatic dependent launch is on
                               (Hopper and later, unless ATLAS_CUDA_PDL=0) */
    int gemv_variant;       /* ATLAS_CUDA_GEMV: 0 (default) the block kernel for n = 1;
                               1 the fp32 warp kernels for n <= 8; 2 the block kernel for
                               n = 1; 3 the mma kernel for n = 1 too; 4 the 4-rows-a-warp
                               kernel for n = 1 */
    int gemv_ng;            /* ATLAS_CUDA_GEMV_NG=ng: row groups a block of the one-row GEMVs
                               (gemv1c; 0 or 1: one, the block kernel gemv1b) */
    int gemv_bps;           /* ATLAS_CUDA_GEMV_NG=wB (default w2): gemv1c with ng from a grid
                               of B blocks an SM, per matmul (0: gemv_ng) */
    int gemv_early2;        /* gemv1c's second item before the wait too (default; 0 with
                               ATLAS_CUDA_GEMV_EARLY2=0) */
    int use_attn_dec;       /* 0 with ATLAS_CUDA_ATTN=split: decode on the split kernel */
    void *cluster_ex;       /* cuLaunchKernelEx for the cluster attention kernels (sm_90+,
                               unless ATLAS_CUDA_ATTN=split or warp); NULL: none */
    int attn_warps;         /* warps a cluster-attention block: 4 (at most 2 heads a block), or
                               8 with ATLAS_CUDA_ATTN_WARPS=8 (kernels/attention.cu) */
    int attn_early;         /* 0 with ATLAS_CUDA_ATTN_EARLY=0: decode attention loads no key
                               before the wait for the previous kernel (ops_cuda.c) */
    int attn_heads;         /* query heads a cluster-attention block (ATLAS_CUDA_ATTN_HEADS):
                               1, 2 or 4, halved until it divides H / K; 0 (default): 1 on
                               the 4-warp kernel, 4 on the 8-warp one */
    /* decode fusions (ATLAS_CUDA_FUSE: a comma list of rope, norm, merge, swiglu, qkv, or
     * all / none; default all, the fastest measured on the H200: bench/RESULTS.md) */
    int fuse_rope;          /* rope + kv_store in one kernel */
    int fuse_norm;          /* RMSNorm folded into the GEMVs around it */
    int fuse_merge;         /* attention splits merged by the last one, no combine kernel */
    int fuse_swiglu;        /* swiglu in the gate_up GEMV's epilogue */
    int fuse_qkv;           /* rope + kv_store in the qkv GEMV's epilogue */
    int use_prefill_attn;   /* 0 with ATLAS_CUDA_PREFILL_ATTN=0: the split kernel for all */
    unsigned skip_ops;      /* ATLAS_CUDA_SKIP (timing only): 1 << op of ops not run */
    int use_bf16_act;       /* 0 with ATLAS_CUDA_BF16_ACT=0: every cuBLASLt input converted
                               from fp32 by its own pass (ops_cuda.c "bf16 copies") */
    uint64_t graph_captures, graph_replays;
    /* the host's side of plain greedy decode steps (begin_batch .. cuda_argmax's wait on a
     * replayed graph), for `atlas bench`: stamps of the step under way (ms, atlas_now_ms;
     * end 0 once a begin_batch has read it, so that a gap counts only between two such
     * steps) and sums over steps of CUDA_HS_N intervals (bench_cuda.h host_us) */
    struct {
        double t[CUDA_HS_N + 1], gap, end, gap_sum, sum[CUDA_HS_N];
        long n, n_gap;
        bool replayed;
    } hs;
    uint64_t fused_away;    /* commands that ran inside another's kernel (exec_fused; tests) */

    cuda_lt *lt;            /* NULL when cuBLASLt is absent or disabled */
    CUdeviceptr lt_a;       /* bf16 copy of x for cuBLASLt */
    size_t lt_a_bytes;
    CUdeviceptr lt_ws;      /* cuBLASLt workspace */
    size_t lt_ws_bytes;
    CUdeviceptr lt_h;       /* bf16 copy of the last RMSNorm's output [cap, d] (begin_batch) */
    size_t lt_h_bytes;
    CUdeviceptr shadow_src; /* the fp32 range lt_h mirrors now (0: none); exec_list scope */
    size_t shadow_bytes;
    size_t weight_bytes, kv_bytes; /* held now, for `atlas bench` */
    cuda_load load;
} cuda_backend;

/* d_ids: ids [ct] (int), best [ct] (u64, from a 16-byte boundary), count [ct] (int) */
static inline size_t cuda_ids_best(int ct) { return ((size_t)ct * 4 + 15) & ~(size_t)15; }
static inline size_t cuda_ids_bytes(int ct) { return cuda_ids_best(ct) + (size_t)ct * 12; }

/* device pointers held in void* */
#define CUDA_PTR(p) ((CUdeviceptr)(uintptr_t)(p))

static inline CUdeviceptr cuda_stage_ptr(const cuda_backend *cb, int which) {
    return cb->d_stage + (size_t)which * cb->stage_stride * sizeof(int32_t);
}
enum { CUDA_STAGE_TOKENS, CUDA_STAGE_POS, CUDA_STAGE_SLOTS, CUDA_STAGE_SEQ, CUDA_STAGE_ROWS,
       CUDA_STAGE_TILES, CUDA_STAGE_TABLE = 7 };

/* ops_cuda.c: runs one command now (on the stream; captured when capturing). */
atlas_status cuda_exec(cuda_backend *cb, const cuda_cmd *c);
/* ops_cuda.c: runs a list, fusing neighbours where it can (decode graphs). */
atlas_status cuda_exec_list(cuda_backend *cb, const cuda_cmd *c, int n);
/* ops_cuda.c: a one-row block GEMV over `groups` groups of 4 rows, launched as the ops
 * launch (PDL when it is on): `multi` (a gemv1c kernel, which takes ng, a[na - 1], after the
 * arguments of `single`; set here, the caller leaves it NULL) with ng > 1 row groups a block,
 * else `single`, a group a block (which reads no extra argument). multi NULL: always single.
 * `atlas bench` chains GEMVs with it. */
atlas_status cuda_gemv_rows(cuda_backend *cb, CUfunction single, CUfunction multi, int groups,
                            int ng, void **a, int na);
/* ops_cuda.c: the row groups a block when `groups` are spread over a grid of bps blocks an
 * SM (ATLAS_CUDA_GEMV_NG=wB). */
int cuda_gemv_ng_for_grid(const cuda_backend *cb, int groups, int bps);
/* ops_cuda.c: cuLaunchKernelEx from the loaded driver, or NULL. */
void *cuda_pdl_resolve(void);
/* ops_cuda.c: looks up every kernel; loads the modules. */
atlas_status cuda_load_kernels(cuda_backend *cb);
/* Loads the kernels and cuBLASLt on first use (backend_cuda.c): before anything launches. */
atlas_status cuda_ready(cuda_backend *cb);
/* ops_cuda.c: query heads a block of the split attention kernel for groups of G heads of
 * head_dim hd (a divisor of G that fits its shared memory); 0: none fits. */
int cuda_attn_split_heads(int G, int hd);
/* ops_cuda.c: split count and chunk for attention over `cap` positions with n tokens;
 * false when the kernel merges its splits without the partials buffers (clusters). */
bool cuda_attn_split_plan(const cuda_backend *cb, int n, int cap, int *n_split, int *chunk);

/* cublaslt.c (optional; every function is safe with lt NULL). */
atlas_status cuda_lt_create(cuda_lt **out); /* ATLAS_ERR_NOT_FOUND when absent */
void cuda_lt_free(cuda_lt *lt);
/* out[n, m] (fp32, or bf16 with out_bf16) = a[n, k] (bf16) @ w[m, k]^T (bf16) on stream. */
atlas_status cuda_lt_matmul(cuda_lt *lt, CUstream stream, CUdeviceptr out, int out_bf16,
                            CUdeviceptr a, CUdeviceptr w, int n, int m, int k, CUdeviceptr ws,
                            size_t ws_bytes);
const char *cuda_lt_version(const cuda_lt *lt);

#endif

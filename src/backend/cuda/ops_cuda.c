/* backend/cuda/ops_cuda.c — one launch function per op: grid shapes and kernel choice; the
 * kernels of the fusions the model said (cuda_exec_fused, for plan.c's exec list).
 * Shapes are those of backend/backend.h; kernels are in kernels/NAME.cu. */
#include <dlfcn.h>
#include <stdbool.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "core/fault.h"

/* cuLaunchKernelEx and its attribute (cuda.h, CUDA 12/13): programmatic dependent launch
 * lets a kernel start while the previous one drains (kernels/common.cuh, pdl_*). */
typedef struct pdl_attr {
    int id;
    char pad[4];
    union { char bytes[64]; int i; unsigned long long align; } value;
} pdl_attr;
typedef struct pdl_config {
    unsigned gx, gy, gz, bx, by, bz, smem;
    CUstream stream;
    pdl_attr *attrs;
    unsigned n_attrs;
} pdl_config;
enum { PDL_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6 };

void *cuda_pdl_resolve(void) {
    void *dl = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *fn = dl ? dlsym(dl, "cuLaunchKernelEx") : NULL;
    if (dl) dlclose(dl); /* RTLD_NOLOAD took a reference; the driver stays loaded */
    return fn;
}

static atlas_status launch(cuda_backend *cb, CUfunction f, unsigned gx, unsigned gy,
                           unsigned gz, unsigned block, unsigned smem, void **args) {
    /* an empty grid is no work (a chunk of a long prompt wants no logit row: gather of 0
     * rows), and the driver refuses it with CUDA_ERROR_INVALID_VALUE */
    if (gx == 0 || gy == 0 || gz == 0) return ATLAS_OK;
    /* a fault site (core/fault.h): a refused launch, before the driver sees it, so that the
     * context is never poisoned */
    if (ATLAS_FAULT_HERE())
        return atlas_cu_check(ATLAS_CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel (injected fault)",
                              __FILE__, __LINE__);
    bool pdl = cb->dev.launch_ex && !cb->plan.pdl_fence;
    cb->plan.pdl_fence = false;
    if (pdl) {
        typedef CUresult (*launch_ex_fn)(const pdl_config *, CUfunction, void **, void **);
        pdl_attr attr;
        memset(&attr, 0, sizeof attr);
        attr.id = PDL_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.i = 1;
        pdl_config cfg = {gx, gy, gz, block, 1, 1, smem, cb->dev.stream, &attr, 1};
        return atlas_cu_check(((launch_ex_fn)cb->dev.launch_ex)(&cfg, f, args, NULL),
                              "cuLaunchKernelEx", __FILE__, __LINE__);
    }
    return ATLAS_CU(cuLaunchKernel, f, gx, gy, gz, block, 1, 1, smem, cb->dev.stream, args, NULL);
}

atlas_status cuda_launch(cuda_backend *cb, CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                         unsigned block, unsigned smem, void **args) {
    return launch(cb, f, gx, gy, gz, block, smem, args);
}

/* A grid of clusters of (1, 1, cz) blocks (sm_90+), with PDL when it is on. */
enum { LAUNCH_ATTR_CLUSTER_DIMENSION = 4 };
static atlas_status launch_cluster(cuda_backend *cb, CUfunction f, unsigned gx, unsigned gy,
                                   unsigned cz, unsigned block, void **args) {
    typedef CUresult (*launch_ex_fn)(const pdl_config *, CUfunction, void **, void **);
    if (ATLAS_FAULT_HERE()) /* as in launch */
        return atlas_cu_check(ATLAS_CUDA_ERROR_INVALID_VALUE,
                              "cuLaunchKernelEx (cluster, injected fault)", __FILE__, __LINE__);
    pdl_attr attr[2];
    memset(attr, 0, sizeof attr);
    attr[0].id = LAUNCH_ATTR_CLUSTER_DIMENSION;
    unsigned dims[3] = {1, 1, cz};
    memcpy(attr[0].value.bytes, dims, sizeof dims);
    attr[1].id = PDL_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr[1].value.i = 1;
    pdl_config cfg = {gx, gy, cz, block, 1, 1, 0, cb->dev.stream, attr,
                      cb->dev.launch_ex && !cb->plan.pdl_fence ? 2 : 1};
    cb->plan.pdl_fence = false;
    return atlas_cu_check(((launch_ex_fn)cb->dev.cluster_ex)(&cfg, f, args, NULL),
                          "cuLaunchKernelEx (cluster)", __FILE__, __LINE__);
}


/* An FP8 cache's scale of a layer: K (v 0) or V (v 1); 1 without scales. */
static float kv_scale(const cuda_backend *cb, int layer, int v) {
    return cb->mod.kv_scales ? cb->mod.kv_scales[2 * layer + v] : 1.0f;
}

/* One layer's K and V pools in the cache (cuda_backend.h). */
static void kv_pools(const atlas_kv *kv, int layer, CUdeviceptr *kc, CUdeviceptr *vc) {
    *kc = kv->base + (size_t)layer * 2 * kv->layer_elems * (size_t)kv->es;
    *vc = *kc + kv->layer_elems * (size_t)kv->es;
}

enum { ATTN_MIN_CHUNK = 64 };
/* the cluster kernel: up to 8 splits (a portable cluster), for caches of up to 4096 slots a
 * sequence (64 keys a warp at most; longer contexts want the many splits of the others) */
enum { ATTN_CLUSTER = 8, ATTN_CLUSTER_CAP = 4096 };

static bool attn_cluster(const cuda_backend *cb, int cap) {
    const atlas_backend_geom *g = &cb->base.geom;
    /* (bf16 caches only: an FP8 cache's decode kernels write partials, which the split plan
     * must then reserve) */
    return cb->dev.cluster_ex && cb->base.kv_size == 2 &&
           cap <= ATTN_CLUSTER_CAP &&
           (g->head_dim == 64 || g->head_dim == 128) && g->n_heads / g->n_kv_heads <= 8;
}

bool cuda_attn_split_plan(const cuda_backend *cb, int n, int cap, int *n_split, int *chunk) {
    if (attn_cluster(cb, cap)) { /* merged in shared memory: no partials */
        /* as many splits as fill the GPU, at most 8: a batch of 64 or 256 sequences wants
         * one (8 took a 64-sequence step from 8.4 to 10.0 ms) */
        int K = cb->base.geom.n_kv_heads, T = cb->dev.arch.attn_target_blocks;
        int want = (T + n * K - 1) / (n * K);
        int s = (cap + ATTN_MIN_CHUNK - 1) / ATTN_MIN_CHUNK;
        if (s > want) s = want;
        *n_split = s < ATTN_CLUSTER ? s : ATTN_CLUSTER;
        *chunk = (cap + *n_split - 1) / *n_split;
        return false;
    }
    int K = cb->base.geom.n_kv_heads, T = cb->dev.arch.attn_target_blocks;
    int want = (T + n * K - 1) / (n * K);
    int most = (cap + ATTN_MIN_CHUNK - 1) / ATTN_MIN_CHUNK;
    int s = want < 1 ? 1 : want > most ? most : want;
    int c = (cap + s - 1) / s;
    c = (c + ATTN_MIN_CHUNK - 1) / ATTN_MIN_CHUNK * ATTN_MIN_CHUNK;
    *chunk = c;
    *n_split = (cap + c - 1) / c;
    return true;
}

/* The split kernel's dynamic shared memory (kernels/attention.cu atlas_attn_split) for G
 * query heads a block and tiles of t keys. Its budget is the device's (cuda_arch:
 * 43 KiB at most, less where 4 blocks would not fit an SM). */
enum { ATTN_MIN_TILE = 32 };
static size_t attn_split_smem(int G, int hd, int t) {
    return (size_t)(2 * G * hd + G * t + t + 3 * G) * 4;
}

/* Keys handled per pass inside a block: as many as fit, at least ATTN_MIN_TILE. */
static int attn_tile(int G, int hd, int budget) {
    int t = 256;
    while (t > ATTN_MIN_TILE && attn_split_smem(G, hd, t) > (size_t)budget) t /= 2;
    return t;
}

/* Query heads a split-kernel block: all G of a kv head when they fit its shared memory (each
 * K/V row read once for the group), else the largest divisor of G that fits (MQA's 32-64
 * heads at head_dim 128-256); 0 when not even one head fits (check_geom refuses that). */
int cuda_attn_split_heads(int G, int hd, int budget) {
    for (int gb = G; gb >= 1; gb--)
        if (G % gb == 0 && attn_split_smem(gb, hd, ATTN_MIN_TILE) <= (size_t)budget) return gb;
    return 0;
}

/* The attention command's sinks (p[3], NULL: none): a bf16 [H] weight's pointer, or 0. */
static CUdeviceptr attn_sinks(const cuda_cmd *c) {
    return c->p[3] ? ((const atlas_weight *)c->p[3])->ptr : 0;
}

/* Tensor-core flash attention over tiles of 64 queries (prefill; head_dim 64, 80, 96, 128:
 * cb->mod.fn.attn_prefill). */
static atlas_status op_attention_tiles(cuda_backend *cb, const cuda_cmd *c) {
    const atlas_backend_geom *g = &cb->base.geom;
    const atlas_kv *kv = c->p[2];
    int H = g->n_heads, K = g->n_kv_heads, hd = g->head_dim;
    int bs = kv->block_size, max_blocks = cb->batch.max_blocks;
    int window = atlas_geom_window(g, c->layer);
    float qscale = 1.4426950408889634f * atlas_geom_attn_scale(g);
    CUdeviceptr out = CUDA_PTR(c->p[0]), qkv = CUDA_PTR(c->p[1]), kc, vc;
    kv_pools(kv, c->layer, &kc, &vc);
    CUdeviceptr tiles = cuda_stage_ptr(cb, CUDA_STAGE_TILES), seq = cuda_stage_ptr(cb, CUDA_STAGE_SEQ);
    CUdeviceptr pos = cuda_stage_ptr(cb, CUDA_STAGE_POS), table = cuda_stage_ptr(cb, CUDA_STAGE_TABLE);
    CUdeviceptr sinks = attn_sinks(c);
    bool fp8 = kv->es == 1; /* its K scale folded into q, its V scale the kernel's last argument */
    float vscale = kv_scale(cb, c->layer, 1);
    if (fp8) qscale *= kv_scale(cb, c->layer, 0);
    void *a[] = {&out, &qkv, &kc, &vc, &tiles, &seq, &pos, &table, &max_blocks, &bs, &H, &K,
                 &window, &qscale, &sinks, &vscale};
    return launch(cb, fp8 ? cb->mod.fn.attn_prefill8 : cb->mod.fn.attn_prefill,
                  (unsigned)cb->batch.n_tiles, (unsigned)H, 1, 128, 2 * 64 * (hd + 8) * 2, a);
}

/* The warp-per-key decode kernel for this shape and cache type, or NULL (the split kernel
 * then). */
static CUfunction attn_dec_kernel(const cuda_backend *cb, int hd, int G, bool fp8) {
    if (G > 8) return NULL;
    int h = hd == 64 ? 0 : hd == 128 ? 1 : hd == 256 ? 2 : -1;
    if (h < 0) return NULL;
    int q = G <= 1 ? 0 : G <= 2 ? 1 : G <= 4 ? 2 : 3;
    return fp8 ? cb->mod.fn.attn_dec8[h][q] : cb->mod.fn.attn_dec[h][q];
}

static atlas_status op_attention(cuda_backend *cb, const cuda_cmd *c) {
    const atlas_backend_geom *g = &cb->base.geom;
    const atlas_kv *kv = c->p[2];
    int H = g->n_heads, K = g->n_kv_heads, hd = g->head_dim, G = H / K;
    if (cb->mod.fn.attn_prefill && c->n >= 16 && c->n >= 8 * cb->batch.n_tiles)
        return op_attention_tiles(cb, c);
    int n = c->n, bs = kv->block_size, max_blocks = cb->batch.max_blocks;
    int window = atlas_geom_window(g, c->layer);
    int chunk = cb->batch.chunk, tile;
    float scale = atlas_geom_attn_scale(g);
    /* an FP8 cache: its K scale folded into q's, its V scale the kernels' last argument */
    bool fp8 = kv->es == 1;
    float vscale = kv_scale(cb, c->layer, 1);
    if (fp8) scale *= kv_scale(cb, c->layer, 0);
    CUdeviceptr out = CUDA_PTR(c->p[0]), qkv = CUDA_PTR(c->p[1]), kc, vc;
    kv_pools(kv, c->layer, &kc, &vc);
    CUdeviceptr seq = cuda_stage_ptr(cb, CUDA_STAGE_SEQ), pos = cuda_stage_ptr(cb, CUDA_STAGE_POS);
    CUdeviceptr table = cuda_stage_ptr(cb, CUDA_STAGE_TABLE);
    CUdeviceptr counters = cb->ws.attn_counters; /* the splits merged by the last one */
    CUdeviceptr sinks = attn_sinks(c);
    CUfunction dec = attn_dec_kernel(cb, hd, G, fp8);
    /* every token its own sequence: keys before a token's own are older than this batch, and
     * the decode kernels load them before waiting for the previous kernel */
    int early = n == cb->batch.n_seqs;
    void *da[] = {&cb->ws.part_o, &cb->ws.part_ml, &qkv, &kc, &vc, &seq, &pos, &table, &max_blocks,
                  &bs, &H, &K, &window, &chunk, &scale, &out, &counters, &early,
                  &sinks, &vscale}; /* decode kernels (vscale: the FP8 ones') */
    /* (one split: the kernel below, 4 warps a block, writes the output itself, as it did in
     * the 64- and 256-sequence steps measured at 7883bc9) */
    if (dec && attn_cluster(cb, cb->batch.max_blocks * bs) && cb->batch.n_split > 1 &&
        cb->batch.n_split <= ATTN_CLUSTER) {
        /* a query head a 4-warp block (8B decode replay 3.843 / 3.935 ms against 3.864-3.872 /
         * 3.950 with 2, and 3.950 against 3.987 with 8 warps a block; bench/RESULTS.md) */
        CUfunction f = cb->mod.fn.attn_dcl[hd == 64 ? 0 : 1];
        return launch_cluster(cb, f, (unsigned)n, (unsigned)H, (unsigned)cb->batch.n_split,
                              4 * 32, da);
    }
    if (dec) {
        ATLAS_TRY(launch(cb, dec, (unsigned)n, (unsigned)K, (unsigned)cb->batch.n_split, 128, 0,
                         da));
        if (counters || cb->batch.n_split == 1) return ATLAS_OK; /* merged in the kernel */
        void *b[] = {&out, &cb->ws.part_o, &cb->ws.part_ml, &H, &hd, &cb->batch.n_split, &sinks};
        return launch(cb, cb->mod.fn.attn_combine, (unsigned)n, (unsigned)H, 1, 128, 0, b);
    }
    int budget = cb->dev.arch.attn_split_smem;
    int gb = cuda_attn_split_heads(G, hd, budget); /* >= 1: check_geom */
    tile = attn_tile(gb, hd, budget);
    void *a[] = {&cb->ws.part_o, &cb->ws.part_ml, &qkv, &kc, &vc, &seq, &pos, &table, &max_blocks,
                 &bs, &H, &K, &hd, &gb, &window, &chunk, &tile, &scale, &out, &counters, &sinks,
                 &vscale};
    unsigned smem = (unsigned)attn_split_smem(gb, hd, tile);
    ATLAS_TRY(launch(cb, fp8 ? cb->mod.fn.attn_split8 : cb->mod.fn.attn_split, (unsigned)n, (unsigned)(H / gb),
                     (unsigned)cb->batch.n_split, 128, smem, a));
    if (counters) return ATLAS_OK; /* the last split of each (token, kv head) merged them */
    void *b[] = {&out, &cb->ws.part_o, &cb->ws.part_ml, &H, &hd, &cb->batch.n_split, &sinks};
    return launch(cb, cb->mod.fn.attn_combine, (unsigned)n, (unsigned)H, 1, hd < 32 ? 32 : 128,
                  0, b);
}

/* --- bf16 copies for cuBLASLt -------------------------------------------------------------
 * cuBLASLt multiplies bf16 inputs, and the activations are fp32: each prefill matmul used to
 * convert its x in a pass of its own. Instead an RMSNorm of 64 rows or more also writes its
 * output in bf16 (lt_h; mirror_rows of it), which the matmuls the model said read that output
 * (rmsnorm_matmul: CUDA_LINK_MIRROR) take; and gate_up -> swiglu -> down runs in bf16
 * (cuda_exec_fused, by the swiglu epilogue's hand-off): gate_up's product comes out in bf16,
 * swiglu turns it into the down matmul's bf16 input, and neither the fp32 gate_up rows nor the
 * fp32 swiglu output is written. */

static bool lt_fits(const cuda_backend *cb, int n, int k) {
    return cb->mod.lt && n >= 64 && (size_t)n * k * 2 <= cb->ws.lt_a_bytes;
}

/* The input x[n, k] (fp32) of the matmul command mm as bf16 for cuBLASLt: the last norm's
 * copy when mm reads that norm's output (CUDA_LINK_MIRROR) and the copy was made, else
 * converted into lt_a. */
static atlas_status lt_input(cuda_backend *cb, const cuda_cmd *mm, int k, CUdeviceptr *xb) {
    int n = mm->n;
    CUdeviceptr x = CUDA_PTR(mm->p[1]);
    if ((mm->link & CUDA_LINK_MIRROR) && k == cb->plan.mirror_d &&
        mm->row0 + n <= cb->plan.mirror_rows) { /* rows of d % 8 == 0 bf16: 16-byte aligned */
        *xb = cb->ws.lt_h + (size_t)mm->row0 * k * 2;
        return ATLAS_OK;
    }
    long long count = (long long)n * k;
    void *a[] = {&cb->ws.lt_a, &x, &count};
    *xb = cb->ws.lt_a;
    return launch(cb, cb->mod.fn.f32_to_bf16, 1024, 1, 1, 256, 0, a);
}

/* out[n, m] (fp32) += bias[m] after a cuBLASLt matmul (none: nothing). */
static atlas_status lt_bias(cuda_backend *cb, CUdeviceptr out, const atlas_weight *bias, int n,
                            int m) {
    if (!bias) return ATLAS_OK;
    CUdeviceptr bp = bias->ptr;
    long long total = (long long)n * m;
    void *b[] = {&out, &bp, &m, &total};
    return launch(cb, cb->mod.fn.add_bias, 1024, 1, 1, 256, 0, b);
}

/* out[n, m] = xb[n, k] (bf16) @ w^T + bias, out in fp32 or (out_bf16, no bias) bf16. */
static atlas_status lt_gemm(cuda_backend *cb, CUdeviceptr out, int out_bf16, CUdeviceptr xb,
                            const atlas_weight *w, const atlas_weight *bias, int n) {
    int m = (int)w->rows, k = (int)w->cols;
    ATLAS_TRY(cuda_lt_matmul(cb->mod.lt, cb->dev.stream, out, out_bf16, xb, w->ptr, n, m, k,
                             cb->ws.lt_ws, cb->ws.lt_ws_bytes));
    return lt_bias(cb, out, bias, n, m);
}

/* gate_up matmul -> swiglu -> down matmul, n >= 64 rows: in bf16 as described above, for
 * dense weights. A quantized one's product stays fp32 into the fp32 swiglu (op_qmatmul
 * from its scratch copy): its bf16 copy already rounds each weight, and rounding gate_up's
 * output too took a small checkpoint past the conformance bound (AWQ at 40 tokens, 4.2e-2
 * -> 5.1e-2 against 5e-2), for 6% of the 8B shape's 2,048-row prefill (bench/RESULTS.md).
 * The model said the chain: a matmul with a swiglu epilogue (CUDA_LINK_SWIGLU, then the
 * swiglu, CUDA_LINK_CHAIN: the next command is the matmul of its output). Returns false
 * (nothing run) when c[0..2] is not that chain or does not fit. */
static bool prefill_mlp(cuda_backend *cb, const cuda_cmd *c, int n_cmds, atlas_status *st) {
    if (n_cmds < 3 || c[0].op != CUDA_OP_MATMUL || !(c[0].link & CUDA_LINK_SWIGLU) ||
        c[1].op != CUDA_OP_SWIGLU || !(c[1].link & CUDA_LINK_CHAIN) ||
        c[2].op != CUDA_OP_MATMUL)
        return false;
    const atlas_weight *gu = c[0].p[2], *down = c[2].p[2];
    int n = c[0].n, f = c[1].d, k = (int)gu->cols;
    if (gu->fmt != ATLAS_WFMT_DENSE || down->fmt != ATLAS_WFMT_DENSE || c[1].n != n ||
        c[2].n != n || c[0].p[3] || gu->rows != 2 * (int64_t)f || down->cols != f || f % 8 ||
        !lt_fits(cb, n, k) || !lt_fits(cb, n, f))
        return false;
    CUdeviceptr xb, g = CUDA_PTR(c[0].p[0]);
    *st = lt_input(cb, &c[0], k, &xb);
    if (*st == ATLAS_OK) *st = lt_gemm(cb, g, 1, xb, gu, NULL, n); /* bf16 in g's memory */
    if (*st == ATLAS_OK) {
        long long total = (long long)n * f;
        unsigned blocks = (unsigned)((total / 8 + 255) / 256);
        cuda_glu_act ga = cuda_glu_of(cb, c[1].layer); /* the gate activation (cuda_cmd) */
        void *a[] = {&cb->ws.lt_a, &g, &f, &total, &ga};
        *st = launch(cb, cb->mod.fn.swiglu_bf16, blocks > 4096 ? 4096 : blocks, 1, 1, 256, 0, a);
    }
    if (*st == ATLAS_OK) *st = lt_gemm(cb, CUDA_PTR(c[2].p[0]), 0, cb->ws.lt_a, down, c[2].p[3], n);
    return true;
}

atlas_status cuda_gemv_rows(cuda_backend *cb, CUfunction single, CUfunction multi, int groups,
                            int ng, void **a, int na) {
    if (multi && ng > 1) {
        /* a flag in ng's high half (gemv1c_body): the second item's loads before the wait
         * too (replay 4.313-4.431 ms against 4.328-4.513 on three H200s; bench/RESULTS.md) */
        int arg = ng | 1 << 16;
        void *b[32];
        if (na > 32) return atlas_fail(ATLAS_ERR_INTERNAL, "cuda: gemv with %d arguments", na);
        memcpy(b, a, sizeof(void *) * (size_t)(na - 1));
        b[na - 1] = &arg; /* a copy: the caller's array never holds this frame's address */
        return launch(cb, multi, (unsigned)((groups + ng - 1) / ng), 1, 1, 256, 0, b);
    }
    return launch(cb, single, (unsigned)groups, 1, 1, 256, 0, a);
}

int cuda_gemv_ng_for_grid(const cuda_backend *cb, int groups, int bps) {
    int blocks = bps * atlas_host_properties(cb->dev.host)->sm_count;
    return (groups + blocks - 1) / blocks;
}

/* cuda_gemv_rows with ng from a grid of 2 blocks an SM: on the H200 8B shape a decode graph
 * replay took 3.987 ms against 4.125 with one group a block, and fixed ng 2/4/8 and a grid of
 * 1 or 4 blocks an SM were slower (bench/RESULTS.md, "one-row GEMVs over several row
 * groups"). Tests fix ng (cuda_backend.gemv_ng). */
static atlas_status launch_rows(cuda_backend *cb, CUfunction single, CUfunction multi,
                                int groups, void **a, int na) {
    int ng = cb->plan.gemv_ng > 0 ? cb->plan.gemv_ng : cuda_gemv_ng_for_grid(cb, groups, 2);
    return cuda_gemv_rows(cb, single, multi, groups, ng, a, na);
}

/* The bf16 matmul of c with weight w (c's own, or a quantized one's bf16 scratch copy). */
static atlas_status dense_matmul(cuda_backend *cb, const cuda_cmd *c, const atlas_weight *w) {
    const atlas_weight *bias = c->p[3];
    int n = c->n, m = (int)w->rows, k = (int)w->cols;
    CUdeviceptr out = CUDA_PTR(c->p[0]), x = CUDA_PTR(c->p[1]), wp = w->ptr;
    CUdeviceptr bp = bias ? bias->ptr : 0;
    /* n = 1: the block kernels (their first weights load before the wait for the previous
     * kernel), gemv1c with ng row groups a block by default (bench/RESULTS.md) */
    if (n == 1) {
        void *a[] = {&out, &x, &wp, &bp, &n, &m, &k, NULL}; /* NULL: ng, set by launch_rows */
        return launch_rows(cb, cb->mod.fn.gemv1b, cb->mod.fn.gemv1c[0], (m + 3) / 4, a,
                           (int)(sizeof a / sizeof a[0]));
    }
    if (n <= 8 && k % 32 == 0) {
        void *a[] = {&out, &x, &wp, &bp, &n, &m, &k}; /* 2..8 rows: tensor cores */
        return launch(cb, cb->mod.fn.gemv_mma, (unsigned)((m + 15) / 16), 1, 1, 128, 0, a);
    }
    if (n <= 8) { /* 2..8 rows of a k the mma kernel does not take: fp32 warp kernels */
        CUfunction f = n <= 4 ? cb->mod.fn.gemv4 : cb->mod.fn.gemv8;
        void *a[] = {&out, &x, &wp, &bp, &n, &m, &k};
        return launch(cb, f, (unsigned)((m + 7) / 8), 1, 1, 128, 0, a);
    }
    /* 9+ rows through cuBLASLt: the mma.sync GEMM's 128-row tiles gave a 16-row step of the
     * 8B shape 32 blocks a matmul, 38 ms against 17 ms at 64 rows (bench/RESULTS.md) */
    if (cb->mod.lt && (size_t)n * k * 2 <= cb->ws.lt_a_bytes) {
        CUdeviceptr xb;
        ATLAS_TRY(lt_input(cb, c, k, &xb));
        return lt_gemm(cb, out, 0, xb, w, bias, n);
    }
    void *a[] = {&out, &x, &wp, &bp, &n, &m, &k};
    return launch(cb, cb->mod.fn.gemm, (unsigned)((m + 127) / 128), (unsigned)((n + 127) / 128), 1,
                  256, 0, a);
}

/* The variant of kernels/quant.cu that reads w. */
static cuda_qkind qkind_of(const atlas_weight *w) {
    return w->fmt == ATLAS_WFMT_FP8_E4M3 ? CUDA_Q_FP8
           : w->fmt == ATLAS_WFMT_FP4_E2M1 ? CUDA_Q_FP4
           : w->g_idx                      ? CUDA_Q_INT4G
                                           : CUDA_Q_INT4;
}

/* What a one-row GEMV's epilogue takes over from the commands after it (kernels/gemv.cu
 * ATLAS_GEMV1B_EPI; block kernel only): swiglu of its output, or rope and kv_store of it. */
typedef enum { TAIL_NONE, TAIL_SWIGLU, TAIL_QKV } gemv_tail;

/* The streaming kernel CUDA_QGEMV_S + v of w's kind with the 22 arguments a, where it takes
 * w (*done: launched; else the caller launches another): one wave of blocks of 32 ceil(k /
 * 32E) threads (E columns a load), blocks an SM from the occupancy (cuda_quant_ready asks
 * it), no more blocks than rows (act: gate_up's row pairs, which a block keeps). */
static atlas_status qstream_launch(cuda_backend *cb, const atlas_weight *w, int v, bool act,
                                   void **a, bool *done) {
    cuda_qkind q = qkind_of(w);
    CUfunction f = cb->mod.fn.qgemv1s[q][v];
    int e_log2 = q == CUDA_Q_FP8 ? 4 : 5, m = (int)w->rows, k = (int)w->cols;
    int warps = (k + (32 << e_log2) - 1) / (32 << e_log2);
    /* FP4 with a scale a 16 columns (NVFP4): its own kernel, a scale a half load */
    bool g16 = q == CUDA_Q_FP4 && w->csh == 4 && v == 0 && cb->mod.fn.qgemv1s16;
    if (g16) f = cb->mod.fn.qgemv1s16;
    *done = false;
    if (!f || (w->csh < e_log2 && !g16) || warps > 16) /* a scale a load; 512 threads */
        return ATLAS_OK;
    int bps = g16 ? cb->mod.fn.qgemv1s16_bps[warps] : cb->mod.fn.qgemv1s_bps[q][v][warps];
    if (bps <= 0) return ATLAS_OK;
    long long units = act ? m / 2 : m;
    long long wave = (long long)bps * atlas_host_properties(cb->dev.host)->sm_count;
    *done = true;
    return launch(cb, f, (unsigned)(units < wave ? units : wave), 1, 1, 32u * (unsigned)warps, 0,
                  a);
}

/* A quantized one-row GEMV's 22 kernel arguments (atlas_qgemv1_<fmt>) launched with ng as
 * cuda_qgemv1 takes it (act: the swiglu tail's, a[20], is set); atlas_qgemv1c_<fmt> gets
 * groups and ng after them. */
static atlas_status qgemv_launch(cuda_backend *cb, const atlas_weight *w, void **a, int ng,
                                 bool act) {
    cuda_qkind q = qkind_of(w);
    int m = (int)w->rows, groups = (m + 3) / 4;
    if (ng >= CUDA_QGEMV_S && ng < CUDA_QGEMV_S + CUDA_QSTREAMS) {
        bool done = false;
        ATLAS_TRY(qstream_launch(cb, w, ng - CUDA_QGEMV_S, act, a, &done));
        if (done) return ATLAS_OK;
        ng = 0;
    }
    if (ng == CUDA_QGEMV_X8 && q == CUDA_Q_INT4)
        return launch(cb, cb->mod.fn.qgemv1x, (unsigned)groups, 1, 1, 128, 0, a);
    if (ng == CUDA_QGEMV_X8) ng = 0;
    if (ng < 0) ng = cuda_gemv_ng_for_grid(cb, groups, -ng);
    if (ng == 0 || q == CUDA_Q_INT4G)
        return launch(cb, cb->mod.fn.qgemv1[q], (unsigned)groups, 1, 1, 128, 0, a);
    void *b[24];
    memcpy(b, a, sizeof(void *) * 22);
    b[22] = &groups;
    b[23] = &ng;
    return launch(cb, cb->mod.fn.qgemv1c[q], (unsigned)((groups + ng - 1) / ng), 1, 1, 128, 0, b);
}

/* One row of a quantized weight through kernels/quant.cu's one-row kernels, with the fusions
 * gemv_fused (below) gives it: the norm and residual fusions and the swiglu tail; no qkv tail
 * (tail_of says). Plain (norm NULL, resid 0, TAIL_NONE): op_qmatmul's one row. The kernel
 * plan.qgemv_ng picks the kernel: the streaming one by default (its loads eight rows ahead
 * keep the memory busy at decode shapes, where one group a block left it idle across each
 * block's round trips: bench/RESULTS.md). */
static atlas_status qgemv_fused(cuda_backend *cb, const cuda_cmd *mm, const cuda_cmd *norm,
                                CUdeviceptr resid, gemv_tail tail, const cuda_cmd *next) {
    const atlas_weight *w = mm->p[2], *bias = mm->p[3];
    int n = 1, m = (int)w->rows, k = (int)w->cols;
    int rsh = w->rsh, csh = w->csh, scols = w->scols, p1 = w->p1, p2 = w->p2;
    float eps = cb->base.geom.rms_eps;
    CUdeviceptr out = CUDA_PTR(mm->p[0]), x = CUDA_PTR(mm->p[1]), wp = w->ptr, sc = w->scales;
    CUdeviceptr zs = w->zeros, gi = w->g_idx, bp = bias ? bias->ptr : 0, nw = 0, h = 0, act = 0;
    CUdeviceptr rs = w->rowscale;
    if (norm) {
        x = CUDA_PTR(norm->p[0]);
        nw = ((const atlas_weight *)norm->p[3])->ptr;
        h = CUDA_PTR(norm->p[2]);
    }
    cuda_glu_act ga = cuda_glu_of(cb, ATLAS_GLU_SILU);
    if (tail == TAIL_SWIGLU) {
        act = CUDA_PTR(next[0].p[0]);
        ga = cuda_glu_of(cb, next[0].layer); /* the gate activation (cuda_cmd) */
    }
    void *a[] = {&out, &x, &wp, &bp, &n, &m, &k, &sc, &zs, &gi, &rsh, &csh, &scols, &p1, &p2,
                 &rs, &nw, &eps, &h, &resid, &act, &ga};
    int ng = cb->plan.int8_x && qkind_of(w) == CUDA_Q_INT4 ? CUDA_QGEMV_SX : cb->plan.qgemv_ng;
    return qgemv_launch(cb, w, a, ng, tail == TAIL_SWIGLU);
}

atlas_status cuda_qgemv1(cuda_backend *cb, const atlas_weight *w, CUdeviceptr out, CUdeviceptr x,
                         int ng) {
    int n = 1, m = (int)w->rows, k = (int)w->cols;
    int rsh = w->rsh, csh = w->csh, scols = w->scols, p1 = w->p1, p2 = w->p2;
    float eps = 0.0f;
    CUdeviceptr wp = w->ptr, sc = w->scales, zs = w->zeros, gi = w->g_idx, rs = w->rowscale;
    CUdeviceptr none = 0;
    cuda_glu_act ga = cuda_glu_of(cb, ATLAS_GLU_SILU);
    void *a[] = {&out, &x, &wp, &none, &n, &m, &k, &sc, &zs, &gi, &rsh, &csh, &scols, &p1, &p2,
                 &rs, &none, &eps, &none, &none, &none, &ga};
    return qgemv_launch(cb, w, a, ng, false);
}

/* The most rows a quantized weight's tensor-core kernels take (more: the scratch copy). */
int cuda_qmma_max(const cuda_backend *cb) {
    int v = cb->plan.qmma_max;
    return v <= 0 ? CUDA_QMMA_DEFAULT : v < CUDA_QMMA_MAX ? v : CUDA_QMMA_MAX;
}

/* The bf16 matmul of c from w's scratch copy, then w's rowscale (and the bias after it). */
static atlas_status qscratch_matmul(cuda_backend *cb, const cuda_cmd *c, const atlas_weight *w) {
    atlas_weight tmp = {.ptr = cb->ws.deq, .rows = w->rows, .cols = w->cols};
    if (!w->rowscale) return dense_matmul(cb, c, &tmp);
    const atlas_weight *bias = c->p[3];
    cuda_cmd plain = *c;
    plain.p[3] = NULL;
    ATLAS_TRY(dense_matmul(cb, &plain, &tmp));
    CUdeviceptr out = CUDA_PTR(c->p[0]), rs = w->rowscale, bp = bias ? bias->ptr : 0;
    int n = c->n, m = (int)w->rows;
    long long blocks = ((long long)n * m + 255) / 256;
    void *a[] = {&out, &rs, &bp, &n, &m};
    return launch(cb, cb->mod.fn.qrowscale, (unsigned)(blocks < 4096 ? blocks : 4096), 1, 1,
                  256, 0, a);
}

/* Rows an FP8 matmul on the tensor cores takes of n (plan.fp8_act; 0: none): FP8 weights in
 * 128 x 128 blocks whose rows and columns cuBLASLt takes, n rounded down to 4 (its rows'
 * multiple), while x's codes and scales fit the bf16 input buffer lt_a. k a multiple of 512:
 * with 5 column blocks (k 640) the product was off by 1e4 on an H100 (cuBLASLt 13.0), the
 * scale grid's rows read at another stride, where 32 blocks (k 4,096) were right. */
static int fp8_lt_rows(const cuda_backend *cb, const atlas_weight *w, int n) {
    int64_t k = w->cols;
    int n4 = n & ~3;
    if (!cb->plan.fp8_act || !cb->mod.lt || w->fmt != ATLAS_WFMT_FP8_E4M3 || w->rsh != 7 ||
        w->csh != 7 || k % 512 || w->rows % 16 || w->rowscale)
        return 0;
    return (size_t)n4 * k + (size_t)n4 * (k / 128) * 4 <= cb->ws.lt_a_bytes ? n4 : 0;
}

/* out[0..n4) = x @ w^T on FP8 tensor cores: x rounded to e4m3 a row and 128 columns (into
 * lt_a: codes, then scales), cuBLASLt's matmul with w's block scales, then the bias. */
static atlas_status fp8_lt_matmul(cuda_backend *cb, const cuda_cmd *c, const atlas_weight *w,
                                  int n4) {
    int m = (int)w->rows, k = (int)w->cols;
    CUdeviceptr out = CUDA_PTR(c->p[0]), x = CUDA_PTR(c->p[1]);
    CUdeviceptr xq = cb->ws.lt_a, xs = xq + (size_t)n4 * k;
    long long blocks = ((long long)n4 * (k / 128) * 32 + 255) / 256;
    void *a[] = {&xq, &xs, &x, &n4, &k};
    ATLAS_TRY(launch(cb, cb->mod.fn.fp8_actq, (unsigned)(blocks < 4096 ? blocks : 4096), 1, 1,
                     256, 0, a));
    ATLAS_TRY(cuda_lt_matmul_fp8(cb->mod.lt, cb->dev.stream, out, xq, xs, w->ptr, w->scales, n4,
                                 m, k, cb->ws.lt_ws, cb->ws.lt_ws_bytes));
    return lt_bias(cb, out, c->p[3], n4, m);
}

/* w dequantized to bf16 into the scratch buffer ws.deq. */
static atlas_status qdequant(cuda_backend *cb, const atlas_weight *w) {
    int m = (int)w->rows, k = (int)w->cols;
    cuda_qkind q = qkind_of(w);
    CUdeviceptr wp = w->ptr, sc = w->scales, zs = w->zeros, gi = w->g_idx;
    int rsh = w->rsh, csh = w->csh, scols = w->scols, p1 = w->p1, p2 = w->p2;
    if (cb->ws.deq_bytes < (size_t)m * k * 2)
        return atlas_fail(ATLAS_ERR_INTERNAL, "cuda: no scratch for a quantized weight of "
                          "%d x %d", m, k);
    CUdeviceptr deq = cb->ws.deq;
    void *d[] = {&deq, &wp, &m, &k, &sc, &zs, &gi, &rsh, &csh, &scols, &p1, &p2};
    long long loads = (long long)m * k / (q == CUDA_Q_FP8 ? 16 : 32);
    long long blocks = (loads + 255) / 256;
    return launch(cb, cb->mod.fn.qdequant[q], (unsigned)(blocks < 8192 ? blocks : 8192), 1, 1,
                  256, 0, d);
}

/* Tiles of 16 rows an atlas_qmmw block takes for a weight of m rows: 4 where that still
 * leaves two blocks an SM (an 8B's gate_up at 16 rows: 741 GB/s against 639 with 2 on an
 * H100), else 2 (its qkv, o and down: 274-375 against 233-350; bench/RESULTS.md). */
int cuda_qmmw_tiles(const cuda_backend *cb, int m) {
    return m >= 128 * atlas_host_properties(cb->dev.host)->sm_count ? 4 : 2;
}

/* A quantized weight: one row through the fp32 GEMV, up to cuda_qmma_max (CUDA_QGEMV_MAX with
 * act-order) through the kernels that multiply on the tensor cores, both reading the packed
 * bytes once; more through the bf16 matmuls, from the weight dequantized into the scratch
 * buffer (a prefill is compute-bound: the extra pass is small beside its GEMM). */
static atlas_status op_qmatmul(cuda_backend *cb, const cuda_cmd *c) {
    const atlas_weight *w = c->p[2], *bias = c->p[3];
    int n = c->n, m = (int)w->rows, k = (int)w->cols;
    cuda_qkind q = qkind_of(w);
    CUdeviceptr wp = w->ptr, sc = w->scales, zs = w->zeros, gi = w->g_idx, rs = w->rowscale;
    int rsh = w->rsh, csh = w->csh, scols = w->scols, p1 = w->p1, p2 = w->p2;
    if (n == 1) return qgemv_fused(cb, c, NULL, 0, TAIL_NONE, NULL);
    CUdeviceptr out = CUDA_PTR(c->p[0]), x = CUDA_PTR(c->p[1]), bp = bias ? bias->ptr : 0;
    void *a[] = {&out, &x, &wp, &bp, &n, &m, &k, &sc, &zs, &gi, &rsh, &csh, &scols, &p1, &p2,
                 &rs};
    /* the most rows multiplied from the packed bytes (more: the scratch copy) */
    const int direct = q == CUDA_Q_INT4G ? CUDA_QGEMV_MAX : cuda_qmma_max(cb);
    if (q == CUDA_Q_INT4G && n <= direct)
        return launch(cb, cb->mod.fn.qgemv8_g, (unsigned)((m + 3) / 4), 1, 1, 128, 0, a);
    if (n <= direct) {
        int i = n <= 8 ? 0 : n <= 16 ? 1 : n <= 32 ? 2 : 3;
        /* x split into bf16 hi + lo once, in the scratch buffer (free: batches of these
         * rows do not dequantize), for every block instead of by each */
        if (cb->plan.qmma_split && cb->ws.deq_bytes >= (size_t)n * k * 4) {
            CUdeviceptr xs = cb->ws.deq;
            long long blocks = ((long long)n * k / 4 + 255) / 256;
            void *sa[] = {&xs, &x, &n, &k};
            ATLAS_TRY(launch(cb, cb->mod.fn.qsplit[q != CUDA_Q_FP8],
                             (unsigned)(blocks < 4096 ? blocks : 4096), 1, 1, 256, 0, sa));
            void *b[17];
            memcpy(b, a, sizeof a);
            b[16] = &xs;
            /* INT4 with a scale a 128-column chunk: the kernel compiled for that alone */
            bool chunk = q == CUDA_Q_INT4 && csh >= CUDA_QMMA_CHUNK_LOG2 && cb->plan.qmma_chunk;
            int rt = cb->plan.qmma_wide < 0 ? cuda_qmmw_tiles(cb, m) : cb->plan.qmma_wide;
            if (chunk && i < 2 && (rt == 2 || rt == 4))
                return launch(cb, cb->mod.fn.qmmw[i][rt == 4], (unsigned)((m + 16 * rt - 1) / (16 * rt)),
                              1, 1, 128, 0, b);
            return launch(cb, chunk ? cb->mod.fn.qmmq[i] : cb->mod.fn.qmmp[q][i],
                          (unsigned)((m + 15) / 16), 1, 1, 128, 0, b);
        }
        return launch(cb, cb->mod.fn.qmma[q][i], (unsigned)((m + 15) / 16), 1, 1, 128, 0, a);
    }
    int n4 = q == CUDA_Q_FP8 ? fp8_lt_rows(cb, w, n) : 0;
    if (n4 > 0) {
        atlas_status st = fp8_lt_matmul(cb, c, w, n4);
        if (st == ATLAS_OK && n4 == n) return ATLAS_OK;
        if (st == ATLAS_OK) { /* the last 1-3 rows on the kernels that take a few */
            cuda_cmd rest = *c;
            rest.n = n - n4;
            rest.p[0] = (char *)c->p[0] + (size_t)n4 * m * 4;
            rest.p[1] = (char *)c->p[1] + (size_t)n4 * k * 4;
            return op_qmatmul(cb, &rest);
        }
        if (st != ATLAS_ERR_UNSUPPORTED) return st;
        cb->plan.fp8_act = false; /* this cuBLASLt has no such matmul: the scratch copy */
    }
    ATLAS_TRY(qdequant(cb, w));
    return qscratch_matmul(cb, c, w);
}

static atlas_status op_matmul(cuda_backend *cb, const cuda_cmd *c) {
    const atlas_weight *w = c->p[2];
    if (w->fmt != ATLAS_WFMT_DENSE) return op_qmatmul(cb, c);
    return dense_matmul(cb, c, w);
}

atlas_status cuda_exec(cuda_backend *cb, const cuda_cmd *c) {
    const atlas_backend_geom *g = &cb->base.geom;
    int H = g->n_heads, K = g->n_kv_heads, hd = g->head_dim, d = c->d;
    float eps = g->rms_eps;
    CUdeviceptr p0 = CUDA_PTR(c->p[0]), p1 = CUDA_PTR(c->p[1]), p2 = CUDA_PTR(c->p[2]);
    /* a command over no rows does nothing (the logit rows of a prefill chunk that wants
     * none: gather, lm_head matmul); cuBLASLt refuses a matmul of 0 rows */
    if (c->n <= 0 && c->op != CUDA_OP_STAGE) return ATLAS_OK;
    switch (c->op) {
    case 0: /* the decode key: launch shapes, no work */
        return ATLAS_OK;
    case CUDA_OP_EMBED: {
        const atlas_weight *t = c->p[1];
        if (t->fmt != ATLAS_WFMT_DENSE)
            return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: an embedding stored %s: the CUDA "
                              "backend reads dense embeddings; run with --device cpu",
                              atlas_wformat_name(t->fmt));
        CUdeviceptr tok = cuda_stage_ptr(cb, CUDA_STAGE_TOKENS), tp = t->ptr,
                    ids = c->p[2] ? CUDA_PTR(c->p[2]) : tok;
        d = (int)t->cols;
        float scale = g->embed_scale != 0 ? g->embed_scale : 1.0f;
        void *a[] = {&p0, &tp, &tok, &ids, &d, &scale};
        return launch(cb, cb->mod.fn.embed, (unsigned)c->n, 1, 1, 128, 0, a);
    }
    case CUDA_OP_ADD_RMSNORM: { /* p0 resid, p1 delta (0: plain rmsnorm), p2 out, p3 w */
        const atlas_weight *w = c->p[3];
        CUdeviceptr wp = w->ptr, bf = 0;
        cb->plan.mirror_rows = 0;
        if (cb->plan.deferring && cb->mod.lt && c->n >= 64 &&
            (size_t)c->n * d * 2 <= cb->ws.lt_h_bytes) {
            bf = cb->ws.lt_h; /* the next matmuls' bf16 input ("bf16 copies for cuBLASLt") */
            cb->plan.mirror_rows = c->n;
            cb->plan.mirror_d = d;
        }
        void *a[] = {&p0, &p1, &p2, &wp, &d, &eps, &bf};
        return launch(cb, cb->mod.fn.add_rmsnorm, (unsigned)c->n, 1, 1, d >= 4096 ? 1024 : 256,
                      0, a);
    }
    case CUDA_OP_MATMUL:
        return op_matmul(cb, c);
    case CUDA_OP_QK_NORM: {
        const atlas_weight *qn = c->p[1], *kn = c->p[2];
        CUdeviceptr qp = qn->ptr, kp = kn->ptr;
        void *a[] = {&p0, &qp, &kp, &H, &K, &hd, &eps};
        return launch(cb, cb->mod.fn.qk_norm, (unsigned)c->n, (unsigned)(H + K), 1, 32, 0, a);
    }
    case CUDA_OP_ROPE: {
        CUdeviceptr cs = cuda_rope_table(cb, c->layer);
        int rot = g->rope_dim / 2;
        void *a[] = {&p0, &cs, &H, &K, &hd, &rot};
        return launch(cb, cb->mod.fn.rope, (unsigned)c->n, (unsigned)(H + K), 1,
                      rot < 32 ? 32 : rot, 0, a);
    }
    case CUDA_OP_KV_STORE: {
        CUdeviceptr kc, vc, slots = cuda_stage_ptr(cb, CUDA_STAGE_SLOTS);
        const atlas_kv *kv = c->p[1];
        kv_pools(kv, c->layer, &kc, &vc);
        float ks = kv_scale(cb, c->layer, 0), vs = kv_scale(cb, c->layer, 1);
        void *a[] = {&p0, &kc, &vc, &slots, &H, &K, &hd, &ks, &vs}; /* ks, vs: FP8's */
        return launch(cb, kv->es == 1 ? cb->mod.fn.kv_store8 : cb->mod.fn.kv_store,
                      (unsigned)c->n, 1, 1, 256, 0, a);
    }
    case CUDA_OP_ATTENTION:
        return op_attention(cb, c);
    case CUDA_OP_SWIGLU: { /* layer: the gate activation (cuda_cmd) */
        long long total = (long long)c->n * d;
        unsigned blocks = (unsigned)((total + 255) / 256);
        cuda_glu_act ga = cuda_glu_of(cb, c->layer);
        void *a[] = {&p0, &p1, &d, &total, &ga};
        return launch(cb, cb->mod.fn.swiglu, blocks > 4096 ? 4096 : blocks, 1, 1, 256, 0, a);
    }
    case CUDA_OP_GATHER: {
        CUdeviceptr rows = cuda_stage_ptr(cb, CUDA_STAGE_ROWS);
        void *a[] = {&p0, &p1, &rows, &d};
        return launch(cb, cb->mod.fn.gather_rows, (unsigned)c->n, 1, 1, 256, 0, a);
    }
    case CUDA_OP_ARGMAX: { /* p0 ids (device), p1 logits, p2 host_ids (mapped; may be NULL) */
        /* slices of 4096 (256 threads x 16 loads in flight) a block, up to 64 blocks a row */
        unsigned slices = (unsigned)((d + 4095) / 4096);
        if (slices > 1) {
            /* p0 is d_ids at a chunk's first row (argmax_queue a chunk at a time): its rows'
             * partials are that far into theirs, 8-byte aligned whatever the row */
            CUdeviceptr ids0 = cb->ws.d_ids;
            size_t row0 = (size_t)(p0 - ids0) / sizeof(int32_t);
            CUdeviceptr best = ids0 + cuda_ids_best(cb->ws.cap_tok) + row0 * 8;
            CUdeviceptr count = ids0 + cuda_ids_best(cb->ws.cap_tok) +
                                (size_t)cb->ws.cap_tok * 8 + row0 * sizeof(int32_t);
            void *a[] = {&p0, &p2, &best, &count, &p1, &d};
            return launch(cb, cb->mod.fn.argmax_wide, (unsigned)c->n, slices > 64 ? 64 : slices, 1,
                          256, 0, a);
        }
        void *a[] = {&p0, &p2, &p1, &d};
        return launch(cb, cb->mod.fn.argmax, (unsigned)c->n, 1, 1, 1024, 0, a);
    }
    case CUDA_OP_STAGE: { /* p0 the host buffer (mapped), n tokens, d ints, layer the staged
                           * regions' stride in ints */
        int half = hd / 2, rot = g->rope_dim / 2, pos_off = CUDA_STAGE_POS * c->layer;
        int long_off = g->rope_inv_freq_long ? CUDA_STAGE_LONG * c->layer : -1;
        int n_sets = 1 + g->n_rope_sets, set_stride = cb->ws.cap_tok * half;
        float f0 = (float)g->rope_attn_factor;
        float f1 = n_sets > 1 ? (float)g->rope_sets[0].attn_factor : 1.0f;
        void *a[] = {&cb->ws.d_stage, &p0, &d, &pos_off, &long_off, &cb->ws.d_rope,
                     &cb->mod.d_inv_freq, &half, &rot, &n_sets, &set_stride, &f0, &f1};
        atlas_status st = launch(cb, cb->mod.fn.stage, (unsigned)c->n, 1, 1,
                                 128 /* STAGE_THREADS */, 0, a);
        /* the next kernel starts after this one ends: kernels read staged ints before their
         * wait (decode attention's early keys), and a wait orders only the kernel before */
        cb->plan.pdl_fence = true;
        return st;
    }
    default:
        return atlas_fail(ATLAS_ERR_INTERNAL, "cuda: unknown command %d", c->op);
    }
}

/* One row through a fused GEMV (kernels/gemv.cu "Decode's fusions around RMSNorm" and
 * ATLAS_GEMV1B_EPI): the block kernel as op_matmul takes it. norm: the add_rmsnorm command whose output is the input
 * (its resid is read, its weight applied, its out written); resid: the residual stream to add
 * the output into; tail: what the epilogue does of the commands next[] after mm. */
static atlas_status gemv_fused(cuda_backend *cb, const cuda_cmd *mm, const cuda_cmd *norm,
                               CUdeviceptr resid, gemv_tail tail, const cuda_cmd *next) {
    const atlas_backend_geom *g = &cb->base.geom;
    const atlas_weight *w = mm->p[2], *bias = mm->p[3];
    if (w->fmt != ATLAS_WFMT_DENSE) return qgemv_fused(cb, mm, norm, resid, tail, next);
    int m = (int)w->rows, k = (int)w->cols;
    float eps = g->rms_eps;
    CUdeviceptr out = CUDA_PTR(mm->p[0]), x = CUDA_PTR(mm->p[1]), wp = w->ptr;
    CUdeviceptr bp = bias ? bias->ptr : 0, nw = 0, h = 0;
    if (norm) {
        x = CUDA_PTR(norm->p[0]);
        nw = ((const atlas_weight *)norm->p[3])->ptr;
        h = CUDA_PTR(norm->p[2]);
    }
    if (tail == TAIL_SWIGLU) { /* m = 2f rows, m % 4 == 0 (tail_of) */
        CUdeviceptr act = CUDA_PTR(next[0].p[0]);
        cuda_glu_act ga = cuda_glu_of(cb, next[0].layer); /* the gate activation (cuda_cmd) */
        /* the last, ng, is set by launch_rows (as in every a[] it is given) */
        void *a[] = {&out, &x, &wp, &bp, &m, &k, &nw, &eps, &h, &act, &ga, NULL};
        return launch_rows(cb, cb->mod.fn.gemv1b_swiglu[norm != NULL],
                           norm ? cb->mod.fn.gemv1c_norm[1] : cb->mod.fn.gemv1c[1],
                           m / 4, a, (int)(sizeof a / sizeof a[0]));
    }
    if (tail == TAIL_QKV) { /* m = (H + 2K) hd rows, hd % 4 == 0, rot even (tail_of) */
        int H = g->n_heads, K = g->n_kv_heads, hd = g->head_dim, rot = g->rope_dim / 2;
        CUdeviceptr kc, vc, slots = cuda_stage_ptr(cb, CUDA_STAGE_SLOTS);
        CUdeviceptr cs = cuda_rope_table(cb, next[0].layer);
        const atlas_kv *kv = next[1].p[1];
        kv_pools(kv, next[1].layer, &kc, &vc);
        if (kv->es == 1) { /* an FP8 cache: its layer's scales, then ng */
            float ks = kv_scale(cb, next[1].layer, 0), vs = kv_scale(cb, next[1].layer, 1);
            void *a8[] = {&out, &x, &wp, &bp, &m, &k, &nw, &eps, &h, &kc, &vc, &slots, &cs,
                          &H, &K, &hd, &rot, &ks, &vs, NULL};
            return launch_rows(cb, cb->mod.fn.gemv1b_qkv8[norm != NULL],
                               cb->mod.fn.gemv1c_qkv8[norm != NULL], m / 4, a8,
                               (int)(sizeof a8 / sizeof a8[0]));
        }
        void *a[] = {&out, &x, &wp, &bp, &m, &k, &nw, &eps, &h, &kc, &vc, &slots, &cs,
                     &H, &K, &hd, &rot, NULL};
        return launch_rows(cb, cb->mod.fn.gemv1b_qkv[norm != NULL],
                           norm ? cb->mod.fn.gemv1c_norm[2] : cb->mod.fn.gemv1c[2],
                           m / 4, a, (int)(sizeof a / sizeof a[0]));
    }
    void *a[] = {&out, &x, &wp, &bp, &m, &k, &nw, &eps, &h, &resid, NULL};
    return launch_rows(cb, norm ? cb->mod.fn.gemv1b_norm : cb->mod.fn.gemv1b_resid,
                       norm ? cb->mod.fn.gemv1c_norm[0] : cb->mod.fn.gemv1c_resid, (m + 3) / 4, a,
                       (int)(sizeof a / sizeof a[0]));
}

/* A one-row matmul, which the fused GEMVs take. */
static bool fusable_gemv(const cuda_backend *cb, const cuda_cmd *c) {
    (void)cb;
    return c->op == CUDA_OP_MATMUL && c->n == 1;
}

/* The tail that the commands next[0, n_next) after mm (a fusable matmul) give its epilogue, and how many of them it takes (0: none): the epilogue the model
 * said (rmsnorm_matmul: CUDA_LINK_SWIGLU, CUDA_LINK_ROPE_KV), when the shapes fit the kernel.
 * swiglu: swiglu(act, out) with out [2f]; qkv: rope(out), kv_store(out) (the Llama order:
 * Qwen3's qk_norm between them keeps them apart). What the epilogue writes is none of the
 * buffers the GEMV reads (backend.h: a fused op's buffers do not alias). */
static int tail_of(const cuda_backend *cb, const cuda_cmd *mm, const cuda_cmd *next,
                   int n_next, gemv_tail *tail) {
    const atlas_backend_geom *g = &cb->base.geom;
    const atlas_weight *w = mm->p[2];
    *tail = TAIL_NONE;
    if (!fusable_gemv(cb, mm) || n_next < 1) return 0;
    if ((mm->link & CUDA_LINK_SWIGLU) && next[0].op == CUDA_OP_SWIGLU && next[0].n == 1 &&
        next[0].d % 2 == 0 && w->rows == 2 * (int64_t)next[0].d) {
        *tail = TAIL_SWIGLU;
        return 1;
    }
    int H = g->n_heads, K = g->n_kv_heads, hd = g->head_dim;
    if ((mm->link & CUDA_LINK_ROPE_KV) && w->fmt == ATLAS_WFMT_DENSE && n_next >= 2 &&
        next[0].op == CUDA_OP_ROPE && next[0].n == 1 && next[1].op == CUDA_OP_KV_STORE &&
        next[1].n == 1 && hd % 4 == 0 && g->rope_dim % 4 == 0 &&
        w->rows == (int64_t)(H + 2 * K) * hd) {
        *tail = TAIL_QKV;
        return 2;
    }
    return 0;
}

/* norm (a one-row add_rmsnorm) feeds mm, a fusable matmul of its output h, as the model said
 * (rmsnorm_matmul: CUDA_LINK_FEEDS); mm writes neither the residual stream nor h (backend.h:
 * no aliasing), which the fused GEMV reads and writes. */
static bool norm_feeds(const cuda_backend *cb, const cuda_cmd *norm, const cuda_cmd *mm) {
    return norm->op == CUDA_OP_ADD_RMSNORM && (norm->link & CUDA_LINK_FEEDS) && norm->n == 1 &&
           norm->d % 8 == 0 && fusable_gemv(cb, mm) &&
           ((const atlas_weight *)mm->p[2])->cols == norm->d;
}

/* cmds commands ran as kernels kernels: counted, for tests; returns cmds. */
static int fused(cuda_backend *cb, int cmds, int kernels) {
    cb->plan.fused_away += (uint64_t)(cmds - kernels);
    return cmds;
}

/* The fusions the model said (backend.h's fused ops, which backend_cuda.c records as plain
 * commands with CUDA_LINK_* bits), at the head of the queued list c[0, n): commands are linked
 * by their position, their links and the hand-off rules of backend.h, never by comparing
 * their buffers; only shapes are checked, for what the kernels take. First prefill's bf16 MLP
 * chain (prefill_mlp, >= 64 rows; it leaves the intermediates unwritten), then decode's (one
 * row a sequence; each keeps the ops' results, the intermediate included): rope then
 * kv_store -> one kernel (rope); RMSNorm folded into the GEMVs before and after it (norm); the qkv GEMV followed by
 * rope and kv_store -> one GEMV whose epilogue does them (qkv); the gate_up GEMV followed by
 * swiglu -> one GEMV whose epilogue does it (swiglu). The last two also take the norm
 * fusion's GEMV, so with all of them a Llama layer is 5 kernels: attention (merged), o
 * (+ residual), gate_up (norm, swiglu), down (+ residual), the next qkv (norm, rope,
 * kv_store). (A GEMV that computed swiglu on the fly for the down projection was tried and
 * dropped: every warp recomputed and re-read all of gate_up, 69 us a layer against 38 + 3
 * for the two kernels; bench/RESULTS.md.)
 * Returns how many commands ran (1 to 5). */
int cuda_exec_fused(cuda_backend *cb, const cuda_cmd *c, int n, atlas_status *st) {
    const atlas_backend_geom *g = &cb->base.geom;
    gemv_tail tail;
    int used;
    if (prefill_mlp(cb, c, n, st)) return 3; /* prefill: gate_up -> swiglu -> down in bf16 */
    if (n >= 2 && c[0].op == CUDA_OP_ROPE && (c[0].link & CUDA_LINK_KV) &&
        c[1].op == CUDA_OP_KV_STORE && c[1].n == c[0].n) {
        int H = g->n_heads, K = g->n_kv_heads, hd = g->head_dim, rot = g->rope_dim / 2;
        CUdeviceptr qkv = CUDA_PTR(c[0].p[0]), kc, vc, cs = cuda_rope_table(cb, c[0].layer);
        CUdeviceptr slots = cuda_stage_ptr(cb, CUDA_STAGE_SLOTS);
        const atlas_kv *kv = c[1].p[1];
        kv_pools(kv, c[1].layer, &kc, &vc);
        float ks = kv_scale(cb, c[1].layer, 0), vs = kv_scale(cb, c[1].layer, 1);
        void *a[] = {&qkv, &kc, &vc, &slots, &cs, &H, &K, &hd, &rot, &ks, &vs}; /* ks, vs: FP8's */
        *st = launch(cb, kv->es == 1 ? cb->mod.fn.rope_kv8 : cb->mod.fn.rope_kv,
                     (unsigned)c[0].n, (unsigned)(H + 2 * K), 1, hd / 2 < 32 ? 32 : hd / 2, 0, a);
        return fused(cb, 2, 1);
    }
    /* matmul -> o; add_rmsnorm(x += o, h = norm(x)); matmul(h), as matmul_residual then
     * rmsnorm_matmul said them: the first GEMV adds its output into x, the second normalises
     * x on the fly (and writes h) */
    if (n >= 3 && fusable_gemv(cb, &c[0]) && (c[0].link & CUDA_LINK_RESID) &&
        norm_feeds(cb, &c[1], &c[2]) && c[1].p[1] &&
        ((const atlas_weight *)c[0].p[2])->rows == c[1].d) {
        used = tail_of(cb, &c[2], c + 3, n - 3, &tail);
        *st = gemv_fused(cb, &c[0], NULL, CUDA_PTR(c[1].p[0]), TAIL_NONE, NULL);
        if (*st == ATLAS_OK) *st = gemv_fused(cb, &c[2], &c[1], 0, tail, c + 3);
        return fused(cb, 3 + used, 2);
    }
    /* rmsnorm (no add) then matmul(h): the GEMV normalises on the fly */
    if (n >= 2 && norm_feeds(cb, &c[0], &c[1]) && !c[0].p[1]) {
        used = tail_of(cb, &c[1], c + 2, n - 2, &tail);
        *st = gemv_fused(cb, &c[1], &c[0], 0, tail, c + 2);
        return fused(cb, 2 + used, 1);
    }
    /* a GEMV and its epilogue's ops alone */
    if ((used = tail_of(cb, &c[0], c + 1, n - 1, &tail)) > 0) {
        *st = gemv_fused(cb, &c[0], NULL, 0, tail, c + 1);
        return fused(cb, 1 + used, 1);
    }
    *st = cuda_exec(cb, c);
    return 1;
}

/* backend/cuda/ops_moe.c — the mixture-of-experts commands on the GPU (backend.h moe_route
 * and moe_experts, which backend_cuda.c records and plan.c runs here; the kernels and what
 * each computes are kernels/moe.cu's).
 *
 * Both ops are recorded as commands like every other op, so a decode step with MoE layers is
 * still one CUDA graph: every launch shape depends on the batch's token count only, and the
 * grouping by expert (counts, prefix sums, permutation, tile table) happens on the device.
 * A batch of few slots (n * k <= MOE_SLOT_MAX: decode at batch 1 and 2 of Qwen3-MoE's k = 8,
 * up to 8 of Mixtral's k = 2) runs each slot's expert as GEMVs, which read only the chosen
 * experts' rows; a larger one runs grouped, one launch for all experts' gate|up and one for
 * down, in passes of at most cuda_workspace.moe_chunk tokens whose buffers fit
 * CUDA_MOE_WS_MAX (one pass for every prefill chunk of the shapes in the issue). MXFP4
 * experts (weight_load's quant_load_experts) run the kernels' _fp4 instances on the same
 * arguments plus the scales, so the workspace and the launch shapes are the same.
 *
 * Workspace (cuda_workspace.moe, reserved by begin_batch for its token count): the router's
 * logits [n, E] fp32; then for one pass of c tokens (S = c * k slots) the activations [S, f]
 * (fp32 for the GEMVs, bf16 grouped), and grouped the slots' rows, the permutation, the tile
 * table and the down products [S, d] fp32. */
#include <stdbool.h>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"

enum { MOE_SLOT_MAX = 16, MOE_BM = 64 /* the grouped kernels' tile rows (kernels/moe.cu GM) */ };

typedef struct moe_ws {
    bool grouped;
    int chunk; /* tokens of one pass */
    size_t logits, act, pos, rows, tiles, y, total; /* byte offsets; total: all of it */
} moe_ws;

static size_t up256(size_t b) { return (b + 255) & ~(size_t)255; }

/* The most tiles of MOE_BM rows that `slots` slots over E experts can make. */
static int max_tiles(int slots, int E) {
    return (slots + MOE_BM - 1) / MOE_BM + (E < slots ? E : slots);
}

/* The layout of one pass of c tokens from offset at; returns its end. */
static size_t pass_layout(const atlas_backend_geom *g, int c, bool grouped, size_t at,
                          moe_ws *L) {
    size_t S = (size_t)c * g->n_experts_used;
    L->act = at; /* fp32 for the GEMVs, bf16 grouped */
    at += up256(S * g->expert_ffn * (grouped ? 2 : sizeof(float)));
    if (!grouped) return at;
    L->pos = at;
    at += up256(S * sizeof(int32_t));
    L->rows = at;
    at += up256(S * sizeof(int32_t));
    L->tiles = at;
    at += up256((1 + 3 * (size_t)max_tiles((int)S, g->n_experts)) * sizeof(int32_t));
    L->y = at;
    return at + up256(S * g->hidden * sizeof(float));
}

static moe_ws moe_layout(const cuda_backend *cb, int n) {
    const atlas_backend_geom *g = &cb->base.geom;
    moe_ws L = {.grouped = (size_t)n * g->n_experts_used > MOE_SLOT_MAX, .chunk = n};
    size_t base = up256((size_t)n * g->n_experts * sizeof(float));
    if (L.grouped) {
        /* the largest pass that fits (a pass's bytes grow with its tokens) */
        int lo = 1, hi = n;
        while (lo < hi) {
            int mid = lo + (hi - lo + 1) / 2;
            moe_ws t;
            if (pass_layout(g, mid, true, 0, &t) <= CUDA_MOE_WS_MAX) lo = mid;
            else hi = mid - 1;
        }
        L.chunk = cb->ws.moe_chunk > 0 && cb->ws.moe_chunk < lo ? cb->ws.moe_chunk : lo;
    }
    L.total = pass_layout(g, L.chunk, L.grouped, base, &L);
    return L;
}

size_t cuda_moe_ws_bytes(const cuda_backend *cb, int n) {
    return cb->base.geom.n_experts > 0 && n > 0 ? moe_layout(cb, n).total : 0;
}

/* --- the commands, run ------------------------------------------------------------------- */

/* A weight's device pointer, 0 for none (the biases). */
static CUdeviceptr wptr(const void *w) { return w ? ((const atlas_weight *)w)->ptr : 0; }

/* p: ids, wts, h, router, router bias (NULL: none) */
static atlas_status exec_route(cuda_backend *cb, const cuda_cmd *c, const moe_ws *L) {
    const atlas_backend_geom *g = &cb->base.geom;
    int n = c->n, E = g->n_experts, k = g->n_experts_used, d = g->hidden;
    int norm = g->moe_norm_topk != 0, order = g->moe_route == ATLAS_ROUTE_TOPK_SOFTMAX;
    CUdeviceptr ids = CUDA_PTR(c->p[0]), wts = CUDA_PTR(c->p[1]), h = CUDA_PTR(c->p[2]);
    CUdeviceptr router = wptr(c->p[3]), bias = wptr(c->p[4]), logits = cb->ws.moe + L->logits;
    void *a[] = {&logits, &h, &router, &bias, &n, &E, &d};
    ATLAS_TRY(cuda_launch(cb, cb->mod.fn.moe_logits, (unsigned)((E + 3) / 4),
                          (unsigned)((n + 15) / 16), 1, 128, 0, a));
    void *b[] = {&ids, &wts, &logits, &E, &k, &norm, &order};
    return cuda_launch(cb, cb->mod.fn.moe_topk, (unsigned)n, 1, 1, 128, 0, b);
}

/* The experts' weights, their scales (MXFP4; 0: bf16) and biases (0: none) of one command;
 * q picks the kernels (1: MXFP4, backend_cuda.c lets both weights through in one format). */
typedef struct moe_w {
    CUdeviceptr gu, gsc, gub, dn, dsc, db;
    int q;
} moe_w;

static moe_w weights_of(const cuda_cmd *c) {
    const atlas_weight *gu = c->p[2], *dn = c->p[3];
    return (moe_w){.gu = gu->ptr, .gsc = gu->scales, .gub = wptr(c->p[6]), .dn = dn->ptr,
                   .dsc = dn->scales, .db = wptr(c->p[7]), .q = gu->fmt == ATLAS_WFMT_FP4_E2M1};
}

/* One grouped pass over nc tokens: their slots planned, gate|up, down, the combine. */
static atlas_status grouped_pass(cuda_backend *cb, const moe_ws *L, CUdeviceptr out,
                                 CUdeviceptr h, moe_w w, CUdeviceptr ids, CUdeviceptr wts,
                                 int nc) {
    const atlas_backend_geom *g = &cb->base.geom;
    int E = g->n_experts, k = g->n_experts_used, d = g->hidden, f = g->expert_ffn;
    cuda_glu_act ga = cuda_glu_of(cb, (int)g->glu);
    int S = nc * k, bm = MOE_BM, tiles_n = max_tiles(S, E);
    CUdeviceptr ws = cb->ws.moe, act = ws + L->act, pos = ws + L->pos, rows = ws + L->rows;
    CUdeviceptr tiles = ws + L->tiles, y = ws + L->y;
    void *pa[] = {&pos, &rows, &tiles, &ids, &S, &E, &bm};
    ATLAS_TRY(cuda_launch(cb, cb->mod.fn.moe_plan, 1, 1, 1, 1024, 0, pa));
    void *gua[] = {&act, &h, &w.gu, &w.gsc, &w.gub, &tiles, &rows, &k, &d, &f, &ga};
    ATLAS_TRY(cuda_launch(cb, cb->mod.fn.moe_gu_grouped[w.q], (unsigned)((f + 63) / 64),
                          (unsigned)tiles_n, 1, 256, 0, gua));
    void *da[] = {&y, &act, &w.dn, &w.dsc, &tiles, &d, &f};
    ATLAS_TRY(cuda_launch(cb, cb->mod.fn.moe_down_grouped[w.q], (unsigned)((d + 127) / 128),
                          (unsigned)tiles_n, 1, 256, 0, da));
    void *ca[] = {&out, &y, &w.db, &ids, &wts, &pos, &k, &d};
    return cuda_launch(cb, cb->mod.fn.moe_combine, (unsigned)nc, 1, 1, 256, 0, ca);
}

/* p: out, h, gate_up, down, ids, wts, gate_up bias, down bias (biases NULL: none) */
static atlas_status exec_experts(cuda_backend *cb, const cuda_cmd *c, const moe_ws *L) {
    const atlas_backend_geom *g = &cb->base.geom;
    int n = c->n, E = g->n_experts, k = g->n_experts_used, d = g->hidden, f = g->expert_ffn;
    CUdeviceptr out = CUDA_PTR(c->p[0]), h = CUDA_PTR(c->p[1]);
    moe_w w = weights_of(c);
    CUdeviceptr ids = CUDA_PTR(c->p[4]), wts = CUDA_PTR(c->p[5]);
    if (!L->grouped) {
        CUdeviceptr act = cb->ws.moe + L->act;
        cuda_glu_act ga = cuda_glu_of(cb, (int)g->glu);
        void *a[] = {&act, &h, &w.gu, &w.gsc, &w.gub, &ids, &k, &d, &f, &E, &ga};
        ATLAS_TRY(cuda_launch(cb, cb->mod.fn.moe_gu_slots[w.q], (unsigned)((f + 7) / 8),
                              (unsigned)(n * k), 1, 256, 0, a));
        void *b[] = {&out, &act, &w.dn, &w.dsc, &w.db, &ids, &wts, &k, &d, &f, &E};
        return cuda_launch(cb, cb->mod.fn.moe_down_slots[w.q], (unsigned)((d + 7) / 8), (unsigned)n,
                           1, 256, 0, b);
    }
    for (int t0 = 0; t0 < n; t0 += L->chunk) {
        int nc = n - t0 < L->chunk ? n - t0 : L->chunk;
        size_t slot0 = (size_t)t0 * k * 4, row0 = (size_t)t0 * d * 4;
        ATLAS_TRY(grouped_pass(cb, L, out + row0, h + row0, w, ids + slot0, wts + slot0, nc));
    }
    return ATLAS_OK;
}

atlas_status cuda_moe_exec(cuda_backend *cb, const cuda_cmd *c) {
    if (c->n <= 0) return ATLAS_OK;
    if (!cb->mod.fn.moe_topk)
        return atlas_fail(ATLAS_ERR_INTERNAL, "cuda moe: the kernels were not loaded (a "
                          "geometry without experts)");
    moe_ws L = moe_layout(cb, c->n);
    if (L.total > cb->ws.moe_bytes)
        return atlas_fail(ATLAS_ERR_INTERNAL, "cuda moe: %d tokens want %zu bytes of workspace "
                          "and %zu are reserved (begin_batch reserves them)", c->n, L.total,
                          cb->ws.moe_bytes);
    return c->op == CUDA_OP_MOE_ROUTE ? exec_route(cb, c, &L) : exec_experts(cb, c, &L);
}

static atlas_status moe_load(cuda_backend *cb) {
    ATLAS_TRY(atlas_registry_load_module(cb->mod.reg, "moe"));
    cuda_fns *fn = &cb->mod.fn;
    struct { CUfunction *f; const char *name; } fns[] = {
        {&fn->moe_logits, "atlas_moe_logits"}, {&fn->moe_plan, "atlas_moe_plan"},
        {&fn->moe_combine, "atlas_moe_combine"},
        {&fn->moe_gu_slots[0], "atlas_moe_gu_slots"},
        {&fn->moe_gu_slots[1], "atlas_moe_gu_slots_fp4"},
        {&fn->moe_down_slots[0], "atlas_moe_down_slots"},
        {&fn->moe_down_slots[1], "atlas_moe_down_slots_fp4"},
        {&fn->moe_gu_grouped[0], "atlas_moe_gu_grouped"},
        {&fn->moe_gu_grouped[1], "atlas_moe_gu_grouped_fp4"},
        {&fn->moe_down_grouped[0], "atlas_moe_down_grouped"},
        {&fn->moe_down_grouped[1], "atlas_moe_down_grouped_fp4"},
        {&fn->moe_topk, "atlas_moe_topk"}, /* last: it says all are loaded */
    };
    for (size_t i = 0; i < sizeof fns / sizeof *fns; i++)
        ATLAS_TRY(atlas_registry_function(cb->mod.reg, fns[i].name, fns[i].f));
    return ATLAS_OK;
}

atlas_status cuda_moe_ready(cuda_backend *cb) {
    return cb->mod.fn.moe_topk ? ATLAS_OK : cuda_quietly(cb, moe_load);
}

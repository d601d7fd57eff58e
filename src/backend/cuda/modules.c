/* backend/cuda/modules.c — the model's module set: the kernels looked up in the registry's
 * modules and the cuBLASLt handle with its buffers, made once at create; the state is
 * cuda_backend.mod (cuda_backend.h). */
#include <stdbool.h>
#include <stdio.h>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"

typedef struct quiet_job {
    atlas_status (*fn)(cuda_backend *);
    cuda_backend *cb;
} quiet_job;

static atlas_status quiet_run(void *arg) {
    quiet_job *j = arg;
    return j->fn(j->cb);
}

atlas_status cuda_quietly(cuda_backend *cb, atlas_status (*fn)(cuda_backend *)) {
    quiet_job j = {fn, cb};
    return atlas_host_quiet_call(cb->dev.host, quiet_run, &j);
}

/* Looks up every kernel; loads the modules. */
static atlas_status load_kernels(cuda_backend *cb) {
    static const char *const modules[] = {"embed", "norm", "rope", "kv", "swiglu", "argmax",
                                          "gemv", "gemm", "attention", "attn_prefill"};
    for (size_t i = 0; i < sizeof modules / sizeof *modules; i++)
        ATLAS_TRY(atlas_registry_load_module(cb->mod.reg, modules[i]));
    cuda_fns *fn = &cb->mod.fn;
    struct { CUfunction *f; const char *name; } fns[] = {
        {&fn->embed, "atlas_embed"}, {&fn->gather_rows, "atlas_gather_rows"},
        {&fn->add_rmsnorm, "atlas_add_rmsnorm"}, {&fn->qk_norm, "atlas_qk_norm"},
        {&fn->rope, "atlas_rope"}, {&fn->kv_store, "atlas_kv_store"},
        {&fn->swiglu, "atlas_swiglu"}, {&fn->swiglu_bf16, "atlas_swiglu_bf16"},
        {&fn->argmax, "atlas_argmax"}, {&fn->argmax_wide, "atlas_argmax_wide"},
        {&fn->gemv4, "atlas_gemv4"},
        {&fn->gemv8, "atlas_gemv8"}, {&fn->gemm, "atlas_gemm"},
        {&fn->f32_to_bf16, "atlas_f32_to_bf16"}, {&fn->add_bias, "atlas_add_bias"},
        {&fn->attn_split, "atlas_attn_split"}, {&fn->attn_combine, "atlas_attn_combine"},
        {&fn->rope_kv, "atlas_rope_kv_store"},
        {&fn->stage, "atlas_stage"},
        {&fn->gemv1b, "atlas_gemv1b"}, {&fn->gemv_mma, "atlas_gemv_mma"},
        {&fn->gemv1b_norm, "atlas_gemv1b_norm"},
        {&fn->gemv1b_resid, "atlas_gemv1b_resid"},
        {&fn->gemv1b_swiglu[0], "atlas_gemv1b_swiglu"},
        {&fn->gemv1b_swiglu[1], "atlas_gemv1b_norm_swiglu"},
        {&fn->gemv1b_qkv[0], "atlas_gemv1b_qkv"},
        {&fn->gemv1b_qkv[1], "atlas_gemv1b_norm_qkv"},
        {&fn->gemv1c[0], "atlas_gemv1c"}, {&fn->gemv1c[1], "atlas_gemv1c_swiglu"},
        {&fn->gemv1c[2], "atlas_gemv1c_qkv"}, {&fn->gemv1c_norm[0], "atlas_gemv1c_norm"},
        {&fn->gemv1c_norm[1], "atlas_gemv1c_norm_swiglu"},
        {&fn->gemv1c_norm[2], "atlas_gemv1c_norm_qkv"},
        {&fn->gemv1c_resid, "atlas_gemv1c_resid"},
    };
    for (size_t i = 0; i < sizeof fns / sizeof *fns; i++)
        ATLAS_TRY(atlas_registry_function(cb->mod.reg, fns[i].name, fns[i].f));
    /* attention: only the model's head_dim (looking a kernel up loads it: each costs time in
     * every model load, and 2/3 of these would never run) */
    int hd = cb->base.geom.head_dim;
    fn->attn_prefill = NULL;
    if (hd == 64 || hd == 80 || hd == 96 || hd == 128) {
        char name[48];
        snprintf(name, sizeof name, "atlas_attn_prefill%d", hd);
        ATLAS_TRY(atlas_registry_function(cb->mod.reg, name, &fn->attn_prefill));
    }
    for (int h = 0; h < 3; h++)
        for (int q = 0; q < 4 && (64 << h) == hd; q++) {
            char name[48];
            snprintf(name, sizeof name, "atlas_attn_dec%d_g%d", 64 << h, 1 << q);
            ATLAS_TRY(atlas_registry_function(cb->mod.reg, name, &fn->attn_dec[h][q]));
            /* cluster kernel: head_dim <= 128, a head a block, where clusters are used */
            if (h == 2 || q > 0 || !cb->dev.arch.clusters) continue;
            snprintf(name, sizeof name, "atlas_attn_dcl%d_g1_w4", 64 << h);
            ATLAS_TRY(atlas_registry_function(cb->mod.reg, name, &fn->attn_dcl[h]));
        }
    return ATLAS_OK;
}

static atlas_status kv8_load(cuda_backend *cb) {
    cuda_fns *fn = &cb->mod.fn;
    ATLAS_TRY(atlas_registry_function(cb->mod.reg, "atlas_kv_store_fp8", &fn->kv_store8));
    ATLAS_TRY(atlas_registry_function(cb->mod.reg, "atlas_rope_kv_store_fp8", &fn->rope_kv8));
    ATLAS_TRY(atlas_registry_function(cb->mod.reg, "atlas_attn_split_fp8", &fn->attn_split8));
    ATLAS_TRY(atlas_registry_function(cb->mod.reg, "atlas_gemv1b_qkv_fp8", &fn->gemv1b_qkv8[0]));
    ATLAS_TRY(atlas_registry_function(cb->mod.reg, "atlas_gemv1b_norm_qkv_fp8",
                                      &fn->gemv1b_qkv8[1]));
    ATLAS_TRY(atlas_registry_function(cb->mod.reg, "atlas_gemv1c_qkv_fp8", &fn->gemv1c_qkv8[0]));
    ATLAS_TRY(atlas_registry_function(cb->mod.reg, "atlas_gemv1c_norm_qkv_fp8",
                                      &fn->gemv1c_qkv8[1]));
    int hd = cb->base.geom.head_dim;
    char name[48];
    fn->attn_prefill8 = NULL;
    if (fn->attn_prefill) { /* the same head_dims as the bf16 kernel */
        snprintf(name, sizeof name, "atlas_attn_prefill%d_fp8", hd);
        ATLAS_TRY(atlas_registry_function(cb->mod.reg, name, &fn->attn_prefill8));
    }
    for (int h = 0; h < 3; h++)
        for (int q = 0; q < 4 && (64 << h) == hd; q++) {
            snprintf(name, sizeof name, "atlas_attn_dec%d_g%d_fp8", 64 << h, 1 << q);
            ATLAS_TRY(atlas_registry_function(cb->mod.reg, name, &fn->attn_dec8[h][q]));
        }
    cb->mod.kv8_ready = true;
    return ATLAS_OK;
}

atlas_status cuda_kv8_ready(cuda_backend *cb) {
    return cb->mod.kv8_ready ? ATLAS_OK : cuda_quietly(cb, kv8_load);
}

/* bps[w]: blocks of w warps an SM of streaming kernel f (-1: none fits; 1 where the driver
 * cannot tell), asked here rather than at the launch, which a graph capture may record. */
static atlas_status stream_occupancy(CUfunction f, int *bps) {
    const atlas_driver *d = atlas_driver_get();
    for (int w = 1; w <= 16; w++) {
        int b = 1;
        if (d->cuOccupancyMaxActiveBlocksPerMultiprocessor)
            ATLAS_CU_TRY(cuOccupancyMaxActiveBlocksPerMultiprocessor, &b, f, 32 * w, 0);
        bps[w] = b > 0 ? b : -1;
    }
    return ATLAS_OK;
}

/* The quantized formats' kernels, loaded with the first quantized weight (a dense model never
 * loads their module: every lookup costs load time). */
static atlas_status quant_load(cuda_backend *cb) {
    ATLAS_TRY(atlas_registry_load_module(cb->mod.reg, "quant"));
    static const char *const qnames[CUDA_QKINDS] = {"fp8", "int4", "int4g", "fp4"};
    cuda_fns *fn = &cb->mod.fn;
    ATLAS_TRY(atlas_registry_function(cb->mod.reg, "atlas_qgemv8_int4g", &fn->qgemv8_g));
    ATLAS_TRY(atlas_registry_function(cb->mod.reg, "atlas_qrowscale", &fn->qrowscale));
    ATLAS_TRY(atlas_registry_function(cb->mod.reg, "atlas_fp8_actq", &fn->fp8_actq));
    ATLAS_TRY(atlas_registry_function(cb->mod.reg, "atlas_int4_repack_gptq", &fn->repack_gptq));
    ATLAS_TRY(atlas_registry_function(cb->mod.reg, "atlas_int4_repack_awq", &fn->repack_awq));
    ATLAS_TRY(atlas_registry_function(cb->mod.reg, "atlas_int4_repack_grids",
                                      &fn->repack_grids));
    ATLAS_TRY(atlas_registry_function(cb->mod.reg, "atlas_qgemv1x_int4", &fn->qgemv1x));
    ATLAS_TRY(atlas_registry_function(cb->mod.reg, "atlas_qsplit_fp8", &fn->qsplit[0]));
    ATLAS_TRY(atlas_registry_function(cb->mod.reg, "atlas_qsplit_q4", &fn->qsplit[1]));
    for (int q = 0; q < CUDA_QKINDS; q++) {
        char name[48];
        snprintf(name, sizeof name, "atlas_qgemv1_%s", qnames[q]);
        ATLAS_TRY(atlas_registry_function(cb->mod.reg, name, &fn->qgemv1[q]));
        if (q != CUDA_Q_INT4G) {
            snprintf(name, sizeof name, "atlas_qgemv1c_%s", qnames[q]);
            ATLAS_TRY(atlas_registry_function(cb->mod.reg, name, &fn->qgemv1c[q]));
        }
        /* the streaming kernels: 8 stages of every format but act-order; 4 stages and
         * int8 x of INT4 */
        static const char *const snames[CUDA_QSTREAMS] = {"s", "s4", "sx"};
        for (int i = 0; i < CUDA_QSTREAMS; i++) {
            fn->qgemv1s[q][i] = NULL;
            if (q == CUDA_Q_INT4G || (i > 0 && q != CUDA_Q_INT4)) continue;
            snprintf(name, sizeof name, "atlas_qgemv1%s_%s", snames[i], qnames[q]);
            ATLAS_TRY(atlas_registry_function(cb->mod.reg, name, &fn->qgemv1s[q][i]));
            ATLAS_TRY(stream_occupancy(fn->qgemv1s[q][i], fn->qgemv1s_bps[q][i]));
        }
        if (q == CUDA_Q_FP4) {
            ATLAS_TRY(
                atlas_registry_function(cb->mod.reg, "atlas_qgemv1s16_fp4", &fn->qgemv1s16));
            ATLAS_TRY(stream_occupancy(fn->qgemv1s16, fn->qgemv1s16_bps));
        }
        snprintf(name, sizeof name, "atlas_qdequant_%s", qnames[q]);
        ATLAS_TRY(atlas_registry_function(cb->mod.reg, name, &fn->qdequant[q]));
        for (int i = 0; i < 4 && q != CUDA_Q_INT4G; i++) {
            snprintf(name, sizeof name, "atlas_qmma%d_%s", 1 << i, qnames[q]);
            ATLAS_TRY(atlas_registry_function(cb->mod.reg, name, &fn->qmma[q][i]));
            snprintf(name, sizeof name, "atlas_qmmp%d_%s", 1 << i, qnames[q]);
            ATLAS_TRY(atlas_registry_function(cb->mod.reg, name, &fn->qmmp[q][i]));
            if (q == CUDA_Q_INT4) {
                snprintf(name, sizeof name, "atlas_qmmq%d_int4", 1 << i);
                ATLAS_TRY(atlas_registry_function(cb->mod.reg, name, &fn->qmmq[i]));
            }
            for (int r = 0; q == CUDA_Q_INT4 && i < 2 && r < 2; r++) {
                snprintf(name, sizeof name, "atlas_qmmw%dx%d_int4", 1 << i, 2 << r);
                ATLAS_TRY(atlas_registry_function(cb->mod.reg, name, &fn->qmmw[i][r]));
            }
        }
    }
    cb->mod.quant_ready = true;
    return ATLAS_OK;
}

atlas_status cuda_quant_ready(cuda_backend *cb) {
    return cb->mod.quant_ready ? ATLAS_OK : cuda_quietly(cb, quant_load);
}

static atlas_status sample_load(cuda_backend *cb) {
    ATLAS_TRY(atlas_registry_load_module(cb->mod.reg, "sample"));
    ATLAS_TRY(atlas_registry_function(cb->mod.reg, "atlas_sample", &cb->mod.fn.sample));
    ATLAS_TRY(atlas_registry_function(cb->mod.reg, "atlas_sample_ids", &cb->mod.fn.sample_ids));
    cb->mod.sample_ready = true;
    return ATLAS_OK;
}

atlas_status cuda_sample_ready(cuda_backend *cb) {
    return cb->mod.sample_ready ? ATLAS_OK : cuda_quietly(cb, sample_load);
}

/* cb->base.kernels: the choices (arch.c) and the code the driver picked, read back from one
 * kernel: "running sm_90 code from compute_90 PTX" where the machine code was built for
 * sm_90a, compute_80 in portable mode. */
static void describe(cuda_backend *cb) {
    const atlas_host_props *p = atlas_host_properties(cb->dev.host);
    char arch[256];
    cuda_arch_describe(&cb->dev.arch, p, arch, (int)sizeof arch);
    int ptx = 0, bin = 0;
    const atlas_driver *d = atlas_driver_get();
    if (d->cuFuncGetAttribute && cb->mod.fn.embed &&
        d->cuFuncGetAttribute(&ptx, ATLAS_CU_FUNC_ATTR_PTX_VERSION, cb->mod.fn.embed) == 0 &&
        d->cuFuncGetAttribute(&bin, ATLAS_CU_FUNC_ATTR_BINARY_VERSION, cb->mod.fn.embed) == 0 &&
        ptx > 0 && bin > 0)
        snprintf(cb->base.kernels, sizeof cb->base.kernels, "%s; running sm_%d code from "
                 "compute_%d", arch, bin, ptx);
    else
        snprintf(cb->base.kernels, sizeof cb->base.kernels, "%s", arch);
    if (cb->plan.int8_x) {
        size_t n = strlen(cb->base.kernels);
        snprintf(cb->base.kernels + n, sizeof cb->base.kernels - n,
                 "; INT4 one-row matmuls with int8 activations");
    }
}

/* The kernel modules and cuBLASLt, made once, at the backend's creation. 3-4 ms on the H200
 * machine since cuBLASLt stays open; kernels and cuBLASLt together held the first weight
 * back 62-83 ms when it was opened in every load: bench/RESULTS.md. */
atlas_status cuda_ready(cuda_backend *cb) {
    if (cb->mod.ready) return ATLAS_OK;
    ATLAS_TRY(atlas_host_make_current(cb->dev.host));
    ATLAS_TRY(cuda_quietly(cb, load_kernels));
    describe(cb);
    if (cb->mod.want_lt && cuda_lt_create(&cb->mod.lt) == ATLAS_OK) {
        cb->ws.lt_a_bytes = (size_t)64 << 20;
        cb->ws.lt_ws_bytes = (size_t)32 << 20;
        if (atlas_registry_alloc(cb->mod.reg, cb->ws.lt_a_bytes, "cublaslt input",
                                 &cb->ws.lt_a) != ATLAS_OK ||
            atlas_registry_alloc(cb->mod.reg, cb->ws.lt_ws_bytes, "cublaslt workspace",
                                 &cb->ws.lt_ws) != ATLAS_OK) {
            atlas_registry_keep(cb->mod.reg, cuda_lt_free(cb->mod.lt)); /* destroy reports it */
            cb->mod.lt = NULL;
            cb->ws.lt_a_bytes = cb->ws.lt_ws_bytes = 0;
        }
    }
    atlas_error_clear();
    cb->mod.ready = true;
    return ATLAS_OK;
}

/* engine/pools.c — the memory budget of the resident models and each model's KV pool
 * (atlas/engine.h, "Memory"), fixed when the engine is made. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "atlas/host.h"
#include "core/error.h"
#include "core/meminfo.h"
#include "engine/engine_internal.h"
#include "model/inspect.h"

static void format_bytes(char *buf, size_t cap, size_t b) {
    snprintf(buf, cap, "%.2f GiB", (double)b / (1024.0 * 1024 * 1024));
}

/* The CPU's budget under ATLAS_MAX_RESIDENT_AUTO: 90% of what the host has available now
 * (nothing is loaded yet), the rest left to the server, its buffers and the system; half the
 * RAM when that cannot be read. */
static size_t host_budget(atlas_engine *e, size_t ram) {
    atlas_mem_avail av;
    char t[32];
    if (atlas_mem_available(&av) == ATLAS_OK) {
        size_t b = (size_t)(0.9 * (double)av.bytes);
        format_bytes(t, sizeof t, b);
        snprintf(e->budget_what, sizeof e->budget_what, "0.9 of the host's available memory "
                 "at start is %s", t);
        return b;
    }
    atlas_error_clear();
    format_bytes(t, sizeof t, ram / 2);
    snprintf(e->budget_what, sizeof e->budget_what, "half the host's RAM is %s", t);
    return ram / 2;
}

atlas_host *atlas_engine_gpu_host(const atlas_engine *e) {
    atlas_host *h = NULL;
    if (e->p.device == ATLAS_DEVICE_CPU) return NULL;
    if (atlas_host_get(e->p.gpu, &h) == ATLAS_OK) return h;
    atlas_error_clear(); /* no GPU: the CPU serves, as the models will find too */
    return NULL;
}

/* The memory budget of the resident models: gpu_memory, else the share of the GPU's memory,
 * else none (the CPU: RAM is the system's to manage), except under ATLAS_MAX_RESIDENT_AUTO,
 * which needs one.  *gpu: a GPU is there. */
static size_t memory_budget(atlas_engine *e, int *gpu, size_t *ram_share) {
    atlas_host *h = atlas_engine_gpu_host(e);
    *gpu = h != NULL;
    size_t total = h ? atlas_host_properties(h)->total_mem : 0;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    size_t ram = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : (size_t)4 << 30;
    *ram_share = ram / 4;
    char t[32];
    if (e->p.gpu_memory) {
        format_bytes(t, sizeof t, e->p.gpu_memory);
        snprintf(e->budget_what, sizeof e->budget_what, "the memory budget is %s", t);
        return e->p.gpu_memory;
    }
    if (!*gpu) return e->p.max_resident == ATLAS_MAX_RESIDENT_AUTO ? host_budget(e, ram) : 0;
    size_t b = (size_t)(e->p.gpu_memory_utilization * (double)total);
    format_bytes(t, sizeof t, b);
    snprintf(e->budget_what, sizeof e->budget_what, "%.2f of the GPU's memory is %s",
             e->p.gpu_memory_utilization, t);
    return b;
}

/* How many models the pools are shared among, and the weights of that many of the largest
 * (*heavy): max_resident, or under ATLAS_MAX_RESIDENT_AUTO the most of the largest whose
 * weights and workspaces fit the budget together (at least one). */
static int sharers(const atlas_engine *e, size_t workspace, size_t *heavy) {
    int k = e->p.max_resident == ATLAS_MAX_RESIDENT_AUTO || e->p.max_resident > e->n_models
                ? e->n_models : e->p.max_resident;
    int auto_k = e->p.max_resident == ATLAS_MAX_RESIDENT_AUTO;
    char *taken = calloc((size_t)e->n_models, 1);
    *heavy = 0;
    int j = 0;
    for (; j < k && taken; j++) {
        int best = -1;
        for (int i = 0; i < e->n_models; i++)
            if (!taken[i] && (best < 0 || e->models[i].weight_bytes > e->models[best].weight_bytes))
                best = i;
        size_t w = e->models[best].weight_bytes;
        if (auto_k && j > 0 && e->budget && *heavy + w + (size_t)(j + 1) * workspace > e->budget)
            break;
        taken[best] = 1;
        *heavy += w;
    }
    free(taken);
    return j > 0 ? j : 1;
}

atlas_status atlas_engine_size_pools(atlas_engine *e) {
    int gpu = 0;
    size_t ram_share = 0;
    e->budget = memory_budget(e, &gpu, &ram_share);
    /* activations and the matmul library's scratch per resident model; the CPU's buffers
     * are small beside its weights */
    size_t workspace = gpu ? (size_t)1 << 30 : (size_t)64 << 20;
    size_t heavy = 0;
    int k = sharers(e, workspace, &heavy);
    size_t share = 0;
    if (e->budget) {
        size_t used = heavy + (size_t)k * workspace;
        share = e->budget > used ? (e->budget - used) / (size_t)k : 0;
    } else {
        share = ram_share / (size_t)k;
    }
    int bs = e->p.kv_block_size;
    for (int i = 0; i < e->n_models; i++) {
        eng_model *md = &e->models[i];
        /* auto: bf16 on a GPU and with the CPU's bf16 or int8 activations, fp32 on its
         * reference; FP8 one byte, so the same memory holds twice bf16's tokens */
        size_t elem = atlas_model_kv_elem(gpu, e->p.cpu_activations, md->kv_type);
        md->kv_token_bytes = 2 * elem * (size_t)md->cfg.n_layers * md->cfg.n_kv_heads *
                             md->cfg.head_dim;
        snprintf(md->kv_dtype, sizeof md->kv_dtype, "%s",
                 elem == 1 ? "fp8" : elem == 2 ? "bf16" : "f32");
        if (md->kv_f32_asked && elem != 4)
            return atlas_fail(ATLAS_ERR_UNSUPPORTED, "engine: model '%s': kv_dtype f32: the KV "
                              "cache on the %s is %s%s", md->name, gpu ? "GPU" : "CPU",
                              md->kv_dtype,
                              gpu ? " (bf16 or fp8 there)"
                                  : " (f32 with --cpu-activations fp32, bf16 with bf16 or int8)");
        long per_seq = (md->ctx + bs - 1) / bs;
        size_t mine = md->kv_memory ? md->kv_memory : share;
        long blocks = e->p.kv_blocks ? e->p.kv_blocks
                                     : (long)(mine / (md->kv_token_bytes * (size_t)bs));
        if (!e->p.kv_blocks && blocks > per_seq * md->parallel) blocks = per_seq * md->parallel;
        if (blocks > INT32_MAX / bs) blocks = INT32_MAX / bs;
        if (blocks < 1) blocks = 1; /* the load then fails: its weights leave no room */
        md->kv_blocks = (int)blocks;
        if (blocks < per_seq) {
            char t[32];
            format_bytes(t, sizeof t, (size_t)blocks * bs * md->kv_token_bytes);
            snprintf(md->ctx_note, sizeof md->ctx_note, "context lowered from %d to %ld tokens: "
                     "the KV pool (%s) holds no more for one sequence", md->ctx,
                     blocks * bs, t);
            md->ctx = (int)(blocks * bs);
        }
        md->est_bytes = md->weight_bytes + (size_t)blocks * bs * md->kv_token_bytes;
    }
    return ATLAS_OK;
}

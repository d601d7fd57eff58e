/* model/inspect.c — see inspect.h. */
#include "model/inspect.h"

#include <stdio.h>
#include <string.h>

#include "atlas/host.h"
#include "backend/backend.h"
#include "core/error.h"
#include "core/file.h"
#include "core/meminfo.h"
#include "format/layout.h"
#include "format/safetensors.h"
#include "model/quant.h"
#include "model/shard.h"
#include "model/weights.h"

int atlas_model_kv_blocks_for(const atlas_config *c, const atlas_model_params *p) {
    if (p->kv_blocks) return p->kv_blocks;
    int tokens = p->kv_tokens;
    if (!tokens) tokens = c->max_position > 0 && c->max_position < 4096 ? c->max_position : 4096;
    return (tokens + p->kv_block_size - 1) / p->kv_block_size;
}

atlas_cpu_activations atlas_model_cpu_act(atlas_cpu_activations act) {
    if (act != ATLAS_CPU_ACT_AUTO) return act;
    return atlas_backend_cpu_bf16_dot() || atlas_backend_cpu_int8_dot() ? ATLAS_CPU_ACT_INT8
                                                                         : ATLAS_CPU_ACT_FP32;
}

size_t atlas_model_kv_elem(bool cuda, atlas_cpu_activations act, atlas_kv_dtype kv) {
    if (kv == ATLAS_KV_DTYPE_FP8) return 1;
    if (kv == ATLAS_KV_DTYPE_BF16) return 2;
    return cuda || atlas_model_cpu_act(act) != ATLAS_CPU_ACT_FP32 ? 2 : 4;
}

size_t atlas_model_kv_bytes_for(const atlas_config *c, int n_kv_heads, int blocks,
                                int block_size, size_t elem) {
    return (size_t)2 * elem * (size_t)c->n_layers * (size_t)blocks *
           (size_t)block_size * (size_t)n_kv_heads * (size_t)c->head_dim;
}

void atlas_model_memory_room(bool cuda, int gpu, size_t *avail, char *what, size_t cap) {
    *avail = 0;
    what[0] = '\0';
    if (cuda) {
        atlas_host *h = NULL;
        size_t free_b = 0, total = 0;
        if (atlas_host_get(gpu, &h) == ATLAS_OK && atlas_host_mem_info(h, &free_b, &total) == ATLAS_OK) {
            *avail = free_b;
            snprintf(what, cap, "free memory of cuda:%d", gpu);
        } else {
            atlas_error_clear(); /* no figure: the load finds out */
        }
        return;
    }
    atlas_mem_avail m;
    if (atlas_mem_available(&m) != ATLAS_OK) {
        atlas_error_clear();
        return;
    }
    *avail = m.bytes;
    snprintf(what, cap, "%s", m.what);
}

static double gib(size_t b) { return (double)b / 1073741824.0; }

atlas_status atlas_model_memory_check(bool cuda, int gpu, size_t weights, size_t kv, int skip) {
    if (skip) return ATLAS_OK;
    size_t avail;
    char what[200];
    atlas_model_memory_room(cuda, gpu, &avail, what, sizeof what);
    if (!what[0] || weights + kv <= avail) return ATLAS_OK;
    return atlas_fail(cuda ? ATLAS_ERR_DEVICE_NOMEM : ATLAS_ERR_NOMEM,
                      "not enough memory: the weights and the KV cache need %.2f GiB (weights "
                      "%.2f, KV cache %.2f) on %s, and %.2f GiB is available (%s); nothing was "
                      "read. Lower the KV cache (--kv-memory, --ctx-size) or load anyway with "
                      "--no-memory-check (params.no_memory_check)", gib(weights + kv),
                      gib(weights), gib(kv), cuda ? "the GPU" : "the CPU", gib(avail), what);
}

/* Where p's device would load a model: the CPU, or CUDA when it can be used. */
static atlas_status pick_device(const atlas_model_params *p, atlas_model_survey *out) {
    if (p->device == ATLAS_DEVICE_CPU) {
        snprintf(out->backend, sizeof out->backend, "cpu");
        snprintf(out->backend_why, sizeof out->backend_why, "requested");
        return ATLAS_OK;
    }
    atlas_host *h = NULL;
    atlas_status st = atlas_host_get(p->gpu, &h);
    if (st == ATLAS_OK) {
        snprintf(out->backend, sizeof out->backend, "cuda");
        snprintf(out->backend_why, sizeof out->backend_why, "%s",
                 p->device == ATLAS_DEVICE_CUDA ? "requested" : "a CUDA device is usable");
        return ATLAS_OK;
    }
    if (p->device == ATLAS_DEVICE_CUDA) return st;
    snprintf(out->backend, sizeof out->backend, "cpu");
    snprintf(out->backend_why, sizeof out->backend_why, "CUDA not usable (%s: %.200s)",
             atlas_status_str(st), atlas_last_error());
    atlas_error_clear();
    return ATLAS_OK;
}

static void copy_config(const atlas_config *c, atlas_model_survey *out) {
    snprintf(out->architecture, sizeof out->architecture, "%s", c->architecture);
    out->vocab_size = c->vocab_size;
    out->hidden = c->hidden;
    out->n_layers = c->n_layers;
    out->n_heads = c->n_heads;
    out->n_kv_heads = c->n_kv_heads;
    out->head_dim = c->head_dim;
    out->intermediate = c->intermediate;
    out->max_position = c->max_position;
    out->tied_embeddings = c->tie_embeddings;
    out->n_experts = c->n_experts;
    out->n_experts_used = c->n_experts_used;
    out->expert_ffn = c->expert_ffn;
    for (int l = 0; l < c->n_layers; l++) out->n_moe_layers += atlas_config_layer_moe(c, l);
}

/* The weights of this rank: every tensor looked up and checked, none read. */
static atlas_status survey_weights(const char *dir, const atlas_config *c,
                                   const atlas_model_params *p, atlas_model_survey *out,
                                   int *kv_heads) {
    atlas_shard_plan plan;
    *kv_heads = c->n_kv_heads;
    if (p->tp_size > 1) {
        atlas_shard_geom sg;
        atlas_shard_geom_from_config(c, &sg);
        ATLAS_TRY(atlas_shard_plan_make(&sg, p->tp_size, p->tp_rank, &plan));
        *kv_heads = plan.n_kv_heads;
    }
    atlas_st *st = NULL;
    ATLAS_TRY(atlas_st_open_dir(dir, &st));
    atlas_weights_sum sum;
    atlas_status s = atlas_weights_survey(st, c, p->tp_size > 1 ? &plan : NULL, &sum);
    atlas_st_free(st);
    ATLAS_TRY(s);
    out->n_params = sum.n_params;
    out->weight_bytes = sum.n_bytes;
    snprintf(out->dtype, sizeof out->dtype, "%s",
             sum.dtype == ATLAS_DTYPE_COUNT ? "mixed" : atlas_dtype_name(sum.dtype));
    /* what a load's atlas_model_info says, from the same groups */
    atlas_quant_config_str(&c->quant, out->quantization, sizeof out->quantization);
    atlas_weights_formats(sum.groups, c, out->formats, sizeof out->formats);
    out->token_weight_bytes = atlas_weights_token_bytes(sum.groups, c);
    return ATLAS_OK;
}

atlas_status atlas_model_survey_dir(const char *dir, const atlas_model_params *p,
                                    atlas_model_survey *out) {
    memset(out, 0, sizeof *out);
    if (!dir || !*dir) return atlas_fail(ATLAS_ERR_INVALID, "model inspect: no directory given");
    if (p->kv_block_size < 1 || p->tp_size < 1 || p->tp_rank < 0 || p->tp_rank >= p->tp_size)
        return atlas_fail(ATLAS_ERR_INVALID, "model inspect: kv_block_size %d, tp_rank %d, "
                          "tp_size %d", p->kv_block_size, p->tp_rank, p->tp_size);
    ATLAS_TRY(atlas_layout_check(dir)); /* a GGUF file, .bin weights, a hub id: as a load says */
    atlas_config c;
    ATLAS_TRY(atlas_config_load(dir, &c));
    c.quant.kv_fp8_on = p->kv_dtype == ATLAS_KV_DTYPE_FP8; /* the quantization string's */
    copy_config(&c, out);
    int kv_heads;
    ATLAS_TRY(survey_weights(dir, &c, p, out, &kv_heads));
    char tok[4096];
    out->has_tokenizer = atlas_path_join(tok, sizeof tok, dir, "tokenizer.json") == ATLAS_OK &&
                         atlas_file_exists(tok);
    ATLAS_TRY(pick_device(p, out));
    bool cuda = !strcmp(out->backend, "cuda");
    out->kv_block_size = p->kv_block_size;
    out->kv_blocks = atlas_model_kv_blocks_for(&c, p);
    size_t elem = atlas_model_kv_elem(cuda, p->cpu_activations, p->kv_dtype);
    out->kv_bytes = atlas_model_kv_bytes_for(&c, kv_heads, out->kv_blocks, p->kv_block_size, elem);
    out->kv_token_bytes = atlas_model_kv_bytes_for(&c, kv_heads, 1, 1, elem);
    out->needed_bytes = out->weight_bytes + out->kv_bytes;
    if (!p->no_memory_check) /* else nothing asked of the device: available_what stays "" */
        atlas_model_memory_room(cuda, p->gpu, &out->available_bytes, out->available_what,
                                sizeof out->available_what);
    out->fits = !out->available_what[0] || out->needed_bytes <= out->available_bytes;
    return ATLAS_OK;
}

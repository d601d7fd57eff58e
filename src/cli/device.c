/* cli/device.c — the --device, --kernels, --cpu-activations, --gpu-activations,
 * --kv-cache-dtype and --step-ahead options, one spelling for every subcommand, and
 * the engine of one model that `run` and `chat` make from them. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atlas/engine.h"
#include "cli/cli.h"

int atlas_cli_parse_device(const char *v, atlas_device *device, int *gpu) {
    if (!strcmp(v, "auto")) return *device = ATLAS_DEVICE_AUTO, *gpu = 0, 0;
    if (!strcmp(v, "cpu")) return *device = ATLAS_DEVICE_CPU, *gpu = 0, 0;
    if (strncmp(v, "cuda", 4)) return -1;
    if (!v[4]) return *device = ATLAS_DEVICE_CUDA, *gpu = 0, 0;
    if (v[4] != ':' || v[5] < '0' || v[5] > '9') return -1;
    char *end;
    errno = 0;
    long n = strtol(v + 5, &end, 10);
    if (errno || *end || n > 1023) return -1;
    *device = ATLAS_DEVICE_CUDA;
    *gpu = (int)n;
    return 0;
}

int atlas_cli_parse_kernels(const char *v, atlas_kernels *kernels) {
    if (!strcmp(v, "native")) return *kernels = ATLAS_KERNELS_NATIVE, 0;
    if (!strcmp(v, "portable")) return *kernels = ATLAS_KERNELS_PORTABLE, 0;
    return -1;
}

int atlas_cli_parse_cpu_activations(const char *v, atlas_cpu_activations *act) {
    if (!strcmp(v, "fp32")) return *act = ATLAS_CPU_ACT_FP32, 0;
    if (!strcmp(v, "bf16")) return *act = ATLAS_CPU_ACT_BF16, 0;
    if (!strcmp(v, "int8")) return *act = ATLAS_CPU_ACT_INT8, 0;
    if (!strcmp(v, "auto")) return *act = ATLAS_CPU_ACT_AUTO, 0;
    return -1;
}

int atlas_cli_parse_gpu_activations(const char *v, atlas_gpu_activations *act) {
    if (!strcmp(v, "fp32")) return *act = ATLAS_GPU_ACT_FP32, 0;
    if (!strcmp(v, "int8")) return *act = ATLAS_GPU_ACT_INT8, 0;
    return -1;
}

int atlas_cli_parse_step_ahead(const char *v, atlas_step_ahead *out) {
    if (!strcmp(v, "auto")) return *out = ATLAS_STEP_AHEAD_AUTO, 0;
    if (!strcmp(v, "on")) return *out = ATLAS_STEP_AHEAD_ON, 0;
    if (!strcmp(v, "off")) return *out = ATLAS_STEP_AHEAD_OFF, 0;
    return -1;
}

int atlas_cli_parse_kv_dtype(const char *cmd, const char *v, atlas_kv_dtype *out) {
    if (atlas_model_kv_dtype_parse(v, out) == ATLAS_OK) return 0;
    fprintf(stderr, "atlas %s: --kv-cache-dtype: %s\n", cmd, atlas_last_error());
    return -2;
}

atlas_engine_params atlas_cli_one_model(const atlas_engine_model *mod, const atlas_cli_device *d) {
    atlas_engine_params p = atlas_engine_default_params();
    p.models = mod;
    p.n_models = 1;
    p.parallel = 1;
    p.queue_limit = 1;
    p.ctx_size = d->ctx;
    p.device = d->device;
    p.gpu = d->gpu;
    p.kernels = d->kernels;
    p.n_threads = d->threads;
    p.cpu_activations = d->cpu_act;
    p.gpu_activations = d->gpu_act;
    p.kv_dtype = d->kv_dtype;
    p.no_memory_check = d->no_memory_check;
    return p;
}

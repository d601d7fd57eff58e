/* cli/cli.h — the subcommands of the atlas program; each lives in its own file and
 * returns the process exit status (0 ok, 1 error, 2 usage). Errors are one line on stderr. */
#ifndef ATLAS_CLI_H
#define ATLAS_CLI_H

#include "atlas/engine.h"
#include "atlas/model.h"
#include "cli/list.h"
#include "cli/options.h"

int atlas_cli_run(int argc, char **argv);      /* cli/run.c */
int atlas_cli_info(int argc, char **argv);     /* cli/info.c */
int atlas_cli_tokenize(int argc, char **argv); /* cli/tokenize.c */
int atlas_cli_template(int argc, char **argv); /* cli/template.c */
int atlas_cli_serve(int argc, char **argv);    /* cli/serve.c */
int atlas_cli_chat(int argc, char **argv);     /* cli/chat.c */
int atlas_cli_bench(int argc, char **argv);    /* cli/bench.c */
int atlas_cli_export(int argc, char **argv);   /* cli/default_model.c */

/* The model directory used when no -m is given: models/default, embedded in the binary and
 * registered in memory on the first call (cli/default_model.c). */
const char *atlas_cli_default_model(void);

/* Parses --device's value: "auto", "cpu", "cuda" or "cuda:N" (N the GPU ordinal, 0 when
 * absent). 0 on success, -1 (nothing set) on anything else (cli/device.c). */
int atlas_cli_parse_device(const char *v, atlas_device *device, int *gpu);
/* Parses --kernels' value: "native" or "portable" (include/atlas/model.h).  0 on success, -1
 * (nothing set) on anything else (cli/device.c). */
int atlas_cli_parse_kernels(const char *v, atlas_kernels *kernels);
/* Parses --cpu-activations' value: "auto", "fp32", "bf16" or "int8" (include/atlas/model.h).
 * 0 on success, -1 (nothing set) on anything else (cli/device.c). */
int atlas_cli_parse_cpu_activations(const char *v, atlas_cpu_activations *act);
/* Parses --gpu-activations' value: "fp32" or "int8" (include/atlas/model.h).  0 on success,
 * -1 (nothing set) on anything else (cli/device.c). */
int atlas_cli_parse_gpu_activations(const char *v, atlas_gpu_activations *act);
/* Parses --step-ahead's value: "auto", "on" or "off" (include/atlas/engine.h).  0 on
 * success, -1 (nothing set) on anything else (cli/device.c). */
int atlas_cli_parse_step_ahead(const char *v, atlas_step_ahead *out);
/* Parses --kv-cache-dtype's value (atlas_model_kv_dtype_parse: auto, bf16, fp8, fp8_e4m3):
 * 0 on success; else one line "atlas CMD: --kv-cache-dtype: MESSAGE" on stderr and -2
 * (cli/device.c). */
int atlas_cli_parse_kv_dtype(const char *cmd, const char *v, atlas_kv_dtype *out);
/* Its lines in `run --help`, `serve --help` and `bench`'s usage. */
#define ATLAS_CLI_KV_DTYPE_HELP                                                                \
    "  --kv-cache-dtype auto|bf16|fp8  the KV cache's elements (vLLM's flag; fp8_e4m3 is\n"   \
    "                       fp8): fp8 stores e4m3 with the checkpoint's k_scale / v_scale\n"  \
    "                       (else 1.0), twice the tokens of bf16 in the same memory\n"        \
    "                       (default auto: bf16 on a GPU; on the CPU fp32, or bf16 with\n"   \
    "                       --cpu-activations bf16 or int8)\n"

/* Its lines in `run --help` and `serve --help`. */
#define ATLAS_CLI_CPU_ACT_HELP                                                                 \
    "  --cpu-activations auto|fp32|bf16|int8  what the CPU multiplies weights with\n"        \
    "                       (fp32: exact, the reference; bf16: rounded as a GPU does for\n"      \
    "                       bf16 weights, AVX512_BF16 dot products where the CPU has\n"          \
    "                       them, about 2x the prefill; int8: that where the CPU has\n"          \
    "                       them, and INT4 weights times int8 activations as llama.cpp\n"       \
    "                       takes them, 2x the INT4 prefill and decode; both keep the KV\n"     \
    "                       cache in bf16; default auto: int8 where the CPU has bf16 or\n"      \
    "                       integer dot products (AVX2, VNNI, sdot), else fp32)\n"

/* Its lines in `run --help`, `serve --help` and `bench`'s usage. */
#define ATLAS_CLI_GPU_ACT_HELP                                                                 \
    "  --gpu-activations fp32|int8  what a GPU's one-row INT4 matmuls (decode) multiply\n"    \
    "                       weights with (int8: activations in int8 blocks of 32 as\n"        \
    "                       llama.cpp takes them on CUDA, about 1.07x the INT4 decode;\n"      \
    "                       default fp32, as exact as the CPU reference)\n"

/* Where a command that runs one model in process runs it (--device, --kernels, --threads,
 * --ctx-size). */
typedef struct atlas_cli_device {
    atlas_device device;
    int gpu; /* the ordinal of --device cuda:N */
    atlas_kernels kernels;
    atlas_cpu_activations cpu_act; /* --cpu-activations */
    atlas_gpu_activations gpu_act; /* --gpu-activations */
    atlas_kv_dtype kv_dtype;       /* --kv-cache-dtype */
    int threads, ctx;
    int no_memory_check; /* --no-memory-check */
} atlas_cli_device;

/* An engine's params for the one model `mod` (which must outlive them): one sequence at a
 * time, on d's device (cli/device.c). */
atlas_engine_params atlas_cli_one_model(const atlas_engine_model *mod, const atlas_cli_device *d);

/* A sampling seed from the OS's random source (getrandom), for a run or an answer that was
 * given none: each one samples differently, as llama.cpp and Ollama do (cli/seed.c). */
uint64_t atlas_cli_random_seed(void);

/* Checks dir before anything loads it (atlas_model_check_layout: a GGUF file, .bin weights,
 * a hub id or a cache entry, named with dir as the user gave it): 0 when it looks like a
 * model, else 1 after one line "atlas CMD: MESSAGE" on stderr (cli/hints.c). */
int atlas_cli_check_model(const char *cmd, const char *dir);
/* The model's name in messages and in its engine: dir's last component ("kjv" for
 * ~/models/kjv/), never a name of the command's own. */
void atlas_cli_model_name(const char *dir, char *buf, size_t cap);
/* After a failed load: with --device cuda where CUDA could not be used, one line on stderr
 * that offers --device cpu; otherwise nothing. */
void atlas_cli_device_hint(const char *cmd, atlas_device device);

#endif

/* atlas/model.h — loading a Hugging Face model directory and reaching it through counted
 * handles.
 *
 * Lifetime: atlas_model_load returns the owner's handle (count 1). Anyone else who keeps the
 * model takes another handle with atlas_model_ref and drops it with atlas_model_unref. The
 * owner ends the model with atlas_model_release, which refuses (ATLAS_ERR_BUSY, nothing
 * unloaded) while other handles are live, so a forgotten reference is a named error instead
 * of a use-after-free after the next model loads. The engine builds on this: each running
 * request holds a handle, and a refused release is how it knows to drain the model first
 * (atlas/engine.h, "Releasing a model").
 *
 * The forward pass is internal (src/model/forward.h): the engine drives it.
 *
 * Threads: loading, the handle calls (the count is atomic) and the getters (a loaded model
 * does not change) may be called from any thread; atlas_model_release from the owner's
 * thread, once the owner itself no longer uses the model.  Ownership: what a getter returns
 * (strings, the tokenizer, the eos ids) belongs to the model and is valid while it is
 * loaded; arguments are borrowed for the call (load copies what it keeps of dir and p). */
#ifndef ATLAS_MODEL_H
#define ATLAS_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "atlas/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct atlas_model atlas_model;
typedef struct atlas_tokenizer atlas_tokenizer; /* include/atlas/tokenizer.h */

typedef enum atlas_device {
    ATLAS_DEVICE_AUTO = 0, /* CUDA when it can be used, else the CPU (the reason is kept) */
    ATLAS_DEVICE_CPU,
    ATLAS_DEVICE_CUDA,     /* fails when CUDA cannot be used */
} atlas_device;

/* Which GPU code a model runs (`--kernels`). */
typedef enum atlas_kernels {
    ATLAS_KERNELS_NATIVE = 0, /* the machine code built for the GPU (or the PTX for later ones) */
    ATLAS_KERNELS_PORTABLE,   /* compute_80 PTX compiled by the driver at load, with an RTX
                                 card's (sm_86's) kernel choices and shared memory: how the
                                 kernels run on Ampere and Ada, reproduced on a newer GPU */
} atlas_kernels;

/* What the CPU multiplies weights with (`--cpu-activations`). */
typedef enum atlas_cpu_activations {
    ATLAS_CPU_ACT_FP32 = 0, /* fp32 activations, every product exact: the reference */
    ATLAS_CPU_ACT_BF16,     /* activations a bf16 weight multiplies rounded to bf16 first, as a
                               GPU's tensor cores and llama.cpp take them: AVX512_BF16 dot
                               products where the CPU has them (about twice the prefill rate),
                               logits within the GPU's tolerance of the reference; other weight
                               formats are unchanged; the KV cache in bf16, as on a GPU */
    ATLAS_CPU_ACT_INT8,     /* BF16's where the CPU has bf16 dot products (elsewhere a bf16
                               weight's activations stay fp32: rounding them gains nothing
                               there; the KV cache is bf16 either way), and the activations an
                               INT4 weight multiplies quantized to int8 in blocks of 32
                               (llama.cpp's scheme for its 4-bit formats) for integer dot
                               products (AVX512-VNNI, AVX2, aarch64's sdot): about twice the
                               INT4 decode rate */
    ATLAS_CPU_ACT_AUTO,     /* INT8's where the CPU has bf16 or integer dot products (every
                               x86-64 CPU the release builds for, aarch64 with sdot), as
                               llama.cpp computes, else FP32; the command line's default */
} atlas_cpu_activations;

/* What a GPU's one-row INT4 matmuls (decode's GEMVs) multiply weights with
 * (`--gpu-activations`). */
typedef enum atlas_gpu_activations {
    ATLAS_GPU_ACT_FP32 = 0, /* fp32 activations, the products as exact as the CPU reference's */
    ATLAS_GPU_ACT_INT8,     /* an INT4 weight's activations quantized to int8 in blocks of 32
                               (llama.cpp's scheme for its 4-bit formats on CUDA), integer dot
                               products (dp4a): about 7% more decode on an 8B GPTQ (H100,
                               bench/RESULTS.md); other formats and the tensor-core paths of
                               two rows and more are unchanged */
} atlas_gpu_activations;

/* The KV cache's element type (`--kv-cache-dtype`, vLLM's flag and values). */
typedef enum atlas_kv_dtype {
    ATLAS_KV_DTYPE_AUTO = 0, /* the backend's: bf16 on a GPU; on the CPU fp32, or bf16 with
                                bf16 or int8 activations */
    ATLAS_KV_DTYPE_BF16,     /* bf16 on every backend (the CPU too, whatever its activations) */
    ATLAS_KV_DTYPE_FP8,      /* FP8 e4m3, one byte an element: twice the tokens of bf16 in
                                the same memory. As vLLM: K (after RoPE) and V are stored as
                                e4m3(x / scale), ties to even, saturating at +-448, and read as
                                code * scale, with each layer's scales the checkpoint's
                                self_attn.k_scale / v_scale where it has them, else 1.0. Both
                                backends have it (a backend without it refuses it at load
                                with ATLAS_ERR_UNSUPPORTED, before reading a weight) */
} atlas_kv_dtype;

/* A load's progress: bytes of the weights read so far, and the bytes it reads in all. */
typedef void (*atlas_load_progress_fn)(void *user, uint64_t done, uint64_t total);

typedef struct atlas_model_params {
    atlas_device device;
    int n_threads;        /* CPU worker threads; 0: one per core */
    int kv_blocks;        /* blocks of the paged KV cache; 0: enough for kv_tokens */
    int kv_block_size;    /* tokens per block (default 16) */
    int kv_tokens;        /* when kv_blocks is 0: cache this many tokens (default: min(max
                             position, 4096)) */
    int max_batch_tokens; /* most tokens one forward may carry (default 512) */
    int mlp_chunk_tokens; /* most rows the MLP computes at once (default 2048): its [rows, 3 x
                             intermediate] activations are the largest buffers of a forward,
                             so this bounds the workspace whatever max_batch_tokens is (on a
                             GPU a quantized MLP's weights are dequantized once a chunk) */
    int load_tokenizer;   /* 1 (default): load DIR/tokenizer.json; 0: skip it */
    int tp_rank;          /* tensor parallelism: this process's rank, 0..tp_size-1 (default 0) */
    int tp_size;          /* ranks the model is split across (default 1: the whole model).
                             Above 1 the model holds only its rank's shard, and every forward
                             needs the all-reduce the caller provides (docs/TENSOR_PARALLEL.md) */
    int gpu;              /* the GPU ordinal (default 0). A process serves one GPU: the first
                             model on CUDA binds it, and one that names another ordinal later
                             fails with ATLAS_ERR_INVALID (include/atlas/host.h) */
    atlas_kernels kernels; /* the GPU code (default native); the CPU ignores it */
    /* Optional (NULL, default: none): told of the bytes read as the weights load, many times
     * a second on a large model, and once more with done == total when they are all in
     * place (not after a failure). Called from the thread that reads them (the loading
     * thread on the CPU; on CUDA the host's loader threads), never two calls at once; it
     * must return quickly and not call into the model. */
    atlas_load_progress_fn progress;
    void *progress_user;  /* progress's first argument */
    /* 0 (default): before any weight is read, the memory the weights and the KV cache need
     * on the chosen backend is checked against what it has (CUDA: the GPU's free memory;
     * CPU: MemAvailable, or the cgroup's memory limit when that leaves less), and a load that
     * needs more fails with ATLAS_ERR_NOMEM (CPU) or ATLAS_ERR_DEVICE_NOMEM (CUDA) naming
     * both figures.  1: load anyway (`--no-memory-check`). */
    int no_memory_check;
    atlas_cpu_activations cpu_activations; /* the CPU's bf16 matmuls (default fp32); other
                                              backends ignore it */
    atlas_gpu_activations gpu_activations; /* a GPU's one-row INT4 matmuls (default fp32);
                                              the CPU ignores it */
    atlas_kv_dtype kv_dtype; /* the KV cache's element type (default auto: the backend's) */
    /* Bytes of pinned host memory the process keeps released models' weights in, as they lie
     * on the GPU, so that the next load of the same files copies them back and reads no file
     * (0, default: none).  The store is the process's, least recently used out: give every
     * load of the process the same value (the engine does).  CUDA only, and not on a GPU
     * that shares the host's memory (atlas_model_info.host_tier says why). */
    size_t host_cache;
} atlas_model_params;

/* text as a KV cache type: "auto", "bf16", "fp8" or its alias "fp8_e4m3" (vLLM's names).
 * ATLAS_ERR_INVALID for anything else, with a message naming the value and the accepted ones
 * (vLLM's "fp8_e5m2" included: atlas has no e5m2 cache).  Pure; any thread. */
ATLAS_API atlas_status atlas_model_kv_dtype_parse(const char *text, atlas_kv_dtype *out);
/* "auto", "bf16", "fp8" (the canonical name; "?" for a value not of the enum).  Pure. */
ATLAS_API const char *atlas_model_kv_dtype_name(atlas_kv_dtype t);

/* The defaults above.  Pure; any thread. */
ATLAS_API atlas_model_params atlas_model_default_params(void);

/* Loads DIR (config.json, safetensors, tokenizer.json, generation_config.json) onto the
 * backend p asks for (NULL: defaults). On success *out is the owner's handle (count 1). */
ATLAS_API atlas_status atlas_model_load(const char *dir, const atlas_model_params *p,
                                        atlas_model **out);

/* Whether dir is a model directory that atlas_model_load can read (config.json, and
 * model.safetensors or model.safetensors.index.json), looking at file names and at most a
 * file's first bytes, never the weights.  ATLAS_OK, or: ATLAS_ERR_UNSUPPORTED for a model in
 * a form atlas does not read (a GGUF file or a directory of them, PyTorch .bin weights, a
 * Hugging Face cache entry models--ORG--NAME, a directory of model directories), with a
 * message naming the path and what to give instead (the cache entry's snapshots/<revision>,
 * the `huggingface-cli download` command); ATLAS_ERR_IO for a path that holds no model (no
 * such directory, a file, no config.json; a name that looks like a hub id ORG/NAME is told
 * how to download it); ATLAS_ERR_NOT_FOUND for config.json without safetensors weights.
 * Loads check this first.  Any thread; owns nothing. */
ATLAS_API atlas_status atlas_model_check_layout(const char *dir);

/* The model serves: work its load left for later starts now, beside serving, so that it
 * delays neither the load nor the first answer.  On CUDA with atlas_model_params.host_cache,
 * the fill of the host tier's image of the weights (pinning host memory holds the driver's
 * other calls for up to about 21 ms, a 32 MiB chunk, while it runs); a model that never calls it keeps
 * no image.  Once, after atlas_model_load returned, from the owner's thread (the engine calls
 * it after the model's LOADED event); a second call does nothing. */
ATLAS_API void atlas_model_start_tier_fill(atlas_model *m);

/* Another handle on m (returns m). */
ATLAS_API atlas_model *atlas_model_ref(atlas_model *m);
/* Drops a handle taken with atlas_model_ref. NULL does nothing. */
ATLAS_API void atlas_model_unref(atlas_model *m);
/* Live handles, the owner's included. */
ATLAS_API int atlas_model_handles(const atlas_model *m);

/* The owner's end of the model. With other handles live: ATLAS_ERR_BUSY, the message gives
 * their number, and nothing is unloaded (the owner's handle stays valid). Otherwise frees
 * everything, going on past each failure, and m is gone either way: ATLAS_OK, or the first
 * failure's status (on CUDA ATLAS_ERR_DEVICE; never ATLAS_ERR_BUSY) with a message that
 * counts and lists every failure, e.g. "releasing model DIR (it is unloaded all the same):
 * freeing its memory: registry release (7 allocation(s), 10 module(s)): 2 failure(s):
 * cuMemFree 'kv cache' (268435456 bytes): CUDA_ERROR_ILLEGAL_ADDRESS (registry.c:260);
 * cuModuleUnload 'gemm': ..." (bounded: "; and N more").  NULL returns ATLAS_OK. */
ATLAS_API atlas_status atlas_model_release(atlas_model *m);

/* When each step of a load ended, in milliseconds of CLOCK_MONOTONIC (clock_gettime's clock;
 * 0: the load had no such step), for a start-up's log. */
typedef struct atlas_model_load_times {
    double begin;     /* atlas_model_load was called */
    double config;    /* config.json read */
    double files;     /* the checkpoint's files opened and their headers read */
    double backend;   /* the backend made: on CUDA the host bound, the kernel modules loaded,
                         cuBLASLt's handle made */
    double weights;   /* every weight read from its file (or the host tier) and on the backend:
                         the uploads waited for */
    double kv;        /* the KV cache allocated */
    double tokenizer; /* tokenizer.json parsed beside the weights (0: not loaded with the model,
                         as in the engine, which keeps its own) */
    double end;       /* the model ready */
    double repack_ms; /* of the weights step, the milliseconds spent on the host reading
                         quantized weights and repacking them into the backend's formats (0:
                         none stored so; a GPU repacks GPTQ's and AWQ's itself, within the
                         weights step, and only their g_idx counts here) */
} atlas_model_load_times;

/* What `atlas info` prints. Strings are owned by the model. */
typedef struct atlas_model_info {
    const char *dir;
    const char *architecture;  /* config.json's "architectures"[0], e.g. "LlamaForCausalLM" */
    int vocab_size;
    int hidden;
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int intermediate;
    int max_position;
    int tied_embeddings;
    int64_t n_params;          /* elements of every tensor used (tied: counted once) */
    const char *dtype;         /* of the weights in the files: "BF16", "F16", "F32", "mixed" */
    const char *backend;       /* "cpu", "cuda" */
    const char *backend_why;   /* why this backend, e.g. the reason CUDA could not be used */
    const char *kernels;       /* the GPU code and kernel choices ("" on the CPU) */
    size_t weight_bytes;       /* tensor bytes in the files */
    size_t kv_bytes;           /* the KV cache as allocated */
    int kv_blocks;
    int kv_block_size;
    int max_batch_tokens;
    int n_threads;             /* CPU backend workers (0 on other backends) */
    const char *quantization;  /* config.json's quantization_config, e.g. "awq (INT4, group
                                  128)"; "none" */
    const char *formats;       /* each weight group's format and bytes, e.g. "embedding BF16
                                  1.0 MiB; attention FP8 e4m3 block 128x128 2.1 MiB; ..." */
    size_t token_weight_bytes; /* the weight bytes a decode token reads: every layer's packed
                                  weights with their scales, zero points and indices (norms
                                  too), the lm_head as stored, one embedding row */
    size_t kv_token_bytes;     /* and the KV it reads per token of its context (all layers) */
    const char *kv_dtype;      /* the KV cache's elements: "f32", "bf16" or "fp8" (e4m3) */
    const char *kv_scales;     /* what became of an FP8 KV cache's scales: those of the
                                  checkpoint used, unused (a cache not FP8), or 1.0; "" for a
                                  cache not FP8 with a checkpoint that has none */
    const char *load_source;   /* where the last load read the weights from: "host" (the host
                                  tier, atlas_model_params.host_cache: no file read),
                                  "page_cache" (every page of the files asked about was
                                  cached before the load: one each 2 MiB) or "disk" */
    size_t load_cached_bytes;  /* bytes of the weights' files found in the page cache before
                                  the load read them, estimated from those pages (all of
                                  them for "host") */
    const char *host_tier;     /* why this load kept no copy in the host tier ("" when it did
                                  or none was asked for), e.g. on an integrated GPU */
    atlas_model_load_times times; /* its load's steps */
    int queue_overlaps;        /* 1: atlas_model_forward_argmax_queue returns before the step
                                  is computed (the device reduces it), so a step queued ahead
                                  overlaps the host's work; 0: it computes the step then and
                                  there, and queuing ahead only delays the step before's ids */
} atlas_model_info;

/* Fills *info; valid while m is. */
ATLAS_API void atlas_model_get_info(const atlas_model *m, atlas_model_info *info);

/* What loading a directory with given params would take, found from its headers alone:
 * config.json (and generation_config.json), the safetensors headers (every tensor the
 * architecture calls for looked up, its shape and dtype checked, as a load does, with the
 * same errors) and whether tokenizer.json is there.  No tensor data is read, so it takes
 * milliseconds whatever the checkpoint's size. */
typedef struct atlas_model_survey {
    char architecture[64];      /* config.json's "architectures"[0] */
    int vocab_size, hidden, n_layers, n_heads, n_kv_heads, head_dim, intermediate;
    int max_position;
    int tied_embeddings;
    /* a mixture-of-experts model (0 experts: dense): n_experts of expert_ffn columns in each
     * of its n_moe_layers MoE layers, n_experts_used a token (token_weight_bytes counts
     * those); intermediate is the dense layers' */
    int n_experts, n_experts_used, expert_ffn, n_moe_layers;
    int has_tokenizer;          /* 1: tokenizer.json is there */
    int64_t n_params;           /* elements of every tensor used (tied: counted once) */
    char dtype[8];              /* of the big matrices: "BF16", "F16", "F32", "mixed" */
    size_t weight_bytes;        /* tensor bytes the load reads (and keeps): quantized
                                   weights as stored, with their scales, zeros, indices */
    char quantization[96];      /* as atlas_model_info.quantization */
    char formats[480];          /* as atlas_model_info.formats */
    size_t token_weight_bytes;  /* as atlas_model_info.token_weight_bytes */
    size_t kv_token_bytes;      /* as atlas_model_info.kv_token_bytes, on that backend */
    char backend[8];            /* "cpu" or "cuda": where the params' device would load it */
    char backend_why[256];      /* why that backend (the reason CUDA cannot be used) */
    int kv_blocks, kv_block_size;
    size_t kv_bytes;            /* the KV cache at the params' settings on that backend */
    size_t needed_bytes;        /* weights + KV cache */
    size_t available_bytes;     /* what the backend has now (0: not known; not asked with
                                   atlas_model_params.no_memory_check) */
    char available_what[200];   /* where that figure comes from, e.g. "MemAvailable
                                   (/proc/meminfo)" or "free memory of cuda:0" */
    int fits;                   /* 1: needed <= available (or available not known) */
} atlas_model_survey;

/* Fills *out for dir and p (NULL: defaults).  Errors are a load's (ATLAS_ERR_IO for a
 * missing file, ATLAS_ERR_FORMAT, ATLAS_ERR_UNSUPPORTED for an architecture or dtype atlas
 * does not run, ATLAS_ERR_NO_DEVICE for device CUDA without one), naming the file; a model
 * that does not fit is not an error here (fits says so).  Any thread; owns nothing. */
ATLAS_API atlas_status atlas_model_inspect(const char *dir, const atlas_model_params *p,
                                           atlas_model_survey *out);

/* The model's tokenizer, NULL when loaded with load_tokenizer = 0. Valid while m is. */
ATLAS_API const atlas_tokenizer *atlas_model_tokenizer(const atlas_model *m);

/* End-of-sequence ids: the union of config.json, generation_config.json and the tokenizer's
 * eos token. Returns their count; *ids stays valid while m is. */
ATLAS_API int atlas_model_eos(const atlas_model *m, const int32_t **ids);
/* 1 when id is one of them. */
ATLAS_API int atlas_model_is_eos(const atlas_model *m, int32_t id);

ATLAS_API int atlas_model_vocab_size(const atlas_model *m);

/* Geometry of the paged KV cache, for whoever hands out its blocks. */
ATLAS_API int atlas_model_kv_blocks(const atlas_model *m);
ATLAS_API int atlas_model_kv_block_size(const atlas_model *m);
ATLAS_API int atlas_model_max_batch_tokens(const atlas_model *m);

/* What a model directory's generation_config.json asks of sampling, read without loading
 * the model: 0 in a field it does not set, and set says which fields it names (ATLAS_GEN_*
 * bits), since a default of 0 (greedy temperature) differs from none. Thread-safe; owns
 * nothing. */
enum {
    ATLAS_GEN_TEMPERATURE = 1u << 0,
    ATLAS_GEN_TOP_P = 1u << 1,
    ATLAS_GEN_TOP_K = 1u << 2,
    ATLAS_GEN_MIN_P = 1u << 3,
    ATLAS_GEN_REPETITION_PENALTY = 1u << 4,
    ATLAS_GEN_MAX_NEW_TOKENS = 1u << 5,
};
typedef struct atlas_generation_defaults {
    float temperature;
    float top_p;
    int top_k;
    float min_p;
    float repetition_penalty;
    unsigned set;
    int max_new_tokens; /* the default max_tokens of a request that sets none */
} atlas_generation_defaults;
ATLAS_API atlas_status atlas_model_generation_defaults(const char *dir,
                                                       atlas_generation_defaults *out);

#ifdef __cplusplus
}
#endif
#endif

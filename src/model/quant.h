/* model/quant.h — quantized checkpoints: config.json's `quantization_config`, and the tensors
 * of each quantized linear layer turned into a weight format of the backend's
 * (backend/backend.h atlas_wquant).  Internal.
 *
 * Read, each as its published layout says:
 * - `quant_method: fp8` (Qwen3-*-FP8, DeepSeek): e4m3 `weight` [out, in] and, with
 *   `weight_block_size` [br, bc], float `weight_scale_inv` [ceil(out/br), ceil(in/bc)] that
 *   multiplies (despite its name); without a block size, one float `weight_scale` a tensor.
 * - `compressed-tensors`, format `float-quantized`: e4m3 `weight` and `weight_scale`, strategy
 *   tensor ([] or [1]), channel ([out, 1]) or block ([ceil(out/br), ceil(in/bc)]).
 * - `awq` version gemm: int32 `qweight` [in, out/8] and `qzeros` [in/g, out/8], eight 4-bit
 *   values a word in AWQ's interleaved order (column 8j + [0,2,4,6,1,3,5,7][i] in nibble i),
 *   float16 `scales` [in/g, out]; w = (q - z) * s.
 * - `gptq` 4-bit: int32 `qweight` [in/8, out] (input row 8i + k in nibble k), `qzeros`
 *   [groups, out/8] (column 8j + k in nibble k; checkpoint_format gptq stores zero - 1,
 *   gptq_v2 the zero), float16 `scales` [groups, out], int32 `g_idx` [in] (desc_act: any
 *   order; otherwise it must be i / group, and may be absent); w = (q - z) * s.
 * - `mxfp4` (gpt-oss's naming of a parameter P as P_blocks / P_scales, here P = weight):
 *   uint8 `weight_blocks` [out, in/32, 16] (two e2m1 codes a byte, the even column in the low
 *   nibble) and uint8 e8m0 `weight_scales` [out, in/32]; w = e2m1 * 2^(scale - 127).
 * - NVFP4, ModelOpt (`modelopt`, quant_algo NVFP4): uint8 `weight` [out, in/2] (packed as
 *   above), e4m3 `weight_scale` [out, in/16], float32 `weight_scale_2` that multiplies:
 *   w = e2m1 * (e4m3(scale) * weight_scale_2); compressed-tensors `nvfp4-pack-quantized`:
 *   `weight_packed`, `weight_scale` and a float32 `weight_global_scale` that divides:
 *   w = e2m1 * (e4m3(scale) / weight_global_scale). Both are W4A4 as published: the CPU runs
 *   them weight-only (the activations' `input_scale` / `input_global_scale` are not applied).
 * - ModelOpt FP8 (`modelopt`, quant_algo FP8, in quantization_config or in the
 *   hf_quant_config.json beside config.json): e4m3 `weight` [out, in], float32 `weight_scale`
 *   [] that multiplies, float32 `input_scale` [] (static activations).
 * - compressed-tensors `pack-quantized`, 4-bit integers (W4A16), strategy group or channel:
 *   int32 `weight_packed` [out, ceil(in/8)] (column 8j + k in nibble k), `weight_scale`
 *   [out, groups], int `weight_shape` [2]; with zero points (symmetric false) int32
 *   `weight_zero_point` [ceil(out/8), groups] (row 8i + k in nibble k); every nibble holds
 *   the signed value plus 8, so w = (q - z) * s on the nibbles, z = 8 when symmetric;
 *   actorder group adds int32 `weight_g_idx` [in].
 * INT4 layouts are repacked at load into the one internal layout of ATLAS_WFMT_INT4 (GPTQ's
 * and AWQ's by the backend on its device when it says int4_stored); FP4
 * codes are kept as stored, their scales turned into float32.
 * Refused by name: 8-bit GPTQ and 8-bit integer weights of any method (W8A8, W8A16): they
 * would need a weight format of their own, and FP8 serves eight bits a weight.
 * Weights are quantized, activations are not: every format runs weight-only (activations in
 * the compute type). A checkpoint that asks for static activation scales (W8A8 FP8, W4A4
 * NVFP4) has them checked and left unused, and atlas_quant_config_str says "weight-only";
 * one that asks for an FP8 KV cache keeps its KV in the compute type and says "KV cache
 * unquantized" (its k_scale / v_scale are left unused) unless the load's cache is FP8
 * (--kv-cache-dtype fp8, kv_fp8_on): then "FP8 KV cache", with those scales. */
#ifndef ATLAS_MODEL_QUANT_H
#define ATLAS_MODEL_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "atlas/status.h"
#include "backend/backend.h"
#include "core/threadpool.h"
#include "format/safetensors.h"

typedef enum atlas_qmethod {
    ATLAS_QM_NONE = 0,
    ATLAS_QM_FP8,    /* quant_method fp8 */
    ATLAS_QM_CT_FP8, /* compressed-tensors float-quantized */
    ATLAS_QM_AWQ,
    ATLAS_QM_GPTQ,
    ATLAS_QM_MXFP4,    /* quant_method mxfp4 (gpt-oss) */
    ATLAS_QM_NVFP4,    /* quant_method modelopt, quant_algo NVFP4 */
    ATLAS_QM_CT_NVFP4, /* compressed-tensors nvfp4-pack-quantized */
    ATLAS_QM_FBGEMM_FP8, /* quant_method fbgemm_fp8: FP8 e4m3 per channel */
    ATLAS_QM_MODELOPT_FP8, /* quant_method modelopt, quant_algo FP8: e4m3 per tensor */
    ATLAS_QM_CT_INT4,      /* compressed-tensors pack-quantized: 4-bit integers */
} atlas_qmethod;

typedef enum atlas_qstrategy { ATLAS_QS_TENSOR, ATLAS_QS_CHANNEL, ATLAS_QS_BLOCK } atlas_qstrategy;

enum { ATLAS_QUANT_MAX_IGNORE = 64 };

typedef struct atlas_quant_config {
    atlas_qmethod method;
    atlas_qstrategy strategy; /* FP8 */
    int block[2];             /* FP8 block: rows, columns */
    int group;                /* AWQ / GPTQ: input columns a group; 0: the whole row (-1) */
    bool gptq_v2;             /* GPTQ zeros stored as they are (not minus one) */
    bool desc_act;            /* GPTQ act-order: g_idx permutes the groups */
    bool symmetric;           /* compressed-tensors INT4: no zero points stored (zero 8) */
    /* what the checkpoint asks for that atlas does not apply, said by atlas_quant_config_str:
     * static activation scales (W8A8, W4A4: the matmul runs weight-only, activations in the
     * compute type) and an FP8 KV cache (the KV stays in the compute type) */
    bool static_act;
    bool kv_fp8;
    bool kv_fp8_on;           /* not the checkpoint's: the load's cache is FP8 (--kv-cache-dtype
                                 fp8), so an FP8 KV cache asked for is said applied */
    /* ignore / modules_to_not_convert / ignored_layers: "re:" entries are POSIX extended
     * regular expressions matched against the whole module name; others match as a part
     * of it (transformers' rule) */
    int n_ignore;
    char ignore[ATLAS_QUANT_MAX_IGNORE][128];
} atlas_quant_config;

/* Reads quantization_config (q NULL or JSON null: none) of config file `file`; a method,
 * version or option atlas does not read is refused naming it and what is supported. q is a
 * json_t (kept opaque here so that this header needs no jansson). */
atlas_status atlas_quant_config_parse(const char *file, const void *q, atlas_quant_config *out);

/* Reads hf_quant_config.json (root, a json_t), which a ModelOpt export writes beside a
 * config.json without quantization_config: {"producer": {"name": "modelopt", ...},
 * "quantization": {"quant_algo": ..., "kv_cache_quant_algo": ..., "exclude_modules": [...]}}. */
atlas_status atlas_quant_config_parse_hf(const char *file, const void *root,
                                         atlas_quant_config *out);

/* "fp8 (block 128x128)", "awq (INT4, group 128)", ...; "none". Into buf[cap]. */
const char *atlas_quant_config_str(const atlas_quant_config *qc, char *buf, size_t cap);

/* One linear layer's weight as the backend's weight_load takes it. */
typedef struct atlas_qweight {
    bool quantized;  /* false: the module's `weight` is dense; nothing else is set */
    atlas_wquant q;
    const atlas_tensor_view *codes; /* FP8: the e4m3 weight, read through its source; INT4
                                       kept as stored: the qweight; compressed-tensors' INT4
                                       of whole words a row: weight_packed (packed NULL) */
    void *packed;    /* INT4: [rows, cols/2] repacked (owned) */
    size_t packed_bytes;
    float *scales, *zeros; /* owned, the grid of q */
    int32_t *g_idx;        /* owned or NULL */
    int64_t rows, cols;
    size_t file_bytes;     /* bytes of every tensor it came from */
    bool act_order;        /* desc_act with a g_idx (known from the headers) */
    /* INT4 kept as stored (atlas_quant_bind's int4_stored; q.order GPTQ or AWQ): codes is the
     * qweight, these the scales and qzeros, and stored_src their sources, which the caller
     * makes (q.stored_scales / stored_zeros point at them); packed, scales, zeros NULL */
    const atlas_tensor_view *stored_scales, *stored_zeros;
    atlas_weight_src stored_src[2];
} atlas_qweight;

/* Whether `module` (e.g. "model.layers.0.mlp.down_proj") is stored quantized, with the shape
 * [rows, cols] and the tensors its method asks for (checked, not read), and whether that
 * agrees with the ignore list. used (may be NULL) gets each tensor's atlas_st_index set.
 * With read: reads and converts them into *out (free with atlas_qweight_free), the reads
 * and repacks split over pool's threads (NULL: the caller's thread alone); with int4_stored
 * too (a backend's int4_stored), GPTQ's and AWQ's codes and grids are left as stored for
 * the backend to repack, and only a g_idx is read. */
atlas_status atlas_quant_bind(const atlas_st *st, const atlas_quant_config *qc,
                              const char *module, int64_t rows, int64_t cols, bool read,
                              bool int4_stored, bool *used, atlas_threadpool *pool,
                              atlas_qweight *out);
/* Makes the n parts of one fused weight (q|k|v, gate|up) share one scale layout where they
 * can, exactly: per-tensor FP8 scales become per-channel. Block scales stay per part; the
 * parts concatenate into one matrix only when each part's rows are a multiple of the block
 * (atlas_quant_concatenable); otherwise a backend keeps the parts apart (the CPU always
 * does). */
atlas_status atlas_quant_fuse(atlas_qweight *parts, int n);
bool atlas_quant_concatenable(const atlas_qweight *parts, int n);
void atlas_qweight_free(atlas_qweight *w);

#endif

/* backend/cpu/cpu.h — the CPU backend's shared state and kernels.  Internal to backend/cpu.
 *
 * Weights are kept as the checkpoint stores them (bf16/f16/f32, or packed FP8/INT4 with their
 * scales) and are converted to fp32 a tile of rows at a time while multiplying; activations
 * are fp32, the paged KV cache fp32, bf16 or FP8 e4m3 (atlas_backend.kv_size). */
#ifndef ATLAS_BACKEND_CPU_H
#define ATLAS_BACKEND_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/threadpool.h"

/* CPU_MAX_PARTS: sources of one weight (a stacked MoE layer's experts: 2 a expert for
 * gate|up); CPU_ROWS: weight rows per matmul tile */
enum { CPU_MAX_PARTS = 4096, CPU_ROWS = 4 };

/* One view of a (fused) weight: rows [row0, row0 + rows) of the fused matrix. */
typedef struct cpu_part {
    const void *data; /* [rows, cols] in dtype (or packed as quant says): copy's bytes */
    void *copy;       /* owned: the weight's bytes, read at load (never the checkpoint's mapping) */
    atlas_dtype dtype;
    int64_t row0, rows;
    /* quant.format ATLAS_WFMT_DENSE: dtype says. Otherwise its scales, zeros and g_idx
     * point into owned (one allocation, freed with the weight). */
    atlas_wquant quant;
    void *owned;
    size_t mapped;    /* copy's mapping length (weight_bytes); 0: copy is malloc'd */
} cpu_part;

struct atlas_weight {
    int n_dims;      /* 1 or 2 */
    int64_t rows;    /* 2-D: fused rows (out); 1-D: 1 */
    int64_t cols;    /* 2-D: in; 1-D: the length */
    int n_parts;
    cpu_part *parts; /* [n_parts], owned (a view's: its weight's) */
    float *vec;      /* 1-D weights: fp32 copy [cols] (small: norms, biases) */
};

/* Block by block: a block holds its tokens of every layer, so a sequence's cache is a run
 * of whole blocks that huge pages cover with at most one partly used page (laid out layer by
 * layer, each layer's first tokens would take a huge page of their own). Within a layer's
 * share, head by head: attention reads one kv head's keys in order, and they are then one
 * run of block_size rows, where rows of all heads token by token put each key in a page of
 * its own, which the hardware prefetchers do not follow. */
struct atlas_kv {
    int n_blocks, block_size, n_layers;
    int bf16;            /* elements bf16 (the bf16 and int8 activation modes), else fp32 */
    int fp8;             /* elements FP8 e4m3 codes of x / scale (kv_size 1), else as bf16 says */
    float *scales;       /* fp8: [2 * n_layers], layer l's K scale at 2l, V at 2l + 1; owned */
    size_t block_floats; /* one layer's share of a block, in elements: K * block_size * hd */
    size_t stride;       /* elements from a block to the next: n_layers * block_floats */
    void *k, *v;         /* [n_blocks, n_layers, K, block_size, hd], mmap'd */
    size_t bytes;        /* of each of k and v */
};

/* Bytes of one element of kv. */
static inline size_t cpu_kv_es(const atlas_kv *kv) { return kv->fp8 ? 1 : kv->bf16 ? 2 : 4; }

/* Layer l's base in pool p (k or v) of kv. */
static inline void *cpu_kv_layer(const atlas_kv *kv, void *p, int l) {
    return (char *)p + (size_t)l * kv->block_floats * cpu_kv_es(kv);
}

/* Elements from a layer's base (cpu_kv_layer) to slot's row of kv head h. */
static inline size_t cpu_kv_at(const atlas_kv *kv, size_t slot, size_t h, size_t hd) {
    size_t bs = (size_t)kv->block_size;
    return slot / bs * kv->stride + (h * bs + slot % bs) * hd;
}

/* bf16 weights with AVX-512 or NEON (cpu_bf16.c), chosen at run time: F32 widens the weights
 * and keeps fp32 products (AVX-512F and BW); NEON does the same on aarch64; DOT rounds the
 * activations to bf16 and multiplies with AVX512_BF16's dot products, only when the model
 * asks for bf16 activations (atlas_model_params.cpu_matmul). */
typedef enum cpu_bf16_kind {
    CPU_BF16_NONE, /* the AVX2 / plain C tiles of cpu_matmul.c */
    CPU_BF16_F32,
    CPU_BF16_NEON,
    CPU_BF16_DOT,
} cpu_bf16_kind;

/* The attention's path (cpu_attention.c), chosen at run time: PLAIN one (token, head) at a
 * time in C, the reference; AVX2, AVX512 and NEON (aarch64) tiles of queries times keys. */
typedef enum cpu_attn_kind {
    CPU_ATTN_PLAIN,
    CPU_ATTN_AVX2,
    CPU_ATTN_AVX512,
    CPU_ATTN_NEON,
} cpu_attn_kind;

/* INT4 weights times int8 activations (cpu_q8.c, `--cpu-activations int8`), chosen at run
 * time: OFF the fp32 paths; PLAIN the C reference; AVX2 vpmaddubsw; VNNI AVX512-VNNI; NEON
 * aarch64's dot-product extension. */
typedef enum cpu_q8_kind {
    CPU_Q8_OFF,
    CPU_Q8_PLAIN,
    CPU_Q8_AVX2,
    CPU_Q8_VNNI,
    CPU_Q8_NEON,
} cpu_q8_kind;

typedef struct cpu_read cpu_read;

typedef struct cpu_mapping {
    void *p;
    size_t len;
} cpu_mapping;

typedef struct cpu_backend {
    atlas_backend base; /* first: the op table sees this */
    atlas_threadpool *pool;
    int n_threads;
    float *scratch;      /* [n_threads, scratch_floats]: per-thread row buffers */
    size_t scratch_floats;
    double *inv_freq;    /* [hd/2]; then longrope's long set at inv_freq + hd/2, or NULL; then
                            geom.rope_sets' frequencies, hd/2 each */
    double *inv_freq_long;
    int n_sets;          /* RoPE sets: 1 + geom.n_rope_sets */
    cpu_mapping *maps;   /* the buffers of 2 MiB or more alloc mapped: [n_maps]; alloc and free
                            come from the model's one thread (its load, its release) */
    int n_maps, cap_maps;
    int32_t *layer_window;   /* owned copies of the geometry's per-layer arrays, or NULL */
    uint8_t *layer_rope_set;
    float *kv_scales;        /* [2 * n_layers] or NULL */
    /* the staged batch (begin_batch) */
    int n_tokens, n_seqs, n_logits, block_size, cap_tokens, cap_seqs, cap_logits;
    int32_t *tokens, *positions, *slots, *tok_seq, *seq_ctx, *logit_rows; /* owned copies */
    int32_t *seq_rope;   /* [n_seqs]: the length longrope picks the factors by */
    float *rope_cos, *rope_sin; /* [n_sets, cap_tokens, hd/2] */
    int32_t *block_table;       /* [n_seqs * max_blocks] */
    int max_blocks;
    size_t cap_table;
    /* mixture of experts (cpu_moe.c): a layer's router logits, grouped rows and their
     * token lists, grown on demand */
    float *moe_buf;
    size_t moe_cap;
    int32_t *moe_list;
    size_t moe_list_cap;
    /* bf16 matmuls (cpu_bf16.c): the kernel, and the packed activations, grown on demand */
    cpu_bf16_kind bf16;
    void *xpack;
    size_t xpack_cap;
    /* activations rounded to bf16 before they multiply a bf16 weight (bf16 DOT where the CPU
     * has it, else a rounded copy, xround, through the kernel it has) */
    int round_x;
    float *xround;
    size_t xround_cap;
    /* INT4 weights times int8 activations (cpu_q8.c), packed into xpack; OFF: fp32 */
    cpu_q8_kind q8;
    /* attention (cpu_attention.c): the path, the rows of a tile (a query block's tokens times
     * a kv head's q heads), the batch's query blocks and the threads' tiles, grown on demand */
    cpu_attn_kind attn;
    int attn_rows;
    int32_t *attn_blocks;
    size_t attn_blocks_cap;
    float *attn_buf;
    size_t attn_buf_cap;
    /* weights' reads queued by weight_load, run by weights_done (cpu_read.c) */
    cpu_read *reads;
    size_t n_reads, cap_reads;
} cpu_backend;

/* Queues the read of source v (which has a reader) into dst, in pieces, for cpu_read_run;
 * owner: the weight dst belongs to. v->ctx must stay valid until the run (backend.h). */
atlas_status cpu_read_queue(cpu_backend *cb, const atlas_weight *owner,
                            const atlas_weight_src *v, void *dst);
/* Drops owner's queued reads (a weight freed before they ran). */
void cpu_read_cancel(cpu_backend *cb, const atlas_weight *owner);
/* Runs every queued read on all the pool's threads and empties the queue; the first
 * failure, with the tensor's name, once all have stopped (the queue then stays as it was:
 * the next run reads it again, and fails again, until the weights are freed). */
atlas_status cpu_read_run(cpu_backend *cb);

/* The 256 e4m3 codes' values as fp32, the table the FP8 weights dequantize with
 * (cpu_quant.c); the FP8 KV cache reads its codes through it too. */
const float *cpu_e4m3_table(void);

/* Row r of part p (its own numbering) dequantized to fp32 into dst[cols] (cpu_quant.c). */
void cpu_dequant_row(const cpu_part *p, int64_t r, int64_t cols, float *dst);
/* Checks a quantized source's packed size and scale grid, and copies its scales, zeros and
 * g_idx into part->owned (cpu_quant.c). */
atlas_status cpu_quant_load(const atlas_weight_src *v, cpu_part *part);

/* INT4 straight from its nibbles (cpu_int4.c), bitwise the same as dequantizing the row with
 * cpu_dequant_row and multiplying it in the matmul's order. cpu_int4_fast: whether part p
 * can take these (INT4 without g_idx, groups of whole 8-lane steps, an AVX2 build). */
int cpu_int4_fast(const cpu_part *p);
/* out[r] = dot(row r of part p, x[k]) for its rows r0 <= r < r1 (decode), with AVX-512VL
 * where the CPU has it. */
void cpu_int4_gemv(const cpu_part *p, const float *x, int64_t k, int64_t r0, int64_t r1,
                   float *out);
/* The same with AVX2 alone (avx512 0) or AVX-512VL where the CPU has it (1): the tests
 * check each variant against the plain path. */
void cpu_int4_gemv_at(const cpu_part *p, const float *x, int64_t k, int64_t r0, int64_t r1,
                      float *out, int avx512);
/* Row r of part p dequantized to fp32 into dst[k], as cpu_dequant_row (prefill's tiles). */
void cpu_int4_row(const cpu_part *p, int64_t r, int64_t k, float *dst);

/* Whether this CPU runs kind (PLAIN everywhere); the fastest it runs. */
int cpu_q8_kind_supported(cpu_q8_kind kind);
cpu_q8_kind cpu_q8_best(void);
/* Whether weight w can take int8 activations: every part INT4 without g_idx, one group size
 * of 32, 64, a multiple of 128 or the whole row, and cols a multiple of 32. */
int cpu_q8_fits(const atlas_weight *w);
/* Bytes of one token's packed int8 activations for k columns and groups of bc, and the
 * packing (blocks of 32 quantized to int8 with an fp32 scale each, and each group's sum). */
size_t cpu_q8_pack_bytes(int64_t k, int64_t bc);
void cpu_q8_pack(const float *x, int64_t k, int64_t bc, void *dst);
/* The same in plain C (simd 0) or with AVX2 where the build has it (1): the tests check
 * that both write the same bytes. */
void cpu_q8_pack_at(const float *x, int64_t k, int64_t bc, void *dst, int simd);
/* out[t * ldo + r] = row r of part p times packed token t (xs bytes apart), r0 <= r < r1,
 * with kind's kernel (not OFF). */
void cpu_q8_gemm(cpu_q8_kind kind, const cpu_part *p, int64_t k, int64_t r0, int64_t r1,
                 const void *xp, size_t xs, int n, float *out, int64_t ldo);

/* Whether this CPU runs kind; the kind the backend takes by default (NONE: no AVX-512). */
int cpu_bf16_kind_supported(cpu_bf16_kind kind);
cpu_bf16_kind cpu_bf16_best(void);
/* Bytes of one token's packed activations for a k-column weight, and the packing, for kind. */
size_t cpu_bf16_pack_bytes(cpu_bf16_kind kind, int64_t k);
void cpu_bf16_pack(cpu_bf16_kind kind, const float *x, int64_t k, void *dst);
/* out[t * ldo + r] = dot(row r of w[., k], token t) for r0 <= r < r1 and n packed tokens xp
 * (64-byte aligned, cpu_bf16_pack_bytes apart). */
void cpu_bf16_gemm(cpu_bf16_kind kind, const uint16_t *w, int64_t k, int64_t r0, int64_t r1,
                   const void *xp, int n, float *out, int64_t ldo);

/* Row r of w converted to fp32 into dst[w->cols]. */
void cpu_weight_row(const atlas_weight *w, int64_t r, float *dst);

/* Dot product of a[n] and b[n] in fp32 (attention scores; the matmul has its own fixed
 * order, see cpu_matmul.c). */
float cpu_dot(const float *a, const float *b, int64_t n);

atlas_status cpu_matmul(atlas_backend *be, void *out, const void *x, const atlas_weight *w,
                        const atlas_weight *bias, int n);
/* The same through the plain path every format has (each row dequantized by cpu_weight_row,
 * then multiplied): the reference the format kernels are tested against, bit for bit. */
atlas_status cpu_matmul_plain(atlas_backend *be, void *out, const void *x,
                              const atlas_weight *w, const atlas_weight *bias, int n);
/* cpu_matmul with fp32 activations even when the backend rounds them to bf16 (round_x): for
 * an MoE router, whose top-k a rounding would flip, and which the GPU computes in fp32 too. */
atlas_status cpu_matmul_exact(atlas_backend *be, void *out, const void *x,
                              const atlas_weight *w, const atlas_weight *bias, int n);
/* out[n, f] = act(gate_up[n, :f]) * gate_up[n, f:]: SwiGLU, and geom.glu's gating
 * (cpu_glu.c; gpt-oss's clamps both halves first). */
/* backend.h's sample op, through atlas/sampler.h (cpu_sample.c). */
atlas_status cpu_sample(atlas_backend *be, atlas_sample_out *out, void *logits, int rows,
                        int vocab, const atlas_sample_row *p, const atlas_sample_adj *adj,
                        int n_adj);
atlas_status cpu_swiglu(atlas_backend *be, void *out, const void *gate_up, int n, int f);
atlas_status cpu_glu(atlas_backend *be, void *out, const void *gate_up, int n, int f);
/* The mixture-of-experts ops of backend.h (cpu_moe.c). */
atlas_status cpu_moe_route(atlas_backend *be, int32_t *ids, float *wts, const void *h,
                           const atlas_weight *router, const atlas_weight *bias, int n);
atlas_status cpu_moe_experts(atlas_backend *be, void *out, const void *h,
                             const atlas_weight *gate_up, const atlas_weight *gate_up_bias,
                             const atlas_weight *down, const atlas_weight *down_bias,
                             const int32_t *ids, const float *wts, int n);
/* Whether this CPU runs kind; the fastest it runs. */
int cpu_attn_kind_supported(cpu_attn_kind kind);
cpu_attn_kind cpu_attn_best(void);
atlas_status cpu_attention(atlas_backend *be, void *out, const void *qkv, const atlas_kv *kv,
                           int layer, const atlas_weight *sinks);

#endif

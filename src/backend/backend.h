/* backend/backend.h — the op table: one model definition (model/forward.c), two
 * implementations (backend/cpu, backend/cuda).  Internal.
 *
 * Conventions
 * - Activations are backend memory (host memory on the CPU, device memory on CUDA) in the
 *   backend's activation type (geom.act_size bytes an element: 4 = fp32 on the CPU).
 *   Row-major; "x[n, d]" means n rows of d elements, rows contiguous.
 * - Weights are loaded once through weight_load from sources the model describes
 *   (atlas_weight_src: bytes in memory and a reader; the backend knows no files or
 *   checkpoint formats). The CPU may keep pointing at the source's bytes; CUDA uploads them
 *   as bf16. A weight is [out, in] like torch's nn.Linear.weight.
 * - q, k and v come from one fused projection: qkv[n, (H + 2*K) * hd], q heads first, then
 *   k heads, then v heads (H = geom.n_heads, K = geom.n_kv_heads, hd = geom.head_dim).
 * - begin_batch stages the batch (token ids, positions, KV slots, block tables) in the
 *   backend, so that later ops of the same forward read it there (CUDA graphs replay with
 *   fixed addresses). A batch is valid until the next begin_batch.
 * - The KV cache is paged: per layer, K and V pools of [n_blocks, block_size, K, hd].
 *   Token at position p of sequence s lives in slot
 *     block_table[s * max_blocks + p / block_size] * block_size + p % block_size.
 * - Every op may be asynchronous; download/argmax/sync wait for completion.
 * - Ops return ATLAS_OK or an error with a message (CUDA: the driver call, file, line). */
#ifndef ATLAS_BACKEND_H
#define ATLAS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "atlas/status.h"
#include "core/dtype.h"

typedef struct atlas_backend atlas_backend;
typedef struct atlas_weight atlas_weight; /* backend-owned copy/view of one (fused) weight */
typedef struct atlas_kv atlas_kv;         /* backend-owned paged KV cache */

enum { ATLAS_WEIGHT_MAX_DIMS = 8 };

/* A weight's format: a property of the weight, not of the model. Every format is a matrix
 * w[rows, cols] ([out, in]) that the backend's matmul reads as it is stored, dequantizing a
 * tile at a time; the model (model/quant.c) turns each checkpoint layout into one of these at
 * load. docs/ARCHITECTURE.md, "Weight formats", says how a format is added. */
typedef enum atlas_wformat {
    ATLAS_WFMT_DENSE = 0, /* the source's dtype: BF16, F16 or F32 */
    /* FP8 e4m3 codes [rows, cols], one byte each: w[r][c] = e4m3(code) *
     * scales[r / block_rows][c / block_cols] */
    ATLAS_WFMT_FP8_E4M3,
    /* 4-bit integers [rows, cols / 2] bytes, column 2j in the low nibble of byte j and 2j+1 in
     * the high one: w[r][c] = (q - zeros[r][g]) * scales[r][g], g = g_idx ? g_idx[c] :
     * c / block_cols (block_rows 1) */
    ATLAS_WFMT_INT4,
    /* OCP FP4 e2m1 codes [rows, cols / 2] bytes, column 2j in the low nibble of byte j and
     * 2j+1 in the high one: w[r][c] = e2m1(code) * scales[r][c / block_cols] (block_rows 1;
     * MXFP4's e8m0 and NVFP4's e4m3 x global scale are turned into float32 at load) */
    ATLAS_WFMT_FP4_E2M1,
    ATLAS_WFMT_COUNT
} atlas_wformat;

/* "FP8 e4m3", "INT4" */
const char *atlas_wformat_name(atlas_wformat f);

/* How an INT4 weight's codes and grids reach weight_load (atlas_wquant.order). */
typedef enum atlas_int4_order {
    ATLAS_INT4_PACKED = 0, /* ATLAS_WFMT_INT4's layout above; scales and zeros the float grids */
    ATLAS_INT4_GPTQ, /* as GPTQ stores them: int32 [cols/8, rows], input 8i+k in nibble k */
    ATLAS_INT4_AWQ,  /* as AWQ stores them: int32 [cols, rows/8], row 8j + [0,2,4,6,1,3,5,7][k]
                        in nibble k */
} atlas_int4_order;

struct atlas_weight_src;

/* A quantized source's scales and zero points, float32, row-major over the scale grid
 * [ceil(rows / block_rows), scale_cols]. Valid as long as the source's data. */
typedef struct atlas_wquant {
    atlas_wformat format;
    int block_rows, block_cols; /* the rows and columns one scale covers */
    int scale_cols;             /* columns of the scale grid (INT4 with g_idx: the groups) */
    const float *scales;
    const float *zeros;         /* INT4 only (NULL otherwise) */
    const int32_t *g_idx;       /* INT4: [cols] the group of each column (GPTQ's act-order), or
                                   NULL: c / block_cols */
    /* NVFP4: the float32 factor every scale includes (each an e4m3 value times it: ModelOpt's
     * weight_scale_2, compressed-tensors' 1 / weight_global_scale), so that a backend may keep
     * it apart from the codes (e2m1 x e4m3 is exact in bf16); 0 for the other formats. */
    float global;
    /* INT4 handed over as stored (order GPTQ or AWQ; only to a backend with int4_stored, which
     * repacks on its device): the source's bytes are the checkpoint's qweight, scales and
     * zeros are NULL, and the grids come from stored_scales ([groups, rows] in f16, bf16 or
     * f32) and stored_zeros (int32 [groups, rows/8], row 8j + k's zero in the nibble the
     * order gives row 8j + k of a word), each zero plus zero_add (GPTQ's zero - 1: 1). */
    atlas_int4_order order;
    const struct atlas_weight_src *stored_scales, *stored_zeros;
    float zero_add;
} atlas_wquant;

/* Where one tensor of a weight comes from, as the model describes it to weight_load: its
 * bytes in memory, and a reader of the same bytes that the backend may prefer for bulk
 * copies (the model's reader preads its file: no page faults, bench/RESULTS.md). The
 * backend reads the tensor only through these two; it never sees a path or a descriptor. */
typedef struct atlas_weight_src {
    const char *name;  /* for errors: the tensor's name */
    atlas_dtype dtype;
    int n_dims;
    int64_t shape[ATLAS_WEIGHT_MAX_DIMS];
    size_t nbytes;     /* product(shape) * dtype size; quantized: the packed bytes */
    /* NULL: a dense tensor in dtype. Otherwise a 2-D weight of shape [rows, cols] stored in
     * quant->format (dtype F8_E4M3, U8 for INT4's packed nibbles, I32 for INT4 as stored). A
     * fused weight's parts are all dense or all of one format; each part keeps its own scales
     * (model/quant.h says when parts may be concatenated into one matrix). */
    const atlas_wquant *quant;
    /* The tensor's bytes, row-major, at any alignment (the model's mapping, or a buffer it
     * owns). Valid until weights_done returns (for a weight loaded after it: the next
     * begin_batch) and no longer: a backend keeps its own copy, and reads through `read`
     * when there is one, so that no byte comes from a mapping of a file that may be cut
     * short under it. */
    const void *data;
    /* A 1-D dense weight only: added to every element in float32 as it loads (Gemma's norms
     * are used as 1 + w); 0 otherwise. */
    float offset;
    /* Optional (NULL: the backend copies from data): fills dst with bytes
     * [offset, offset + n) of the tensor's data. Called with ctx from any thread (CUDA: the
     * host's loader threads, concurrently) until data's first limit above. On a failure the
     * backend copies those bytes from data instead. */
    atlas_status (*read)(void *ctx, void *dst, uint64_t offset, size_t n);
    void *ctx;
} atlas_weight_src;

/* One set of RoPE frequencies and the factor its cos/sin are scaled by. */
typedef struct atlas_rope_set {
    const double *inv_freq; /* [rope_dim/2] */
    double attn_factor;
} atlas_rope_set;

enum { ATLAS_MAX_ROPE_SETS = 2 };

/* The MLP's gate activation (the epilogue ATLAS_EPI_GLU applies it): act(gate) * up. */
typedef enum atlas_glu_kind {
    ATLAS_GLU_SILU = 0,  /* SwiGLU: silu(g) = g / (1 + exp(-g)) */
    ATLAS_GLU_GELU_TANH, /* GeGLU: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) */
    /* gpt-oss's clamped SwiGLU, on g = min(gate, L) and u = clamp(up, -L, L):
     * (u + 1) * g * sigmoid(alpha * g), L = geom.glu_limit, alpha = geom.glu_alpha */
    ATLAS_GLU_SWIGLU_CLAMP,
} atlas_glu_kind;

/* How moe_route turns a router's logits into a token's k experts and their weights. */
typedef enum atlas_moe_route_kind {
    ATLAS_ROUTE_SOFTMAX_TOPK = 0, /* softmax over all E, the k largest (renormalised when
                                     moe_norm_topk): Qwen3-MoE, Mixtral */
    ATLAS_ROUTE_TOPK_SOFTMAX,     /* the k largest logits, then a softmax over those k:
                                     gpt-oss */
} atlas_moe_route_kind;

/* What the ops need to know about the model; fixed for the backend's lifetime. */
typedef struct atlas_backend_geom {
    int hidden;        /* d */
    int n_heads;       /* H */
    int n_kv_heads;    /* K */
    int head_dim;      /* hd */
    int intermediate;  /* f */
    int vocab_size;
    int n_layers;
    float rms_eps;
    const double *rope_inv_freq; /* [hd/2]; copied at create */
    double rope_attn_factor;     /* cos/sin are multiplied by this (yarn, longrope), else 1 */
    int rope_dim;                /* dims of each head that rotate (rotate-half over the first
                                    rope_dim; the rest pass through); 0: head_dim */
    /* longrope (NULL: none): [rope_dim/2] frequencies for the tokens of a sequence whose
     * length (seq_ctx, or seq_rope_len when larger) is above rope_long_after; rope_inv_freq for the
     * others. Chosen per sequence, so a token's rotation never depends on its batch. */
    const double *rope_inv_freq_long;
    int rope_long_after;
    int max_position;            /* positions beyond are still valid: tables grow or compute */
    int sliding_window;          /* 0: full causal attention */
    int sliding_from_layer;      /* layers >= this use sliding_window (0: all of them) */
    /* Per layer, as data (NULL: none of it). layer_window[l]: layer l's sliding window (0:
     * full), instead of sliding_window / sliding_from_layer. layer_rope_set[l]: the RoPE set
     * layer l rotates with, 0 (rope_inv_freq, rope_attn_factor and longrope's long set) or
     * i >= 1 (rope_sets[i - 1]): Gemma 3's local layers rotate with a base of their own.
     * Copied at create. */
    const int32_t *layer_window;
    const uint8_t *layer_rope_set;
    int n_rope_sets;             /* sets beyond set 0: 0 .. ATLAS_MAX_ROPE_SETS - 1 */
    atlas_rope_set rope_sets[ATLAS_MAX_ROPE_SETS - 1];
    float attn_scale;            /* scores are q.k times it; 0: 1/sqrt(head_dim) */
    float embed_scale;           /* embed multiplies the rows by it; 0: 1 (Gemma: sqrt(d)) */
    atlas_glu_kind glu;          /* the activation of ATLAS_EPI_GLU and the glu op */
    float glu_alpha, glu_limit;  /* ATLAS_GLU_SWIGLU_CLAMP's gain and clamp */
    int attn_sinks;              /* 1: attention is given each layer's sinks (gpt-oss) */
    int post_norms;              /* the model norms projections' outputs before their residual
                                    adds (Gemma 3): rmsnorm then add, the plain ops */
    /* Mixture-of-experts layers (0 experts: none; which layers are MoE is the model's): E
     * experts of expert_ffn columns each, k chosen a token, their weights renormalised to
     * sum 1 when moe_norm_topk (moe_route, moe_experts). */
    int n_experts;               /* E */
    int n_experts_used;          /* k */
    int expert_ffn;              /* f of one expert (the dense layers keep intermediate) */
    int moe_norm_topk;
    atlas_moe_route_kind moe_route; /* the routing's order of top-k and softmax */
    /* An FP8 KV cache's scales (kv_size 1), NULL: all 1. kv_scales[2l] is layer l's K scale,
     * kv_scales[2l + 1] its V scale: a row x is stored as e4m3(x / scale) (ties to even,
     * saturating at +-448) and read as the code's value times scale, as vLLM's FP8 KV cache
     * (a checkpoint's self_attn.k_scale / v_scale). Copied at create. */
    const float *kv_scales;
} atlas_backend_geom;

/* Layer l's sliding window (0: full causal attention). */
static inline int atlas_geom_window(const atlas_backend_geom *g, int layer) {
    if (g->layer_window) return g->layer_window[layer];
    return layer >= g->sliding_from_layer ? g->sliding_window : 0;
}

/* The factor of the attention scores. */
static inline float atlas_geom_attn_scale(const atlas_backend_geom *g) {
    return g->attn_scale > 0 ? g->attn_scale : 1.0f / __builtin_sqrtf((float)g->head_dim);
}

typedef struct atlas_batch {
    int n_tokens;
    const int32_t *tokens;      /* [n_tokens]; in a queued step (argmax_queue, sample_queue),
                                   v < 0 is the id of row -1 - v of the step queued before,
                                   read on the device (ATLAS_BATCH_PREV) */
    const int32_t *positions;   /* [n_tokens] absolute positions */
    int n_seqs;
    const int32_t *seq_start;   /* [n_seqs + 1]: seq s owns tokens seq_start[s] .. seq_start[s+1]-1,
                                   at consecutive positions */
    const int32_t *seq_ctx;     /* [n_seqs]: context length of seq s after this batch
                                   (= its last position + 1) */
    const int32_t *block_table; /* [n_seqs * max_blocks] */
    int max_blocks;
    int n_logits;
    const int32_t *logit_rows;  /* [n_logits]: token indices whose logits are wanted */
    const int32_t *seq_rope_len; /* [n_seqs] or NULL: the length by which longrope picks seq
                                   s's factor set, max(this, seq_ctx[s]) (the engine: every
                                   token it knows of the sequence, so that a prompt prefilled
                                   in chunks rotates as in one prefill) */
    int hidden;                 /* 1: the rows of logit_rows are wanted as the final-norm
                                   hidden states h[n_logits, d] (an embedding model's), not
                                   as logits */
} atlas_batch;

/* A queued step's token that is the id of logit row r of the step queued before it. */
#define ATLAS_BATCH_PREV(r) (-1 - (int32_t)(r))

/* What rmsnorm_matmul does with its output out[n, m] after the matmul. */
typedef enum atlas_epi_kind {
    ATLAS_EPI_NONE,
    ATLAS_EPI_SWIGLU,  /* act[n, f] = swiglu(out) (m = 2f) */
    ATLAS_EPI_ROPE_KV, /* rope(out) then kv_store(out, kv, layer) (out: qkv) */
    ATLAS_EPI_GLU,     /* act[n, f] = glu(out) with geom.glu's activation (m = 2f) */
} atlas_epi_kind;

typedef struct atlas_epilogue {
    atlas_epi_kind kind;
    void *act;    /* SWIGLU, GLU */
    int f;        /* SWIGLU, GLU */
    atlas_kv *kv; /* ROPE_KV */
    int layer;    /* ROPE_KV */
} atlas_epilogue;

/* The sample op's rows (backend_ops.sample): one row's parameters as atlas/sampler.h's
 * params say (the same checks, the same order of transforms), the seed with the counter
 * of its draw, and what it wants back. The layout is the CUDA kernel's too
 * (kernels/sample.cu): fixed-width fields, 64 bytes. */
typedef struct atlas_sample_row {
    uint64_t seed;
    uint64_t counter;     /* the draw's uniform is atlas_sampler_uniform(seed, counter): the
                             engine passes the drawn token's position */
    float temperature;    /* 0: the argmax of the transformed row */
    float top_p, min_p;
    float repetition_penalty, presence_penalty, frequency_penalty;
    int32_t top_k;        /* 0: off */
    int32_t adj0, n_adj;  /* the row's adjustments: adj[adj0 .. adj0 + n_adj), after the
                             rows' before (no two rows share one) */
    int32_t n_top;        /* the most likely ids of the raw row wanted, 0..ATLAS_SAMPLE_MAX_TOP */
    int32_t flags;        /* ATLAS_SAMPLE_* */
    int32_t pad_;         /* 0 */
} atlas_sample_row;

enum {
    ATLAS_SAMPLE_LOGPROB = 1, /* the drawn id's logprob in the raw row is wanted */
    ATLAS_SAMPLE_SKIP = 2,    /* not sampled: its logits and out are left alone */
    ATLAS_SAMPLE_MAX_TOP = 20,
};

/* One token a row's transforms touch: its history (prompt and generated tokens, as the
 * sampler's history and prompt length) and its logit_bias, merged. A row's entries are in
 * increasing id, each id once. */
typedef struct atlas_sample_adj {
    int32_t id;
    int32_t seen;  /* 1: in the history: the repetition penalty applies (once) */
    int32_t count; /* times among the generated tokens: presence and frequency; > 0 only
                      with seen */
    float bias;    /* logit_bias's (0: none), added first */
} atlas_sample_adj;

/* What the sample op gives back for one row. */
typedef struct atlas_sample_out {
    int32_t id;
    float logprob; /* of id in the raw row (ATLAS_SAMPLE_LOGPROB), else 0 */
    int32_t n_top; /* min(row's n_top, vocab) */
    int32_t top_ids[ATLAS_SAMPLE_MAX_TOP];     /* most likely first; ties: the lower id */
    float top_logprobs[ATLAS_SAMPLE_MAX_TOP];
} atlas_sample_out;

/* Checks the sample op's arguments (every backend's op calls it first): each row's params
 * as the sampler checks them, its adjustments (in range, increasing ids below vocab, a
 * count only with seen), n_top and flags. ATLAS_ERR_INVALID / ATLAS_ERR_RANGE naming the
 * row and field. */
atlas_status atlas_sample_check(const atlas_sample_row *p, int rows, const atlas_sample_adj *adj,
                                int n_adj, int vocab);
/* The same for a queued step's rows (sample_queue): ids only, so no adjustments, flags or
 * top ids. */
atlas_status atlas_sample_check_queued(const atlas_sample_row *p, int rows, int vocab);

typedef struct atlas_backend_ops {
    const char *name; /* "cpu", "cuda" */

    atlas_status (*alloc)(atlas_backend *be, size_t bytes, void **out);
    /* free(NULL) does nothing.  The frees (free, weight_free, kv_free) return nothing: a
     * failure to free is kept by the backend and reported by destroy with the rest of the
     * unload's, so that it is reported once, in one message, whoever called the free. */
    void (*free)(atlas_backend *be, void *p);

    /* Loads one weight; with n > 1, the sources are concatenated along dim 0 (rows), e.g.
     * wq|wk|wv into the fused qkv weight or gate|up into the fused gate_up weight.
     * 1-D sources (norm weights, biases) concatenate likewise. The structs may live on the
     * caller's stack (a backend that reads later keeps copies); what they point to stays
     * valid as atlas_weight_src says. */
    atlas_status (*weight_load)(atlas_backend *be, const atlas_weight_src *const *srcs, int n,
                                atlas_weight **out);
    void (*weight_free)(atlas_backend *be, atlas_weight *w);
    /* Optional (NULL: none): every weight of the model was loaded; returns when they are on
     * the device (CUDA: weight_load may only queue a weight's copy; the queued copies run
     * here, in file order). Weights loaded after it are finished by the next begin_batch.
     * A backend without it has read a weight's sources when weight_load returns. */
    atlas_status (*weights_done)(atlas_backend *be);
    /* Optional (NULL: none; the CPU's weights are the files' pages or its own host memory
     * already): before the first weight_load, keeps this load's weights in host memory for
     * the next load of the same key (key: the model's identity; budget: bytes the process
     * may keep; expect: about the weights' bytes), or loads them from there when it holds
     * them: *hit 1, and weight_load reads no source's bytes (CUDA: backend/cuda/host_tier.h).
     * *off: why the backend keeps none on this device ("" when it may). */
    atlas_status (*host_tier)(atlas_backend *be, uint64_t key, size_t budget, size_t expect,
                              int *hit, const char **off);
    /* Optional (NULL: none): the model's load is over (its weights, KV cache and activations
     * are made), called on the loading thread before the model is handed to the thread that
     * serves it.  CUDA: what the load queued on the copy stream comes before the serving
     * stream's work, and later allocations are ordered on the serving stream (registry.h). */
    atlas_status (*loaded)(atlas_backend *be);
    /* Optional (NULL: none): the model serves (its load is over and was announced): starts
     * the host tier's fill of this load's weights that host_tier chose, off the load's
     * critical path, since pinning host memory holds the driver's other calls (CUDA:
     * backend/cuda/host_tier.h).  Never called: no image is kept.  The owner's thread. */
    void (*tier_fill)(atlas_backend *be);

    /* The cache's element type is be->kv_size's (ATLAS_ERR_UNSUPPORTED for one the backend
     * does not have). */
    atlas_status (*kv_create)(atlas_backend *be, int n_blocks, int block_size, atlas_kv **out);
    void (*kv_free)(atlas_backend *be, atlas_kv *kv);
    /* Optional (NULL: the backend cannot): copies whole blocks of the cache, every layer's K
     * and V, between the cache and host memory: block ids[i] to or from an image of
     * kv_bytes / n_blocks bytes at host[i] (the cache's own layout and element type, for the
     * same backend, geometry and element type to read back).  kv_save returns once the
     * images are written; kv_restore is ordered before every later op that reads the cache
     * and has read the images when it returns. */
    atlas_status (*kv_save)(atlas_backend *be, const atlas_kv *kv, const int32_t *ids, int n,
                            void *const *host);
    atlas_status (*kv_restore)(atlas_backend *be, atlas_kv *kv, const int32_t *ids, int n,
                               const void *const *host);

    atlas_status (*begin_batch)(atlas_backend *be, const atlas_batch *b, int block_size);

    /* x[n, d] = table[tokens] (* geom.embed_scale when it is not 0) */
    atlas_status (*embed)(atlas_backend *be, void *x, const atlas_weight *table);
    /* out[rows, d] = rmsnorm(x[rows, d]) * w[d] */
    atlas_status (*rmsnorm)(atlas_backend *be, void *out, const void *x, const atlas_weight *w,
                            int rows, int d);
    /* resid[n, d] += delta[n, d]; out[n, d] = rmsnorm(resid) * w */
    atlas_status (*add_rmsnorm)(atlas_backend *be, void *resid, const void *delta, void *out,
                                const atlas_weight *w, int n, int d);
    /* out[n, m] = x[n, k] @ w[m, k]^T (+ bias[m]) */
    atlas_status (*matmul)(atlas_backend *be, void *out, const void *x, const atlas_weight *w,
                           const atlas_weight *bias, int n);
    /* Qwen3: per-head RMSNorm of the q heads (q_norm[hd]) and k heads (k_norm[hd]) of qkv[n]. */
    atlas_status (*qk_norm)(atlas_backend *be, void *qkv, const atlas_weight *q_norm,
                            const atlas_weight *k_norm, int n);
    /* Rotary embedding (rotate-half convention) of q and k heads of qkv[n] at the batch's
     * positions, with layer's RoPE set (geom.layer_rope_set). */
    atlas_status (*rope)(atlas_backend *be, void *qkv, int n, int layer);
    /* Writes the k and v heads of qkv[n] into the layer's cache slots. */
    atlas_status (*kv_store)(atlas_backend *be, const void *qkv, atlas_kv *kv, int layer);
    /* out[n, H*hd]: causal softmax(q k^T * atlas_geom_attn_scale) v of each token against its
     * sequence's cached context up to and including its own position, the last
     * atlas_geom_window(layer) positions of it when that is not 0 (GQA: q head h uses kv head
     * h / (H/K)). sinks (NULL: none; geom.attn_sinks says whether the model has them): a
     * logit per q head [H] that joins each softmax's denominator and adds no value, so
     * the weights of the positions sum to less than 1 (gpt-oss). */
    atlas_status (*attention)(atlas_backend *be, void *out, const void *qkv, const atlas_kv *kv,
                              int layer, const atlas_weight *sinks);
    /* out[n, f] = silu(gate_up[n, :f]) * gate_up[n, f:] */
    atlas_status (*swiglu)(atlas_backend *be, void *out, const void *gate_up, int n, int f);
    /* Optional (NULL: only SwiGLU, through swiglu): out[n, f] = act(gate_up[n, :f]) *
     * gate_up[n, f:] with geom.glu's activation. */
    atlas_status (*glu)(atlas_backend *be, void *out, const void *gate_up, int n, int f);
    /* resid[n, d] += delta[n, d]. The add may be deferred (CUDA: no kernel of its own) into
     * the next op, which the model guarantees is a norm of resid (rmsnorm or rmsnorm_matmul
     * with norm) over the same n rows; nothing writes delta until then but that norm, whose
     * output may be delta (post-norms: a backend reads each row's delta before it writes
     * that row's output). */
    atlas_status (*add)(atlas_backend *be, void *resid, const void *delta, int n, int d);
    /* Mixture of experts (optional, NULL: none; the model refuses an MoE checkpoint on a
     * backend without them). A layer is route then experts, then add's residual add.
     * moe_route: logits = h[n, d] @ router[E, d]^T (+ bias[E]) in float32; then as
     * geom.moe_route says: ATLAS_ROUTE_SOFTMAX_TOPK: p = softmax(logits) over all E, the
     * k = geom.n_experts_used largest p in decreasing order (equal p: the lower expert index
     * first, as torch.topk returns them), divided by their sum when geom.moe_norm_topk;
     * ATLAS_ROUTE_TOPK_SOFTMAX: the k largest logits (in that order, ties likewise), their
     * softmax over the k as the weights. ids[n, k] (int32) and wts[n, k] (float32), backend
     * memory. */
    atlas_status (*moe_route)(atlas_backend *be, int32_t *ids, float *wts, const void *h,
                              const atlas_weight *router, const atlas_weight *bias, int n);
    /* out[n, d] = sum over j < k of wts[t, j] * down_e(glu(gate_up_e h[t])), e = ids[t, j],
     * the glu geom.glu's. The E experts are one stacked weight each, row blocks of one
     * expert after another (each expert's view is its block): gate_up[E * 2f, d] (expert
     * e's gate rows e * 2f .. e * 2f + f - 1, its up rows the next f) and down[E * d, f],
     * f = geom.expert_ffn; so a backend may group the rows by expert and run each group's
     * matmuls (the CPU), or all groups in one grouped launch. Their biases (NULL: none,
     * gpt-oss has them) stack likewise: gate_up_bias[E * 2f], down_bias[E * d], each
     * expert's added to its own matmul's output. Each token's experts are summed in
     * increasing expert index. */
    atlas_status (*moe_experts)(atlas_backend *be, void *out, const void *h,
                                const atlas_weight *gate_up, const atlas_weight *gate_up_bias,
                                const atlas_weight *down, const atlas_weight *down_bias,
                                const int32_t *ids, const float *wts, int n);
    /* out[n_logits, d] = x[logit_rows, d] */
    atlas_status (*gather_rows)(atlas_backend *be, void *out, const void *x, int d);
    /* host[count] = (float)x[count]; waits */
    atlas_status (*download)(atlas_backend *be, float *host, const void *x, size_t count);
    /* ids[rows] = argmax over each row of logits[rows, vocab]; waits */
    atlas_status (*argmax)(atlas_backend *be, int32_t *ids, const void *logits, int rows,
                           int vocab);
    /* Optional (NULL: none), greedy decoding a step ahead of the host: queues ids =
     * argmax of each row of logits[rows, vocab] and their copy to the host, and returns
     * without waiting; the next queued batch may take any of them as tokens
     * (ATLAS_BATCH_PREV) on the device, so that it is queued while this one runs. At most 2 queued; argmax_collect
     * waits for the oldest one and writes its ids[rows]. A step of more rows than the logits
     * buffer holds is queued a chunk at a time: row0 0 starts a step, a call with row0 at
     * the rows queued so far adds logits[rows, vocab] as the step's rows row0.. */
    atlas_status (*argmax_queue)(atlas_backend *be, const void *logits, int row0, int rows,
                                 int vocab);
    atlas_status (*argmax_collect)(atlas_backend *be, int32_t *ids, int rows);
    /* Optional with argmax_queue: whether the oldest queued step has run (argmax_collect
     * would not wait): 1; an error answers 1, for argmax_collect to report. */
    int (*argmax_ready)(atlas_backend *be);
    /* Sampled decoding a step ahead, as argmax_queue (a backend with one has both, and they
     * share the queue and argmax_collect): each row r's id drawn as the sample op draws it
     * for p[r], which asks for no adjustments and no logprobs (n_adj 0, flags 0; temperature
     * 0 is the argmax). p is read before the call returns. */
    atlas_status (*sample_queue)(atlas_backend *be, const void *logits, int row0, int rows,
                                 int vocab, const atlas_sample_row *p);
    /* Samples each row r of logits[rows, vocab] with p[r] and its adjustments into out[r]:
     * the transforms of atlas/sampler.h in its order (logit_bias, repetition, presence and
     * frequency penalties; temperature 0: the argmax; else / temperature, top-k, top-p,
     * min-p) and one draw by the uniform atlas_sampler_uniform(seed, counter); then the
     * drawn id's logprob and the n_top most likely ids of the raw row (atlas_sampler_logprobs's
     * log-softmax). What logits hold after is undefined (CUDA transforms them in place);
     * rows flagged ATLAS_SAMPLE_SKIP are left alone. Waits. The CPU calls the sampler
     * (atlas_sampler_sample_at: the reference); CUDA's kernel draws from the same
     * distribution with the same uniform but walks its candidates in another order, so
     * the two pick different ids for one seed. */
    atlas_status (*sample)(atlas_backend *be, atlas_sample_out *out, void *logits, int rows,
                           int vocab, const atlas_sample_row *p, const atlas_sample_adj *adj,
                           int n_adj);
    atlas_status (*sync)(atlas_backend *be);

    /* Fused ops: the model says which ops go together (model/forward.c calls them through
     * backend/expand.h); a backend without its own kernel for one leaves it NULL and
     * expand.c runs it as the plain ops its comment names, with the same results. No
     * buffer of a fused op aliases another of its buffers.
     *
     * Hand-off between ops (what a backend may rely on, so that it links its kernels by
     * position, never by comparing buffers):
     * - matmul_residual's add may be deferred into the next op, which the model guarantees
     *   is a norm of that same residual over the same rows (as add's).
     * - rmsnorm_matmul with a norm: the matmul reads the norm's output h. Without one: the
     *   matmul reads rows [row0, row0 + n) of h, which the last norm op wrote and nothing
     *   wrote since (a backend may read its own copy of it).
     * - an ATLAS_EPI_SWIGLU epilogue's act is read by the next op, which the model
     *   guarantees is a matmul of act over the same rows, and by no other; nor is its out
     *   (gate_up) read after (gate_up -> swiglu -> down: a backend may hand act over in its
     *   own form, and leave act and out unwritten or holding its own form). The same for an
     *   ATLAS_EPI_GLU epilogue. */

    /* h[n, d] = rmsnorm(x[n, d]) * norm[d]; out[n, m] = h @ w[m, d]^T (+ bias[m]); then the
     * epilogue. norm NULL: out = h[row0 .. row0 + n) @ w^T (x unused). Expands to rmsnorm,
     * matmul and the epilogue's ops. */
    atlas_status (*rmsnorm_matmul)(atlas_backend *be, void *out, void *h, const void *x,
                                   const atlas_weight *norm, const atlas_weight *w,
                                   const atlas_weight *bias, int n, int d, int row0,
                                   const atlas_epilogue *epi);
    /* tmp[n, d] = x[n, k] @ w[d, k]^T; resid[n, d] += tmp. Expands to matmul and add. */
    atlas_status (*matmul_residual)(atlas_backend *be, void *resid, void *tmp, const void *x,
                                    const atlas_weight *w, int n, int d);
    /* rope(qkv[n]) then kv_store(qkv, kv, layer). Expands to those two. */
    atlas_status (*rope_kv_store)(atlas_backend *be, void *qkv, atlas_kv *kv, int layer, int n);
    /* Frees everything left and the backend itself, even when some of it fails. Returns
     * ATLAS_OK, or the first failure of the backend's frees (the ones kept since it was
     * made, then its own) with every one of them counted and listed in the message (CUDA:
     * atlas_registry_release's). Never ATLAS_ERR_BUSY: the backend is gone either way. */
    atlas_status (*destroy)(atlas_backend *be);
    /* Optional (NULL: none): x[count] = its sum over the ranks of tensor parallelism, in
     * place, ordered with the other ops (CUDA: NCCL on the backend's stream). Only called
     * at a world size above 1; docs/TENSOR_PARALLEL.md. */
    atlas_status (*all_reduce)(atlas_backend *be, void *x, size_t count);
} atlas_backend_ops;

/* Every implementation embeds this as its first member. */
struct atlas_backend {
    const atlas_backend_ops *ops;
    atlas_backend_geom geom;
    size_t act_size; /* bytes per activation element */
    char kernels[320]; /* what runs, for `atlas info` ("" where there is nothing to say) */
    /* 1: weight_load has copied every source's bytes in memory (`data` without a reader) and
     * its quantization's arrays when it returns, so the model may free them then, not at
     * weights_done (the CPU: a 4-bit model's repacked bytes would otherwise double its peak
     * memory); 0: they stay valid until weights_done (CUDA's queued copies). */
    int copies_at_load;
    /* 1: the backend takes GPTQ's and AWQ's INT4 weights as stored and repacks them on its
     * device (atlas_wquant.order), so that a load moves their bytes at the copy rate; 0: the
     * model repacks them on the host into ATLAS_INT4_PACKED. */
    int int4_stored;
    /* 1: the model may keep the MLP's activation in the qkv buffer (dead between the
     * attention's end and the next layer's projection) when it fits: set by a backend whose
     * kernels were checked with that layout (the CPU, where it lowered peak memory); 0: its
     * own buffer */
    int act_in_qkv;
    /* bytes of a KV cache element, what kv_create makes: 4 fp32 (the CPU's reference), 2
     * bf16, 1 FP8 e4m3 with geom.kv_scales. The backend sets its default at create (and the
     * CPU's set_activations); the model may set it to 1 (or 2 on the CPU) before kv_create,
     * and a backend without that cache type refuses it there. */
    size_t kv_size;
};

/* Creates the CPU backend with n_threads workers (0: one per core). */
atlas_status atlas_backend_cpu_create(const atlas_backend_geom *geom, int n_threads,
                                      atlas_backend **out);
/* What the CPU multiplies weights with, act one of include/atlas/model.h's values:
 * FP32 (the default, the reference); BF16: the activations a bf16 weight multiplies rounded
 * to bf16 first (as a GPU's tensor cores take them), with AVX512_BF16 dot products where the
 * CPU has them; INT8: that where the CPU has them (else a bf16 weight's activations stay
 * fp32), and INT4 weights times activations quantized to int8 (cpu_q8.c).  BF16 and INT8
 * keep the KV cache in bf16. */
atlas_status atlas_backend_cpu_set_activations(atlas_backend *be, int act);
/* Whether this CPU has the bf16 dot products (AVX512_BF16) that BF16 and INT8 are fast with. */
int atlas_backend_cpu_bf16_dot(void);
/* Whether this CPU has integer dot products for INT8's INT4 kernels (AVX2's vpmaddubsw,
 * AVX512-VNNI, aarch64's sdot), not the plain C path. */
int atlas_backend_cpu_int8_dot(void);
/* Ops that atlas_backend_options.skip_ops can leave out (bits). */
enum {
    ATLAS_SKIP_NORM = 1 << 0,      /* rmsnorm and add_rmsnorm */
    ATLAS_SKIP_MATMUL = 1 << 1,
    ATLAS_SKIP_ROPE = 1 << 2,
    ATLAS_SKIP_KV_STORE = 1 << 3,
    ATLAS_SKIP_ATTENTION = 1 << 4,
    ATLAS_SKIP_SWIGLU = 1 << 5,
};

/* How the CUDA backend is made. Zero-initialised (or NULL) is the default, the fastest
 * measured (bench/RESULTS.md); every other field turns something off, for `atlas bench` to
 * measure what it gives and for the tests to reach the plain paths. */
typedef struct atlas_backend_options {
    int gpu;          /* the GPU ordinal; the process host binds one (atlas_host_get: another
                         ordinal later is an error) */
    int no_graphs;    /* decode steps launch their kernels one by one, never as CUDA graphs */
    int no_pdl;       /* no programmatic dependent launch (on by default from Hopper) */
    int no_cublaslt;  /* large matmuls on atlas_gemm instead of cuBLASLt */
    int portable;     /* `--kernels portable`: the compute_80 PTX compiled by the driver, with
                         sm_86's choices and shared memory (backend/cuda/arch.h) */
    int int8_x;       /* `--gpu-activations int8`: INT4 weights' one-row GEMVs with x
                         quantized to int8 in blocks of 32 (the streaming kernel's dp4a form) */
    unsigned skip_ops; /* ATLAS_SKIP_* bits: those ops are left out of every batch, to time
                          what the others cost inside a decode graph; the results are wrong */
    int load;         /* made by a model's load, which calls the op `loaded` when it is over:
                         until then the device memory is ordered on the load's side (the copy
                         stream, beside the models serving); 0: on the serving stream from
                         creation, as a backend used directly (tests, atlas bench) wants it */
} atlas_backend_options;

/* Creates the CUDA backend on the process host (ATLAS_ERR_NO_DEVICE when there is none,
 * with the reason); opts NULL: the defaults. Defined in backend/cuda. */
atlas_status atlas_backend_cuda_create(const atlas_backend_geom *geom,
                                       const atlas_backend_options *opts, atlas_backend **out);

#endif

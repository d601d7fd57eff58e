/* model/config.h — a model's config.json and generation_config.json.  Internal.
 *
 * Both config styles are read: the classic keys (rope_theta, rope_scaling, torch_dtype) and
 * transformers 5's (rope_parameters, dtype). head_dim is explicit or hidden / n_heads (Qwen3:
 * 128, Qwen3Config's default). Absent optional fields take the defaults of transformers'
 * config class: tie_word_embeddings false, rms_norm_eps 1e-6, rope_theta 10000, Mistral's
 * sliding_window 4096. Qwen2/Qwen3 slide only with use_sliding_window, on layers >=
 * max_window_layers (or as layer_types says): ask atlas_config_layer_sliding per layer.
 * Biases: Llama's attention_bias covers q/k/v/o, Qwen3's too, Qwen2 has q/k/v always and
 * never o, Mistral none; mlp_bias is Llama's only. Phi3 (Phi3Config's defaults: rms_norm_eps
 * 1e-5, max_position_embeddings 4096) has no biases, slides on every layer when
 * sliding_window is set, and may rotate part of each head (partial_rotary_factor, top level
 * or in the RoPE dict) with longrope. hidden_act must be silu (or swish, its
 * other name): the MLP is SwiGLU; another activation is refused by name.
 * Gemma 3 (Gemma3ForCausalLM, and the text model of Gemma3ForConditionalGeneration, whose
 * text_config may omit any field: Gemma3TextConfig's defaults are built in) uses every norm
 * weight as (1 + w), norms the attention and MLP outputs before their residual adds, gates
 * with GeLU-tanh, scales the embedding by sqrt(hidden) and the scores by
 * query_pre_attn_scalar^-0.5, and interleaves sliding layers (their own RoPE base,
 * rope_local_base_freq) with full ones (rope_theta and rope_scaling) as layer_types or
 * sliding_window_pattern says: ask atlas_config_layer_rope_set per layer. Gemma 2's
 * soft-capping is refused by name. Qwen3-MoE (Qwen3's attention, head_dim derived when
 * absent) and Mixtral (Mistral's, rms_norm_eps 1e-5, rope_theta 1e6, no window) route each
 * token to experts in their MoE layers (model/config_moe.h; docs/MODELS.md): ask
 * atlas_config_layer_moe per layer. gpt-oss (GptOssConfig's defaults: head_dim 64, 8 kv
 * heads, rms_norm_eps 1e-5, sliding_window 128 on the even layers unless layer_types says,
 * YaRN with factor 32 over 4096 positions and rope_theta 150000, attention_bias true) has
 * biases on q/k/v/o, attention sinks, and MoE layers everywhere (config_moe.h). */
#ifndef ATLAS_MODEL_CONFIG_H
#define ATLAS_MODEL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#include "atlas/model.h"
#include "atlas/status.h"
#include "core/dtype.h"
#include "model/quant.h"

typedef enum atlas_arch {
    ATLAS_ARCH_LLAMA = 0, /* LlamaForCausalLM */
    ATLAS_ARCH_MISTRAL,   /* MistralForCausalLM */
    ATLAS_ARCH_QWEN2,     /* Qwen2ForCausalLM: q/k/v biases */
    ATLAS_ARCH_QWEN3,     /* Qwen3ForCausalLM: q/k RMSNorm, no biases */
    ATLAS_ARCH_PHI3,      /* Phi3ForCausalLM (Phi-3, Phi-4, Phi-4-mini): fused qkv_proj and
                             gate_up_proj, partial rotary, longrope */
    ATLAS_ARCH_GEMMA3,    /* Gemma3ForCausalLM, Gemma3ForConditionalGeneration's text model */
    ATLAS_ARCH_QWEN3_MOE, /* Qwen3MoeForCausalLM: Qwen3's attention, mixture-of-experts MLPs */
    ATLAS_ARCH_MIXTRAL,   /* MixtralForCausalLM: Mistral's attention, mixture-of-experts MLPs */
    ATLAS_ARCH_GPT_OSS,   /* GptOssForCausalLM: biases, attention sinks, sliding and full
                             layers, MoE with top-k-then-softmax routing and a clamped SwiGLU */
} atlas_arch;

/* A mixture-of-experts model's layers: the experts of each MoE layer (model/config_moe.c). */
enum { ATLAS_MAX_EXPERTS = 1024, ATLAS_MAX_EXPERTS_USED = 64 };

/* The MLP's gate activation: act(gate) * up. */
typedef enum atlas_act {
    ATLAS_ACT_SILU = 0,  /* SwiGLU */
    ATLAS_ACT_GELU_TANH, /* GeGLU with the tanh approximation (gelu_pytorch_tanh) */
    ATLAS_ACT_SWIGLU_CLAMP, /* gpt-oss's experts: (clamp(up) + 1) * g * sigmoid(alpha * g),
                               g = min(gate, swiglu_limit) */
} atlas_act;

enum { ATLAS_MAX_LAYERS = 4096 };

typedef enum atlas_rope_type {
    ATLAS_ROPE_DEFAULT = 0,
    ATLAS_ROPE_LINEAR,
    ATLAS_ROPE_LLAMA3,
    ATLAS_ROPE_YARN,
    ATLAS_ROPE_LONGROPE, /* Phi-3/Phi-4: per-frequency short and long factors */
} atlas_rope_type;

/* longrope factors: one per rotated frequency (rope_dim / 2 of them). */
enum { ATLAS_MAX_ROPE_FACTORS = 256 };

typedef struct atlas_rope {
    atlas_rope_type type;
    double theta;                /* rope_theta (base) */
    double factor;               /* linear, llama3, yarn */
    double low_freq_factor;      /* llama3 */
    double high_freq_factor;     /* llama3 */
    int original_max_position;   /* llama3, yarn */
    double beta_fast, beta_slow; /* yarn (defaults 32, 1) */
    double mscale, mscale_all_dim; /* yarn (0 when absent) */
    double attention_factor;     /* yarn; 0 when absent (then derived from factor) */
    bool truncate;               /* yarn: transformers' "truncate" (default true) */
    /* longrope: a sequence whose context is above original_max_position rotates with
     * long_factor, else with short_factor (see atlas_rope_inv_freq_long) */
    int n_factors;
    double short_factor[ATLAS_MAX_ROPE_FACTORS], long_factor[ATLAS_MAX_ROPE_FACTORS];
} atlas_rope;

enum { ATLAS_MAX_EOS = 16 };

/* How an embedding model makes one vector of a sequence's final-norm hidden states
 * (sentence-transformers' Pooling module); NONE: a generative model. */
typedef enum atlas_pooling {
    ATLAS_POOL_NONE = 0,
    ATLAS_POOL_MEAN, /* the mean over the sequence's tokens */
    ATLAS_POOL_LAST, /* the last token's (Qwen3-Embedding: the appended eos) */
    ATLAS_POOL_CLS,  /* the first token's */
} atlas_pooling;

enum { ATLAS_MAX_MATRYOSHKA = 32 };

typedef struct atlas_config {
    atlas_arch arch;
    char architecture[64];     /* as written in config.json */
    int vocab_size;            /* rows of the embedding (may exceed the tokenizer's strings) */
    int hidden;                /* hidden_size */
    int n_layers;              /* num_hidden_layers */
    int n_heads;               /* num_attention_heads */
    int n_kv_heads;            /* num_key_value_heads (defaults to n_heads) */
    int head_dim;              /* explicit or hidden / n_heads */
    int rope_dim;              /* dims of a head that rotate: head_dim * partial_rotary_factor
                                  (Phi-4-mini: 96 of 128); the rest pass through */
    int intermediate;          /* intermediate_size */
    int max_position;          /* max_position_embeddings */
    double rms_eps;            /* rms_norm_eps */
    bool tie_embeddings;       /* tie_word_embeddings */
    bool qkv_bias;             /* attention_bias (Qwen2: always true) */
    bool o_bias;               /* o_proj bias: attention_bias for Llama and Qwen3 */
    bool mlp_bias;             /* gate/up/down biases: Llama's mlp_bias */
    bool qk_norm;              /* Qwen3 */
    bool fused_proj;           /* Phi3: qkv_proj and gate_up_proj are single tensors */
    int sliding_window;        /* 0 when none */
    int sliding_from_layer;    /* layers >= this use sliding_window (when it is not 0), unless
                                  layer_kinds */
    bool layer_kinds;          /* layer_sliding says each layer's kind (layer_types, Gemma 3's
                                  sliding_window_pattern) */
    unsigned char layer_sliding[ATLAS_MAX_LAYERS]; /* 1: a sliding_attention layer */
    atlas_act act;             /* hidden_act / Gemma 3's hidden_activation */
    bool norm_plus_one;        /* Gemma 3: every RMSNorm weight w is used as (1 + w) */
    bool post_norms;           /* Gemma 3: pre_feedforward_layernorm before the MLP, and
                                  post_attention_layernorm / post_feedforward_layernorm on the
                                  attention and MLP outputs before their residual adds */
    double embed_scale;        /* the embedding rows are multiplied by it (Gemma 3: sqrt(hidden)
                                  rounded to float32); 1 otherwise */
    double attn_scale;         /* the scores are q.k times it: Gemma 3's
                                  query_pre_attn_scalar^-0.5; 0: 1/sqrt(head_dim) */
    /* Mixture of experts (n_experts 0: a dense model): a MoE layer routes each token to
     * n_experts_used of its n_experts SwiGLU experts of expert_ffn columns (Qwen3-MoE's
     * moe_intermediate_size, Mixtral's intermediate_size), their weights renormalised to
     * sum 1 when moe_norm_topk (Qwen3-MoE's norm_topk_prob; Mixtral always); the other
     * layers keep the dense MLP of intermediate columns. */
    int n_experts;
    int n_experts_used;
    int expert_ffn;
    bool moe_norm_topk;
    /* gpt-oss: the router takes the top k of its logits (with its bias), then a softmax over
     * the k; the experts have biases and gate with swiglu_alpha and swiglu_limit; each
     * attention head has a sink (self_attn.sinks) */
    bool moe_topk_softmax;
    bool moe_bias;
    double swiglu_alpha, swiglu_limit;
    bool attn_sinks;
    unsigned char layer_moe[ATLAS_MAX_LAYERS]; /* 1: layer l's MLP is a MoE layer */
    bool nested_text;          /* Gemma3ForConditionalGeneration: the text model's weights
                                  under language_model.model. or model.language_model. */
    atlas_dtype dtype;         /* torch_dtype / dtype (BF16 when absent) */
    atlas_rope rope;           /* every layer's, or the full-attention layers' with rope_local */
    bool has_rope_local;       /* sliding layers rotate with rope_local (Gemma 3) */
    atlas_rope rope_local;
    atlas_quant_config quant;  /* quantization_config (method NONE when absent) */
    int bos_id;                /* -1 when absent */
    int eos_ids[ATLAS_MAX_EOS];/* union of config.json and generation_config.json */
    int n_eos;
    /* generation_config.json defaults (0 / -1 when absent) */
    double gen_temperature;
    double gen_top_p;
    int gen_top_k;
    double gen_repetition_penalty;
    int gen_do_sample;         /* -1 when absent, else 0 / 1 */
    double gen_min_p;
    int gen_max_new_tokens;    /* 0 when absent */
    unsigned gen_set;          /* ATLAS_GEN_* bits (atlas/model.h) of the fields present */
    /* An embedding model (model/pooling.h: modules.json, 1_Pooling/config.json): no output
     * head is bound, its requests get a pooled vector instead of tokens. */
    atlas_pooling pooling;
    bool normalize;            /* a Normalize module follows the pooling: L2-normalised */
    /* the widths the model was trained to be cut to (vLLM's matryoshka_dimensions, with
     * is_matryoshka); none: a vector is never shortened */
    int matryoshka[ATLAS_MAX_MATRYOSHKA];
    int n_matryoshka;
    bool matryoshka_any;       /* is_matryoshka without a list: any width 1..hidden */
} atlas_config;

/* Reads DIR/config.json and, when present, DIR/generation_config.json. Errors name the file
 * and the field. */
atlas_status atlas_config_load(const char *dir, atlas_config *out);

/* Parses config.json text (name is used in messages). Used by the loader and the fuzzer. */
atlas_status atlas_config_parse(const char *json, size_t len, const char *name, atlas_config *out);
/* Merges generation_config.json text into cfg (eos ids union, sampling defaults). */
atlas_status atlas_config_parse_generation(const char *json, size_t len, const char *name,
                                           atlas_config *cfg);

/* The sampling defaults of cfg's generation_config.json, as atlas_model_generation_defaults
 * gives them. */
void atlas_config_generation_defaults(const atlas_config *cfg, atlas_generation_defaults *out);

/* Adds an eos id if not already present (used for the tokenizer's eos token). */
void atlas_config_add_eos(atlas_config *cfg, int id);

/* The longest sequence the model is meant for, as vLLM derives it: max_position_embeddings
 * (4096 when absent), times the factor for linear RoPE scaling; yarn's original maximum
 * times its factor; llama3 configs already give the scaled maximum. Always 1..INT32_MAX:
 * atlas_config_parse refuses a factor that derives anything else, naming it. */
long atlas_config_max_context(const atlas_config *cfg);

/* Whether layer `layer`'s MLP is a mixture of experts. */
bool atlas_config_layer_moe(const atlas_config *cfg, int layer);

/* Whether layer `layer` attends over a sliding window (of cfg->sliding_window tokens). */
bool atlas_config_layer_sliding(const atlas_config *cfg, int layer);
/* The RoPE set layer `layer` rotates with: 0 (cfg->rope), or 1 (cfg->rope_local: a sliding
 * layer of a config with per-layer-type RoPE). */
int atlas_config_layer_rope_set(const atlas_config *cfg, int layer);

#endif

"""The model shapes of the conformance suite (issue 23, parts 5 and 7) and its prompts.

BIG: published shapes at their real widths (hidden size, heads, head_dim, vocabulary, RoPE)
with 2 layers (num_hidden_layers where an entry gives it: enough for every layer type), plus
made-up ones where no listed model has the feature.  SMALL: small widths
kept in tests/data/small/ for the CPU tests in CI.  Each entry is a transformers config (as the
model's config.json has it, with either RoPE spelling), the prompt lengths it is checked at,
and the tokenizer it is served with.

Prompt ids come from prompt_ids(), which bench/conformance/conform.c computes the same way.
"""

LLAMA = "LlamaForCausalLM"
MISTRAL = "MistralForCausalLM"
QWEN2 = "Qwen2ForCausalLM"
QWEN3 = "Qwen3ForCausalLM"
PHI3 = "Phi3ForCausalLM"
GEMMA3 = "Gemma3ForCausalLM"
QWEN3_MOE = "Qwen3MoeForCausalLM"
MIXTRAL = "MixtralForCausalLM"
GPT_OSS = "GptOssForCausalLM"

# config.json's model_type of each architecture
MODEL_TYPE = {LLAMA: "llama", MISTRAL: "mistral", QWEN2: "qwen2", QWEN3: "qwen3", PHI3: "phi3",
              GEMMA3: "gemma3_text", QWEN3_MOE: "qwen3_moe", MIXTRAL: "mixtral", GPT_OSS: "gpt_oss"}

BIG_LENGTHS = [1, 7, 511, 512, 513, 2600, 8192, 32768]
FORCED = 16  # decode steps after the prompt, the reference's greedy tokens fed in turn
TOPK = 64    # reference log-probs stored per position


def _gpt_oss_yarn(omax):
    """gpt-oss's YaRN: factor 32, not truncated (its config.json spells it so)."""
    return {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "truncate": False, "original_max_position_embeddings": omax}


def _gpt_oss(**kw):
    """A gpt-oss entry: GptOssConfig's fields as openai/gpt-oss-20b's config.json has them,
    a sliding (first) and a full layer; experts="mxfp4" writes its experts in MXFP4
    (tools/conformance/gpt_oss.py), "chunk" bounds the reference's eager attention."""
    base = dict(architectures=[GPT_OSS], num_hidden_layers=2,
                layer_types=["sliding_attention", "full_attention"], attention_bias=True,
                rope_theta=150000.0, rms_norm_eps=1e-5, swiglu_limit=7.0, hidden_act="silu",
                router_aux_loss_coef=0.9, output_router_logits=False, tie_word_embeddings=False,
                chunk=512)
    base.update(kw)
    return base


def _llama3(factor, omax=8192):
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": omax}


BIG = {
    # meta-llama/Llama-3.1-8B (rope_scaling spelling)
    "llama3.1-8b": dict(architectures=[LLAMA], hidden_size=4096, intermediate_size=14336,
                        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                        max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
                        tie_word_embeddings=False, rope_scaling=_llama3(8.0),
                        bos_token_id=128000, eos_token_id=128001, tok="llama3"),
    # meta-llama/Llama-3.2-1B: tied, llama3 factor 32 (transformers-5 rope_parameters spelling)
    "llama3.2-1b": dict(architectures=[LLAMA], hidden_size=2048, intermediate_size=8192,
                        num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                        vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5,
                        tie_word_embeddings=True,
                        rope_parameters=dict(rope_theta=500000.0, **_llama3(32.0)),
                        bos_token_id=128000, eos_token_id=128001, tok="llama3"),
    # meta-llama/Llama-2-7b-hf: MHA, 4,096 positions
    "llama2-7b": dict(architectures=[LLAMA], hidden_size=4096, intermediate_size=11008,
                      num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                      max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-5,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, tok="llama2"),
    # mistralai/Mistral-7B-v0.3
    "mistral-7b-v0.3": dict(architectures=[MISTRAL], hidden_size=4096, intermediate_size=14336,
                            num_attention_heads=32, num_key_value_heads=8, vocab_size=32768,
                            max_position_embeddings=32768, rope_theta=1000000.0,
                            rms_norm_eps=1e-5, sliding_window=None, tie_word_embeddings=False,
                            bos_token_id=1, eos_token_id=2, tok="llama2"),
    # Qwen/Qwen2.5-0.5B: 14 / 2 heads of 64, qkv bias, tied
    "qwen2.5-0.5b": dict(architectures=[QWEN2], hidden_size=896, intermediate_size=4864,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                         max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                         tie_word_embeddings=True, use_sliding_window=False,
                         sliding_window=32768, max_window_layers=24,
                         bos_token_id=151643, eos_token_id=151643, tok="qwen3"),
    # Qwen/Qwen2.5-7B: 28 / 4 heads of 128, qkv bias, untied
    "qwen2.5-7b": dict(architectures=[QWEN2], hidden_size=3584, intermediate_size=18944,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                       max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                       tie_word_embeddings=False, use_sliding_window=False,
                       sliding_window=131072, max_window_layers=28,
                       bos_token_id=151643, eos_token_id=151643, tok="qwen3"),
    # Qwen/Qwen3-0.6B: q/k norm, head_dim 128 with hidden 1024, tied
    "qwen3-0.6b": dict(architectures=[QWEN3], hidden_size=1024, intermediate_size=3072,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0,
                       rms_norm_eps=1e-6, tie_word_embeddings=True,
                       bos_token_id=151643, eos_token_id=151645, tok="qwen3"),
    # Qwen/Qwen3-8B
    "qwen3-8b": dict(architectures=[QWEN3], hidden_size=4096, intermediate_size=12288,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0,
                     rms_norm_eps=1e-6, tie_word_embeddings=False,
                     bos_token_id=151643, eos_token_id=151645, tok="qwen3"),
    # made up: head_dim 80, 96 and 256; one KV head (MQA); Mistral v0.1's 4,096-token window
    "hd80": dict(architectures=[LLAMA], hidden_size=2560, intermediate_size=6912,
                 num_attention_heads=32, num_key_value_heads=8, head_dim=80, vocab_size=32000,
                 max_position_embeddings=8192, rope_theta=10000.0, rms_norm_eps=1e-5,
                 tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, tok="llama2"),
    "hd96": dict(architectures=[LLAMA], hidden_size=3072, intermediate_size=8192,
                 num_attention_heads=32, num_key_value_heads=8, head_dim=96, vocab_size=32000,
                 max_position_embeddings=8192, rope_theta=10000.0, rms_norm_eps=1e-5,
                 tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, tok="llama2"),
    "hd256": dict(architectures=[QWEN3], hidden_size=2048, intermediate_size=6144,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                  vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0,
                  rms_norm_eps=1e-6, tie_word_embeddings=True,
                  bos_token_id=151643, eos_token_id=151645, tok="qwen3"),
    "mqa": dict(architectures=[LLAMA], hidden_size=2048, intermediate_size=5632,
                num_attention_heads=16, num_key_value_heads=1, vocab_size=128256,
                max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
                tie_word_embeddings=False, rope_scaling=_llama3(8.0),
                bos_token_id=128000, eos_token_id=128001, tok="llama3"),
    # microsoft/phi-4: fused qkv_proj / gate_up_proj, 40 / 10 heads of 128, untied
    "phi-4": dict(architectures=[PHI3], hidden_size=5120, intermediate_size=17920,
                  num_attention_heads=40, num_key_value_heads=10, vocab_size=100352,
                  max_position_embeddings=16384, original_max_position_embeddings=16384,
                  rope_theta=250000.0, rms_norm_eps=1e-5, sliding_window=None,
                  tie_word_embeddings=False, bos_token_id=100257, eos_token_id=100265,
                  tok="llama3", lengths=[1, 7, 511, 513, 2600, 8192]),
    # microsoft/Phi-4-mini-instruct: 3/4 of each head rotated, longrope past 4,096 (the
    # factors below are made up, 48 of each: the published ones are in its config.json);
    # lengths on both sides of 4,096, the forced steps of 4,095 crossing it while decoding
    "phi-4-mini": dict(architectures=[PHI3], hidden_size=3072, intermediate_size=8192,
                       num_attention_heads=24, num_key_value_heads=8, vocab_size=200064,
                       max_position_embeddings=131072, original_max_position_embeddings=4096,
                       partial_rotary_factor=0.75, rope_theta=10000.0, rms_norm_eps=1e-5,
                       rope_scaling={"type": "longrope",
                                     "short_factor": [1.0 + 0.02 * i for i in range(48)],
                                     "long_factor": [1.0 + 1.5 * i for i in range(48)]},
                       sliding_window=None, tie_word_embeddings=True,
                       bos_token_id=199999, eos_token_id=199999, tok="llama3",
                       lengths=[1, 7, 513, 4090, 4095, 4097, 8192]),
    # google/gemma-3-1b-it: six layers, five local (window 512, base 10,000) and one global
    # (base 1e6); 4 / 1 heads of 256, GeGLU, (1 + w) norms and post-norms, tied
    "gemma3-1b": dict(architectures=[GEMMA3], hidden_size=1152, intermediate_size=6912,
                      num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                      num_hidden_layers=6, vocab_size=262144, max_position_embeddings=32768,
                      rope_theta=1000000.0, rope_local_base_freq=10000.0, sliding_window=512,
                      sliding_window_pattern=6, query_pre_attn_scalar=256, rms_norm_eps=1e-6,
                      hidden_activation="gelu_pytorch_tanh", rope_scaling=None,
                      final_logit_softcapping=None, attn_logit_softcapping=None,
                      tie_word_embeddings=True, bos_token_id=2, eos_token_id=[1, 106],
                      tok="gemma3", lengths=[1, 7, 511, 513, 2600, 8192]),
    # google/gemma-3-27b-it's text model (published as Gemma3ForConditionalGeneration, whose
    # nesting tests/test-families.c covers): 32 / 16 heads of 128 with query_pre_attn_scalar
    # 168, window 1,024, linear factor 8 on the global layer only; six layers, five local
    "gemma3-27b": dict(architectures=[GEMMA3], hidden_size=5376, intermediate_size=21504,
                       num_attention_heads=32, num_key_value_heads=16, head_dim=128,
                       num_hidden_layers=6, vocab_size=262208, max_position_embeddings=131072,
                       rope_theta=1000000.0, rope_local_base_freq=10000.0, sliding_window=1024,
                       sliding_window_pattern=6, query_pre_attn_scalar=168, rms_norm_eps=1e-6,
                       hidden_activation="gelu_pytorch_tanh",
                       rope_scaling={"rope_type": "linear", "factor": 8.0},
                       final_logit_softcapping=None, attn_logit_softcapping=None,
                       tie_word_embeddings=True, bos_token_id=2, eos_token_id=[1, 106],
                       tok="gemma3", lengths=[1, 7, 1023, 1025, 2600, 8192]),
    # Qwen/Qwen3-30B-A3B: 32 / 4 heads of 128, q/k norm, 128 experts of 768, top 8
    # renormalised, every layer a MoE layer (its dense intermediate_size unused), untied
    "qwen3-30b-a3b": dict(architectures=[QWEN3_MOE], hidden_size=2048, intermediate_size=6144,
                          moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                          norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                          num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                          vocab_size=151936, max_position_embeddings=40960,
                          rope_theta=1000000.0, rms_norm_eps=1e-6, use_sliding_window=False,
                          sliding_window=None, tie_word_embeddings=False,
                          bos_token_id=151643, eos_token_id=151645, tok="qwen3"),
    # mistralai/Mixtral-8x7B-v0.1: 32 / 8 heads of 128, 8 experts of 14,336, top 2
    "mixtral-8x7b": dict(architectures=[MIXTRAL], hidden_size=4096, intermediate_size=14336,
                         num_local_experts=8, num_experts_per_tok=2, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=32000, max_position_embeddings=32768,
                         rope_theta=1000000.0, rms_norm_eps=1e-5, sliding_window=None,
                         router_jitter_noise=0.0, tie_word_embeddings=False, bos_token_id=1,
                         eos_token_id=2, tok="llama2"),
    # openai/gpt-oss-20b: 64 / 8 heads of 64 on hidden 2,880 (not a multiple of 128), 32
    # experts of 2,880, top 4 then softmax, sinks, a 128-token window on the first layer and
    # full attention on the second, YaRN factor 32 over 4,096; its experts in MXFP4 as
    # published, and in bf16
    "gpt-oss-20b": _gpt_oss(hidden_size=2880, intermediate_size=2880, num_local_experts=32,
                            num_experts_per_tok=4, experts_per_token=4, num_attention_heads=64,
                            num_key_value_heads=8, head_dim=64, vocab_size=201088,
                            max_position_embeddings=131072, sliding_window=128,
                            rope_scaling=_gpt_oss_yarn(4096), initial_context_length=4096,
                            pad_token_id=199999, eos_token_id=200002, tok="llama3",
                            experts="mxfp4", lengths=[1, 7, 127, 129, 2600, 8192, 32768]),
    "gpt-oss-20b-bf16": _gpt_oss(hidden_size=2880, intermediate_size=2880,
                                 num_local_experts=32, num_experts_per_tok=4,
                                 experts_per_token=4, num_attention_heads=64,
                                 num_key_value_heads=8, head_dim=64, vocab_size=201088,
                                 max_position_embeddings=131072, sliding_window=128,
                                 rope_scaling=_gpt_oss_yarn(4096), initial_context_length=4096,
                                 pad_token_id=199999, eos_token_id=200002, tok="llama3",
                                 lengths=[1, 7, 127, 129, 2600, 8192, 32768]),
    # mistralai/Mistral-7B-v0.1: sliding window 4,096 (run at 8,192)
    "mistral-7b-v0.1-sw": dict(architectures=[MISTRAL], hidden_size=4096,
                               intermediate_size=14336, num_attention_heads=32,
                               num_key_value_heads=8, vocab_size=32000,
                               max_position_embeddings=32768, rope_theta=10000.0,
                               rms_norm_eps=1e-5, sliding_window=4096,
                               tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                               tok="llama2", lengths=[1, 7, 513, 4095, 4097, 8192]),
}

SMALL_LENGTHS = [1, 7, 40, 63, 64, 65, 200]

SMALL = {
    # odd head counts: 3 query heads on 1 KV head, hd 16
    "odd-heads": dict(architectures=[LLAMA], hidden_size=48, intermediate_size=96,
                      num_attention_heads=3, num_key_value_heads=1, vocab_size=512,
                      max_position_embeddings=2048, rope_theta=10000.0, rms_norm_eps=1e-5,
                      tie_word_embeddings=False),
    # MHA with 5 heads, tied
    "mha5": dict(architectures=[LLAMA], hidden_size=40, intermediate_size=80,
                 num_attention_heads=5, num_key_value_heads=5, vocab_size=512,
                 max_position_embeddings=2048, rope_theta=10000.0, rms_norm_eps=1e-5,
                 tie_word_embeddings=True),
    # Qwen2: 6 / 2 heads, qkv bias
    "qkv-bias": dict(architectures=[QWEN2], hidden_size=48, intermediate_size=96,
                     num_attention_heads=6, num_key_value_heads=2, vocab_size=512,
                     max_position_embeddings=2048, rope_theta=1000000.0, rms_norm_eps=1e-6,
                     tie_word_embeddings=True, use_sliding_window=False),
    # Llama with every bias: attention_bias (q/k/v and o_proj) and mlp_bias (gate/up/down),
    # 6 / 2 heads of 8, untied
    "llama-biases": dict(architectures=[LLAMA], hidden_size=48, intermediate_size=96,
                         num_attention_heads=6, num_key_value_heads=2, vocab_size=512,
                         max_position_embeddings=2048, rope_theta=10000.0, rms_norm_eps=1e-5,
                         attention_bias=True, mlp_bias=True, hidden_act="silu",
                         tie_word_embeddings=False),
    # Qwen3 with attention_bias: q/k/v biases before the q/k norm and o_proj's, tied
    "qwen3-attn-bias": dict(architectures=[QWEN3], hidden_size=32, intermediate_size=64,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                            vocab_size=512, max_position_embeddings=2048, rope_theta=1000000.0,
                            rms_norm_eps=1e-6, attention_bias=True, tie_word_embeddings=True),
    # Qwen3: q/k norm, explicit head_dim 16 with hidden 32
    "qk-norm": dict(architectures=[QWEN3], hidden_size=32, intermediate_size=64,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512,
                    max_position_embeddings=2048, rope_theta=1000000.0, rms_norm_eps=1e-6,
                    tie_word_embeddings=True),
    # each RoPE type, in both spellings
    "rope-linear": dict(architectures=[LLAMA], hidden_size=32, intermediate_size=64,
                        num_attention_heads=2, num_key_value_heads=1, vocab_size=512,
                        max_position_embeddings=1024, rope_theta=10000.0, rms_norm_eps=1e-5,
                        rope_scaling={"rope_type": "linear", "factor": 4.0},
                        tie_word_embeddings=False),
    "rope-llama3": dict(architectures=[LLAMA], hidden_size=32, intermediate_size=64,
                        num_attention_heads=2, num_key_value_heads=1, vocab_size=512,
                        max_position_embeddings=4096,
                        rope_parameters=dict(rope_theta=500000.0, **_llama3(8.0, 256)),
                        rms_norm_eps=1e-5, tie_word_embeddings=True),
    "rope-yarn": dict(architectures=[QWEN2], hidden_size=32, intermediate_size=64,
                      num_attention_heads=2, num_key_value_heads=1, vocab_size=512,
                      max_position_embeddings=1024, rope_theta=1000000.0, rms_norm_eps=1e-6,
                      rope_scaling={"type": "yarn", "factor": 4.0,
                                    "original_max_position_embeddings": 256},
                      tie_word_embeddings=True, use_sliding_window=False),
    "rope-yarn-attn": dict(architectures=[LLAMA], hidden_size=32, intermediate_size=64,
                           num_attention_heads=2, num_key_value_heads=1, vocab_size=512,
                           max_position_embeddings=2048, rms_norm_eps=1e-5,
                           rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                            "factor": 8.0, "attention_factor": 1.2,
                                            "beta_fast": 16, "beta_slow": 2,
                                            "original_max_position_embeddings": 256},
                           tie_word_embeddings=False),
    # YaRN as Qwen2.5's model cards tell users to turn it on: factor 4 with
    # original_max_position_embeddings equal to max_position_embeddings (transformers once
    # replaced the factor by their ratio, 1, when both were there: the reference settles what
    # the installed transformers does)
    "rope-yarn-qwen": dict(architectures=[QWEN2], hidden_size=32, intermediate_size=64,
                           num_attention_heads=2, num_key_value_heads=1, vocab_size=512,
                           max_position_embeddings=2048, rope_theta=10000.0, rms_norm_eps=1e-6,
                           rope_scaling={"type": "yarn", "factor": 4.0,
                                         "original_max_position_embeddings": 2048},
                           tie_word_embeddings=True, use_sliding_window=False),
    # YaRN as DeepSeek-V3 spells it (mscale / mscale_all_dim give the attention factor) and
    # gpt-oss's truncate false
    "rope-yarn-mscale": dict(architectures=[LLAMA], hidden_size=32, intermediate_size=64,
                             num_attention_heads=2, num_key_value_heads=1, vocab_size=512,
                             max_position_embeddings=1024, rms_norm_eps=1e-5,
                             rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                              "factor": 4.0, "mscale": 1.0,
                                              "mscale_all_dim": 0.5, "truncate": False,
                                              "original_max_position_embeddings": 256},
                             tie_word_embeddings=False),
    # Phi3: fused projections, half of each head rotated, longrope over 64 of 256 (prompts
    # on both sides of 64; the forced steps after 63 and 64 cross it while decoding)
    "phi3-longrope": dict(architectures=[PHI3], hidden_size=64, intermediate_size=96,
                          num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                          max_position_embeddings=256, original_max_position_embeddings=64,
                          partial_rotary_factor=0.5, rope_theta=10000.0, rms_norm_eps=1e-5,
                          rope_scaling={"type": "longrope",
                                        "short_factor": [1.0, 1.1, 1.2, 1.3],
                                        "long_factor": [2.0, 3.0, 5.0, 8.0]},
                          tie_word_embeddings=True,
                          pad_token_id=0),  # Phi3Config's default, 32000, is past the vocabulary
    # Gemma 3: 7 layers (five local with a 16-token window and base 10,000, one global with
    # base 1e6 and linear factor 2, one local again), 4 / 2 heads of 32 scaled by
    # query_pre_attn_scalar 24, GeGLU, (1 + w) norms, post-norms, tied
    "gemma3": dict(architectures=[GEMMA3], hidden_size=64, intermediate_size=128,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                   num_hidden_layers=7, vocab_size=512, max_position_embeddings=2048,
                   rope_theta=1000000.0, rope_local_base_freq=10000.0,
                   rope_scaling={"rope_type": "linear", "factor": 2.0}, sliding_window=16,
                   sliding_window_pattern=6, query_pre_attn_scalar=24, rms_norm_eps=1e-6,
                   hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True),
    # Qwen3-MoE: 8 experts of 16, top 2 renormalised, three layers with the middle one
    # dense (mlp_only_layers: a MoE, a dense and a MoE layer), 4 / 2 heads of 16, untied
    "qwen3-moe": dict(architectures=[QWEN3_MOE], hidden_size=32, intermediate_size=64,
                      moe_intermediate_size=16, num_experts=8, num_experts_per_tok=2,
                      norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1],
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      num_hidden_layers=3, vocab_size=512, max_position_embeddings=2048,
                      rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False),
    # Mixtral: 8 experts of 48, top 2, block_sparse_moe's w1/w3/w2, 4 / 2 heads of 8
    "mixtral": dict(architectures=[MIXTRAL], hidden_size=32, intermediate_size=48,
                    num_local_experts=8, num_experts_per_tok=2, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=512, max_position_embeddings=2048,
                    rope_theta=1000000.0, rms_norm_eps=1e-5, sliding_window=None,
                    tie_word_embeddings=False),
    # gpt-oss: 8 / 1 heads of 16 (the published 8:1), hidden 64, 8 experts of 64 with top 4
    # then softmax, biases everywhere, sinks, a 16-token window on the first layer and full
    # attention on the second, YaRN factor 32 over 64 (not truncated); its experts in bf16,
    # and in MXFP4
    "gpt-oss": _gpt_oss(hidden_size=64, intermediate_size=64, num_local_experts=8,
                        num_experts_per_tok=4, num_attention_heads=8, num_key_value_heads=1,
                        head_dim=16, vocab_size=512, max_position_embeddings=2048,
                        sliding_window=16, rope_scaling=_gpt_oss_yarn(64)),
    "gpt-oss-mxfp4": _gpt_oss(hidden_size=64, intermediate_size=64, num_local_experts=8,
                              num_experts_per_tok=4, num_attention_heads=8,
                              num_key_value_heads=1, head_dim=16, vocab_size=512,
                              max_position_embeddings=2048, sliding_window=16,
                              rope_scaling=_gpt_oss_yarn(64), experts="mxfp4"),
    # Mistral's sliding window, prompts past it
    "sliding": dict(architectures=[MISTRAL], hidden_size=32, intermediate_size=64,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                    max_position_embeddings=2048, rope_theta=10000.0, rms_norm_eps=1e-5,
                    sliding_window=16, tie_word_embeddings=False),
}


def lengths(name, cfg, big):
    """The prompt lengths a model is checked at: those that, with the forced steps, fit."""
    ls = cfg.get("lengths") or (BIG_LENGTHS if big else SMALL_LENGTHS)
    return [n for n in ls if n + FORCED + 1 <= cfg["max_position_embeddings"]]


def prompt_ids(n, seed, lo=100, hi=None):
    """n ids in [lo, hi) from the LCG of bench/serve/loadgen (conform.c has its twin)."""
    hi = hi or 32000
    s, out = seed, []
    for _ in range(n):
        s = (s * 1103515245 + 12345) % 2147483648
        out.append(lo + s % (hi - lo))
    return out


def prompt_range(cfg):
    """Ordinary tokens of every tokenizer used here, inside the model's vocabulary."""
    return 100, min(cfg["vocab_size"], 32000)


def config_json(cfg):
    """The config.json dict: the entry without the suite's own keys."""
    return {k: v for k, v in cfg.items() if k not in ("tok", "lengths", "experts", "chunk")}

/* tests/test-config.c — config.json / generation_config.json on the fixtures and on variants
 * written at run time into a mkdtemp directory (both config styles, the four architectures,
 * sliding windows, eos unions, wrong types), and RoPE inverse frequencies for every type.
 *
 * Expected RoPE values were computed with a separate Python transcription of transformers'
 * modeling_rope_utils.py (_compute_default/linear/llama3/yarn_parameters, in float64); the
 * default and linear cases are also checkable by hand (10000^(-2i/8)). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "atlas/status.h"
#include "harness.h"
#include "model/config.h"
#include "model/rope.h"

static char tmpdir[256];
static int variant_no;

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f || fputs(text, f) < 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
    fclose(f);
}

/* A fresh directory holding config.json = cfg (and generation_config.json = gen if given).
 * Takes ownership of cfg and gen. Returns the directory (static, one at a time). */
static const char *variant_dir(json_t *cfg, json_t *gen) {
    static char dir[512];
    char path[600];
    snprintf(dir, sizeof dir, "%s/v%03d", tmpdir, ++variant_no);
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_dump_file(cfg, path, JSON_INDENT(2));
    if (gen) {
        snprintf(path, sizeof path, "%s/generation_config.json", dir);
        json_dump_file(gen, path, JSON_INDENT(2));
    }
    json_decref(cfg);
    json_decref(gen);
    return dir;
}

static json_t *fixture_json(const char *rel) {
    json_error_t err;
    json_t *j = json_load_file(harness_data_path(rel), 0, &err);
    if (!j) {
        fprintf(stderr, "%s: %s\n", rel, err.text);
        exit(2);
    }
    return j;
}

static json_t *llama(void) { return fixture_json("tiny-llama3/config.json"); }
static json_t *qwen3(void) { return fixture_json("tiny-qwen3/config.json"); }

/* Loads the variant; must succeed. */
static atlas_config load_ok(json_t *cfg, json_t *gen) {
    atlas_config c;
    const char *dir = variant_dir(cfg, gen);
    atlas_status s = atlas_config_load(dir, &c);
    CHECK_MSG(s == ATLAS_OK, "%s: %s", dir, atlas_last_error());
    return c;
}

/* Loads the variant; must fail with `want`, naming file (config.json or
 * generation_config.json, with its directory) and the field. */
static void load_fail(json_t *cfg, json_t *gen, atlas_status want, const char *file,
                      const char *fld) {
    atlas_config c;
    const char *dir = variant_dir(cfg, gen);
    atlas_status s = atlas_config_load(dir, &c);
    const char *msg = atlas_last_error();
    if (getenv("ATLAS_TEST_VERBOSE")) printf("  %s\n", msg);
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    CHECK_MSG(s == want, "%s: got %s (%s), want %s", dir, atlas_status_str(s), msg,
              atlas_status_str(want));
    CHECK_MSG(strstr(msg, path) != NULL, "message does not name %s: %s", path, msg);
    CHECK_MSG(strstr(msg, fld) != NULL, "message does not name '%s': %s", fld, msg);
}

static void set(json_t *o, const char *key, json_t *v) { json_object_set_new(o, key, v); }

static int has_eos(const atlas_config *c, int id) {
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == id) return 1;
    return 0;
}

static void check_close(const double *got, const double *want, const int *idx, int n,
                        const char *what) {
    for (int k = 0; k < n; k++) {
        /* float32 values (as transformers keeps them), rounded from the exact ones */
        double g = got[idx[k]], w = want[k];
        CHECK_MSG((double)(float)g == g && fabs(g - w) <= 0x1p-24 * fabs(w) * 1.000001,
                  "%s: inv_freq[%d] = %.17g, want float32 of %.17g", what, idx[k], g, w);
    }
}

/* ---- the fixtures ------------------------------------------------------------------------ */

static void test_fixtures(void) {
    atlas_config c;
    CHECK_OK(atlas_config_load(harness_data_path("tiny-llama3"), &c));
    CHECK(c.arch == ATLAS_ARCH_LLAMA && !strcmp(c.architecture, "LlamaForCausalLM"));
    CHECK(c.vocab_size == 128256 && c.hidden == 16 && c.n_layers == 2 && c.n_heads == 2);
    CHECK(c.n_kv_heads == 1 && c.head_dim == 8 && c.intermediate == 64);
    CHECK(c.max_position == 131072 && c.rms_eps == 1e-5);
    CHECK(c.tie_embeddings && !c.qkv_bias && !c.o_bias && !c.mlp_bias && !c.qk_norm);
    CHECK(c.sliding_window == 0 && !atlas_config_layer_sliding(&c, 1));
    CHECK(c.dtype == ATLAS_DTYPE_BF16);
    CHECK(c.rope.type == ATLAS_ROPE_LLAMA3 && c.rope.theta == 500000.0 && c.rope.factor == 8.0);
    CHECK(c.rope.low_freq_factor == 1.0 && c.rope.high_freq_factor == 4.0);
    CHECK(c.rope.original_max_position == 8192);
    CHECK(c.bos_id == 128000 && c.n_eos == 1 && c.eos_ids[0] == 128001);
    CHECK(c.gen_temperature == 0 && c.gen_top_k == -1 && c.gen_do_sample == -1);
    /* wavelengths 2pi, 167, 4443 (between 2048 and 8192: smoothed), 118140 (> 8192: /8) */
    double inv[4], attn = 0;
    atlas_rope_inv_freq(&c, inv, &attn);
    const double want[4] = {1, 0.037606030930863933, 0.00052484616099295468,
                            6.6478698711812362e-06};
    const int idx[4] = {0, 1, 2, 3};
    check_close(inv, want, idx, 4, "tiny-llama3");
    CHECK(attn == 1.0);

    CHECK_OK(atlas_config_load(harness_data_path("tiny-qwen3"), &c));
    CHECK(c.arch == ATLAS_ARCH_QWEN3 && !strcmp(c.architecture, "Qwen3ForCausalLM"));
    CHECK(c.vocab_size == 151936 && c.hidden == 16 && c.n_heads == 4 && c.n_kv_heads == 2);
    CHECK(c.head_dim == 16 && c.n_heads * c.head_dim == 64); /* explicit, != hidden / heads */
    CHECK(c.max_position == 4096 && c.rms_eps == 1e-6);
    CHECK(c.tie_embeddings && c.qk_norm && !c.qkv_bias && !c.o_bias);
    CHECK(c.sliding_window == 0 && !atlas_config_layer_sliding(&c, 1));
    CHECK(c.dtype == ATLAS_DTYPE_BF16);
    CHECK(c.rope.type == ATLAS_ROPE_DEFAULT && c.rope.theta == 1e6);
    CHECK(c.bos_id == -1 && c.n_eos == 0); /* eos null in both files */
    atlas_config_add_eos(&c, 151645);      /* the tokenizer's eos joins */
    atlas_config_add_eos(&c, 151645);
    CHECK(c.n_eos == 1 && c.eos_ids[0] == 151645);
    double inv16[8];
    atlas_rope_inv_freq(&c, inv16, &attn);
    double want16[8];
    int idx16[8];
    for (int i = 0; i < 8; i++) want16[i] = pow(1e6, -i / 8.0), idx16[i] = i;
    check_close(inv16, want16, idx16, 8, "tiny-qwen3");
}

/* ---- config styles and architectures -------------------------------------------------------- */

/* tiny-llama3 rewritten in transformers-5 style must mean the same thing. */
static void test_styles(void) {
    json_t *j = llama();
    json_t *rp = json_deep_copy(json_object_get(j, "rope_scaling"));
    set(rp, "rope_theta", json_real(500000.0));
    json_object_del(j, "rope_scaling");
    json_object_del(j, "rope_theta");
    json_object_del(j, "torch_dtype");
    set(j, "rope_parameters", rp);
    set(j, "dtype", json_string("float16"));
    atlas_config a = load_ok(j, NULL);
    atlas_config b;
    CHECK_OK(atlas_config_load(harness_data_path("tiny-llama3"), &b));
    CHECK(a.rope.type == ATLAS_ROPE_LLAMA3 && a.rope.theta == 500000.0 && a.rope.factor == 8);
    CHECK(a.rope.original_max_position == 8192 && a.dtype == ATLAS_DTYPE_F16);
    double ia[4], ib[4];
    atlas_rope_inv_freq(&a, ia, NULL);
    atlas_rope_inv_freq(&b, ib, NULL);
    CHECK(!memcmp(ia, ib, sizeof ia));

    /* Qwen3 rewritten in the classic style; legacy "type" key instead of "rope_type". */
    j = qwen3();
    json_object_del(j, "rope_parameters");
    json_object_del(j, "dtype");
    set(j, "rope_theta", json_integer(1000000));
    set(j, "rope_scaling", json_pack("{s:s,s:f}", "type", "linear", "factor", 2.0));
    set(j, "torch_dtype", json_string("float32"));
    atlas_config q = load_ok(j, NULL);
    CHECK(q.rope.type == ATLAS_ROPE_LINEAR && q.rope.theta == 1e6 && q.rope.factor == 2.0);
    CHECK(q.dtype == ATLAS_DTYPE_F32);

    /* rope_theta inside the dict wins over the top-level one; no dtype means bf16. */
    j = qwen3();
    set(j, "rope_theta", json_real(5.0));
    json_object_del(j, "dtype");
    q = load_ok(j, NULL);
    CHECK(q.rope.theta == 1e6 && q.dtype == ATLAS_DTYPE_BF16);
    /* No rope fields at all: theta 10000, default type. */
    j = qwen3();
    json_object_del(j, "rope_parameters");
    q = load_ok(j, NULL);
    CHECK(q.rope.type == ATLAS_ROPE_DEFAULT && q.rope.theta == 10000.0);
}

static void test_architectures(void) {
    /* Mistral: no head_dim (derived), sliding_window defaults to 4096 on every layer. */
    json_t *j = llama();
    set(j, "architectures", json_pack("[s]", "MistralForCausalLM"));
    json_object_del(j, "rope_scaling");
    json_object_del(j, "tie_word_embeddings");
    set(j, "attention_bias", json_true()); /* MistralAttention has no biases whatever it says */
    atlas_config c = load_ok(j, NULL);
    CHECK(c.arch == ATLAS_ARCH_MISTRAL && c.head_dim == 8 && !c.tie_embeddings);
    CHECK(!c.qkv_bias && !c.o_bias && c.sliding_window == 4096);
    CHECK(atlas_config_layer_sliding(&c, 0) && atlas_config_layer_sliding(&c, 1));
    j = llama();
    set(j, "architectures", json_pack("[s]", "MistralForCausalLM"));
    set(j, "sliding_window", json_null());
    c = load_ok(j, NULL);
    CHECK(c.sliding_window == 0 && !atlas_config_layer_sliding(&c, 0));
    /* MistralConfig ignores layer_types; num_key_value_heads defaults to 8 there. */
    j = llama();
    set(j, "architectures", json_pack("[s]", "MistralForCausalLM"));
    set(j, "layer_types", json_pack("[s,s]", "full_attention", "bogus"));
    set(j, "num_attention_heads", json_integer(16));
    set(j, "head_dim", json_integer(8));
    json_object_del(j, "num_key_value_heads");
    c = load_ok(j, NULL);
    CHECK(c.n_kv_heads == 8 && atlas_config_layer_sliding(&c, 0));

    /* Llama: attention_bias gives q/k/v/o biases, mlp_bias the MLP's; tie defaults to false. */
    j = llama();
    set(j, "attention_bias", json_true());
    set(j, "mlp_bias", json_true());
    json_object_del(j, "tie_word_embeddings");
    set(j, "head_dim", json_integer(12));
    c = load_ok(j, NULL);
    CHECK(c.qkv_bias && c.o_bias && c.mlp_bias && !c.tie_embeddings && c.head_dim == 12);
    /* hidden_act: silu (and swish, transformers' other name for it) or absent; the MLP is
     * SwiGLU, so any other activation is refused by name rather than computed as silu */
    static const char *const acts_ok[] = {"silu", "swish"};
    for (int i = 0; i < 2; i++) {
        j = qwen3();
        set(j, "hidden_act", json_string(acts_ok[i]));
        load_ok(j, NULL);
    }
    j = qwen3();
    json_object_del(j, "hidden_act");
    load_ok(j, NULL);
    static const char *const acts_bad[] = {"gelu", "gelu_pytorch_tanh", "relu", "SiLU"};
    for (int i = 0; i < 4; i++) {
        j = llama();
        set(j, "hidden_act", json_string(acts_bad[i]));
        load_fail(j, NULL, ATLAS_ERR_UNSUPPORTED, "config.json", "hidden_act");
        char want[48];
        snprintf(want, sizeof want, "\"%s\"", acts_bad[i]);
        CHECK_MSG(strstr(atlas_last_error(), want) != NULL, "%s", atlas_last_error());
    }
    j = llama();
    set(j, "hidden_act", json_integer(1));
    load_fail(j, NULL, ATLAS_ERR_FORMAT, "config.json", "hidden_act");

}

static void test_architectures_qwen(void) {
    /* Qwen2: q/k/v biases always, never o; sliding only with use_sliding_window, from
     * max_window_layers on. */
    json_t *j = qwen3();
    set(j, "architectures", json_pack("[s]", "Qwen2ForCausalLM"));
    json_object_del(j, "head_dim");
    set(j, "sliding_window", json_integer(1024));
    atlas_config c = load_ok(j, NULL);
    CHECK(c.arch == ATLAS_ARCH_QWEN2 && c.qkv_bias && !c.o_bias && !c.qk_norm);
    CHECK(c.head_dim == 4 && c.sliding_window == 0); /* use_sliding_window false */
    j = qwen3();
    set(j, "architectures", json_pack("[s]", "Qwen2ForCausalLM"));
    set(j, "use_sliding_window", json_true());
    set(j, "sliding_window", json_integer(1024));
    set(j, "max_window_layers", json_integer(1));
    json_object_del(j, "layer_types");
    c = load_ok(j, NULL);
    CHECK(c.sliding_window == 1024 && !atlas_config_layer_sliding(&c, 0) &&
          atlas_config_layer_sliding(&c, 1));
    /* An explicit layer_types list decides per layer. */
    j = qwen3();
    set(j, "architectures", json_pack("[s]", "Qwen2ForCausalLM"));
    set(j, "use_sliding_window", json_true());
    set(j, "sliding_window", json_integer(512));
    set(j, "layer_types", json_pack("[s,s]", "sliding_attention", "sliding_attention"));
    c = load_ok(j, NULL);
    CHECK(atlas_config_layer_sliding(&c, 0) && c.sliding_window == 512);

    /* Qwen3 without head_dim: transformers' Qwen3Config default is 128. attention_bias gives
     * q/k/v and o biases. */
    j = qwen3();
    json_object_del(j, "head_dim");
    set(j, "attention_bias", json_true());
    c = load_ok(j, NULL);
    CHECK(c.head_dim == 128 && c.qkv_bias && c.o_bias && c.qk_norm);
    /* Qwen2/Qwen3 default num_key_value_heads is 32; null means the heads. */
    j = qwen3();
    set(j, "num_attention_heads", json_integer(64));
    json_object_del(j, "num_key_value_heads");
    c = load_ok(j, NULL);
    CHECK(c.n_kv_heads == 32);
    j = qwen3();
    set(j, "num_key_value_heads", json_null());
    c = load_ok(j, NULL);
    CHECK(c.n_kv_heads == 4);

    /* model_type when architectures is absent; num_key_value_heads defaults to the heads. */
    j = llama();
    json_object_del(j, "architectures");
    json_object_del(j, "num_key_value_heads");
    c = load_ok(j, NULL);
    CHECK(c.arch == ATLAS_ARCH_LLAMA && c.n_kv_heads == 2);
}

/* ---- generation_config.json and eos ids ----------------------------------------------------- */

static void test_generation(void) {
    json_t *gen = json_pack("{s:[i,i,i],s:i,s:f,s:f,s:i,s:f,s:b}", "eos_token_id", 128001,
                            128008, 128009, "bos_token_id", 128000, "temperature", 0.6, "top_p",
                            0.9, "top_k", 50, "repetition_penalty", 1.1, "do_sample", 1);
    atlas_config c = load_ok(llama(), gen);
    CHECK(c.n_eos == 3 && has_eos(&c, 128001) && has_eos(&c, 128008) && has_eos(&c, 128009));
    CHECK(c.bos_id == 128000 && c.gen_temperature == 0.6 && c.gen_top_p == 0.9);
    CHECK(c.gen_top_k == 50 && c.gen_repetition_penalty == 1.1 && c.gen_do_sample == 1);

    /* config.json's list and generation_config.json's int: the union. */
    json_t *j = llama();
    set(j, "eos_token_id", json_pack("[i,i]", 7, 8));
    c = load_ok(j, json_pack("{s:i}", "eos_token_id", 9));
    CHECK(c.n_eos == 3 && has_eos(&c, 7) && has_eos(&c, 8) && has_eos(&c, 9));

    /* Qwen3: null in config.json, a list in generation_config.json. */
    c = load_ok(qwen3(), json_pack("{s:[i,i],s:n}", "eos_token_id", 151645, 151643,
                                   "bos_token_id"));
    CHECK(c.n_eos == 2 && has_eos(&c, 151645) && has_eos(&c, 151643) && c.bos_id == -1);
    /* Both null. */
    c = load_ok(qwen3(), json_pack("{s:n}", "eos_token_id"));
    CHECK(c.n_eos == 0);

    /* Errors in generation_config.json name it and the field. */
    load_fail(llama(), json_pack("{s:f}", "top_k", 1.5), ATLAS_ERR_FORMAT,
              "generation_config.json", "top_k");
    load_fail(llama(), json_pack("{s:s}", "temperature", "hot"), ATLAS_ERR_FORMAT,
              "generation_config.json", "temperature");
    load_fail(llama(), json_pack("{s:[i,s]}", "eos_token_id", 1, "x"), ATLAS_ERR_FORMAT,
              "generation_config.json", "eos_token_id[1]");
    load_fail(llama(), json_pack("{s:i}", "do_sample", 1), ATLAS_ERR_FORMAT,
              "generation_config.json", "do_sample");
    load_fail(llama(), json_pack("{s:f}", "max_new_tokens", 2.5), ATLAS_ERR_FORMAT,
              "generation_config.json", "max_new_tokens");
    load_fail(llama(), json_pack("{s:i}", "max_new_tokens", -1), ATLAS_ERR_RANGE,
              "generation_config.json", "max_new_tokens");
    c = load_ok(llama(), json_pack("{s:i}", "max_new_tokens", 256));
    CHECK(c.gen_max_new_tokens == 256 && (c.gen_set & ATLAS_GEN_MAX_NEW_TOKENS));
    atlas_generation_defaults d;
    atlas_config_generation_defaults(&c, &d);
    CHECK(d.max_new_tokens == 256 && (d.set & ATLAS_GEN_MAX_NEW_TOKENS));
    atlas_config before = c;
    const char *bad = "{\"top_k\": 3, \"top_p\": \"x\"}";
    CHECK(atlas_config_parse_generation(bad, strlen(bad), "g.json", &c) == ATLAS_ERR_FORMAT);
    CHECK(!memcmp(&before, &c, sizeof c)); /* nothing merged from a bad file */
    CHECK(atlas_config_parse_generation("[", 1, "g.json", &c) == ATLAS_ERR_FORMAT);
    CHECK(strstr(atlas_last_error(), "g.json") && strstr(atlas_last_error(), "byte"));
}

/* ---- malformed config.json -------------------------------------------------------------- */

static void test_errors(void) {
    const atlas_status F = ATLAS_ERR_FORMAT;
    json_t *j = llama();
    set(j, "architectures", json_pack("[s]", "GPT2LMHeadModel"));
    load_fail(j, NULL, ATLAS_ERR_UNSUPPORTED, "config.json", "architectures");
    j = llama();
    json_object_del(j, "architectures");
    set(j, "model_type", json_string("gemma"));
    load_fail(j, NULL, ATLAS_ERR_UNSUPPORTED, "config.json", "model_type");
    j = llama();
    set(j, "architectures", json_string("LlamaForCausalLM"));
    load_fail(j, NULL, F, "config.json", "architectures");
    j = llama();
    set(j, "hidden_size", json_string("16"));
    load_fail(j, NULL, F, "config.json", "hidden_size");
    j = llama();
    set(j, "num_attention_heads", json_real(2.0));
    load_fail(j, NULL, F, "config.json", "num_attention_heads");
    j = llama();
    json_object_del(j, "num_hidden_layers");
    load_fail(j, NULL, F, "config.json", "num_hidden_layers");
    j = llama();
    set(j, "vocab_size", json_integer(-5));
    load_fail(j, NULL, ATLAS_ERR_RANGE, "config.json", "vocab_size");
    j = llama();
    set(j, "tie_word_embeddings", json_integer(1));
    load_fail(j, NULL, F, "config.json", "tie_word_embeddings");
    j = llama();
    set(j, "rms_norm_eps", json_string("1e-5"));
    load_fail(j, NULL, F, "config.json", "rms_norm_eps");
    j = llama();
    set(j, "eos_token_id", json_string("</s>"));
    load_fail(j, NULL, F, "config.json", "eos_token_id");
    j = llama();
    set(j, "eos_token_id", json_pack("[i,i]", 2, -1));
    load_fail(j, NULL, ATLAS_ERR_RANGE, "config.json", "eos_token_id");
    j = llama();
    set(j, "torch_dtype", json_string("float8_e4m3fn"));
    load_fail(j, NULL, ATLAS_ERR_UNSUPPORTED, "config.json", "torch_dtype");
    j = qwen3();
    set(j, "dtype", json_integer(3));
    load_fail(j, NULL, F, "config.json", "dtype");
    j = llama();
    set(j, "hidden_size", json_integer(15));
    load_fail(j, NULL, ATLAS_ERR_RANGE, "config.json", "hidden_size");
    j = llama();
    set(j, "num_key_value_heads", json_integer(3));
    load_fail(j, NULL, ATLAS_ERR_RANGE, "config.json", "num_key_value_heads");
    j = llama();
    set(j, "head_dim", json_integer(7));
    load_fail(j, NULL, ATLAS_ERR_RANGE, "config.json", "head_dim");
    /* a quantization method atlas does not read is refused by name, its method said and
     * the supported ones listed (tests/test-quant.c covers the ones it reads) */
    j = llama();
    set(j, "quantization_config", json_pack("{s:s, s:i}", "quant_method", "bitsandbytes",
                                            "bits", 4));
    load_fail(j, NULL, ATLAS_ERR_UNSUPPORTED, "config.json", "quantization_config");
    CHECK(strstr(atlas_last_error(), "bitsandbytes") != NULL);
    CHECK(strstr(atlas_last_error(), "awq (version gemm") != NULL);
    j = llama();
    set(j, "quantization_config", json_null());
    load_ok(j, NULL);
}

/* A factor whose derived context (atlas_config_max_context) is 0 or beyond an int is
 * refused at load, naming the factor, in both spellings; the largest context that fits is
 * not. (Such a config used to load and serve "a context of 0 tokens".) */
static void test_errors_context(void) {
    static const char *const keys[] = {"rope_scaling", "rope_parameters"};
    static const double bad[] = {1e30, 1e300, 1e-30, 524289.0 /* * 4096 = 2^31 + 4096 */};
    for (int k = 0; k < 2; k++) {
        char fld[64];
        snprintf(fld, sizeof fld, "%s.factor", keys[k]);
        for (int i = 0; i < 4; i++) {
            json_t *j = llama();
            json_object_del(j, "rope_scaling");
            set(j, "max_position_embeddings", json_integer(4096));
            set(j, keys[k], json_pack("{s:s,s:f}", "rope_type", "linear", "factor", bad[i]));
            load_fail(j, NULL, ATLAS_ERR_RANGE, "config.json", fld);
            j = qwen3();
            json_object_del(j, "rope_parameters");
            set(j, keys[k], json_pack("{s:s,s:f,s:i}", "rope_type", "yarn", "factor", bad[i],
                                      "original_max_position_embeddings", 4096));
            load_fail(j, NULL, ATLAS_ERR_RANGE, "config.json", fld);
        }
    }
    /* 2^31 - 1 itself: 4096 * 524287.99975585938 floors to it */
    json_t *j = llama();
    json_object_del(j, "rope_scaling");
    set(j, "max_position_embeddings", json_integer(4096));
    set(j, "rope_scaling", json_pack("{s:s,s:f}", "type", "linear", "factor",
                                     2147483647.0 / 4096));
    atlas_config c = load_ok(j, NULL);
    CHECK_MSG(atlas_config_max_context(&c) == 2147483647L, "%ld", atlas_config_max_context(&c));
    /* one past it is refused */
    j = llama();
    json_object_del(j, "rope_scaling");
    set(j, "max_position_embeddings", json_integer(4096));
    set(j, "rope_scaling", json_pack("{s:s,s:f}", "type", "linear", "factor",
                                     2147483648.0 / 4096));
    load_fail(j, NULL, ATLAS_ERR_RANGE, "config.json", "rope_scaling.factor");
    /* and through the parser alone (the fuzzer's entry), for the inputs of the issue */
    static const char *const texts[] = {
        "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 100, \"hidden_size\": 16, "
        "\"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"intermediate_size\": 32, "
        "\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 1e30, \"rope_theta\": "
        "10000, \"original_max_position_embeddings\": 4096}}",
        "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 100, \"hidden_size\": 16, "
        "\"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"intermediate_size\": 32, "
        "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 1e30}}",
    };
    for (int i = 0; i < 2; i++) {
        CHECK(atlas_config_parse(texts[i], strlen(texts[i]), "m/config.json", &c) ==
              ATLAS_ERR_RANGE);
        CHECK_MSG(strstr(atlas_last_error(), "factor") && strstr(atlas_last_error(), "1e+30"),
                  "%s", atlas_last_error());
    }
    /* a config filled in by hand is clamped, never converted out of range */
    c.rope.type = ATLAS_ROPE_LINEAR, c.rope.factor = 1e30, c.max_position = 4096;
    CHECK(atlas_config_max_context(&c) == 2147483647L);
    c.rope.factor = 1e-30;
    CHECK(atlas_config_max_context(&c) == 1);
    c.rope.type = ATLAS_ROPE_YARN, c.rope.factor = NAN, c.rope.original_max_position = 4096;
    CHECK(atlas_config_max_context(&c) == 1);
}

static void test_errors_rope(void) {
    const atlas_status F = ATLAS_ERR_FORMAT;
    json_t *j = llama();
    set(json_object_get(j, "rope_scaling"), "factor", json_string("8"));
    load_fail(j, NULL, F, "config.json", "rope_scaling.factor");
    j = llama();
    json_object_del(json_object_get(j, "rope_scaling"), "low_freq_factor");
    load_fail(j, NULL, F, "config.json", "rope_scaling.low_freq_factor");
    j = llama();
    set(json_object_get(j, "rope_scaling"), "rope_type", json_string("dynamic"));
    load_fail(j, NULL, ATLAS_ERR_UNSUPPORTED, "config.json", "rope_scaling.rope_type");
    j = qwen3();
    set(json_object_get(j, "rope_parameters"), "rope_type", json_integer(1));
    load_fail(j, NULL, F, "config.json", "rope_parameters.rope_type");
    j = qwen3();
    set(j, "rope_parameters", json_string("default"));
    load_fail(j, NULL, F, "config.json", "rope_parameters");
    j = qwen3();
    set(json_object_get(j, "rope_parameters"), "partial_rotary_factor", json_real(0.5));
    load_fail(j, NULL, ATLAS_ERR_UNSUPPORTED, "config.json", "partial_rotary_factor");
    j = qwen3(); /* at the top level too: transformers' RoPE reads it there for any family */
    set(j, "partial_rotary_factor", json_real(0.5));
    load_fail(j, NULL, ATLAS_ERR_UNSUPPORTED, "config.json", "\"partial_rotary_factor\": 0.5");
    j = qwen3();
    set(j, "rope_parameters", json_pack("{s:{s:s}}", "full_attention", "rope_type", "default"));
    load_fail(j, NULL, ATLAS_ERR_UNSUPPORTED, "config.json", "rope_parameters");
    j = qwen3();
    set(j, "rope_parameters", json_pack("{s:s,s:f,s:s}", "rope_type", "yarn", "factor", 4.0,
                                        "truncate", "yes"));
    load_fail(j, NULL, F, "config.json", "rope_parameters.truncate");
    j = qwen3();
    set(j, "layer_types", json_pack("[s,s]", "full_attention", "chunked_attention"));
    load_fail(j, NULL, ATLAS_ERR_UNSUPPORTED, "config.json", "layer_types[1]");
    j = qwen3();
    set(j, "layer_types", json_pack("[s]", "full_attention"));
    load_fail(j, NULL, F, "config.json", "layer_types");
    j = qwen3();
    set(j, "rope_parameters", json_pack("{s:s,s:f,s:i}", "rope_type", "yarn", "factor", 4.0,
                                        "beta_fast", -1));
    load_fail(j, NULL, ATLAS_ERR_RANGE, "config.json", "rope_parameters");
    test_errors_context();
}

/* Not JSON, not an object, and no file at all. */
static void test_errors_files(void) {
    const atlas_status F = ATLAS_ERR_FORMAT;
    atlas_config c;
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/badjson", tmpdir);
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_text(path, "{\"hidden_size\": 16,\n \"vocab_size\": }");
    CHECK(atlas_config_load(dir, &c) == F);
    CHECK(strstr(atlas_last_error(), path) && strstr(atlas_last_error(), "line 2"));
    write_text(path, "[1]");
    CHECK(atlas_config_load(dir, &c) == F && strstr(atlas_last_error(), path));
    snprintf(dir, sizeof dir, "%s/nothing", tmpdir);
    mkdir(dir, 0700);
    CHECK(atlas_config_load(dir, &c) == ATLAS_ERR_IO && strstr(atlas_last_error(), dir));
}

/* ---- RoPE inverse frequencies ---------------------------------------------------------------- */

/* A Qwen3-shaped config (head_dim 128 unless changed) with the given rope_parameters. */
static atlas_config rope_cfg(json_t *params, int max_pos, int head_dim) {
    json_t *j = qwen3();
    set(j, "rope_parameters", params);
    set(j, "max_position_embeddings", json_integer(max_pos));
    set(j, "head_dim", json_integer(head_dim));
    return load_ok(j, NULL);
}

static void test_rope(void) {
    double inv[64], attn;
    const int idx6[6] = {0, 5, 17, 31, 40, 63};

    /* default and linear, by hand: 10000^(-2i/8) = 1, 0.1, 0.01, 0.001 */
    atlas_config c = rope_cfg(json_pack("{s:s,s:f}", "rope_type", "default", "rope_theta",
                                        10000.0), 4096, 8);
    atlas_rope_inv_freq(&c, inv, &attn);
    const double d8[4] = {1, 0.1, 0.01, 0.001};
    const int idx4[4] = {0, 1, 2, 3};
    check_close(inv, d8, idx4, 4, "default");
    CHECK(attn == 1.0);
    c = rope_cfg(json_pack("{s:s,s:f,s:f}", "rope_type", "linear", "rope_theta", 10000.0,
                           "factor", 4.0), 4096, 8);
    atlas_rope_inv_freq(&c, inv, &attn);
    const double l8[4] = {0.25, 0.025, 0.0025, 0.00025};
    check_close(inv, l8, idx4, 4, "linear");
    CHECK(attn == 1.0);

    /* llama3 as in Llama 3.1 8B (head_dim 128). */
    c = rope_cfg(json_pack("{s:s,s:f,s:f,s:f,s:f,s:i}", "rope_type", "llama3", "rope_theta",
                           500000.0, "factor", 8.0, "low_freq_factor", 1.0, "high_freq_factor",
                           4.0, "original_max_position_embeddings", 8192), 131072, 128);
    atlas_rope_inv_freq(&c, inv, &attn);
    const double l3[6] = {1, 0.35873022375128993, 0.030634520893224042, 0.00085675141291963208,
                          3.4281021959525912e-05, 3.0689259889145111e-07};
    check_close(inv, l3, idx6, 6, "llama3");
    CHECK(attn == 1.0);

    /* yarn as Qwen3 recommends (factor 4 over 32768): attention factor 0.1 ln 4 + 1. */
    c = rope_cfg(json_pack("{s:s,s:f,s:f,s:i}", "rope_type", "yarn", "rope_theta", 1e6, "factor",
                           4.0, "original_max_position_embeddings", 32768), 131072, 128);
    atlas_rope_inv_freq(&c, inv, &attn);
    const double yq[6] = {1, 0.33982083289425591, 0.025482967479793464, 0.00080295972754523023,
                          4.4456985250973067e-05, 3.1023444018792988e-07};
    check_close(inv, yq, idx6, 6, "yarn");
    CHECK(fabs(attn - 1.1386294361119891) < 1e-15);

    /* yarn with mscale / mscale_all_dim (DeepSeek style): get_mscale ratio. */
    c = rope_cfg(json_pack("{s:s,s:f,s:f,s:i,s:f,s:f,s:i,s:i}", "rope_type", "yarn",
                           "rope_theta", 10000.0, "factor", 40.0,
                           "original_max_position_embeddings", 4096, "mscale", 1.0,
                           "mscale_all_dim", 0.5, "beta_fast", 32, "beta_slow", 1),
                 163840, 128);
    atlas_rope_inv_freq(&c, inv, &attn);
    const double ym[6] = {1, 0.48696752516586306, 0.086596432336006543, 0.0067843441600505669,
                          0.00079056941504209452, 2.8869549617236457e-06};
    check_close(inv, ym, idx6, 6, "yarn mscale");
    CHECK(fabs(attn - 1.1557219901962608) < 1e-15);

    /* yarn, truncate false, explicit attention_factor and betas; the original length defaults
     * to max_position_embeddings. */
    c = rope_cfg(json_pack("{s:s,s:f,s:f,s:f,s:i,s:i,s:b}", "rope_type", "yarn", "rope_theta",
                           10000.0, "factor", 8.0, "attention_factor", 0.9, "beta_fast", 16,
                           "beta_slow", 2, "truncate", 0), 4096, 128);
    CHECK(c.rope.original_max_position == 4096 && !c.rope.truncate);
    atlas_rope_inv_freq(&c, inv, &attn);
    const double yt[6] = {1, 0.48696752516586306, 0.086596432336006543, 0.0078842149655024511,
                          0.00043557547602531194, 1.4434774808618228e-05};
    check_close(inv, yt, idx6, 6, "yarn truncate false");
    CHECK(attn == 0.9);

    /* yarn with factor null: max_position / original (65536 / 8192 = 8). */
    c = rope_cfg(json_pack("{s:s,s:f,s:n,s:i}", "rope_type", "yarn", "rope_theta", 10000.0,
                           "factor", "original_max_position_embeddings", 8192), 65536, 64);
    CHECK(c.rope.factor == 8.0);
    atlas_rope_inv_freq(&c, inv, &attn);
    const double yn[4] = {1, 0.23713737056616555, 0.0049752596580711021,
                          1.6669017902041549e-05};
    const int idx4b[4] = {0, 5, 17, 31};
    check_close(inv, yn, idx4b, 4, "yarn factor null");
    CHECK(fabs(attn - 1.2079441541679836) < 1e-15);
}

/* RoPE types atlas does not compute are refused at load, the message naming the type, in
 * both spellings; and the context a config allows (vLLM's derivation). */
static void test_rope_refusals(void) {
    static const char *const types[] = {"dynamic", "su", "ntk-magic", "longrop"};
    static const char *const keys[] = {"rope_scaling", "rope_parameters"};
    for (int k = 0; k < 2; k++)
        for (int t = 0; t < 4; t++) {
            char json[512];
            int n = snprintf(json, sizeof json,
                             "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 100, "
                             "\"hidden_size\": 16, \"num_hidden_layers\": 1, "
                             "\"num_attention_heads\": 2, \"intermediate_size\": 32, "
                             "\"max_position_embeddings\": 64, \"%s\": {\"rope_type\": "
                             "\"%s\", \"factor\": 2.0}}", keys[k], types[t]);
            atlas_config c;
            CHECK(atlas_config_parse(json, (size_t)n, "m/config.json", &c) == ATLAS_ERR_UNSUPPORTED);
            char want[96];
            snprintf(want, sizeof want, "unsupported RoPE type \"%s\"", types[t]);
            CHECK_MSG(strstr(atlas_last_error(), want) && strstr(atlas_last_error(), keys[k]),
                      "%s", atlas_last_error());
        }
    atlas_config c;
    CHECK_OK(atlas_config_load(harness_data_path("tiny-llama3"), &c));
    CHECK(atlas_config_max_context(&c) == 131072); /* llama3: already the scaled maximum */
    c.rope.type = ATLAS_ROPE_LINEAR, c.rope.factor = 4, c.max_position = 4096;
    CHECK(atlas_config_max_context(&c) == 16384);
    c.rope.type = ATLAS_ROPE_YARN, c.rope.factor = 4, c.rope.original_max_position = 32768;
    CHECK(atlas_config_max_context(&c) == 131072);
}

/* Phi-4-mini's shape: head_dim 128 (3072 / 24), 8 KV heads, 3/4 of each head rotated,
 * longrope over original_max 4096 of 131072, factors at the top level as Phi3Config keeps
 * them (or in rope_parameters, transformers 5). */
static json_t *phi4_mini(int rope_parameters) {
    json_t *sf = json_array(), *lf = json_array();
    for (int i = 0; i < 48; i++) {
        json_array_append_new(sf, json_real(1.0 + 0.01 * i));
        json_array_append_new(lf, json_real(1.0 + 0.5 * i));
    }
    json_t *j = json_pack("{s:[s],s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:f,s:b,s:s,s:f}",
                          "architectures", "Phi3ForCausalLM", "vocab_size", 200064,
                          "hidden_size", 3072, "intermediate_size", 8192,
                          "num_hidden_layers", 32, "num_attention_heads", 24,
                          "num_key_value_heads", 8, "max_position_embeddings", 131072,
                          "rope_theta", 10000.0, "tie_word_embeddings", 1, "hidden_act", "silu",
                          "rms_norm_eps", 1e-5);
    json_t *rope = json_pack("{s:s,s:o,s:o}", rope_parameters ? "rope_type" : "type", "longrope",
                             "short_factor", sf, "long_factor", lf);
    if (rope_parameters) {
        set(rope, "partial_rotary_factor", json_real(0.75));
        set(rope, "original_max_position_embeddings", json_integer(4096));
        set(rope, "rope_theta", json_real(10000.0));
        set(j, "rope_parameters", rope);
    } else {
        set(j, "partial_rotary_factor", json_real(0.75));
        set(j, "original_max_position_embeddings", json_integer(4096));
        set(j, "rope_scaling", rope);
    }
    return j;
}

static void test_phi3(void) {
    for (int style = 0; style < 2; style++) {
        atlas_config c = load_ok(phi4_mini(style), NULL);
        CHECK(c.arch == ATLAS_ARCH_PHI3 && c.fused_proj && !c.qkv_bias && !c.o_bias);
        CHECK(c.head_dim == 128 && c.rope_dim == 96 && c.n_kv_heads == 8 && c.rms_eps == 1e-5);
        CHECK(c.rope.type == ATLAS_ROPE_LONGROPE && c.rope.n_factors == 48);
        CHECK(c.rope.original_max_position == 4096 && c.rope.factor == 32.0);
        CHECK(atlas_config_max_context(&c) == 131072);
        double inv[64], inv_long[64], attn = 0;
        atlas_rope_inv_freq(&c, inv, &attn);
        CHECK(atlas_rope_inv_freq_long(&c, inv_long));
        /* transformers: sqrt(1 + ln(131072 / 4096) / ln(4096)); 1 / (ext_i * 10000^(2i/96)) */
        CHECK_MSG(fabs(attn - sqrt(1 + log(32.0) / log(4096.0))) < 1e-15, "attn %.17g", attn);
        CHECK(inv[0] == 1.0 && inv_long[0] == 1.0);
        for (int i = 1; i < 48; i++) {
            double p = pow(10000.0, 2.0 * i / 96);
            CHECK_MSG(fabs(inv[i] - (float)(1 / ((1 + 0.01 * i) * p))) <= 1e-7 * inv[i] &&
                      fabs(inv_long[i] - (float)(1 / ((1 + 0.5 * i) * p))) <= 1e-7 * inv_long[i],
                      "longrope frequency %d: %g, %g", i, inv[i], inv_long[i]);
        }
    }
    /* Phi-4 (14B): no rope_scaling, the whole head rotates, no long set */
    json_t *j = json_pack("{s:[s],s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:f,s:n}", "architectures",
                          "Phi3ForCausalLM", "vocab_size", 100352, "hidden_size", 5120,
                          "intermediate_size", 17920, "num_hidden_layers", 40,
                          "num_attention_heads", 40, "num_key_value_heads", 10,
                          "max_position_embeddings", 16384,
                          "original_max_position_embeddings", 16384, "rope_theta", 250000.0,
                          "rope_scaling");
    atlas_config c = load_ok(j, NULL);
    double inv[64];
    CHECK(c.head_dim == 128 && c.rope_dim == 128 && c.rope.type == ATLAS_ROPE_DEFAULT);
    CHECK(!atlas_rope_inv_freq_long(&c, inv) && c.sliding_window == 0 && c.rms_eps == 1e-5);
    /* factor lists of the wrong length, a bad factor, partial rotary elsewhere, odd dims */
    j = phi4_mini(0);
    json_array_remove(json_object_get(json_object_get(j, "rope_scaling"), "long_factor"), 0);
    load_fail(j, NULL, ATLAS_ERR_FORMAT, "config.json", "rope_scaling.long_factor");
    j = phi4_mini(1);
    json_array_set_new(json_object_get(json_object_get(j, "rope_parameters"), "short_factor"),
                       3, json_real(-1));
    load_fail(j, NULL, ATLAS_ERR_RANGE, "config.json", "rope_parameters.short_factor[3]");
    j = llama();
    set(j, "partial_rotary_factor", json_real(0.5));
    json_object_del(j, "rope_scaling");
    json_object_set_new(j, "rope_parameters", json_pack("{s:s,s:f}", "rope_type", "default",
                                                        "partial_rotary_factor", 0.5));
    load_fail(j, NULL, ATLAS_ERR_UNSUPPORTED, "config.json", "partial_rotary_factor");
    j = phi4_mini(0);
    set(j, "partial_rotary_factor", json_real(0.7)); /* 89.6 -> 89 dims: odd */
    load_fail(j, NULL, ATLAS_ERR_RANGE, "config.json", "partial_rotary_factor");
}


/* ---- Gemma 3 ------------------------------------------------------------------------------ */

/* google/gemma-3-1b-it's config.json as published (transformers 4 spelling). */
static json_t *gemma3_1b(void) {
    json_error_t err;
    json_t *j = json_loads(
        "{\"architectures\": [\"Gemma3ForCausalLM\"], \"attention_bias\": false, "
        "\"attn_logit_softcapping\": null, \"bos_token_id\": 2, \"eos_token_id\": [1, 106], "
        "\"final_logit_softcapping\": null, \"head_dim\": 256, \"hidden_activation\": "
        "\"gelu_pytorch_tanh\", \"hidden_size\": 1152, \"intermediate_size\": 6912, "
        "\"max_position_embeddings\": 32768, \"model_type\": \"gemma3_text\", "
        "\"num_attention_heads\": 4, \"num_hidden_layers\": 26, \"num_key_value_heads\": 1, "
        "\"query_pre_attn_scalar\": 256, \"rms_norm_eps\": 1e-06, \"rope_local_base_freq\": "
        "10000, \"rope_scaling\": null, \"rope_theta\": 1000000, \"sliding_window\": 512, "
        "\"sliding_window_pattern\": 6, \"torch_dtype\": \"bfloat16\", \"vocab_size\": 262144}",
        0, &err);
    if (!j) fprintf(stderr, "gemma3_1b: %s\n", err.text), exit(2);
    return j;
}

static void test_gemma3_causal(void) {
    atlas_config c = load_ok(gemma3_1b(), NULL);
    CHECK(c.arch == ATLAS_ARCH_GEMMA3 && !c.nested_text && c.act == ATLAS_ACT_GELU_TANH);
    CHECK(c.tie_embeddings && c.norm_plus_one && c.post_norms && c.qk_norm && !c.qkv_bias);
    CHECK(c.head_dim == 256 && c.n_kv_heads == 1 && c.sliding_window == 512);
    CHECK(c.embed_scale == (double)(float)sqrt(1152.0) && c.attn_scale == 1.0 / 16);
    CHECK(c.rope.theta == 1e6 && c.has_rope_local && c.rope_local.theta == 1e4);
    CHECK(atlas_config_max_context(&c) == 32768 && has_eos(&c, 106) && c.bos_id == 2);
    /* five sliding layers (local RoPE), the sixth full (global), and so on */
    for (int l = 0; l < 26; l++) {
        int full = (l + 1) % 6 == 0;
        CHECK_MSG(atlas_config_layer_sliding(&c, l) == !full &&
                  atlas_config_layer_rope_set(&c, l) == !full, "layer %d", l);
    }
    double g[128], lo[128], a = 0;
    atlas_rope_inv_freq(&c, g, &a);
    CHECK(atlas_rope_inv_freq_local(&c, lo, &a) && a == 1.0);
    CHECK(g[1] == (float)pow(1e6, -2.0 / 256) && lo[1] == (float)pow(1e4, -2.0 / 256));
    /* a null window: the sliding layers attend to everything, still with the local RoPE */
    json_t *j = gemma3_1b();
    set(j, "sliding_window", json_null());
    c = load_ok(j, NULL);
    CHECK(!atlas_config_layer_sliding(&c, 0) && atlas_config_layer_rope_set(&c, 0) == 1);
    /* transformers 5: rope_parameters per layer type, layer_types spelled out */
    j = gemma3_1b();
    json_object_del(j, "rope_theta");
    json_object_del(j, "rope_local_base_freq");
    json_object_del(j, "rope_scaling");
    set(j, "num_hidden_layers", json_integer(3));
    set(j, "layer_types", json_pack("[s,s,s]", "full_attention", "sliding_attention",
                                    "full_attention"));
    set(j, "rope_parameters", json_pack("{s:{s:s,s:f},s:{s:s,s:f,s:f}}", "sliding_attention",
                                        "rope_type", "default", "rope_theta", 5000.0,
                                        "full_attention", "rope_type", "linear", "rope_theta",
                                        2e6, "factor", 8.0));
    c = load_ok(j, NULL);
    CHECK(c.rope_local.theta == 5000 && c.rope_local.type == ATLAS_ROPE_DEFAULT);
    CHECK(c.rope.theta == 2e6 && c.rope.type == ATLAS_ROPE_LINEAR && c.rope.factor == 8);
    CHECK(atlas_config_layer_rope_set(&c, 0) == 0 && atlas_config_layer_rope_set(&c, 1) == 1 &&
          atlas_config_layer_rope_set(&c, 2) == 0 && atlas_config_layer_sliding(&c, 1));
    CHECK(atlas_config_max_context(&c) == 32768); /* the linear factor is in it already */
    /* what Gemma 3 does not have, refused by name */
    j = gemma3_1b();
    set(j, "final_logit_softcapping", json_real(30.0));
    load_fail(j, NULL, ATLAS_ERR_UNSUPPORTED, "config.json", "final_logit_softcapping");
    j = gemma3_1b();
    set(j, "attn_logit_softcapping", json_real(50.0));
    load_fail(j, NULL, ATLAS_ERR_UNSUPPORTED, "config.json", "attn_logit_softcapping");
    j = gemma3_1b();
    set(j, "hidden_activation", json_string("gelu"));
    load_fail(j, NULL, ATLAS_ERR_UNSUPPORTED, "config.json", "hidden_activation");
    j = gemma3_1b();
    set(j, "use_bidirectional_attention", json_true());
    load_fail(j, NULL, ATLAS_ERR_UNSUPPORTED, "config.json", "use_bidirectional_attention");
    j = gemma3_1b();
    set(j, "rope_parameters", json_pack("{s:s,s:f}", "rope_type", "default", "rope_theta", 1e6));
    load_fail(j, NULL, ATLAS_ERR_FORMAT, "config.json", "sliding_attention");
    j = gemma3_1b();
    set(j, "query_pre_attn_scalar", json_integer(0));
    load_fail(j, NULL, ATLAS_ERR_RANGE, "config.json", "query_pre_attn_scalar");
}

/* google/gemma-3-4b-it's config.json, vision_config cut short: text_config omits most fields
 * (Gemma3TextConfig's defaults), eos and the dtype are at the top. */
static void test_gemma3_nested(void) {
    json_t *j = json_pack("{s:[s],s:s,s:[i,i],s:s,s:{s:i,s:i,s:s,s:i,s:{s:f,s:s},s:i},"
                          "s:{s:i,s:s}}",
                          "architectures", "Gemma3ForConditionalGeneration", "model_type",
                          "gemma3", "eos_token_id", 1, 106, "torch_dtype", "float16",
                          "text_config", "hidden_size", 2560, "intermediate_size", 10240,
                          "model_type", "gemma3_text", "num_hidden_layers", 34, "rope_scaling",
                          "factor", 8.0, "rope_type", "linear", "sliding_window", 1024,
                          "vision_config", "hidden_size", 1152, "model_type",
                          "siglip_vision_model");
    atlas_config c = load_ok(j, NULL);
    CHECK(c.arch == ATLAS_ARCH_GEMMA3 && c.nested_text && c.hidden == 2560 && c.n_layers == 34);
    CHECK(c.n_heads == 8 && c.n_kv_heads == 4 && c.head_dim == 256 && c.vocab_size == 262208);
    CHECK(c.rope.type == ATLAS_ROPE_LINEAR && c.rope.factor == 8 && c.rope.theta == 1e6);
    CHECK(c.rope_local.type == ATLAS_ROPE_DEFAULT && c.rope_local.theta == 1e4);
    CHECK(c.dtype == ATLAS_DTYPE_F16 && has_eos(&c, 106) && c.tie_embeddings);
    CHECK(c.sliding_window == 1024 && atlas_config_max_context(&c) == 131072);
    CHECK(c.attn_scale == 1.0 / 16 && c.embed_scale == (double)(float)sqrt(2560.0));
    /* no text_config at all: every default */
    c = load_ok(json_pack("{s:[s]}", "architectures", "Gemma3ForConditionalGeneration"), NULL);
    CHECK(c.hidden == 2304 && c.intermediate == 9216 && c.n_layers == 26 && c.rms_eps == 1e-6);
    CHECK(c.max_position == 131072 && c.sliding_window == 4096 && c.act == ATLAS_ACT_GELU_TANH);
    CHECK(c.bos_id == 2 && c.n_eos == 1 && has_eos(&c, 1)); /* Gemma3TextConfig's ids */
    /* an error inside it names text_config */
    j = json_pack("{s:[s],s:{s:s}}", "architectures", "Gemma3ForConditionalGeneration",
                  "text_config", "hidden_size", "big");
    load_fail(j, NULL, ATLAS_ERR_FORMAT, "config.json: text_config", "hidden_size");
}

/* Qwen2's layer_types may put full layers after sliding ones now that the kinds are per
 * layer. */
static void test_layer_kinds(void) {
    json_t *j = qwen3();
    set(j, "architectures", json_pack("[s]", "Qwen2ForCausalLM"));
    set(j, "use_sliding_window", json_true());
    set(j, "sliding_window", json_integer(64));
    set(j, "layer_types", json_pack("[s,s]", "sliding_attention", "full_attention"));
    atlas_config c = load_ok(j, NULL);
    CHECK(atlas_config_layer_sliding(&c, 0) && !atlas_config_layer_sliding(&c, 1));
    CHECK(atlas_config_layer_rope_set(&c, 0) == 0 && !c.has_rope_local);
}

int main(void) {
    if (!harness_mkdtemp(tmpdir, sizeof tmpdir, "cfg")) return 2;
    test_rope_refusals();
    test_fixtures();
    test_styles();
    test_architectures();
    test_architectures_qwen();
    test_generation();
    test_errors();
    test_errors_rope();
    test_errors_files();
    test_rope();
    test_phi3();
    test_gemma3_causal();
    test_gemma3_nested();
    test_layer_kinds();
    harness_rm_rf(tmpdir);
    return harness_finish();
}

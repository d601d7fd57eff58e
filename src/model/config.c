/* model/config.c — see config.h.
 *
 * Defaults follow transformers' config classes (LlamaConfig, MistralConfig, Qwen2Config,
 * Qwen3Config) so that a config.json that omits a field means what it means there. Fields
 * that no real checkpoint omits (sizes, layer and head counts) are required. */
#include "model/config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "atlas/model.h"
#include "core/error.h"
#include "core/file.h"
#include "format/layout.h"
#include "model/config_moe.h"
#include "model/pooling.h"

/* Sizes are bounded so that products of two of them fit comfortably in 64 bits. */
#define CFG_MAX_DIM (1 << 24)

static const char *json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

static atlas_status wrong_type(const char *file, const char *field, const char *want,
                               const json_t *v) {
    return atlas_fail(ATLAS_ERR_FORMAT, "%s: field \"%s\": expected %s, got %s", file, field,
                      want, json_type_name(v));
}

/* Absent and null both mean "not given". */
static json_t *field(json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

/* An integer in [lo, hi]; *out is left alone when the field is absent and !required. */
static atlas_status get_int(const char *file, json_t *obj, const char *key, bool required,
                            long long lo, long long hi, int *out) {
    json_t *v = field(obj, key);
    if (!v) {
        if (required) return atlas_fail(ATLAS_ERR_FORMAT, "%s: missing field \"%s\"", file, key);
        return ATLAS_OK;
    }
    if (!json_is_integer(v)) return wrong_type(file, key, "an integer", v);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return atlas_fail(ATLAS_ERR_RANGE, "%s: field \"%s\": %lld is out of range [%lld, %lld]",
                          file, key, (long long)x, lo, hi);
    *out = (int)x;
    return ATLAS_OK;
}

/* A finite number (integer or real); *out is left alone when absent. */
static atlas_status get_num(const char *file, json_t *obj, const char *key, double *out) {
    json_t *v = field(obj, key);
    if (!v) return ATLAS_OK;
    if (!json_is_number(v)) return wrong_type(file, key, "a number", v);
    double x = json_number_value(v);
    if (!isfinite(x))
        return atlas_fail(ATLAS_ERR_RANGE, "%s: field \"%s\" is not finite", file, key);
    *out = x;
    return ATLAS_OK;
}

static atlas_status get_bool(const char *file, json_t *obj, const char *key, bool *out) {
    json_t *v = field(obj, key);
    if (!v) return ATLAS_OK;
    if (!json_is_boolean(v)) return wrong_type(file, key, "a boolean", v);
    *out = json_is_true(v);
    return ATLAS_OK;
}

static atlas_status load_json(const char *json, size_t len, const char *file, json_t **out) {
    json_error_t err;
    *out = json_loadb(json, len, JSON_REJECT_DUPLICATES, &err);
    if (!*out)
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: JSON: %s at byte %d (line %d, column %d)", file,
                          err.text, err.position, err.line, err.column);
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: not a JSON object", file);
    }
    return ATLAS_OK;
}

void atlas_config_add_eos(atlas_config *cfg, int id) {
    for (int i = 0; i < cfg->n_eos; i++)
        if (cfg->eos_ids[i] == id) return;
    if (cfg->n_eos < ATLAS_MAX_EOS) cfg->eos_ids[cfg->n_eos++] = id;
}

/* eos_token_id: an integer, a list of integers, or null. */
static atlas_status read_eos(const char *file, json_t *obj, atlas_config *cfg) {
    json_t *v = field(obj, "eos_token_id");
    if (!v) return ATLAS_OK;
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (json_is_integer(e) && (json_integer_value(e) < 0 || json_integer_value(e) > INT32_MAX))
            return atlas_fail(ATLAS_ERR_RANGE, "%s: field \"eos_token_id\": %lld is not a token id",
                              file, (long long)json_integer_value(e));
        if (!json_is_integer(e)) {
            if (json_is_array(v))
                return atlas_fail(ATLAS_ERR_FORMAT,
                                  "%s: field \"eos_token_id[%zu]\": expected a token id, got %s",
                                  file, i, json_type_name(e));
            return wrong_type(file, "eos_token_id", "a token id or a list of them", v);
        }
        int id = (int)json_integer_value(e);
        bool seen = false;
        for (int k = 0; k < cfg->n_eos; k++) seen |= cfg->eos_ids[k] == id;
        if (!seen && cfg->n_eos == ATLAS_MAX_EOS)
            return atlas_fail(ATLAS_ERR_RANGE, "%s: field \"eos_token_id\": more than %d ids",
                              file, ATLAS_MAX_EOS);
        atlas_config_add_eos(cfg, id);
    }
    return ATLAS_OK;
}

/* The family from architectures[0], as vLLM takes it; model_type only where architectures is
 * absent. Where the two name different families (a config edited by hand or by a tool that
 * rewrote one), transformers would build model_type's class: atlas follows architectures,
 * and `atlas info`'s architecture line shows the class it took. */
static atlas_status read_arch(const char *file, json_t *root, atlas_config *cfg) {
    static const struct {
        const char *cls, *model_type;
        atlas_arch arch;
    } archs[] = {
        {"LlamaForCausalLM", "llama", ATLAS_ARCH_LLAMA},
        {"MistralForCausalLM", "mistral", ATLAS_ARCH_MISTRAL},
        {"Qwen2ForCausalLM", "qwen2", ATLAS_ARCH_QWEN2},
        {"Qwen3ForCausalLM", "qwen3", ATLAS_ARCH_QWEN3},
        {"Qwen3Model", "qwen3", ATLAS_ARCH_QWEN3}, /* Qwen3-Embedding saved without a head */
        {"Phi3ForCausalLM", "phi3", ATLAS_ARCH_PHI3},
        {"Gemma3ForCausalLM", "gemma3_text", ATLAS_ARCH_GEMMA3},
        {"Gemma3ForConditionalGeneration", "gemma3", ATLAS_ARCH_GEMMA3},
        {"Qwen3MoeForCausalLM", "qwen3_moe", ATLAS_ARCH_QWEN3_MOE},
        {"MixtralForCausalLM", "mixtral", ATLAS_ARCH_MIXTRAL},
        {"GptOssForCausalLM", "gpt_oss", ATLAS_ARCH_GPT_OSS},
    };
    json_t *list = field(root, "architectures");
    const char *name = NULL, *what = "architectures[0]";
    if (list) {
        if (!json_is_array(list) || json_array_size(list) == 0 ||
            !json_is_string(json_array_get(list, 0)))
            return wrong_type(file, "architectures", "a non-empty list of strings", list);
        name = json_string_value(json_array_get(list, 0));
    } else {
        json_t *mt = field(root, "model_type");
        if (!mt) return atlas_fail(ATLAS_ERR_FORMAT, "%s: missing field \"architectures\"", file);
        if (!json_is_string(mt)) return wrong_type(file, "model_type", "a string", mt);
        name = json_string_value(mt);
        what = "model_type";
    }
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) {
        if (strcmp(name, list ? archs[i].cls : archs[i].model_type) != 0) continue;
        cfg->arch = archs[i].arch;
        cfg->nested_text = !strcmp(archs[i].cls, "Gemma3ForConditionalGeneration");
        snprintf(cfg->architecture, sizeof cfg->architecture, "%s", archs[i].cls);
        return ATLAS_OK;
    }
    return atlas_fail(ATLAS_ERR_UNSUPPORTED,
                      "%s: field \"%s\": unsupported architecture \"%.64s\" (supported: "
                      "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                      "Qwen3Model, Phi3ForCausalLM, Gemma3ForCausalLM, "
                      "Gemma3ForConditionalGeneration, Qwen3MoeForCausalLM, MixtralForCausalLM, "
                      "GptOssForCausalLM)",
                      file, what, name);
}

static atlas_status read_dtype(const char *file, json_t *root, atlas_config *cfg) {
    const char *key = field(root, "dtype") ? "dtype" : "torch_dtype";
    json_t *v = field(root, key);
    cfg->dtype = ATLAS_DTYPE_BF16;
    if (!v) return ATLAS_OK;
    if (!json_is_string(v)) return wrong_type(file, key, "a string", v);
    const char *s = json_string_value(v);
    if (!strcmp(s, "bfloat16"))
        cfg->dtype = ATLAS_DTYPE_BF16;
    else if (!strcmp(s, "float16") || !strcmp(s, "half"))
        cfg->dtype = ATLAS_DTYPE_F16;
    else if (!strcmp(s, "float32") || !strcmp(s, "float"))
        cfg->dtype = ATLAS_DTYPE_F32;
    else
        return atlas_fail(ATLAS_ERR_UNSUPPORTED,
                          "%s: field \"%s\": unsupported dtype \"%.32s\" (bfloat16, float16, "
                          "float32 are)", file, key, s);
    return ATLAS_OK;
}

/* ---- RoPE parameters ------------------------------------------------------------------ */

/* A rope parameter, named in messages with the object that holds it. */
static atlas_status rope_num(const char *file, const char *obj_name, json_t *p, const char *key,
                             bool required, double *out) {
    char name[96];
    snprintf(name, sizeof name, "%s.%s", obj_name, key);
    json_t *v = field(p, key);
    if (!v) {
        if (required)
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: missing field \"%s\"", file, name);
        return ATLAS_OK;
    }
    if (!json_is_number(v)) return wrong_type(file, name, "a number", v);
    double x = json_number_value(v);
    if (!isfinite(x)) return atlas_fail(ATLAS_ERR_RANGE, "%s: field \"%s\" is not finite", file,
                                        name);
    *out = x;
    return ATLAS_OK;
}

static atlas_status rope_type_of(const char *file, const char *pname, json_t *p,
                                 atlas_rope_type *out) {
    const char *key = field(p, "rope_type") ? "rope_type" : "type";
    json_t *v = field(p, key);
    *out = ATLAS_ROPE_DEFAULT;
    if (!v) return ATLAS_OK;
    char name[64];
    snprintf(name, sizeof name, "%s.%s", pname, key);
    if (!json_is_string(v)) return wrong_type(file, name, "a string", v);
    static const char *const names[] = {"default", "linear", "llama3", "yarn", "longrope"};
    for (int i = 0; i < 5; i++)
        if (!strcmp(json_string_value(v), names[i])) {
            *out = (atlas_rope_type)i;
            return ATLAS_OK;
        }
    return atlas_fail(ATLAS_ERR_UNSUPPORTED,
                      "%s: field \"%s\": unsupported RoPE type \"%.32s\" (default, linear, "
                      "llama3, yarn, longrope are)", file, name, json_string_value(v));
}

/* One of longrope's factor lists: rope_dim / 2 positive numbers, as transformers checks. */
static atlas_status rope_factors(const char *file, const char *pname, json_t *p,
                                 const char *key, int n, double *out) {
    json_t *v = field(p, key);
    char name[96];
    snprintf(name, sizeof name, "%s.%s", pname, key);
    if (!v) return atlas_fail(ATLAS_ERR_FORMAT, "%s: missing field \"%s\"", file, name);
    if (!json_is_array(v) || json_array_size(v) != (size_t)n)
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: field \"%s\": expected a list of %d numbers "
                          "(half the rotary dimension)", file, name, n);
    for (int i = 0; i < n; i++) {
        json_t *e = json_array_get(v, (size_t)i);
        double x = json_is_number(e) ? json_number_value(e) : -1;
        if (!(x > 0) || !isfinite(x))
            return atlas_fail(ATLAS_ERR_RANGE, "%s: field \"%s[%d]\": want a positive number",
                              file, name, i);
        out[i] = x;
    }
    return ATLAS_OK;
}

/* transformers' _compute_longrope_parameters: with original_max_position_embeddings (the
 * dict's, else the top level's, as Phi3Config keeps it) the factor is max_position_embeddings
 * over it, whatever the dict's factor says; without, the dict's factor over
 * max_position_embeddings. The attention factor, unless given, is sqrt(1 + ln(factor) /
 * ln(original maximum)), 1 for a factor <= 1. r->original_max_position holds the top
 * level's (0: absent) on entry. */
static atlas_status longrope_params(const char *file, const char *pname, json_t *p,
                                    atlas_config *cfg) {
    atlas_rope *r = &cfg->rope;
    int n = cfg->rope_dim / 2;
    if (n > ATLAS_MAX_ROPE_FACTORS)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: field \"%s\": longrope over %d "
                          "frequencies (at most %d are supported)", file, pname, n,
                          ATLAS_MAX_ROPE_FACTORS);
    r->n_factors = n;
    ATLAS_TRY(rope_factors(file, pname, p, "short_factor", n, r->short_factor));
    ATLAS_TRY(rope_factors(file, pname, p, "long_factor", n, r->long_factor));
    double omax = 0, factor = 0;
    ATLAS_TRY(rope_num(file, pname, p, "original_max_position_embeddings", false, &omax));
    ATLAS_TRY(rope_num(file, pname, p, "factor", false, &factor));
    ATLAS_TRY(rope_num(file, pname, p, "attention_factor", false, &r->attention_factor));
    if (omax == 0) omax = r->original_max_position;
    if (omax != 0 && (omax < 1 || omax > INT32_MAX || omax != floor(omax)))
        return atlas_fail(ATLAS_ERR_RANGE, "%s: field \"%s.original_max_position_embeddings\": "
                          "%g is not a positive integer", file, pname, omax);
    if (omax != 0) {
        factor = (double)cfg->max_position / omax;
    } else {
        omax = cfg->max_position;
        if (factor == 0) factor = 1;
    }
    if (!(factor > 0) || r->attention_factor < 0)
        return atlas_fail(ATLAS_ERR_RANGE, "%s: field \"%s\": factor %g and attention_factor "
                          "%g must be positive", file, pname, factor, r->attention_factor);
    r->original_max_position = (int)omax;
    r->factor = factor;
    if (r->attention_factor == 0)
        r->attention_factor = factor <= 1 ? 1.0 : sqrt(1 + log(factor) / log(omax));
    return ATLAS_OK;
}

/* The type-specific parameters, as transformers' validation requires them. */
static atlas_status rope_scaling_params(const char *file, const char *pname, json_t *p,
                                        atlas_config *cfg) {
    atlas_rope *r = &cfg->rope;
    double omax = cfg->max_position;
    switch (r->type) {
    case ATLAS_ROPE_DEFAULT: return ATLAS_OK;
    case ATLAS_ROPE_LINEAR: ATLAS_TRY(rope_num(file, pname, p, "factor", true, &r->factor)); break;
    case ATLAS_ROPE_LLAMA3:
        ATLAS_TRY(rope_num(file, pname, p, "factor", true, &r->factor));
        ATLAS_TRY(rope_num(file, pname, p, "low_freq_factor", true, &r->low_freq_factor));
        ATLAS_TRY(rope_num(file, pname, p, "high_freq_factor", true, &r->high_freq_factor));
        ATLAS_TRY(rope_num(file, pname, p, "original_max_position_embeddings", false, &omax));
        if (!(r->high_freq_factor > r->low_freq_factor) || !(r->low_freq_factor > 0))
            return atlas_fail(ATLAS_ERR_RANGE,
                              "%s: field \"%s\": need 0 < low_freq_factor < high_freq_factor",
                              file, pname);
        break;
    case ATLAS_ROPE_LONGROPE: return longrope_params(file, pname, p, cfg);
    case ATLAS_ROPE_YARN:
        r->factor = 0;
        ATLAS_TRY(rope_num(file, pname, p, "factor", false, &r->factor));
        ATLAS_TRY(rope_num(file, pname, p, "original_max_position_embeddings", false, &omax));
        ATLAS_TRY(rope_num(file, pname, p, "attention_factor", false, &r->attention_factor));
        ATLAS_TRY(rope_num(file, pname, p, "mscale", false, &r->mscale));
        ATLAS_TRY(rope_num(file, pname, p, "mscale_all_dim", false, &r->mscale_all_dim));
        ATLAS_TRY(rope_num(file, pname, p, "beta_fast", false, &r->beta_fast));
        ATLAS_TRY(rope_num(file, pname, p, "beta_slow", false, &r->beta_slow));
        /* transformers: `get("beta_fast") or 32` — a zero means the default too. */
        if (r->beta_fast == 0) r->beta_fast = 32;
        if (r->beta_slow == 0) r->beta_slow = 1;
        if (r->beta_fast < 0 || r->beta_slow < 0 || r->attention_factor < 0 || r->mscale < 0 ||
            r->mscale_all_dim < 0)
            return atlas_fail(ATLAS_ERR_RANGE,
                              "%s: field \"%s\": beta_fast, beta_slow, attention_factor, mscale "
                              "and mscale_all_dim must not be negative", file, pname);
        json_t *t = field(p, "truncate");
        if (t && !json_is_boolean(t)) {
            char name[96];
            snprintf(name, sizeof name, "%s.truncate", pname);
            return wrong_type(file, name, "a boolean", t);
        }
        r->truncate = t ? json_is_true(t) : true;
        break;
    }
    if (omax < 1 || omax > INT32_MAX || omax != floor(omax))
        return atlas_fail(ATLAS_ERR_RANGE,
                          "%s: field \"%s.original_max_position_embeddings\": %g is not a "
                          "positive integer", file, pname, omax);
    r->original_max_position = (int)omax;
    if (r->type == ATLAS_ROPE_YARN && r->factor == 0)
        r->factor = (double)cfg->max_position / r->original_max_position;
    if (r->factor <= 0)
        return atlas_fail(ATLAS_ERR_RANGE, "%s: field \"%s.factor\": %g is not positive", file,
                          pname, r->factor);
    return ATLAS_OK;
}

/* The context atlas_config_max_context derives from the factor, checked in double before
 * anything converts it: a factor of 1e30 (or 1e-30) would give a context no int holds (or 0
 * tokens), which a server would advertise and then refuse every request against. */
static atlas_status check_context(const char *file, const char *pname, const atlas_config *cfg) {
    const atlas_rope *r = &cfg->rope;
    double base;
    const char *of;
    if (r->type == ATLAS_ROPE_LINEAR) {
        base = cfg->max_position;
        of = "max_position_embeddings";
    } else if (r->type == ATLAS_ROPE_YARN) {
        base = r->original_max_position;
        of = "original_max_position_embeddings";
    } else {
        return ATLAS_OK; /* llama3's max_position_embeddings is the scaled maximum already */
    }
    double ctx = floor(base * r->factor);
    if (isfinite(r->factor) && ctx >= 1 && ctx <= INT32_MAX) return ATLAS_OK;
    return atlas_fail(ATLAS_ERR_RANGE,
                      "%s: field \"%s.factor\": %g times %s %.0f gives a context of %g tokens "
                      "(1 to %d are possible)", file, pname, r->factor, of, base, ctx, INT32_MAX);
}

/* The rotated part of a head: int(head_dim * partial_rotary_factor), as transformers takes
 * it. Only Phi3 rotates part of a head (its attention passes the rest through); another
 * family given a factor would compute a different model, so it is refused. */
static atlas_status set_rope_dim(const char *file, const char *where, double partial,
                                 atlas_config *cfg) {
    const char *dot = strcmp(where, "partial_rotary_factor") ? "." : "";
    const char *pre = *dot ? where : "";
    if (partial != 1.0 && cfg->arch != ATLAS_ARCH_PHI3)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: field \"%s%spartial_rotary_factor\": %g "
                          "(only 1 is supported for %s)", file, pre, dot, partial,
                          cfg->architecture);
    double dim = floor(cfg->head_dim * partial);
    if (!(partial > 0 && partial <= 1) || dim < 2 || fmod(dim, 2) != 0)
        return atlas_fail(ATLAS_ERR_RANGE, "%s: field \"%s%spartial_rotary_factor\": %g of "
                          "head_dim %d is not a positive even number of dimensions", file, pre,
                          dot, partial, cfg->head_dim);
    cfg->rope_dim = (int)dim;
    return ATLAS_OK;
}

/* The parameters of one RoPE dict p (named pname in messages) into cfg->rope: rope_theta
 * inside it wins over what cfg->rope holds. */
static atlas_status rope_dict(const char *file, const char *pname, json_t *p, double *partial,
                              atlas_config *cfg) {
    atlas_rope *r = &cfg->rope;
    ATLAS_TRY(rope_num(file, pname, p, "rope_theta", false, &r->theta));
    ATLAS_TRY(rope_num(file, pname, p, "partial_rotary_factor", false, partial));
    ATLAS_TRY(set_rope_dim(file, pname, *partial, cfg));
    ATLAS_TRY(rope_type_of(file, pname, p, &r->type));
    ATLAS_TRY(rope_scaling_params(file, pname, p, cfg));
    return check_context(file, pname, cfg);
}

static void rope_defaults(atlas_rope *r, double theta, int max_position) {
    memset(r, 0, sizeof *r);
    r->theta = theta, r->factor = 1.0, r->beta_fast = 32, r->beta_slow = 1;
    r->truncate = true, r->original_max_position = max_position;
}

static atlas_status check_theta(const char *file, const char *what, double theta) {
    return theta > 1.0 ? ATLAS_OK : atlas_fail(ATLAS_ERR_RANGE, "%s: field \"%s\": %g must be "
                                               "above 1", file, what, theta);
}

/* An optional object field; *out NULL when absent or null. */
static atlas_status get_object(const char *file, json_t *obj, const char *key, json_t **out) {
    *out = field(obj, key);
    if (*out && !json_is_object(*out)) return wrong_type(file, key, "an object", *out);
    return ATLAS_OK;
}

/* Gemma 3: full-attention layers rotate with rope_theta (default 1e6) and rope_scaling,
 * sliding ones with rope_local_base_freq (default 1e4) and no scaling, as transformers'
 * Gemma3TextConfig sets them up; transformers 5 spells both as rope_parameters with a
 * "full_attention" and a "sliding_attention" entry (rope_theta inside each). */
static atlas_status read_rope_gemma3(const char *file, json_t *root, atlas_config *cfg) {
    json_t *rs, *rp, *full = NULL, *slide = NULL;
    double local = 10000.0, partial = 1.0;
    ATLAS_TRY(get_num(file, root, "rope_local_base_freq", &local));
    ATLAS_TRY(get_object(file, root, "rope_scaling", &rs));
    ATLAS_TRY(get_object(file, root, "rope_parameters", &rp));
    if (rp) {
        full = json_object_get(rp, "full_attention");
        slide = json_object_get(rp, "sliding_attention");
        if ((!full && !slide) || (full && !json_is_object(full)) ||
            (slide && !json_is_object(slide)))
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: field \"rope_parameters\": expected the "
                              "per-layer-type objects \"full_attention\" and "
                              "\"sliding_attention\" (%s)", file, cfg->architecture);
    }
    if (rs && json_object_size(rs) > 0)
        ATLAS_TRY(rope_dict(file, "rope_scaling", rs, &partial, cfg));
    else if (full)
        ATLAS_TRY(rope_dict(file, "rope_parameters.full_attention", full, &partial, cfg));
    atlas_config *tmp = malloc(sizeof *tmp); /* the sliding layers' set, read as the other */
    if (!tmp) return atlas_fail(ATLAS_ERR_NOMEM, "%s: out of memory", file);
    *tmp = *cfg;
    rope_defaults(&tmp->rope, local, cfg->max_position);
    atlas_status st = slide ? rope_dict(file, "rope_parameters.sliding_attention", slide,
                                        &partial, tmp) : ATLAS_OK;
    cfg->rope_local = tmp->rope;
    free(tmp);
    ATLAS_TRY(st);
    cfg->has_rope_local = true;
    if (cfg->rope_local.original_max_position == 0)
        cfg->rope_local.original_max_position = cfg->max_position;
    return check_theta(file, slide ? "rope_parameters.sliding_attention.rope_theta"
                                   : "rope_local_base_freq", cfg->rope_local.theta);
}

/* rope_scaling (classic) wins over rope_parameters (transformers 5), as in transformers'
 * convert_rope_params_to_dict; rope_theta inside the dict wins over the top-level one. */
static atlas_status read_rope(const char *file, json_t *root, atlas_config *cfg) {
    atlas_rope *r = &cfg->rope;
    bool big_theta = cfg->arch == ATLAS_ARCH_GEMMA3 || cfg->arch == ATLAS_ARCH_MIXTRAL;
    rope_defaults(r, big_theta ? 1000000.0 : 10000.0, cfg->max_position);
    if (cfg->arch == ATLAS_ARCH_GPT_OSS) atlas_config_gpt_oss_rope(r);
    ATLAS_TRY(get_num(file, root, "rope_theta", &r->theta));
    /* Phi3Config keeps these two at the top level (transformers 5 moves them into the dict);
     * transformers' RoPE reads a top-level partial_rotary_factor of any family's config, so
     * it is read for every family (set_rope_dim refuses it where only 1 is supported) */
    double partial = 1.0;
    ATLAS_TRY(get_num(file, root, "partial_rotary_factor", &partial));
    if (cfg->arch == ATLAS_ARCH_PHI3) {
        r->original_max_position = 0;
        ATLAS_TRY(get_int(file, root, "original_max_position_embeddings", false, 1, INT32_MAX,
                          &r->original_max_position));
    }
    ATLAS_TRY(set_rope_dim(file, "partial_rotary_factor", partial, cfg));
    if (cfg->arch == ATLAS_ARCH_GEMMA3) {
        ATLAS_TRY(read_rope_gemma3(file, root, cfg));
    } else {
        const char *pname = "rope_scaling";
        json_t *p = field(root, pname);
        if (p && !json_is_object(p)) return wrong_type(file, pname, "an object", p);
        if (!p || json_object_size(p) == 0) {
            pname = "rope_parameters";
            p = field(root, pname);
            if (p && !json_is_object(p)) return wrong_type(file, pname, "an object", p);
        }
        if (p && json_is_object(json_object_get(p, "full_attention")))
            return atlas_fail(ATLAS_ERR_UNSUPPORTED,
                              "%s: field \"%s\": per-layer-type RoPE parameters are not "
                              "supported for %s", file, pname, cfg->architecture);
        if (p) ATLAS_TRY(rope_dict(file, pname, p, &partial, cfg));
    }
    if (r->original_max_position == 0) r->original_max_position = cfg->max_position;
    return check_theta(file, "rope_theta", r->theta);
}

/* ---- the whole config ------------------------------------------------------------------ */

static atlas_status read_sizes(const char *file, json_t *root, atlas_config *cfg) {
    /* Gemma3TextConfig gives every size a default (a published text_config omits most) */
    bool gemma = cfg->arch == ATLAS_ARCH_GEMMA3, need = !gemma;
    if (gemma) {
        cfg->vocab_size = 262208, cfg->hidden = 2304, cfg->intermediate = 9216;
        cfg->n_layers = 26, cfg->n_heads = 8;
    }
    ATLAS_TRY(get_int(file, root, "vocab_size", need, 1, INT32_MAX, &cfg->vocab_size));
    ATLAS_TRY(get_int(file, root, "hidden_size", need, 1, CFG_MAX_DIM, &cfg->hidden));
    ATLAS_TRY(get_int(file, root, "intermediate_size", need, 1, CFG_MAX_DIM, &cfg->intermediate));
    ATLAS_TRY(get_int(file, root, "num_hidden_layers", need, 1, ATLAS_MAX_LAYERS,
                      &cfg->n_layers));
    ATLAS_TRY(get_int(file, root, "num_attention_heads", need, 1, 4096, &cfg->n_heads));
    /* Absent: the class default (Mistral 8, Qwen2/Qwen3 32, Gemma3 4); null or Llama: the
     * heads. */
    json_t *kv = json_object_get(root, "num_key_value_heads");
    cfg->n_kv_heads = cfg->n_heads;
    if (!kv && (cfg->arch == ATLAS_ARCH_MISTRAL || cfg->arch == ATLAS_ARCH_MIXTRAL))
        cfg->n_kv_heads = 8;
    if (!kv && cfg->arch == ATLAS_ARCH_QWEN3_MOE) cfg->n_kv_heads = 4;
    if (!kv && (cfg->arch == ATLAS_ARCH_QWEN2 || cfg->arch == ATLAS_ARCH_QWEN3))
        cfg->n_kv_heads = 32;
    if (!kv && gemma) cfg->n_kv_heads = 4;
    if (!kv && cfg->arch == ATLAS_ARCH_GPT_OSS) cfg->n_kv_heads = 8;
    ATLAS_TRY(get_int(file, root, "num_key_value_heads", false, 1, 4096, &cfg->n_kv_heads));
    if (cfg->n_heads % cfg->n_kv_heads != 0)
        return atlas_fail(ATLAS_ERR_RANGE,
                          "%s: field \"num_key_value_heads\": %d does not divide "
                          "num_attention_heads %d", file, cfg->n_kv_heads, cfg->n_heads);
    /* Qwen3Config defaults head_dim to 128, Gemma3TextConfig to 256; the others (Qwen3-MoE
     * too: Qwen3MoeConfig has no default) derive it. */
    bool oss = cfg->arch == ATLAS_ARCH_GPT_OSS, fixed = cfg->arch == ATLAS_ARCH_QWEN3 || gemma;
    bool derived = !field(root, "head_dim") && !fixed && !oss;
    cfg->head_dim = oss ? 64 : fixed ? (gemma ? 256 : 128) : cfg->hidden / cfg->n_heads;
    ATLAS_TRY(get_int(file, root, "head_dim", false, 2, 65536, &cfg->head_dim));
    if (derived && cfg->hidden % cfg->n_heads != 0)
        return atlas_fail(ATLAS_ERR_RANGE,
                          "%s: field \"hidden_size\": %d is not a multiple of num_attention_heads "
                          "%d (and there is no head_dim)", file, cfg->hidden, cfg->n_heads);
    if (cfg->head_dim % 2 != 0 || cfg->head_dim == 0)
        return atlas_fail(ATLAS_ERR_RANGE, "%s: field \"head_dim\": %d is not a positive even "
                          "number", file, cfg->head_dim);
    return ATLAS_OK;
}

/* Per-class defaults from transformers (values absent from config.json). */
static void class_defaults(atlas_config *cfg) {
    cfg->max_position = 2048;
    cfg->rms_eps = 1e-6;
    switch (cfg->arch) {
    case ATLAS_ARCH_LLAMA: break;
    case ATLAS_ARCH_MISTRAL:
        cfg->max_position = 4096 * 32;
        cfg->sliding_window = 4096;
        break;
    case ATLAS_ARCH_MIXTRAL: /* MixtralConfig: sliding_window None */
        cfg->max_position = 4096 * 32;
        cfg->rms_eps = 1e-5;
        break;
    case ATLAS_ARCH_QWEN2:
    case ATLAS_ARCH_QWEN3:
    case ATLAS_ARCH_QWEN3_MOE:
        cfg->max_position = 32768;
        cfg->sliding_window = 4096; /* used only with use_sliding_window */
        break;
    case ATLAS_ARCH_PHI3:
        cfg->max_position = 4096;
        cfg->rms_eps = 1e-5;
        break;
    case ATLAS_ARCH_GEMMA3:
        cfg->max_position = 131072;
        cfg->sliding_window = 4096;
        break;
    case ATLAS_ARCH_GPT_OSS:
        cfg->max_position = 131072;
        cfg->rms_eps = 1e-5;
        cfg->sliding_window = 128;
        break;
    }
}

/* Gemma3TextConfig without layer_types: every sliding_window_pattern-th layer (1-based) is
 * a full one, the others slide. */
static atlas_status gemma3_pattern(const char *file, json_t *root, atlas_config *cfg) {
    int pattern = 6;
    ATLAS_TRY(get_int(file, root, "sliding_window_pattern", false, 1, INT32_MAX, &pattern));
    cfg->layer_kinds = true;
    for (int i = 0; i < cfg->n_layers; i++) cfg->layer_sliding[i] = (i + 1) % pattern != 0;
    return ATLAS_OK;
}

/* Mistral, Mixtral and Phi3 slide on every layer (their configs have no layer_types);
 * Qwen2/3 only with use_sliding_window, from max_window_layers on, or layer by layer as
 * layer_types says (Qwen3-MoE: every layer, as Qwen3MoeAttention has it); Gemma3 as
 * layer_types or its pattern says. */
static atlas_status read_sliding(const char *file, json_t *root, atlas_config *cfg) {
    if (cfg->arch == ATLAS_ARCH_LLAMA) return ATLAS_OK;
    json_t *sw = json_object_get(root, "sliding_window");
    if (json_is_null(sw)) cfg->sliding_window = 0;
    ATLAS_TRY(get_int(file, root, "sliding_window", false, 0, INT32_MAX, &cfg->sliding_window));
    bool qwen3_moe = cfg->arch == ATLAS_ARCH_QWEN3_MOE;
    if (cfg->arch == ATLAS_ARCH_QWEN2 || cfg->arch == ATLAS_ARCH_QWEN3 || qwen3_moe) {
        bool use = false;
        int from = qwen3_moe ? 0 : 28;
        ATLAS_TRY(get_bool(file, root, "use_sliding_window", &use));
        if (!qwen3_moe)
            ATLAS_TRY(get_int(file, root, "max_window_layers", false, 0, INT32_MAX, &from));
        if (!use) cfg->sliding_window = 0;
        cfg->sliding_from_layer = from;
    }
    bool every = cfg->arch == ATLAS_ARCH_MISTRAL || cfg->arch == ATLAS_ARCH_PHI3 ||
                 cfg->arch == ATLAS_ARCH_MIXTRAL || qwen3_moe;
    json_t *lt = every ? NULL : field(root, "layer_types");
    if (!lt && cfg->arch == ATLAS_ARCH_GEMMA3) return gemma3_pattern(file, root, cfg);
    if (!lt && cfg->arch == ATLAS_ARCH_GPT_OSS) { /* GptOssConfig: even layers slide */
        cfg->layer_kinds = true;
        for (int i = 0; i < cfg->n_layers; i++) cfg->layer_sliding[i] = i % 2 == 0;
        return ATLAS_OK;
    }
    if (!lt) return ATLAS_OK;
    if (!json_is_array(lt) || json_array_size(lt) != (size_t)cfg->n_layers)
        return atlas_fail(ATLAS_ERR_FORMAT,
                          "%s: field \"layer_types\": expected a list of %d strings", file,
                          cfg->n_layers);
    int first = cfg->n_layers;
    for (int i = 0; i < cfg->n_layers; i++) {
        const char *s = json_string_value(json_array_get(lt, (size_t)i));
        bool sliding = s && !strcmp(s, "sliding_attention");
        if (!s || (!sliding && strcmp(s, "full_attention") != 0))
            return atlas_fail(ATLAS_ERR_UNSUPPORTED,
                              "%s: field \"layer_types[%d]\": expected \"full_attention\" or "
                              "\"sliding_attention\"", file, i);
        if (sliding && first == cfg->n_layers) first = i;
        cfg->layer_sliding[i] = sliding;
    }
    cfg->layer_kinds = true;
    cfg->sliding_from_layer = first;
    return ATLAS_OK;
}

/* The MLP is act(gate) * up. transformers' ACT2FN maps "swish" to the same SiLU; Gemma 3
 * reads hidden_activation (its hidden_act is ignored there, as transformers does) and gates
 * with gelu_pytorch_tanh. Any other activation would be computed as another without a word,
 * so it is refused. */
static atlas_status read_act(const char *file, json_t *root, atlas_config *cfg) {
    bool gemma = cfg->arch == ATLAS_ARCH_GEMMA3;
    const char *key = gemma ? "hidden_activation" : "hidden_act";
    if (cfg->arch == ATLAS_ARCH_GPT_OSS) { /* its experts gate their own way, whatever it says */
        cfg->act = ATLAS_ACT_SWIGLU_CLAMP;
        return ATLAS_OK;
    }
    cfg->act = gemma ? ATLAS_ACT_GELU_TANH : ATLAS_ACT_SILU; /* the classes' defaults */
    json_t *v = field(root, key);
    if (!v) return ATLAS_OK;
    if (!json_is_string(v)) return wrong_type(file, key, "a string", v);
    const char *s = json_string_value(v);
    if (!gemma && (!strcmp(s, "silu") || !strcmp(s, "swish"))) return ATLAS_OK;
    if (gemma && !strcmp(s, "gelu_pytorch_tanh")) return ATLAS_OK;
    return atlas_fail(ATLAS_ERR_UNSUPPORTED,
                      "%s: field \"%s\": unsupported activation \"%.32s\" (%s is: the MLP "
                      "is %s)", file, key, s, gemma ? "gelu_pytorch_tanh" : "silu",
                      gemma ? "GeGLU" : "SwiGLU");
}

/* Gemma 3's own fields: query_pre_attn_scalar, and Gemma 2's soft-capping refused by name
 * (computed without it, the model would be another; EmbeddingGemma's bidirectional attention
 * is refused with every family's, read_attention_kind). */
static atlas_status read_gemma3(const char *file, json_t *root, atlas_config *cfg) {
    static const char *const capping[] = {"final_logit_softcapping", "attn_logit_softcapping"};
    for (int i = 0; i < 2; i++)
        if (field(root, capping[i]))
            return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: field \"%s\": soft-capping (Gemma 2) "
                              "is not supported; Gemma 3 has it null", file, capping[i]);
    double q = 256;
    ATLAS_TRY(get_num(file, root, "query_pre_attn_scalar", &q));
    if (!(q > 0))
        return atlas_fail(ATLAS_ERR_RANGE, "%s: field \"query_pre_attn_scalar\": %g is not "
                          "positive", file, q);
    cfg->attn_scale = 1.0 / sqrt(q);
    cfg->embed_scale = (float)sqrt((double)cfg->hidden);
    cfg->norm_plus_one = true;
    cfg->post_norms = true;
    cfg->qk_norm = true;
    return ATLAS_OK;
}

static atlas_status read_flags(const char *file, json_t *root, atlas_config *cfg) {
    bool gemma = cfg->arch == ATLAS_ARCH_GEMMA3, attn_bias = cfg->arch == ATLAS_ARCH_GPT_OSS;
    cfg->tie_embeddings = gemma; /* Gemma3TextConfig ties; the other classes do not */
    ATLAS_TRY(get_bool(file, root, "tie_word_embeddings", &cfg->tie_embeddings));
    bool qwen3 = cfg->arch == ATLAS_ARCH_QWEN3 || cfg->arch == ATLAS_ARCH_QWEN3_MOE;
    if (cfg->arch == ATLAS_ARCH_LLAMA || qwen3 || gemma || cfg->arch == ATLAS_ARCH_GPT_OSS)
        ATLAS_TRY(get_bool(file, root, "attention_bias", &attn_bias));
    if (cfg->arch == ATLAS_ARCH_LLAMA)
        ATLAS_TRY(get_bool(file, root, "mlp_bias", &cfg->mlp_bias));
    cfg->qkv_bias = cfg->arch == ATLAS_ARCH_QWEN2 || attn_bias;
    cfg->o_bias = attn_bias;
    cfg->qk_norm = qwen3;
    cfg->fused_proj = cfg->arch == ATLAS_ARCH_PHI3;
    cfg->embed_scale = 1.0;
    if (gemma) ATLAS_TRY(read_gemma3(file, root, cfg));
    return read_act(file, root, cfg);
}

/* The forward attends causally: a checkpoint trained with bidirectional attention (gte-Qwen2
 * and EmbeddingGemma-like embedders say so in config.json) would give other vectors with no
 * error, so it is refused by name. */
static atlas_status read_attention_kind(const char *file, json_t *root) {
    bool causal = true, bidirectional = false;
    ATLAS_TRY(get_bool(file, root, "is_causal", &causal));
    ATLAS_TRY(get_bool(file, root, "use_bidirectional_attention", &bidirectional));
    json_t *name = field(root, "_name_or_path");
    const char *why = !causal ? "\"is_causal\": false"
                      : bidirectional ? "\"use_bidirectional_attention\": true"
                      : json_is_string(name) && strstr(json_string_value(name), "gte-Qwen2")
                          ? "\"_name_or_path\" names gte-Qwen2"
                          : NULL;
    if (!why) return ATLAS_OK;
    return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: %s: a model with bidirectional attention "
                      "(gte-Qwen2 and the like) is not supported: atlas attends causally",
                      file, why);
}

/* vLLM's is_matryoshka and matryoshka_dimensions: the widths a vector may be cut to. With
 * is_matryoshka and no list, any width from 1 to hidden (vLLM's reading). */
static atlas_status read_matryoshka(const char *file, json_t *root, atlas_config *cfg) {
    bool on = false;
    ATLAS_TRY(get_bool(file, root, "is_matryoshka", &on));
    json_t *dims = field(root, "matryoshka_dimensions");
    cfg->n_matryoshka = 0;
    if (!dims) {
        cfg->matryoshka_any = on;
        return ATLAS_OK;
    }
    if (!json_is_array(dims) || json_array_size(dims) == 0 ||
        json_array_size(dims) > ATLAS_MAX_MATRYOSHKA)
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: field \"matryoshka_dimensions\": expected a "
                          "list of 1 to %d widths", file, ATLAS_MAX_MATRYOSHKA);
    for (size_t i = 0; i < json_array_size(dims); i++) {
        json_t *v = json_array_get(dims, i);
        if (!json_is_integer(v) || json_integer_value(v) < 1 ||
            json_integer_value(v) > cfg->hidden)
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: field \"matryoshka_dimensions\"[%zu]: "
                              "expected a width in 1..%d (hidden_size)", file, i, cfg->hidden);
        cfg->matryoshka[cfg->n_matryoshka++] = (int)json_integer_value(v);
    }
    return ATLAS_OK;
}

/* The model's own fields: config.json's top level, or Gemma3ForConditionalGeneration's
 * text_config (named in messages as "FILE: text_config"). */
static atlas_status parse_text(const char *file, json_t *root, atlas_config *cfg) {
    class_defaults(cfg);
    ATLAS_TRY(read_sizes(file, root, cfg));
    ATLAS_TRY(get_int(file, root, "max_position_embeddings", false, 1, INT32_MAX,
                      &cfg->max_position));
    ATLAS_TRY(get_num(file, root, "rms_norm_eps", &cfg->rms_eps));
    if (!(cfg->rms_eps > 0 && cfg->rms_eps < 1))
        return atlas_fail(ATLAS_ERR_RANGE, "%s: field \"rms_norm_eps\": %g is not in (0, 1)",
                          file, cfg->rms_eps);
    ATLAS_TRY(read_flags(file, root, cfg));
    ATLAS_TRY(atlas_config_read_moe(file, root, cfg));
    ATLAS_TRY(read_sliding(file, root, cfg));
    ATLAS_TRY(read_dtype(file, root, cfg));
    ATLAS_TRY(read_rope(file, root, cfg));
    ATLAS_TRY(read_attention_kind(file, root));
    return read_matryoshka(file, root, cfg);
}

/* Gemma3ForConditionalGeneration: the text model's fields in text_config (absent: every
 * default), the dtype there or at the top level; the top level's tie_word_embeddings, bos and
 * eos (Gemma3Config's) join the text_config's. */
static atlas_status parse_nested(const char *file, json_t *root, atlas_config *cfg) {
    json_t *text;
    ATLAS_TRY(get_object(file, root, "text_config", &text));
    json_t *empty = json_object();
    if (!empty) return atlas_fail(ATLAS_ERR_NOMEM, "%s: out of memory", file);
    char tfile[1200];
    snprintf(tfile, sizeof tfile, "%s: text_config", file);
    atlas_status st = parse_text(tfile, text ? text : empty, cfg);
    json_decref(empty);
    ATLAS_TRY(st);
    if (!text || (!field(text, "dtype") && !field(text, "torch_dtype")))
        ATLAS_TRY(read_dtype(file, root, cfg));
    ATLAS_TRY(get_bool(file, root, "tie_word_embeddings", &cfg->tie_embeddings));
    if (text) {
        ATLAS_TRY(get_int(tfile, text, "bos_token_id", false, 0, INT32_MAX, &cfg->bos_id));
        ATLAS_TRY(read_eos(tfile, text, cfg));
    }
    return ATLAS_OK;
}

static atlas_status parse_root(const char *file, json_t *root, atlas_config *cfg) {
    ATLAS_TRY(atlas_quant_config_parse(file, json_object_get(root, "quantization_config"),
                                       &cfg->quant));
    ATLAS_TRY(read_arch(file, root, cfg));
    ATLAS_TRY(cfg->nested_text ? parse_nested(file, root, cfg) : parse_text(file, root, cfg));
    ATLAS_TRY(get_int(file, root, "bos_token_id", false, 0, INT32_MAX, &cfg->bos_id));
    ATLAS_TRY(read_eos(file, root, cfg));
    if (cfg->arch == ATLAS_ARCH_GEMMA3 && cfg->bos_id < 0) cfg->bos_id = 2; /* its defaults */
    if (cfg->arch == ATLAS_ARCH_GEMMA3 && cfg->n_eos == 0) atlas_config_add_eos(cfg, 1);
    return ATLAS_OK;
}

static void config_init(atlas_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->bos_id = -1;
    cfg->gen_top_k = -1;
    cfg->gen_do_sample = -1;
}

atlas_status atlas_config_parse(const char *json, size_t len, const char *name,
                                atlas_config *out) {
    const char *file = name ? name : "config.json";
    config_init(out);
    json_t *root;
    ATLAS_TRY(load_json(json, len, file, &root));
    atlas_status s = parse_root(file, root, out);
    json_decref(root);
    return s;
}

atlas_status atlas_config_parse_generation(const char *json, size_t len, const char *name,
                                           atlas_config *cfg) {
    const char *file = name ? name : "generation_config.json";
    json_t *root;
    ATLAS_TRY(load_json(json, len, file, &root));
    atlas_config c = *cfg; /* cfg is only changed when the whole file is good */
    atlas_status s = read_eos(file, root, &c);
    if (s == ATLAS_OK) s = get_int(file, root, "bos_token_id", false, 0, INT32_MAX, &c.bos_id);
    if (s == ATLAS_OK) s = get_num(file, root, "temperature", &c.gen_temperature);
    if (s == ATLAS_OK) s = get_num(file, root, "top_p", &c.gen_top_p);
    if (s == ATLAS_OK) s = get_int(file, root, "top_k", false, 0, INT32_MAX, &c.gen_top_k);
    if (s == ATLAS_OK) s = get_num(file, root, "repetition_penalty", &c.gen_repetition_penalty);
    if (s == ATLAS_OK) s = get_num(file, root, "min_p", &c.gen_min_p);
    if (s == ATLAS_OK)
        s = get_int(file, root, "max_new_tokens", false, 0, INT32_MAX, &c.gen_max_new_tokens);
    static const struct { const char *key; unsigned bit; } present[] = {
        {"temperature", ATLAS_GEN_TEMPERATURE}, {"top_p", ATLAS_GEN_TOP_P},
        {"top_k", ATLAS_GEN_TOP_K}, {"min_p", ATLAS_GEN_MIN_P},
        {"repetition_penalty", ATLAS_GEN_REPETITION_PENALTY},
        {"max_new_tokens", ATLAS_GEN_MAX_NEW_TOKENS}};
    for (size_t i = 0; s == ATLAS_OK && i < sizeof present / sizeof *present; i++)
        if (field(root, present[i].key)) c.gen_set |= present[i].bit;
    bool sample = false;
    if (s == ATLAS_OK && field(root, "do_sample")) {
        s = get_bool(file, root, "do_sample", &sample);
        c.gen_do_sample = sample;
    }
    json_decref(root);
    if (s == ATLAS_OK) *cfg = c;
    return s;
}

/* A ModelOpt export may keep its quantization in hf_quant_config.json beside config.json
 * (read, as vLLM does, only where config.json has no quantization_config). */
static atlas_status read_hf_quant(const char *dir, atlas_config *out) {
    char path[4096];
    char *text;
    size_t len;
    json_t *root;
    ATLAS_TRY(atlas_path_join(path, sizeof path, dir, "hf_quant_config.json"));
    if (!atlas_file_exists(path)) return ATLAS_OK;
    ATLAS_TRY(atlas_file_read(path, &text, &len));
    atlas_status s = load_json(text, len, path, &root);
    free(text);
    if (s != ATLAS_OK) return s;
    s = atlas_quant_config_parse_hf(path, root, &out->quant);
    json_decref(root);
    return s;
}

atlas_status atlas_config_load(const char *dir, atlas_config *out) {
    char path[4096];
    char *text;
    size_t len;
    ATLAS_TRY(atlas_path_join(path, sizeof path, dir, "config.json"));
    atlas_status s = atlas_file_read(path, &text, &len);
    /* "x.gguf/config.json: cannot open" says nothing to the user: say what x.gguf is */
    if (s == ATLAS_ERR_IO && !atlas_file_exists(path)) {
        atlas_status why = atlas_layout_check(dir);
        if (why != ATLAS_OK) return why;
    }
    if (s != ATLAS_OK) return s;
    s = atlas_config_parse(text, len, path, out);
    free(text);
    if (s != ATLAS_OK) return s;
    if (out->quant.method == ATLAS_QM_NONE) ATLAS_TRY(read_hf_quant(dir, out));
    ATLAS_TRY(atlas_pooling_load(dir, out));
    ATLAS_TRY(atlas_path_join(path, sizeof path, dir, "generation_config.json"));
    if (!atlas_file_exists(path)) return ATLAS_OK;
    ATLAS_TRY(atlas_file_read(path, &text, &len));
    s = atlas_config_parse_generation(text, len, path, out);
    free(text);
    return s;
}

long atlas_config_max_context(const atlas_config *cfg) {
    double max = cfg->max_position > 0 ? cfg->max_position : 4096;
    const atlas_rope *r = &cfg->rope;
    /* Gemma 3's max_position_embeddings is the scaled length already (vLLM skips its linear
     * factor too) */
    if (r->type == ATLAS_ROPE_LINEAR && cfg->arch != ATLAS_ARCH_GEMMA3)
        max = floor(max * r->factor);
    else if (r->type == ATLAS_ROPE_YARN) max = floor((double)r->original_max_position * r->factor);
    /* a parsed config is within 1..INT32_MAX (check_context); one filled in by hand is
     * clamped, never converted out of range */
    if (!(max >= 1)) return 1;
    return max > INT32_MAX ? INT32_MAX : (long)max;
}

static bool sliding_kind(const atlas_config *cfg, int layer) {
    if (!cfg->layer_kinds) return layer >= cfg->sliding_from_layer;
    return layer >= 0 && layer < cfg->n_layers && layer < ATLAS_MAX_LAYERS &&
           cfg->layer_sliding[layer];
}

bool atlas_config_layer_moe(const atlas_config *cfg, int layer) {
    return cfg->n_experts > 0 && layer >= 0 && layer < cfg->n_layers &&
           layer < ATLAS_MAX_LAYERS && cfg->layer_moe[layer];
}

bool atlas_config_layer_sliding(const atlas_config *cfg, int layer) {
    return cfg->sliding_window > 0 && sliding_kind(cfg, layer);
}

int atlas_config_layer_rope_set(const atlas_config *cfg, int layer) {
    return cfg->has_rope_local && sliding_kind(cfg, layer) ? 1 : 0;
}

atlas_status atlas_model_generation_defaults(const char *dir, atlas_generation_defaults *out) {
    *out = (atlas_generation_defaults){0};
    atlas_config c;
    ATLAS_TRY(atlas_config_load(dir, &c));
    atlas_config_generation_defaults(&c, out);
    return ATLAS_OK;
}

void atlas_config_generation_defaults(const atlas_config *c, atlas_generation_defaults *out) {
    *out = (atlas_generation_defaults){0};
    out->temperature = c->gen_temperature > 0 ? (float)c->gen_temperature : 0;
    out->top_p = c->gen_top_p > 0 ? (float)c->gen_top_p : 0;
    out->top_k = c->gen_top_k > 0 ? c->gen_top_k : 0;
    out->min_p = (float)c->gen_min_p;
    out->repetition_penalty = (float)c->gen_repetition_penalty;
    out->max_new_tokens = c->gen_max_new_tokens;
    out->set = c->gen_set;
}

/* model/quant_config.c — config.json's quantization_config (model/quant.h). */
#include <jansson.h>
#include <regex.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"
#include "model/quant.h"

#define SUPPORTED "fp8 (e4m3, block or per-tensor), compressed-tensors (float-quantized FP8: " \
                  "tensor, channel or block), awq (version gemm, 4-bit), gptq (4-bit, gptq or " \
                  "gptq_v2), mxfp4, modelopt (NVFP4), compressed-tensors (nvfp4-pack-quantized), " \
                  "fbgemm_fp8"

__attribute__((format(printf, 2, 3))) static atlas_status refuse(const char *file,
                                                                  const char *fmt, ...) {
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: field \"quantization_config\": %s; atlas reads "
                      SUPPORTED, file, what);
}

static atlas_status read_ignore(const char *file, json_t *list, const char *field,
                                atlas_quant_config *out) {
    if (!list || json_is_null(list)) return ATLAS_OK;
    if (!json_is_array(list))
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: field \"quantization_config.%s\" is not a list",
                          file, field);
    size_t i;
    json_t *e;
    json_array_foreach(list, i, e) {
        const char *s = json_string_value(e);
        if (!s || strlen(s) >= sizeof out->ignore[0] || out->n_ignore == ATLAS_QUANT_MAX_IGNORE)
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: field \"quantization_config.%s[%zu]\": not "
                              "a string, longer than %zu bytes, or past %d entries", file, field,
                              i, sizeof out->ignore[0] - 1, ATLAS_QUANT_MAX_IGNORE);
        if (!strncmp(s, "re:", 3)) { /* checked here, so that matching never meets a bad one */
            char full[160];
            regex_t re;
            snprintf(full, sizeof full, "^(%s)$", s + 3);
            if (regcomp(&re, full, REG_EXTENDED | REG_NOSUB))
                return atlas_fail(ATLAS_ERR_FORMAT, "%s: field \"quantization_config.%s[%zu]\": "
                                  "\"%s\" is not a regular expression atlas reads (POSIX "
                                  "extended)", file, field, i, s);
            regfree(&re);
        }
        snprintf(out->ignore[out->n_ignore++], sizeof out->ignore[0], "%s", s);
    }
    return ATLAS_OK;
}

static int get_int(json_t *q, const char *key, const char *alt, int dflt) {
    json_t *v = json_object_get(q, key);
    if (!v && alt) v = json_object_get(q, alt);
    return json_is_integer(v) ? (int)json_integer_value(v) : dflt;
}

static const char *get_str(json_t *q, const char *key, const char *dflt) {
    const char *s = json_string_value(json_object_get(q, key));
    return s ? s : dflt;
}

static atlas_status read_block(const char *file, json_t *b, const char *field, int block[2]) {
    if (!json_is_array(b) || json_array_size(b) != 2 ||
        !json_is_integer(json_array_get(b, 0)) || !json_is_integer(json_array_get(b, 1)) ||
        json_integer_value(json_array_get(b, 0)) < 1 || json_integer_value(json_array_get(b, 1)) < 1 ||
        json_integer_value(json_array_get(b, 0)) > 65536 || json_integer_value(json_array_get(b, 1)) > 65536)
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: field \"quantization_config.%s\": want two "
                          "positive block sizes [rows, columns]", file, field);
    block[0] = (int)json_integer_value(json_array_get(b, 0));
    block[1] = (int)json_integer_value(json_array_get(b, 1));
    return ATLAS_OK;
}

static atlas_status parse_fp8(const char *file, json_t *q, atlas_quant_config *out) {
    const char *fmt = get_str(q, "fmt", "e4m3"), *act = get_str(q, "activation_scheme", "dynamic");
    if (strcmp(fmt, "e4m3")) {
        return refuse(file, "fp8 \"fmt\" %.32s (atlas reads e4m3)", fmt);
    }
    if (strcmp(act, "dynamic")) {
        return refuse(file, "fp8 activation_scheme %.32s: static FP8 activation scales "
                      "are not supported yet (weight-only: dynamic)", act);
    }
    json_t *b = json_object_get(q, "weight_block_size");
    out->method = ATLAS_QM_FP8;
    out->strategy = ATLAS_QS_TENSOR;
    if (b && !json_is_null(b)) {
        ATLAS_TRY(read_block(file, b, "weight_block_size", out->block));
        out->strategy = ATLAS_QS_BLOCK;
    }
    ATLAS_TRY(read_ignore(file, json_object_get(q, "modules_to_not_convert"),
                          "modules_to_not_convert", out));
    return read_ignore(file, json_object_get(q, "ignored_layers"), "ignored_layers", out);
}

/* compressed-tensors: one config group of FP8 weights over the Linear layers. */
/* The one config group of compressed-tensors, or NULL after refusing. */
static json_t *ct_group(json_t *q) {
    json_t *groups = json_object_get(q, "config_groups");
    if (!json_is_object(groups) || json_object_size(groups) != 1) return NULL;
    json_t *g = json_object_iter_value(json_object_iter(groups));
    json_t *targets = json_object_get(g, "targets");
    bool linear = false;
    for (size_t i = 0; json_is_array(targets) && i < json_array_size(targets); i++) {
        const char *t = json_string_value(json_array_get(targets, i));
        linear |= t && !strcmp(t, "Linear");
    }
    return linear ? g : NULL;
}

/* compressed-tensors NVFP4: e2m1 weights in groups of 16 with e4m3 scales and a float32
 * global scale (strategy tensor_group). */
static atlas_status parse_ct_nvfp4(const char *file, json_t *q, atlas_quant_config *out) {
    json_t *g = ct_group(q), *w = g ? json_object_get(g, "weights") : NULL;
    if (!g) return refuse(file, "compressed-tensors with other than one config group of "
                          "targets [\"Linear\"]");
    if (!json_is_object(w) || get_int(w, "num_bits", NULL, 0) != 4 ||
        strcmp(get_str(w, "type", "?"), "float") ||
        strcmp(get_str(w, "strategy", "?"), "tensor_group") || get_int(w, "group_size", NULL, 0) != 16)
        return refuse(file, "compressed-tensors nvfp4-pack-quantized weights other than 4-bit "
                      "floats, strategy tensor_group, group_size 16");
    json_t *kv = json_object_get(q, "kv_cache_scheme");
    if (kv && !json_is_null(kv))
        return refuse(file, "compressed-tensors kv_cache_scheme (an FP8 KV cache) is not "
                      "supported yet");
    out->method = ATLAS_QM_CT_NVFP4;
    out->group = 16;
    return read_ignore(file, json_object_get(q, "ignore"), "ignore", out);
}

/* ModelOpt's export (quantization_config, or hf_quant_config.json's "quantization"). */
static atlas_status parse_modelopt(const char *file, json_t *q, atlas_quant_config *out) {
    const char *algo = get_str(q, "quant_algo", "?");
    if (strcmp(algo, "NVFP4")) {
        return refuse(file, "modelopt quant_algo %.32s (atlas reads NVFP4)", algo);
    }
    int group = get_int(q, "group_size", NULL, 16);
    if (group != 16) {
        return refuse(file, "modelopt NVFP4 with group_size %d (NVFP4's is 16)", group);
    }
    out->method = ATLAS_QM_NVFP4;
    out->group = 16;
    return read_ignore(file, json_object_get(q, "exclude_modules"), "exclude_modules", out);
}

/* gpt-oss's MXFP4: e2m1 in blocks of 32 with an e8m0 scale. */
static atlas_status parse_mxfp4(const char *file, json_t *q, atlas_quant_config *out) {
    out->method = ATLAS_QM_MXFP4;
    out->group = 32;
    return read_ignore(file, json_object_get(q, "modules_to_not_convert"),
                       "modules_to_not_convert", out);
}

static atlas_status parse_ct(const char *file, json_t *q, atlas_quant_config *out) {
    const char *fmt = get_str(q, "format", "?");
    if (!strcmp(fmt, "nvfp4-pack-quantized")) return parse_ct_nvfp4(file, q, out);
    if (strcmp(fmt, "float-quantized")) {
        return refuse(file, "compressed-tensors format %.40s is not supported yet", fmt);
    }
    json_t *kv = json_object_get(q, "kv_cache_scheme");
    if (kv && !json_is_null(kv))
        return refuse(file, "compressed-tensors kv_cache_scheme (an FP8 KV cache) is not "
                      "supported yet");
    json_t *groups = json_object_get(q, "config_groups");
    if (!json_is_object(groups) || json_object_size(groups) != 1)
        return refuse(file, "compressed-tensors with other than one config group");
    json_t *g = json_object_iter_value(json_object_iter(groups));
    json_t *targets = json_object_get(g, "targets"), *w = json_object_get(g, "weights");
    json_t *in = json_object_get(g, "input_activations");
    bool linear = false;
    for (size_t i = 0; json_is_array(targets) && i < json_array_size(targets); i++) {
        const char *t = json_string_value(json_array_get(targets, i));
        linear |= t && !strcmp(t, "Linear");
    }
    if (!linear) return refuse(file, "compressed-tensors targets other than [\"Linear\"]");
    if (!json_is_object(w) || get_int(w, "num_bits", NULL, 0) != 8 ||
        strcmp(get_str(w, "type", "?"), "float") ||
        json_is_false(json_object_get(w, "symmetric")) ||
        json_is_true(json_object_get(w, "dynamic")))
        return refuse(file, "compressed-tensors weights other than static symmetric 8-bit "
                      "floats");
    if (in && !json_is_null(in) && !json_is_true(json_object_get(in, "dynamic")))
        return refuse(file, "compressed-tensors static input_activations (input_scale): static "
                      "FP8 activation scales are not supported yet (weight-only)");
    const char *strategy = get_str(w, "strategy", "?");
    out->method = ATLAS_QM_CT_FP8;
    if (!strcmp(strategy, "tensor")) out->strategy = ATLAS_QS_TENSOR;
    else if (!strcmp(strategy, "channel")) out->strategy = ATLAS_QS_CHANNEL;
    else if (!strcmp(strategy, "block")) {
        out->strategy = ATLAS_QS_BLOCK;
        ATLAS_TRY(read_block(file, json_object_get(w, "block_structure"),
                             "config_groups.*.weights.block_structure", out->block));
    } else {
        return refuse(file, "compressed-tensors FP8 strategy %.32s (atlas reads tensor, "
                      "channel, block)", strategy);
    }
    return read_ignore(file, json_object_get(q, "ignore"), "ignore", out);
}

static atlas_status read_group(const char *file, json_t *q, const char *alt, bool allow_row,
                               atlas_quant_config *out) {
    int g = get_int(q, "group_size", alt, 128);
    if (g == -1 && allow_row) g = 0;
    else if (g < 2 || g % 2 || g > 65536)
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: field \"quantization_config.group_size\": %d "
                          "(want an even group size%s)", file, g, allow_row ? " or -1" : "");
    out->group = g;
    return ATLAS_OK;
}

static atlas_status parse_awq(const char *file, json_t *q, atlas_quant_config *out) {
    const char *version = get_str(q, "version", "gemm");
    if (strcasecmp(version, "gemm")) {
        return refuse(file, "awq version %.32s (atlas reads gemm's layout; gemv and "
                      "gemv_fast pack differently)", version);
    }
    int bits = get_int(q, "bits", "w_bit", 4);
    if (bits != 4) {
        return refuse(file, "awq with %d bits (atlas reads 4)", bits);
    }
    if (json_is_false(json_object_get(q, "zero_point")))
        return refuse(file, "awq without zero points (zero_point false)");
    out->method = ATLAS_QM_AWQ;
    ATLAS_TRY(read_group(file, q, "q_group_size", false, out));
    return read_ignore(file, json_object_get(q, "modules_to_not_convert"),
                       "modules_to_not_convert", out);
}

static atlas_status parse_gptq(const char *file, json_t *q, atlas_quant_config *out) {
    const char *fmt = get_str(q, "checkpoint_format", "gptq");
    if (json_is_true(json_object_get(q, "is_marlin_format")) || !strcmp(fmt, "marlin"))
        return refuse(file, "gptq in marlin's checkpoint_format (repack it to gptq: marlin's "
                      "tile order is its kernels')");
    if (strcmp(fmt, "gptq") && strcmp(fmt, "gptq_v2")) {
        return refuse(file, "gptq checkpoint_format %.32s", fmt);
    }
    int bits = get_int(q, "bits", NULL, 4);
    if (bits != 4) {
        return refuse(file, "gptq with %d bits (atlas reads 4-bit GPTQ only)", bits);
    }
    out->method = ATLAS_QM_GPTQ;
    out->gptq_v2 = !strcmp(fmt, "gptq_v2");
    out->desc_act = json_is_true(json_object_get(q, "desc_act"));
    ATLAS_TRY(read_group(file, q, NULL, true, out));
    return read_ignore(file, json_object_get(q, "modules_to_not_convert"),
                       "modules_to_not_convert", out);
}

/* fbgemm_fp8 (transformers' FbgemmFp8Config): e4m3 weights with a scale per output channel
 * (weight_scale [out, 1]); its activations are quantized per token at run time
 * (activation_scale_ub bounds them), which atlas leaves in the compute type: weight-only. */
static atlas_status parse_fbgemm(const char *file, json_t *q, atlas_quant_config *out) {
    json_t *ub = json_object_get(q, "activation_scale_ub");
    if (ub && !json_is_number(ub))
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: field \"quantization_config."
                          "activation_scale_ub\" is not a number", file);
    out->method = ATLAS_QM_FBGEMM_FP8;
    out->strategy = ATLAS_QS_CHANNEL;
    return read_ignore(file, json_object_get(q, "modules_to_not_convert"),
                       "modules_to_not_convert", out);
}

atlas_status atlas_quant_config_parse(const char *file, const void *qv, atlas_quant_config *out) {
    json_t *q = (json_t *)qv;
    memset(out, 0, sizeof *out);
    if (!q || json_is_null(q)) return ATLAS_OK;
    if (!json_is_object(q))
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: field \"quantization_config\" is not an object",
                          file);
    const char *m = json_string_value(json_object_get(q, "quant_method"));
    if (!m) return refuse(file, "no \"quant_method\"");
    if (!strcmp(m, "fp8")) return parse_fp8(file, q, out);
    if (!strcmp(m, "compressed-tensors")) return parse_ct(file, q, out);
    if (!strcmp(m, "awq")) return parse_awq(file, q, out);
    if (!strcmp(m, "gptq")) return parse_gptq(file, q, out);
    if (!strcmp(m, "mxfp4")) return parse_mxfp4(file, q, out);
    if (!strcmp(m, "modelopt")) return parse_modelopt(file, q, out);
    if (!strcmp(m, "fbgemm_fp8")) return parse_fbgemm(file, q, out);
    return refuse(file, "quant_method %.48s is not supported", m);
}

const char *atlas_quant_config_str(const atlas_quant_config *qc, char *buf, size_t cap) {
    static const char *const strategies[] = {"per-tensor", "per-channel", "block"};
    switch (qc->method) {
    case ATLAS_QM_FP8:
    case ATLAS_QM_CT_FP8:
        if (qc->strategy == ATLAS_QS_BLOCK)
            snprintf(buf, cap, "%s (FP8 e4m3, block %dx%d)",
                     qc->method == ATLAS_QM_FP8 ? "fp8" : "compressed-tensors", qc->block[0],
                     qc->block[1]);
        else
            snprintf(buf, cap, "%s (FP8 e4m3, %s)",
                     qc->method == ATLAS_QM_FP8 ? "fp8" : "compressed-tensors",
                     strategies[qc->strategy]);
        break;
    case ATLAS_QM_FBGEMM_FP8: snprintf(buf, cap, "fbgemm_fp8 (FP8 e4m3, per-channel)"); break;
    case ATLAS_QM_AWQ: snprintf(buf, cap, "awq (INT4, group %d)", qc->group); break;
    case ATLAS_QM_GPTQ:
        if (qc->group) snprintf(buf, cap, "gptq%s (INT4, group %d)", qc->gptq_v2 ? "_v2" : "",
                                qc->group);
        else snprintf(buf, cap, "gptq%s (INT4, one group a row)", qc->gptq_v2 ? "_v2" : "");
        break;
    case ATLAS_QM_MXFP4:
        snprintf(buf, cap, "mxfp4 (FP4 e2m1, e8m0 scales per 32)");
        break;
    case ATLAS_QM_NVFP4:
    case ATLAS_QM_CT_NVFP4:
        snprintf(buf, cap, "%s (NVFP4: FP4 e2m1, e4m3 scales per 16, weight-only)",
                 qc->method == ATLAS_QM_NVFP4 ? "modelopt" : "compressed-tensors");
        break;
    default: snprintf(buf, cap, "none");
    }
    return buf;
}

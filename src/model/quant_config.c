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
                  "tensor, channel or block; pack-quantized 4-bit integers: group or channel), " \
                  "awq (version gemm, 4-bit), gptq (4-bit, gptq or gptq_v2), mxfp4, modelopt " \
                  "(FP8, NVFP4), compressed-tensors (nvfp4-pack-quantized), fbgemm_fp8"

/* The object read: config.json's "quantization_config", or the "quantization" of the
 * hf_quant_config.json a ModelOpt export writes beside it. */
static const char *qfield(const char *file) {
    size_t n = strlen(file), k = strlen("hf_quant_config.json");
    return n >= k && !strcmp(file + n - k, "hf_quant_config.json") ? "quantization"
                                                                    : "quantization_config";
}

__attribute__((format(printf, 2, 3))) static atlas_status refuse(const char *file,
                                                                  const char *fmt, ...) {
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: field \"%s\": %s; atlas reads " SUPPORTED,
                      file, qfield(file), what);
}

static atlas_status read_ignore(const char *file, json_t *list, const char *field,
                                atlas_quant_config *out) {
    if (!list || json_is_null(list)) return ATLAS_OK;
    if (!json_is_array(list))
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: field \"%s.%s\" is not a list", file,
                          qfield(file), field);
    size_t i;
    json_t *e;
    json_array_foreach(list, i, e) {
        const char *s = json_string_value(e);
        if (!s || strlen(s) >= sizeof out->ignore[0] || out->n_ignore == ATLAS_QUANT_MAX_IGNORE)
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: field \"%s.%s[%zu]\": not a string, longer "
                              "than %zu bytes, or past %d entries", file, qfield(file), field,
                              i, sizeof out->ignore[0] - 1, ATLAS_QUANT_MAX_IGNORE);
        if (!strncmp(s, "re:", 3)) { /* checked here, so that matching never meets a bad one */
            char full[160];
            regex_t re;
            snprintf(full, sizeof full, "^(%s)$", s + 3);
            if (regcomp(&re, full, REG_EXTENDED | REG_NOSUB))
                return atlas_fail(ATLAS_ERR_FORMAT, "%s: field \"%s.%s[%zu]\": \"%s\" is not "
                                  "a regular expression atlas reads (POSIX extended)", file,
                                  qfield(file), field, i, s);
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
    if (strcmp(act, "dynamic") && strcmp(act, "static")) {
        return refuse(file, "fp8 activation_scheme %.32s (atlas reads dynamic and static)", act);
    }
    json_t *b = json_object_get(q, "weight_block_size");
    out->method = ATLAS_QM_FP8;
    out->static_act = !strcmp(act, "static");
    out->strategy = ATLAS_QS_TENSOR;
    if (b && !json_is_null(b)) {
        ATLAS_TRY(read_block(file, b, "weight_block_size", out->block));
        out->strategy = ATLAS_QS_BLOCK;
    }
    ATLAS_TRY(read_ignore(file, json_object_get(q, "modules_to_not_convert"),
                          "modules_to_not_convert", out));
    return read_ignore(file, json_object_get(q, "ignored_layers"), "ignored_layers", out);
}

/* An FP8 KV cache the checkpoint asks for (compressed-tensors' kv_cache_scheme, ModelOpt's
 * kv_cache_quant_algo) is not applied: the KV cache stays in the compute type, closer to the
 * unquantized model than the publisher's, and its k_scale / v_scale tensors are left unused
 * (model/weights.c). Any other KV format is refused by name. */
static atlas_status read_kv(const char *file, json_t *q, atlas_quant_config *out) {
    json_t *scheme = json_object_get(q, "kv_cache_scheme"), *algo =
        json_object_get(q, "kv_cache_quant_algo");
    if (json_is_string(scheme)) { /* ModelOpt's config.json, before it wrote the object */
        algo = scheme;
        scheme = NULL;
    }
    if (scheme && !json_is_null(scheme)) {
        if (!json_is_object(scheme) || get_int(scheme, "num_bits", NULL, 0) != 8 ||
            strcmp(get_str(scheme, "type", "?"), "float"))
            return refuse(file, "kv_cache_scheme other than 8-bit floats (FP8)");
        out->kv_fp8 = true;
    }
    if (algo && !json_is_null(algo)) {
        const char *a = json_string_value(algo);
        if (!a || strcasecmp(a, "FP8"))
            return refuse(file, "kv_cache_quant_algo %.32s (atlas reads FP8, not applied)",
                          a ? a : "(not a string)");
        out->kv_fp8 = true;
    }
    return ATLAS_OK;
}

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
    ATLAS_TRY(read_kv(file, q, out));
    out->method = ATLAS_QM_CT_NVFP4;
    out->group = 16;
    return read_ignore(file, json_object_get(q, "ignore"), "ignore", out);
}

/* compressed-tensors pack-quantized: 4-bit integer weights, weight-only (W4A16), in groups
 * along the input or one group a row (strategy channel), symmetric or with zero points. */
static atlas_status parse_ct_int4(const char *file, json_t *q, atlas_quant_config *out) {
    json_t *g = ct_group(q), *w = g ? json_object_get(g, "weights") : NULL;
    if (!g) return refuse(file, "compressed-tensors with other than one config group of "
                          "targets [\"Linear\"]");
    if (!json_is_object(w) || strcmp(get_str(w, "type", "?"), "int"))
        return refuse(file, "compressed-tensors pack-quantized weights other than integers");
    int bits = get_int(w, "num_bits", NULL, 0);
    if (bits != 4)
        return refuse(file, "compressed-tensors pack-quantized with %d-bit integers (atlas reads "
                      "4-bit; W8A16 / W8A8 are not supported)", bits);
    json_t *in = json_object_get(g, "input_activations");
    if (in && !json_is_null(in))
        return refuse(file, "compressed-tensors pack-quantized with input_activations (W4A8 and "
                      "the like: atlas reads weight-only W4A16)");
    if (json_is_true(json_object_get(w, "dynamic")))
        return refuse(file, "compressed-tensors pack-quantized with dynamic weights");
    const char *strategy = get_str(w, "strategy", "?");
    out->method = ATLAS_QM_CT_INT4;
    out->symmetric = !json_is_false(json_object_get(w, "symmetric"));
    if (!strcmp(strategy, "channel")) {
        out->group = 0;
    } else if (!strcmp(strategy, "group")) {
        int gs = get_int(w, "group_size", NULL, 0);
        if (gs < 2 || gs % 2 || gs > 65536)
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: field \"%s.config_groups.*.weights."
                              "group_size\": %d (want an even group size)", file, qfield(file),
                              gs);
        out->group = gs;
    } else {
        return refuse(file, "compressed-tensors pack-quantized strategy %.32s (atlas reads group "
                      "and channel)", strategy);
    }
    /* actorder "group" (alias "dynamic"): weight_g_idx gives each column's group; "weight"
     * (alias "static") reorders only the quantizer's visits, the columns keep their groups */
    json_t *ao = json_object_get(w, "actorder");
    const char *aos = json_string_value(ao);
    bool by_group = aos && (!strcmp(aos, "group") || !strcmp(aos, "dynamic"));
    if (aos && !by_group && strcmp(aos, "weight") && strcmp(aos, "static"))
        return refuse(file, "compressed-tensors actorder %.32s (atlas reads group, weight and "
                      "their aliases dynamic, static)", aos);
    out->desc_act = by_group || json_is_true(ao);
    ATLAS_TRY(read_kv(file, q, out));
    return read_ignore(file, json_object_get(q, "ignore"), "ignore", out);
}

/* ModelOpt's export: config.json's quantization_config (its list "ignore", an FP8 KV as
 * kv_cache_scheme) or hf_quant_config.json's "quantization" (the list "exclude_modules", an
 * FP8 KV as kv_cache_quant_algo). FP8 is e4m3 with one float32 scale a tensor; NVFP4 is as
 * model/quant.h says. Both quantize the activations with static scales (input_scale), which
 * atlas does not apply. */
static atlas_status parse_modelopt(const char *file, json_t *q, atlas_quant_config *out) {
    const char *algo = get_str(q, "quant_algo", "none (a KV cache only export)");
    if (!strcasecmp(algo, "FP8")) {
        out->method = ATLAS_QM_MODELOPT_FP8;
        out->strategy = ATLAS_QS_TENSOR;
    } else if (!strcasecmp(algo, "NVFP4")) {
        int group = get_int(q, "group_size", NULL, 16);
        if (group != 16) {
            return refuse(file, "modelopt NVFP4 with group_size %d (NVFP4's is 16)", group);
        }
        out->method = ATLAS_QM_NVFP4;
        out->group = 16;
    } else {
        return refuse(file, "modelopt quant_algo %.40s (atlas reads FP8 and NVFP4)", algo);
    }
    out->static_act = true;
    ATLAS_TRY(read_kv(file, q, out));
    ATLAS_TRY(read_ignore(file, json_object_get(q, "ignore"), "ignore", out));
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
    if (!strcmp(fmt, "pack-quantized")) return parse_ct_int4(file, q, out);
    if (!strcmp(fmt, "int-quantized") || !strcmp(fmt, "naive-quantized"))
        return refuse(file, "compressed-tensors format %s (8-bit integers: W8A8 / W8A16 are not "
                      "supported)", fmt);
    if (strcmp(fmt, "float-quantized")) {
        return refuse(file, "compressed-tensors format %.40s is not supported yet", fmt);
    }
    ATLAS_TRY(read_kv(file, q, out));
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
    out->static_act = in && !json_is_null(in) && !json_is_true(json_object_get(in, "dynamic"));
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
        /* an 8-bit GPTQ would need a weight format of its own in every backend; FP8
         * checkpoints serve eight bits a weight */
        return refuse(file, "gptq with %d bits: only 4-bit GPTQ is supported", bits);
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

/* The fields the methods read through get_int, get_str and json_is_true / _false, which take
 * a value of another type as absent: "bits": "8" would read as the default 4. Such a value
 * is refused here, naming the field and the type it must have. */
static atlas_status check_types(const char *file, json_t *q) {
    static const char *const ints[] = {"bits", "w_bit", "group_size", "q_group_size"};
    static const char *const strs[] = {"quant_method", "version", "checkpoint_format", "fmt",
                                       "activation_scheme", "format", "quant_algo"};
    static const char *const bools[] = {"desc_act", "zero_point", "is_marlin_format", "sym"};
    const struct { const char *const *keys; size_t n; const char *want; } kinds[] = {
        {ints, sizeof ints / sizeof *ints, "an integer"},
        {strs, sizeof strs / sizeof *strs, "a string"},
        {bools, sizeof bools / sizeof *bools, "true or false"}};
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++)
        for (size_t i = 0; i < kinds[k].n; i++) {
            const json_t *v = json_object_get(q, kinds[k].keys[i]);
            bool ok = !v || json_is_null(v) ||
                      (k == 0 ? json_is_integer(v) : k == 1 ? json_is_string(v) : json_is_boolean(v));
            if (!ok)
                return atlas_fail(ATLAS_ERR_FORMAT, "%s: field \"quantization_config.%s\" must "
                                  "be %s", file, kinds[k].keys[i], kinds[k].want);
        }
    return ATLAS_OK;
}

atlas_status atlas_quant_config_parse(const char *file, const void *qv, atlas_quant_config *out) {
    json_t *q = (json_t *)qv;
    memset(out, 0, sizeof *out);
    if (!q || json_is_null(q)) return ATLAS_OK;
    if (!json_is_object(q))
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: field \"quantization_config\" is not an object",
                          file);
    ATLAS_TRY(check_types(file, q));
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

atlas_status atlas_quant_config_parse_hf(const char *file, const void *rv,
                                         atlas_quant_config *out) {
    json_t *root = (json_t *)rv;
    memset(out, 0, sizeof *out);
    if (!json_is_object(root))
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: not a JSON object", file);
    const char *producer = json_string_value(json_object_get(json_object_get(root, "producer"),
                                                             "name"));
    if (producer && strcmp(producer, "modelopt"))
        return refuse(file, "producer %.48s (atlas reads ModelOpt's hf_quant_config.json)",
                      producer);
    json_t *q = json_object_get(root, "quantization");
    if (!json_is_object(q))
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: field \"quantization\" is missing or not an "
                          "object", file);
    return parse_modelopt(file, q, out);
}

/* What the checkpoint asks for and atlas does not apply, after the format. */
static const char *notes(const atlas_quant_config *qc) {
    if (qc->static_act && qc->kv_fp8)
        return qc->kv_fp8_on ? ", weight-only; FP8 KV cache" : ", weight-only; KV cache unquantized";
    if (qc->static_act) return ", weight-only";
    if (qc->kv_fp8) return qc->kv_fp8_on ? "; FP8 KV cache" : "; KV cache unquantized";
    return "";
}

const char *atlas_quant_config_str(const atlas_quant_config *qc, char *buf, size_t cap) {
    static const char *const strategies[] = {"per-tensor", "per-channel", "block"};
    const char *n = notes(qc);
    switch (qc->method) {
    case ATLAS_QM_FP8:
    case ATLAS_QM_CT_FP8:
        if (qc->strategy == ATLAS_QS_BLOCK)
            snprintf(buf, cap, "%s (FP8 e4m3, block %dx%d%s)",
                     qc->method == ATLAS_QM_FP8 ? "fp8" : "compressed-tensors", qc->block[0],
                     qc->block[1], n);
        else
            snprintf(buf, cap, "%s (FP8 e4m3, %s%s)",
                     qc->method == ATLAS_QM_FP8 ? "fp8" : "compressed-tensors",
                     strategies[qc->strategy], n);
        break;
    case ATLAS_QM_MODELOPT_FP8: snprintf(buf, cap, "modelopt (FP8 e4m3, per-tensor%s)", n); break;
    case ATLAS_QM_FBGEMM_FP8: snprintf(buf, cap, "fbgemm_fp8 (FP8 e4m3, per-channel)"); break;
    case ATLAS_QM_AWQ: snprintf(buf, cap, "awq (INT4, group %d)", qc->group); break;
    case ATLAS_QM_GPTQ:
        if (qc->group) snprintf(buf, cap, "gptq%s (INT4, group %d)", qc->gptq_v2 ? "_v2" : "",
                                qc->group);
        else snprintf(buf, cap, "gptq%s (INT4, one group a row)", qc->gptq_v2 ? "_v2" : "");
        break;
    case ATLAS_QM_CT_INT4:
        if (qc->group) snprintf(buf, cap, "compressed-tensors (INT4, group %d, %s%s)", qc->group,
                                qc->symmetric ? "symmetric" : "zero points", n);
        else snprintf(buf, cap, "compressed-tensors (INT4, one group a row, %s%s)",
                      qc->symmetric ? "symmetric" : "zero points", n);
        break;
    case ATLAS_QM_MXFP4:
        snprintf(buf, cap, "mxfp4 (FP4 e2m1, e8m0 scales per 32)");
        break;
    case ATLAS_QM_NVFP4:
    case ATLAS_QM_CT_NVFP4:
        snprintf(buf, cap, "%s (NVFP4: FP4 e2m1, e4m3 scales per 16, weight-only%s)",
                 qc->method == ATLAS_QM_NVFP4 ? "modelopt" : "compressed-tensors",
                 !qc->kv_fp8 ? "" : qc->kv_fp8_on ? "; FP8 KV cache" : "; KV cache unquantized");
        break;
    default: snprintf(buf, cap, "none");
    }
    return buf;
}

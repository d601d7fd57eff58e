/* server/params.c — the fields of OpenAI request bodies, checked one by one.  Ranges are
 * OpenAI's where it documents them (temperature 0..2, penalties -2..2, logit_bias
 * -100..100, top_logprobs 0..20); top_k, min_p and repetition_penalty as vLLM takes them. */
#include "server/params.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "atlas/constraint.h"
#include "atlas/engine.h"
#include "atlas/tokenizer.h"
#include "atlas/utf8.h"
#include "server/schema.h"

static const json_t *field(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

atlas_status atlas_param_number(const json_t *o, const char *key, double lo, double hi,
                                double *out, bool *present, const char **param) {
    const json_t *v = field(o, key);
    if (present) *present = v != NULL;
    if (!v) return ATLAS_OK;
    *param = key;
    if (!json_is_number(v))
        return atlas_fail(ATLAS_ERR_INVALID, "'%s' must be a number", key);
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi)
        return atlas_fail(ATLAS_ERR_INVALID, "'%s' must be between %g and %g, got %g", key, lo,
                          hi, x);
    *out = x;
    *param = NULL;
    return ATLAS_OK;
}

atlas_status atlas_param_int(const json_t *o, const char *key, int64_t lo, int64_t hi,
                             int64_t *out, bool *present, const char **param) {
    const json_t *v = field(o, key);
    if (present) *present = v != NULL;
    if (!v) return ATLAS_OK;
    *param = key;
    int64_t x;
    if (json_is_integer(v)) {
        x = (int64_t)json_integer_value(v);
    } else if (json_is_real(v)) {
        double d = json_real_value(v);
        if (!(d >= -9.0e18 && d <= 9.0e18) || d != floor(d))
            return atlas_fail(ATLAS_ERR_INVALID, "'%s' must be an integer, got %g", key, d);
        x = (int64_t)d;
    } else {
        return atlas_fail(ATLAS_ERR_INVALID, "'%s' must be an integer", key);
    }
    if (x < lo || x > hi)
        return atlas_fail(ATLAS_ERR_INVALID, "'%s' must be between %lld and %lld, got %lld", key,
                          (long long)lo, (long long)hi, (long long)x);
    *out = x;
    *param = NULL;
    return ATLAS_OK;
}

atlas_status atlas_param_bool(const json_t *o, const char *key, bool *out, const char **param) {
    const json_t *v = field(o, key);
    if (!v) return ATLAS_OK;
    if (!json_is_boolean(v)) {
        *param = key;
        return atlas_fail(ATLAS_ERR_INVALID, "'%s' must be a boolean", key);
    }
    *out = json_is_true(v);
    return ATLAS_OK;
}

atlas_status atlas_param_string(const json_t *o, const char *key, const char **out,
                                const char **param) {
    const json_t *v = field(o, key);
    if (!v) return ATLAS_OK;
    if (!json_is_string(v)) {
        *param = key;
        return atlas_fail(ATLAS_ERR_INVALID, "'%s' must be a string", key);
    }
    *out = json_string_value(v);
    return ATLAS_OK;
}

/* OpenAI's {"token id as a string": bias} object. */
static atlas_status parse_logit_bias(const json_t *body, const atlas_tokenizer *tok,
                                     atlas_gen_params *p, const char **param) {
    const json_t *lb = field(body, "logit_bias");
    if (!lb) return ATLAS_OK;
    *param = "logit_bias";
    if (!json_is_object(lb))
        return atlas_fail(ATLAS_ERR_INVALID, "'logit_bias' must be an object of token id -> "
                                             "bias");
    size_t n = json_object_size(lb);
    if (n > ATLAS_MAX_LOGIT_BIAS)
        return atlas_fail(ATLAS_ERR_INVALID, "'logit_bias' has %zu entries: at most %d", n,
                          ATLAS_MAX_LOGIT_BIAS);
    p->bias = calloc(n ? n : 1, sizeof *p->bias);
    if (!p->bias) return atlas_fail(ATLAS_ERR_NOMEM, "logit_bias: out of memory");
    size_t vocab = tok ? atlas_tokenizer_vocab_size(tok) : (size_t)INT32_MAX;
    const char *key;
    json_t *v;
    int i = 0;
    json_object_foreach((json_t *)lb, key, v) {
        char *end;
        long long id = strtoll(key, &end, 10);
        /* digits only: strtoll would also take " 5" or "+5", a second entry for token 5 */
        if (*key < '0' || *key > '9' || *end || id < 0 || (unsigned long long)id >= vocab)
            return atlas_fail(ATLAS_ERR_INVALID,
                              "'logit_bias' key '%.40s' is not a token id in 0..%zu", key,
                              vocab - 1);
        if (!json_is_number(v) || !(json_number_value(v) >= -100 && json_number_value(v) <= 100))
            return atlas_fail(ATLAS_ERR_INVALID,
                              "'logit_bias' value of token %lld must be a number in -100..100",
                              id);
        p->bias[i].id = (int32_t)id;
        p->bias[i].bias = (float)json_number_value(v);
        i++;
    }
    p->sp.logit_bias = p->bias;
    p->sp.n_logit_bias = i;
    *param = NULL;
    return ATLAS_OK;
}

static atlas_status parse_stop(const json_t *body, atlas_gen_params *p, const char **param) {
    const json_t *st = field(body, "stop");
    if (!st) return ATLAS_OK;
    *param = "stop";
    if (json_is_string(st)) {
        p->stop = malloc(sizeof *p->stop);
        if (!p->stop) return atlas_fail(ATLAS_ERR_NOMEM, "stop: out of memory");
        p->stop[0] = json_string_value(st);
        p->n_stop = 1;
    } else if (json_is_array(st)) {
        size_t n = json_array_size(st);
        if (n > ATLAS_MAX_STOP)
            return atlas_fail(ATLAS_ERR_INVALID, "'stop' has %zu strings: at most %d", n,
                              ATLAS_MAX_STOP);
        p->stop = calloc(n ? n : 1, sizeof *p->stop);
        if (!p->stop) return atlas_fail(ATLAS_ERR_NOMEM, "stop: out of memory");
        for (size_t i = 0; i < n; i++) {
            const json_t *s = json_array_get(st, i);
            if (!json_is_string(s))
                return atlas_fail(ATLAS_ERR_INVALID, "'stop[%zu]' must be a string", i);
            p->stop[p->n_stop++] = json_string_value(s);
        }
    } else {
        return atlas_fail(ATLAS_ERR_INVALID, "'stop' must be a string or an array of strings");
    }
    for (int i = 0; i < p->n_stop; i++) {
        if (!p->stop[i][0])
            return atlas_fail(ATLAS_ERR_INVALID, "'stop' strings must not be empty");
        /* the engine holds back text that may begin a stop string and compares every
         * suffix of it after each token: a long one costs quadratic time per token */
        size_t len = strlen(p->stop[i]);
        if (len != json_string_length(json_is_string(st) ? st : json_array_get(st, (size_t)i)))
            return atlas_fail(ATLAS_ERR_INVALID, "'stop[%d]' holds a NUL character", i);
        if (len > ATLAS_MAX_STOP_BYTES)
            return atlas_fail(ATLAS_ERR_INVALID, "'stop[%d]' is %zu bytes long: at most %d", i,
                              len, ATLAS_MAX_STOP_BYTES);
    }
    *param = NULL;
    return ATLAS_OK;
}

static atlas_status parse_sampling(const json_t *body, atlas_gen_params *p, const char **param) {
    double x;
    int64_t i;
    bool has;
    x = p->sp.temperature;
    ATLAS_TRY(atlas_param_number(body, "temperature", 0, 2, &x, NULL, param));
    p->sp.temperature = (float)x;
    x = p->sp.top_p;
    ATLAS_TRY(atlas_param_number(body, "top_p", 0, 1, &x, NULL, param));
    if (x <= 0) {
        *param = "top_p";
        return atlas_fail(ATLAS_ERR_INVALID, "'top_p' must be in (0, 1], got 0");
    }
    p->sp.top_p = (float)x;
    i = p->sp.top_k;
    ATLAS_TRY(atlas_param_int(body, "top_k", -1, INT32_MAX, &i, NULL, param));
    p->sp.top_k = i < 0 ? 0 : (int)i; /* vLLM: -1 means off */
    x = p->sp.min_p;
    ATLAS_TRY(atlas_param_number(body, "min_p", 0, 1, &x, NULL, param));
    p->sp.min_p = (float)x;
    x = p->sp.presence_penalty;
    ATLAS_TRY(atlas_param_number(body, "presence_penalty", -2, 2, &x, NULL, param));
    p->sp.presence_penalty = (float)x;
    x = p->sp.frequency_penalty;
    ATLAS_TRY(atlas_param_number(body, "frequency_penalty", -2, 2, &x, NULL, param));
    p->sp.frequency_penalty = (float)x;
    x = p->sp.repetition_penalty;
    ATLAS_TRY(atlas_param_number(body, "repetition_penalty", 0.01, 10, &x, NULL, param));
    p->sp.repetition_penalty = (float)x;
    i = 0;
    ATLAS_TRY(atlas_param_int(body, "seed", INT64_MIN, INT64_MAX, &i, &has, param));
    if (has) {
        p->sp.seed = (uint64_t)i;
    } else { /* no seed asked: a different draw each request, as OpenAI */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        p->sp.seed = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec;
    }
    return ATLAS_OK;
}

static atlas_status parse_lengths(const json_t *body, atlas_api_kind kind,
                                  const atlas_generation_defaults *gen, atlas_gen_params *p,
                                  const char **param) {
    int64_t n = 1;
    ATLAS_TRY(atlas_param_int(body, "n", 1, ATLAS_MAX_CHOICES, &n, NULL, param));
    p->n = (int)n;
    int64_t best_of = 1;
    ATLAS_TRY(atlas_param_int(body, "best_of", 1, 1, &best_of, NULL, param));
    /* max_completion_tokens is the newer name (chat); max_tokens the older one */
    bool has = false;
    ATLAS_TRY(atlas_param_int(body, "max_completion_tokens", 1, INT32_MAX, &p->max_tokens, &has,
                              param));
    if (!has)
        ATLAS_TRY(atlas_param_int(body, "max_tokens", 1, INT32_MAX, &p->max_tokens, &has, param));
    if (!has && kind == ATLAS_API_COMPLETION) p->max_tokens = 16; /* OpenAI's default there */
    /* generation_config.json's max_new_tokens stands for an absent field, as in vLLM */
    if (!has && gen && (gen->set & ATLAS_GEN_MAX_NEW_TOKENS) && gen->max_new_tokens > 0)
        p->max_tokens = gen->max_new_tokens, p->max_tokens_default = true;
    return ATLAS_OK;
}

static atlas_status parse_logprobs(const json_t *body, atlas_api_kind kind, atlas_gen_params *p,
                                   const char **param) {
    int64_t top = 0;
    bool has = false;
    if (kind == ATLAS_API_CHAT) {
        ATLAS_TRY(atlas_param_bool(body, "logprobs", &p->logprobs, param));
        ATLAS_TRY(atlas_param_int(body, "top_logprobs", 0, 20, &top, &has, param));
        if (has && !p->logprobs) {
            *param = "top_logprobs";
            return atlas_fail(ATLAS_ERR_INVALID, "'top_logprobs' needs 'logprobs': true");
        }
    } else { /* the legacy API: logprobs is the number of alternatives */
        ATLAS_TRY(atlas_param_int(body, "logprobs", 0, 20, &top, &has, param));
        p->logprobs = has;
    }
    p->top_logprobs = (int)top;
    return ATLAS_OK;
}

/* vLLM's "cache_salt": a non-empty string (vLLM refuses ""), whose bytes the engine
 * compares, so a NUL in it would cut it short; bounded, as it is copied per request. */
static atlas_status parse_cache_salt(const json_t *body, atlas_gen_params *p,
                                     const char **param) {
    const char *salt = NULL;
    ATLAS_TRY(atlas_param_string(body, "cache_salt", &salt, param));
    if (!salt) return ATLAS_OK;
    *param = "cache_salt";
    size_t len = strlen(salt);
    if (len != json_string_length(json_object_get(body, "cache_salt")))
        return atlas_fail(ATLAS_ERR_INVALID, "'cache_salt' holds a NUL character");
    if (len == 0) return atlas_fail(ATLAS_ERR_INVALID, "'cache_salt' must not be empty");
    if (len > ATLAS_ENGINE_MAX_CACHE_SALT)
        return atlas_fail(ATLAS_ERR_INVALID, "'cache_salt' is %zu bytes long: at most %d", len,
                          ATLAS_ENGINE_MAX_CACHE_SALT);
    p->cache_salt = salt;
    *param = NULL;
    return ATLAS_OK;
}

atlas_status atlas_param_keep_alive(const json_t *body, int64_t *out_ms, const char **param) {
    *out_ms = 0;
    const json_t *k = json_object_get(body, "keep_alive");
    if (!k || json_is_null(k)) return ATLAS_OK;
    char num[64];
    const char *text = json_string_value(k);
    if (json_is_number(k)) snprintf(num, sizeof num, "%.17g", json_number_value(k)), text = num;
    if (text && atlas_engine_parse_keep_alive(text, out_ms) == ATLAS_OK) return ATLAS_OK;
    *param = "keep_alive";
    return atlas_fail(ATLAS_ERR_INVALID, "'keep_alive' must be a number of seconds or a "
                                         "duration such as \"5m\" or \"1h30m\"");
}

/* "response_format": {"type": "text"} (the default), {"type": "json_object"} (the text is
 * then one JSON object, by constrained decoding) or {"type": "json_schema"} (the subset of
 * schema.h; what it cannot enforce is refused by name rather than ignored). */
static atlas_status parse_response_format(const json_t *body, atlas_gen_params *p,
                                          const char **param) {
    const json_t *rf = field(body, "response_format");
    if (!rf) return ATLAS_OK;
    *param = "response_format";
    const char *type = json_string_value(json_object_get(rf, "type"));
    if (!json_is_object(rf) || !type)
        return atlas_fail(ATLAS_ERR_INVALID, "'response_format' must be an object with a string "
                                             "'type'");
    if (!strcmp(type, "json_schema")) {
        const json_t *schema = json_object_get(json_object_get(rf, "json_schema"), "schema");
        if (!json_is_object(schema))
            return atlas_fail(ATLAS_ERR_INVALID, "'response_format.json_schema.schema' must be "
                                                 "an object");
        ATLAS_TRY(atlas_schema_program(schema, "response_format.json_schema.schema",
                                       &p->constraint));
    } else if (!strcmp(type, "json_object")) {
        ATLAS_TRY(atlas_constraint_new(&p->constraint));
        ATLAS_TRY(atlas_constraint_add_json_object(p->constraint));
    } else if (strcmp(type, "text") != 0) {
        return atlas_fail(ATLAS_ERR_INVALID, "'response_format' of type '%.100s': the type must "
                                             "be \"text\", \"json_object\" or \"json_schema\"",
                          type);
    }
    *param = NULL;
    return ATLAS_OK;
}

/* generation_config.json's defaults under the request's fields, as vLLM applies them; a
 * value the sampler would refuse is left out rather than failing every request. */
static void apply_defaults(const atlas_generation_defaults *g, atlas_sampler_params *sp) {
    if (!g) return;
    if ((g->set & ATLAS_GEN_TEMPERATURE) && g->temperature >= 0) sp->temperature = g->temperature;
    if ((g->set & ATLAS_GEN_TOP_P) && g->top_p > 0 && g->top_p <= 1) sp->top_p = g->top_p;
    if ((g->set & ATLAS_GEN_TOP_K) && g->top_k >= 0) sp->top_k = g->top_k;
    if ((g->set & ATLAS_GEN_MIN_P) && g->min_p >= 0 && g->min_p <= 1) sp->min_p = g->min_p;
    if ((g->set & ATLAS_GEN_REPETITION_PENALTY) && g->repetition_penalty > 0)
        sp->repetition_penalty = g->repetition_penalty;
}

atlas_status atlas_gen_params_parse(const json_t *body, atlas_api_kind kind,
                                    const atlas_tokenizer *tok,
                                    const atlas_generation_defaults *gen, atlas_gen_params *p,
                                    const char **param) {
    memset(p, 0, sizeof *p);
    p->sp = atlas_sampler_default_params();
    apply_defaults(gen, &p->sp);
    *param = NULL;
    ATLAS_TRY(atlas_param_string(body, "model", &p->model, param));
    ATLAS_TRY(parse_sampling(body, p, param));
    ATLAS_TRY(parse_lengths(body, kind, gen, p, param));
    ATLAS_TRY(parse_logprobs(body, kind, p, param));
    ATLAS_TRY(parse_stop(body, p, param));
    ATLAS_TRY(parse_logit_bias(body, tok, p, param));
    ATLAS_TRY(atlas_param_bool(body, "stream", &p->stream, param));
    ATLAS_TRY(atlas_param_bool(body, "ignore_eos", &p->ignore_eos, param));
    /* vLLM's min_tokens keeps eos and the stop ids from being drawn before that many tokens:
     * not done here, so refused rather than ignored (0 asks for nothing) */
    const json_t *min_tokens = field(body, "min_tokens");
    if (min_tokens && !(json_is_integer(min_tokens) && json_integer_value(min_tokens) == 0)) {
        *param = "min_tokens";
        return atlas_fail(ATLAS_ERR_INVALID, "'min_tokens' is not supported (send 'ignore_eos' "
                                             "with 'max_tokens' for a fixed length)");
    }
    ATLAS_TRY(atlas_param_bool(body, "return_tokens_as_token_ids", &p->tokens_as_ids, param));
    if (kind == ATLAS_API_COMPLETION) ATLAS_TRY(atlas_param_bool(body, "echo", &p->echo, param));
    ATLAS_TRY(parse_response_format(body, p, param));
    ATLAS_TRY(parse_cache_salt(body, p, param));
    ATLAS_TRY(atlas_param_keep_alive(body, &p->keep_alive_ms, param));
    const json_t *so = field(body, "stream_options");
    if (so) {
        if (!json_is_object(so)) {
            *param = "stream_options";
            return atlas_fail(ATLAS_ERR_INVALID, "'stream_options' must be an object");
        }
        ATLAS_TRY(atlas_param_bool(so, "include_usage", &p->include_usage, param));
        if (*param) *param = "stream_options.include_usage";
    }
    return ATLAS_OK;
}

void atlas_gen_params_free(atlas_gen_params *p) {
    atlas_constraint_free(p->constraint);
    p->constraint = NULL;
    free(p->bias);
    free(p->stop);
    p->bias = NULL;
    p->stop = NULL;
}

json_t *atlas_json_text(const char *s, size_t len) {
    json_t *v = json_stringn(s, len);
    if (v || !s) return v ? v : json_string("");
    char *out = malloc(len * 3 + 1);
    if (!out) return NULL;
    size_t o = atlas_utf8_clean(out, len * 3 + 1, s, len);
    v = json_stringn(out, o);
    free(out);
    return v;
}

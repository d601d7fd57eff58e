/* model/pooling.c — see pooling.h. */
#include "model/pooling.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/error.h"
#include "core/file.h"

const char *atlas_pooling_name(atlas_pooling p) {
    switch (p) {
    case ATLAS_POOL_MEAN: return "mean";
    case ATLAS_POOL_LAST: return "last";
    case ATLAS_POOL_CLS: return "cls";
    case ATLAS_POOL_NONE: break;
    }
    return "none";
}

/* DIR/NAME as JSON (*out NULL when the file is absent). */
static atlas_status read_json(const char *dir, const char *name, char *path, size_t cap,
                              json_t **out) {
    *out = NULL;
    ATLAS_TRY(atlas_path_join(path, cap, dir, name));
    if (!atlas_file_exists(path)) return ATLAS_OK;
    char *text;
    size_t len;
    ATLAS_TRY(atlas_file_read(path, &text, &len));
    json_error_t err;
    *out = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    free(text);
    if (!*out)
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: JSON: %s (line %d, column %d)", path, err.text,
                          err.line, err.column);
    return ATLAS_OK;
}

/* 1_Pooling/config.json's pooling_mode_* flags: exactly one of those atlas computes. */
static atlas_status read_pooling(const char *dir, const char *sub, atlas_config *cfg) {
    static const struct { const char *key; atlas_pooling mode; } modes[] = {
        {"pooling_mode_mean_tokens", ATLAS_POOL_MEAN},
        {"pooling_mode_lasttoken", ATLAS_POOL_LAST},
        {"pooling_mode_cls_token", ATLAS_POOL_CLS},
        {"pooling_mode_max_tokens", ATLAS_POOL_NONE},
        {"pooling_mode_mean_sqrt_len_tokens", ATLAS_POOL_NONE},
        {"pooling_mode_weightedmean_tokens", ATLAS_POOL_NONE},
    };
    char name[512], path[4096];
    snprintf(name, sizeof name, "%s/config.json", sub);
    json_t *root;
    ATLAS_TRY(read_json(dir, name, path, sizeof path, &root));
    if (!root) return atlas_fail(ATLAS_ERR_IO, "%s: missing (modules.json names a Pooling "
                                 "module there)", path);
    atlas_status st = ATLAS_OK;
    int on = 0;
    for (size_t i = 0; i < sizeof modes / sizeof *modes && st == ATLAS_OK; i++) {
        if (!json_is_true(json_object_get(root, modes[i].key))) continue;
        if (modes[i].mode == ATLAS_POOL_NONE)
            st = atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: \"%s\": atlas pools by mean, last token "
                            "or cls only", path, modes[i].key);
        cfg->pooling = modes[i].mode;
        on++;
    }
    json_t *dim = json_object_get(root, "word_embedding_dimension");
    if (st == ATLAS_OK && on != 1)
        st = atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: %d pooling modes are on: atlas takes exactly "
                        "one of pooling_mode_mean_tokens, pooling_mode_lasttoken, "
                        "pooling_mode_cls_token", path, on);
    else if (st == ATLAS_OK && json_is_false(json_object_get(root, "include_prompt")))
        st = atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: \"include_prompt\": false is not supported "
                        "(the whole input is pooled)", path);
    else if (st == ATLAS_OK && dim && json_integer_value(dim) != cfg->hidden)
        st = atlas_fail(ATLAS_ERR_FORMAT, "%s: \"word_embedding_dimension\" %lld, but "
                        "hidden_size is %d", path, (long long)json_integer_value(dim),
                        cfg->hidden);
    json_decref(root);
    return st;
}

/* One entry of modules.json: a type atlas computes, or a refusal naming it. */
static atlas_status read_module(const char *dir, const char *path, size_t i, const json_t *m,
                                atlas_config *cfg, bool *pooled) {
    const char *type = json_string_value(json_object_get(m, "type"));
    const char *sub = json_string_value(json_object_get(m, "path"));
    if (!type || !sub)
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: [%zu]: expected \"type\" and \"path\" strings",
                          path, i);
    const char *cls = strrchr(type, '.') ? strrchr(type, '.') + 1 : type;
    if (!strcmp(cls, "Transformer")) return ATLAS_OK;
    if (!strcmp(cls, "Normalize")) {
        cfg->normalize = true;
        return ATLAS_OK;
    }
    if (!strcmp(cls, "Pooling") && !*pooled) {
        *pooled = true;
        return read_pooling(dir, sub, cfg);
    }
    return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: [%zu]: module \"%s\" is not supported (atlas "
                      "runs a Transformer, one Pooling and a Normalize)", path, i, type);
}

atlas_status atlas_pooling_load(const char *dir, atlas_config *cfg) {
    char path[4096];
    json_t *mods;
    cfg->pooling = ATLAS_POOL_NONE;
    cfg->normalize = false;
    ATLAS_TRY(read_json(dir, "modules.json", path, sizeof path, &mods));
    if (!mods) {
        if (strcmp(cfg->architecture, "Qwen3Model")) return ATLAS_OK;
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: missing: a Qwen3Model has no output head, "
                          "so atlas serves it as an embedding model, which needs "
                          "sentence-transformers' modules.json and its Pooling config", path);
    }
    atlas_status st = json_is_array(mods) ? ATLAS_OK
                      : atlas_fail(ATLAS_ERR_FORMAT, "%s: expected a list of modules", path);
    bool pooled = false;
    for (size_t i = 0; st == ATLAS_OK && i < json_array_size(mods); i++)
        st = read_module(dir, path, i, json_array_get(mods, i), cfg, &pooled);
    if (st == ATLAS_OK && !pooled)
        st = atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: no Pooling module: atlas serves a "
                        "sentence-transformers model as an embedding model only", path);
    json_decref(mods);
    if (st != ATLAS_OK) cfg->pooling = ATLAS_POOL_NONE;
    return st;
}

/* cli/serve_preset.c — the models file of `atlas serve --models-preset FILE`:
 *
 *   {"models": [{"name": "small", "dir": "tiny", "ctx_size": 2048, "keep_alive": "10m"}, ...]}
 *
 * Each key is checked by name and type; an unknown key is refused rather than ignored, so
 * a misspelt setting is never silently the default.  A relative "dir" or "chat_template" is
 * taken from the file's own directory, so a file and its models move together. */
#include "cli/serve_preset.h"

#include "atlas/toolcall.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *own(serve_preset *p, char *s) {
    if (!s) return NULL;
    if (p->n_strings == p->cap_strings) {
        int cap = p->cap_strings ? p->cap_strings * 2 : 32;
        char **grown = realloc(p->strings, (size_t)cap * sizeof *grown);
        if (!grown) return free(s), NULL;
        p->strings = grown, p->cap_strings = cap;
    }
    return p->strings[p->n_strings++] = s;
}

static int fail(const char *path, int i, const char *key, const char *what) {
    fprintf(stderr, "atlas serve: --models-preset %s: models[%d].%s: %s\n", path, i, key, what);
    return -1;
}

/* An integer in lo..hi into *out. */
static int get_int(const char *path, int i, const char *key, const json_t *v, long lo, long hi,
                   int *out) {
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        char what[96];
        snprintf(what, sizeof what, "must be an integer in %ld..%ld", lo, hi);
        return fail(path, i, key, what);
    }
    *out = (int)json_integer_value(v);
    return 0;
}

static int get_aliases(serve_preset *p, const char *path, int i, const json_t *v,
                       serve_preset_model *pm) {
    if (!json_is_array(v)) return fail(path, i, "aliases", "must be an array of names");
    pm->aliases = calloc(json_array_size(v) + 1, sizeof *pm->aliases);
    if (!pm->aliases) return fail(path, i, "aliases", "out of memory");
    size_t k;
    const json_t *a;
    json_array_foreach(v, k, a) {
        const char *s = json_string_value(a);
        if (!s || !*s) return fail(path, i, "aliases", "must be an array of non-empty strings");
        char *spec = NULL;
        if (asprintf(&spec, "%s=%s", s, pm->m.name) < 0 || !own(p, spec))
            return fail(path, i, "aliases", "out of memory");
        pm->aliases[pm->n_aliases++] = spec;
    }
    return 0;
}

/* PATH as given, or taken from the models file's directory when relative. */
static char *beside(const char *file, const char *path) {
    const char *slash = strrchr(file, '/');
    char *full = NULL;
    if (path[0] == '/' || !slash) return strdup(path);
    return asprintf(&full, "%.*s/%s", (int)(slash - file), file, path) < 0 ? NULL : full;
}

/* "chat_template": as --chat-template NAME=FILE takes it (a Jinja file, a
 * tokenizer_config.json or a directory holding either), read when the engine starts. */
static int get_template(serve_preset *p, const char *path, int i, const json_t *v,
                        serve_preset_model *pm) {
    const char *s = json_string_value(v);
    if (!s || !*s) return fail(path, i, "chat_template", "must be the path of a template");
    pm->m.chat_template = own(p, beside(path, s));
    return pm->m.chat_template ? 0 : fail(path, i, "chat_template", "out of memory");
}

/* "kv_dtype": --kv-cache-dtype's values ("auto", "bf16", "fp8", "fp8_e4m3"), or "f32", the
 * CPU's cache with fp32 activations (the engine checks that the model gets it); any other
 * type is refused by name. */
static int get_kv_dtype(serve_preset *p, const char *path, int i, const json_t *v,
                        serve_preset_model *pm) {
    const char *s = json_string_value(v);
    atlas_kv_dtype t;
    if (s && (!strcmp(s, "f32") || atlas_model_kv_dtype_parse(s, &t) == ATLAS_OK)) {
        pm->m.kv_dtype = own(p, strdup(s));
        return pm->m.kv_dtype ? 0 : fail(path, i, "kv_dtype", "out of memory");
    }
    char what[200];
    snprintf(what, sizeof what, "'%.40s' is not a KV cache type atlas has: give \"auto\", "
             "\"bf16\", \"fp8\" (e4m3; \"fp8_e4m3\"), \"f32\" (the CPU's with fp32 "
             "activations), or leave it out", s ? s : "(not a string)");
    return fail(path, i, "kv_dtype", what);
}

/* "matryoshka_dimensions": an embedding model's widths, as vLLM reads them from config.json
 * (the engine checks them against the model's width). */
static int get_matryoshka(const char *path, int i, const json_t *v, serve_preset_model *pm) {
    size_t n = json_array_size(v);
    if (!json_is_array(v) || n == 0 || n > ATLAS_ENGINE_MAX_MATRYOSHKA)
        return fail(path, i, "matryoshka_dimensions", "must be an array of 1 to 32 widths");
    for (size_t k = 0; k < n; k++)
        if (get_int(path, i, "matryoshka_dimensions", json_array_get(v, k), 1, 1 << 20,
                    &pm->matryoshka[k]))
            return -1;
    pm->m.matryoshka_dims = pm->matryoshka;
    pm->m.n_matryoshka_dims = (int)n;
    return 0;
}

static int get_setting(serve_preset *p, const char *path, int i, const char *key,
                       const json_t *v, serve_preset_model *pm) {
    atlas_engine_model *m = &pm->m;
    if (!strcmp(key, "name") || !strcmp(key, "dir") || !strcmp(key, "aliases")) return 0;
    if (!strcmp(key, "ctx_size")) return get_int(path, i, key, v, 1, 1L << 30, &m->ctx_size);
    if (!strcmp(key, "parallel")) return get_int(path, i, key, v, 1, 4096, &m->parallel);
    if (!strcmp(key, "batch_tokens"))
        return get_int(path, i, key, v, 1, 1 << 20, &m->batch_tokens);
    if (!strcmp(key, "kv_dtype")) return get_kv_dtype(p, path, i, v, pm);
    if (!strcmp(key, "matryoshka_dimensions")) return get_matryoshka(path, i, v, pm);
    if (!strcmp(key, "kv_memory")) {
        double g = json_number_value(v);
        if (!json_is_number(v) || !(g > 0 && g < 1e9))
            return fail(path, i, key, "must be a positive number of GiB");
        m->kv_memory = (size_t)(g * 1073741824.0);
        return 0;
    }
    if (!strcmp(key, "pinned") || !strcmp(key, "load")) {
        if (!json_is_boolean(v)) return fail(path, i, key, "must be true or false");
        if (!strcmp(key, "pinned")) m->pinned = json_is_true(v);
        else pm->load = json_is_true(v);
        return 0;
    }
    if (!strcmp(key, "chat_template")) return get_template(p, path, i, v, pm);
    if (!strcmp(key, "tool_call_format")) {
        atlas_toolcall_format f;
        const char *s = json_string_value(v);
        if (!s || atlas_toolcall_format_parse(s, &f) != ATLAS_OK)
            return fail(path, i, key, s ? atlas_last_error() : "must be a string");
        m->tool_call_format = own(p, strdup(s));
        return m->tool_call_format ? 0 : fail(path, i, key, "out of memory");
    }
    if (!strcmp(key, "keep_alive")) {
        char num[64];
        const char *text = json_string_value(v);
        if (json_is_number(v)) snprintf(num, sizeof num, "%.17g", json_number_value(v)), text = num;
        if (!text || atlas_engine_parse_keep_alive(text, &m->keep_alive_ms) != ATLAS_OK)
            return fail(path, i, key, "must be a number of seconds or a duration such as "
                                      "\"5m\" or \"1h30m\" (negative: forever)");
        return 0;
    }
    return fail(path, i, key, "unknown setting (the settings: name, dir, aliases, ctx_size, "
                              "parallel, kv_memory, kv_dtype, batch_tokens, pinned, "
                              "keep_alive, load, chat_template, tool_call_format, "
                              "matryoshka_dimensions)");
}

/* The model's "dir", taken from the file's directory when relative. */
static int get_dir(serve_preset *p, const char *path, int i, const json_t *o,
                   serve_preset_model *pm) {
    const char *dir = json_string_value(json_object_get(o, "dir"));
    if (!dir || !*dir) return fail(path, i, "dir", "required: the model's directory");
    if (!(pm->m.dir = own(p, beside(path, dir)))) return fail(path, i, "dir", "out of memory");
    const char *name = json_string_value(json_object_get(o, "name"));
    if (json_object_get(o, "name") && !name) return fail(path, i, "name", "must be a string");
    if (!name) { /* the directory's last component, as --model DIR names it */
        size_t n = strlen(dir);
        while (n > 1 && dir[n - 1] == '/') n--;
        size_t b = n;
        while (b > 0 && dir[b - 1] != '/') b--;
        name = own(p, strndup(dir + b, n - b));
    } else {
        name = own(p, strdup(name));
    }
    if (!name) return fail(path, i, "name", "out of memory");
    if (atlas_engine_check_name(name) != ATLAS_OK) return fail(path, i, "name", atlas_last_error());
    pm->m.name = name;
    return 0;
}

static int read_model(serve_preset *p, const char *path, int i, const json_t *o) {
    serve_preset_model *pm = &p->models[i];
    pm->load = -1;
    if (!json_is_object(o)) {
        fprintf(stderr, "atlas serve: --models-preset %s: models[%d]: must be an object\n",
                path, i);
        return -1;
    }
    if (get_dir(p, path, i, o, pm)) return -1;
    const json_t *al = json_object_get(o, "aliases");
    if (al && get_aliases(p, path, i, al, pm)) return -1;
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)o, key, v)
        if (get_setting(p, path, i, key, v, pm)) return -1;
    return 0;
}

int serve_preset_read(const char *path, serve_preset *out) {
    memset(out, 0, sizeof *out);
    json_error_t err;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        fprintf(stderr, "atlas serve: --models-preset %s: line %d, column %d: %s\n", path,
                err.line, err.column, err.text);
        return -1;
    }
    const json_t *models = json_object_get(root, "models");
    const char *key;
    json_t *v;
    int rc = 0;
    if (json_is_object(root))
        json_object_foreach(root, key, v) if (strcmp(key, "models")) {
            fprintf(stderr, "atlas serve: --models-preset %s: unknown key '%s' (the file is "
                            "{\"models\": [...]})\n", path, key);
            rc = -1;
            break;
        }
    if (!rc && (!json_is_array(models) || json_array_size(models) == 0)) {
        fprintf(stderr, "atlas serve: --models-preset %s: expected {\"models\": [{\"dir\": ...}, "
                        "...]} with at least one model\n", path);
        rc = -1;
    }
    if (!rc && !(out->models = calloc(json_array_size(models), sizeof *out->models))) rc = -1;
    for (size_t i = 0; !rc && i < json_array_size(models); i++) {
        rc = read_model(out, path, (int)i, json_array_get(models, i));
        out->n = (int)i + 1;
    }
    json_decref(root);
    return rc;
}

void serve_preset_free(serve_preset *p) {
    for (int i = 0; i < p->n; i++) free(p->models[i].aliases);
    free(p->models);
    for (int i = 0; i < p->n_strings; i++) free(p->strings[i]);
    free(p->strings);
    memset(p, 0, sizeof *p);
}

/* chat/template.c — atlas/template.h: loading a model's chat template(s) and
 * rendering them with the variables transformers' apply_chat_template passes: messages,
 * tools (None when absent), documents (None), add_generation_prompt, the special tokens,
 * then the caller's extra keyword arguments. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "atlas/template.h"
#include "chat/template_internal.h"
#include "core/error.h"
#include "core/file.h"

enum { MAX_TEMPLATES = 16, ARENA_LIMIT_MB = 256 };

struct atlas_template {
    size_t n;
    char *names[MAX_TEMPLATES];   /* "default", "tool_use", ... */
    char *sources[MAX_TEMPLATES];
    tnode *asts[MAX_TEMPLATES];
    char *errnames[MAX_TEMPLATES]; /* used in messages: "chat_template", "chat_template[tool_use]" */
    char *bos, *eos, *unk, *pad;   /* NULL when absent */
};

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

void atlas_template_free(atlas_template *t) {
    if (!t) return;
    for (size_t i = 0; i < t->n; i++) {
        free(t->names[i]);
        free(t->sources[i]);
        free(t->errnames[i]);
        tpl_node_free(t->asts[i]);
    }
    free(t->bos);
    free(t->eos);
    free(t->unk);
    free(t->pad);
    free(t);
}

static atlas_status add_source(atlas_template *t, const char *name, const char *src, const char *errname) {
    if (t->n >= MAX_TEMPLATES) return atlas_fail(ATLAS_ERR_UNSUPPORTED, "more than %d named chat templates", MAX_TEMPLATES);
    size_t i = t->n;
    t->names[i] = strdup(name);
    t->sources[i] = strdup(src);
    t->errnames[i] = strdup(errname);
    t->n++;
    if (!t->names[i] || !t->sources[i] || !t->errnames[i]) return atlas_fail(ATLAS_ERR_NOMEM, "out of memory");
    return tpl_parse(src, errname, &t->asts[i]);
}

atlas_status atlas_template_parse(const char *source, const char *name, const char *bos_token,
                                  const char *eos_token, atlas_template **out) {
    *out = NULL;
    if (!source) return atlas_fail(ATLAS_ERR_INVALID, "atlas_template_parse: source is NULL");
    atlas_template *t = calloc(1, sizeof *t);
    if (!t) return atlas_fail(ATLAS_ERR_NOMEM, "out of memory");
    t->bos = dup_or_null(bos_token);
    t->eos = dup_or_null(eos_token);
    atlas_status st = add_source(t, "default", source, name ? name : "template");
    if (st != ATLAS_OK) {
        atlas_template_free(t);
        return st;
    }
    *out = t;
    return ATLAS_OK;
}

/* "bos_token": "<s>" or {"content": "<s>", ...} */
static atlas_status special_token(const json_t *cfg, const char *key, const char *path, char **out) {
    const json_t *v = json_object_get(cfg, key);
    *out = NULL;
    if (!v || json_is_null(v)) return ATLAS_OK;
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v)) return atlas_fail(ATLAS_ERR_FORMAT, "%s: %s: expected a string or {\"content\": string}", path, key);
    if (!(*out = strdup(json_string_value(v)))) return atlas_fail(ATLAS_ERR_NOMEM, "out of memory");
    return ATLAS_OK;
}

static atlas_status load_config_templates(atlas_template *t, const json_t *ct, const char *path) {
    if (json_is_string(ct)) return add_source(t, "default", json_string_value(ct), "chat_template");
    if (!json_is_array(ct))
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: chat_template: expected a string or a list of {name, template}", path);
    size_t i;
    json_t *item;
    json_array_foreach(ct, i, item) {
        const json_t *nm = json_object_get(item, "name"), *src = json_object_get(item, "template");
        if (!json_is_string(nm) || !json_is_string(src))
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: chat_template[%zu]: expected {\"name\": string, \"template\": string}", path, i);
        char errname[160];
        snprintf(errname, sizeof errname, "chat_template[%.100s]", json_string_value(nm));
        ATLAS_TRY(add_source(t, json_string_value(nm), json_string_value(src), errname));
    }
    if (!t->n) return atlas_fail(ATLAS_ERR_FORMAT, "%s: chat_template: empty list", path);
    return ATLAS_OK;
}

/* tokenizer_config.json at path as a JSON object in *out, or NULL when there is no file. */
static atlas_status read_config(const char *path, json_t **out) {
    *out = NULL;
    if (!atlas_file_exists(path)) return ATLAS_OK;
    json_error_t err;
    char *text;
    size_t len;
    ATLAS_TRY(atlas_file_read(path, &text, &len));
    json_t *cfg = json_loadb(text, len, JSON_DECODE_INT_AS_REAL, &err); /* model_max_length can be 1e30 */
    free(text);
    if (!cfg) return atlas_fail(ATLAS_ERR_FORMAT, "%s:%d:%d: %s", path, err.line, err.column, err.text);
    if (!json_is_object(cfg)) {
        json_decref(cfg);
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: expected a JSON object", path);
    }
    *out = cfg;
    return ATLAS_OK;
}

static atlas_status load_specials(atlas_template *t, const json_t *cfg, const char *path) {
    ATLAS_TRY(special_token(cfg, "bos_token", path, &t->bos));
    ATLAS_TRY(special_token(cfg, "eos_token", path, &t->eos));
    ATLAS_TRY(special_token(cfg, "unk_token", path, &t->unk));
    return special_token(cfg, "pad_token", path, &t->pad);
}

/* A Jinja file as the default template; its errors name the file. */
static atlas_status load_jinja(atlas_template *t, const char *path) {
    char *src;
    size_t len;
    ATLAS_TRY(atlas_file_read(path, &src, &len));
    atlas_status st = add_source(t, "default", src, path);
    free(src);
    return st;
}

/* The templates of tokenizer_config.json at path (its "chat_template"), if it has any. */
static atlas_status load_config_file(atlas_template *t, const char *path, bool specials) {
    json_t *cfg = NULL;
    ATLAS_TRY(read_config(path, &cfg));
    atlas_status st = ATLAS_OK;
    if (cfg && specials) st = load_specials(t, cfg, path);
    const json_t *ct = json_object_get(cfg, "chat_template");
    if (st == ATLAS_OK && ct && !json_is_null(ct)) st = load_config_templates(t, ct, path);
    json_decref(cfg);
    return st;
}

/* chat_template.jinja wins over tokenizer_config.json's chat_template, as in transformers
 * (newer checkpoints ship the file and keep an older template in the config). specials:
 * read bos/eos/unk/pad from the config too. */
static atlas_status load_dir(atlas_template *t, const char *dir, bool specials) {
    char path[4096], jinja[4096];
    ATLAS_TRY(atlas_path_join(path, sizeof path, dir, "tokenizer_config.json"));
    ATLAS_TRY(atlas_path_join(jinja, sizeof jinja, dir, "chat_template.jinja"));
    if (atlas_file_exists(jinja)) {
        if (specials) {
            json_t *cfg = NULL;
            ATLAS_TRY(read_config(path, &cfg));
            atlas_status st = cfg ? load_specials(t, cfg, path) : ATLAS_OK;
            json_decref(cfg);
            ATLAS_TRY(st);
        }
        return load_jinja(t, jinja);
    }
    ATLAS_TRY(load_config_file(t, path, specials));
    if (t->n == 0)
        return atlas_fail(ATLAS_ERR_NOT_FOUND, "%s: no chat_template in tokenizer_config.json and no chat_template.jinja", dir);
    return ATLAS_OK;
}

atlas_status atlas_template_load(const char *dir, atlas_template **out) {
    *out = NULL;
    atlas_template *t = calloc(1, sizeof *t);
    if (!t) return atlas_fail(ATLAS_ERR_NOMEM, "out of memory");
    atlas_status st = load_dir(t, dir, true);
    if (st != ATLAS_OK) {
        atlas_template_free(t);
        return atlas_fail_wrap(st, "loading the chat template of %s", dir);
    }
    *out = t;
    return ATLAS_OK;
}

static bool is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcmp(s + n - k, tail);
}

/* The special tokens stay the model's: a replacement template renders with the tokens its
 * tokenizer really has. */
static atlas_status load_override(atlas_template *t, const char *dir, const char *file) {
    if (dir) {
        char path[4096];
        json_t *cfg = NULL;
        ATLAS_TRY(atlas_path_join(path, sizeof path, dir, "tokenizer_config.json"));
        ATLAS_TRY(read_config(path, &cfg));
        atlas_status st = cfg ? load_specials(t, cfg, path) : ATLAS_OK;
        json_decref(cfg);
        ATLAS_TRY(st);
    }
    if (!atlas_file_exists(file)) return atlas_fail(ATLAS_ERR_NOT_FOUND, "%s: no such file or directory", file);
    if (is_dir(file)) return load_dir(t, file, false);
    if (ends_with(file, ".json")) {
        ATLAS_TRY(load_config_file(t, file, false));
        if (t->n == 0) return atlas_fail(ATLAS_ERR_NOT_FOUND, "%s: no chat_template", file);
        return ATLAS_OK;
    }
    return load_jinja(t, file);
}

atlas_status atlas_template_load_file(const char *dir, const char *file, atlas_template **out) {
    *out = NULL;
    if (!file || !*file) return atlas_fail(ATLAS_ERR_INVALID, "atlas_template_load_file: no file");
    atlas_template *t = calloc(1, sizeof *t);
    if (!t) return atlas_fail(ATLAS_ERR_NOMEM, "out of memory");
    atlas_status st = load_override(t, dir, file);
    if (st != ATLAS_OK) {
        atlas_template_free(t);
        return atlas_fail_wrap(st, "loading the chat template %s", file);
    }
    *out = t;
    return ATLAS_OK;
}

static size_t pick(const atlas_template *t, const char *name) {
    for (size_t i = 0; i < t->n; i++)
        if (!strcmp(t->names[i], name)) return i;
    return t->n;
}

const char *atlas_template_source(const atlas_template *t) {
    size_t i = pick(t, "default");
    return t->sources[i < t->n ? i : 0];
}
const char *atlas_template_bos(const atlas_template *t) { return t->bos ? t->bos : ""; }
const char *atlas_template_eos(const atlas_template *t) { return t->eos ? t->eos : ""; }

/* tool_calls[].function.arguments given as a JSON string holding an object become that
 * object (vLLM does this before rendering; templates call tojson on it). */
static atlas_status parse_string_arguments(trender *r, tval *messages) {
    for (size_t i = 0; i < messages->u.l->n; i++) {
        tval *m = &messages->u.l->v[i];
        tval *calls = m->kind == TV_DICT ? tv_dict_get(m, "tool_calls") : NULL;
        if (!calls || calls->kind != TV_LIST) continue;
        for (size_t k = 0; k < calls->u.l->n; k++) {
            tval *c = &calls->u.l->v[k];
            tval *fn = c->kind == TV_DICT ? tv_dict_get(c, "function") : NULL;
            tval *args = fn && fn->kind == TV_DICT ? tv_dict_get(fn, "arguments") : NULL;
            if (!args || args->kind != TV_STR) continue;
            json_t *j = json_loadb(args->u.s->s, args->u.s->len, JSON_DECODE_ANY, NULL);
            if (j && json_is_object(j)) {
                atlas_status st = tv_from_json(r, j, args);
                json_decref(j);
                ATLAS_TRY(st);
            } else {
                json_decref(j);
            }
        }
    }
    return ATLAS_OK;
}

static atlas_status set_json(trender *r, const char *name, const json_t *j) {
    tval v;
    ATLAS_TRY(tv_from_json(r, j, &v));
    return tpl_scope_set(r, r->root, name, v);
}

static atlas_status set_token(trender *r, const char *name, const char *tok) {
    if (!tok) return ATLAS_OK;
    tval v;
    ATLAS_TRY(tv_str(r, tok, strlen(tok), &v));
    return tpl_scope_set(r, r->root, name, v);
}

/* The variables setup_root sets, whether or not this template has a value for them. */
static const char *const renderer_names[] = {"messages",  "tools",     "documents",
                                             "add_generation_prompt",   "bos_token",
                                             "eos_token", "unk_token", "pad_token"};

bool atlas_template_reserved(const char *name) {
    if (!name) return false;
    for (size_t i = 0; i < sizeof renderer_names / sizeof *renderer_names; i++)
        if (!strcmp(renderer_names[i], name)) return true;
    return tpl_is_builtin(name);
}

/* A keyword argument replacing the conversation or a builtin would let whoever sets it change
 * what the template renders past every check made on messages and tools. The root scope is
 * searched too, so that a variable setup_root gains later is covered before this list is. */
static atlas_status set_kwargs(trender *r, const json_t *kwargs) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)kwargs, k, v) {
        bool taken = atlas_template_reserved(k);
        for (size_t i = 0; !taken && i < r->root->n; i++) taken = !strcmp(r->root->names[i], k);
        if (taken)
            return atlas_fail(ATLAS_ERR_INVALID, "kwargs: '%.200s' is a name the renderer sets "
                                                 "(a variable or a builtin function); a keyword "
                                                 "argument may not replace it", k);
        tval val;
        ATLAS_TRY(tv_from_json(r, v, &val));
        /* the name must outlive the render: copy it into the arena */
        size_t len = strlen(k);
        char *name = tpl_alloc(r, len + 1);
        if (!name) return tpl_oom(r, NULL);
        memcpy(name, k, len + 1);
        ATLAS_TRY(tpl_scope_set(r, r->root, name, val));
    }
    return ATLAS_OK;
}

static atlas_status setup_root(trender *r, const atlas_template *t, const atlas_template_input *in) {
    if (!(r->root = tpl_scope_new(r, NULL))) return tpl_oom(r, NULL);
    tval msgs;
    ATLAS_TRY(tv_from_json(r, in->messages, &msgs));
    ATLAS_TRY(parse_string_arguments(r, &msgs));
    ATLAS_TRY(tpl_scope_set(r, r->root, "messages", msgs));
    if (in->tools && !json_is_null(in->tools)) ATLAS_TRY(set_json(r, "tools", in->tools));
    else ATLAS_TRY(tpl_scope_set(r, r->root, "tools", tv_none()));
    ATLAS_TRY(tpl_scope_set(r, r->root, "documents", tv_none()));
    ATLAS_TRY(tpl_scope_set(r, r->root, "add_generation_prompt", tv_bool(in->add_generation_prompt)));
    ATLAS_TRY(set_token(r, "bos_token", t->bos));
    ATLAS_TRY(set_token(r, "eos_token", t->eos));
    ATLAS_TRY(set_token(r, "unk_token", t->unk));
    ATLAS_TRY(set_token(r, "pad_token", t->pad));
    return in->kwargs ? set_kwargs(r, in->kwargs) : ATLAS_OK;
}

static atlas_status render(const atlas_template *t, const atlas_template_input *in, char **out,
                           size_t **cuts, size_t *n_cuts) {
    *out = NULL;
    if (cuts) *cuts = NULL, *n_cuts = 0;
    if (!t || !in) return atlas_fail(ATLAS_ERR_INVALID, "atlas_template_render: NULL argument");
    if (!json_is_array(in->messages)) return atlas_fail(ATLAS_ERR_INVALID, "messages: expected an array");
    if (in->tools && !json_is_null(in->tools) && !json_is_array(in->tools))
        return atlas_fail(ATLAS_ERR_INVALID, "tools: expected an array");
    if (in->kwargs && !json_is_object(in->kwargs)) return atlas_fail(ATLAS_ERR_INVALID, "kwargs: expected an object");
    bool tools = in->tools && !json_is_null(in->tools);
    size_t i = tools ? pick(t, "tool_use") : t->n;
    if (i >= t->n) i = pick(t, "default");
    if (i >= t->n) {
        if (t->n != 1)
            return atlas_fail(ATLAS_ERR_NOT_FOUND, "no chat template named \"default\"%s among %zu", tools ? " or \"tool_use\"" : "", t->n);
        i = 0;
    }
    trender r = {.name = t->errnames[i], .pieces = cuts != NULL};
    r.arena.limit = (size_t)ARENA_LIMIT_MB << 20;
    tbuf buf = {.pieces = cuts != NULL};
    atlas_status st = setup_root(&r, t, in);
    if (st == ATLAS_OK) st = tpl_exec(&r, r.root, t->asts[i], &buf);
    if (st == ATLAS_OK && buf.oom) st = atlas_fail(ATLAS_ERR_NOMEM, "%s: out of memory for the output", r.name);
    tpl_arena_free(&r.arena);
    if (st != ATLAS_OK) {
        free(buf.p);
        free(buf.cuts);
        return st;
    }
    *out = buf.p ? buf.p : strdup("");
    if (!*out) {
        free(buf.cuts);
        return atlas_fail(ATLAS_ERR_NOMEM, "out of memory");
    }
    size_t k = tbuf_inner_cuts(&buf); /* the text's edges are no cuts */
    if (k) *cuts = buf.cuts, *n_cuts = k;
    else free(buf.cuts);
    return ATLAS_OK;
}

atlas_status atlas_template_render(const atlas_template *t, const atlas_template_input *in, char **out) {
    return render(t, in, out, NULL, NULL);
}

atlas_status atlas_template_render_pieces(const atlas_template *t, const atlas_template_input *in,
                                          char **out, size_t **cuts, size_t *n_cuts) {
    if (!cuts || !n_cuts) return atlas_fail(ATLAS_ERR_INVALID, "atlas_template_render_pieces: NULL argument");
    return render(t, in, out, cuts, n_cuts);
}

static atlas_status load_arg(const char *what, const char *text, json_t **out) {
    *out = NULL;
    if (!text) return ATLAS_OK;
    json_error_t err;
    *out = json_loads(text, JSON_DECODE_ANY, &err);
    if (!*out) return atlas_fail(ATLAS_ERR_INVALID, "%s: invalid JSON at %d:%d: %s", what, err.line, err.column, err.text);
    return ATLAS_OK;
}

atlas_status atlas_template_render_str(const atlas_template *t, const char *messages_json,
                                       const char *tools_json, bool add_generation_prompt,
                                       const char *kwargs_json, char **out) {
    json_t *m = NULL, *tools = NULL, *kw = NULL;
    *out = NULL;
    if (!messages_json) return atlas_fail(ATLAS_ERR_INVALID, "messages: NULL");
    atlas_status st = load_arg("messages", messages_json, &m);
    if (st == ATLAS_OK) st = load_arg("tools", tools_json, &tools);
    if (st == ATLAS_OK) st = load_arg("kwargs", kwargs_json, &kw);
    if (st == ATLAS_OK) {
        atlas_template_input in = {.messages = m, .tools = tools, .kwargs = kw, .add_generation_prompt = add_generation_prompt};
        st = atlas_template_render(t, &in, out);
    }
    json_decref(m);
    json_decref(tools);
    json_decref(kw);
    return st;
}

/* fuzz/fuzz-shield.c — libFuzzer target for the chat shield (atlas/shield.h) with the Qwen3
 * tokenizer. Input: any bytes, as client text (when valid UTF-8) and as rendered text; the
 * client text also as an object key and as a chat_template_kwargs name and value, rendered
 * the way the server renders a request (atlas_api_render_template, shielded, with the
 * pieces' cuts).
 * Checked: shielding then spelling back gives the text again, for values and keys alike; the
 * shielded text tokenizes to the same ids as the text tokenized with every special token
 * refused; arbitrary rendered text (cut and foreign sentinels included) tokenizes without a
 * crash; a tool's parameter name, a call's argument name (in an object, or in a JSON string
 * with \u escapes) and a kwarg make no more control tokens than a plain name does; kwargs
 * printed beside the template's own text, directly and through a macro and a set block,
 * make none; a kwarg is refused, naming chat_template_kwargs, exactly when
 * atlas_template_reserved says so.
 * Errors are fine; crashes, leaks, sanitizer reports and disagreements are not. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "atlas/shield.h"
#include "atlas/template.h"
#include "atlas/tokenizer.h"
#include "fuzz_fixture.h"
#include "server/api.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { RENDER_MAX = 4096 }; /* longer inputs exercise the shield alone: keep runs fast */

static atlas_tokenizer *tok;
static atlas_template *qwen; /* Qwen3's own template: tools and tool calls */
static atlas_template *echo; /* prints kwargs a and b, b's keys included */
static atlas_template *macro; /* the same through a macro and a set block */

static void setup(void) {
    if (tok) return; /* loaded once: they never change */
    char dir[1024];
    fuzz_fixture_dir(dir, sizeof dir, "tiny-qwen3", __FILE__);
    if (atlas_tokenizer_load(dir, &tok) != ATLAS_OK || atlas_template_load(dir, &qwen) != ATLAS_OK ||
        atlas_template_parse("{{ a }}|{% for k, v in b.items() %}{{ k }}={{ v }};{% endfor %}|"
                             "{{ b | tojson }}",
                             "echo", "<s>", "</s>", &echo) != ATLAS_OK ||
        atlas_template_parse("{% macro m(x) %}{{ x }}|{% endmacro %}{% set s %}<{{ a }}"
                             "{% endset %}{{ m(a) }}{{ s }}{% for k, v in b.items() %}"
                             "{{ m(k) }}{{ v }}{% endfor %}",
                             "macro", "<s>", "</s>", &macro) != ATLAS_OK)
        abort();
}

/* The control tokens of a request rendered as the server renders it; -1 when refused (with
 * *param set). */
static long controls(const atlas_template *t, const json_t *body, const char **param) {
    char *prompt = NULL;
    size_t *cuts = NULL, n_cuts = 0;
    *param = NULL;
    if (atlas_api_render_template(t, "fuzz", tok, body, true, &prompt, &cuts, &n_cuts, NULL,
                                  param) != ATLAS_OK)
        return -1;
    int32_t *ids = NULL;
    size_t n = 0;
    long k = 0;
    if (atlas_shield_encode_pieces(tok, prompt, strlen(prompt), cuts, n_cuts, false, &ids, &n) !=
        ATLAS_OK)
        abort();
    free(cuts);
    for (size_t i = 0; i < n; i++) k += atlas_tokenizer_is_special(tok, ids[i]);
    free(ids);
    free(prompt);
    return k;
}

/* A request whose tool's parameter and whose call's argument are named key (the call's
 * arguments in a JSON string with every '<' escaped when escaped), with key as a kwarg. */
static json_t *request(const char *key, bool escaped) {
    json_t *args = json_pack("{s:s}", key, key);
    if (escaped) {
        char *text = json_dumps(args, JSON_COMPACT), *o = text ? malloc(strlen(text) * 6 + 1) : NULL;
        size_t len = 0;
        for (const char *p = text; o && *p; p++) /* '<' is only ever inside a JSON string */
            len += *p == '<' ? (size_t)(memcpy(o + len, "\\u003c", 6), 6) : (o[len] = *p, 1);
        json_decref(args);
        args = o ? json_stringn(o, len) : NULL;
        free(text);
        free(o);
    }
    return json_pack("{s:[{s:s,s:s},{s:s,s:s,s:[{s:s,s:s,s:{s:s,s:o*}}]},{s:s,s:s,s:s}],"
                     "s:[{s:s,s:{s:s,s:{s:s,s:{s:{s:s}}}}}],s:{s:s}}",
                     "messages", "role", "user", "content", "Weather?", "role", "assistant",
                     "content", "", "tool_calls", "id", "call_1", "type", "function", "function",
                     "name", "f", "arguments", args, "role", "tool", "tool_call_id", "call_1",
                     "content", "22C", "tools", "type", "function", "function", "name", "f",
                     "parameters", "type", "object", "properties", key, "type", "string",
                     "chat_template_kwargs", key, key);
}

static void keys_and_kwargs(const char *s) {
    const char *param;
    static long plain = -1;
    if (plain < 0) {
        json_t *b = request("x", false);
        plain = controls(qwen, b, &param);
        json_decref(b);
        if (plain <= 0) abort();
    }
    for (int escaped = 0; escaped < 1 + (strchr(s, '<') != NULL); escaped++) {
        json_t *body = request(s, escaped);
        if (!body) return; /* out of memory */
        long k = controls(qwen, body, &param);
        bool refused = k < 0 && param && !strcmp(param, "chat_template_kwargs");
        if (atlas_template_reserved(s) != refused) abort();
        if (k >= 0 && k != plain) abort(); /* a name or a kwarg made a control token */
        json_decref(body);
    }
    /* kwargs the template prints, values and keys, make no control token */
    json_t *body = json_pack("{s:[{s:s,s:s}],s:{s:s,s:{s:s}}}", "messages", "role", "user",
                             "content", "hi", "chat_template_kwargs", "a", s, "b", s, s);
    if (body && (controls(echo, body, &param) != 0 || controls(macro, body, &param) != 0))
        abort();
    json_decref(body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setup();
    const char *s = (const char *)data;
    int32_t *ids = NULL;
    size_t n = 0;
    if (atlas_shield_encode(tok, s, size, false, &ids, &n) == ATLAS_OK) free(ids);
    json_t *v = json_stringn(s, size); /* NULL unless valid UTF-8 without NUL */
    if (!v) return 0;
    if (atlas_shield_json(tok, v) == ATLAS_OK) {
        char *back = NULL;
        size_t len = 0;
        if (atlas_shield_text(tok, json_string_value(v), json_string_length(v), &back, &len) ==
            ATLAS_OK) {
            if (len != size || (size && memcmp(back, s, size))) abort(); /* the round trip */
            free(back);
        }
        int32_t *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        atlas_text_range all = {0, size};
        if (atlas_shield_encode(tok, json_string_value(v), json_string_length(v), false, &a,
                                &na) == ATLAS_OK &&
            atlas_tokenizer_encode_ranges(tok, s, size, false, &all, 1, &b, &nb) == ATLAS_OK &&
            (na != nb || (na && memcmp(a, b, na * sizeof *a))))
            abort(); /* client text is text */
        free(a);
        free(b);
    }
    json_decref(v);
    /* as a key: shielded the same way, beside a key that needs nothing */
    json_t *o = json_object();
    bool same = size == 1 && *s == 'k'; /* then one key, whose value is the second's */
    if (o && !json_object_setn(o, s, size, json_true()) && !json_object_set_new(o, "k", json_null()) &&
        atlas_shield_json(tok, o) == ATLAS_OK) {
        const char *key;
        size_t key_len, i = 0;
        json_t *e;
        json_object_keylen_foreach(o, key, key_len, e) {
            char *back = NULL;
            size_t len = 0;
            if (i++ == 0 && atlas_shield_text(tok, key, key_len, &back, &len) == ATLAS_OK) {
                if (len != size || (size && memcmp(back, s, size)) || (!same && !json_is_true(e)))
                    abort();
                free(back);
            }
        }
        if (i != 2u - same) abort(); /* the keys stay distinct */
    }
    json_decref(o);
    if (size < RENDER_MAX) { /* the input has no NUL (json_stringn took it): terminate it */
        char *z = malloc(size + 1);
        if (z) {
            memcpy(z, s, size);
            z[size] = '\0';
            keys_and_kwargs(z);
            free(z);
        }
    }
    return 0;
}

/* server/schema.c — JSON schema subset -> constraint program (see schema.h).  A schema
 * becomes literals for its fixed text (braces, keys, separators) and value segments
 * between them; enums become choices. */
#include "server/schema.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static const char *const IGNORED[] = {"description", "title", "default", "examples", "$schema",
                                      "$comment", "required", "additionalProperties"};

static atlas_status add_text(atlas_constraint *c, const char *s) {
    return atlas_constraint_add_literal(c, s, strlen(s));
}

/* v as compact JSON text (malloc'd). */
static char *compact(const json_t *v) {
    return json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
}

static atlas_status check_keywords(const json_t *schema, const char *path) {
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)schema, key, v) {
        int known = !strcmp(key, "type") || !strcmp(key, "properties") || !strcmp(key, "enum") ||
                    !strcmp(key, "const") || !strcmp(key, "items") || !strcmp(key, "anyOf");
        for (size_t i = 0; !known && i < sizeof IGNORED / sizeof *IGNORED; i++)
            known = !strcmp(key, IGNORED[i]);
        if (!known)
            return atlas_fail(ATLAS_ERR_UNSUPPORTED, "'%s.%.100s' is not supported: atlas enforces "
                              "type, properties, items, enum, const and anyOf with null", path,
                              key);
    }
    (void)v;
    return ATLAS_OK;
}

static atlas_status value(const json_t *schema, atlas_constraint *c, const char *path, int depth);

static atlas_status enum_choice(const json_t *values, atlas_constraint *c, const char *path) {
    size_t n = json_array_size(values);
    if (!json_is_array(values) || n == 0 || n > ATLAS_CONSTRAINT_MAX_OPTIONS)
        return atlas_fail(ATLAS_ERR_INVALID, "'%s.enum' must be an array of 1 to %d values", path,
                          ATLAS_CONSTRAINT_MAX_OPTIONS);
    char **opts = calloc(n, sizeof *opts);
    atlas_status st = opts ? ATLAS_OK : atlas_fail(ATLAS_ERR_NOMEM, "%s.enum", path);
    for (size_t i = 0; st == ATLAS_OK && i < n; i++)
        if (!(opts[i] = compact(json_array_get(values, i))))
            st = atlas_fail(ATLAS_ERR_NOMEM, "%s.enum", path);
    if (st == ATLAS_OK) st = atlas_constraint_add_choice(c, (const char *const *)opts, (int)n);
    for (size_t i = 0; opts && i < n; i++) free(opts[i]);
    free(opts);
    return st;
}

/* {"k1": v1, "k2": v2}: every property, in order. */
static atlas_status object(const json_t *props, atlas_constraint *c, const char *path, int depth) {
    if (!json_is_object(props))
        return atlas_fail(ATLAS_ERR_INVALID, "'%s.properties' must be an object", path);
    if (json_object_size(props) == 0) return add_text(c, "{}");
    const char *key;
    const json_t *sub;
    int first = 1;
    json_object_foreach((json_t *)props, key, sub) {
        json_t *k = json_string(key);
        char *qk = k ? compact(k) : NULL;
        json_decref(k);
        if (!qk) return atlas_fail(ATLAS_ERR_NOMEM, "%s.properties", path);
        atlas_status st = add_text(c, first ? "{" : ", ");
        if (st == ATLAS_OK) st = add_text(c, qk);
        if (st == ATLAS_OK) st = add_text(c, ": ");
        free(qk);
        char sub_path[1024];
        snprintf(sub_path, sizeof sub_path, "%s.properties.%.100s", path, key);
        if (st == ATLAS_OK) st = value(sub, c, sub_path, depth + 1);
        if (st != ATLAS_OK) return st;
        first = 0;
    }
    return add_text(c, "}");
}

/* The value kind of a primitive type name, -1 for others. */
static int primitive(const char *type) {
    if (!strcmp(type, "string")) return ATLAS_CONSTRAINT_JSON_STRING;
    if (!strcmp(type, "number")) return ATLAS_CONSTRAINT_JSON_NUMBER;
    if (!strcmp(type, "integer")) return ATLAS_CONSTRAINT_JSON_INTEGER;
    if (!strcmp(type, "boolean")) return ATLAS_CONSTRAINT_JSON_BOOLEAN;
    return -1;
}

/* An array: any array, or one whose items are all of a primitive type. */
static int array_kind(const json_t *items, const char *path) {
    if (!items || json_is_true(items) || (json_is_object(items) && json_object_size(items) == 0))
        return ATLAS_CONSTRAINT_JSON_ARRAY;
    const char *t = json_string_value(json_object_get(items, "type"));
    int k = t ? primitive(t) : -1;
    if (k < 0 || check_keywords(items, path) != ATLAS_OK || json_object_get(items, "enum") ||
        json_object_get(items, "const") || json_object_get(items, "anyOf") ||
        json_object_get(items, "items") || json_object_get(items, "properties"))
        return -1;
    return ATLAS_CONSTRAINT_JSON_ARRAY_OF_STRING + (k - ATLAS_CONSTRAINT_JSON_STRING);
}

/* A typed value; nullable: null is allowed instead (type [T, "null"] or anyOf with null). */
static atlas_status typed(const char *type, int nullable, const json_t *schema,
                         atlas_constraint *c, const char *path, int depth) {
    const json_t *items = json_object_get(schema, "items");
    if (items && strcmp(type, "array") != 0)
        return atlas_fail(ATLAS_ERR_INVALID, "'%s.items' belongs to arrays", path);
    int null_flag = nullable ? ATLAS_CONSTRAINT_JSON_NULLABLE : 0;
    if (!strcmp(type, "object")) {
        const json_t *props = json_object_get(schema, "properties");
        if (props && nullable)
            return atlas_fail(ATLAS_ERR_UNSUPPORTED, "'%s': an object with properties or null "
                              "is not supported", path);
        return props ? object(props, c, path, depth)
                     : atlas_constraint_add_json_value(c, ATLAS_CONSTRAINT_JSON_OBJECT | null_flag);
    }
    if (!strcmp(type, "array")) {
        int k = array_kind(items, path);
        if (k < 0)
            return atlas_fail(ATLAS_ERR_UNSUPPORTED, "'%s.items' is not supported: atlas enforces "
                              "arrays of strings, numbers, integers or booleans, or any array",
                              path);
        return atlas_constraint_add_json_value(c, k | null_flag);
    }
    int k = primitive(type);
    if (k >= 0) return atlas_constraint_add_json_value(c, k | null_flag);
    if (!strcmp(type, "null")) return add_text(c, "null");
    return atlas_fail(ATLAS_ERR_UNSUPPORTED, "'%s.type' '%.40s' is not supported", path, type);
}

/* "type": [T, "null"] or anyOf [{...T}, {"type": "null"}]: T's schema and the flag; NULL when
 * the schema is not of that shape. */
static const json_t *or_null(const json_t *schema, const char **type) {
    const json_t *t = json_object_get(schema, "type");
    if (json_is_array(t) && json_array_size(t) == 2) {
        const char *a = json_string_value(json_array_get(t, 0));
        const char *b = json_string_value(json_array_get(t, 1));
        if (a && b && !strcmp(b, "null") && strcmp(a, "null")) *type = a;
        else if (a && b && !strcmp(a, "null") && strcmp(b, "null")) *type = b;
        else return NULL;
        return schema;
    }
    const json_t *any = json_object_get(schema, "anyOf");
    if (!json_is_array(any) || json_array_size(any) != 2) return NULL;
    for (int i = 0; i < 2; i++) {
        const json_t *n = json_array_get(any, (size_t)i), *o = json_array_get(any, (size_t)!i);
        const char *nt = json_string_value(json_object_get(n, "type"));
        const char *ot = json_string_value(json_object_get(o, "type"));
        if (nt && !strcmp(nt, "null") && json_object_size(n) == 1 && ot && strcmp(ot, "null")) {
            *type = ot;
            return o;
        }
    }
    return NULL;
}

static atlas_status value(const json_t *schema, atlas_constraint *c, const char *path, int depth) {
    if (depth > ATLAS_SCHEMA_MAX_DEPTH)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "'%s': schemas nested deeper than %d are not "
                          "supported", path, ATLAS_SCHEMA_MAX_DEPTH);
    if (json_is_true(schema)) return atlas_constraint_add_json_value(c, ATLAS_CONSTRAINT_JSON_ANY);
    if (!json_is_object(schema))
        return atlas_fail(ATLAS_ERR_INVALID, "'%s' must be a schema object", path);
    ATLAS_TRY(check_keywords(schema, path));
    const json_t *cv = json_object_get(schema, "const");
    if (cv) {
        char *text = compact(cv);
        if (!text) return atlas_fail(ATLAS_ERR_NOMEM, "%s.const", path);
        atlas_status st = add_text(c, text);
        free(text);
        return st;
    }
    const json_t *ev = json_object_get(schema, "enum");
    if (ev) return enum_choice(ev, c, path);
    const char *nt = NULL;
    const json_t *ns = or_null(schema, &nt);
    if (ns) {
        if (ns != schema) ATLAS_TRY(check_keywords(ns, path));
        if (ns != schema && (json_object_get(ns, "enum") || json_object_get(ns, "const") ||
                             json_object_get(ns, "anyOf")))
            return atlas_fail(ATLAS_ERR_UNSUPPORTED, "'%s.anyOf': only a type or null is "
                              "supported", path);
        return typed(nt, 1, ns, c, path, depth);
    }
    if (json_object_get(schema, "anyOf"))
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "'%s.anyOf' is not supported beyond "
                          "[{\"type\": T}, {\"type\": \"null\"}]", path);
    const json_t *type = json_object_get(schema, "type");
    if (type && !json_is_string(type))
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "'%s.type' must be one type name or [T, "
                          "\"null\"]", path);
    if (type) return typed(json_string_value(type), 0, schema, c, path, depth);
    if (json_object_get(schema, "properties")) return typed("object", 0, schema, c, path, depth);
    if (json_object_get(schema, "items")) return typed("array", 0, schema, c, path, depth);
    return atlas_constraint_add_json_value(c, ATLAS_CONSTRAINT_JSON_ANY);
}

atlas_status atlas_schema_append(const json_t *schema, const char *where, atlas_constraint *c) {
    const char *type = json_string_value(json_object_get(schema, "type"));
    if (!json_is_object(schema) ||
        !(type ? !strcmp(type, "object") : json_object_get(schema, "properties") != NULL))
        return atlas_fail(ATLAS_ERR_INVALID, "'%s' must be an object schema ({\"type\": "
                          "\"object\", ...})", where);
    return value(schema, c, where, 0);
}

atlas_status atlas_schema_program(const json_t *schema, const char *where,
                                  atlas_constraint **out) {
    *out = NULL;
    atlas_constraint *c = NULL;
    ATLAS_TRY(atlas_constraint_new(&c));
    atlas_status st = atlas_schema_append(schema, where, c);
    if (st != ATLAS_OK) {
        atlas_constraint_free(c);
        return st;
    }
    *out = c;
    return ATLAS_OK;
}

/* tests/test-schema.c — JSON schemas (the subset of src/server/schema.h) as constraint
 * programs: instances of the schema are accepted and parse, others are refused; keywords
 * atlas cannot enforce are refused with their path. */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "atlas/constraint.h"
#include "harness.h"
#include "server/schema.h"

static atlas_constraint *compile(const char *schema_json, atlas_status *st) {
    json_t *s = json_loads(schema_json, 0, NULL);
    CHECK_MSG(s != NULL, "bad test schema %s", schema_json);
    atlas_constraint *c = NULL;
    *st = atlas_schema_program(s, "schema", &c);
    json_decref(s);
    return c;
}

static int matches(const atlas_constraint *c, const char *text) {
    atlas_constraint_matcher *m = NULL;
    if (atlas_constraint_matcher_new(c, NULL, &m) != ATLAS_OK) return 0;
    int ok = atlas_constraint_matcher_accept_bytes(m, text, strlen(text)) == ATLAS_OK &&
             atlas_constraint_matcher_done(m);
    atlas_constraint_matcher_free(m);
    return ok;
}

static void test_instances(void) {
    const char *schema =
        "{\"type\": \"object\", \"description\": \"a forecast\", \"properties\": {"
        " \"city\": {\"type\": \"string\", \"description\": \"where\"},"
        " \"days\": {\"type\": \"integer\"},"
        " \"temp\": {\"type\": \"number\"},"
        " \"sunny\": {\"type\": \"boolean\"},"
        " \"unit\": {\"enum\": [\"C\", \"F\", 1, 12, null]},"
        " \"v\": {\"const\": {\"x\": [1, \"\\u00e9\"]}},"
        " \"tags\": {\"type\": \"array\"},"
        " \"extra\": {\"type\": \"object\"},"
        " \"any\": {},"
        " \"nothing\": {\"type\": \"null\"},"
        " \"inner\": {\"properties\": {\"a\": {\"type\": \"integer\"}, \"b\\\"q\": true}}"
        "}, \"required\": [\"city\"], \"additionalProperties\": false}";
    atlas_status st;
    atlas_constraint *c = compile(schema, &st);
    CHECK_OK(st);
    if (!c) return;
    const char *good[] = {
        "{\"city\": \"Paris\", \"days\": 3, \"temp\": -1.5e1, \"sunny\": true, \"unit\": \"C\", "
        "\"v\": {\"x\":[1,\"\xc3\xa9\"]}, \"tags\": [1, \"a\"], \"extra\": {\"k\": {}}, "
        "\"any\": 7, \"nothing\": null, \"inner\": {\"a\": 0, \"b\\\"q\": [null]}}",
        "{\"city\": \"\", \"days\": -0, \"temp\": 2, \"sunny\": false, \"unit\": 12, "
        "\"v\": {\"x\":[1,\"\xc3\xa9\"]}, \"tags\": [], \"extra\": {}, "
        "\"any\": \"s\", \"nothing\": null, \"inner\": {\"a\": 5, \"b\\\"q\": {}}}",
        "{\"city\": \"x\", \"days\": 1, \"temp\": 0.5, \"sunny\": true, \"unit\": 1, "
        "\"v\": {\"x\":[1,\"\xc3\xa9\"]}, \"tags\": [[]], \"extra\": {}, "
        "\"any\": {\"a\": 1}, \"nothing\": null, \"inner\": {\"a\": 5, \"b\\\"q\": 1}}",
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        CHECK_MSG(matches(c, good[i]), "good[%zu]", i);
        json_t *j = json_loads(good[i], 0, NULL);
        CHECK(json_is_object(j) && json_object_size(j) == 11);
        json_decref(j);
    }
    /* each a small change of good[0] (the first: a second space after a key's colon) */
    const char *bad[] = {
        "{\"city\":  \"Paris\", \"days\": 3, \"temp\": -1.5e1, \"sunny\": true, \"unit\": \"C\", "
        "\"v\": {\"x\":[1,\"\xc3\xa9\"]}, \"tags\": [1, \"a\"], \"extra\": {\"k\": {}}, "
        "\"any\": 7, \"nothing\": null, \"inner\": {\"a\": 0, \"b\\\"q\": [null]}}",
        "{\"city\": 1, \"days\": 3, \"temp\": -1.5e1, \"sunny\": true, \"unit\": \"C\", "
        "\"v\": {\"x\":[1,\"\xc3\xa9\"]}, \"tags\": [1, \"a\"], \"extra\": {\"k\": {}}, "
        "\"any\": 7, \"nothing\": null, \"inner\": {\"a\": 0, \"b\\\"q\": [null]}}",
        "{\"city\": \"Paris\", \"days\": 3.5, \"temp\": -1.5e1, \"sunny\": true, \"unit\": \"C\", "
        "\"v\": {\"x\":[1,\"\xc3\xa9\"]}, \"tags\": [1, \"a\"], \"extra\": {\"k\": {}}, "
        "\"any\": 7, \"nothing\": null, \"inner\": {\"a\": 0, \"b\\\"q\": [null]}}",
        "{\"city\": \"Paris\", \"days\": 3, \"temp\": -1.5e1, \"sunny\": 1, \"unit\": \"C\", "
        "\"v\": {\"x\":[1,\"\xc3\xa9\"]}, \"tags\": [1, \"a\"], \"extra\": {\"k\": {}}, "
        "\"any\": 7, \"nothing\": null, \"inner\": {\"a\": 0, \"b\\\"q\": [null]}}",
        "{\"city\": \"Paris\", \"days\": 3, \"temp\": -1.5e1, \"sunny\": true, \"unit\": \"K\", "
        "\"v\": {\"x\":[1,\"\xc3\xa9\"]}, \"tags\": [1, \"a\"], \"extra\": {\"k\": {}}, "
        "\"any\": 7, \"nothing\": null, \"inner\": {\"a\": 0, \"b\\\"q\": [null]}}",
        "{\"city\": \"Paris\", \"days\": 3, \"temp\": -1.5e1, \"sunny\": true, \"unit\": 123, "
        "\"v\": {\"x\":[1,\"\xc3\xa9\"]}, \"tags\": [1, \"a\"], \"extra\": {\"k\": {}}, "
        "\"any\": 7, \"nothing\": null, \"inner\": {\"a\": 0, \"b\\\"q\": [null]}}",
        "{\"city\": \"Paris\", \"days\": 3, \"temp\": -1.5e1, \"sunny\": true, \"unit\": \"C\", "
        "\"v\": {\"x\":[2,\"\xc3\xa9\"]}, \"tags\": [1, \"a\"], \"extra\": {\"k\": {}}, "
        "\"any\": 7, \"nothing\": null, \"inner\": {\"a\": 0, \"b\\\"q\": [null]}}",
        "{\"city\": \"Paris\", \"days\": 3, \"temp\": -1.5e1, \"sunny\": true, \"unit\": \"C\", "
        "\"v\": {\"x\":[1,\"\xc3\xa9\"]}, \"tags\": {}, \"extra\": {\"k\": {}}, "
        "\"any\": 7, \"nothing\": null, \"inner\": {\"a\": 0, \"b\\\"q\": [null]}}",
        "{\"city\": \"Paris\", \"days\": 3, \"temp\": -1.5e1, \"sunny\": true, \"unit\": \"C\", "
        "\"v\": {\"x\":[1,\"\xc3\xa9\"]}, \"tags\": [1, \"a\"], \"extra\": {\"k\": {}}, "
        "\"any\": 7, \"nothing\": 0, \"inner\": {\"a\": 0, \"b\\\"q\": [null]}}",
        "{\"days\": 3, \"city\": \"Paris\", \"temp\": -1.5e1, \"sunny\": true, \"unit\": \"C\", "
        "\"v\": {\"x\":[1,\"\xc3\xa9\"]}, \"tags\": [1, \"a\"], \"extra\": {\"k\": {}}, "
        "\"any\": 7, \"nothing\": null, \"inner\": {\"a\": 0, \"b\\\"q\": [null]}}",
        "{\"city\": \"Paris\"}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK_MSG(!matches(c, bad[i]), "bad[%zu]", i);
    atlas_constraint_free(c);

    /* arrays of a primitive type; null allowed by a type list or anyOf */
    c = compile("{\"properties\": {\"tags\": {\"type\": \"array\", \"items\": {\"type\": "
                "\"string\", \"description\": \"a tag\"}}, \"n\": {\"items\": {\"type\": "
                "\"integer\"}}, \"s\": {\"type\": [\"string\", \"null\"]}, \"b\": {\"anyOf\": "
                "[{\"type\": \"null\"}, {\"type\": \"boolean\"}]}, \"f\": {\"type\": [\"null\", "
                "\"array\"], \"items\": {\"type\": \"number\"}}}}", &st);
    CHECK_OK(st);
    CHECK(c && matches(c, "{\"tags\": [\"a\", \"b\"], \"n\": [1, -2], \"s\": null, \"b\": true, "
                          "\"f\": [1.5]}"));
    CHECK(c && matches(c, "{\"tags\": [], \"n\": [], \"s\": \"x\", \"b\": null, \"f\": null}"));
    CHECK(c && !matches(c, "{\"tags\": [1], \"n\": [], \"s\": \"x\", \"b\": null, \"f\": null}"));
    CHECK(c && !matches(c, "{\"tags\": [], \"n\": [1.5], \"s\": \"x\", \"b\": null, \"f\": null}"));
    CHECK(c && !matches(c, "{\"tags\": [], \"n\": [], \"s\": 1, \"b\": null, \"f\": null}"));
    CHECK(c && !matches(c, "{\"tags\": [], \"n\": [], \"s\": \"x\", \"b\": 0, \"f\": null}"));
    CHECK(c && !matches(c, "{\"tags\": [], \"n\": [], \"s\": \"x\", \"b\": null, \"f\": [\"1\"]}"));
    CHECK(c && !matches(c, "{\"tags\": null, \"n\": [], \"s\": \"x\", \"b\": null, \"f\": null}"));
    atlas_constraint_free(c);

    c = compile("{\"type\": \"object\", \"properties\": {}}", &st);
    CHECK_OK(st);
    CHECK(c && matches(c, "{}") && !matches(c, "{\"a\": 1}"));
    atlas_constraint_free(c);
    c = compile("{\"type\": \"object\"}", &st);
    CHECK_OK(st);
    CHECK(c && matches(c, "{\"a\": [1]}") && !matches(c, "[]"));
    atlas_constraint_free(c);
}

static void test_refused(void) {
    const struct {
        const char *schema;
        atlas_status st;
        const char *path;
    } cases[] = {
        {"{\"type\": \"string\"}", ATLAS_ERR_INVALID, "'schema' must be an object schema"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"pattern\": \"x\"}}}",
         ATLAS_ERR_UNSUPPORTED, "'schema.properties.a.pattern'"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"array\", \"items\": {\"type\": \"object\"}}}}",
         ATLAS_ERR_UNSUPPORTED, "'schema.properties.a.items'"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"array\", \"items\": {\"type\": \"string\", \"minLength\": 1}}}}",
         ATLAS_ERR_UNSUPPORTED, "'schema.properties.a.items'"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": [\"string\", \"number\"]}}}",
         ATLAS_ERR_UNSUPPORTED, "'schema.properties.a.type'"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"anyOf\": [{\"type\": \"string\"}, {\"type\": \"number\"}]}}}",
         ATLAS_ERR_UNSUPPORTED, "'schema.properties.a.anyOf'"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": [\"object\", \"null\"], \"properties\": {}}}}",
         ATLAS_ERR_UNSUPPORTED, "'schema.properties.a': an object with properties or null"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"anyOf\": []}}}", ATLAS_ERR_UNSUPPORTED,
         "'schema.properties.a.anyOf'"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"$ref\": \"#/x\"}}}", ATLAS_ERR_UNSUPPORTED,
         "'schema.properties.a.$ref'"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"date\"}}}", ATLAS_ERR_UNSUPPORTED,
         "'schema.properties.a.type' 'date'"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"enum\": []}}}", ATLAS_ERR_INVALID,
         "'schema.properties.a.enum'"},
        {"{\"type\": \"object\", \"properties\": {\"a\": 5}}", ATLAS_ERR_INVALID,
         "'schema.properties.a' must be"},
        {"{\"type\": \"object\", \"properties\": []}", ATLAS_ERR_INVALID, "'schema.properties'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        atlas_status st;
        atlas_constraint *c = compile(cases[i].schema, &st);
        CHECK_MSG(st == cases[i].st && !c, "case %zu: %s", i, atlas_status_str(st));
        CHECK_MSG(strstr(atlas_last_error(), cases[i].path), "case %zu: %s", i,
                  atlas_last_error());
        atlas_constraint_free(c);
    }
    /* nesting beyond the limit */
    char deep[4096] = "";
    size_t n = 0;
    for (int i = 0; i <= ATLAS_SCHEMA_MAX_DEPTH + 1; i++)
        n += (size_t)snprintf(deep + n, sizeof deep - n, "{\"properties\": {\"a\": ");
    n += (size_t)snprintf(deep + n, sizeof deep - n, "{}");
    for (int i = 0; i <= ATLAS_SCHEMA_MAX_DEPTH + 1; i++)
        n += (size_t)snprintf(deep + n, sizeof deep - n, "}}");
    atlas_status st;
    atlas_constraint *c = compile(deep, &st);
    CHECK(st == ATLAS_ERR_UNSUPPORTED && !c && strstr(atlas_last_error(), "deeper"));
}

int main(void) {
    test_instances();
    test_refused();
    return harness_finish();
}

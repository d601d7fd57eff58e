/* tests/test-constraint.c — constraint programs and the matcher: exact byte sequences
 * accepted and refused (literals, choices, JSON: escapes, UTF-8, numbers, depth and
 * whitespace limits, completion), token masks checked token by token against the byte
 * matcher, random walks over tiny-qwen3's vocabulary that must end in an object jansson
 * parses, and the time one mask of the 151k vocabulary takes. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "atlas/constraint.h"
#include "atlas/tokenizer.h"
#include "atlas/toolcall.h"
#include "harness.h"

static atlas_constraint *json_program(void) {
    atlas_constraint *c = NULL;
    CHECK_OK(atlas_constraint_new(&c));
    CHECK_OK(atlas_constraint_add_json_object(c));
    return c;
}

/* 1 when the whole text is accepted and completes the program; 0 when refused or left
 * incomplete. */
static int matches(const atlas_constraint *c, const char *text, size_t len) {
    atlas_constraint_matcher *m = NULL;
    if (atlas_constraint_matcher_new(c, NULL, &m) != ATLAS_OK) return 0;
    int ok = atlas_constraint_matcher_accept_bytes(m, text, len) == ATLAS_OK &&
             atlas_constraint_matcher_done(m);
    atlas_constraint_matcher_free(m);
    return ok;
}

/* 1 when the text is accepted as a prefix (complete or not). */
static int prefix_ok(const atlas_constraint *c, const char *text) {
    atlas_constraint_matcher *m = NULL;
    if (atlas_constraint_matcher_new(c, NULL, &m) != ATLAS_OK) return 0;
    int ok = atlas_constraint_matcher_accept_bytes(m, text, strlen(text)) == ATLAS_OK;
    atlas_constraint_matcher_free(m);
    return ok;
}

#define MATCH(c, s) matches((c), (s), strlen(s))

static void test_literal_choice(void) {
    atlas_constraint *c = NULL;
    CHECK_OK(atlas_constraint_new(&c));
    CHECK(MATCH(c, "")); /* an empty program is complete at once */
    CHECK(!MATCH(c, "x"));
    CHECK_OK(atlas_constraint_add_literal(c, "<a>", 3));
    const char *names[] = {"get_weather", "get", "set", "get"};
    CHECK_OK(atlas_constraint_add_choice(c, names, 4));
    CHECK_OK(atlas_constraint_add_literal(c, "\"", 1));
    CHECK_OK(atlas_constraint_add_literal(c, "", 0)); /* adds nothing */
    CHECK(atlas_constraint_n_segments(c) == 3);
    CHECK(MATCH(c, "<a>get\""));
    CHECK(MATCH(c, "<a>get_weather\""));
    CHECK(MATCH(c, "<a>set\""));
    CHECK(!MATCH(c, "<a>get_weather"));  /* incomplete */
    CHECK(!MATCH(c, "<a>ge\""));
    CHECK(!MATCH(c, "<a>gets\""));
    CHECK(!MATCH(c, "<a>get_weatherx\""));
    CHECK(!MATCH(c, "<b>get\""));
    CHECK(!MATCH(c, "<a>get\"\""));
    CHECK(prefix_ok(c, "<a>get_w"));
    CHECK(!prefix_ok(c, "<a>x"));

    /* a choice with prefix options must be told apart by the next literal */
    atlas_constraint *d = NULL;
    CHECK_OK(atlas_constraint_new(&d));
    const char *ab[] = {"a", "ab"};
    CHECK_OK(atlas_constraint_add_choice(d, ab, 2));
    atlas_constraint_matcher *m = NULL;
    CHECK(atlas_constraint_matcher_new(d, NULL, &m) == ATLAS_ERR_INVALID); /* at the end */
    CHECK(m == NULL);
    CHECK(atlas_constraint_add_literal(d, "b", 1) == ATLAS_ERR_INVALID);
    CHECK(atlas_constraint_add_json_object(d) == ATLAS_ERR_INVALID);
    CHECK(atlas_constraint_n_segments(d) == 1); /* failed appends change nothing */
    CHECK_OK(atlas_constraint_add_literal(d, "c", 1));
    CHECK(MATCH(d, "ac") && MATCH(d, "abc") && !MATCH(d, "abbc") && !MATCH(d, "a"));
    atlas_constraint_free(d);

    /* a single empty option is skipped; bad arguments are refused */
    CHECK_OK(atlas_constraint_new(&d));
    const char *empty[] = {""};
    CHECK_OK(atlas_constraint_add_choice(d, empty, 1));
    CHECK(MATCH(d, ""));
    CHECK(atlas_constraint_add_choice(d, empty, 0) == ATLAS_ERR_RANGE);
    const char *null_opt[] = {NULL};
    CHECK(atlas_constraint_add_choice(d, null_opt, 1) == ATLAS_ERR_RANGE);
    atlas_constraint_free(d);

    /* copies match the same */
    CHECK_OK(atlas_constraint_copy(c, &d));
    CHECK(MATCH(d, "<a>get_weather\"") && !MATCH(d, "<a>got\""));
    atlas_constraint_free(d);
    atlas_constraint_free(c);
}

static void test_json_accept(void) {
    atlas_constraint *c = json_program();
    const char *good[] = {
        "{}",
        "\n{ }",
        "{\n  \"a\": [\n\t\t1,\n    2\n  ]\n}",
        "{\"a\":1}",
        "{\"\":\"\"}",
        "{\"a\": [1, -0.5e+10, 0, -0, 10.25E-3, true, false, null, \"x\"], \"b\": {\"c\": {}}}",
        "{\"s\": \"\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9 \\uD83D\\uDE00 \\uffff\"}",
        "{\"u\": \"\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xed\x9f\xbf \xf4\x8f\xbf\xbf\"}",
        "{\"a\":[[],[[]],{}]}",
        "{\"n\": 123456789012345678}",
        "{\"n\": 1.5e99}",
        "{\"n\": 1e-7}",
        "{\"k\":\"                                                    \"}",
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        CHECK_MSG(MATCH(c, good[i]), "good[%zu] %s", i, good[i]);
        json_error_t err;
        json_t *j = json_loads(good[i], 0, &err); /* the cases themselves are valid */
        CHECK_MSG(json_is_object(j), "jansson on good[%zu]: %s", i, err.text);
        json_decref(j);
    }
    const char *bad[] = {
        "[]", "\"x\"", "1", "{", "{\"a\"}", "{\"a\" 1}", "{\"a\":}", "{\"a\":1,}", "{,}",
        "{\"a\":01}", "{\"a\":1.}", "{\"a\":.5}", "{\"a\":-}", "{\"a\":+1}", "{\"a\":1e}",
        "{\"a\":1e+}", "{\"a\":tru}", "{\"a\":True}", "{\"a\":nul}", "{\"a\":[1 2]}",
        "{\"a\":[1,]}", "{\"a\":]}", "{\"a\":[}", "{\"a\":{]}", "{a:1}", "{'a':1}",
        "{\"a\":\"\x01\"}", "{\"a\":\"\n\"}", "{\"a\":\"\\x\"}", "{\"a\":\"\\u12\"}",
        "{\"a\":\"\\u12g4\"}", "{\"a\":\"\\ud800\"}", "{\"a\":\"\\ud800\\u0041\"}",
        "{\"a\":\"\\udc00\"}", "{\"a\":\"\\u0000\"}", "{\"a\":\"\xc0\x80\"}",
        "{\"a\":\"\xc3\"}", "{\"a\":\"\xed\xa0\x80\"}", "{\"a\":\"\xf4\x90\x80\x80\"}",
        "{\"a\":\"\xe0\x80\x80\"}", "{\"a\":\"\xf0\x80\x80\x80\"}", "{\"a\":\"\xff\"}",
        "{\"a\":\"\x80\"}", "{\"n\": 1234567890123456789}", "{\"n\": 1e100}", "{} ", "{}x",
        "{}{}", "",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK_MSG(!MATCH(c, bad[i]), "bad[%zu] %s", i, bad[i]);
    CHECK(prefix_ok(c, "{\"a\": [1, {\"b\": \"\\ud8"));
    CHECK(!prefix_ok(c, "{\"a\": [1, {\"b\": \"\\udc"));

    /* nesting: the top object is depth 1; 32 are allowed, 33 are not */
    char deep[256];
    size_t n = 0;
    n += (size_t)sprintf(deep + n, "{\"a\":");
    for (int i = 0; i < ATLAS_CONSTRAINT_MAX_DEPTH - 1; i++) deep[n++] = '[';
    for (int i = 0; i < ATLAS_CONSTRAINT_MAX_DEPTH - 1; i++) deep[n++] = ']';
    deep[n++] = '}';
    CHECK(matches(c, deep, n));
    n = 0;
    n += (size_t)sprintf(deep + n, "{\"a\":");
    for (int i = 0; i < ATLAS_CONSTRAINT_MAX_DEPTH; i++) deep[n++] = '[';
    deep[n] = 0;
    CHECK(!prefix_ok(c, deep));
    deep[n - 1] = 0;
    CHECK(prefix_ok(c, deep));

    /* whitespace outside strings: none, one space, or a newline and an indent of at most 20
     * spaces or tabs; no runs of spaces, no blank lines */
    char ws[64];
    snprintf(ws, sizeof ws, "{\"a\":\n%*s1}", ATLAS_CONSTRAINT_MAX_INDENT, "");
    CHECK(MATCH(c, ws));
    snprintf(ws, sizeof ws, "{\"a\":\n%*s1}", ATLAS_CONSTRAINT_MAX_INDENT + 1, "");
    CHECK(!MATCH(c, ws));
    snprintf(ws, sizeof ws, "{\n%*s\"a\":\n%*s1}", ATLAS_CONSTRAINT_MAX_INDENT, "",
             ATLAS_CONSTRAINT_MAX_INDENT, ""); /* the count restarts after other bytes */
    CHECK(MATCH(c, ws));
    const char *runs[] = {"{\"a\":  1}", "{\"a\": \n1}", "{\"a\":\n\n1}", "{\"a\":\t1}",
                          "{\"a\":\r\n1}", "{\"a\": 1 ,  \"b\": 2}", "{  }", "  {}"};
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++)
        CHECK_MSG(!MATCH(c, runs[i]), "runs[%zu] %s", i, runs[i]);
    /* a value after a literal that ends in a space (a schema's '"a": ') takes no more */
    atlas_constraint *lc = NULL;
    CHECK_OK(atlas_constraint_new(&lc));
    CHECK_OK(atlas_constraint_add_literal(lc, "{\"a\": ", 6));
    CHECK_OK(atlas_constraint_add_json_value(lc, ATLAS_CONSTRAINT_JSON_STRING));
    CHECK_OK(atlas_constraint_add_literal(lc, ", \"b\":", 6));
    CHECK_OK(atlas_constraint_add_json_value(lc, ATLAS_CONSTRAINT_JSON_STRING));
    CHECK_OK(atlas_constraint_add_literal(lc, "}", 1));
    CHECK(MATCH(lc, "{\"a\": \"x\", \"b\": \"y\"}") && MATCH(lc, "{\"a\": \"x\", \"b\":\"y\"}"));
    CHECK(!MATCH(lc, "{\"a\":  \"x\", \"b\": \"y\"}") && !MATCH(lc, "{\"a\": \n\"x\", \"b\":\"y\"}"));
    CHECK(MATCH(lc, "{\"a\": \"x\", \"b\":\n  \"y\"}"));
    atlas_constraint_free(lc);
    atlas_constraint_free(c);

    /* JSON inside a tool-call program */
    CHECK_OK(atlas_constraint_new(&c));
    const char *head = "<tool_call>\n{\"name\": \"";
    CHECK_OK(atlas_constraint_add_literal(c, head, strlen(head)));
    const char *names[] = {"f"};
    CHECK_OK(atlas_constraint_add_choice(c, names, 1));
    CHECK_OK(atlas_constraint_add_literal(c, "\", \"arguments\": ", 16));
    CHECK_OK(atlas_constraint_add_json_object(c));
    CHECK_OK(atlas_constraint_add_literal(c, "}\n</tool_call>", 14));
    CHECK(MATCH(c, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": [1]}}\n</tool_call>"));
    CHECK(!MATCH(c, "<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>"));
    CHECK(!MATCH(c, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}} \n</tool_call>"));
    atlas_constraint_free(c);
}

/* Values of a kind: strings, numbers, integers, arrays, any value; what may follow a value
 * that may be a number; literals merged. */
static void test_json_values(void) {
    atlas_constraint *c = NULL;
    CHECK_OK(atlas_constraint_new(&c));
    const atlas_constraint_json_kind kinds[] = {
        ATLAS_CONSTRAINT_JSON_STRING, ATLAS_CONSTRAINT_JSON_NUMBER, ATLAS_CONSTRAINT_JSON_INTEGER,
        ATLAS_CONSTRAINT_JSON_ANY, ATLAS_CONSTRAINT_JSON_ARRAY, ATLAS_CONSTRAINT_JSON_OBJECT};
    for (int i = 0; i < 6; i++) {
        CHECK_OK(atlas_constraint_add_literal(c, i ? "," : "[", 1));
        CHECK_OK(atlas_constraint_add_json_value(c, kinds[i]));
    }
    CHECK_OK(atlas_constraint_add_literal(c, "]", 1));
    CHECK(atlas_constraint_add_json_value(c, 99) == ATLAS_ERR_RANGE);
    CHECK(atlas_constraint_add_json_value(c, -1) == ATLAS_ERR_RANGE);
    const char *good[] = {
        "[\"a\\u00e9\",-1.5e3,42,{\"x\":[1]},[1,\"b\",null],{}]",
        "[\"\",0,0,12.5,[],{}]",
        "[ \"x\", 7,-0, \"any\",[[]], {\"k\": true}]",
        "[\"x\",1,2,null,[{}],{}]",
        "[\"x\",1,2,-3e+2,[],{}]",
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        CHECK_MSG(MATCH(c, good[i]), "good[%zu] %s", i, good[i]);
        json_t *j = json_loads(good[i], 0, NULL);
        CHECK_MSG(json_is_array(j) && json_array_size(j) == 6, "jansson on %s", good[i]);
        json_decref(j);
    }
    const char *bad[] = {
        "[1,1,1,1,[],{}]",              /* a number for a string */
        "[\"x\",\"1\",1,1,[],{}]",      /* a string for a number */
        "[\"x\",1,4.5,1,[],{}]",          /* a fraction for an integer */
        "[\"x\",1,4e1,1,[],{}]",          /* an exponent for an integer */
        "[\"x\",1,1,1,{},{}]",            /* an object for an array */
        "[\"x\",1,1,1,[],[]]",            /* an array for an object */
        "[\"x\",1 ,1,1,[],{}]",           /* a number ends at the next literal */
        "[\"x\",01,1,1,[],{}]", "[\"x\",1,1,tru,[],{}]", "[\"x\",-,1,1,[],{}]",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK_MSG(!MATCH(c, bad[i]), "bad[%zu] %s", i, bad[i]);
    atlas_constraint_free(c);

    /* a value that may be a number needs a literal after it that cannot continue it */
    atlas_constraint_matcher *m = NULL;
    const atlas_constraint_json_kind numeric[] = {
        ATLAS_CONSTRAINT_JSON_NUMBER, ATLAS_CONSTRAINT_JSON_INTEGER, ATLAS_CONSTRAINT_JSON_ANY};
    for (int i = 0; i < 3; i++) {
        CHECK_OK(atlas_constraint_new(&c));
        CHECK_OK(atlas_constraint_add_json_value(c, numeric[i]));
        CHECK(atlas_constraint_matcher_new(c, NULL, &m) == ATLAS_ERR_INVALID && !m);
        CHECK(atlas_constraint_add_literal(c, "1", 1) == ATLAS_ERR_INVALID);
        CHECK(atlas_constraint_add_literal(c, "e", 1) == ATLAS_ERR_INVALID);
        CHECK(atlas_constraint_add_literal(c, "-x", 2) == ATLAS_ERR_INVALID);
        CHECK(atlas_constraint_add_json_object(c) == ATLAS_ERR_INVALID);
        CHECK_OK(atlas_constraint_add_literal(c, "}", 1));
        CHECK(MATCH(c, "12}") && MATCH(c, " 0}") && !MATCH(c, "12") && !MATCH(c, "}"));
        atlas_constraint_free(c);
    }
    /* strings, arrays and objects end by themselves */
    CHECK_OK(atlas_constraint_new(&c));
    CHECK_OK(atlas_constraint_add_json_value(c, ATLAS_CONSTRAINT_JSON_STRING));
    CHECK(MATCH(c, "\"ab\"") && MATCH(c, "\n  \"\"") && !MATCH(c, "\"ab") && !MATCH(c, "ab"));
    CHECK_OK(atlas_constraint_add_json_value(c, ATLAS_CONSTRAINT_JSON_ARRAY));
    CHECK(MATCH(c, "\"\"[1,[2]]") && !MATCH(c, "\"\"[1,[2]"));
    atlas_constraint_free(c);
    /* booleans, arrays of one kind, null allowed or not */
    CHECK_OK(atlas_constraint_new(&c));
    const int kinds2[] = {ATLAS_CONSTRAINT_JSON_BOOLEAN,
                          ATLAS_CONSTRAINT_JSON_BOOLEAN | ATLAS_CONSTRAINT_JSON_NULLABLE,
                          ATLAS_CONSTRAINT_JSON_ARRAY_OF_STRING,
                          ATLAS_CONSTRAINT_JSON_ARRAY_OF_NUMBER,
                          ATLAS_CONSTRAINT_JSON_ARRAY_OF_INTEGER | ATLAS_CONSTRAINT_JSON_NULLABLE,
                          ATLAS_CONSTRAINT_JSON_ARRAY_OF_BOOLEAN,
                          ATLAS_CONSTRAINT_JSON_STRING | ATLAS_CONSTRAINT_JSON_NULLABLE,
                          ATLAS_CONSTRAINT_JSON_INTEGER | ATLAS_CONSTRAINT_JSON_NULLABLE,
                          ATLAS_CONSTRAINT_JSON_OBJECT | ATLAS_CONSTRAINT_JSON_NULLABLE};
    for (int i = 0; i < 9; i++) {
        CHECK_OK(atlas_constraint_add_literal(c, i ? "," : "[", 1));
        CHECK_OK(atlas_constraint_add_json_value(c, kinds2[i]));
    }
    CHECK_OK(atlas_constraint_add_literal(c, "]", 1));
    const char *good2[] = {
        "[true,null,[\"a\", \"b\"],[1.5, -2e3],[1, -2],[true,false],\"s\",5,{}]",
        "[false,true,[],[],null,[],null,null,null]",
        "[ true, false,[ ],[0],[0,10],[ false ], \"\",-1,{\"a\":[]}]",
    };
    for (size_t i = 0; i < sizeof good2 / sizeof *good2; i++) {
        CHECK_MSG(MATCH(c, good2[i]), "good2[%zu] %s", i, good2[i]);
        json_t *j = json_loads(good2[i], 0, NULL);
        CHECK(json_is_array(j) && json_array_size(j) == 9);
        json_decref(j);
    }
    const char *bad2[] = {
        "[null,null,[],[],null,[],null,null,null]",         /* null for a plain boolean */
        "[true,true,[1],[],null,[],null,null,null]",        /* a number among strings */
        "[true,true,[],[\"1\"],null,[],null,null,null]",    /* a string among numbers */
        "[true,true,[],[],[1.5],[],null,null,null]",        /* a fraction among integers */
        "[true,true,[],[],[1e2],[],null,null,null]",
        "[true,true,[],[],null,[null],null,null,null]",     /* null among booleans */
        "[true,true,[],[],null,[],null,2.5,null]",          /* a fraction for an integer */
        "[true,true,[],[],null,[],null,null,[]]",           /* an array for an object */
        "[true,true,[[]],[],null,[],null,null,null]",       /* nested array */
        "[1,true,[],[],null,[],null,null,null]",
    };
    for (size_t i = 0; i < sizeof bad2 / sizeof *bad2; i++)
        CHECK_MSG(!MATCH(c, bad2[i]), "bad2[%zu] %s", i, bad2[i]);
    atlas_constraint_free(c);
    /* consecutive literals are one segment */
    CHECK_OK(atlas_constraint_new(&c));
    CHECK_OK(atlas_constraint_add_literal(c, "ab", 2));
    CHECK_OK(atlas_constraint_add_literal(c, "cd", 2));
    CHECK(atlas_constraint_n_segments(c) == 1 && MATCH(c, "abcd") && !MATCH(c, "ab"));
    atlas_constraint_free(c);
}

/* The server's tool-call programs (src/server/api.c, one per format) accept a call that the
 * tool-call parser reads back with the same name, escapes included. */
static void test_toolcall_shapes(void) {
    const struct {
        atlas_toolcall_format f;
        const char *head, *middle, *tail;
    } shapes[] = {
        {ATLAS_TOOLCALL_HERMES, "<tool_call>\n{\"name\": \"", "\", \"arguments\": ",
         "}\n</tool_call>"},
        {ATLAS_TOOLCALL_LLAMA3, "{\"name\": \"", "\", \"parameters\": ", "}"},
        {ATLAS_TOOLCALL_MISTRAL, "[TOOL_CALLS][{\"name\": \"", "\", \"arguments\": ", "}]"},
    };
    const char *name = "get \"x\"\\y/\xc3\xa9";  /* get "x"\y/é */
    const char *escaped = "get \\\"x\\\"\\\\y/\xc3\xa9"; /* as jansson writes it */
    const char *names[] = {escaped, "get"};
    for (int k = 0; k < 3; k++) {
        atlas_constraint *c = NULL;
        CHECK_OK(atlas_constraint_new(&c));
        CHECK_OK(atlas_constraint_add_literal(c, shapes[k].head, strlen(shapes[k].head)));
        CHECK_OK(atlas_constraint_add_choice(c, names, 2));
        CHECK_OK(atlas_constraint_add_literal(c, shapes[k].middle, strlen(shapes[k].middle)));
        CHECK_OK(atlas_constraint_add_json_object(c));
        CHECK_OK(atlas_constraint_add_literal(c, shapes[k].tail, strlen(shapes[k].tail)));
        char text[512];
        snprintf(text, sizeof text, "%s%s%s{\"a\": [1, {\"b\": null}]}%s", shapes[k].head,
                 escaped, shapes[k].middle, shapes[k].tail);
        CHECK_MSG(MATCH(c, text), "format %d: %s", k, text);
        char *content = NULL;
        json_t *calls = NULL;
        CHECK_OK(atlas_toolcall_parse(shapes[k].f, text, &content, &calls));
        json_t *fn = json_object_get(json_array_get(calls, 0), "function");
        const char *got = json_string_value(json_object_get(fn, "name"));
        CHECK_MSG(json_array_size(calls) == 1 && got && !strcmp(got, name), "format %d: %s",
                  k, got ? got : "(none)");
        json_t *args = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, NULL);
        CHECK(json_is_object(args) && json_is_array(json_object_get(args, "a")));
        json_decref(args);
        CHECK(content && !*content);
        free(content);
        json_decref(calls);
        atlas_constraint_free(c);
    }
}

/* The mask must say exactly which tokens a fresh matcher, fed prefix and then the token's
 * bytes, accepts.  ids: which to check (NULL: all of [0, n)). */
static int check_mask(const atlas_constraint *c, const atlas_constraint_vocab *v,
                      const char *prefix, size_t plen, const char *const *bytes,
                      const size_t *lens, int n, const uint8_t *mask, const int *ids,
                      int n_ids) {
    int bad = 0;
    for (int k = 0; k < (ids ? n_ids : n); k++) {
        int id = ids ? ids[k] : k;
        atlas_constraint_matcher *m = NULL;
        if (atlas_constraint_matcher_new(c, v, &m) != ATLAS_OK) return 1;
        int ok = atlas_constraint_matcher_accept_bytes(m, prefix, plen) == ATLAS_OK &&
                 !atlas_constraint_matcher_done(m) && lens[id] > 0 &&
                 atlas_constraint_matcher_accept_bytes(m, bytes[id], lens[id]) == ATLAS_OK;
        if (ok != mask[id]) {
            if (bad++ < 5)
                fprintf(stderr, "mask of token %d '%.*s' is %d, the matcher says %d\n", id,
                        (int)lens[id], bytes[id], mask[id], ok);
        }
        atlas_constraint_matcher_free(m);
    }
    return bad;
}

static void test_hand_vocab(void) {
    const char *bytes[] = {"{", "}", "\"", "a", "{\"", "\"}", "x", "", " ", "<tool_call>",
                           "<", "tool", "_call", ">", ":", "1", "\":", "}}", "{}", "\xc3",
                           "\xa9", "\xc3\xa9", "\\u", "d83d", "\\", NULL, "{\"a\":1}", "\n"};
    enum { N = sizeof bytes / sizeof *bytes };
    size_t lens[N];
    for (int i = 0; i < N; i++) lens[i] = bytes[i] ? strlen(bytes[i]) : 0;
    atlas_constraint_vocab *v = NULL;
    CHECK_OK(atlas_constraint_vocab_new(bytes, lens, N, &v));
    CHECK(atlas_constraint_vocab_size(v) == N);
    atlas_constraint *c = NULL;
    CHECK_OK(atlas_constraint_new(&c));
    CHECK_OK(atlas_constraint_add_literal(c, "<tool_call>", 11));
    CHECK_OK(atlas_constraint_add_json_object(c));
    atlas_constraint_matcher *m = NULL;
    CHECK_OK(atlas_constraint_matcher_new(c, v, &m));
    uint8_t mask[N + 4];
    /* at the start: the special-looking token and its spelling's first piece only */
    int n = atlas_constraint_matcher_allowed(m, mask, N + 4);
    CHECK(n == 2 && mask[9] && mask[10] && !mask[N] && !mask[7] && !mask[25]);
    CHECK(atlas_constraint_matcher_accept(m, 3) == ATLAS_ERR_INVALID); /* "a" */
    CHECK(atlas_constraint_matcher_accept(m, 7) == ATLAS_ERR_INVALID); /* no bytes */
    CHECK(atlas_constraint_matcher_accept(m, N) == ATLAS_ERR_RANGE);
    CHECK(atlas_constraint_matcher_accept(m, -1) == ATLAS_ERR_RANGE);
    CHECK_OK(atlas_constraint_matcher_accept(m, 9));
    atlas_constraint_matcher_allowed(m, mask, N);
    CHECK(mask[0] && mask[4] && mask[18] && mask[26] && mask[8] && mask[27] && !mask[1] &&
          !mask[3] && !mask[17]);
    /* then every state along a walk, token by token, against the byte matcher */
    const int walk[] = {8, 4, 3, 16, 2, 21, 19, 20, 22, 23};
    char text[256];
    size_t tl = 11;
    memcpy(text, "<tool_call>", 11);
    for (size_t i = 0; i < sizeof walk / sizeof *walk; i++) {
        int na = atlas_constraint_matcher_allowed(m, mask, N);
        CHECK(check_mask(c, v, text, tl, bytes, lens, N, mask, NULL, 0) == 0);
        CHECK(na > 0);
        CHECK_MSG(mask[walk[i]], "step %zu: token %d", i, walk[i]);
        CHECK_OK(atlas_constraint_matcher_accept(m, walk[i]));
        memcpy(text + tl, bytes[walk[i]], lens[walk[i]]);
        tl += lens[walk[i]];
    }
    /* after <tool_call> {"a":"éé\ud83d a high surrogate needs its low half: no quote */
    atlas_constraint_matcher_allowed(m, mask, N);
    CHECK(!mask[2] && mask[22] && mask[24] && !mask[23]);
    CHECK(check_mask(c, v, text, tl, bytes, lens, N, mask, NULL, 0) == 0);
    CHECK(!atlas_constraint_matcher_done(m));
    atlas_constraint_matcher_free(m);

    m = NULL;
    CHECK_OK(atlas_constraint_matcher_new(c, v, &m));
    CHECK_OK(atlas_constraint_matcher_accept(m, 9));
    CHECK_OK(atlas_constraint_matcher_accept(m, 26)); /* {"a":1} */
    CHECK(atlas_constraint_matcher_done(m));
    CHECK(atlas_constraint_matcher_allowed(m, mask, N) == 0);
    atlas_constraint_matcher_free(m);
    atlas_constraint_free(c);
    atlas_constraint_vocab_free(v);
}

/* A program: a literal, a value of kind (-1: none), a literal. */
static atlas_constraint *prog(const char *head, int kind, const char *tail) {
    atlas_constraint *a = NULL;
    CHECK_OK(atlas_constraint_new(&a));
    CHECK_OK(atlas_constraint_add_literal(a, head, strlen(head)));
    if (kind >= 0) CHECK_OK(atlas_constraint_add_json_value(a, kind));
    CHECK_OK(atlas_constraint_add_literal(a, tail, strlen(tail)));
    return a;
}

#define ALTS(c, keys, rest, n) \
    atlas_constraint_add_alternatives((c), (keys), (const atlas_constraint *const *)(rest), (n))

/* One of several programs, chosen by the key before each; the refused layouts. */
static void test_alternatives(void) {
    const char *keys[] = {"get_weather\"", "get_time\"", "get\""};
    atlas_constraint *rest[3] = {
        prog(", \"arguments\": {\"city\": ", ATLAS_CONSTRAINT_JSON_STRING, "}"),
        prog(", \"arguments\": {\"utc\": ", ATLAS_CONSTRAINT_JSON_BOOLEAN, "}"),
        NULL,
    };
    CHECK_OK(atlas_constraint_new(&rest[2]));
    CHECK_OK(atlas_constraint_add_json_value(rest[2], ATLAS_CONSTRAINT_JSON_ANY));
    CHECK_OK(atlas_constraint_add_literal(rest[2], "!", 1));
    atlas_constraint *c = NULL;
    CHECK_OK(atlas_constraint_new(&c));
    CHECK_OK(atlas_constraint_add_literal(c, "{\"name\": \"", 10));
    CHECK_OK(ALTS(c, keys, rest, 3));
    CHECK_OK(atlas_constraint_add_literal(c, "}", 1));
    const char *good[] = {
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
        "{\"name\": \"get_time\", \"arguments\": {\"utc\": true}}",
        "{\"name\": \"get\"-12.5e3!}",
    };
    for (size_t i = 0; i < 3; i++) CHECK_MSG(MATCH(c, good[i]), "good[%zu] %s", i, good[i]);
    const char *bad[] = {
        "{\"name\": \"get_weather\", \"arguments\": {\"utc\": true}}",
        "{\"name\": \"get_time\", \"arguments\": {\"utc\": \"yes\"}}",
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}",
        "{\"name\": \"got\", \"arguments\": {}}",
        "{\"name\": \"get\"1}",
    };
    for (size_t i = 0; i < 5; i++) CHECK_MSG(!MATCH(c, bad[i]), "bad[%zu] %s", i, bad[i]);
    /* a copy matches the same (the engine keeps one per request) */
    atlas_constraint *d = NULL;
    CHECK_OK(atlas_constraint_copy(c, &d));
    atlas_constraint_free(c);
    CHECK(d && MATCH(d, good[1]) && !MATCH(d, bad[1]));
    atlas_constraint_free(d);
    /* alternatives nested in alternatives, an empty program after a key */
    atlas_constraint *inner = NULL, *outer[2] = {NULL, NULL};
    CHECK_OK(atlas_constraint_new(&inner));
    CHECK_OK(ALTS(inner, keys, rest, 2));
    CHECK_OK(atlas_constraint_add_literal(inner, ">", 1));
    outer[0] = inner;
    const char *okeys[] = {"<", "none"};
    CHECK_OK(atlas_constraint_new(&c));
    CHECK_OK(ALTS(c, okeys, outer, 2));
    CHECK_OK(atlas_constraint_add_literal(c, "!", 1));
    CHECK(MATCH(c, "<get_time\", \"arguments\": {\"utc\": false}>!"));
    CHECK(MATCH(c, "none!"));
    CHECK(!MATCH(c, "<get_time\", \"arguments\": {\"utc\": false}!"));
    CHECK(!MATCH(c, "none.!"));
    atlas_constraint_free(c);
    /* refused: a key that begins another, an empty key, a number at a program's end, a
     * number before keys that could continue it */
    const char *pre[] = {"ab", "abc"}, *empty[] = {""}, *digit[] = {"1"}, *x[] = {"x"};
    atlas_constraint *num[1] = {prog("n", ATLAS_CONSTRAINT_JSON_NUMBER, "")};
    CHECK_OK(atlas_constraint_new(&c));
    CHECK(ALTS(c, pre, NULL, 2) == ATLAS_ERR_INVALID);
    CHECK(ALTS(c, empty, NULL, 1) == ATLAS_ERR_INVALID);
    CHECK(ALTS(c, x, num, 1) == ATLAS_ERR_INVALID);
    CHECK(ALTS(c, x, NULL, 0) == ATLAS_ERR_RANGE);
    CHECK(atlas_constraint_n_segments(c) == 0); /* each failure left it as it was */
    CHECK_OK(atlas_constraint_add_json_value(c, ATLAS_CONSTRAINT_JSON_INTEGER));
    CHECK(ALTS(c, digit, NULL, 1) == ATLAS_ERR_INVALID);
    CHECK_OK(ALTS(c, x, NULL, 1));
    CHECK(MATCH(c, "-12x"));
    atlas_constraint_free(c);
    atlas_constraint_free(num[0]);
    atlas_constraint_free(inner);
    for (int i = 0; i < 3; i++) atlas_constraint_free(rest[i]);
}

/* Free text where a trigger (a strict tool's call, once named) starts a program; tokens
 * without bytes and the end are allowed only in the free text; masks against the bytes. */
static void test_free_text(void) {
    const char *trig[] = {"<call>{\"name\": \"f\"", "<call>{\"name\": \"g\""};
    atlas_constraint *rest[2] = {
        prog(", \"args\": {\"n\": ", ATLAS_CONSTRAINT_JSON_INTEGER, "}}</call>"),
        prog("}</call>", -1, ""),
    };
    atlas_constraint *c = NULL;
    CHECK_OK(atlas_constraint_new(&c));
    CHECK_OK(atlas_constraint_add_free_text(c, trig, (const atlas_constraint *const *)rest, 2));
    CHECK(atlas_constraint_add_literal(c, "x", 1) == ATLAS_ERR_INVALID); /* nothing after */
    CHECK(atlas_constraint_add_free_text(c, trig, NULL, 1) == ATLAS_ERR_INVALID);
    const char *ok[] = {
        "",
        "any text at all <call> <b> {\"name\": \"f",
        "I call <call>{\"name\": \"f\", \"args\": {\"n\": 42}}</call> and more text",
        "<<call>{\"name\": \"g\"}</call><call>{\"name\": \"h\", \"x\": 1}",
        "<call>{\"name\": <call>{\"name\": \"f\", \"args\": {\"n\": -1}}</call>",
        "<call>{\"name\": \"ff\", \"args\": {\"n\": \"text\"}}",
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        atlas_constraint_matcher *m = NULL;
        CHECK_OK(atlas_constraint_matcher_new(c, NULL, &m));
        CHECK_MSG(atlas_constraint_matcher_accept_bytes(m, ok[i], strlen(ok[i])) == ATLAS_OK &&
                  atlas_constraint_matcher_can_end(m) && !atlas_constraint_matcher_done(m),
                  "ok[%zu] %s", i, ok[i]);
        atlas_constraint_matcher_free(m);
    }
    const char *refused[] = {
        "text <call>{\"name\": \"f\", \"args\": {\"n\": \"x\"}}",
        "<call>{\"name\": \"f\", \"args\": {\"n\": 1.5}}",
        "<call>{\"name\": \"g\", \"args\": {}}",
        "<ca<call>{\"name\": \"f\", \"x",
        "<call>{\"name\": \"f\",\"args\"",
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++)
        CHECK_MSG(!prefix_ok(c, refused[i]), "refused[%zu] %s", i, refused[i]);
    /* inside a call the text may not end */
    atlas_constraint_matcher *m = NULL;
    CHECK_OK(atlas_constraint_matcher_new(c, NULL, &m));
    const char *open = "hi <call>{\"name\": \"f\", \"args\": {";
    CHECK_OK(atlas_constraint_matcher_accept_bytes(m, open, strlen(open)));
    CHECK(!atlas_constraint_matcher_can_end(m));
    atlas_constraint_matcher_free(m);

    /* masks: every token the bytes allow, the byteless ones only in free text */
    const char *bytes[] = {"<", "call", ">", "<call>", "{\"", "name", "\": \"", "f", "\",",
                           " \"args\": {\"n\": ", "7", "}}", "</call>", "x", NULL, "\"}",
                           "g", "\"x\"", "<call>{\"name\": \"f\", \"args\": {\"n\": 1"};
    enum { N = sizeof bytes / sizeof *bytes };
    size_t lens[N];
    for (int i = 0; i < N; i++) lens[i] = bytes[i] ? strlen(bytes[i]) : 0;
    atlas_constraint_vocab *v = NULL;
    CHECK_OK(atlas_constraint_vocab_new(bytes, lens, N, &v));
    CHECK_OK(atlas_constraint_matcher_new(c, v, &m));
    const int walk[] = {13, 14, 0, 13, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 18, 11, 12, 14};
    char text[512];
    size_t tl = 0;
    uint8_t mask[N];
    int ids[N], k = 0; /* check_mask knows no byteless tokens: they are checked here */
    for (int id = 0; id < N; id++)
        if (lens[id]) ids[k++] = id;
    for (size_t i = 0; i < sizeof walk / sizeof *walk; i++) {
        int na = atlas_constraint_matcher_allowed(m, mask, N);
        CHECK_MSG(mask[14] == atlas_constraint_matcher_can_end(m), "step %zu: no bytes", i);
        CHECK_MSG(check_mask(c, v, text, tl, bytes, lens, N, mask, ids, k) == 0, "step %zu", i);
        CHECK(na > 0);
        CHECK_MSG(mask[walk[i]], "step %zu: token %d", i, walk[i]);
        CHECK_OK(atlas_constraint_matcher_accept(m, walk[i]));
        memcpy(text + tl, bytes[walk[i]] ? bytes[walk[i]] : "", lens[walk[i]]);
        tl += lens[walk[i]];
    }
    CHECK(atlas_constraint_matcher_can_end(m));
    atlas_constraint_matcher_free(m);
    atlas_constraint_vocab_free(v);
    atlas_constraint_free(c);
    for (int i = 0; i < 2; i++) atlas_constraint_free(rest[i]);
}

/* xorshift for the random walks */
static uint64_t rnd(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Random allowed tokens until complete: two times in three any allowed token, else the
 * first allowed of a few closing ones (so that walks end), bounded. */
static void random_walks(const atlas_tokenizer *tok, const atlas_constraint_vocab *v) {
    int n = atlas_constraint_vocab_size(v);
    const char **bytes = calloc((size_t)n, sizeof *bytes);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    uint8_t *mask = malloc((size_t)n);
    int *allowed = malloc((size_t)n * sizeof *allowed);
    for (int i = 0; i < n; i++) atlas_tokenizer_token_bytes(tok, i, &bytes[i], &lens[i]);
    const char *closers[] = {"\"", "}", "]", ":", "1", ",", "{", "\"}"};
    int closer_ids[8];
    for (int i = 0; i < 8; i++) closer_ids[i] = atlas_tokenizer_token_id(tok, closers[i]);
    atlas_constraint *c = json_program();
    int completed = 0, steps = 0;
    for (uint64_t seed = 1; seed <= 40; seed++) {
        uint64_t r = seed * 0x9E3779B97F4A7C15ull;
        atlas_constraint_matcher *m = NULL;
        CHECK_OK(atlas_constraint_matcher_new(c, v, &m));
        char *text = malloc(1 << 16);
        size_t tl = 0;
        for (int stepno = 0; stepno < 3000 && !atlas_constraint_matcher_done(m); stepno++, steps++) {
            int na = atlas_constraint_matcher_allowed(m, mask, n);
            CHECK(na > 0);
            if (na <= 0) break;
            if (stepno % 40 == 0) { /* spot-check the mask on random tokens */
                int ids[200];
                for (int k = 0; k < 200; k++) ids[k] = (int)(rnd(&r) % (uint64_t)n);
                CHECK(check_mask(c, v, text, tl, bytes, lens, n, mask, ids, 200) == 0);
            }
            int id = -1;
            if (rnd(&r) % 3 == 0)
                for (int k = 0; k < 8 && id < 0; k++)
                    if (closer_ids[k] >= 0 && mask[closer_ids[k]]) id = closer_ids[k];
            if (id < 0) {
                int cnt = 0;
                for (int i = 0; i < n; i++)
                    if (mask[i]) allowed[cnt++] = i;
                id = allowed[rnd(&r) % (uint64_t)cnt];
            }
            CHECK_OK(atlas_constraint_matcher_accept(m, id));
            if (tl + lens[id] < (1 << 16)) {
                memcpy(text + tl, bytes[id], lens[id]);
                tl += lens[id];
            }
        }
        if (!atlas_constraint_matcher_done(m))
            fprintf(stderr, "seed %d incomplete, tail: %.*s\n", (int)seed,
                    (int)(tl < 300 ? tl : 300), text + (tl < 300 ? 0 : tl - 300));
        if (atlas_constraint_matcher_done(m)) {
            completed++;
            json_error_t err;
            json_t *j = json_loadb(text, tl, 0, &err);
            CHECK_MSG(json_is_object(j), "seed %llu: %s in %.*s", (unsigned long long)seed,
                      err.text, (int)tl, text);
            json_decref(j);
        }
        free(text);
        atlas_constraint_matcher_free(m);
    }
    CHECK_MSG(completed == 40, "%d of 40 walks completed", completed);
    printf("40 random walks: %d tokens\n", steps);
    atlas_constraint_free(c);
    free(bytes);
    free(lens);
    free(mask);
    free(allowed);
}

/* Milliseconds per mask of the whole vocabulary: the first mask in three states (no cached
 * mask), then the average over the tokens of a JSON reply, as a sequence would see it. */
static void bench_mask(const atlas_tokenizer *tok, const atlas_constraint_vocab *v) {
    int n = atlas_constraint_vocab_size(v);
    uint8_t *mask = malloc((size_t)n);
    atlas_constraint *c = json_program();
    const char *states[] = {"", "{\"key\": \"some text ", "{\"a\": [1, 2"};
    for (int k = 0; k < 3; k++) {
        int reps = 10, na = 0;
        double t = 0;
        for (int i = 0; i < reps; i++) {
            atlas_constraint_matcher *m = NULL;
            CHECK_OK(atlas_constraint_matcher_new(c, v, &m));
            CHECK_OK(atlas_constraint_matcher_accept_bytes(m, states[k], strlen(states[k])));
            double t0 = now_s();
            na = atlas_constraint_matcher_allowed(m, mask, n);
            t += now_s() - t0;
            atlas_constraint_matcher_free(m);
        }
        printf("first mask of %d tokens after '%s': %.3f ms (%d allowed)\n", n, states[k],
               t * 1e3 / reps, na);
    }
    const char *reply = "{\"city\": \"Paris\", \"forecast\": \"sunny with a light breeze from "
                        "the west and a few clouds in the evening\", \"temperature\": 22.5, "
                        "\"days\": [1, 2, 3], \"alerts\": null}";
    int32_t *ids = NULL;
    size_t n_ids = 0;
    CHECK_OK(atlas_tokenizer_encode(tok, reply, strlen(reply), false, &ids, &n_ids));
    atlas_constraint_matcher *m = NULL;
    CHECK_OK(atlas_constraint_matcher_new(c, v, &m));
    double t0 = now_s();
    for (size_t i = 0; i < n_ids; i++) {
        atlas_constraint_matcher_allowed(m, mask, n);
        CHECK(mask[ids[i]]);
        CHECK_OK(atlas_constraint_matcher_accept(m, ids[i]));
    }
    double ms = (now_s() - t0) * 1e3 / (double)(n_ids ? n_ids : 1);
    CHECK(atlas_constraint_matcher_done(m));
    printf("masked step over a %zu-token JSON reply: %.3f ms per token\n", n_ids, ms);
    atlas_constraint_matcher_free(m);
    free(ids);
    atlas_constraint_free(c);
    free(mask);
}

static void test_tokenizer_vocab(void) {
    atlas_tokenizer *tok = NULL;
    CHECK_OK(atlas_tokenizer_load(harness_data_path("tiny-qwen3"), &tok));
    if (!tok) return;
    atlas_constraint_vocab *v = NULL, *vs = NULL;
    CHECK_OK(atlas_constraint_vocab_from_tokenizer(tok, false, &v));
    CHECK_OK(atlas_constraint_vocab_from_tokenizer(tok, true, &vs));
    if (!v || !vs) return;
    CHECK((size_t)atlas_constraint_vocab_size(v) == atlas_tokenizer_vocab_size(tok));
    /* "<tool_call>" is one (non-special) token, allowed where the literal is due;
     * "<|im_end|>" is special: allowed by its bytes unless skip_special */
    int32_t tc = atlas_tokenizer_token_id(tok, "<tool_call>");
    int32_t im_end = atlas_tokenizer_token_id(tok, "<|im_end|>");
    CHECK(tc >= 0 && im_end >= 0);
    atlas_constraint *c = NULL;
    CHECK_OK(atlas_constraint_new(&c));
    CHECK_OK(atlas_constraint_add_literal(c, "<tool_call><|im_end|>", 21));
    int n = atlas_constraint_vocab_size(v);
    uint8_t *mask = malloc((size_t)n);
    atlas_constraint_matcher *m = NULL;
    CHECK_OK(atlas_constraint_matcher_new(c, v, &m));
    atlas_constraint_matcher_allowed(m, mask, n);
    CHECK(mask[tc] && mask[atlas_tokenizer_token_id(tok, "<")]);
    CHECK_OK(atlas_constraint_matcher_accept(m, tc));
    atlas_constraint_matcher_allowed(m, mask, n);
    CHECK(mask[im_end]);
    atlas_constraint_matcher_free(m);
    CHECK_OK(atlas_constraint_matcher_new(c, vs, &m));
    CHECK_OK(atlas_constraint_matcher_accept(m, tc));
    atlas_constraint_matcher_allowed(m, mask, n);
    CHECK(!mask[im_end] && mask[atlas_tokenizer_token_id(tok, "<")]);
    atlas_constraint_matcher_free(m);
    atlas_constraint_free(c);
    free(mask);
    random_walks(tok, v);
    bench_mask(tok, v);
    atlas_constraint_vocab_free(v);
    atlas_constraint_vocab_free(vs);
    atlas_tokenizer_free(tok);
}

int main(void) {
    test_alternatives();
    test_free_text();
    test_literal_choice();
    test_json_accept();
    test_toolcall_shapes();
    test_json_values();
    test_hand_vocab();
    test_tokenizer_vocab();
    return harness_finish();
}

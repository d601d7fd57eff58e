/* test-c-api.c — every public header in include/atlas/ compiles as plain C11 (this file is
 * C) on its own and together, and the list below is complete: the test reads the directory
 * and fails when a header is missing from it. Also checks the few things of the API that
 * need no model: default params, status strings, the version, UTF-8 and model names. */
#include "atlas/atlas.h"
#include "atlas/constraint.h"
#include "atlas/engine.h"
#include "atlas/harmony.h"
#include "atlas/host.h"
#include "atlas/memdir.h"
#include "atlas/model.h"
#include "atlas/parallel.h"
#include "atlas/reasoning.h"
#include "atlas/shield.h"
#include "atlas/sampler.h"
#include "atlas/server.h"
#include "atlas/status.h"
#include "atlas/template.h"
#include "atlas/tokenizer.h"
#include "atlas/toolcall.h"
#include "atlas/utf8.h"
#include "atlas/version.h"

#include <dirent.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

static const char *const included[] = {
    "atlas.h", "constraint.h", "engine.h", "harmony.h", "host.h", "memdir.h", "model.h",
    "parallel.h", "reasoning.h", "shield.h", "sampler.h", "server.h", "status.h", "template.h", "tokenizer.h", "toolcall.h",
    "utf8.h", "version.h",
};

static void test_all_included(void) {
    const char *root = getenv("ATLAS_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/include/atlas", root ? root : ".");
    DIR *d = opendir(path);
    CHECK_MSG(d != NULL, "cannot open %s", path);
    if (!d) return;
    struct dirent *e;
    int headers = 0;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len < 3 || strcmp(e->d_name + len - 2, ".h")) continue;
        headers++;
        int found = 0;
        for (size_t i = 0; i < sizeof included / sizeof included[0]; i++)
            found |= !strcmp(included[i], e->d_name);
        CHECK_MSG(found, "include/atlas/%s is not included by tests/test-c-api.c", e->d_name);
    }
    closedir(d);
    CHECK(headers >= 8);
}

/* The library says which version it is, the one the headers say. */
static void test_version(void) {
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", ATLAS_VERSION_MAJOR, ATLAS_VERSION_MINOR,
             ATLAS_VERSION_PATCH);
    CHECK(!strcmp(want, ATLAS_VERSION_STRING));
    CHECK_MSG(atlas_version() != NULL && !strcmp(atlas_version(), ATLAS_VERSION_STRING),
              "atlas_version() is %s, the header %s", atlas_version(), ATLAS_VERSION_STRING);
    CHECK(ATLAS_API_VERSION >= 0);
}

/* The rule of model names (UTF-8, no control characters, 1 to 127 bytes), which create
 * checks before it reads any directory. */
static void test_model_names(void) {
    static const char *const bad[][2] = {
        {"line\nfeed", "\"line\\nfeed\": control character U+000A at byte 4"},
        {"caf\xc3\xa9\xff", "\"caf\xc3\xa9\\xFF\": not UTF-8 at byte 5"},
        {"c1\xc2\x85", "\"c1\\u0085\": control character U+0085 at byte 2"},
        {"over\xc0\xaflong", "not UTF-8 at byte 4"},
        {"del\x7f", "control character U+007F at byte 3"},
    };
    atlas_engine_params p = atlas_engine_default_params();
    p.n_models = 1;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        atlas_engine_model m = {.name = bad[i][0], .dir = "/nonexistent"};
        atlas_engine *e = NULL;
        p.models = &m;
        CHECK(atlas_engine_create(&p, &e) == ATLAS_ERR_INVALID && !e);
        CHECK_MSG(strstr(atlas_last_error(), bad[i][1]), "%s", atlas_last_error());
    }
    char name[ATLAS_ENGINE_NAME_MAX + 2];
    memset(name, 'n', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    CHECK(atlas_engine_check_name(name) == ATLAS_ERR_INVALID);
    CHECK_MSG(strstr(atlas_last_error(), "128 bytes long"), "%s", atlas_last_error());
    name[ATLAS_ENGINE_NAME_MAX] = '\0';
    CHECK_MSG(atlas_engine_check_name(name) == ATLAS_OK, "%s", atlas_last_error());
    CHECK(atlas_engine_check_name("q\"uote back\\slash caf\xc3\xa9 \xe2\x82\xac") == ATLAS_OK);
    CHECK(atlas_engine_check_name("") == ATLAS_ERR_INVALID);
}

int main(void) {
    test_all_included();
    test_version();
    test_model_names();
    atlas_model_params p = atlas_model_default_params();
    CHECK(p.device == ATLAS_DEVICE_AUTO && p.kv_block_size > 0 && p.max_batch_tokens > 0 &&
          p.load_tokenizer == 1);
    CHECK(!strcmp(atlas_status_str(ATLAS_ERR_BUSY), "ATLAS_ERR_BUSY"));
    atlas_model *m = NULL;
    CHECK(atlas_model_load(NULL, &p, &m) == ATLAS_ERR_INVALID && m == NULL);
    CHECK(atlas_model_release(NULL) == ATLAS_OK);
    char clean[16];
    CHECK(atlas_utf8_clean(clean, sizeof clean, "a\xff\xc3\xa9", 4) == 6 &&
          !strcmp(clean, "a\xef\xbf\xbd\xc3\xa9"));
    return harness_finish();
}

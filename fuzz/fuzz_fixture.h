/* fuzz/fuzz_fixture.h — where a fuzz target finds a fixture of tests/data: under
 * $ATLAS_TEST_DATA, else next to the target's own source file (libFuzzer runs from anywhere). */
#ifndef ATLAS_FUZZ_FIXTURE_H
#define ATLAS_FUZZ_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* dir[cap] = the fixture directory `name` (e.g. "tiny-qwen3"); src: the caller's __FILE__. */
static inline void fuzz_fixture_dir(char *dir, size_t cap, const char *name, const char *src) {
    const char *data = getenv("ATLAS_TEST_DATA");
    if (data) {
        snprintf(dir, cap, "%s/%s", data, name);
        return;
    }
    const char *cut = strstr(src, "fuzz/fuzz-");
    snprintf(dir, cap, "%.*stests/data/%s", cut ? (int)(cut - src) : 0, src, name);
}

#endif

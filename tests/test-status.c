/* tests/test-status.c — status strings and the per-thread error message. */
#include <string.h>

#include "atlas/status.h"
#include "core/error.h"
#include "harness.h"

int main(void) {
    CHECK(!strcmp(atlas_status_str(ATLAS_OK), "ATLAS_OK"));
    CHECK(!strcmp(atlas_status_str(ATLAS_ERR_BUSY), "ATLAS_ERR_BUSY"));
    CHECK(!strcmp(atlas_status_str((atlas_status)-999), "ATLAS_ERR_UNKNOWN"));
    CHECK(atlas_fail(ATLAS_ERR_IO, "%s: cannot open", "x.json") == ATLAS_ERR_IO);
    CHECK(!strcmp(atlas_last_error(), "x.json: cannot open"));
    CHECK(atlas_fail_wrap(ATLAS_ERR_IO, "loading %s", "dir") == ATLAS_ERR_IO);
    CHECK(!strcmp(atlas_last_error(), "loading dir: x.json: cannot open"));
    atlas_error_clear();
    CHECK(!strcmp(atlas_last_error(), ""));
    return harness_finish();
}

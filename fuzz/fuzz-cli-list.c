/* fuzz/fuzz-cli-list.c — libFuzzer target for the list values of command-line options
 * (src/cli/list.c): `atlas run --prompt-ids 1,2,3` (atlas_cli_parse_ids), `atlas bench -p
 * 512,2048 --batch 8,32` (atlas_cli_parse_ints) and `--skip-ops rope,norm`
 * (atlas_cli_parse_names), and `--device cuda:N` (src/cli/device.c). The input, cut at its
 * first NUL, is the option's value, as argv hands it over. The CLI is not in libatlas, so
 * its two sources are compiled in here. Errors are fine; crashes, leaks, sanitizer reports
 * and results outside what the functions promise are not. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli/device.c"
#include "cli/list.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const SKIP_OPS[] = {"norm", "matmul", "rope", "kv_store", "attention",
                                       "swiglu"};

static size_t count_commas(const char *s) {
    size_t n = 0;
    for (; *s; s++) n += *s == ',';
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *v = malloc(size + 1);
    if (!v) return 0;
    memcpy(v, data, size);
    v[size] = '\0';
    size_t len = strlen(v), pieces = count_commas(v) + 1;

    int32_t *ids = NULL;
    size_t n = 0;
    const char *bad = NULL;
    int rc = atlas_cli_parse_ids(v, &ids, &n, &bad);
    if (rc == 0) {
        if (n > pieces || (n == 0) != (ids == NULL)) abort();
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0) abort();
    } else if (rc < 0) {
        if (ids || n || !bad || bad < v || bad > v + len) abort();
    }
    free(ids);

    int ints[8];
    int k = atlas_cli_parse_ints(v, ints, 8);
    if (k < 0 || k > 8 || (size_t)k > pieces || (len && k == 0)) abort();

    int bits = atlas_cli_parse_names(v, SKIP_OPS, 6);
    if (bits < -1 || bits >= 1 << 6 || (!len && bits != 0)) abort();
    /* Each name alone sets its own bit, and only it. */
    for (int i = 0; i < 6; i++)
        if (!strcmp(v, SKIP_OPS[i]) && bits != 1 << i) abort();

    atlas_device device = ATLAS_DEVICE_AUTO;
    int gpu = -1;
    if (atlas_cli_parse_device(v, &device, &gpu) == 0 && (gpu < 0 || gpu > 1023)) abort();
    free(v);
    return 0;
}

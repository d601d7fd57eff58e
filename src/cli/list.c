/* cli/list.c — the comma-separated values of command-line options (cli/list.h). */
#include "cli/list.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

int atlas_cli_parse_ids(const char *s, int32_t **ids, size_t *n, const char **bad) {
    size_t cap = 0;
    *ids = NULL;
    *n = 0;
    while (*s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (errno || end == s || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            free(*ids);
            *ids = NULL;
            *n = 0;
            *bad = s;
            return -1;
        }
        if (*n == cap) {
            int32_t *g = realloc(*ids, (cap = cap ? 2 * cap : 16) * sizeof **ids);
            if (!g) {
                free(*ids);
                *ids = NULL;
                *n = 0;
                return 1;
            }
            *ids = g;
        }
        (*ids)[(*n)++] = (int32_t)v;
        s = *end ? end + 1 : end;
    }
    return 0;
}

int atlas_cli_parse_ints(const char *v, int *out, int max) {
    int n = 0;
    for (const char *s = v; *s && n < max; s = strchr(s, ',') ? strchr(s, ',') + 1 : "") {
        /* strtol, not atoi: atoi's overflow is undefined, and 4294967808 must not read as 512 */
        long x = strtol(s, NULL, 10);
        out[n++] = x > INT_MAX ? INT_MAX : x < INT_MIN ? INT_MIN : (int)x;
    }
    return n;
}

int atlas_cli_parse_names(const char *v, const char *const *names, int n_names) {
    if (n_names > 31) return -1;
    int bits = 0;
    while (*v) {
        size_t len = strcspn(v, ","), i = 0;
        while (i < (size_t)n_names && (strlen(names[i]) != len || strncmp(names[i], v, len))) i++;
        if (i == (size_t)n_names) return -1;
        bits |= 1 << i;
        v += len + (v[len] == ',');
    }
    return bits;
}

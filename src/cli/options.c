/* cli/options.c — unknown options named, with the nearest valid one (cli/options.h). */
#include "cli/options.h"

#include <stdio.h>
#include <string.h>

int atlas_cli_known_option(const char *arg, const char *const *valid) {
    for (; *valid; valid++)
        if (!strcmp(arg, *valid)) return 1;
    return 0;
}

/* Levenshtein distance; strings longer than 63 bytes are far from every option anyway. */
static int distance(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    if (na > 63 || nb > 63) return 1 << 20;
    int row[64];
    for (size_t j = 0; j <= nb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            int up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            diag = up;
            row[j] = best;
        }
    }
    return row[nb];
}

const char *atlas_cli_nearest_option(const char *arg, const char *const *valid) {
    const char *best = NULL;
    int best_d = 1 << 20;
    for (; *valid; valid++) {
        int d = distance(arg, *valid);
        if (d < best_d) best_d = d, best = *valid;
    }
    size_t len = strlen(arg);
    return best && best_d * 3 <= (int)(len > 3 ? len : 3) ? best : NULL;
}

int atlas_cli_unknown_option(const char *cmd, const char *arg, const char *const *valid) {
    const char *near = atlas_cli_nearest_option(arg, valid);
    if (near)
        fprintf(stderr, "atlas %s: unknown option '%s'; did you mean '%s'?\n", cmd, arg, near);
    else
        fprintf(stderr, "atlas %s: unknown option '%s' (see --help)\n", cmd, arg);
    return 2;
}

/* cli/run.c — `atlas run` (placeholder until its module lands). */
#include <stdio.h>

#include "cli/cli.h"

int atlas_cli_run(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "atlas run: not implemented yet\n");
    return 1;
}

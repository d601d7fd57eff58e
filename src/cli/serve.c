/* cli/serve.c — `atlas serve` (placeholder until its module lands). */
#include <stdio.h>

#include "cli/cli.h"

int atlas_cli_serve(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "atlas serve: not implemented yet\n");
    return 1;
}

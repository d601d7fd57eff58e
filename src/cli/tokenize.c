/* cli/tokenize.c — `atlas tokenize` (placeholder until its module lands). */
#include <stdio.h>

#include "cli/cli.h"

int atlas_cli_tokenize(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "atlas tokenize: not implemented yet\n");
    return 1;
}

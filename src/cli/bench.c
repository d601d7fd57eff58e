/* cli/bench.c — `atlas bench` (placeholder until its module lands). */
#include <stdio.h>

#include "cli/cli.h"

int atlas_cli_bench(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "atlas bench: not implemented yet\n");
    return 1;
}

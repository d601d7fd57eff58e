/* cli/info.c — `atlas info` (placeholder until its module lands). */
#include <stdio.h>

#include "cli/cli.h"

int atlas_cli_info(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "atlas info: not implemented yet\n");
    return 1;
}

/* cli/template.c — `atlas template` (placeholder until its module lands). */
#include <stdio.h>

#include "cli/cli.h"

int atlas_cli_template(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "atlas template: not implemented yet\n");
    return 1;
}

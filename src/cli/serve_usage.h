/* cli/serve_usage.h — the text of `atlas serve --help`. */
#ifndef ATLAS_CLI_SERVE_USAGE_H
#define ATLAS_CLI_SERVE_USAGE_H

#include <stdio.h>

/* Writes the usage of `atlas serve` to f. */
void atlas_cli_serve_usage(FILE *f);

#endif

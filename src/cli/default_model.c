/* cli/default_model.c — where the subcommands find a model when no -m is given; a file of
 * its own so that the subcommands never call back into main.c's dispatcher. */
#include "cli/cli.h"

#ifndef ATLAS_SOURCE_DIR
#define ATLAS_SOURCE_DIR "."
#endif

const char *atlas_cli_default_model(void) { return ATLAS_SOURCE_DIR "/models/default"; }

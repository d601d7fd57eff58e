/* cli/default_model.h — the default model that is compiled into the atlas command
 * (cmake/embed_model.cmake), as an in-memory model directory (atlas/memdir.h). */
#ifndef ATLAS_CLI_DEFAULT_MODEL_H
#define ATLAS_CLI_DEFAULT_MODEL_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "atlas/memdir.h"

/* The path under which the embedded model is registered; atlas_cli_default_model()
 * (cli/cli.h) registers it on first use and returns it. */
#define ATLAS_CLI_DEFAULT_MODEL_DIR "@embedded/default"

/* The embedded files (*n of them): static data, the generated default_model_embed.c. */
const atlas_memdir_file *atlas_cli_embedded_files(size_t *n);

/* true when dir names the embedded default model. */
bool atlas_cli_is_default_model(const char *dir);

/* The JSON file dir/name parsed (the caller json_decref()s it), read from the embedded
 * bytes when dir is the default model: the front end cannot read a memory directory through
 * the file system.  NULL when it is missing or not JSON. */
json_t *atlas_cli_model_json(const char *dir, const char *name);

#endif

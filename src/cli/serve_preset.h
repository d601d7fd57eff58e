/* cli/serve_preset.h — `atlas serve --models-preset FILE`: a JSON file giving each model its
 * directory, aliases and settings (docs/SERVER.md, "The models file"). */
#ifndef ATLAS_CLI_SERVE_PRESET_H
#define ATLAS_CLI_SERVE_PRESET_H

#include "atlas/engine.h"

typedef struct serve_preset_model {
    atlas_engine_model m;  /* name, dir and settings (0: the flag's value) */
    const char **aliases;  /* [n_aliases] "ALIAS=NAME", as --alias takes them */
    int n_aliases;
    int load;              /* "load": 1 load at start, 0 not, -1 not said */
    int matryoshka[ATLAS_ENGINE_MAX_MATRYOSHKA]; /* "matryoshka_dimensions" (m points here) */
} serve_preset_model;

typedef struct serve_preset {
    serve_preset_model *models; /* [n] */
    int n;
    char **strings;             /* every string above, owned */
    int n_strings, cap_strings;
} serve_preset;

/* Reads FILE into *out (the caller's: serve_preset_free, also after a failure).  Returns 0,
 * or -1 after saying on stderr what is wrong and where (the field, as models[i].key). */
int serve_preset_read(const char *path, serve_preset *out);
void serve_preset_free(serve_preset *p);

#endif

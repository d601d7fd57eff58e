/* cli/progress.h — what a model load looks like on the terminal: a bar redrawn in place on
 * stderr (bytes read of the total, GB/s, time left) once a load has taken half a second,
 * when stderr is a terminal; then, terminal or not, one line when it is done:
 *   atlas: loaded NAME: 16.1 GB in 4.2 s (3.8 GB/s), cuda:0
 * The library reports the bytes (atlas_model_params.progress, atlas_engine_params.
 * load_progress); this draws them. */
#ifndef ATLAS_CLI_PROGRESS_H
#define ATLAS_CLI_PROGRESS_H

#include <stdint.h>
#include <stdio.h>

typedef struct atlas_cli_progress atlas_cli_progress;

/* Draws on out (a bar only when it is a terminal). NULL when out of memory; the caller
 * frees it with atlas_cli_progress_free (NULL: nothing). */
atlas_cli_progress *atlas_cli_progress_new(FILE *out);
void atlas_cli_progress_free(atlas_cli_progress *p);

/* A load of model `name` starts now (its clock starts here: creating the backend counts). */
void atlas_cli_progress_begin(atlas_cli_progress *p, const char *name);

/* atlas_engine_params.load_progress (user: the atlas_cli_progress): bytes done of total.
 * Any thread, one call at a time (the library's promise); redraws at most ten times a
 * second. A report with no begin (a load the engine starts by itself) begins one. */
void atlas_cli_progress_report(void *user, const char *model, uint64_t done, uint64_t total);

/* The load begun last is over: clears the bar and prints the line above with device
 * ("cuda:0", "cpu") when it succeeded (ok), nothing else when it failed. */
void atlas_cli_progress_end(atlas_cli_progress *p, int ok, const char *device);

/* Draws nothing from now on (a server whose stderr has become its log). */
void atlas_cli_progress_mute(atlas_cli_progress *p);

/* Lines as JSON objects ({"time", "level": "info", "msg"}) instead, and no bar: for a
 * server whose log is JSON (atlas serve --log-format json). */
void atlas_cli_progress_json(atlas_cli_progress *p);

/* One line "atlas: MSG" (or its JSON object) on the progress's stream, clear of any bar. */
void atlas_cli_progress_say(atlas_cli_progress *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif

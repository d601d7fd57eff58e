/* cli/startup.h — `atlas serve`'s start-up in its log: when each phase ended, in seconds
 * after the process started (from /proc/self/stat, so that exec and the dynamic loader
 * count), so that a slow start says where its time went.  The lines, at INFO:
 *   start: host: driver 0.041 s, cuInit 0.118 s, context 0.231 s, streams 0.232 s,
 *     cuBLASLt 0.170 s, staging 0.402 s
 *   start: model NAME: checked 0.011 s, begin 0.012 s, config 0.012 s, files 0.013 s,
 *     backend 0.241 s, weights 0.720 s, kv 0.731 s, ready 0.733 s, tokenizer 0.350 s
 * ("checked": the models' checks were over and the start's loads were asked for; "tokenizer":
 * the model's tokenizer and template were there for its first request, never before
 * "checked", since the thread that waits for them starts with the load)
 *   start: listening 0.760 s
 * and the server's own "start: first answer 1.020 s after the process started" at the first
 * request answered (atlas_server_params.start_ms).  bench/gpu/start.sh reads them. */
#ifndef ATLAS_CLI_STARTUP_H
#define ATLAS_CLI_STARTUP_H

#include "atlas/engine.h"
#include "atlas/server.h"

enum { ATLAS_CLI_STARTUP_MODELS = 64 };

typedef struct atlas_cli_startup {
    double t0;        /* the process's start, ms of CLOCK_MONOTONIC */
    int n_models;
    const char *names[ATLAS_CLI_STARTUP_MODELS];
    int loaded[ATLAS_CLI_STARTUP_MODELS];               /* its first load's times are in */
    atlas_model_load_times load[ATLAS_CLI_STARTUP_MODELS];
    double tokenizer[ATLAS_CLI_STARTUP_MODELS];         /* tokenizer and template parsed */
    double checked;   /* the models' checks ended: the start's loads are asked for */
} atlas_cli_startup;

/* The process's start in ms of CLOCK_MONOTONIC: /proc/self/stat's start time (clock ticks
 * since boot) carried over from CLOCK_BOOTTIME; where that cannot be read, now. */
double atlas_cli_process_start_ms(void);

/* ms of CLOCK_MONOTONIC now. */
double atlas_cli_now_ms(void);

/* Keeps the times of a LOADED event of a model in names[] (its first only). */
void atlas_cli_startup_note(atlas_cli_startup *su, const atlas_residency_event *ev);

/* Writes the lines above to the server's log; listening: when the server began answering. */
void atlas_cli_startup_log(const atlas_cli_startup *su, atlas_server *server, double listening);

#endif

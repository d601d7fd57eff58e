/* server/state.h — struct atlas_server: the state that every request sees (the engine, the
 * parameters, the stop flag, the id counter, the server's metrics).  server.c fills it at
 * start and frees it at stop; the request paths (api*.c, gen.c, format.c) read it, and
 * change only the atomics and the metrics (under their lock).  Internal to src/server. */
#ifndef ATLAS_SERVER_STATE_H
#define ATLAS_SERVER_STATE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "atlas/server.h"
#include "server/http.h"
#include "server/listen.h"
#include "server/log.h"
#include "server/metrics.h"

struct atlas_server {
    atlas_http *http;
    atlas_engine *engine;
    char *host;
    char *api_key;
    size_t api_key_len;
    char *cors;                   /* atlas_server_params.cors, copied */
    char **aliases;               /* atlas_server_params.aliases, copied ("NAME=MODEL") */
    int n_aliases;
    char *allowed_hosts;          /* atlas_server_params.allowed_hosts, copied (NULL: none) */
    atlas_server_params p;
    atomic_bool stopping;
    atomic_uint_fast64_t next_id; /* for "chatcmpl-..." ids */
    int64_t created;              /* unix time the server started: /v1/models "created" */
    atlas_server_metrics metrics;
    atlas_log *log;               /* the access log and the server's own lines */
    atlas_listen listen;          /* bound at create; handed to the daemon by serve */
    struct atlas_respstore *responses; /* stored /v1/responses (respstore.h) */
    struct atlas_gen_waker *waker; /* wakes the workers waiting for events (gen.h); NULL: the
                                      engine's thread wakes them itself */
};

#endif

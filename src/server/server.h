/* server/server.h — the OpenAI-compatible HTTP server over an engine.  Internal: used by
 * `atlas serve` (cli/serve.c) and the server tests.
 *
 * The server is a client of the engine like the CLI: it tokenizes, renders chat templates,
 * submits token ids and turns the engine's token events into OpenAI JSON or SSE chunks.
 * HTTP is libmicrohttpd with one thread per connection (keep-alive); a request's thread
 * waits on its own event queue, so a slow client never blocks the engine thread. */
#ifndef ATLAS_SERVER_H
#define ATLAS_SERVER_H

#include <stdbool.h>
#include <stddef.h>

#include "atlas/status.h"

typedef struct atlas_server atlas_server;
typedef struct atlas_engine atlas_engine; /* include/atlas/engine.h */

typedef struct atlas_server_params {
    const char *host;       /* numeric IPv4 or IPv6 address; default "127.0.0.1" */
    int port;               /* 0: any free port (atlas_server_port says which); default 8080 */
    const char *api_key;    /* NULL: no key; else every route but /health needs
                               "Authorization: Bearer KEY" */
    size_t max_body;        /* bytes of a request body; larger: 413 (default 4 MiB) */
    int max_connections;    /* open connections at once (default 512) */
    int timeout_s;          /* idle / unfinished-request timeout, seconds (default 30) */
    const char *cors;       /* origins whose browser pages may call the API (CORS): "local"
                               (default: http(s) pages of localhost, 127.0.0.1 and [::1], any
                               port, as Ollama), "*" (any), "none", or a comma-separated list
                               of exact origins ("https://app.example.com,http://host:3000") */
    bool reasoning;         /* chat: a thinking template's "<think>...</think>" is answered as
                               "reasoning_content", not content (default true; llama.cpp's
                               --reasoning-format auto) */
} atlas_server_params;

atlas_server_params atlas_server_default_params(void);

/* Starts listening.  The engine must outlive the server; the strings in p are copied. */
atlas_status atlas_server_start(atlas_engine *engine, const atlas_server_params *p,
                                atlas_server **out);

/* The bound TCP port (useful after asking for port 0). */
int atlas_server_port(const atlas_server *s);

/* Stops accepting, ends every open request (streams get a last chunk and close; their
 * engine requests are cancelled), joins the connection threads and frees s.  NULL: no-op. */
void atlas_server_stop(atlas_server *s);

#endif

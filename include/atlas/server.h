/* atlas/server.h — the OpenAI-compatible HTTP server over an engine: what `atlas serve`
 * starts, and the public way for any program to serve an engine over HTTP.
 *
 * The server is a client of the engine like the CLI: it tokenizes, renders chat templates,
 * submits token ids and turns the engine's token events into OpenAI JSON or SSE chunks.
 * HTTP is libmicrohttpd (HTTPS with a certificate): epoll threads read every connection, so
 * an idle or slow one holds no thread, and a worker thread answers each request whose body
 * is in, waiting on its own event queue, so a slow client never blocks the engine thread.
 *
 * Routes: POST /v1/chat/completions, POST /v1/completions, POST /v1/messages and
 * /v1/messages/count_tokens (Anthropic's Messages), GET /v1/models,
 * GET /v1/models/{id}, POST /v1/models/{id}/load and /unload, GET /health, GET /metrics
 * (Prometheus), POST /tokenize, /detokenize and /apply-template; OpenAI's Responses API:
 * POST /v1/responses, GET and DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items.
 *
 * Threads: start and stop one server from one thread (not concurrently with each other);
 * atlas_server_port may be called from any thread while the server lives.  The server's
 * own threads only ever call the engine's thread-safe functions. */
#ifndef ATLAS_SERVER_H
#define ATLAS_SERVER_H

#include <stdbool.h>
#include <stddef.h>

#include "atlas/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct atlas_server atlas_server;
typedef struct atlas_engine atlas_engine; /* atlas/engine.h */

/* The server's log: what it says about itself and one line per request answered (its
 * method, path, model, status, tokens in and out, time to the first token, total time and
 * the client's address; never an API key, a header or a prompt or answer's text). */
typedef enum atlas_log_level {
    ATLAS_LOG_ERROR = 0, /* failures of the server itself; requests answered 5xx */
    ATLAS_LOG_WARN,      /* requests answered 4xx */
    ATLAS_LOG_INFO,      /* every request; what the server loaded and where it listens */
    ATLAS_LOG_DEBUG,     /* and each request as it arrives, before it is answered */
} atlas_log_level;

typedef enum atlas_log_format {
    ATLAS_LOG_TEXT = 0, /* "2025-01-31T12:00:00.123Z info POST /v1/... model=NAME status=200 ..." */
    ATLAS_LOG_JSON,     /* one JSON object a line */
} atlas_log_format;

typedef struct atlas_server_params {
    const char *host;       /* address or name to listen on, resolved with getaddrinfo
                               ("localhost", "::", "0.0.0.0"; IPv4 addresses tried first,
                               the first that binds is kept); default "127.0.0.1" */
    int port;               /* 0: any free port (atlas_server_port says which); default 8080 */
    const char *api_key;    /* NULL: no key; else every route but /health needs
                               "Authorization: Bearer KEY" or "x-api-key: KEY" */
    size_t max_body;        /* bytes of a request body; larger: 413 (default 4 MiB) */
    int max_connections;    /* open connections at once (default 2048) */
    int max_connections_per_ip; /* open connections from one source address (default 256:
                               the engine's default queue; 0: no cap) */
    int timeout_s;          /* idle timeout, seconds (default 30) */
    int header_timeout_s;   /* a new connection's request headers must be in within this
                               many seconds, however they trickle (default 10) */
    int body_timeout_s;     /* a request's body must be in within this many seconds of its
                               headers (default 60) */
    const char *ssl_certfile; /* PEM certificate (chain) and its key: serve HTTPS, TLS 1.2 */
    const char *ssl_keyfile;  /* or 1.3 only; both or neither (default NULL: plain HTTP) */
    const char *cors;       /* origins whose browser pages may call the API (CORS): "local"
                               (default: http(s) pages of localhost, 127.0.0.1 and [::1], any
                               port, as Ollama), "*" (any), "none", or a comma-separated list
                               of exact origins ("https://app.example.com,http://host:3000") */
    const char *allowed_hosts; /* Host headers answered besides the loopback names and the
                               bound address (comma-separated names, any port; "*": any).
                               Bound to loopback, any other Host is refused with 403 (a DNS
                               rebinding page); bound elsewhere, only these when given.
                               Default NULL */
    const char *const *aliases; /* [n_aliases] "NAME=MODEL": a request naming NAME (or, for
                               a NAME ending in '*', any name it begins) goes to the served
                               model MODEL, as clients that ask for models of their own names
                               (Claude Code: a main and a small one) need.  A served model's
                               own name wins.  Default none */
    int n_aliases;
    bool reasoning;         /* chat: a thinking template's "<think>...</think>" is answered as
                               "reasoning_content", not content (default true; llama.cpp's
                               --reasoning-format auto) */
    int responses_max;      /* /v1/responses kept for previous_response_id and GET, newest
                               first (default 1024; 0: none is stored) */
    int responses_ttl_s;    /* seconds a stored response is kept (default 3600) */
    int log_fd;             /* where the log goes, one write(2) a line (e.g. 2: stderr);
                               -1 (default): nowhere */
    atlas_log_format log_format; /* default ATLAS_LOG_TEXT */
    atlas_log_level log_level;   /* lines of this level and more severe (default INFO) */
    double start_ms;        /* when the process started, in ms of CLOCK_MONOTONIC: the first
                               answer to a request for a model is logged ("start: first answer
                               ...") with the seconds since; 0 (default): no such line */
} atlas_server_params;

/* The defaults above.  Pure; thread-safe. */
ATLAS_API atlas_server_params atlas_server_default_params(void);

/* The server in two steps, so that a port in use or a host that does not resolve is found
 * before a model is loaded: atlas_server_create checks p, opens the log and binds the
 * listening socket (connections then wait in its backlog, unanswered); atlas_server_serve
 * starts answering them with engine (borrowed: it must outlive the server).  *out is the
 * caller's (atlas_server_stop, in either state).  create fails as start does below (the
 * socket's errors too); serve with ATLAS_ERR_INVALID when s already serves, or as the
 * transport fails (HTTPS's certificate or key, ATLAS_ERR_IO). */
ATLAS_API atlas_status atlas_server_create(const atlas_server_params *p, atlas_server **out);
ATLAS_API atlas_status atlas_server_serve(atlas_server *s, atlas_engine *engine);

/* The bound address, numeric ("127.0.0.1", "::1"), and whether it is a loopback one.
 * Thread-safe while s lives (from create on). */
ATLAS_API const char *atlas_server_address(const atlas_server *s);
ATLAS_API bool atlas_server_loopback(const atlas_server *s);

/* Starts listening and serving engine; *out is owned by the caller (atlas_server_stop).
 * engine is borrowed: it must outlive the server.  The strings in p are copied (p may be
 * freed after the call); NULL p: the defaults.  Fails with ATLAS_ERR_INVALID or
 * ATLAS_ERR_RANGE for a bad parameter or a host that does not resolve, ATLAS_ERR_IO when the
 * address cannot be bound; *out stays NULL then.  atlas_server_create, then
 * atlas_server_serve. */
ATLAS_API atlas_status atlas_server_start(atlas_engine *engine, const atlas_server_params *p,
                                          atlas_server **out);

/* Writes a line of the caller's to the server's log (what `atlas serve` says at start and
 * at stop), printf-style, in the log's format, labelled level, whatever log_level filters
 * (it filters the request lines): where the server listens is always said.  Thread-safe
 * while s lives. */
ATLAS_API void atlas_server_log(atlas_server *s, atlas_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Writes a model's residency event (atlas/engine.h: a load with its time and size, a
 * release, a swap, a failed load with why, a drain) to the server's log, whatever
 * log_level filters: what an engine's on_residency hands it.  In JSON the line has "event"
 * ("model_loaded", "model_load_failed", "model_released", "model_draining"), "model",
 * "reason", "for", "duration_ms", "swap_ms", "bytes", "running" and "error" where they
 * apply.  Thread-safe while s lives (from create on). */
typedef struct atlas_residency_event atlas_residency_event; /* atlas/engine.h */
ATLAS_API void atlas_server_log_residency(atlas_server *s, const atlas_residency_event *ev);

/* The bound TCP port (useful after asking for port 0).  Thread-safe while s lives. */
ATLAS_API int atlas_server_port(const atlas_server *s);

/* Stops accepting, ends every open request (streams get a last chunk and close; their
 * engine requests are cancelled), joins the server's threads and frees s.  Blocks for up
 * to a few seconds while requests in flight answer.  Call once, from the thread that owns
 * s, never from a request's own thread.  NULL: no-op. */
ATLAS_API void atlas_server_stop(atlas_server *s);

#ifdef __cplusplus
}
#endif
#endif

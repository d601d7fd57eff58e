/* server/http_conn.h — the transport's inside (http.c and http_conn.c only): the daemon's
 * state, the deadlines of each connection, the workers that run dispatch, and the pump that
 * carries a stream's bytes from its worker to the connection.  Internal to src/server. */
#ifndef ATLAS_SERVER_HTTP_CONN_H
#define ATLAS_SERVER_HTTP_CONN_H

#include <pthread.h>
#include <stdatomic.h>

#include <microhttpd.h>

#include "server/http.h"

typedef struct atlas_http_conn atlas_http_conn;

/* Where a connection is, for its deadline: reading a request's headers (a new connection:
 * header_timeout_s from its accept), its body (body_timeout_s from the headers), answering
 * (no deadline: the idle timeout and the dispatch function rule), or kept alive between
 * requests (the next request's headers by timeout_s + header_timeout_s). */
typedef enum atlas_http_phase {
    ATLAS_HTTP_HEADERS, ATLAS_HTTP_BODY, ATLAS_HTTP_BUSY, ATLAS_HTTP_IDLE
} atlas_http_phase;

/* What happens to a call after its body is in. */
enum { ATLAS_HTTP_STAGE_READING, ATLAS_HTTP_STAGE_QUEUED, ATLAS_HTTP_STAGE_READY };

struct atlas_http {
    struct MHD_Daemon *mhd;
    atlas_http_dispatch dispatch;
    void *ctx;
    char *cors;        /* atlas_http_params.cors, copied */
    size_t max_body;
    int timeout_s, header_timeout_s, body_timeout_s;
    int port;
    bool tls;
    char log[256];     /* libmicrohttpd's last message, for a failed start */
    atlas_log *access; /* atlas_http_params.log */
    /* connections and their deadlines (http_conn.c) */
    pthread_mutex_t cmu;
    pthread_cond_t ccv;
    atlas_http_conn *conns;
    pthread_t sweeper;
    bool sweeping, sweep_stop;
    /* workers (http_conn.c) */
    pthread_mutex_t wmu;
    pthread_cond_t wcv;
    atlas_http_call *jobs, *jobs_tail;
    int n_jobs, n_workers, n_idle, max_workers;
    pthread_t *workers;
    atomic_bool wstop;
    atomic_int in_flight; /* calls handed to a worker whose response is not done yet */
    bool sync_ok;      /* the locks above were made */
};

/* Makes the locks, the worker table and the sweeper thread. */
atlas_status atlas_http_conn_init(atlas_http *h, int max_workers);
/* Joins the workers (every queued call is answered first); with the daemon stopped, the
 * sweeper; frees what conn_init made. */
void atlas_http_workers_stop(atlas_http *h);
void atlas_http_conn_fini(atlas_http *h);

/* libmicrohttpd's MHD_OPTION_NOTIFY_CONNECTION callback: registers and forgets connections. */
void atlas_http_on_connection(void *cls, struct MHD_Connection *conn, void **socket_ctx,
                              enum MHD_ConnectionNotificationCode code);
void atlas_http_set_phase(struct MHD_Connection *conn, atlas_http_phase phase);
/* The phase's deadline in seconds; 0: none. */
double atlas_http_phase_limit(const atlas_http *h, atlas_http_phase phase);

/* Queues c (suspended by the caller) for a worker, which runs dispatch into c->reply, makes
 * a pump for a stream, sets c->stage READY and resumes the connection.  False when the
 * workers are stopping or none could be started. */
bool atlas_http_submit(atlas_http *h, atlas_http_call *c);

/* A stream's content reader and its free callback (libmicrohttpd's), over c->pump. */
ssize_t atlas_http_pump_read(void *cls, uint64_t pos, char *buf, size_t max);
void atlas_http_pump_free(void *cls);

#endif

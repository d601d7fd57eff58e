/* server/http_conn.c — what keeps the transport answering under load: a deadline on every
 * connection's headers and body (a sweeper thread shuts down the socket of one past it, as
 * a client trickling a byte a second never trips an idle timeout), workers that run the
 * blocking dispatch function while the connection is suspended (so the epoll threads never
 * wait), and a pump per stream between its worker and libmicrohttpd's content reader. */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/http_conn.h"

enum {
    SWEEP_MS = 100,           /* how late past its deadline a connection may be cut */
    PUMP_CHUNK = 16 * 1024,   /* bytes a stream read asks for */
    PUMP_MAX = 1 << 20,       /* bytes a stream may run ahead of a client that does not read */
};

struct atlas_http_conn {
    atlas_http_conn *prev, *next;
    atlas_http *h;
    int fd;
    atlas_http_phase phase;
    double since;   /* when the phase began */
    bool cut;       /* shut down already */
};

/* A stream between its worker (which reads it, blocking) and the connection (whose content
 * reader must not block: with nothing buffered it suspends the connection, and the worker
 * resumes it when bytes come). */
typedef struct atlas_http_pump {
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* room in buf */
    atlas_http_stream s;
    atlas_http *h;
    struct MHD_Connection *conn;
    int fd;                 /* the connection's socket, to uncork */
    int gen_fd;             /* the call's duplicate of it, which the stream polls; ours */
    char *buf;
    size_t off, len, cap;
    bool ended, failed;     /* no more bytes will come (failed: drop the connection) */
    bool closed;            /* libmicrohttpd is done with the response */
    bool waiting;           /* the reader suspended the connection */
    int refs;               /* the worker's and the response's */
} atlas_http_pump;

static void cond_init_mono(pthread_cond_t *cv) {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}

static void wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += ms * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(cv, mu, &ts);
}

/* The clock of atlas_http_now (http.c, which calls this file and so is not called back). */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* --- connections and deadlines ----------------------------------------------------------- */

double atlas_http_phase_limit(const atlas_http *h, atlas_http_phase phase) {
    switch (phase) {
    case ATLAS_HTTP_HEADERS: return h->header_timeout_s;
    case ATLAS_HTTP_BODY: return h->body_timeout_s;
    case ATLAS_HTTP_IDLE: return h->timeout_s + h->header_timeout_s;
    case ATLAS_HTTP_BUSY: break;
    }
    return 0;
}

void atlas_http_on_connection(void *cls, struct MHD_Connection *conn, void **socket_ctx,
                              enum MHD_ConnectionNotificationCode code) {
    atlas_http *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        atlas_http_conn *c = calloc(1, sizeof *c);
        *socket_ctx = c;
        if (!c) return; /* out of memory: it goes without a deadline, but is served */
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        c->h = h;
        c->fd = ci ? ci->connect_fd : -1;
        c->phase = ATLAS_HTTP_HEADERS;
        c->since = now_s();
        pthread_mutex_lock(&h->cmu);
        c->next = h->conns;
        if (h->conns) h->conns->prev = c;
        h->conns = c;
        pthread_mutex_unlock(&h->cmu);
        return;
    }
    atlas_http_conn *c = *socket_ctx;
    if (!c) return;
    /* under the lock: the sweeper never shuts down a socket that is being closed (its
     * number could be another connection's by then) */
    pthread_mutex_lock(&h->cmu);
    if (c->prev) c->prev->next = c->next;
    else h->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    pthread_mutex_unlock(&h->cmu);
    free(c);
    *socket_ctx = NULL;
}

void atlas_http_set_phase(struct MHD_Connection *conn, atlas_http_phase phase) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    atlas_http_conn *c = ci ? ci->socket_context : NULL;
    if (!c) return;
    pthread_mutex_lock(&c->h->cmu);
    c->phase = phase;
    c->since = now_s();
    pthread_mutex_unlock(&c->h->cmu);
}

/* Shuts down the socket of every connection past its phase's deadline: libmicrohttpd's
 * thread then reads the end of the stream and closes the connection itself. */
static void *sweep_main(void *arg) {
    atlas_http *h = arg;
    pthread_mutex_lock(&h->cmu);
    while (!h->sweep_stop) {
        wait_ms(&h->ccv, &h->cmu, SWEEP_MS);
        double now = now_s();
        for (atlas_http_conn *c = h->conns; c; c = c->next) {
            double limit = atlas_http_phase_limit(h, c->phase);
            if (c->cut || c->fd < 0 || limit <= 0 || now - c->since <= limit) continue;
            shutdown(c->fd, SHUT_RDWR);
            c->cut = true;
        }
    }
    pthread_mutex_unlock(&h->cmu);
    return NULL;
}

/* --- workers ------------------------------------------------------------------------------- */

static void pump_unref(atlas_http_pump *p) {
    pthread_mutex_lock(&p->mu);
    int left = --p->refs;
    pthread_mutex_unlock(&p->mu);
    if (left > 0) return;
    if (p->gen_fd >= 0) close(p->gen_fd);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->buf);
    free(p);
}

/* Under p->mu: bytes (or the end) are there; wake the connection if its reader waits. */
static void pump_wake(atlas_http_pump *p) {
    if (!p->waiting || p->closed) return;
    p->waiting = false;
    MHD_resume_connection(p->conn);
}

static bool pump_append(atlas_http_pump *p, const char *src, size_t n) {
    if (p->off) {
        memmove(p->buf, p->buf + p->off, p->len - p->off);
        p->len -= p->off;
        p->off = 0;
    }
    if (p->len + n > p->cap) {
        size_t want = p->cap ? p->cap * 2 : PUMP_CHUNK;
        while (want < p->len + n) want *= 2;
        char *grown = realloc(p->buf, want);
        if (!grown) return false;
        p->buf = grown;
        p->cap = want;
    }
    memcpy(p->buf + p->len, src, n);
    p->len += n;
    return true;
}

/* The worker's side of a stream: reads it until it ends, the client is gone, or (at stop)
 * a client that does not read holds it back; then closes it. */
static void pump_run(atlas_http_pump *p) {
    char *tmp = malloc(PUMP_CHUNK);
    for (bool done = !tmp; !done;) {
        pthread_mutex_lock(&p->mu);
        while (!p->closed && p->len - p->off >= PUMP_MAX && !atomic_load(&p->h->wstop))
            wait_ms(&p->cv, &p->mu, SWEEP_MS);
        done = p->closed || p->len - p->off >= PUMP_MAX;
        pthread_mutex_unlock(&p->mu);
        if (done) break;
        ssize_t n = p->s.read(p->s.ctx, tmp, PUMP_CHUNK);
        pthread_mutex_lock(&p->mu);
        if (n > 0 && !pump_append(p, tmp, (size_t)n)) n = ATLAS_HTTP_STREAM_ERROR;
        if (n <= 0) {
            p->ended = true;
            p->failed = n != ATLAS_HTTP_STREAM_END;
        }
        if (n != 0) pump_wake(p);
        done = p->ended;
        pthread_mutex_unlock(&p->mu);
    }
    pthread_mutex_lock(&p->mu);
    if (!p->ended) {
        p->ended = p->failed = true;
        pump_wake(p);
    }
    pthread_mutex_unlock(&p->mu);
    free(tmp);
    p->s.close(p->s.ctx);
    pump_unref(p);
}

ssize_t atlas_http_pump_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    atlas_http_pump *p = cls;
    pthread_mutex_lock(&p->mu);
    size_t n = p->len - p->off;
    if (n) {
        if (n > max) n = max;
        memcpy(buf, p->buf + p->off, n);
        p->off += n;
        if (p->off == p->len) p->off = p->len = 0;
        pthread_cond_signal(&p->cv);
        pthread_mutex_unlock(&p->mu);
        /* Each event goes out now: libmicrohttpd corks the socket while it builds a response
         * of unknown size, which would hold tokens back by up to 200 ms. */
        int off = 0, on = 1;
        setsockopt(p->fd, IPPROTO_TCP, TCP_CORK, &off, sizeof off);
        setsockopt(p->fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
        return (ssize_t)n;
    }
    if (p->ended) {
        bool failed = p->failed;
        pthread_mutex_unlock(&p->mu);
        return failed ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
    }
    p->waiting = true; /* the worker resumes the connection when bytes come */
    MHD_suspend_connection(p->conn);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

void atlas_http_pump_free(void *cls) {
    atlas_http_pump *p = cls;
    pthread_mutex_lock(&p->mu);
    p->closed = true;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pump_unref(p);
}

static atlas_http_pump *pump_new(atlas_http_call *c, atlas_http_stream s) {
    atlas_http_pump *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    pthread_mutex_init(&p->mu, NULL);
    cond_init_mono(&p->cv);
    p->s = s;
    p->h = c->http;
    p->conn = c->conn;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    p->fd = ci ? ci->connect_fd : -1;
    p->gen_fd = c->fd; /* the stream polls it until its close: it lives as long */
    c->fd = -1;
    p->refs = 2; /* the worker's, and the response's */
    return p;
}

/* Runs dispatch for c, then hands the reply back to the connection's thread. */
static void run_call(atlas_http *h, atlas_http_call *c) {
    atlas_http_reply *r = c->reply;
    h->dispatch(h->ctx, c, r);
    atlas_http_pump *p = NULL;
    if (r->stream.read) {
        p = pump_new(c, r->stream);
        if (!p) {
            r->stream.close(r->stream.ctx);
            free(r->body);
            r->body = strdup("out of memory\n");
            r->len = r->body ? strlen(r->body) : 0;
            r->status = 500;
            r->ctype = "text/plain";
        }
        r->stream = (atlas_http_stream){0};
        c->pump = p; /* send_reply makes it the response's body */
    }
    struct MHD_Connection *conn = c->conn;
    c->stage = ATLAS_HTTP_STAGE_READY;
    MHD_resume_connection(conn); /* c belongs to the connection's thread from here */
    if (p) pump_run(p);
}

static void *worker_main(void *arg) {
    atlas_http *h = arg;
    pthread_mutex_lock(&h->wmu);
    for (;;) {
        h->n_idle++;
        while (!h->jobs && !atomic_load(&h->wstop)) pthread_cond_wait(&h->wcv, &h->wmu);
        h->n_idle--;
        atlas_http_call *c = h->jobs;
        if (!c) break; /* stopping, and every queued call answered */
        h->jobs = c->next_job;
        if (!h->jobs) h->jobs_tail = NULL;
        h->n_jobs--;
        pthread_mutex_unlock(&h->wmu);
        run_call(h, c);
        pthread_mutex_lock(&h->wmu);
    }
    pthread_mutex_unlock(&h->wmu);
    return NULL;
}

bool atlas_http_submit(atlas_http *h, atlas_http_call *c) {
    pthread_mutex_lock(&h->wmu);
    bool ok = !atomic_load(&h->wstop);
    if (ok && h->n_jobs + 1 > h->n_idle && h->n_workers < h->max_workers) {
        /* no worker free: one more (they stay for later requests) */
        if (pthread_create(&h->workers[h->n_workers], NULL, worker_main, h) == 0)
            h->n_workers++;
    }
    ok = ok && h->n_workers > 0;
    if (ok) {
        c->next_job = NULL;
        if (h->jobs_tail) h->jobs_tail->next_job = c;
        else h->jobs = c;
        h->jobs_tail = c;
        h->n_jobs++;
        c->stage = ATLAS_HTTP_STAGE_QUEUED;
        pthread_cond_signal(&h->wcv);
    }
    pthread_mutex_unlock(&h->wmu);
    return ok;
}

/* --- start and stop --------------------------------------------------------------------------- */

atlas_status atlas_http_conn_init(atlas_http *h, int max_workers) {
    pthread_mutex_init(&h->cmu, NULL);
    pthread_mutex_init(&h->wmu, NULL);
    cond_init_mono(&h->ccv);
    pthread_cond_init(&h->wcv, NULL);
    atomic_init(&h->wstop, false);
    atomic_init(&h->in_flight, 0);
    h->sync_ok = true;
    h->max_workers = max_workers;
    h->workers = calloc((size_t)max_workers, sizeof *h->workers);
    if (!h->workers) return atlas_fail(ATLAS_ERR_NOMEM, "server: out of memory");
    int err = pthread_create(&h->sweeper, NULL, sweep_main, h);
    if (err) return atlas_fail(ATLAS_ERR_INTERNAL, "server: no thread: %s", strerror(err));
    h->sweeping = true;
    return ATLAS_OK;
}

void atlas_http_workers_stop(atlas_http *h) {
    if (!h->sync_ok) return;
    pthread_mutex_lock(&h->wmu);
    atomic_store(&h->wstop, true);
    pthread_cond_broadcast(&h->wcv);
    int n = h->n_workers;
    pthread_mutex_unlock(&h->wmu);
    for (int i = 0; i < n; i++) pthread_join(h->workers[i], NULL);
}

void atlas_http_conn_fini(atlas_http *h) {
    if (!h->sync_ok) return;
    if (h->sweeping) {
        pthread_mutex_lock(&h->cmu);
        h->sweep_stop = true;
        pthread_cond_signal(&h->ccv);
        pthread_mutex_unlock(&h->cmu);
        pthread_join(h->sweeper, NULL);
    }
    free(h->workers);
    pthread_cond_destroy(&h->wcv);
    pthread_cond_destroy(&h->ccv);
    pthread_mutex_destroy(&h->wmu);
    pthread_mutex_destroy(&h->cmu);
}

/* server/gen.c — one generation: the engine request, its event queue, the waiting, and the
 * answer (a whole response, or the SSE stream handed to the transport).  Formatting the
 * events as OpenAI JSON lives in format.c, which this calls. */
#include "server/gen.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "atlas/engine.h"
#include "server/errors.h"
#include "server/gen_internal.h"

enum { POLL_MS = 50 }; /* how often a waiting thread looks at its client and the server */

/* --- the access log ------------------------------------------------------------------- */

/* Tokens and the time to the first token of gs[0..n) (choices of one request: their usage
 * already summed into gs[0]'s by the formatting when there are several) into rec. A stream
 * whose client left before the END has no usage: its prompt and the tokens made so far. */
static void note_usage(atlas_gen **gs, int n, const atlas_usage *u, atlas_log_request *rec) {
    bool none = !u->prompt_tokens && !u->completion_tokens;
    rec->tokens_in = none ? gs[0]->prompt_tokens : u->prompt_tokens;
    rec->tokens_out = none ? 0 : u->completion_tokens;
    double first = 0;
    for (int i = 0; i < n; i++) {
        pthread_mutex_lock(&gs[i]->mu);
        double t = gs[i]->t_first;
        if (none) rec->tokens_out += gs[i]->n_generated;
        pthread_mutex_unlock(&gs[i]->mu);
        if (t > 0 && (first == 0 || t < first)) first = t;
    }
    rec->ttft_ms = first > 0 ? (first - gs[0]->t_start) * 1e3 : -1;
}

/* --- the waker ------------------------------------------------------------------------- */

struct atlas_gen_waker {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atlas_gen **q;           /* the gens to wake, each holding a reference */
    size_t n, cap;
    bool idle, stop;
    pthread_t th;
};

static void gen_unref(atlas_gen *g);

/* Queues g (its reference taken by the caller) for a wake; false when the waker is stopping
 * or out of memory (the caller wakes it). Signals the waker only when it sleeps, so a
 * step's burst of tokens costs it one wake-up. */
static bool waker_push(atlas_gen_waker *w, atlas_gen *g) {
    pthread_mutex_lock(&w->mu);
    bool ok = !w->stop;
    if (ok && w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 256;
        atlas_gen **q = realloc(w->q, cap * sizeof *q);
        if (q) w->q = q, w->cap = cap;
        else ok = false;
    }
    if (ok) {
        w->q[w->n++] = g;
        if (w->idle) pthread_cond_signal(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return ok;
}

static void *waker_main(void *arg) {
    atlas_gen_waker *w = arg;
    atlas_gen **batch = NULL;
    size_t cap = 0;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->n && !w->stop) {
            w->idle = true;
            pthread_cond_wait(&w->cv, &w->mu);
            w->idle = false;
        }
        if (!w->n) break; /* stopping, and nothing left */
        atlas_gen **q = w->q; /* the list taken, the other one given for the next pushes */
        size_t n = w->n, qcap = w->cap;
        w->q = batch, w->cap = cap, w->n = 0;
        batch = q, cap = qcap;
        pthread_mutex_unlock(&w->mu);
        for (size_t i = 0; i < n; i++) {
            pthread_mutex_lock(&batch[i]->mu);
            pthread_cond_broadcast(&batch[i]->cv);
            pthread_mutex_unlock(&batch[i]->mu);
            gen_unref(batch[i]);
        }
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    free(batch);
    return NULL;
}

atlas_status atlas_gen_waker_start(atlas_gen_waker **out) {
    *out = NULL;
    atlas_gen_waker *w = calloc(1, sizeof *w);
    if (!w) return atlas_fail(ATLAS_ERR_NOMEM, "server: out of memory");
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    int err = pthread_create(&w->th, NULL, waker_main, w);
    if (err) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return atlas_fail(ATLAS_ERR_NOMEM, "server: starting the waker thread: %s",
                          strerror(err));
    }
    *out = w;
    return ATLAS_OK;
}

void atlas_gen_waker_stop(atlas_gen_waker *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->th, NULL); /* it wakes and drops what it still holds first */
    free(w->q);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

/* --- the engine side: copy each event into the queue --------------------------------- */

static void group_unref(atlas_gen_group *G) {
    pthread_mutex_lock(&G->mu);
    int left = --G->refs;
    pthread_mutex_unlock(&G->mu);
    if (left > 0) return;
    pthread_cond_destroy(&G->cv);
    pthread_mutex_destroy(&G->mu);
    free(G);
}

static void gen_unref(atlas_gen *g) {
    pthread_mutex_lock(&g->mu);
    int left = --g->refs;
    pthread_mutex_unlock(&g->mu);
    if (left > 0) return;
    if (g->group) group_unref(g->group);
    atlas_gen_event *e = g->head;
    while (e) {
        atlas_gen_event *next = e->next;
        free(e);
        e = next;
    }
    atlas_gen_format_free(g);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g->model);
    free(g->echo);
    free(g);
}

/* The per-model series: each token's gap, and at the end what the request came to. */
static void observe(atlas_gen *g, const atlas_event *ev, double t_first) {
    double now = atlas_http_now();
    if (ev->type == ATLAS_EVENT_TOKEN) atlas_itl_local_token(&g->itl, now);
    if (ev->type != ATLAS_EVENT_END) return;
    atlas_server_metrics_end(&g->srv->metrics, g->model, ev->queue_s, ev->ttft_s,
                             t_first > 0 ? now - t_first : -1, ev->usage.prompt_tokens,
                             ev->usage.cached_tokens, &g->itl);
}

static void on_event(const atlas_event *ev, void *user) {
    atlas_gen *g = user;
    bool end = ev->type == ATLAS_EVENT_END;
    size_t msg_len = end && ev->message ? strlen(ev->message) : 0;
    size_t stop_len = end && ev->stop_string ? strlen(ev->stop_string) : 0;
    int n_top = ev->type == ATLAS_EVENT_TOKEN && ev->n_top > 0 ? ev->n_top : 0;
    atlas_gen_event *e = calloc(1, sizeof *e + (size_t)n_top * sizeof(atlas_top_logprob) +
                                       ev->text_len + msg_len + stop_len + 3);
    if (e) {
        e->type = ev->type;
        e->id = ev->id;
        e->logprob = ev->logprob;
        e->n_top = n_top;
        if (n_top) memcpy(e->top, ev->top, (size_t)n_top * sizeof(atlas_top_logprob));
        e->text = (char *)(e->top + n_top);
        e->text_len = ev->text_len;
        if (ev->text_len) memcpy(e->text, ev->text, ev->text_len);
        e->message = e->text + ev->text_len + 1;
        if (msg_len) memcpy(e->message, ev->message, msg_len);
        if (end && ev->stop_string) { /* valid during the call only */
            e->stop_string = e->message + msg_len + 1;
            memcpy(e->stop_string, ev->stop_string, stop_len);
        }
        e->finish = ev->finish;
        e->stop_id = end ? ev->stop_id : -1;
        e->status = ev->status;
        e->usage = ev->usage;
        e->ttft_s = ev->ttft_s;
    }
    pthread_mutex_lock(&g->mu);
    if (!e) { /* out of memory: the request cannot go on */
        g->lost = true;
        if (ev->type != ATLAS_EVENT_END) g->cancel_asked = true;
    } else {
        e->t = atlas_http_now();
        if (ev->type == ATLAS_EVENT_TOKEN && g->t_first == 0) g->t_first = e->t;
        if (ev->type == ATLAS_EVENT_TOKEN) g->n_generated++;
        if (g->tail) g->tail->next = e;
        else g->head = e;
        g->tail = e;
    }
    observe(g, ev, g->t_first); /* before ended: g may be freed once it is seen */
    if (ev->type == ATLAS_EVENT_END) g->ended = true;
    /* a worker waiting for it is woken by the waker (holding a reference till then); one
     * that is not will find the event before it waits */
    bool hand = g->waiting > 0 && g->srv->waker;
    if (hand) g->refs++;
    else if (g->waiting > 0) pthread_cond_broadcast(&g->cv);
    atlas_gen_group *G = g->group;
    pthread_mutex_unlock(&g->mu);
    if (hand && !waker_push(g->srv->waker, g)) {
        pthread_mutex_lock(&g->mu);
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
        gen_unref(g);
    }
    if (G) { /* the leader may be waiting for any member */
        pthread_mutex_lock(&G->mu);
        pthread_cond_broadcast(&G->cv);
        pthread_mutex_unlock(&G->mu);
    }
    if (ev->type == ATLAS_EVENT_END) gen_unref(g); /* the engine's reference */
}

/* --- starting ---------------------------------------------------------------------------- */

/* A gen's or a group's lock and condition; the condition waits on the monotonic clock (the
 * SSE reader's timed waits must not jump with the wall clock). */
static void sync_init(pthread_mutex_t *mu, pthread_cond_t *cv) {
    pthread_mutex_init(mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}

/* Waits on cv for at most POLL_MS (the caller then looks at its client and the server). */
static void poll_wait(pthread_cond_t *cv, pthread_mutex_t *mu) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += POLL_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(cv, mu, &ts);
}

atlas_status atlas_gen_start(atlas_http_call *call, const atlas_gen_opts *o,
                             const atlas_gen_params *gp, const atlas_tokenizer *tok,
                             const int32_t *ids, size_t n_ids, atlas_gen **out) {
    *out = NULL;
    atlas_gen *g = calloc(1, sizeof *g);
    if (!g) {
        if (o->dialect && o->dialect->free) o->dialect->free(o->dialect_ctx);
        return atlas_fail(ATLAS_ERR_NOMEM, "request: out of memory");
    }
    sync_init(&g->mu, &g->cv);
    g->refs = 2;
    g->srv = call->ctx;
    g->fd = call->fd;
    g->o = *o;
    g->model = strdup(o->model);
    g->echo = o->echo ? strdup(o->echo) : NULL;
    g->o.model = g->model;
    g->o.echo = g->echo;
    g->tok = tok;
    g->t_start = call->t_start;
    g->log = call->log;
    g->call_log = &call->log;
    g->created = (int64_t)time(NULL);
    uint64_t n = atomic_fetch_add(&g->srv->next_id, 1);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(g->id, sizeof g->id, "%s%08llx%016llx", o->kind == ATLAS_API_CHAT ? "chatcmpl-" : "cmpl-",
             (unsigned long long)(n & 0xffffffffu),
             (unsigned long long)((uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec));
    atlas_status st = !g->model || (o->echo && !g->echo)
                          ? atlas_fail(ATLAS_ERR_NOMEM, "request: out of memory")
                          : atlas_gen_format_init(g, ids, n_ids);
    if (st != ATLAS_OK) {
        g->refs = 1;
        gen_unref(g);
        return st;
    }
    atlas_request req = {0};
    req.model = o->model;
    req.prompt = ids;
    req.n_prompt = n_ids;
    req.sampling = gp->sp;
    req.max_tokens = (int)gp->max_tokens;
    int ctx = 0; /* vLLM cuts the file's default to what the context leaves, too */
    if (gp->max_tokens_default &&
        atlas_engine_ctx_size(g->srv->engine, o->model, &ctx) == ATLAS_OK &&
        (size_t)ctx < n_ids + (size_t)req.max_tokens)
        req.max_tokens = (size_t)ctx > n_ids ? ctx - (int)n_ids : 0;
    req.stop = gp->stop;
    req.stop_ids = gp->stop_ids;
    req.n_stop_ids = gp->n_stop_ids;
    req.n_stop = gp->n_stop;
    req.logprobs = gp->logprobs;
    req.top_logprobs = gp->top_logprobs;
    req.ignore_eos = gp->ignore_eos;
    req.constraint = gp->constraint; /* copied by submit */
    req.cache_salt = gp->cache_salt;
    req.keep_alive_ms = gp->keep_alive_ms;
    req.think_budget = gp->think_budget;
    req.think_open = gp->think_open;
    req.n_think_open = gp->n_think_open;
    req.think_close = gp->think_close;
    req.n_think_close = gp->n_think_close;
    req.think_inside = gp->think_inside;
    g->prompt_tokens = (int)n_ids;
    pthread_mutex_lock(&g->srv->metrics.mu);
    g->srv->metrics.active_requests++;
    pthread_mutex_unlock(&g->srv->metrics.mu);
    g->counted = true;
    st = atlas_engine_submit(g->srv->engine, &req, on_event, g, &g->h);
    if (st != ATLAS_OK) {
        g->refs = 1; /* no callback will come */
        atlas_gen_release(g);
        return st;
    }
    *out = g;
    return ATLAS_OK;
}

atlas_status atlas_gen_group_make(atlas_gen **gs, int n, int per_prompt) {
    if (n < 2 || n > 16) return atlas_fail(ATLAS_ERR_INTERNAL, "stream group of %d", n);
    atlas_gen_group *G = calloc(1, sizeof *G);
    if (!G) return atlas_fail(ATLAS_ERR_NOMEM, "request: out of memory");
    sync_init(&G->mu, &G->cv);
    G->refs = n;
    G->n = n;
    G->per_prompt = per_prompt > 0 ? per_prompt : 1;
    for (int i = 0; i < n; i++) {
        G->members[i] = gs[i];
        pthread_mutex_lock(&gs[i]->mu); /* on_event reads g->group under it */
        gs[i]->group = G;
        gs[i]->index = i;
        pthread_mutex_unlock(&gs[i]->mu);
        memcpy(gs[i]->id, gs[0]->id, sizeof gs[i]->id); /* one stream, one id */
        gs[i]->created = gs[0]->created;
    }
    return ATLAS_OK;
}

/* --- the HTTP side ---------------------------------------------------------------------- */

atlas_gen_event *atlas_gen_next(atlas_gen *g, bool wait, bool *gone) {
    *gone = false;
    pthread_mutex_lock(&g->mu);
    for (;;) {
        atlas_gen_event *e = g->head;
        if (e) {
            g->head = e->next;
            if (!g->head) g->tail = NULL;
            pthread_mutex_unlock(&g->mu);
            return e;
        }
        if (g->ended && !g->head) break; /* only after the END was popped */
        bool cancel = g->cancel_asked;
        if (!wait) break;
        if (cancel || atomic_load(&g->srv->stopping) ||
            atlas_http_client_gone(g->fd)) {
            *gone = !cancel && !atomic_load(&g->srv->stopping);
            if (!g->cancel_sent) {
                g->cancel_sent = true;
                pthread_mutex_unlock(&g->mu);
                atlas_engine_cancel(g->h);
                pthread_mutex_lock(&g->mu);
            }
            if (*gone) break; /* nobody to write to: stop waiting */
        }
        g->waiting++;
        poll_wait(&g->cv, &g->mu);
        g->waiting--;
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

bool atlas_gen_has_event(atlas_gen *g) {
    pthread_mutex_lock(&g->mu);
    bool any = g->head != NULL;
    pthread_mutex_unlock(&g->mu);
    return any;
}

/* The request no longer counts as in flight (its last byte is out, or it was dropped). */
static void uncount(atlas_gen *g) {
    pthread_mutex_lock(&g->mu);
    bool was = g->counted;
    g->counted = false;
    pthread_mutex_unlock(&g->mu);
    if (!was) return;
    atlas_server_metrics *m = &g->srv->metrics;
    pthread_mutex_lock(&m->mu);
    m->active_requests--;
    pthread_mutex_unlock(&m->mu);
}

void atlas_gen_release(atlas_gen *g) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    bool running = !g->ended && !g->cancel_sent;
    g->cancel_sent = true;
    pthread_mutex_unlock(&g->mu);
    if (running && g->h) atlas_engine_cancel(g->h);
    atlas_engine_handle_free(g->h);
    g->h = NULL;
    uncount(g);
    gen_unref(g);
}

/* Waits until the first event is there (a token, or the end), so that a request that fails
 * before its first token (a model that cannot load) still gets a proper HTTP error. */
bool atlas_gen_wait_first(atlas_gen *g) {
    bool gone;
    pthread_mutex_lock(&g->mu);
    bool any = g->head != NULL;
    pthread_mutex_unlock(&g->mu);
    if (any) return true;
    atlas_gen_event *e = atlas_gen_next(g, true, &gone);
    if (!e) return false;
    pthread_mutex_lock(&g->mu); /* put it back at the front */
    e->next = g->head;
    g->head = e;
    if (!g->tail) g->tail = e;
    pthread_mutex_unlock(&g->mu);
    return true;
}

/* Cancels every member's engine request not yet ended (outside G->mu: a cancel may call
 * back at once). */
static void group_cancel(atlas_gen_group *G) {
    for (int i = 0; i < G->n; i++) {
        atlas_gen *m = G->members[i];
        pthread_mutex_lock(&m->mu);
        bool send = !m->ended && !m->cancel_sent;
        m->cancel_sent = true;
        pthread_mutex_unlock(&m->mu);
        if (send) atlas_engine_cancel(m->h);
    }
}

/* The next event of any member (round robin), *from its member; NULL when the client left
 * (*gone), the server stops, or a member lost an event (out of memory). */
static atlas_gen_event *group_next(atlas_gen_group *G, atlas_gen **from, bool *gone) {
    *gone = false;
    atlas_gen *lead = G->members[0];
    pthread_mutex_lock(&G->mu);
    for (;;) {
        bool lost = false;
        for (int k = 0; k < G->n; k++) {
            int i = (G->next + k) % G->n;
            if (G->taken_end[i]) continue;
            atlas_gen *m = G->members[i];
            pthread_mutex_lock(&m->mu);
            atlas_gen_event *e = m->head;
            if (e) {
                m->head = e->next;
                if (!m->head) m->tail = NULL;
            } else if (m->ended || m->cancel_asked) {
                lost = true; /* its END (or an event) was dropped for want of memory */
            }
            pthread_mutex_unlock(&m->mu);
            if (e) {
                if (e->type == ATLAS_EVENT_END) G->taken_end[i] = true;
                G->next = (i + 1) % G->n;
                pthread_mutex_unlock(&G->mu);
                *from = m;
                return e;
            }
        }
        bool stopping = atomic_load(&lead->srv->stopping);
        if (lost || stopping || atlas_http_client_gone(lead->fd)) {
            *gone = !lost && !stopping;
            pthread_mutex_unlock(&G->mu);
            group_cancel(G);
            return NULL;
        }
        poll_wait(&G->cv, &G->mu);
    }
}

/* A stream answers for g alone, or for every member of g's group. */
static void uncount_stream(atlas_gen *g) {
    if (!g->group) uncount(g);
    else
        for (int i = 0; i < g->group->n; i++) uncount(g->group->members[i]);
}

/* Releases the members other than the leader g (the stream held them). */
static void release_members(atlas_gen *g) {
    atlas_gen_group *G = g->group;
    for (int i = G ? G->n - 1 : 0; i > 0; i--) atlas_gen_release(G->members[i]);
}

/* The transport's stream reader: blocks (in the connection's own thread) until bytes are
 * ready; ATLAS_HTTP_STREAM_END after "data: [DONE]", STREAM_ERROR when the client left. */
static ssize_t sse_read(void *ctx, char *buf, size_t max) {
    atlas_gen *g = ctx;
    while (g->out_off == g->out_len) {
        g->out_off = g->out_len = 0;
        if (g->done_sent || (g->group && g->group->done)) {
            uncount_stream(g);
            return ATLAS_HTTP_STREAM_END;
        }
        bool gone;
        atlas_gen *m = g;
        atlas_gen_event *e = g->group ? group_next(g->group, &m, &gone)
                                      : atlas_gen_next(g, true, &gone);
        if (!e) {
            if (gone) {
                uncount_stream(g);
                return ATLAS_HTTP_STREAM_ERROR;
            }
            /* stopping, or the engine could not queue an event: end the stream properly */
            atlas_gen_format_abort(g, atomic_load(&g->srv->stopping)
                                          ? "the server is shutting down"
                                          : "the server ran out of memory");
            continue;
        }
        atlas_status st = atlas_gen_format_event(m, e);
        free(e);
        if (st == ATLAS_OK && m != g && m->out_len) { /* a member's chunks go out here */
            if (atlas_buf_printf(&g->out, &g->out_len, &g->out_cap, "%.*s", (int)m->out_len,
                                 m->out))
                st = atlas_fail(ATLAS_ERR_NOMEM, "SSE: out of memory");
            m->out_len = 0;
        }
        if (st != ATLAS_OK) return ATLAS_HTTP_STREAM_ERROR;
    }
    size_t n = g->out_len - g->out_off;
    if (n > max) n = max;
    memcpy(buf, g->out + g->out_off, n);
    g->out_off += n;
    return (ssize_t)n;
}

/* The response is done with the stream (finished, failed or the client left): cancels the
 * engine requests still running, releases the stream's references and writes the request's
 * access-log line (the status was 200: the stream began). */
static void sse_close(void *ctx) {
    atlas_gen *g = ctx;
    atlas_gen_group *G = g->group;
    g->log.status = 200;
    g->log.total_ms = (atlas_http_now() - g->t_start) * 1e3;
    note_usage(G ? G->members : &g, G ? G->n : 1, G ? &G->usage : &g->usage, &g->log);
    atlas_log_request_done(g->srv->log, &g->log);
    release_members(g);
    atlas_gen_release(g);
}

/* --- whole responses -------------------------------------------------------------------- */

/* Whether g's request was cancelled because its client left, not because the server stops:
 * the socket says so, or the cancel was the one atlas_gen_next sends when it sees the client
 * gone (a stream's first wait can see that, cancel, and leave the END it called back with
 * for collect_all): answered 499, to nobody, a client's doing. */
static bool client_left(atlas_gen *g) {
    if (atomic_load(&g->srv->stopping)) return false;
    pthread_mutex_lock(&g->mu);
    bool ours = g->cancel_sent && !g->lost;
    pthread_mutex_unlock(&g->mu);
    return ours || atlas_http_client_gone(g->fd);
}

/* Waits for g's END, collecting its text; false (with r set to the error) when it failed. */
static bool collect_all(atlas_gen *g, atlas_http_reply *r) {
    atlas_status st = ATLAS_OK;
    for (;;) {
        bool gone;
        atlas_gen_event *e = atlas_gen_next(g, true, &gone);
        if (!e) {
            if (gone) atlas_api_error_reply(r, ATLAS_API_ERR_CLIENT_GONE, ATLAS_OK, NULL,
                                            "the client closed the connection");
            else atlas_api_error_reply(r, ATLAS_API_ERR_SHUTDOWN, ATLAS_OK, NULL,
                                       g->lost ? "the server ran out of memory"
                                               : "the server is shutting down");
            return false;
        }
        if (st == ATLAS_OK) st = atlas_gen_format_collect(g, e);
        if (e->type != ATLAS_EVENT_END) {
            free(e);
            continue;
        }
        g->usage = e->usage;
        g->finish = e->finish;
        atlas_gen_format_observe_end(g);
        bool ok = false;
        if (e->finish == ATLAS_FINISH_ERROR)
            atlas_api_error_reply(r, ATLAS_API_ERR_STATUS,
                                  e->status ? e->status : ATLAS_ERR_INTERNAL, NULL, e->message);
        else if (e->finish == ATLAS_FINISH_CANCELLED && client_left(g))
            atlas_api_error_reply(r, ATLAS_API_ERR_CLIENT_GONE, ATLAS_OK, NULL,
                                  "the client closed the connection");
        else if (e->finish == ATLAS_FINISH_CANCELLED)
            atlas_api_error_reply(r, ATLAS_API_ERR_SHUTDOWN, ATLAS_OK, NULL,
                                  "the request was cancelled: the server is shutting down");
        else if (st != ATLAS_OK)
            atlas_api_error_fail(r, st, NULL);
        else
            ok = true;
        free(e);
        return ok;
    }
}

void atlas_gen_finish_json(atlas_gen *g, atlas_http_reply *r) {
    if (collect_all(g, r)) atlas_http_reply_json(r, 200, atlas_gen_format_response(g));
    note_usage(&g, 1, &g->usage, g->call_log);
    atlas_gen_release(g);
}

void atlas_gen_finish_batch(atlas_gen **gs, int n, int per_prompt, atlas_http_reply *r) {
    bool ok = true;
    for (int i = 0; i < n; i++) /* all run at once in the engine; collect in order */
        if (ok && !collect_all(gs[i], r)) ok = false;
    if (ok) atlas_http_reply_json(r, 200, atlas_gen_format_batch(gs, n, per_prompt));
    note_usage(gs, n, &gs[0]->usage, gs[0]->call_log); /* summed by format_batch */
    for (int i = 0; i < n; i++) atlas_gen_release(gs[i]);
}

/* --- answering --------------------------------------------------------------------------- */

void atlas_gen_reply(atlas_gen *g, atlas_http_reply *r) {
    if (!g->o.stream) {
        atlas_gen_finish_json(g, r);
        return;
    }
    bool failed = true;
    if (atlas_gen_wait_first(g)) {
        pthread_mutex_lock(&g->mu);
        failed = g->head && g->head->type == ATLAS_EVENT_END &&
                 g->head->finish != ATLAS_FINISH_STOP && g->head->finish != ATLAS_FINISH_LENGTH;
        pthread_mutex_unlock(&g->mu);
    }
    if (failed) { /* nothing was generated: answer with the error's own HTTP status */
        release_members(g);
        atlas_gen_finish_json(g, r);
        return;
    }
    r->status = 200;
    r->ctype = g->o.dialect ? g->o.dialect->stream_type : NULL;
    r->stream = (atlas_http_stream){sse_read, sse_close, g};
}

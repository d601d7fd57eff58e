/* engine/seq.c — the lowest part of the engine: a sequence's memory and failure, the waiting
 * queue's insertions and removals, and the clock and histograms the files above share.  It
 * calls nothing else of the engine, so output.c, the scheduler and the public calls can all
 * build on it without calling each other in a circle. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "engine/engine_internal.h"

double atlas_engine_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void atlas_engine_hist_observe(atlas_engine_hist *h, double seconds) {
    int i = 0;
    while (i < ATLAS_ENGINE_HIST_BUCKETS && seconds > h->bounds[i]) i++;
    h->counts[i]++;
    h->n++;
    h->sum += seconds;
}

void atlas_engine_seq_unref(seq *s) {
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1) return;
    atlas_sampler_free(s->sampler);
    free(s->bias);
    atlas_detok_free(s->detok);
    atlas_constraint_matcher_free(s->matcher);
    free(s->allowed);
    free(s->kv.ids);
    free(s->kv.salt);
    free(s->tokens);
    free(s->stop_ids);
    free(s->forced);
    for (int i = 0; i < s->n_stop; i++) free(s->stop[i]);
    free(s->stop);
    free(s->pending);
    free(s->pool);
    free(s->vec);
    free(s->message);
    free(s);
}

void atlas_engine_seq_fail(seq *s, atlas_status st, const char *msg) {
    s->finish = ATLAS_FINISH_ERROR;
    s->status = st;
    free(s->message);
    s->message = strdup(msg ? msg : "");
}

static atlas_status waiting_grow(atlas_engine *e) {
    if (e->n_waiting < e->waiting_cap) return ATLAS_OK;
    int cap = e->waiting_cap ? e->waiting_cap * 2 : 64;
    seq **w = realloc(e->waiting, (size_t)cap * sizeof *w);
    if (!w) return atlas_fail(ATLAS_ERR_NOMEM, "engine: a queue of %d requests", cap);
    e->waiting = w;
    e->waiting_cap = cap;
    return ATLAS_OK;
}

atlas_status atlas_engine_queue_back(atlas_engine *e, seq *s) {
    ATLAS_TRY(waiting_grow(e));
    e->waiting[e->n_waiting++] = s;
    e->models[s->model].n_waiting++;
    return ATLAS_OK;
}

atlas_status atlas_engine_queue_front(atlas_engine *e, seq *s) {
    ATLAS_TRY(waiting_grow(e));
    memmove(e->waiting + 1, e->waiting, (size_t)e->n_waiting * sizeof *e->waiting);
    e->waiting[0] = s;
    e->n_waiting++;
    e->models[s->model].n_waiting++;
    return ATLAS_OK;
}

void atlas_engine_queue_remove_at(atlas_engine *e, int i) {
    e->models[e->waiting[i]->model].n_waiting--;
    memmove(e->waiting + i, e->waiting + i + 1, (size_t)(e->n_waiting - i - 1) * sizeof *e->waiting);
    e->n_waiting--;
}

void atlas_engine_kv_host_count(atlas_engine *e, const atlas_kv_host_moved *mv, int restored) {
    atlas_engine_metrics *x = &e->metrics;
    *(restored ? &x->kv_host_restored_blocks : &x->kv_host_saved_blocks) += mv->blocks;
    *(restored ? &x->kv_host_restored_bytes : &x->kv_host_saved_bytes) += mv->bytes;
    x->kv_host_dropped_blocks += mv->dropped;
    x->kv_host_bytes = atlas_kv_host_bytes(e->kv_host);
    x->kv_host_blocks = atlas_kv_host_blocks(e->kv_host);
    x->kv_host_budget = atlas_kv_host_budget(e->kv_host);
}

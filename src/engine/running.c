/* engine/running.c — sequences entering and leaving the running lists: admission (which
 * takes a handle on the sequence's model), ending, cancellation, preemption (which drop it),
 * and the queue of END events delivered outside the lock.  Below the residency and step
 * code, above output.c and seq.c.
 *
 * Model handles: a sequence holds an atlas_model_ref on its model exactly while it is in the
 * model's running list, so the model's live handles are its owner's plus one per running
 * sequence, and atlas_model_release refuses (ATLAS_ERR_BUSY) while any of them runs.  The
 * handle is dropped when the sequence leaves the list, however it leaves: finished,
 * cancelled (the client gone included), failed, preempted or paused for a swap. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "engine/engine_internal.h"

static void count_finish(atlas_engine *e, const seq *s) {
    switch (s->finish) {
    case ATLAS_FINISH_STOP: e->metrics.finished_stop++; break;
    case ATLAS_FINISH_LENGTH: e->metrics.finished_length++; break;
    case ATLAS_FINISH_CANCELLED: e->metrics.finished_cancelled++; break;
    case ATLAS_FINISH_ERROR: e->metrics.finished_error++; break;
    }
}

void atlas_engine_push_done(atlas_engine *e, seq *s) {
    if (e->n_done == e->done_cap) {
        int cap = e->done_cap ? e->done_cap * 2 : 64;
        seq **d = realloc(e->done, (size_t)cap * sizeof *d);
        if (!d) {
            /* Cannot queue it: end it right here, lock held (rare enough to accept). */
            count_finish(e, s);
            s->state = SEQ_DONE;
            atlas_engine_seq_emit_end(e, s);
            atlas_engine_seq_unref(s);
            return;
        }
        e->done = d;
        e->done_cap = cap;
    }
    count_finish(e, s);
    s->state = SEQ_DONE;
    e->done[e->n_done++] = s;
}

void atlas_engine_flush_done(atlas_engine *e) {
    while (e->n_done > 0) {
        int n = e->n_done;
        seq **list = malloc((size_t)n * sizeof *list);
        if (!list) return; /* try again next round */
        memcpy(list, e->done, (size_t)n * sizeof *list);
        e->n_done = 0;
        pthread_mutex_unlock(&e->mu);
        for (int i = 0; i < n; i++) {
            atlas_engine_seq_emit_end(e, list[i]);
            atlas_engine_seq_unref(list[i]);
        }
        free(list);
        pthread_mutex_lock(&e->mu);
    }
}

/* Takes s off md's running list and drops its model handle.  A release refused while s ran
 * may succeed now: the residency code tries again (md->release_refused cleared). */
static void running_remove(eng_model *md, seq *s) {
    for (int i = 0; i < md->n_running; i++)
        if (md->running[i] == s) {
            memmove(md->running + i, md->running + i + 1,
                    (size_t)(md->n_running - i - 1) * sizeof *md->running);
            md->n_running--;
            break;
        }
    atlas_model_unref(s->model_ref);
    s->model_ref = NULL;
    md->release_refused = 0;
}

void atlas_engine_end_running(atlas_engine *e, eng_model *md, seq *s) {
    atlas_kv_table_release(&md->pool, &s->kv, s->tokens, s->n_computed);
    running_remove(md, s);
    atlas_engine_push_done(e, s);
}

void atlas_engine_end_waiting(atlas_engine *e, int model, atlas_finish finish,
                              atlas_status st, const char *msg) {
    for (int i = 0; i < e->n_waiting;) {
        seq *s = e->waiting[i];
        if (model >= 0 && s->model != model) {
            i++;
            continue;
        }
        atlas_engine_queue_remove_at(e, i);
        if (finish == ATLAS_FINISH_ERROR)
            atlas_engine_seq_fail(s, st, msg);
        else
            s->finish = finish;
        atlas_engine_push_done(e, s);
    }
}

int atlas_engine_reap_cancelled(atlas_engine *e) {
    int n = 0;
    for (int i = 0; i < e->n_waiting;) {
        seq *s = e->waiting[i];
        if (!atomic_load(&s->cancel)) {
            i++;
            continue;
        }
        atlas_engine_queue_remove_at(e, i);
        s->finish = ATLAS_FINISH_CANCELLED;
        atlas_engine_push_done(e, s);
        n++;
    }
    for (int m = 0; m < e->n_models; m++) {
        eng_model *md = &e->models[m];
        for (int i = 0; i < md->n_running;) {
            seq *s = md->running[i];
            if (!atomic_load(&s->cancel)) {
                i++;
                continue;
            }
            s->finish = ATLAS_FINISH_CANCELLED;
            atlas_engine_end_running(e, md, s);
            n++;
        }
    }
    atlas_engine_flush_done(e);
    return n > 0;
}

static void unplan(atlas_engine *e, seq *s) {
    int i = s->plan;
    memmove(e->plan + i, e->plan + i + 1, (size_t)(e->n_plan - i - 1) * sizeof *e->plan);
    e->n_plan--;
    for (int j = i; j < e->n_plan; j++) e->plan[j].s->plan = j;
    s->plan = -1;
}

void atlas_engine_preempt(atlas_engine *e, eng_model *md, seq *s, double *budget) {
    if (s->plan >= 0) {
        *budget += e->plan[s->plan].cost;
        unplan(e, s);
    }
    atlas_kv_table_release(&md->pool, &s->kv, s->tokens, s->n_computed);
    s->n_computed = 0;
    s->requeued = 1;
    running_remove(md, s);
    e->metrics.preemptions++;
    s->state = SEQ_WAITING;
    atlas_status st = atlas_engine_queue_front(e, s);
    if (st != ATLAS_OK) {
        atlas_engine_seq_fail(s, st, atlas_last_error());
        atlas_engine_push_done(e, s);
    }
}

/* Whether s may take cached blocks: mean and cls pooling need the hidden states of the
 * first tokens, computed, not cached. */
static int may_share(const eng_model *md, const seq *s) {
    return !s->embed || md->cfg.pooling == ATLAS_POOL_LAST;
}

/* n more of s's tokens came from the prefix cache; the request's own count is that of its
 * life before a preemption (a recompute is not what the client asked of the cache). */
static void count_cached(atlas_engine *e, seq *s, int n) {
    e->metrics.cached_tokens += (uint64_t)n;
    if (s->requeued) return;
    s->n_cached += n;
    if (s->n_cached > s->n_prompt) s->n_cached = s->n_prompt;
}

/* Blocks that already hold a prefix of s's tokens (prefix cache), at its first admission and
 * after a preemption. */
static void match_prefix(atlas_engine *e, eng_model *md, seq *s) {
    if (s->kv.n != 0 || s->n_computed != 0 || !may_share(md, s)) return;
    s->n_computed = atlas_kv_table_match(&md->pool, &s->kv, s->tokens, s->n_tokens);
    if (e->kv_host) { /* what the pool lacks may be in host memory since a release */
        atlas_kv_host_moved mv;
        s->n_computed = atlas_kv_host_restore(e->kv_host, s->model, md->m, &md->pool, &s->kv,
                                              s->tokens, s->n_tokens, &mv);
        atlas_engine_kv_host_count(e, &mv, 1);
    }
    count_cached(e, s, s->n_computed);
}

int atlas_engine_share_prefix(atlas_engine *e, eng_model *md, seq *s) {
    if (!may_share(md, s)) return 1;
    bool wait = false;
    int at = atlas_kv_table_extend(&md->pool, &s->kv, s->tokens, s->n_tokens, s->n_computed,
                                   &wait);
    count_cached(e, s, at - s->n_computed);
    s->n_computed = at;
    return !wait;
}

int atlas_engine_admit(atlas_engine *e) {
    if (e->n_waiting == 0) return 0; /* the idle loop allocates nothing */
    int any = 0; /* nor the loop while the waiting requests' models load (fault walks count) */
    for (int i = 0; i < e->n_waiting && !any; i++) any = e->models[e->waiting[i]->model].m != NULL;
    if (!any) return 0;
    int *reserved = calloc((size_t)e->n_models * 2, sizeof *reserved);
    if (!reserved) return 0;
    int *blocked = reserved + e->n_models, n = 0;
    for (int i = 0; i < e->n_waiting;) {
        seq *s = e->waiting[i];
        eng_model *md = &e->models[s->model];
        int need = md->m ? atlas_kv_blocks_for(&md->pool, s->n_tokens + 1) : 0;
        if (!md->m || md->draining || md->held || blocked[s->model] || md->n_running >= md->parallel ||
            atlas_kv_pool_free(&md->pool) - reserved[s->model] < need) {
            if (md->m) blocked[s->model] = 1;
            i++;
            continue;
        }
        reserved[s->model] += need;
        atlas_engine_queue_remove_at(e, i);
        match_prefix(e, md, s);
        s->model_ref = atlas_model_ref(md->m);
        s->state = SEQ_RUNNING;
        s->order = ++e->clock;
        if (s->t_admit == 0) s->t_admit = atlas_engine_now();
        md->keep_now_ms = s->keep_alive_ms ? s->keep_alive_ms : md->keep_ms;
        md->served = 1;
        md->running[md->n_running++] = s;
        n++;
    }
    free(reserved);
    return n > 0;
}

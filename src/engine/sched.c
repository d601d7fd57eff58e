/* engine/sched.c — the scheduler thread's loop: cancellations, load/unload commands,
 * residency, admission, then one step of every model with work, round robin; and the
 * shutdown that ends what is left.  The top of the scheduler: it calls residency.c,
 * step.c and running.c, none of which calls back up.
 *
 * The loop holds e->mu except around forward passes, releases and callbacks; a model loads
 * on the loader thread meanwhile (residency.c), which hands its result over under e->mu.
 * Only this thread changes residency, running lists, KV pools and sequences' compute state,
 * so what it reads without the lock cannot change under it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/host.h"
#include "core/error.h"
#include "engine/engine_internal.h"

/* ---- the thread ------------------------------------------------------------------------- */

static atlas_status alloc_buffers(atlas_engine *e) {
    int most = 0; /* the largest step of any model */
    for (int i = 0; i < e->n_models; i++)
        if (e->models[i].batch_tokens > most) most = e->models[i].batch_tokens;
    size_t n = (size_t)most + 1;
    e->plan = calloc(n, sizeof *e->plan);
    e->plan_next = calloc(n, sizeof *e->plan_next);
    e->b_tokens = malloc(n * sizeof(int32_t));
    e->b_pos = malloc(n * sizeof(int32_t));
    e->b_start = malloc((n + 1) * sizeof(int32_t));
    e->b_ctx = malloc(n * sizeof(int32_t));
    e->b_rope = malloc(n * sizeof(int32_t));
    e->b_rows = malloc(n * sizeof(int32_t));
    e->b_ids = malloc(n * sizeof(int32_t));
    if (!e->plan || !e->plan_next || !e->b_tokens || !e->b_pos || !e->b_start || !e->b_ctx ||
        !e->b_rope || !e->b_rows || !e->b_ids)
        return atlas_fail(ATLAS_ERR_NOMEM, "engine: batch buffers");
    return ATLAS_OK;
}

/* Where none of this thread's work is queued on the GPU (each model's steps are collected
 * by then): a load's kernel modules go in here (atlas_host_quiet_call), without e->mu, which
 * they do not need. Under e->mu. */
static void quiet_point(atlas_engine *e) {
    if (!e->quiet_checked) { /* the host, once a model is resident: it exists by then */
        for (int i = 0; i < e->n_models && !e->quiet_checked; i++)
            if (e->models[i].m) e->quiet_checked = 1;
        if (e->quiet_checked) e->quiet_host = atlas_engine_gpu_host(e);
    }
    if (!e->quiet_host) return;
    atlas_host_serving(e->quiet_host, true);
    if (!atlas_host_quiet_wanted(e->quiet_host)) return;
    pthread_mutex_unlock(&e->mu);
    atlas_host_quiet_point(e->quiet_host);
    pthread_mutex_lock(&e->mu);
}

void *atlas_engine_sched_main(void *arg) {
    atlas_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    atlas_status bst = alloc_buffers(e);
    char bmsg[256];
    snprintf(bmsg, sizeof bmsg, "%s", bst == ATLAS_OK ? "" : atlas_last_error());
    int rr = 0; /* round robin over models */
    while (!e->stop) {
        if (bst != ATLAS_OK) { /* nothing can run: answer everyone with the reason */
            atlas_engine_end_waiting(e, -1, ATLAS_FINISH_ERROR, bst, bmsg);
            atlas_engine_flush_done(e);
            for (eng_cmd *c = e->cmds; c; c = e->cmds) atlas_engine_cmd_complete(e, c, bst, bmsg);
            /* the calls back drop the lock: a stop may have come meanwhile */
            if (!e->stop) pthread_cond_wait(&e->wake, &e->mu);
            continue;
        }
        quiet_point(e);
        int worked = atlas_engine_reap_cancelled(e);
        worked |= atlas_engine_do_commands(e);
        worked |= atlas_engine_do_residency(e);
        worked |= atlas_engine_admit(e);
        worked |= atlas_engine_do_keep_alive(e);
        for (int k = 0; k < e->n_models && !e->stop; k++) {
            eng_model *md = &e->models[(rr + k) % e->n_models];
            worked |= atlas_engine_step(e, md);
        }
        rr = (rr + 1) % e->n_models;
        if (!worked && !e->stop) {
            if (e->quiet_host) atlas_host_serving(e->quiet_host, false); /* asleep: no points */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 100 * 1000 * 1000;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&e->wake, &e->mu, &ts);
        }
    }
    if (e->quiet_host) atlas_host_serving(e->quiet_host, false);
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

void atlas_engine_sched_shutdown(atlas_engine *e) {
    pthread_mutex_lock(&e->mu);
    atlas_engine_end_waiting(e, -1, ATLAS_FINISH_CANCELLED, ATLAS_OK, NULL);
    for (int m = 0; m < e->n_models; m++) {
        eng_model *md = &e->models[m];
        while (md->n_running > 0) {
            seq *s = md->running[0];
            s->finish = ATLAS_FINISH_CANCELLED;
            atlas_engine_end_running(e, md, s);
        }
    }
    atlas_engine_flush_done(e);
    for (eng_cmd *c = e->cmds; c; c = e->cmds)
        atlas_engine_cmd_complete(e, c, ATLAS_ERR_INVALID, "the engine is shutting down");
    atlas_engine_load_abandon(e); /* a load in flight ends first: it cannot be stopped */
    /* no sequence runs any more, so no handle but the owner's is left to refuse these */
    for (int m = 0; m < e->n_models; m++)
        if (e->models[m].m) (void)atlas_engine_release_model(e, &e->models[m]);
    pthread_mutex_unlock(&e->mu);
    free(e->plan);
    free(e->plan_next);
    free(e->b_tokens);
    free(e->b_pos);
    free(e->b_start);
    free(e->b_ctx);
    free(e->b_rope);
    free(e->b_rows);
    free(e->b_ids);
    free(e->b_table);
    free(e->logits);
    free(e->row);
    free(e->smp_rows);
    free(e->smp_out);
    free(e->smp_adj);
    free(e->smp_keys);
    free(e->done);
}

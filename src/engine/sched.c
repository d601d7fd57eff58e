/* engine/sched.c — the scheduler thread: cancellations, load/unload commands, residency
 * (which models are loaded, swapping least recently used ones out), admission of waiting
 * requests, and steps (one batched forward per model with work, then sampling).
 *
 * The loop holds e->mu except around forward passes, model loads and releases, and
 * callbacks.  Only this thread changes residency, running lists, KV pools and sequences'
 * compute state, so what it reads without the lock cannot change under it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "engine/engine_internal.h"
#include "model/forward.h"

/* ---- ending sequences ------------------------------------------------------------------- */

static void count_finish(atlas_engine *e, const seq *s) {
    switch (s->finish) {
    case ATLAS_FINISH_STOP: e->metrics.finished_stop++; break;
    case ATLAS_FINISH_LENGTH: e->metrics.finished_length++; break;
    case ATLAS_FINISH_CANCELLED: e->metrics.finished_cancelled++; break;
    case ATLAS_FINISH_ERROR: e->metrics.finished_error++; break;
    }
}

/* Queues s for its END (s is in no list any more).  Under e->mu. */
static void push_done(atlas_engine *e, seq *s) {
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

/* Emits the queued ENDs outside the lock.  Under e->mu (dropped meanwhile). */
static void flush_done(atlas_engine *e) {
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

static void running_remove(eng_model *md, seq *s) {
    for (int i = 0; i < md->n_running; i++)
        if (md->running[i] == s) {
            memmove(md->running + i, md->running + i + 1,
                    (size_t)(md->n_running - i - 1) * sizeof *md->running);
            md->n_running--;
            return;
        }
}

/* A running sequence ends: its blocks go back at once.  Under e->mu. */
static void end_running(atlas_engine *e, eng_model *md, seq *s) {
    atlas_kv_table_release(&md->pool, &s->kv, s->tokens, s->n_computed);
    running_remove(md, s);
    push_done(e, s);
}

static void waiting_remove_at(atlas_engine *e, int i) {
    e->models[e->waiting[i]->model].n_waiting--;
    memmove(e->waiting + i, e->waiting + i + 1, (size_t)(e->n_waiting - i - 1) * sizeof *e->waiting);
    e->n_waiting--;
}

static int reap_cancelled(atlas_engine *e) {
    int n = 0;
    for (int i = 0; i < e->n_waiting;) {
        seq *s = e->waiting[i];
        if (!atomic_load(&s->cancel)) {
            i++;
            continue;
        }
        waiting_remove_at(e, i);
        s->finish = ATLAS_FINISH_CANCELLED;
        push_done(e, s);
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
            end_running(e, md, s);
            n++;
        }
    }
    flush_done(e);
    return n > 0;
}

/* ---- loading and releasing -------------------------------------------------------------- */

static void cmd_complete(atlas_engine *e, eng_cmd *c, atlas_status st, const char *msg) {
    eng_cmd **p = &e->cmds;
    while (*p && *p != c) p = &(*p)->next;
    if (*p) *p = c->next;
    c->st = st;
    snprintf(c->msg, sizeof c->msg, "%s", msg ? msg : "");
    c->done = 1;
    pthread_cond_broadcast(&e->cmd_done);
}

/* Completes every pending command of kind for model. */
static void cmds_complete(atlas_engine *e, cmd_kind kind, int model, atlas_status st,
                          const char *msg) {
    for (eng_cmd *c = e->cmds, *next; c; c = next) {
        next = c->next;
        if (c->kind == kind && c->model == model) cmd_complete(e, c, st, msg);
    }
}

/* Releases a resident model with no running sequence.  Under e->mu (dropped meanwhile).
 * ATLAS_ERR_BUSY from atlas_model_release means someone kept a handle: a bug in atlas,
 * counted, recorded in last_error and returned (the model then stays resident). */
static atlas_status release_model(atlas_engine *e, eng_model *md) {
    atlas_model *m = md->m;
    md->m = NULL;
    atlas_kv_pool_destroy(&md->pool);
    pthread_mutex_unlock(&e->mu);
    atlas_status st = atlas_model_release(m);
    char msg[256];
    snprintf(msg, sizeof msg, "%s", st == ATLAS_OK ? "" : atlas_last_error());
    pthread_mutex_lock(&e->mu);
    if (st == ATLAS_ERR_BUSY) {
        e->metrics.release_busy++;
        snprintf(md->last_error, sizeof md->last_error,
                 "BUG: releasing model '%.40s' was refused: %.170s", md->name, msg);
        md->m = m;
        atlas_status pst = atlas_kv_pool_init(&md->pool, atlas_model_kv_blocks(m),
                                              atlas_model_kv_block_size(m));
        (void)pst; /* its failure leaves a zero pool: admission then never fits */
        return atlas_fail(ATLAS_ERR_INTERNAL, "%s", md->last_error);
    }
    e->metrics.unloads++;
    if (st != ATLAS_OK)
        snprintf(md->last_error, sizeof md->last_error, "releasing: %.200s", msg);
    md->unload_asked = 0;
    md->draining = 0;
    md->drain_since = 0;
    return ATLAS_OK;
}

/* Ends every waiting request for model (and its load commands) with an error. */
static void fail_model_requests(atlas_engine *e, int model, atlas_status st, const char *msg) {
    eng_model *md = &e->models[model];
    snprintf(md->last_error, sizeof md->last_error, "%s", msg);
    for (int i = 0; i < e->n_waiting;) {
        seq *s = e->waiting[i];
        if (s->model != model) {
            i++;
            continue;
        }
        waiting_remove_at(e, i);
        atlas_engine_seq_fail(s, st, msg);
        push_done(e, s);
    }
    cmds_complete(e, CMD_LOAD, model, st, msg);
    flush_done(e);
}

static atlas_status load_checked(atlas_engine *e, eng_model *md, atlas_model **out) {
    atlas_model_params mp = atlas_model_default_params();
    mp.device = e->p.device;
    mp.n_threads = e->p.n_threads;
    mp.kv_blocks = md->kv_blocks;
    mp.kv_block_size = e->p.kv_block_size;
    mp.max_batch_tokens = e->p.batch_tokens;
    mp.load_tokenizer = 0; /* the engine keeps its own, resident or not */
    atlas_model *m = NULL;
    ATLAS_TRY(atlas_model_load(md->dir, &mp, &m));
    int bs = atlas_model_kv_block_size(m), nb = atlas_model_kv_blocks(m);
    atlas_status st = ATLAS_OK;
    if (bs != e->p.kv_block_size || (long)nb * bs < md->ctx ||
        atlas_model_max_batch_tokens(m) < e->p.batch_tokens ||
        atlas_model_vocab_size(m) != md->cfg.vocab_size)
        st = atlas_fail(ATLAS_ERR_INTERNAL, "model gave %d KV blocks of %d tokens, batches of "
                        "%d, vocab %d; the engine asked %d of %d, %d, %d", nb, bs,
                        atlas_model_max_batch_tokens(m), atlas_model_vocab_size(m),
                        md->kv_blocks, e->p.kv_block_size, e->p.batch_tokens,
                        md->cfg.vocab_size);
    if (st != ATLAS_OK) {
        atlas_model_release(m);
        return st;
    }
    *out = m;
    return ATLAS_OK;
}

/* Loads model (room was made).  t0: when the swap began (the release before it).  Under
 * e->mu (dropped meanwhile). */
static void load_model(atlas_engine *e, int model, double t0) {
    eng_model *md = &e->models[model];
    pthread_mutex_unlock(&e->mu);
    atlas_error_clear();
    atlas_model *m = NULL;
    atlas_status st = load_checked(e, md, &m);
    char msg[512];
    snprintf(msg, sizeof msg, "loading model '%s' from %s: %s", md->name, md->dir,
             atlas_last_error());
    pthread_mutex_lock(&e->mu);
    if (st == ATLAS_OK) {
        st = atlas_kv_pool_init(&md->pool, atlas_model_kv_blocks(m), atlas_model_kv_block_size(m));
        if (st != ATLAS_OK) {
            snprintf(msg, sizeof msg, "loading model '%s': %s", md->name, atlas_last_error());
            pthread_mutex_unlock(&e->mu);
            atlas_model_release(m);
            pthread_mutex_lock(&e->mu);
        }
    }
    if (st != ATLAS_OK) {
        e->metrics.load_failures++;
        fail_model_requests(e, model, st, msg);
        return;
    }
    atlas_model_info info;
    atlas_model_get_info(m, &info);
    md->est_bytes = info.weight_bytes + info.kv_bytes;
    md->m = m;
    md->loaded_at = atlas_engine_now();
    md->last_used = ++e->clock;
    md->last_error[0] = 0;
    double dt = atlas_engine_now() - t0;
    e->metrics.loads++;
    e->metrics.last_swap_s = dt;
    atlas_engine_hist_observe(&e->metrics.swap, dt);
    cmds_complete(e, CMD_LOAD, model, ATLAS_OK, NULL);
}

/* ---- residency -------------------------------------------------------------------------- */

static void preempt(atlas_engine *e, eng_model *md, seq *s, int *budget);

/* Pauses every running sequence of md (newest first, so that the oldest ends up at the
 * front of the queue).  Under e->mu. */
static void pause_all(atlas_engine *e, eng_model *md) {
    int budget = 0;
    while (md->n_running > 0) preempt(e, md, md->running[md->n_running - 1], &budget);
    flush_done(e);
}

static int fits(const atlas_engine *e, int model) {
    int n = 0;
    size_t bytes = e->models[model].est_bytes;
    for (int i = 0; i < e->n_models; i++)
        if (e->models[i].m) {
            n++;
            bytes += e->models[i].est_bytes;
        }
    return n < e->p.max_resident && (e->budget == 0 || bytes <= e->budget);
}

/* The model that should be loaded next: that of the oldest load command, else that of the
 * oldest waiting request; -1 when every wanted model is resident. */
static int wanted_model(const atlas_engine *e) {
    for (const eng_cmd *c = e->cmds; c; c = c->next)
        if (c->kind == CMD_LOAD && !e->models[c->model].m) return c->model;
    for (int i = 0; i < e->n_waiting; i++)
        if (!e->models[e->waiting[i]->model].m) return e->waiting[i]->model;
    return -1;
}

static int lru_victim(const atlas_engine *e, int except) {
    int v = -1;
    for (int i = 0; i < e->n_models; i++) {
        const eng_model *md = &e->models[i];
        if (i == except || !md->m) continue;
        if (v < 0 || md->last_used < e->models[v].last_used) v = i;
    }
    return v;
}

/* Load/unload commands for models already in the state asked.  Under e->mu. */
static int do_commands(atlas_engine *e) {
    int worked = 0;
    for (eng_cmd *c = e->cmds, *next; c; c = next) {
        next = c->next;
        eng_model *md = &e->models[c->model];
        if (c->kind == CMD_LOAD && md->m) {
            cmd_complete(e, c, ATLAS_OK, NULL);
            worked = 1;
        } else if (c->kind == CMD_UNLOAD) {
            if (!md->m) {
                cmd_complete(e, c, ATLAS_OK, NULL);
            } else if (md->n_running == 0) {
                atlas_status st = release_model(e, md);
                cmds_complete(e, CMD_UNLOAD, c->model, st, st ? md->last_error : NULL);
                next = e->cmds; /* the list may have changed while unlocked */
            } else {
                md->unload_asked = 1;
                continue;
            }
            worked = 1;
        }
    }
    return worked;
}

/* Makes the wanted model resident: loads it when it fits, else lets the least recently
 * used model drain (no admissions) and releases it once its sequences are done.
 * Under e->mu (dropped while loading or releasing). */
static int do_residency(atlas_engine *e) {
    for (int i = 0; i < e->n_models; i++) e->models[i].draining = e->models[i].unload_asked;
    int want = wanted_model(e);
    if (want < 0) {
        for (int i = 0; i < e->n_models; i++) e->models[i].drain_since = 0;
        return 0;
    }
    eng_model *wm = &e->models[want];
    if (e->budget && wm->est_bytes > e->budget) {
        char msg[512];
        snprintf(msg, sizeof msg, "model '%s' needs %.2f GiB (weights %.2f, KV cache %.2f); %s",
                 wm->name, wm->est_bytes / 1073741824.0, wm->weight_bytes / 1073741824.0,
                 (wm->est_bytes - wm->weight_bytes) / 1073741824.0, e->budget_what);
        e->metrics.load_failures++;
        fail_model_requests(e, want, ATLAS_ERR_DEVICE_NOMEM, msg);
        return 1;
    }
    double t0 = atlas_engine_now();
    while (!fits(e, want)) {
        int v = lru_victim(e, want);
        if (v < 0) return 0; /* cannot happen: max_resident >= 1 and the size fits alone */
        eng_model *vm = &e->models[v];
        vm->draining = 1;
        if (vm->n_running > 0) {
            double now = atlas_engine_now();
            if (vm->drain_since == 0) vm->drain_since = now;
            /* Timed from the later of the drain and the load, so that two models wanted at
             * once take turns of at least drain_timeout_ms instead of pausing each other at
             * every step. */
            double since = vm->drain_since > vm->loaded_at ? vm->drain_since : vm->loaded_at;
            if (e->p.drain_timeout_ms <= 0 || (now - since) * 1e3 < e->p.drain_timeout_ms)
                return 0; /* it finishes its sequences first */
            pause_all(e, vm);
        }
        atlas_status st = release_model(e, vm);
        if (st != ATLAS_OK) {
            char msg[512];
            snprintf(msg, sizeof msg, "cannot make room for model '%s': %s", wm->name,
                     vm->last_error);
            fail_model_requests(e, want, st, msg);
            return 1;
        }
        if (e->models[want].m) return 1; /* loaded by hand meanwhile: cannot, but be safe */
    }
    load_model(e, want, t0);
    return 1;
}

/* ---- admission -------------------------------------------------------------------------- */

/* Moves waiting requests of resident, non-draining models into their running lists, in
 * order, while there is room (parallel) and free KV blocks for their tokens; a request
 * that does not fit blocks those behind it for the same model.  Under e->mu. */
static int admit(atlas_engine *e) {
    int *reserved = calloc((size_t)e->n_models * 2, sizeof *reserved);
    if (!reserved) return 0;
    int *blocked = reserved + e->n_models, n = 0;
    for (int i = 0; i < e->n_waiting;) {
        seq *s = e->waiting[i];
        eng_model *md = &e->models[s->model];
        int need = md->m ? atlas_kv_blocks_for(&md->pool, s->n_tokens + 1) : 0;
        if (!md->m || md->draining || blocked[s->model] || md->n_running >= e->p.parallel ||
            atlas_kv_pool_free(&md->pool) - reserved[s->model] < need) {
            if (md->m) blocked[s->model] = 1;
            i++;
            continue;
        }
        reserved[s->model] += need;
        waiting_remove_at(e, i);
        /* Blocks that already hold a prefix of its tokens (prefix cache). */
        if (s->kv.n == 0 && s->n_computed == 0) {
            s->n_computed = atlas_kv_table_match(&md->pool, &s->kv, s->tokens, s->n_tokens);
            if (s->t_admit == 0)
                s->n_cached = s->n_computed < s->n_prompt ? s->n_computed : s->n_prompt;
            e->metrics.cached_tokens += (uint64_t)s->n_computed;
        }
        s->state = SEQ_RUNNING;
        s->order = ++e->clock;
        if (s->t_admit == 0) s->t_admit = atlas_engine_now();
        md->running[md->n_running++] = s;
        n++;
    }
    free(reserved);
    return n > 0;
}

/* ---- building a step -------------------------------------------------------------------- */

static void unplan(atlas_engine *e, seq *s) {
    int i = s->plan;
    memmove(e->plan + i, e->plan + i + 1, (size_t)(e->n_plan - i - 1) * sizeof *e->plan);
    e->n_plan--;
    for (int j = i; j < e->n_plan; j++) e->plan[j].s->plan = j;
    s->plan = -1;
}

/* Frees the sequence's blocks and puts it back at the front of the queue: it will be
 * recomputed (prompt and generated tokens) when there is room again.  Under e->mu. */
static void preempt(atlas_engine *e, eng_model *md, seq *s, int *budget) {
    if (s->plan >= 0) {
        *budget += e->plan[s->plan].n;
        unplan(e, s);
    }
    atlas_kv_table_release(&md->pool, &s->kv, s->tokens, s->n_computed);
    s->n_computed = 0;
    running_remove(md, s);
    e->metrics.preemptions++;
    s->state = SEQ_WAITING;
    atlas_status st = atlas_engine_queue_front(e, s);
    if (st != ATLAS_OK) {
        atlas_engine_seq_fail(s, st, atlas_last_error());
        push_done(e, s);
    }
}

/* Plans the step for md: first one decode token for every sequence that has finished its
 * prompt, then prompt chunks in admission order, within the token budget.  When the pool
 * runs out of blocks the newest sequence is preempted (possibly the one asking).
 * Under e->mu. */
static void plan_step(atlas_engine *e, eng_model *md) {
    int budget = e->p.batch_tokens;
    e->n_plan = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < md->n_running && budget > 0; i++) {
            seq *s = md->running[i];
            int remaining = s->n_tokens - s->n_computed;
            if ((remaining == 1) != (pass == 0) || s->plan >= 0) continue;
            int take = remaining < budget ? remaining : budget;
            int self = 0;
            while (!atlas_kv_table_reserve(&md->pool, &s->kv, s->n_computed + take)) {
                seq *v = md->running[md->n_running - 1]; /* the newest */
                if (v == s) {
                    self = 1;
                    break;
                }
                preempt(e, md, v, &budget);
            }
            if (self) {
                preempt(e, md, s, &budget);
                i--;
                continue;
            }
            s->plan = e->n_plan;
            e->plan[e->n_plan++] =
                (plan_entry){.s = s, .n = take, .logits = s->n_computed + take == s->n_tokens};
            budget -= take;
        }
    }
}

/* Writes every planned sequence's block table into e->b_table (rows of the longest table's
 * width) and sets the batch's table and width. */
static atlas_status fill_tables(atlas_engine *e, atlas_batch *b) {
    int max_blocks = 1;
    for (int i = 0; i < e->n_plan; i++)
        if (e->plan[i].s->kv.n > max_blocks) max_blocks = e->plan[i].s->kv.n;
    size_t need = (size_t)e->n_plan * max_blocks;
    if (need > e->b_table_cap) {
        int32_t *t = realloc(e->b_table, need * sizeof *t);
        if (!t) return atlas_fail(ATLAS_ERR_NOMEM, "engine: block table of %zu", need);
        e->b_table = t;
        e->b_table_cap = need;
    }
    for (int i = 0; i < e->n_plan; i++) {
        const seq *s = e->plan[i].s;
        int32_t *row = e->b_table + (size_t)i * max_blocks;
        memcpy(row, s->kv.ids, (size_t)s->kv.n * sizeof *row);
        for (int j = s->kv.n; j < max_blocks; j++) row[j] = 0;
    }
    b->block_table = e->b_table;
    b->max_blocks = max_blocks;
    return ATLAS_OK;
}

/* Fills the batch arrays from the plan; returns the number of logit rows.  s->plan is
 * reset here: entries are then addressed by index. */
static atlas_status fill_batch(atlas_engine *e, atlas_batch *b) {
    int n = 0, n_logits = 0;
    for (int i = 0; i < e->n_plan; i++) {
        plan_entry *pe = &e->plan[i];
        seq *s = pe->s;
        s->plan = -1;
        e->b_start[i] = n;
        for (int j = 0; j < pe->n; j++, n++) {
            e->b_tokens[n] = s->tokens[s->n_computed + j];
            e->b_pos[n] = s->n_computed + j;
        }
        e->b_ctx[i] = s->n_computed + pe->n;
        if (pe->logits) e->b_rows[n_logits++] = n - 1;
    }
    e->b_start[e->n_plan] = n;
    *b = (atlas_batch){.n_tokens = n, .tokens = e->b_tokens, .positions = e->b_pos,
                       .n_seqs = e->n_plan, .seq_start = e->b_start, .seq_ctx = e->b_ctx,
                       .n_logits = n_logits, .logit_rows = e->b_rows};
    return fill_tables(e, b);
}

/* ---- running a step --------------------------------------------------------------------- */

/* A constrained sequence: gives the tokens its matcher does not allow -inf in logits (a copy
 * of the raw row), and its eos and stop ids too (they would end the text before the program
 * is complete; special tokens have no bytes for the matcher anyway, but a stop id may be a
 * plain token).  0 (s failed) when no token is allowed. */
static int mask_row(const atlas_engine *e, seq *s, float *logits, int vocab) {
    int n = s->n_allowed; /* s->allowed: from compute_masks */
    const eng_model *md = &e->models[s->model];
    for (int i = 0; !s->ignore_eos && i < md->n_eos; i++)
        if (md->eos[i] >= 0 && md->eos[i] < vocab && s->allowed[md->eos[i]])
            s->allowed[md->eos[i]] = 0, n--;
    for (int i = 0; i < s->n_stop_ids; i++)
        if (s->allowed[s->stop_ids[i]]) s->allowed[s->stop_ids[i]] = 0, n--;
    if (n <= 0) {
        atlas_engine_seq_fail(s, ATLAS_ERR_INTERNAL, "constraint: no token of the vocabulary "
                              "may come next (the program cannot be completed)");
        return 0;
    }
    for (int i = 0; i < vocab; i++)
        if (!s->allowed[i]) logits[i] = -INFINITY;
    return 1;
}

/* Samples s's next token from its logits row (and takes logprobs of the raw row first);
 * returns 1 when s ends. */
static int sample_row(atlas_engine *e, seq *s, float *row, int vocab) {
    atlas_top_logprob top[ATLAS_ENGINE_MAX_TOP_LOGPROBS];
    int32_t top_ids[ATLAS_ENGINE_MAX_TOP_LOGPROBS];
    float top_lps[ATLAS_ENGINE_MAX_TOP_LOGPROBS], lp = 0;
    int n_top = 0;
    int32_t id = -1;
    atlas_status st;
    if (s->logprobs || s->top_logprobs || s->matcher || s->n_forced) {
        memcpy(e->row, row, (size_t)vocab * sizeof *row); /* sampling overwrites it */
        if (s->matcher && !mask_row(e, s, e->row, vocab)) return 1;
        int g = s->n_tokens - s->n_prompt; /* generated so far */
        if (g < s->n_forced)
            id = s->forced[g], st = ATLAS_OK;
        else
            st = atlas_sampler_sample(s->sampler, e->row, vocab, s->tokens,
                                      (size_t)s->n_tokens, &id);
        if (st == ATLAS_OK && s->matcher) st = atlas_constraint_matcher_accept(s->matcher, id);
        if (st == ATLAS_OK && (s->logprobs || s->top_logprobs))
            st = atlas_sampler_logprobs(row, vocab, id, &lp, s->top_logprobs, top_ids, top_lps,
                                        &n_top);
        for (int i = 0; i < n_top; i++) top[i] = (atlas_top_logprob){top_ids[i], top_lps[i]};
    } else {
        st = atlas_sampler_sample(s->sampler, row, vocab, s->tokens, (size_t)s->n_tokens, &id);
    }
    if (st != ATLAS_OK) {
        atlas_engine_seq_fail(s, st, atlas_last_error());
        return 1;
    }
    int ended = atlas_engine_seq_accept(e, s, id, lp, top, n_top);
    /* a complete program ends the text (STOP also when max_tokens ran out at that token);
     * END then releases what was held back */
    if (s->matcher && atlas_constraint_matcher_done(s->matcher) &&
        (!ended || s->finish == ATLAS_FINISH_LENGTH)) {
        s->finish = ATLAS_FINISH_STOP;
        ended = 1;
    }
    return ended;
}

/* The masks of the constrained sequences that sample this step.  They depend only on the
 * tokens so far, so a helper thread computes them while the forward pass runs. */
static void compute_masks(atlas_engine *e, int vocab) {
    for (int i = 0; i < e->n_plan; i++) {
        seq *s = e->plan[i].s;
        if (e->plan[i].logits && s->matcher)
            s->n_allowed = atlas_constraint_matcher_allowed(s->matcher, s->allowed, vocab);
    }
}

typedef struct mask_work {
    atlas_engine *e;
    int vocab;
} mask_work;

static void *mask_main(void *arg) {
    mask_work *w = arg;
    compute_masks(w->e, w->vocab);
    return NULL;
}

/* Starts compute_masks on a thread when some sequence needs it (returns 1: join *th), or
 * runs it here when no thread can be started. */
static int masks_begin(atlas_engine *e, int vocab, mask_work *w, pthread_t *th) {
    int any = 0;
    for (int i = 0; i < e->n_plan; i++) any |= e->plan[i].logits && e->plan[i].s->matcher;
    if (!any) return 0;
    *w = (mask_work){e, vocab};
    if (pthread_create(th, NULL, mask_main, w) == 0) return 1;
    compute_masks(e, vocab);
    return 0;
}

/* Runs the planned batch and samples; marks ended sequences SEQ_DONE.  Outside e->mu. */
static void run_step(atlas_engine *e, eng_model *md, const atlas_batch *b) {
    int vocab = md->cfg.vocab_size, greedy = 1;
    for (int i = 0; i < e->n_plan; i++)
        if (e->plan[i].logits && !e->plan[i].s->plain_greedy) greedy = 0;
    atlas_status st = ATLAS_OK;
    size_t need = (size_t)b->n_logits * vocab;
    if (!greedy && need > e->logits_cap) {
        float *l = realloc(e->logits, need * sizeof *l);
        if (l) {
            e->logits = l;
            e->logits_cap = need;
        } else {
            st = atlas_fail(ATLAS_ERR_NOMEM, "engine: logits of %d rows", b->n_logits);
        }
    }
    if (!greedy && (size_t)vocab > e->row_cap) { /* models differ in vocabulary */
        float *r = realloc(e->row, (size_t)vocab * sizeof *r);
        if (r) {
            e->row = r;
            e->row_cap = (size_t)vocab;
        } else {
            st = atlas_fail(ATLAS_ERR_NOMEM, "engine: a logits row of %d", vocab);
        }
    }
    mask_work w;
    pthread_t th;
    int masking = st == ATLAS_OK && masks_begin(e, vocab, &w, &th);
    if (st == ATLAS_OK)
        st = greedy ? atlas_model_forward_argmax(md->m, b, e->b_ids)
                    : atlas_model_forward(md->m, b, e->logits);
    if (masking) pthread_join(th, NULL);
    if (st != ATLAS_OK) {
        for (int i = 0; i < e->n_plan; i++) {
            atlas_engine_seq_fail(e->plan[i].s, st, atlas_last_error());
            e->plan[i].s->state = SEQ_DONE;
        }
        return;
    }
    for (int i = 0, row = 0; i < e->n_plan; i++) {
        seq *s = e->plan[i].s;
        s->n_computed += e->plan[i].n;
        if (!e->plan[i].logits) continue;
        int ended;
        if (greedy) {
            ended = atlas_engine_seq_accept(e, s, e->b_ids[row], 0, NULL, 0);
        } else {
            ended = sample_row(e, s, e->logits + (size_t)row * vocab, vocab);
        }
        row++;
        if (ended) s->state = SEQ_DONE;
    }
}

/* ---- greedy decode steps queued a step ahead ----------------------------------------------
 * When a step is only plain greedy decodes (one token a sequence, the argmax of the raw
 * logits) and nothing else waits, the next step is queued on the backend before this one is
 * collected (atlas_model_forward_argmax_queue: its tokens are this step's argmax, taken on
 * the device), so that the GPU computes step k + 1 while the host emits step k's tokens.
 * The run ends, and the queued step is collected, as soon as a sequence ends, something
 * waits to be admitted, a command or another model has work, or a sequence would need a KV
 * block that is not free. */

static int ahead_eligible(const atlas_engine *e) {
    if (e->n_plan == 0) return 0;
    for (int i = 0; i < e->n_plan; i++) {
        const plan_entry *pe = &e->plan[i];
        if (pe->n != 1 || !pe->logits || !pe->s->plain_greedy ||
            pe->s->n_tokens - pe->s->n_computed != 1)
            return 0;
    }
    return 1;
}

/* Whether another step may be queued behind `q` uncollected ones, and if so reserves its KV
 * row for every sequence.  Under e->mu. */
static int ahead_more(atlas_engine *e, eng_model *md, int q) {
    if (e->stop || e->n_waiting > 0 || e->cmds || md->draining) return 0;
    for (int i = 0; i < e->n_models; i++)
        if (&e->models[i] != md && e->models[i].n_running > 0) return 0;
    for (int i = 0; i < e->n_plan; i++) {
        const seq *s = e->plan[i].s;
        int gen = s->n_tokens - s->n_prompt;
        if (atomic_load(&s->cancel) || gen + q + 1 > s->max_tokens || s->n_tokens + q + 1 > s->cap)
            return 0;
    }
    for (int i = 0; i < e->n_plan; i++) {
        seq *s = e->plan[i].s;
        if (!atlas_kv_table_reserve(&md->pool, &s->kv, s->n_computed + q + 1)) return 0;
    }
    return 1;
}

/* Runs the planned step and as many queued steps after it as ahead_more allows; marks
 * ended sequences SEQ_DONE and returns the number of steps.  Outside e->mu. */
static int run_ahead(atlas_engine *e, eng_model *md, atlas_batch *b) {
    atlas_status st = atlas_model_forward_argmax_queue(md->m, b);
    int q = st == ATLAS_OK, steps = q, more = q; /* more: 0 once nothing more is queued */
    while (q > 0) {
        if (more) {
            pthread_mutex_lock(&e->mu);
            more = ahead_more(e, md, q);
            if (more) st = fill_tables(e, b);
            pthread_mutex_unlock(&e->mu);
        }
        if (more && st == ATLAS_OK) {
            for (int i = 0; i < e->n_plan; i++) {
                const seq *s = e->plan[i].s;
                e->b_pos[i] = s->n_computed + q;
                e->b_ctx[i] = s->n_computed + q + 1;
            }
            b->tokens = NULL; /* the argmax of the step queued before */
            st = atlas_model_forward_argmax_queue(md->m, b);
            if (st == ATLAS_OK) q++, steps++;
        }
        if (st != ATLAS_OK) break;
        st = atlas_model_argmax_collect(md->m, e->b_ids, e->n_plan);
        if (st != ATLAS_OK) break;
        q--;
        for (int i = 0; i < e->n_plan; i++) {
            seq *s = e->plan[i].s;
            if (s->state == SEQ_DONE) continue; /* its row of a step queued past its end */
            s->n_computed++;
            if (atlas_engine_seq_accept(e, s, e->b_ids[i], 0, NULL, 0)) {
                s->state = SEQ_DONE;
                more = 0; /* an end: the steps already queued are collected, no more */
            }
        }
    }
    if (st != ATLAS_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", atlas_last_error());
        while (q-- > 0) (void)atlas_model_argmax_collect(md->m, e->b_ids, e->n_plan);
        for (int i = 0; i < e->n_plan; i++) {
            if (e->plan[i].s->state == SEQ_DONE) continue;
            atlas_engine_seq_fail(e->plan[i].s, st, msg);
            e->plan[i].s->state = SEQ_DONE;
        }
    }
    return steps;
}

/* One step of md.  Under e->mu (dropped for the forward pass and the callbacks). */
static int step(atlas_engine *e, eng_model *md) {
    if (!md->m || md->n_running == 0) return 0;
    plan_step(e, md);
    flush_done(e); /* a preempted sequence whose requeueing failed */
    if (e->n_plan == 0) return 1;
    atlas_batch b;
    atlas_status st = fill_batch(e, &b);
    if (st != ATLAS_OK) {
        for (int i = 0; i < e->n_plan; i++) {
            seq *s = e->plan[i].s;
            s->plan = -1;
            atlas_engine_seq_fail(s, st, atlas_last_error());
            end_running(e, md, s);
        }
        flush_done(e);
        return 1;
    }
    int prefill = 0;
    for (int i = 0; i < e->n_plan; i++)
        if (!e->plan[i].logits || e->plan[i].s->n_tokens - e->plan[i].s->n_computed > 1)
            prefill += e->plan[i].n;
    int steps = 1, ahead = ahead_eligible(e);
    pthread_mutex_unlock(&e->mu);
    if (ahead)
        steps = run_ahead(e, md, &b);
    else
        run_step(e, md, &b);
    pthread_mutex_lock(&e->mu);
    e->metrics.steps += (uint64_t)steps;
    e->metrics.last_batch_tokens = b.n_tokens;
    e->metrics.prompt_tokens += (uint64_t)prefill;
    if (!md->draining) md->last_used = ++e->clock; /* keeps a draining victim the LRU one */
    for (int i = 0; i < e->n_plan; i++)
        if (e->plan[i].s->state == SEQ_DONE) end_running(e, md, e->plan[i].s);
    e->n_plan = 0;
    flush_done(e);
    return 1;
}

/* ---- the thread ------------------------------------------------------------------------- */

static atlas_status alloc_buffers(atlas_engine *e) {
    size_t n = (size_t)e->p.batch_tokens + 1;
    e->plan = calloc(n, sizeof *e->plan);
    e->b_tokens = malloc(n * sizeof(int32_t));
    e->b_pos = malloc(n * sizeof(int32_t));
    e->b_start = malloc((n + 1) * sizeof(int32_t));
    e->b_ctx = malloc(n * sizeof(int32_t));
    e->b_rows = malloc(n * sizeof(int32_t));
    e->b_ids = malloc(n * sizeof(int32_t));
    if (!e->plan || !e->b_tokens || !e->b_pos || !e->b_start || !e->b_ctx || !e->b_rows ||
        !e->b_ids)
        return atlas_fail(ATLAS_ERR_NOMEM, "engine: batch buffers");
    return ATLAS_OK;
}

static void fail_all_waiting(atlas_engine *e, atlas_status st, const char *msg) {
    while (e->n_waiting > 0) {
        seq *s = e->waiting[0];
        waiting_remove_at(e, 0);
        atlas_engine_seq_fail(s, st, msg);
        push_done(e, s);
    }
    flush_done(e);
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
            fail_all_waiting(e, bst, bmsg);
            for (eng_cmd *c = e->cmds; c; c = e->cmds) cmd_complete(e, c, bst, bmsg);
            pthread_cond_wait(&e->wake, &e->mu);
            continue;
        }
        int worked = reap_cancelled(e);
        worked |= do_commands(e);
        worked |= do_residency(e);
        worked |= admit(e);
        for (int k = 0; k < e->n_models && !e->stop; k++) {
            eng_model *md = &e->models[(rr + k) % e->n_models];
            worked |= step(e, md);
        }
        rr = (rr + 1) % e->n_models;
        if (!worked && !e->stop) {
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
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

void atlas_engine_sched_shutdown(atlas_engine *e) {
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->n_waiting; i++) e->waiting[i]->finish = ATLAS_FINISH_CANCELLED;
    while (e->n_waiting > 0) {
        seq *s = e->waiting[0];
        waiting_remove_at(e, 0);
        push_done(e, s);
    }
    for (int m = 0; m < e->n_models; m++) {
        eng_model *md = &e->models[m];
        while (md->n_running > 0) {
            seq *s = md->running[0];
            s->finish = ATLAS_FINISH_CANCELLED;
            end_running(e, md, s);
        }
    }
    flush_done(e);
    for (eng_cmd *c = e->cmds; c; c = e->cmds)
        cmd_complete(e, c, ATLAS_ERR_INVALID, "the engine is shutting down");
    for (int m = 0; m < e->n_models; m++)
        if (e->models[m].m) release_model(e, &e->models[m]);
    pthread_mutex_unlock(&e->mu);
    free(e->plan);
    free(e->b_tokens);
    free(e->b_pos);
    free(e->b_start);
    free(e->b_ctx);
    free(e->b_rows);
    free(e->b_ids);
    free(e->b_table);
    free(e->logits);
    free(e->row);
    free(e->done);
}

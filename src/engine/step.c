/* engine/step.c — one step of a model: planning the batch (decode tokens first, then prompt
 * chunks, preempting the newest sequence when KV blocks run out), filling the batch, the
 * forward pass, constraint masks, sampling, and greedy steps queued a step ahead.  Called by
 * the scheduler loop (sched.c); calls running.c, output.c and seq.c below it.
 *
 * Only the scheduler thread runs this, so what it reads of the plan and the sequences without
 * the lock cannot change under it. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/host.h"
#include "core/error.h"
#include "engine/engine_internal.h"
#include "model/forward.h"

/* Plans the step for md: first one decode token for every sequence that has finished its
 * prompt, then prompt chunks in admission order, within the step's budget, where a prompt
 * token costs its attention over the keys before it too (engine/budget.h; a decode token
 * costs one, so that no decode is ever left out of a step for its context).  When the pool
 * runs out of blocks the newest sequence is preempted (possibly the one asking).
 * Under e->mu. */
static void plan_step(atlas_engine *e, eng_model *md) {
    double budget = md->batch_tokens;
    e->n_plan = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < md->n_running && budget > 0; i++) {
            seq *s = md->running[i];
            int remaining = s->n_tokens - s->n_computed;
            if ((remaining == 1) != (pass == 0) || s->plan >= 0) continue;
            if (pass == 1 && !atlas_engine_share_prefix(e, md, s)) continue;
            remaining = s->n_tokens - s->n_computed;
            int take = pass == 0 ? 1 : atlas_step_cost_take(&md->cost, s->n_computed, remaining, budget);
            if (take == 0 && e->n_plan == 0) take = 1; /* a step computes something */
            if (take == 0) continue;
            int self = 0;
            while (!atlas_kv_table_reserve(&md->pool, &s->kv, s->n_computed + take)) {
                seq *v = md->running[md->n_running - 1]; /* the newest */
                if (v == s) {
                    self = 1;
                    break;
                }
                atlas_engine_preempt(e, md, v, &budget);
            }
            if (self) {
                atlas_engine_preempt(e, md, s, &budget);
                i--;
                continue;
            }
            double cost = pass == 0 ? 1.0 : atlas_step_cost_of(&md->cost, s->n_computed, take);
            s->plan = e->n_plan;
            e->plan[e->n_plan++] = (plan_entry){.s = s, .n = take, .pos0 = s->n_computed,
                                                .cost = cost,
                                                .logits = s->n_computed + take == s->n_tokens};
            budget -= cost;
            /* the blocks this step completes: found by the sequences planned after s, which
             * then wait for them rather than compute them too */
            atlas_kv_table_commit(&md->pool, &s->kv, s->tokens, s->n_computed + take, true);
        }
    }
}

/* Writes the block table of every sequence of entries p[n] into e->b_table (rows of the
 * longest table's width) and sets the batch's table and width. */
static atlas_status fill_tables(atlas_engine *e, const plan_entry *p, int n, atlas_batch *b) {
    int max_blocks = 1;
    for (int i = 0; i < n; i++)
        if (p[i].s->kv.n > max_blocks) max_blocks = p[i].s->kv.n;
    size_t need = (size_t)n * max_blocks;
    if (need > e->b_table_cap) {
        int32_t *t = realloc(e->b_table, need * sizeof *t);
        if (!t) return atlas_fail(ATLAS_ERR_NOMEM, "engine: block table of %zu", need);
        e->b_table = t;
        e->b_table_cap = need;
    }
    for (int i = 0; i < n; i++) {
        const seq *s = p[i].s;
        int32_t *row = e->b_table + (size_t)i * max_blocks;
        memcpy(row, s->kv.ids, (size_t)s->kv.n * sizeof *row);
        for (int j = s->kv.n; j < max_blocks; j++) row[j] = 0;
    }
    b->block_table = e->b_table;
    b->max_blocks = max_blocks;
    return ATLAS_OK;
}

/* An embedding model's rows of entry pe, whose tokens are the batch's [first, first + n):
 * the hidden states its pooling reads (mean: all; last: the sequence's last; cls: its
 * first), appended to e->b_rows at *n_rows. */
static void embed_rows(atlas_engine *e, const eng_model *md, plan_entry *pe, int first,
                       int *n_rows) {
    pe->row0 = *n_rows;
    if (md->cfg.pooling == ATLAS_POOL_MEAN)
        for (int j = 0; j < pe->n; j++) e->b_rows[(*n_rows)++] = first + j;
    else if (md->cfg.pooling == ATLAS_POOL_LAST && pe->logits)
        e->b_rows[(*n_rows)++] = first + pe->n - 1;
    else if (md->cfg.pooling == ATLAS_POOL_CLS && pe->s->n_computed == 0)
        e->b_rows[(*n_rows)++] = first;
    pe->rows = *n_rows - pe->row0;
}

/* Fills the batch arrays from entries p[n_plan] (e->plan, or a step planned behind a queued
 * one: a sequence with a row there, s->q_row, takes its first token from it); the batch's
 * logit rows are an embedding model's hidden-state rows its pooling reads.  s->plan is
 * reset here: entries are then addressed by index. */
static atlas_status fill_batch(atlas_engine *e, const eng_model *md, plan_entry *p, int n_plan,
                               atlas_batch *b) {
    int n = 0, n_logits = 0, embeds = md->cfg.pooling != ATLAS_POOL_NONE;
    for (int i = 0; i < n_plan; i++) {
        plan_entry *pe = &p[i];
        seq *s = pe->s;
        s->plan = -1;
        e->b_start[i] = n;
        for (int j = 0; j < pe->n; j++, n++) {
            e->b_tokens[n] = j == 0 && s->q_row >= 0 ? ATLAS_BATCH_PREV(s->q_row)
                                                     : s->tokens[pe->pos0 + j];
            e->b_pos[n] = pe->pos0 + j;
        }
        e->b_ctx[i] = pe->pos0 + pe->n;
        e->b_rope[i] = s->n_tokens; /* a chunked prompt's whole length, as one prefill's */
        if (embeds) embed_rows(e, md, pe, n - pe->n, &n_logits);
        else if (pe->logits) e->b_rows[n_logits++] = n - 1;
    }
    e->b_start[n_plan] = n;
    *b = (atlas_batch){.n_tokens = n, .tokens = e->b_tokens, .positions = e->b_pos,
                       .n_seqs = n_plan, .seq_start = e->b_start, .seq_ctx = e->b_ctx,
                       .seq_rope_len = e->b_rope,
                       .n_logits = n_logits, .logit_rows = e->b_rows, .hidden = embeds};
    return fill_tables(e, p, n_plan, b);
}

/* ---- running a step --------------------------------------------------------------------- */

/* A constrained sequence: gives the tokens its matcher does not allow -inf in logits (a copy
 * of the raw row), and its eos and stop ids too unless the text may end here (in free text:
 * else they would end the text before the program is complete; special tokens have no bytes
 * for the matcher anyway, but a stop id may be a plain token).  0 (s failed) when no token
 * is allowed. */
static int mask_row(const atlas_engine *e, seq *s, float *logits, int vocab) {
    int n = s->n_allowed; /* s->allowed: from compute_masks */
    const eng_model *md = &e->models[s->model];
    int keep = atlas_constraint_matcher_can_end(s->matcher);
    for (int i = 0; !keep && !s->ignore_eos && i < md->n_eos; i++)
        if (md->eos[i] >= 0 && md->eos[i] < vocab && s->allowed[md->eos[i]])
            s->allowed[md->eos[i]] = 0, n--;
    for (int i = 0; !keep && i < s->n_stop_ids; i++)
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

/* Whether s's generated tokens end with ids[0 .. n). */
static int tokens_end_with(const seq *s, const int32_t *ids, int n) {
    if (n < 1 || s->n_tokens - s->n_prompt < n) return 0;
    return !memcmp(s->tokens + s->n_tokens - n, ids, (size_t)n * sizeof *ids);
}

/* The token forced next, -1 when s samples: teacher forcing's, or the closing tag of a think
 * block whose budget is spent (starting it here). */
static int32_t forced_next(seq *s) {
    int g = s->n_tokens - s->n_prompt; /* generated so far */
    if (g < s->n_forced) return s->forced[g];
    if (!s->think_budget || !s->think_in) return -1;
    if (s->think_forcing < 0 && s->think_used >= s->think_budget) s->think_forcing = 0;
    return s->think_forcing >= 0 ? s->think_close[s->think_forcing] : -1;
}

/* Follows s's think blocks after its newest token: a closing tag forced or written ends
 * the block, an opening tag starts one, and a token inside counts against the budget. */
static void think_track(seq *s) {
    if (s->think_forcing >= 0) {
        if (++s->think_forcing < s->n_think_close) return;
        s->think_forcing = -1;
        s->think_in = 0;
    } else if (s->think_in) {
        if (tokens_end_with(s, s->think_close, s->n_think_close)) s->think_in = 0;
        else s->think_used++;
    } else if (tokens_end_with(s, s->think_open, s->n_think_open)) {
        s->think_in = 1;
    }
}

/* s takes id (with its logprobs); returns 1 when s ends. */
static int take_token(atlas_engine *e, seq *s, int32_t id, float lp, const atlas_top_logprob *top,
                      int n_top) {
    int ended = atlas_engine_seq_accept(e, s, id, lp, top, n_top);
    if (s->think_budget && !ended) think_track(s);
    /* a complete program ends the text (STOP also when max_tokens ran out at that token);
     * END then releases what was held back */
    if (s->matcher && atlas_constraint_matcher_done(s->matcher) &&
        (!ended || s->finish == ATLAS_FINISH_LENGTH)) {
        s->finish = ATLAS_FINISH_STOP;
        ended = 1;
    }
    return ended;
}

/* Samples s's next token on the host from its logits row (and takes logprobs of the raw row
 * first), drawing at its position as the backend's sample op does; returns 1 when s ends. */
static int sample_row(atlas_engine *e, seq *s, float *row, int vocab) {
    atlas_top_logprob top[ATLAS_ENGINE_MAX_TOP_LOGPROBS];
    int32_t top_ids[ATLAS_ENGINE_MAX_TOP_LOGPROBS];
    float top_lps[ATLAS_ENGINE_MAX_TOP_LOGPROBS], lp = 0;
    int n_top = 0;
    int32_t id = forced_next(s);
    uint64_t at = (uint64_t)s->n_tokens;
    atlas_status st = ATLAS_OK;
    if (s->logprobs || s->top_logprobs || s->matcher) {
        memcpy(e->row, row, (size_t)vocab * sizeof *row); /* sampling overwrites it */
        if (s->matcher && !mask_row(e, s, e->row, vocab)) return 1;
        if (id < 0)
            st = atlas_sampler_sample_at(s->sampler, e->row, vocab, s->tokens,
                                         (size_t)s->n_tokens, at, &id);
        if (st == ATLAS_OK && s->matcher) st = atlas_constraint_matcher_accept(s->matcher, id);
        if (st == ATLAS_OK && (s->logprobs || s->top_logprobs))
            st = atlas_sampler_logprobs(row, vocab, id, &lp, s->top_logprobs, top_ids, top_lps,
                                        &n_top);
        for (int i = 0; i < n_top; i++) top[i] = (atlas_top_logprob){top_ids[i], top_lps[i]};
    } else if (id < 0) {
        st = atlas_sampler_sample_at(s->sampler, row, vocab, s->tokens, (size_t)s->n_tokens, at,
                                     &id);
    }
    if (st != ATLAS_OK) {
        atlas_engine_seq_fail(s, st, atlas_last_error());
        return 1;
    }
    return take_token(e, s, id, lp, top, n_top);
}

/* s takes what the backend's sample op drew for it; returns 1 when s ends. */
static int take_sampled(atlas_engine *e, seq *s, const atlas_sample_out *o) {
    _Static_assert((int)ATLAS_SAMPLE_MAX_TOP == (int)ATLAS_ENGINE_MAX_TOP_LOGPROBS,
                   "the sample op returns every top logprob a request may ask");
    atlas_top_logprob top[ATLAS_ENGINE_MAX_TOP_LOGPROBS];
    for (int i = 0; i < o->n_top; i++) top[i] = (atlas_top_logprob){o->top_ids[i], o->top_logprobs[i]};
    return take_token(e, s, o->id, o->logprob, top, o->n_top);
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

/* The last error, the model's directory taken out of it, into msg[512]. */
static void step_error(const eng_model *md, char *msg) {
    snprintf(msg, 512, "%s", atlas_last_error());
    atlas_engine_strip_dir(msg, md->dir);
}

/* Fails every sequence of the entries p[n] not ended already with st, msg. */
static void fail_entries(plan_entry *p, int n, atlas_status st, const char *msg) {
    for (int i = 0; i < n; i++) {
        if (!p[i].s || p[i].s->state == SEQ_DONE) continue;
        atlas_engine_seq_fail(p[i].s, st, msg);
        p[i].s->state = SEQ_DONE;
    }
}

/* A failed forward fails every sequence of the step with its message. */
static void fail_plan(atlas_engine *e, const eng_model *md, atlas_status st) {
    e->step_failed = 1;
    char msg[512];
    step_error(md, msg);
    fail_entries(e->plan, e->n_plan, st, msg);
}

/* Host buffers for n rows of logits chosen on the host and the copy that sampling one
 * overwrites. */
static atlas_status host_rows(atlas_engine *e, int n, int vocab) {
    size_t need = (size_t)n * vocab;
    if (need > e->logits_cap) {
        float *l = realloc(e->logits, need * sizeof *l);
        if (!l) return atlas_fail(ATLAS_ERR_NOMEM, "engine: logits of %d rows", n);
        e->logits = l;
        e->logits_cap = need;
    }
    if ((size_t)vocab > e->row_cap) { /* models differ in vocabulary */
        float *r = realloc(e->row, (size_t)vocab * sizeof *r);
        if (!r) return atlas_fail(ATLAS_ERR_NOMEM, "engine: a logits row of %d", vocab);
        e->row = r;
        e->row_cap = (size_t)vocab;
    }
    return ATLAS_OK;
}

/* Runs the planned batch and samples; marks ended sequences SEQ_DONE.  Outside e->mu.
 * Plain greedy steps take the backend's argmax.  Other steps sample on the backend (the
 * sample op: only the ids and logprobs come back), but for the rows whose token is chosen
 * on the host (a constraint's mask, a forced token): the op skips those, and only their
 * rows of logits are downloaded, each on its own, since such rows are few and a whole
 * step's logits are large (256 rows of a 128k vocabulary: 131 MB). */
static void run_step(atlas_engine *e, eng_model *md, const atlas_batch *b) {
    int vocab = md->cfg.vocab_size, greedy = 1, n_adj = 0, n_host = 0;
    for (int i = 0; i < e->n_plan; i++)
        if (e->plan[i].logits && !e->plan[i].s->plain_greedy) greedy = 0;
    atlas_status st = ATLAS_OK;
    if (!greedy) st = atlas_engine_sample_rows(e, b->n_logits, &n_adj, &n_host);
    if (st == ATLAS_OK && n_host > 0) st = host_rows(e, n_host, vocab);
    mask_work w;
    pthread_t th;
    int masking = st == ATLAS_OK && masks_begin(e, vocab, &w, &th);
    atlas_model_sampling smp = {e->smp_rows, e->smp_adj, n_adj, e->smp_out, e->logits};
    if (st == ATLAS_OK)
        st = greedy ? atlas_model_forward_argmax(md->m, b, e->b_ids)
                    : atlas_model_forward_sample(md->m, b, &smp);
    if (masking) pthread_join(th, NULL);
    if (st != ATLAS_OK) {
        fail_plan(e, md, st);
        return;
    }
    for (int i = 0, row = 0, k = 0; i < e->n_plan; i++) {
        seq *s = e->plan[i].s;
        s->n_computed += e->plan[i].n;
        if (!e->plan[i].logits) continue;
        int ended;
        if (greedy)
            ended = atlas_engine_seq_accept(e, s, e->b_ids[row], 0, NULL, 0);
        else if (e->smp_rows[row].flags & ATLAS_SAMPLE_SKIP)
            ended = sample_row(e, s, e->logits + (size_t)k++ * vocab, vocab);
        else
            ended = take_sampled(e, s, &e->smp_out[row]);
        row++;
        if (ended) s->state = SEQ_DONE;
    }
}

/* ---- an embedding model's step -------------------------------------------------------------
 * The forward gives the final-norm hidden states of the rows fill_batch asked for; each
 * sequence adds its rows into its pool, and the one whose prompt is complete ends with its
 * vector (mean: the sum over its tokens divided by their number; then L2-normalised when
 * the model says so, as sentence-transformers' Normalize: x / max(|x|, 1e-12)). */

static void pool_entry(const eng_model *md, const plan_entry *pe, const float *rows) {
    seq *s = pe->s;
    int d = md->cfg.hidden;
    if (s->n_computed == 0) /* a first chunk (again, after a preemption): a new sum */
        memset(s->pool, 0, (size_t)d * sizeof *s->pool);
    for (int r = 0; r < pe->rows; r++) {
        const float *h = rows + (size_t)(pe->row0 + r) * d;
        for (int k = 0; k < d; k++)
            s->pool[k] = md->cfg.pooling == ATLAS_POOL_MEAN ? s->pool[k] + h[k] : h[k];
    }
    if (!pe->logits) return; /* the prompt goes on in a later step */
    double div = md->cfg.pooling == ATLAS_POOL_MEAN ? s->n_tokens : 1, norm = 0;
    for (int k = 0; k < d; k++) norm += (s->pool[k] / div) * (s->pool[k] / div);
    norm = md->cfg.normalize ? fmax(sqrt(norm), 1e-12) : 1;
    for (int k = 0; k < d; k++) s->vec[k] = (float)(s->pool[k] / div / norm);
}

static void run_embed_step(atlas_engine *e, eng_model *md, const atlas_batch *b) {
    size_t need = (size_t)b->n_logits * md->cfg.hidden;
    atlas_status st = ATLAS_OK;
    if (need > e->logits_cap) {
        float *l = realloc(e->logits, need * sizeof *l);
        if (l) {
            e->logits = l;
            e->logits_cap = need;
        } else {
            st = atlas_fail(ATLAS_ERR_NOMEM, "engine: hidden states of %d rows", b->n_logits);
        }
    }
    if (st == ATLAS_OK) st = atlas_model_forward(md->m, b, e->logits);
    if (st != ATLAS_OK) {
        fail_plan(e, md, st);
        return;
    }
    for (int i = 0; i < e->n_plan; i++) {
        plan_entry *pe = &e->plan[i];
        pool_entry(md, pe, e->logits);
        pe->s->n_computed += pe->n;
        if (pe->logits) pe->s->state = SEQ_DONE; /* finish STOP: the vector is made */
    }
}

/* ---- steps queued a step ahead ------------------------------------------------------------
 * When every sequence of the model takes its tokens as a queued step can (plain greedy: the
 * argmax of the raw logits; plain sampled: a draw that asks for nothing the tokens before
 * change: temperature, top-k, top-p, min-p) and nothing else needs the scheduler, the next
 * step is planned and queued on the backend before this one is collected
 * (atlas_model_forward_argmax_queue or _sample_queue), so that the GPU computes step k + 1
 * while the host emits step k's tokens.  That step is planned as plan_step plans one, from
 * where the queued step leaves each sequence: one with a logit row there decodes the id it
 * will get (ATLAS_BATCH_PREV: taken on the device), prompts go on in chunks, requests
 * admitted meanwhile start theirs, and a sequence whose next token ends it (max_tokens, its
 * context) gets no row.  A draw's uniform depends on its seed and position only, so it is
 * the one the step run alone would use.  A sequence that ends when a step is collected is
 * released then; its row of the step queued behind is computed and dropped (it writes a
 * position past the sequence's registered blocks, in a block that step's successors only
 * reuse after it on the stream).  The run ends, and plan_step takes over, as soon as a
 * command, another model, a cancellation, a sequence that is not plain or a KV block that is
 * not free (preemption) needs it. */

enum { AHEAD_NO, AHEAD_GREEDY, AHEAD_SAMPLED };

/* Whether every sequence of md may have rows in queued steps. */
static int all_queueable(const eng_model *md) {
    for (int i = 0; i < md->n_running; i++)
        if (!(md->running[i]->plain_greedy || md->running[i]->plain_sampled)) return 0;
    return 1;
}

/* How a queued step of entries p[n] takes its ids: AHEAD_NO without a logit row (a step
 * queued gives ids), greedy when no row samples, or when the backend queues no draws. */
static int step_mode(const eng_model *md, const plan_entry *p, int n) {
    int mode = AHEAD_NO;
    for (int i = 0; i < n; i++) {
        if (!p[i].logits) continue;
        if (p[i].s->plain_sampled)
            return atlas_model_queues_samples(md->m) ? AHEAD_SAMPLED : AHEAD_NO;
        mode = AHEAD_GREEDY;
    }
    return mode;
}

static int ahead_eligible(const atlas_engine *e, const eng_model *md) {
    if (e->n_plan == 0 || e->p.step_ahead == ATLAS_STEP_AHEAD_OFF) return AHEAD_NO;
    /* a backend that computes a queued step at once gains nothing by it, and each token
     * would be emitted a step late: the first one's time would include the second's */
    atlas_model_info info;
    atlas_model_get_info(md->m, &info);
    if (!info.queue_overlaps && e->p.step_ahead != ATLAS_STEP_AHEAD_ON) return AHEAD_NO;
    return all_queueable(md) ? step_mode(md, e->plan, e->n_plan) : AHEAD_NO;
}

/* Queues the step of entries p[n], filled into b. */
static atlas_status ahead_queue(atlas_engine *e, eng_model *md, const atlas_batch *b,
                                const plan_entry *p, int n, int mode) {
    if (mode == AHEAD_GREEDY) return atlas_model_forward_argmax_queue(md->m, b);
    ATLAS_TRY(atlas_engine_queued_rows(e, p, n));
    return atlas_model_forward_sample_queue(md->m, b, e->smp_rows);
}

/* The entries p[n] of a step just queued: each sequence's rows after it start past them, and
 * one with a logit row takes its next token from it. */
static void ahead_mark(plan_entry *p, int n) {
    for (int i = 0, row = 0; i < n; i++) {
        p[i].s->ahead += p[i].n;
        p[i].s->q_row = p[i].logits ? row++ : -1;
    }
}

/* Whether another step of md may be planned behind the queued one; admits what waits for md
 * meanwhile.  Under e->mu. */
static int ahead_more(atlas_engine *e, eng_model *md) {
    if (e->stop || e->cmds || md->draining) return 0;
    /* a load's kernel modules wait for the queue to empty: let it */
    if (e->quiet_host && atlas_host_quiet_wanted(e->quiet_host)) return 0;
    if (e->n_waiting > 0) atlas_engine_admit(e);
    for (int i = 0; i < e->n_waiting; i++) /* another model's: residency decides */
        if (&e->models[e->waiting[i]->model] != md) return 0;
    for (int i = 0; i < e->n_models; i++)
        if (&e->models[i] != md && e->models[i].n_running > 0) return 0;
    for (int i = 0; i < md->n_running; i++)
        if (atomic_load(&md->running[i]->cancel)) return 0;
    return all_queueable(md);
}

/* Plans the step behind the queued one into nx, as plan_step plans one but without
 * preempting; *prefill gets its prompt tokens.  Returns its entries, 0 when there is none to
 * queue (no logit row in it, or a KV block not free).  Under e->mu. */
static int ahead_plan(atlas_engine *e, eng_model *md, plan_entry *nx, int *prefill) {
    double budget = md->batch_tokens;
    int n = 0, rows = 0;
    *prefill = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < md->n_running && budget > 0; i++) {
            seq *s = md->running[i];
            int pending = s->q_row >= 0, gen = s->n_tokens - s->n_prompt;
            /* its next token ends it: nothing comes after it */
            if (pending && (gen + 2 > s->max_tokens || s->n_tokens + 2 > s->cap)) continue;
            int base = s->n_computed + s->ahead, known = s->n_tokens - base;
            if ((pending || known == 1) != (pass == 0)) continue;
            if (pass == 1 && s->ahead == 0) { /* nothing of it queued: it may share a prefix */
                if (!atlas_engine_share_prefix(e, md, s)) continue;
                base = s->n_computed;
                known = s->n_tokens - base;
            }
            int take = pass == 0 ? 1 : atlas_step_cost_take(&md->cost, base, known, budget);
            if (take == 0 && n == 0) take = 1; /* a step computes something */
            if (take == 0) continue;
            if (!atlas_kv_table_reserve(&md->pool, &s->kv, base + take)) return 0;
            double cost = pass == 0 ? 1.0 : atlas_step_cost_of(&md->cost, base, take);
            int logits = pending || base + take == s->n_tokens;
            nx[n++] = (plan_entry){.s = s, .n = take, .pos0 = base, .cost = cost,
                                   .logits = logits};
            rows += logits;
            if (!pending && !(known == 1 && s->ahead == 0)) *prefill += take; /* not a decode */
            budget -= cost;
            /* the blocks it completes, found pending by the sequences planned after it (not
             * a decode's: its token is not known yet; a step that is not queued after all
             * leaves them pending until they are written, atlas_kv_table_written) */
            if (!pending)
                atlas_kv_table_commit(&md->pool, &s->kv, s->tokens, base + take, true);
        }
    }
    return rows > 0 ? n : 0;
}

/* Takes the ids of the collected step's entries p[n] (outside e->mu). */
static void ahead_take(atlas_engine *e, plan_entry *p, int n) {
    for (int i = 0, row = 0; i < n; i++) {
        int r = p[i].logits ? row++ : -1;
        seq *s = p[i].s;
        if (!s) continue; /* it ended before this step ran */
        s->n_computed += p[i].n;
        s->ahead -= p[i].n;
        if (r >= 0 && atlas_engine_seq_accept(e, s, e->b_ids[r], 0, NULL, 0))
            s->state = SEQ_DONE;
    }
}

/* Releases md's sequences that ended (SEQ_DONE).  Under e->mu. */
static void end_done(atlas_engine *e, eng_model *md) {
    for (int i = 0; i < md->n_running; i++)
        if (md->running[i]->state == SEQ_DONE) atlas_engine_end_running(e, md, md->running[i--]);
}

/* After a step's entries p[n] were collected: their blocks are shareable, and a sequence
 * that ended is released, its entry in the step queued behind, nx[n_nx], dropped.  Under
 * e->mu. */
static void ahead_settle(atlas_engine *e, eng_model *md, plan_entry *p, int n, plan_entry *nx,
                         int n_nx) {
    for (int i = 0; i < n; i++) {
        seq *s = p[i].s;
        if (!s) continue;
        if (s->state != SEQ_DONE) {
            atlas_kv_table_written(&md->pool, &s->kv, s->n_computed);
            continue;
        }
        for (int j = 0; j < n_nx; j++)
            if (nx[j].s == s) nx[j].s = NULL;
    }
    end_done(e, md);
}

/* Waits to plan the step behind the queued one that began at t0 as late as the host can, so
 * that a request arriving meanwhile joins it rather than the step after it (a step later to
 * its first token): until that step's expected end less twice the host's time to plan and
 * queue one and 0.5 ms, or its end if that comes first; not before a step's time is known. */
static void ahead_wait(eng_model *md, double t0) {
    if (md->ahead_step_s <= 0) return;
    double until = t0 + md->ahead_step_s - 2 * md->ahead_host_s - 5e-4;
    while (atlas_engine_now() < until && !atlas_model_queued_ready(md->m)) {
        struct timespec ts = {0, 200 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* Runs the planned step and the steps planned and queued behind it while ahead_more allows,
 * settling each (e->n_plan is 0 after) and counting it in the metrics; returns the number of
 * steps queued but not counted (a failure's).  Outside e->mu. */
static int run_ahead(atlas_engine *e, eng_model *md, atlas_batch *b, int mode) {
    plan_entry *cur = e->plan, *nx = e->plan_next;
    int n_cur = e->n_plan, rows = b->n_logits, n_nx = 0, nx_rows = 0, steps = 0, counted = 0;
    atlas_status st = ahead_queue(e, md, b, cur, n_cur, mode);
    if (st == ATLAS_OK) ahead_mark(cur, n_cur), steps = 1;
    /* q_cur, q_nx: the step of cur, of nx, is queued and not collected */
    int q_cur = st == ATLAS_OK, q_nx = 0, more = q_cur;
    /* t_cur: when cur's step began on the device (its queuing, or the collect of the step
     * before it, which it followed on the stream); t_last: the last collect */
    double t_cur = atlas_engine_now(), t_last = 0;
    while (q_cur) {
        int prefill = 0, nx_mode = AHEAD_NO;
        n_nx = 0;
        if (more) ahead_wait(md, t_cur);
        double t_plan = atlas_engine_now();
        if (more) {
            pthread_mutex_lock(&e->mu);
            more = ahead_more(e, md);
            if (more) n_nx = ahead_plan(e, md, nx, &prefill);
            if (n_nx) nx_mode = step_mode(md, nx, n_nx);
            if (nx_mode == AHEAD_NO) n_nx = 0; /* a draw the backend cannot queue */
            if (n_nx) st = fill_batch(e, md, nx, n_nx, b);
            pthread_mutex_unlock(&e->mu);
            if (n_nx) nx_rows = b->n_logits;
        }
        for (int i = 0; i < n_cur; i++) /* their rows were read (fill_batch) */
            if (cur[i].s) cur[i].s->q_row = -1;
        if (n_nx && st == ATLAS_OK) st = ahead_queue(e, md, b, nx, n_nx, nx_mode);
        if (st != ATLAS_OK) break;
        if (n_nx) ahead_mark(nx, n_nx), q_nx = 1, steps++;
        if (n_nx) md->ahead_host_s = atlas_engine_now() - t_plan;
        more = more && n_nx > 0;
        q_cur = 0; /* collected, or dropped when that fails */
        st = atlas_model_argmax_collect(md->m, e->b_ids, rows);
        if (st != ATLAS_OK) break;
        double now = atlas_engine_now();
        if (t_last > 0) md->ahead_step_s = now - t_last; /* back to back on the device */
        t_last = t_cur = now;
        ahead_take(e, cur, n_cur);
        pthread_mutex_lock(&e->mu);
        ahead_settle(e, md, cur, n_cur, nx, n_nx);
        /* counted before the ENDs go out, so that a request's steps are in the metrics its
         * caller reads after it */
        e->metrics.steps++, counted++;
        e->metrics.steps_ahead += (uint64_t)q_nx;
        e->metrics.prompt_tokens += (uint64_t)prefill;
        atlas_engine_flush_done(e);
        pthread_mutex_unlock(&e->mu);
        plan_entry *t = cur;
        cur = nx, nx = t;
        n_cur = n_nx, rows = nx_rows, q_cur = q_nx, q_nx = 0, n_nx = 0;
    }
    if (st != ATLAS_OK) { /* every sequence of a step queued, or planned, fails */
        char msg[512];
        step_error(md, msg);
        e->step_failed = 1;
        if (q_cur) (void)atlas_model_argmax_collect(md->m, e->b_ids, rows);
        if (q_nx) (void)atlas_model_argmax_collect(md->m, e->b_ids, nx_rows);
        pthread_mutex_lock(&e->mu);
        fail_entries(cur, n_cur, st, msg);
        fail_entries(nx, n_nx, st, msg);
        end_done(e, md);
        pthread_mutex_unlock(&e->mu);
    }
    e->n_plan = 0;
    return steps - counted;
}

/* One step of md.  Under e->mu (dropped for the forward pass and the callbacks). */
int atlas_engine_step(atlas_engine *e, eng_model *md) {
    if (!md->m || md->n_running == 0) return 0;
    plan_step(e, md);
    atlas_engine_flush_done(e); /* a preempted sequence whose requeueing failed */
    if (e->n_plan == 0) return 1;
    atlas_batch b;
    atlas_status st = fill_batch(e, md, e->plan, e->n_plan, &b);
    if (st != ATLAS_OK) {
        for (int i = 0; i < e->n_plan; i++) {
            seq *s = e->plan[i].s;
            s->plan = -1;
            atlas_engine_seq_fail(s, st, atlas_last_error());
            atlas_engine_end_running(e, md, s);
        }
        atlas_engine_flush_done(e);
        return 1;
    }
    int prefill = 0;
    for (int i = 0; i < e->n_plan; i++)
        if (!e->plan[i].logits || e->plan[i].s->n_tokens - e->plan[i].s->n_computed > 1)
            prefill += e->plan[i].n;
    int steps = 1, ahead = ahead_eligible(e, md);
    e->step_failed = 0;
    /* counted before the step: steps queued ahead deliver ENDs before this returns */
    e->metrics.last_batch_tokens = b.n_tokens;
    e->metrics.prompt_tokens += (uint64_t)prefill;
    pthread_mutex_unlock(&e->mu);
    if (b.hidden)
        run_embed_step(e, md, &b);
    else if (ahead != AHEAD_NO)
        steps = run_ahead(e, md, &b, ahead);
    else
        run_step(e, md, &b);
    pthread_mutex_lock(&e->mu);
    e->metrics.steps += (uint64_t)steps;
    if (!md->draining) md->last_used = ++e->clock; /* keeps a draining victim the LRU one */
    /* after a failed pass every planned sequence ends, and its release forgets the blocks
     * registered for this step */
    for (int i = 0; i < e->n_plan && !e->step_failed; i++)
        atlas_kv_table_written(&md->pool, &e->plan[i].s->kv, e->plan[i].s->n_computed);
    for (int i = 0; i < e->n_plan; i++)
        if (e->plan[i].s->state == SEQ_DONE) atlas_engine_end_running(e, md, e->plan[i].s);
    e->n_plan = 0;
    atlas_engine_flush_done(e);
    return 1;
}


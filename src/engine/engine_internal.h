/* engine/engine_internal.h — the engine's data, shared by its files.  Internal.
 *
 * The files call down only, never back up (tools/layers.py checks it):
 *   engine.c     the public calls; starts the scheduler thread
 *   sched.c      the scheduler thread's loop and the shutdown
 *   residency.c  load/unload commands, loading (on the loader thread), releasing, swapping
 *   step.c       one step of a model: plan, batch, forward, sampling
 *   running.c    admission, running lists, ending and preempting sequences, END delivery
 *   output.c     from a sampled token to TOKEN and END events
 *   seq.c        a sequence's memory and failure, the waiting queue, the clock
 *   kv_host.c    released models' prefix KV in host memory (kv_host.h), called by
 *                residency.c (save at a release, check at a load) and running.c (restore)
 *
 * Locking: e->mu guards the waiting queue, the commands, every model's residency and
 * running list, the KV pools, e->load and e->metrics.  The scheduler thread is the only one
 * that changes residency, running lists and sequences' compute state; it drops e->mu around
 * forward passes, releases and callbacks.  A model's load runs on the loader thread
 * (residency.c), which reads only what atlas_engine_create fixed (the model's directory,
 * name and sizes, e->p) and writes only e->load's result, handed over under e->mu; the
 * scheduler installs what it loaded.  Tokenizers and templates load under e->tok_mu.  A
 * sequence's cancel flag and reference count are atomics.
 *
 * A sequence's life:
 *   submit -> WAITING -> (admitted) RUNNING -> ... -> DONE (END emitted, engine ref dropped)
 *                  ^---- preempted (blocks freed) ----'
 * It holds a handle on its model (atlas_model_ref) exactly while RUNNING: taken at
 * admission, dropped when it leaves the running list (ended or preempted), before its END.
 */
#ifndef ATLAS_ENGINE_INTERNAL_H
#define ATLAS_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "atlas/constraint.h"
#include "atlas/engine.h"
#include "atlas/model.h"
#include "atlas/sampler.h"
#include "atlas/template.h"
#include "atlas/tokenizer.h"
#include "engine/budget.h"
#include "engine/kv.h"
#include "engine/kv_host.h"
#include "backend/backend.h"
#include "model/config.h"

typedef enum seq_state { SEQ_WAITING = 0, SEQ_RUNNING, SEQ_DONE } seq_state;

typedef struct atlas_request_handle seq;

struct atlas_request_handle {
    atomic_int refs;   /* the engine's (until END) + the caller's (until handle_free) */
    atomic_int cancel; /* set by atlas_engine_cancel */
    atomic_int ended;  /* END emitted */
    atlas_engine *e;
    int model;         /* index into e->models */
    atlas_event_cb cb;
    void *user;
    /* the request, copied */
    int max_tokens;    /* > 0 */
    int logprobs, top_logprobs, ignore_eos;
    int plain_greedy;  /* argmax of the raw logits: the backend may reduce them itself */
    int plain_sampled; /* a draw with temperature, top-k, top-p, min-p only: nothing the
                          tokens drawn before change, so steps may be queued ahead */
    int32_t *stop_ids;
    int n_stop_ids;
    int32_t *forced;   /* [n_forced]: teacher forcing (atlas_request.forced) */
    int n_forced;
    /* the thinking budget (atlas_request.think_budget; 0: none) and its tags */
    int think_budget;
    int32_t think_open[ATLAS_ENGINE_MAX_THINK_IDS], think_close[ATLAS_ENGINE_MAX_THINK_IDS];
    int n_think_open, n_think_close;
    int think_in;      /* 1: inside a think block */
    int think_used;    /* tokens generated inside blocks so far */
    int think_forcing; /* closing ids forced so far, -1: not forcing */
    char **stop;
    int n_stop;
    /* tokens[cap]: the prompt, then generated ones; KV holds tokens[0 .. n_computed) */
    int32_t *tokens;
    int n_tokens, n_prompt, cap, n_computed;
    int n_cached;      /* prompt tokens found in the prefix cache before its first preemption */
    int requeued;      /* preempted at least once */
    atlas_kv_table kv;
    atlas_model *model_ref; /* a handle on its model while RUNNING (running.c), else NULL */
    atlas_sampler *sampler;
    atlas_sampler_params sp; /* the request's, for the backend's sample op (logit_bias: NULL;
                                bias below holds it) */
    atlas_sample_adj *bias;  /* [n_bias]: logit_bias by increasing id, repeated ids summed */
    int n_bias;
    atlas_detok *detok;
    atlas_constraint_matcher *matcher; /* NULL: unconstrained */
    uint8_t *allowed;  /* [vocab]: the matcher's mask, for the scheduler thread */
    int n_allowed;     /* tokens allowed by it (computed during the step's forward pass) */
    char *pending;     /* text held back: it may be the start of a stop string */
    size_t n_pending, pending_cap;
    /* scheduling */
    seq_state state;
    uint64_t order;    /* admission order: the newest is preempted first */
    int plan;          /* index of its entry in the step being built, -1 if none */
    int ahead;         /* positions from n_computed on in queued steps not yet collected */
    int q_row;         /* its logit row in the step queued last, whose id is its next token
                          (-1: none) */
    double t_submit, t_admit, t_first, t_last;
    /* how it ended */
    atlas_finish finish;
    atlas_status status;
    char *message;     /* ERROR; malloc'd */
    int stop_string;   /* index into stop, -1 */
    int32_t stop_id;
    int64_t keep_alive_ms; /* atlas_request.keep_alive_ms */
    float stop_logprob; /* stop_id's logprobs, for the END event (when the request asked) */
    atlas_top_logprob stop_top[ATLAS_ENGINE_MAX_TOP_LOGPROBS];
    int n_stop_top;
    /* an embedding request (atlas_request.embed): no token is generated; the pooled rows
     * add up in pool[hidden] (double: a mean over thousands of rows) as its prompt is
     * computed, and vec[hidden] is the vector its END carries */
    int embed;
    double *pool;
    float *vec;
};

typedef struct eng_model {
    char *name, *dir;
    char *chat_template;    /* atlas_engine_model's, copied (NULL: none) */
    char *tool_call_format; /* likewise */
    atlas_config cfg;
    int ctx;                /* tokens per sequence */
    int parallel;           /* most running sequences */
    int batch_tokens;       /* token budget of one step */
    atlas_step_cost cost;   /* what its tokens cost of it (engine/budget.h) */
    size_t kv_memory;       /* bytes of KV pool asked (0: a share of the budget) */
    int pinned;             /* never released for a swap nor by keep-alive */
    int64_t keep_ms;        /* keep-alive as set (ATLAS_KEEP_ALIVE_FOREVER, _NONE or ms) */
    char kv_dtype[8];       /* "bf16", "f32" or "fp8" */
    atlas_kv_dtype kv_type; /* what the model's loads ask for (atlas_model_params.kv_dtype) */
    bool kv_f32_asked;      /* atlas_engine_model.kv_dtype "f32": must be what auto gives */
    int max_ctx;            /* the model's own maximum (atlas_config_max_context) */
    int kv_blocks;          /* pool size asked of the model */
    size_t weight_bytes;    /* of its files, before loading */
    size_t kv_token_bytes;  /* KV bytes a token takes on its device */
    size_t est_bytes;       /* weights + KV, estimated before loading; exact once loaded */
    char ctx_note[256];     /* why ctx is below what was asked, "" if it is not */
    /* under e->tok_mu, loaded on first use */
    atlas_tokenizer *tok;
    atlas_template *tmpl;
    atlas_constraint_vocab *cvocab; /* the tokenizer's, sorted; built on the first constraint */
    int tmpl_tried;
    atlas_status tmpl_st;
    char tmpl_err[256];
    int32_t eos[ATLAS_MAX_EOS + 1];
    int n_eos;
    /* under e->mu; changed by the scheduler thread only */
    atlas_model *m;         /* NULL: not resident (or being released) */
    atlas_model *releasing; /* the model while its release runs unlocked, else NULL */
    int release_refused;    /* its last release was refused (requests hold handles) and
                               none of its sequences has left since: no new attempt yet */
    atlas_kv_pool pool;
    atlas_kv_host_ident kv_ident; /* how it was loaded last: what its blocks in e->kv_host
                                     are good for (set at each load) */
    int kv_ident_set;
    const char *load_source; /* its last load's (atlas_model_info.load_source, static text) */
    const char *tier_off;    /* and why the host tier kept no copy ("": it could) */
    int warm;                /* atlas_engine_model.warm */
    atlas_model_load_times load_times; /* and when its steps ended (the LOADED event's) */
    seq **running;          /* [e->p.parallel], admission order */
    int n_running;
    int n_waiting;
    int draining;           /* no admissions: it is to be released */
    /* a queued step's time on the device, and the host's to plan and queue one, as last
     * seen (step.c's ahead_wait) */
    double ahead_step_s, ahead_host_s;
    int loading;            /* its load runs on the loader thread */
    int held;               /* loaded while the model making room for it drains: admits
                               nothing until that one is released (e->load.victim) */
    double drain_since;     /* when it began draining for a swap; 0: not */
    double loaded_at;       /* it serves a turn from here before being paused (residency.c) */
    double last_load_s;     /* its last load's seconds, 0 before one */
    double computed_at;     /* draining: when a sequence was last seen computing its prompt
                               (or recomputing); the pause waits drain_timeout_ms after it */
    int unload_asked;       /* an unload was refused: released once its requests end */
    int64_t keep_now_ms;    /* the keep-alive that holds now: the last admitted request's */
    double idle_since;      /* resident with no request running or waiting: since when; 0
                               while busy */
    int expiring;           /* its release runs because its keep-alive ran out */
    int served;             /* a request was admitted since its load (keep-alive "none"
                               releases only after one) */
    uint64_t last_used;
    char last_error[256];
    /* a failed load is remembered: requests fail at once until fail_until (1, 2, 4 ... 60 s
     * after the last failure), or until the directory's files change (fail_sig) */
    int fail_count;
    double fail_until;
    uint64_t fail_sig;
} eng_model;

/* residency.c: a signature of the regular files in dir (names, sizes, mtimes). */
uint64_t atlas_engine_dir_sig(const char *dir);
/* Removes every "dir/" from s, and names a bare dir "the model's directory", in place (s
 * holds at least 400 bytes): a message for clients names the model's files, never the
 * server's paths. */
void atlas_engine_strip_dir(char *s, const char *dir);

/* pools.c: the memory budget (e->budget, e->budget_what) and each model's KV pool, context
 * and estimated bytes, once the models' configs are read. */
atlas_status atlas_engine_size_pools(atlas_engine *e);
/* pools.c: the GPU host the engine's models run on, or NULL (the CPU asked for, or no GPU,
 * which the models find too: that error is cleared). */
atlas_host *atlas_engine_gpu_host(const atlas_engine *e);

typedef enum cmd_kind { CMD_LOAD, CMD_UNLOAD } cmd_kind;

typedef struct eng_cmd {
    cmd_kind kind;
    int model;
    int done;
    atlas_status st;
    char msg[512];
    struct eng_cmd *next;
} eng_cmd;

/* The load in flight, one at a time, on the loader thread (residency.c), while the scheduler
 * goes on stepping the resident models.  Under e->mu; the result fields are the thread's
 * until it sets done. */
typedef struct eng_load {
    int active;           /* its thread was started and is not joined yet */
    int done;             /* the thread has handed over its result */
    pthread_t thread;
    int model;            /* loading, or loaded and held; -1: none */
    int victim;           /* a model draining for it meanwhile, released once drained; -1 */
    int replaced;         /* the model released last to make room for it; -1: none */
    int beside;           /* models resident when it began: they kept stepping */
    double t0, t_start;   /* when the swap began (its first release), when the load did */
    const char *why;      /* "load" (a command) or "request" */
    /* the thread's result */
    atlas_model *m;
    uint64_t files;       /* the model's files as it read them (atlas_engine_dir_sig) */
    atlas_status st;
    char msg[512];        /* the failure as clients see it */
    int release_failed;   /* releases of a refused model that failed to free something */
    double t_end;
    /* the release the thread runs before its load: an idle model making room, released
     * there so that the scheduler steps the others meanwhile (a release waits for the
     * serving stream and gives the memory back to the driver: 19 ms for an 8B model) */
    int rel_model;        /* its index (its eng_model's releasing is rel_m), -1: none */
    atlas_model *rel_m;
    int rel_done;         /* it has run: its result below, for the scheduler to install */
    atlas_status rel_st;
    char rel_msg[512];
    double rel_dt;
} eng_load;

/* One entry of the batch being built: n tokens of s from pos0 on (s->n_computed, but in a
 * step queued behind another one that computes s too). */
typedef struct plan_entry {
    seq *s;            /* NULL: a queued step's row whose sequence ended before it ran */
    int n;
    int pos0;          /* the position of its first token */
    double cost; /* of the step's budget (engine/budget.h) */
    int logits; /* 1: the last of them needs logits (it reaches the sequence's end) */
    int row0, rows; /* an embedding model's: its hidden-state rows in the step's output */
} plan_entry;

struct atlas_engine {
    atlas_engine_params p;   /* models points at e->models' strings */
    eng_model *models;
    int n_models;
    pthread_t thread;
    int thread_started;
    /* the GPU host once a model is resident on it (sched.c): the scheduler offers it quiet
     * points, where a load's kernel modules go in without a bubble in the steps */
    atlas_host *quiet_host;
    int quiet_checked;
    pthread_t warm_thread;   /* reads the tokenizers and templates of models with warm */
    int warm_started;
    pthread_mutex_t mu;
    pthread_cond_t wake;     /* the scheduler waits on it when idle */
    pthread_cond_t cmd_done; /* load/unload callers wait on it */
    pthread_mutex_t tok_mu;
    int stop;
    seq **waiting;           /* FIFO; preempted sequences go back to the front */
    int n_waiting, waiting_cap;
    eng_cmd *cmds;
    eng_load load;
    uint64_t clock;          /* LRU stamps and admission order */
    atlas_engine_metrics metrics;
    size_t budget;           /* bytes the resident models may take, 0: no limit */
    atlas_kv_host *kv_host;  /* released models' prefix KV (the scheduler's; NULL: none) */
    char budget_what[96];    /* where the budget comes from, for messages */
    /* the scheduler thread's buffers */
    plan_entry *plan;
    int n_plan;
    plan_entry *plan_next; /* a step queued behind e->plan (step.c's run_ahead) */
    int step_failed;   /* the forward pass of the step being run failed */
    int32_t *b_tokens, *b_pos, *b_start, *b_ctx, *b_table, *b_rows, *b_ids;
    int32_t *b_rope; /* [n_plan]: each sequence's known tokens (atlas_batch.seq_rope_len) */
    size_t b_table_cap;
    float *logits;     /* [n_logits, vocab] */
    size_t logits_cap;
    float *row;        /* [vocab]: a copy that sampling may overwrite */
    size_t row_cap;
    /* a sampled step's rows for the backend's sample op (sample_rows.c), [smp_cap] each;
     * their adjustments, and the sorted history keys they are counted from */
    atlas_sample_row *smp_rows;
    atlas_sample_out *smp_out;
    int smp_cap;
    atlas_sample_adj *smp_adj;
    size_t smp_adj_cap;
    uint32_t *smp_keys;
    size_t smp_keys_cap;
    seq **done;        /* sequences whose END is due (removed from every list) */
    int n_done, done_cap;
};

/* engine.c */
atlas_status atlas_engine_ensure_tokenizer(atlas_engine *e, int model);
/* residency.c: model's files failed it outside a load (its tokenizer): msg (the model's
 * files named, never the server's paths) becomes its last error, and it is failed as a
 * load is (state "failed", the back-off), until its files change or a load succeeds. */
void atlas_engine_model_failed(atlas_engine *e, int model, const char *msg);

/* sched.c */
void *atlas_engine_sched_main(void *arg);
/* Ends every request (CANCELLED) and releases every model; after the thread has stopped. */
void atlas_engine_sched_shutdown(atlas_engine *e);

/* residency.c (under e->mu, which the calls drop while a model is released or told of) */
/* Releases md (resident) through atlas_model_release.  ATLAS_OK: released (a failure to
 * free something is kept in md->last_error: the model is gone either way).  ATLAS_ERR_BUSY:
 * requests run on it, the message gives their number, nothing changed; until one of them
 * has left, further calls answer the same without trying.  ATLAS_ERR_INTERNAL: refused
 * although none of the engine's sequences runs on it (a leaked handle). */
atlas_status atlas_engine_release_model(atlas_engine *e, eng_model *md);
void atlas_engine_cmd_complete(atlas_engine *e, eng_cmd *c, atlas_status st, const char *msg);
/* Load/unload commands, deferred unloads; returns 1 when something was done. */
int atlas_engine_do_commands(atlas_engine *e);
/* Makes the model wanted next resident (draining and releasing another); 1: did something. */
int atlas_engine_do_residency(atlas_engine *e);
/* Releases the resident models idle for longer than their keep-alive; 1: released one. */
int atlas_engine_do_keep_alive(atlas_engine *e);
/* At shutdown: waits for the load in flight, if any, and releases what it loaded. */
void atlas_engine_load_abandon(atlas_engine *e);

/* step.c */
/* One step of md (nothing when it has no running sequence: returns 0).  Under e->mu,
 * dropped for the forward pass and the callbacks. */
int atlas_engine_step(atlas_engine *e, eng_model *md);

/* running.c (under e->mu) */
/* Moves waiting requests of resident, non-draining models into their running lists, in
 * order, while there is room (parallel) and free KV blocks for their tokens; a request that
 * does not fit blocks those behind it for the same model.  Each admitted sequence takes a
 * handle on its model (atlas_model_ref).  Returns 1 when any was admitted. */
int atlas_engine_admit(atlas_engine *e);
/* A running sequence ends: its blocks go back and its model handle is dropped at once; its
 * END is queued. */
void atlas_engine_end_running(atlas_engine *e, eng_model *md, seq *s);
/* Frees the sequence's blocks, drops its model handle and puts it back at the front of the
 * queue: it will be recomputed (prompt and generated tokens) when there is room again.
 * *budget gets back the tokens it had in the step being planned. */
void atlas_engine_preempt(atlas_engine *e, eng_model *md, seq *s, double *budget);
/* Before s's next prompt chunk is planned: takes the blocks that other sequences have
 * written since for the tokens after its own (prefix cache), counting them as cached.
 * Returns 0 when s should wait a step, the next of its blocks being written by another
 * sequence in the step being planned. */
int atlas_engine_share_prefix(atlas_engine *e, eng_model *md, seq *s);
/* Ends every waiting request of model (-1: of every model) with finish (ERROR: st and msg);
 * their ENDs are queued. */
void atlas_engine_end_waiting(atlas_engine *e, int model, atlas_finish finish,
                              atlas_status st, const char *msg);
/* Ends the cancelled requests, waiting or running, and delivers their ENDs; 1: any. */
int atlas_engine_reap_cancelled(atlas_engine *e);
/* Queues s for its END (s is in no list any more). */
void atlas_engine_push_done(atlas_engine *e, seq *s);
/* Emits the queued ENDs outside the lock (dropped meanwhile). */
void atlas_engine_flush_done(atlas_engine *e);

/* output.c (outside e->mu) */
/* Takes the sampled token: appends it, emits its TOKEN event and decides whether the
 * sequence ends (returns 1 with s->finish set). */
int atlas_engine_seq_accept(atlas_engine *e, seq *s, int32_t id, float logprob,
                            const atlas_top_logprob *top, int n_top);
/* Emits the END event (releasing held-back text unless a stop string ended it). */
void atlas_engine_seq_emit_end(atlas_engine *e, seq *s);

/* seq.c */
double atlas_engine_now(void);
void atlas_engine_hist_observe(atlas_engine_hist *h, double seconds);
/* Drops a reference; the last one frees the sequence. */
void atlas_engine_seq_unref(seq *s);

/* sample_rows.c: s->sp and s->bias from the request's sampling params (at submit). */
atlas_status atlas_engine_seq_sampling(seq *s, const atlas_sampler_params *sp);
/* Whether s's next token is chosen on the host (sample_row): a constraint's mask, a forced
 * token (teacher forcing, a spent thinking budget's closing tag). */
int atlas_engine_seq_on_host(const seq *s);
/* The sample op's rows of the planned step's n_logits logit rows into e->smp_rows, their
 * adjustments into e->smp_adj[*n_adj]; rows chosen on the host are flagged
 * ATLAS_SAMPLE_SKIP (*n_host of them). */
atlas_status atlas_engine_sample_rows(atlas_engine *e, int n_logits, int *n_adj, int *n_host);
/* The rows of a queued step's n entries p (their sequences plain greedy or plain sampled)
 * into e->smp_rows, one for each entry with logits: each draw's counter is the position of
 * the token it draws. */
atlas_status atlas_engine_queued_rows(atlas_engine *e, const plan_entry *p, int n);
/* Marks s as ending with an error; the message is copied. */
void atlas_engine_seq_fail(seq *s, atlas_status st, const char *msg);
/* Appends s to the waiting queue, or puts it at the front (preemption).  Under e->mu. */
atlas_status atlas_engine_queue_back(atlas_engine *e, seq *s);
atlas_status atlas_engine_queue_front(atlas_engine *e, seq *s);
/* Removes the i-th waiting request.  Under e->mu. */
void atlas_engine_queue_remove_at(atlas_engine *e, int i);
/* Adds what the host KV store did (a save or check: restored 0) to e->metrics.  Under e->mu. */
void atlas_engine_kv_host_count(atlas_engine *e, const atlas_kv_host_moved *mv, int restored);
/* The KV store's share of host_cache: what the weights' host tier holds, and `coming` more
 * bytes of it (counted only where a load has used the tier), leave (residency.c).  Under
 * e->mu, on the scheduler thread. */
void atlas_engine_kv_host_share(atlas_engine *e, size_t coming);

#endif

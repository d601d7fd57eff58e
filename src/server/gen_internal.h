/* server/gen_internal.h — the insides of atlas_gen, shared by gen.c (queue, waiting) and
 * format.c (OpenAI JSON).  Internal to src/server. */
#ifndef ATLAS_SERVER_GEN_INTERNAL_H
#define ATLAS_SERVER_GEN_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>

#include "atlas/engine.h"
#include "atlas/harmony.h"
#include "atlas/reasoning.h"
#include "server/gen.h"
#include "server/state.h"

/* One engine event, copied: the text and the message live after the struct. */
typedef struct atlas_gen_event {
    struct atlas_gen_event *next;
    atlas_event_type type;
    int32_t id;
    float logprob;
    atlas_finish finish;
    atlas_status status;
    atlas_usage usage;
    double ttft_s;
    double t;                 /* when it was queued (monotonic seconds) */
    char *text;
    size_t text_len;
    char *message;            /* NUL-terminated */
    char *stop_string;        /* END by a stop string: which one (NUL-terminated); else NULL */
    int32_t stop_id;          /* END by an eos or stop id: which; else -1 */
    int n_top;
    atlas_top_logprob top[];  /* [n_top] */
} atlas_gen_event;

/* The choices of one streamed request (n > 1, or several prompts): each member keeps its
 * own engine request, queue and formatting state; the leader (members[0]) answers one SSE
 * stream from all of them.  Members signal cv (under mu) when they queue an event, so the
 * leader can wait for any of them.  Freed with the last member. */
typedef struct atlas_gen_group {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;                 /* members not yet freed */
    int n;
    atlas_gen *members[16];   /* ATLAS_MAX_CHOICES; the leader's stream holds their refs */
    bool taken_end[16];       /* member i's END was taken from its queue */
    int next;                 /* round robin over the members */
    /* the leader's HTTP thread only: */
    int n_ended;              /* members whose END was formatted */
    atlas_usage usage;        /* summed over them (each prompt once) */
    int per_prompt;           /* choices per prompt: prompt tokens counted once for them */
    bool done;                /* [DONE] was written */
} atlas_gen_group;

struct atlas_gen {
    pthread_mutex_t mu;
    pthread_cond_t cv;        /* signalled when an event arrives */
    int refs;                 /* engine + HTTP side (+ the waker's, while it holds the gen) */
    int waiting;              /* workers in poll_wait on cv, under mu */
    atlas_gen_event *head, *tail;
    bool ended;               /* the END event was queued */
    bool cancel_asked;        /* an event was lost: cancel */
    bool cancel_sent;
    bool lost;
    bool counted;             /* in metrics.active_requests */

    atlas_request_handle *h;  /* used by the HTTP thread only */
    atlas_server *srv;
    int fd;
    atlas_gen_opts o;
    char *model, *echo;
    const atlas_tokenizer *tok;
    char id[48];
    int64_t created;
    int prompt_tokens;
    double t_start;           /* the HTTP request's arrival */
    double t_first;           /* when its first token was queued (0: none yet), under mu */
    int n_generated;          /* its TOKEN events queued so far, under mu: the access log's
                                 tokens_out when the client leaves before the END */
    atlas_itl_local itl;      /* gaps between its tokens; the engine's thread only */
    atlas_log_request log;    /* the request's access-log line, copied at start: a stream
                                 writes it as it closes, the call being gone by then */
    atlas_log_request *call_log; /* the call's own, while it is answered (not streamed) */

    atlas_gen_group *group;   /* streamed choices: the group this gen belongs to */
    int index;                /* its choice index in the response */

    /* formatting state: the HTTP thread only (format.c) */
    atlas_reasoning *rp;      /* o.reasoning: the "<think>" splitter */
    char *reasoning;          /* the whole reasoning so far (non-streaming) */
    size_t reasoning_len, reasoning_cap;
    atlas_toolcall_parser *tp;
    atlas_harmony *hp;        /* o.harmony: the reply read from its token ids */
    size_t released;          /* o.harmony: bytes of text the engine has released */
    json_t *calls;            /* completed tool calls, for the whole response */
    int n_calls;
    bool began;               /* the first event was formatted (role chunk or echo) */
    bool done_sent;
    char *text;               /* the whole text so far (non-streaming) */
    size_t text_len, text_cap;
    json_t *lp;               /* logprobs collected (non-streaming) */
    size_t text_offset;       /* /v1/completions logprobs text_offset */
    atlas_usage usage;
    atlas_usage start_usage;  /* the first event's: the prompt and its cached tokens */
    atlas_finish finish;
    char *stop_string;        /* the stop string that ended it (malloc'd), else NULL */
    char *out;                /* SSE bytes ready to send */
    size_t out_len, out_off, out_cap;
};

/* gen.c */
/* The next event (NULL: the END was already taken, the client left (*gone), or the server
 * stops and the request was cancelled).  The caller frees it. */
atlas_gen_event *atlas_gen_next(atlas_gen *g, bool wait, bool *gone);
bool atlas_gen_has_event(atlas_gen *g);
bool atlas_gen_wait_first(atlas_gen *g);

/* format.c: formatting only, it never waits on the queue (gen.c does, and calls it) */
/* ids[0..n_ids): the prompt (where a Harmony reply starts) */
atlas_status atlas_gen_format_init(atlas_gen *g, const int32_t *ids, size_t n_ids);
void atlas_gen_format_free(atlas_gen *g);
/* Streaming: appends the SSE bytes for e to g->out. */
atlas_status atlas_gen_format_event(atlas_gen *g, const atlas_gen_event *e);
/* Streaming: appends n bytes of s to what the stream sends next (a dialect's hooks). */
atlas_status atlas_gen_write(atlas_gen *g, const char *s, size_t n);
/* Streaming: ends the stream with an error event and [DONE]. */
void atlas_gen_format_abort(atlas_gen *g, const char *why);
/* Whole response: adds e's text (and logprobs) to g, after the echoed prompt (if any) on
 * the first call; after the END event (and g->usage, g->finish set from it),
 * atlas_gen_format_response builds the chat.completion / text_completion object. */
atlas_status atlas_gen_format_collect(atlas_gen *g, const atlas_gen_event *e);
json_t *atlas_gen_format_response(atlas_gen *g);
/* The one response of several collected gens gs[0..n): their choices in that order, usage
 * summed (a prompt's tokens once for its per_prompt choices). */
json_t *atlas_gen_format_batch(atlas_gen **gs, int n, int per_prompt);
/* OpenAI's whole chat.completion (or text_completion) object for g, whatever its dialect:
 * the one another dialect may translate. */
json_t *atlas_gen_format_openai(atlas_gen *g);
/* OpenAI's usage object for g ({prompt_tokens, completion_tokens, total_tokens,
 * prompt_tokens_details}). */
json_t *atlas_gen_format_usage(const atlas_gen *g);
/* Counts g's time from the request's arrival to now as its end-to-end latency. */
void atlas_gen_format_observe_end(atlas_gen *g);

#endif

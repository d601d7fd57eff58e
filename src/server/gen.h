/* server/gen.h — one generation as the server sees it: the engine request, the queue that
 * carries its token events from the engine thread to the HTTP thread, and the formatting
 * of those events as OpenAI JSON (whole response) or SSE chunks.  Internal to src/server.
 *
 * Threads: the engine thread only appends events to the queue (copying them, O(1), never
 * waiting on a client); the connection's thread pops them, formats and writes.  A gen is
 * counted: one reference for the engine (dropped at its end event), one for the HTTP side
 * (dropped when its stream closes, or by atlas_gen_release).  A client that goes away cancels
 * the engine request at once. */
#ifndef ATLAS_SERVER_GEN_H
#define ATLAS_SERVER_GEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <jansson.h>

#include "atlas/toolcall.h"
#include "server/http.h"
#include "server/params.h"

typedef struct atlas_tokenizer atlas_tokenizer;
typedef struct atlas_gen atlas_gen;
typedef struct atlas_gen_waker atlas_gen_waker;

/* The thread that wakes the workers waiting for a generation's events: the engine's
 * scheduler thread queues a token event and hands the waiting worker to it instead of
 * waking it (a futex wake a token, 2.8 us each on a 2-vCPU VM: 1.4 ms of host time a step of
 * 512 tokens, in which a GPU step that is not queued ahead waits). Started before the server
 * serves, stopped once its workers are joined (what it still holds is woken and dropped). */
atlas_status atlas_gen_waker_start(atlas_gen_waker **out);
void atlas_gen_waker_stop(atlas_gen_waker *w);

/* What one step of a generation released to the client, after the reasoning splitter and
 * the tool-call parser: reasoning and text (either may be empty; both NUL-terminated) and
 * the tool calls it completed (OpenAI's shape: {"id", "type", "function": {"name",
 * "arguments": "..."}, "index"}, index counting the reply's calls). */
typedef struct atlas_gen_piece {
    const char *reasoning;
    size_t reasoning_len;
    const char *text;
    size_t text_len;
    const json_t *calls;      /* array, possibly empty */
} atlas_gen_piece;

/* Another API's shape for the same generation (Anthropic's Messages, OpenAI's Responses,
 * Ollama's): what format.c writes for OpenAI's chat, a dialect writes instead, from the same
 * pieces.  Streaming hooks append their bytes to the stream (atlas_gen_write) and may read
 * the gen's state (gen_internal.h: g->usage, g->finish, g->stop_string, g->o.dialect_ctx).
 * One choice only: a dialect's request has no "n". */
typedef struct atlas_gen_dialect {
    const char *stream_type;  /* the stream's Content-Type; NULL: text/event-stream */
    atlas_status (*begin)(atlas_gen *g);                          /* NULL: nothing first */
    atlas_status (*piece)(atlas_gen *g, const atlas_gen_piece *p); /* something to tell */
    atlas_status (*end)(atlas_gen *g);   /* the last: g's usage, finish and stop string set */
    /* The stream ends with an error: err is OpenAI's answer for it (status and JSON body,
     * which the hook may reshape in place), why its message. */
    atlas_status (*error)(atlas_gen *g, atlas_http_reply *err, const char *why);
    json_t *(*response)(atlas_gen *g);   /* the whole answer, from what was collected */
    void (*free)(void *ctx);             /* drops atlas_gen_opts.dialect_ctx; NULL: none */
} atlas_gen_dialect;

/* What the formatting needs to know about the request. */
typedef struct atlas_gen_opts {
    atlas_api_kind kind;
    const char *model;            /* the id answered in "model" (copied) */
    bool stream, include_usage;
    bool logprobs;
    int top_logprobs;
    bool tokens_as_ids;           /* logprobs name tokens "token_id:N" */
    atlas_toolcall_format tools;  /* NONE: no tool parsing */
    const char *echo;             /* /v1/completions echo: the prompt text (copied) or NULL */
    bool reasoning;               /* chat: split "<think>" out as reasoning_content */
    bool reasoning_inside;        /* the prompt already opened the block (reasoning.h) */
    bool harmony;                 /* chat: the reply is Harmony (atlas/harmony.h), read from
                                     its ids: analysis is reasoning, and tool calls are taken
                                     when tools is ATLAS_TOOLCALL_HARMONY (else content) */
    const atlas_gen_dialect *dialect; /* NULL: OpenAI's JSON and SSE (format.c) */
    void *dialect_ctx;            /* the dialect's own, owned by the gen once atlas_gen_start
                                     is called, whatever it returns */
} atlas_gen_opts;

/* Submits the request to the engine and returns the gen (both references held: the engine's
 * and the caller's).  ids[n_ids] is the prompt; tok decodes token bytes for logprobs. */
atlas_status atlas_gen_start(atlas_http_call *call, const atlas_gen_opts *o,
                             const atlas_gen_params *gp, const atlas_tokenizer *tok,
                             const int32_t *ids, size_t n_ids, atlas_gen **out);

/* Answers with g: a whole JSON response (atlas_gen_finish_json), or, for a stream, the SSE
 * body once the first event is there (a request that fails before its first token gets
 * its error status instead).  Takes over the caller's reference: a stream's body holds it
 * until the transport closes the stream, which cancels the engine request if it still
 * runs. */
void atlas_gen_reply(atlas_gen *g, atlas_http_reply *r);

/* Streamed choices: gs[0..n) (n <= ATLAS_MAX_CHOICES) become one stream whose chunks carry
 * each gen's index (prompt-major, per_prompt choices a prompt) and end with one usage chunk
 * and one [DONE]; answer with atlas_gen_reply(gs[0]), which then owns them all. */
atlas_status atlas_gen_group_make(atlas_gen **gs, int n, int per_prompt);

/* Non-streaming: waits for the end (cancelling if the client leaves or the server stops)
 * and builds the whole response into r (a 200 JSON body or an error).  Releases the
 * caller's reference. */
void atlas_gen_finish_json(atlas_gen *g, atlas_http_reply *r);

/* Several choices of one request (not streamed): prompts of /v1/completions, "n" of each;
 * waits for all and answers one response whose choices are in that order, usage summed
 * (a prompt's tokens once for its per_prompt choices).  Releases every gen. */
void atlas_gen_finish_batch(atlas_gen **gs, int n, int per_prompt, atlas_http_reply *r);

/* Drops the HTTP side's reference (cancelling the engine request if it still runs). */
void atlas_gen_release(atlas_gen *g);

#endif

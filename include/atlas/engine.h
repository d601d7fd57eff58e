/* atlas/engine.h — the engine: requests in, tokens out, over several models that it loads,
 * keeps resident and swaps in process.  The server and the CLI are its clients.
 *
 * One scheduler thread owns the models.  Each step it builds one batch per resident model
 * that has work: a decode token for every running sequence plus a chunk of the prompts
 * being prefilled, up to the token budget (continuous batching: requests join and leave at
 * step boundaries).  The KV cache is paged (fixed-size blocks, a block table per sequence);
 * when blocks run out the newest sequence is preempted (its blocks freed, its tokens kept)
 * and recomputed later, never failed.  Full blocks are kept after their sequence ends and
 * reused by later prompts that start with the same tokens and carry the same cache_salt
 * (prefix caching; every hit is checked token by token, never trusted to a hash).
 *
 * Memory: each model's KV cache is one paged pool, sized at create (kv_memory, or an even
 * share of what the memory budget leaves after the weights of max_resident models; with
 * ATLAS_MAX_RESIDENT_AUTO, of the most of the largest models whose weights fit the budget
 * together) and never larger than parallel sequences of the full context; a context that
 * one sequence cannot hold in the pool is lowered to what it can (atlas_engine_models says
 * so).
 *
 * Model residency: up to max_resident models (as many as fit the memory budget; with
 * ATLAS_MAX_RESIDENT_AUTO the budget alone counts) stay loaded; a request for a model that is
 * not resident waits in the queue while the scheduler releases the least recently used idle
 * model, or, when every resident one is busy, lets the least recently used one's running
 * sequences finish (or pauses them after its turn), releases it, loads the requested one and
 * goes on (a pinned model is never the one released).  A model with work serves a turn of at
 * least max(drain_timeout_ms, twice its last load) from its load before it is paused or
 * released, so that two models wanted at once never spend more time swapping than serving.
 * A model idle for its keep-alive is released too.  A failed load ends the requests that
 * wanted that model with an error and leaves the others served.  A load runs on the
 * engine's loader thread, one at a time, while the resident models go on stepping; where
 * memory allows it beside the model it replaces, it runs while that one drains, and the
 * newcomer admits once that one is released.
 *
 * Releasing a model follows the handle contract of atlas/model.h: every running request
 * holds a handle on its model (atlas_model_ref when it is admitted, atlas_model_unref when it
 * ends, however it ends: finished, cancelled, failed, paused), so atlas_model_release refuses
 * with ATLAS_ERR_BUSY while any runs, and that refusal is what keeps the model resident.  It
 * is the normal course of a drain, not an error: the model admits no more requests and the
 * release is tried again when one of its requests ends (metrics: release_busy counts the
 * refusals).  The same rule holds for atlas_engine_unload, as for closing a libuv loop with
 * handles open: with requests in flight the answer is ATLAS_ERR_BUSY and their count, and
 * the engine drains the model before it releases it.
 *
 * Threads: every call here is thread-safe, except atlas_engine_free, which is called once,
 * when no other thread uses the engine, and never from a callback.  Callbacks run on the
 * scheduler thread: they must be quick and must not block on the engine
 * (atlas_engine_cancel and atlas_engine_handle_free are allowed in them).
 *
 * Ownership: the engine and the request handles are the caller's (atlas_engine_free,
 * atlas_engine_handle_free).  Everything passed in is copied by the call that takes it (the
 * params and model list by create, the request with its prompt, stop strings, constraint,
 * forced tokens and think tags by submit), so the caller may free it when the call returns.  What the
 * engine hands out (tokenizers, templates, model names) belongs to the engine and lives
 * until atlas_engine_free; an event lives for its callback only. */
#ifndef ATLAS_ENGINE_H
#define ATLAS_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "atlas/model.h"
#include "atlas/sampler.h"
#include "atlas/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct atlas_engine atlas_engine;
typedef struct atlas_request_handle atlas_request_handle;
typedef struct atlas_tokenizer atlas_tokenizer; /* atlas/tokenizer.h */
typedef struct atlas_template atlas_template;   /* atlas/template.h */
typedef struct atlas_constraint atlas_constraint; /* atlas/constraint.h */

/* ---- creating an engine ----------------------------------------------------------------- */

/* Keep-alive, as Ollama means it: how long a model stays resident once no request runs on
 * it or waits for it.  Milliseconds (> 0), or one of these. */
enum {
    ATLAS_KEEP_ALIVE_DEFAULT = 0,  /* the model's setting (in params: forever) */
    ATLAS_KEEP_ALIVE_FOREVER = -1, /* until a swap or an unload needs its place */
    ATLAS_KEEP_ALIVE_NONE = -2,    /* released as soon as its requests have ended */
};

/* A model and its own settings.  Every setting is 0 for the engine params' value, so a
 * zero-initialised entry with a name and a directory is a model served as the params say. */
typedef struct atlas_engine_model {
    const char *name; /* the id requests use, e.g. "qwen3-8b" (atlas_engine_check_name) */
    const char *dir;  /* Hugging Face model directory */
    /* NULL (default): the template of dir (atlas_template_load).  Else the operator's
     * replacement (atlas_template_load_file: a Jinja file, a tokenizer_config.json, or a
     * directory holding either), read and parsed by atlas_engine_create, which fails
     * naming the file and line when it does not parse. */
    const char *chat_template;
    /* NULL or "" (default): the tool-call format is found from the template and the
     * architecture.  Else one atlas_toolcall_format_parse knows ("hermes", "llama3",
     * "mistral", "none"), checked by atlas_engine_create. */
    const char *tool_call_format;
    int ctx_size;     /* tokens per sequence (params.ctx_size) */
    int parallel;     /* most running sequences (params.parallel) */
    size_t kv_memory; /* bytes of its KV pool (params.kv_memory) */
    int batch_tokens; /* token budget of its steps (params.batch_tokens) */
    int pinned;       /* 1: never released to make room for another model, nor by its
                         keep-alive; only atlas_engine_unload releases it */
    int64_t keep_alive_ms; /* ATLAS_KEEP_ALIVE_* or milliseconds (params.keep_alive_ms) */
    /* NULL or "" (default): params.kv_dtype.  "auto": its KV cache's element type is the
     * backend's, bf16 on a GPU; on the CPU f32, or bf16 with bf16 or int8 activations
     * (cpu_activations).  "bf16", "fp8" (FP8 e4m3; "fp8_e4m3" is the same) as
     * atlas_model_kv_dtype_parse reads them: an FP8 pool holds twice the tokens of a bf16
     * one in the same kv_memory.  "f32" must be what auto gives (the CPU's fp32 activations):
     * atlas_engine_create refuses another value (ATLAS_ERR_INVALID naming the model and the
     * accepted ones) and a type the device lacks (ATLAS_ERR_UNSUPPORTED) rather than serve
     * a type not asked for. */
    const char *kv_dtype;
    /* An embedding model's Matryoshka widths (n > 0: these replace config.json's
     * matryoshka_dimensions; 1..ATLAS_ENGINE_MAX_MATRYOSHKA of them, each 1..hidden_size,
     * checked by atlas_engine_create; copied). */
    const int *matryoshka_dims;
    int n_matryoshka_dims;
    /* 1: its tokenizer and chat template are read from atlas_engine_create on, on a thread
     * of the engine's, beside the rest of the create (which may wait for the GPU's set-up,
     * atlas_host_start) and the model's load, so that neither its load at start nor its
     * first request waits for the parse (a 128k-token tokenizer.json takes a few hundred
     * ms); a failure is left for the first use to report.  0 (default): read on first use. */
    int warm;
} atlas_engine_model;

/* A keep-alive as Ollama takes it: a number of seconds, or a Go duration ("5m", "1h30m",
 * "90s", "250ms"; a bare number is seconds); negative is forever, 0 is
 * ATLAS_KEEP_ALIVE_NONE.  ATLAS_ERR_INVALID for anything else.  Pure. */
ATLAS_API atlas_status atlas_engine_parse_keep_alive(const char *text, int64_t *out_ms);

/* The longest model name in bytes: what the server's access log and the load line hold
 * whole. */
enum { ATLAS_ENGINE_NAME_MAX = 127 };

/* The rule every model name keeps, checked by atlas_engine_create: 1 to
 * ATLAS_ENGINE_NAME_MAX bytes of valid UTF-8 without control characters (U+0000..U+001F,
 * U+007F..U+009F).  A name is an id in URLs, JSON, log lines and Prometheus labels, so two
 * names must never show as one there, and none may break a line.  ATLAS_OK, or
 * ATLAS_ERR_INVALID with a message that shows the name escaped and says what breaks the
 * rule and at which byte.  Any thread. */
ATLAS_API atlas_status atlas_engine_check_name(const char *name);
/* What the scheduler did with a model's residency, told to atlas_engine_params.on_residency
 * so that a server can log every load, release, swap and failed load (the engine itself
 * never prints). */
typedef enum atlas_residency_kind {
    ATLAS_RESIDENCY_LOADED = 0, /* the model is resident */
    ATLAS_RESIDENCY_LOAD_FAILED,/* its load failed, or was refused before it began (too large
                                   for the budget, broken headers, no room could be made) */
    ATLAS_RESIDENCY_RELEASED,   /* it was released (unloaded) */
    ATLAS_RESIDENCY_DRAINING,   /* it is to be released and waits for its running requests */
} atlas_residency_kind;

typedef struct atlas_residency_event {
    atlas_residency_kind kind;
    const char *model;     /* the configured name */
    /* Why, a word: LOADED "request" (a request waits for it) or "load" (atlas_engine_load);
     * RELEASED and DRAINING "swap" (room for `other`), "unload" (atlas_engine_unload) or
     * "shutdown" (atlas_engine_free).  LOAD_FAILED: the error, as its requests are told. */
    const char *reason;
    const char *other;     /* RELEASED, DRAINING "swap": the model it makes room for; LOADED:
                              the model released last to make room for it; else NULL */
    double seconds;        /* LOADED, LOAD_FAILED: the load's time; RELEASED: the release's */
    double swap_seconds;   /* LOADED with other set: from the release to now (a load that ran
                              while `other` drained counts from its release); else 0 */
    size_t bytes;          /* LOADED, RELEASED: its weights and KV cache */
    int running;           /* DRAINING: requests still running on it */
    const char *error;     /* RELEASED: what the release failed to free ("" when nothing; the
                              model is gone either way) */
    int beside;            /* LOADED, LOAD_FAILED: models resident while it loaded, which kept
                              stepping (a load runs on the engine's loader thread) */
    const char *source;    /* LOADED: where its weights came from: "host" (the host tier of
                              atlas_engine_params.host_cache: no file read), "page_cache" or
                              "disk" (atlas_model_info.load_source); else NULL */
    const char *tier_off;  /* LOADED: why the host tier kept no copy of it on this GPU (an
                              integrated one); NULL or "" when it could */
    const atlas_model_load_times *times; /* LOADED: when each step of the load ended
                              (atlas_model_info.times), valid during the call; else NULL */
} atlas_residency_event;

/* Whether a step of plain decodes (plain greedy or plain sampled sequences) is queued before
 * the one before it is collected (docs/ENGINE.md). AUTO: where the backend computes a queued
 * step while the host goes on (a GPU); ON: also where it computes one at once (the CPU: no
 * gain, and each token is emitted a step late; what the CPU tests of the path use); OFF:
 * never (each step's tokens emitted before the next is queued). */
typedef enum atlas_step_ahead {
    ATLAS_STEP_AHEAD_AUTO = 0,
    ATLAS_STEP_AHEAD_ON,
    ATLAS_STEP_AHEAD_OFF,
} atlas_step_ahead;

typedef struct atlas_engine_params {
    const atlas_engine_model *models; /* [n_models]; copied by create */
    int n_models;
    int max_resident;     /* models loaded at once (default 1), or ATLAS_MAX_RESIDENT_AUTO:
                             as many as the memory budget holds */
    double gpu_memory_utilization; /* share of the GPU's total memory the resident models
                             (weights and KV) may use, as vLLM's flag (default 0.9) */
    size_t gpu_memory;    /* the memory budget in bytes instead, on either backend (0,
                             default: the share above of the GPU's memory; without a GPU no
                             limit, except with ATLAS_MAX_RESIDENT_AUTO: 90% of the memory
                             the host has available at create, MemAvailable lowered by the
                             cgroup's limit as the load check reads it) */
    size_t kv_memory;     /* bytes of KV cache per model; 0 (default): on a GPU an even share of
                             what the budget leaves after the weights of the max_resident
                             largest models (less a workspace reserve), on the CPU a quarter
                             of the RAM split likewise */
    int ctx_size;         /* tokens per sequence, prompt + generated; 0 (default): the model's
                             maximum (max_position_embeddings, times the RoPE factor for
                             linear and yarn scaling as vLLM derives it); more than that is
                             ATLAS_ERR_INVALID at create */
    int parallel;         /* most running sequences per model (default 32); caps concurrency,
                             the pool does not scale with it (beyond parallel x ctx_size) */
    int queue_limit;      /* most requests waiting to start; beyond: ATLAS_ERR_BUSY
                             (default 256) */
    int kv_block_size;    /* tokens per KV block (default 16) */
    int kv_blocks;        /* blocks per model, overriding kv_memory; 0 (default): from it */
    int batch_tokens;     /* token budget of one step: decode tokens + prefill chunk
                             (default 512) */
    int drain_timeout_ms; /* a model to be swapped out lets its running sequences go on
                             this long, or twice its last load when that is longer (default
                             30000), counted from the later of the swap's
                             request and the model's load, and held while one of them
                             computes its prompt; then they are paused: their KV is freed and
                             they wait, first in the queue, to be recomputed (prompt and
                             tokens so far) when the model is back, their events simply
                             resuming.  0: no limit, they finish first */
    atlas_device device;  /* default ATLAS_DEVICE_AUTO */
    int gpu;              /* the GPU ordinal (default 0); a process serves one GPU, so every
                             engine of a process names the same one */
    atlas_kernels kernels; /* the GPU code (include/atlas/model.h; default native) */
    int n_threads;        /* CPU backend workers; 0: one per core */
    /* Optional (NULL, default: none): each model load's progress, as
     * atlas_model_params.progress reports it (include/atlas/model.h: the same threads and
     * rules; the load runs on the engine's loader thread), with the configured name of the
     * model loading. */
    void (*load_progress)(void *user, const char *model, uint64_t done, uint64_t total);
    void *load_progress_user; /* load_progress's first argument */
    /* Optional (NULL, default: none): each residency event, on the scheduler thread (the
     * releases of atlas_engine_free on its caller's) with no engine lock held; *ev and its
     * strings live for the call.  It must return quickly and must not call
     * atlas_engine_load, _unload or _free (the scheduler would wait on itself). */
    void (*on_residency)(void *user, const atlas_residency_event *ev);
    void *on_residency_user; /* on_residency's first argument */
    int no_memory_check;  /* 1: load models even when the check before reading the weights
                             finds too little memory (atlas_model_params.no_memory_check) */
    int64_t keep_alive_ms; /* the models' keep-alive (atlas_engine_model.keep_alive_ms);
                             0 (default): forever */
    atlas_cpu_activations cpu_activations; /* the CPU's bf16 matmuls (include/atlas/model.h;
                                              default fp32) */
    atlas_gpu_activations gpu_activations; /* a GPU's one-row INT4 matmuls (include/atlas/
                                              model.h; default fp32) */
    size_t host_cache;    /* bytes of host memory for what released models leave behind: on
                             CUDA their weights, pinned and laid out as on the GPU, copied
                             back when the model loads again (atlas_model_params.host_cache),
                             and their cached prefix KV blocks, copied back when a request
                             that continues one arrives after the model returns; one budget,
                             the weights first, the KV in what they leave, least recently
                             used out of each (docs/ENGINE.md); 0 (default): none kept */
    atlas_kv_dtype kv_dtype; /* the models' KV cache type (atlas_engine_model.kv_dtype
                                overrides it; default auto) */
    atlas_step_ahead step_ahead; /* decode steps queued a step ahead (default auto) */
} atlas_engine_params;

enum { ATLAS_MAX_RESIDENT_AUTO = -1 }; /* atlas_engine_params.max_resident */

/* The defaults above (no models).  Pure. */
ATLAS_API atlas_engine_params atlas_engine_default_params(void);

/* Checks the params (ATLAS_ERR_INVALID naming the field; a model directory without
 * config.json is ATLAS_ERR_IO naming it) and starts the scheduler thread.  Loads no
 * model: the first request (or atlas_engine_load) does.  *out is the caller's
 * (atlas_engine_free); NULL on failure. */
ATLAS_API atlas_status atlas_engine_create(const atlas_engine_params *p, atlas_engine **out);

/* Ends every request (finish CANCELLED), joins the thread, releases the models and frees
 * the engine.  Handles not yet freed stay valid until atlas_engine_handle_free.  NULL:
 * no-op. */
ATLAS_API void atlas_engine_free(atlas_engine *e);

/* ---- requests ------------------------------------------------------------------------- */

typedef struct atlas_request {
    const char *model;            /* a configured name */
    const int32_t *prompt;        /* [n_prompt] token ids, >= 1 of them */
    size_t n_prompt;
    atlas_sampler_params sampling;
    int max_tokens;               /* <= 0: until the context is full; a prompt and
                                     max_tokens beyond the context are refused
                                     (ATLAS_ERR_RANGE), as vLLM does */
    const int32_t *stop_ids;      /* [n_stop_ids]: end the generation (like eos) */
    int n_stop_ids;
    const char *const *stop;      /* [n_stop] stop strings: the text ends before them */
    int n_stop;
    int logprobs;                 /* 1: token events carry the token's logprob */
    int top_logprobs;             /* 0 .. ATLAS_ENGINE_MAX_TOP_LOGPROBS */
    int ignore_eos;               /* 1: the model's eos ids do not end the generation */
    /* NULL: none.  Else the text must follow this program (copied by submit, so the caller
     * may free it at once): tokens it does not allow get no probability (logprobs are still
     * those of the raw logits), eos and stop ids included, and the request ends with STOP
     * as soon as the program is complete.  Special tokens, which the text leaves out, are
     * never allowed.  Stop strings and max_tokens still apply. */
    const atlas_constraint *constraint;
    /* Teacher forcing, for checking the engine against a reference: the first n_forced
     * generated tokens are forced[0 .. n_forced) instead of samples (copied by submit).  Their
     * events carry the logprobs of the model's raw logits as usual, so the logprobs at each
     * position are the model's given the reference's tokens before it.  Ids must be in the
     * vocabulary; eos and stop ids among them end the generation as a sample would. */
    const int32_t *forced;
    int n_forced;
    /* NULL or "": none.  Else the prefix cache shares this request's KV blocks only with
     * requests of the same salt, byte for byte (vLLM's cache_salt); a request without one
     * shares only with others without one.  At most ATLAS_ENGINE_MAX_CACHE_SALT bytes. */
    const char *cache_salt;
    /* 0: the model's keep-alive.  Else (ATLAS_KEEP_ALIVE_FOREVER, _NONE or milliseconds) how
     * long the model stays after this request, as Ollama's keep_alive: each request that
     * runs sets it anew (one without keep_alive_ms back to the model's).  Has no effect on
     * a pinned model. */
    int64_t keep_alive_ms;
    /* A budget on thinking (Anthropic's thinking.budget_tokens).  0 (default): none.  Else a
     * think block opens when the generated tokens end with think_open[0 .. n_think_open)
     * (0 to ATLAS_ENGINE_MAX_THINK_IDS ids), or at the start when think_inside is 1 (the
     * prompt opened it), and closes when they end with think_close[0 .. n_think_close) (1 to
     * ATLAS_ENGINE_MAX_THINK_IDS ids).  Once think_budget tokens have been generated inside
     * blocks (over the whole reply; the tokens of the closing tag itself are counted until
     * it is complete), the closing ids are forced next, as teacher forcing forces tokens, and
     * the reply goes on after the block; a block opened after the budget is spent is closed
     * at once.  Not with a constraint (ATLAS_ERR_INVALID: its program would refuse the
     * tags).  Ids copied by submit. */
    int think_budget;
    const int32_t *think_open;
    int n_think_open;
    const int32_t *think_close;
    int n_think_close;
    int think_inside;
    /* 1: an embedding request, for an embedding model (atlas_engine_embedding): the prompt
     * (which may fill the whole context) is computed and pooled, no token is generated, and
     * the END event carries the vector (atlas_event.embedding).  The generation fields above
     * are ignored.  0 on an embedding model, or 1 on another: ATLAS_ERR_INVALID naming it. */
    int embed;
} atlas_request;

enum {
    ATLAS_ENGINE_MAX_TOP_LOGPROBS = 20,
    ATLAS_ENGINE_MAX_CACHE_SALT = 256,
    ATLAS_ENGINE_MAX_THINK_IDS = 8,
    ATLAS_ENGINE_MAX_MATRYOSHKA = 32, /* atlas_engine_model.n_matryoshka_dims */
};

typedef enum atlas_event_type {
    ATLAS_EVENT_TOKEN = 0, /* one generated token */
    ATLAS_EVENT_END,       /* the last event of every request, exactly once */
} atlas_event_type;

typedef enum atlas_finish {
    ATLAS_FINISH_STOP = 0,   /* an eos id, a stop id, a stop string or a complete constraint */
    ATLAS_FINISH_LENGTH,     /* max_tokens or the context size */
    ATLAS_FINISH_CANCELLED,  /* atlas_engine_cancel or atlas_engine_free */
    ATLAS_FINISH_ERROR,      /* status and message say why (e.g. the model failed to load) */
} atlas_finish;

typedef struct atlas_usage {
    int prompt_tokens;
    int completion_tokens; /* generated tokens, the stopping eos/stop id included */
    int cached_tokens;     /* prompt tokens whose KV was reused instead of computed */
} atlas_usage;

typedef struct atlas_top_logprob {
    int32_t id;
    float logprob;
} atlas_top_logprob;

/* Logprobs are the log-softmax of the model's raw logits, before any sampling transform. */
typedef struct atlas_event {
    atlas_event_type type;
    /* TOKEN and END: text released now, UTF-8 (never a broken character), not
     * NUL-terminated; may be empty.  Text that could be the start of a stop string is held
     * back until it is known not to be; END releases what is left.  The stop string and
     * tokens that end the generation (eos, stop ids) are not part of the text. */
    const char *text;
    size_t text_len;
    /* TOKEN; and END by an eos or stop id (stop_id >= 0): that token's logprobs */
    int32_t id;
    float logprob;                  /* when the request asked for logprobs */
    const atlas_top_logprob *top;   /* [n_top], most likely first */
    int n_top;
    /* END */
    atlas_finish finish;
    atlas_status status;            /* ERROR: why; ATLAS_OK otherwise */
    const char *message;            /* ERROR: what failed and where; "" otherwise */
    const char *stop_string;        /* STOP by a stop string: which one; else NULL */
    int32_t stop_id;                /* STOP by an eos or stop id: which; else -1 */
    atlas_usage usage;              /* END; TOKEN: so far (the prompt's cached tokens are
                                       known from the first token on) */
    double ttft_s;                  /* submit to first token; 0 when there was none */
    double queue_s;                 /* submit to the first step that computed it */
    /* END of an embedding request that finished (STOP): the pooled vector, L2-normalised
     * when the model says so; else NULL and 0 */
    const float *embedding;
    int n_embedding;
} atlas_event;

/* Called on the scheduler thread; everything *ev points to is valid during the call only. */
typedef void (*atlas_event_cb)(const atlas_event *ev, void *user);

/* Copies *req and queues it.  Errors (nothing is called back then):
 *   ATLAS_ERR_NOT_FOUND  unknown model name;
 *   ATLAS_ERR_RANGE      prompt longer than the context ("prompt has N tokens, the context
 *                        holds C"; it must leave room for one generated token), a prompt,
 *                        stop or logit_bias id outside the vocabulary;
 *   ATLAS_ERR_INVALID    empty prompt, bad sampler params, top_logprobs out of range, an
 *                        empty or ambiguous constraint program;
 *   ATLAS_ERR_BUSY       the queue is full (the server answers 429).
 * On success cb then receives TOKEN events and one END, possibly before submit returns.
 * With out non-NULL, *out is a handle for atlas_engine_cancel, which the caller frees
 * with atlas_engine_handle_free (any time, before or after the END). */
ATLAS_API atlas_status atlas_engine_submit(atlas_engine *e, const atlas_request *req,
                                           atlas_event_cb cb, void *user,
                                           atlas_request_handle **out);

/* Ends the request soon (END with CANCELLED, unless it already ended) and frees its KV
 * blocks at the next step boundary.  Safe from any thread, callbacks included. */
ATLAS_API void atlas_engine_cancel(atlas_request_handle *h);

/* Drops the caller's handle (does not cancel).  NULL: no-op. */
ATLAS_API void atlas_engine_handle_free(atlas_request_handle *h);

/* ---- models --------------------------------------------------------------------------- */

/* Loads the model now (evicting others as residency requires) and waits.  Errors are the
 * load's own (ATLAS_ERR_IO, ATLAS_ERR_FORMAT, ATLAS_ERR_DEVICE_NOMEM, ...), or
 * ATLAS_ERR_NOT_FOUND for an unknown name. */
ATLAS_API atlas_status atlas_engine_load(atlas_engine *e, const char *name);

/* Sets the model's keep-alive from now on, as a request's keep_alive_ms does (0: back to
 * its setting); ATLAS_ERR_NOT_FOUND for an unknown name. */
ATLAS_API atlas_status atlas_engine_keep_alive(atlas_engine *e, const char *name,
                                               int64_t keep_alive_ms);

/* Releases the model now when no request runs on it, and waits for that: ATLAS_OK (not
 * resident: ATLAS_OK too).  With requests running on it the release is refused:
 * ATLAS_ERR_BUSY, nothing released, and the message says how many ("model 'NAME' has N
 * request(s) in flight").  The model then drains: it admits no more requests (new ones
 * wait), those running go on to their ends, and it is released after the last one has
 * ended; atlas_engine_load of it before then takes that back.  Requests that arrive for it
 * after its release load it again.  An unload after the running requests have ended is
 * granted (or finds the model already released). */
ATLAS_API atlas_status atlas_engine_unload(atlas_engine *e, const char *name);

typedef struct atlas_engine_model_status {
    const char *name;       /* valid while the engine lives */
    const char *dir;
    int resident;
    int running;            /* sequences running on it */
    int waiting;            /* requests queued for it */
    char last_error[256];   /* of its last failed load, "" if none */
    int ctx_size;           /* tokens per sequence */
    int max_ctx;            /* the model's own maximum */
    long kv_tokens;         /* tokens its KV pool holds (all sequences together) */
    size_t kv_bytes;        /* the pool's size */
    char note[256];         /* why ctx_size is below what was asked, "" if it is not */
    char backend[16];       /* "cpu", "cuda" while resident; "" otherwise */
    char architecture[64];  /* config.json's architectures[0], resident or not */
    const char *chat_template;    /* atlas_engine_model's, copied: NULL when none */
    const char *tool_call_format; /* likewise */
    /* While resident (else "" and 0), as atlas_model_get_info says: */
    char dtype[8];          /* of the weights in the files ("BF16", ..., "mixed") */
    int64_t n_params;
    size_t weight_bytes;    /* the weights' bytes in the files */
    /* "resident", "draining" (to be released once its requests end), "loading" (also
     * once loaded beside the model draining for it, until that one is released: resident
     * is 0 then, resident_bytes counts it), "unloaded", or "failed" (its last load failed:
     * last_error says why) */
    const char *state;
    double retry_in_s;      /* failed: seconds until a request tries to load it again
                               (sooner when its files change; 0: the next one does) */
    int failed_loads;       /* failed loads in a row (0 once one succeeds) */
    /* Its settings (atlas_engine_model, the params' filled in): */
    int parallel;
    int batch_tokens;
    int pinned;
    int64_t keep_alive_ms;  /* as set, ATLAS_KEEP_ALIVE_FOREVER or _NONE or ms */
    int64_t keep_alive_now_ms; /* what holds now (the last request's, else as set) */
    double expires_in_s;    /* resident and idle with a timed keep-alive: seconds until its
                               release; else -1 */
    char kv_dtype[8];       /* its KV cache's element type: "bf16" (GPU, and the CPU with bf16
                               or int8 activations), "f32" (the CPU's fp32), "fp8" (e4m3,
                               asked for) */
    int kv_block_size;      /* tokens a KV block holds */
    int kv_blocks;          /* blocks of its pool (kv_tokens / kv_block_size) */
    int kv_blocks_used;     /* of them held by sequences now (0 while not resident) */
    size_t resident_bytes;  /* its weights and KV pool while resident (else 0) */
    size_t memory_bytes;    /* what it takes resident: estimated from its files until its
                               first load, then as loaded */
    double last_load_s;     /* its last load's seconds (0: never loaded) */
} atlas_engine_model_status;

/* Fills the caller's out[0 .. min(cap, n)) and returns n, the number of configured models
 * (a snapshot: name and dir live as long as the engine). */
ATLAS_API int atlas_engine_models(atlas_engine *e, atlas_engine_model_status *out, int cap);

/* The model's tokenizer, loaded on first use (with the vocab_size of its config.json) and
 * kept, resident or not, until atlas_engine_free. */
ATLAS_API atlas_status atlas_engine_tokenizer(atlas_engine *e, const char *name,
                                              const atlas_tokenizer **out);

/* The model's chat template, loaded on first use and kept likewise (ATLAS_ERR_NOT_FOUND
 * when the directory has none). */
ATLAS_API atlas_status atlas_engine_template(atlas_engine *e, const char *name,
                                             const atlas_template **out);

/* What an embedding model makes (sentence-transformers' modules.json and Pooling config,
 * config.json's Matryoshka widths or the model's own setting), read at create. */
typedef struct atlas_engine_embedding {
    int is_embedding;     /* 0: a generative model (the rest is 0) */
    const char *pooling;  /* "mean", "last" or "cls" (NULL when not an embedding model) */
    int normalize;        /* 1: vectors are L2-normalised */
    int dims;             /* a vector's width (hidden_size) */
    const int *matryoshka; /* [n_matryoshka]: the widths a vector may be cut to; valid while
                              the engine lives */
    int n_matryoshka;
    int matryoshka_any;   /* 1: any width 1..dims (is_matryoshka without a list) */
} atlas_engine_embedding;

/* Fills *out for the model NAME (ATLAS_ERR_NOT_FOUND for an unknown one). */
ATLAS_API atlas_status atlas_engine_embedding_info(atlas_engine *e, const char *name,
                                                   atlas_engine_embedding *out);

/* The context size of a sequence of that model (ctx_size or the model's own limit). */
ATLAS_API atlas_status atlas_engine_ctx_size(atlas_engine *e, const char *name, int *out);

/* The sampling defaults of the model's generation_config.json, as read when the engine was
 * made (atlas_model_generation_defaults; set 0 when it has none). */
ATLAS_API atlas_status atlas_engine_generation_defaults(atlas_engine *e, const char *name,
                                                        atlas_generation_defaults *out);

/* ---- metrics -------------------------------------------------------------------------- */

enum { ATLAS_ENGINE_HIST_BUCKETS = 16 };

/* Latency histogram: counts[i] holds observations <= bounds[i] (and above bounds[i-1]);
 * counts[ATLAS_ENGINE_HIST_BUCKETS] those above the last bound. */
typedef struct atlas_engine_hist {
    double bounds[ATLAS_ENGINE_HIST_BUCKETS]; /* seconds, increasing */
    uint64_t counts[ATLAS_ENGINE_HIST_BUCKETS + 1];
    uint64_t n;
    double sum;
} atlas_engine_hist;

typedef struct atlas_engine_metrics {
    uint64_t requests_submitted, requests_rejected; /* rejected: BUSY at submit */
    uint64_t finished_stop, finished_length, finished_cancelled, finished_error;
    uint64_t prompt_tokens;     /* prefilled (recomputed ones after preemption included) */
    uint64_t cached_tokens;     /* prompt tokens whose KV came from the prefix cache */
    uint64_t generated_tokens;
    uint64_t steps;             /* forward passes */
    uint64_t steps_ahead;       /* of them, decode steps queued while the one before ran
                                   (plain greedy and plain sampled sequences only) */
    uint64_t preemptions;       /* for KV blocks, or paused by a swap's drain timeout */
    int queue_len;              /* requests waiting to start */
    int running;                /* sequences in the running batches */
    int last_batch_tokens;      /* tokens in the last forward */
    int kv_blocks_used, kv_blocks_total; /* over the resident models */
    int kv_blocks_cached;       /* free blocks that keep a prefix for reuse */
    int resident_models;
    uint64_t loads, load_failures, unloads;
    uint64_t release_busy;      /* releases refused while requests ran on the model (a swap's
                                   or an unload's drain; not an error) */
    uint64_t unload_failures;   /* releases that failed to free something (the model is gone
                                   all the same; atlas_engine_models' last_error says what) */
    double last_swap_s;         /* release of the old model to the new one serving (a load
                                   beside the draining old one: only what is left of it) */
    uint64_t swaps;             /* loads that released another model to make room */
    double swap_seconds;        /* their time, from the first release to the new model
                                   serving (a load beside the old one's drain not counted) */
    size_t memory_budget;       /* bytes the resident models may take (0: no limit) */
    /* released models' prefix KV in host memory (atlas_engine_params.host_cache) */
    uint64_t kv_host_saved_blocks, kv_host_saved_bytes;       /* copied out at releases */
    uint64_t kv_host_restored_blocks, kv_host_restored_bytes; /* copied back for requests */
    uint64_t kv_host_dropped_blocks; /* evicted for room, or their model came back changed */
    size_t kv_host_bytes;       /* held now */
    int kv_host_blocks;
    size_t kv_host_budget;      /* what the store may hold now: --host-cache less what the
                                   weights' host tier holds or a coming load may fill */
    /* where loads read the weights from (atlas_model_info.load_source) and their bytes */
    uint64_t loads_host, loads_page_cache, loads_disk;
    uint64_t load_bytes_host, load_bytes_page_cache, load_bytes_disk;
    /* the weights' host tier (the process's, atlas_engine_params.host_cache) */
    size_t host_tier_bytes;     /* the images kept */
    size_t host_tier_pinned;    /* pinned memory it holds, free chunks included */
    int host_tier_models;       /* images kept */
    uint64_t host_tier_evicted; /* images evicted for room */
    uint64_t device_contexts;   /* GPU contexts the process created: 1 once it used the GPU,
                                   for its life (a swap never makes another) */
    int device_lost;            /* 1 once the GPU returned one of CUDA's sticky errors (a
                                   kernel's illegal address, an uncorrectable ECC error...):
                                   every GPU model fails from then on, until a restart */
    char device_error[512];     /* the first such error, "" while there is none */
    atlas_engine_hist ttft;     /* submit to first token */
    atlas_engine_hist itl;      /* between consecutive tokens of a sequence */
    atlas_engine_hist swap;     /* each swap (or load) */
} atlas_engine_metrics;

/* A snapshot of the counters into the caller's *out. */
ATLAS_API void atlas_engine_get_metrics(atlas_engine *e, atlas_engine_metrics *out);

#ifdef __cplusplus
}
#endif
#endif

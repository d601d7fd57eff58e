/* server/embed.c — see embed.h. */
#include "server/embed.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "atlas/engine.h"
#include "atlas/tokenizer.h"
#include "server/api.h"
#include "server/errors.h"
#include "server/params.h"

/* Sequences one request keeps in the engine's queue at once: the rest wait here, so that a
 * request of 2,048 inputs neither fills the queue (other clients' 429s) nor is refused. */
enum { EMBED_IN_FLIGHT = 64 };

void atlas_embed_req_free(atlas_embed_req *q) {
    for (int i = 0; q->ids && i < q->count; i++) free(q->ids[i]);
    free(q->ids);
    free(q->n);
    q->ids = NULL;
    q->n = NULL;
    q->count = 0;
}

/* One input: a string, or a non-empty array of token ids in the vocabulary. */
static atlas_status one_input(const json_t *v, const char *where, const atlas_tokenizer *tok,
                              int32_t **ids, size_t *n) {
    if (json_is_string(v)) {
        if (json_string_length(v) == 0)
            return atlas_fail(ATLAS_ERR_INVALID, "'%s' is an empty string", where);
        return atlas_tokenizer_encode(tok, json_string_value(v), json_string_length(v), true,
                                      ids, n);
    }
    if (!json_is_array(v) || json_array_size(v) == 0)
        return atlas_fail(ATLAS_ERR_INVALID, "'%s' must be a non-empty string or array of token "
                          "ids", where);
    size_t count = json_array_size(v), vocab = atlas_tokenizer_vocab_size(tok);
    if (!(*ids = malloc(count * sizeof **ids)))
        return atlas_fail(ATLAS_ERR_NOMEM, "%s: out of memory", where);
    for (size_t i = 0; i < count; i++) {
        const json_t *t = json_array_get(v, i);
        json_int_t id = json_is_integer(t) ? json_integer_value(t) : -1;
        if (id < 0 || (size_t)id >= vocab)
            return atlas_fail(ATLAS_ERR_INVALID, "'%s[%zu]' must be a token id in 0..%zu", where,
                              i, vocab - 1);
        (*ids)[i] = (int32_t)id;
    }
    *n = count;
    return ATLAS_OK;
}

atlas_status atlas_embed_inputs(atlas_server *s, const json_t *body, const char *key,
                                atlas_embed_req *q, const char **param) {
    const atlas_tokenizer *tok;
    ATLAS_TRY(atlas_engine_tokenizer(s->engine, q->model, &tok));
    const json_t *in = json_object_get(body, key);
    *param = key;
    if (!in) return atlas_fail(ATLAS_ERR_INVALID, "'%s' is required", key);
    const json_t *first = json_array_get(in, 0);
    /* one input (a string or ids), or a list of them */
    bool many = json_is_array(in) && (json_is_string(first) || json_is_array(first));
    size_t k = many ? json_array_size(in) : 1;
    if (json_is_array(in) && json_array_size(in) == 0)
        return atlas_fail(ATLAS_ERR_INVALID, "'%s' is an empty list", key);
    if (k > ATLAS_EMBED_MAX_INPUTS)
        return atlas_fail(ATLAS_ERR_INVALID, "'%s' holds %zu inputs: at most %d", key, k,
                          ATLAS_EMBED_MAX_INPUTS);
    q->ids = calloc(k, sizeof *q->ids);
    q->n = calloc(k, sizeof *q->n);
    if (!q->ids || !q->n) return atlas_fail(ATLAS_ERR_NOMEM, "%s: out of memory", key);
    q->count = (int)k;
    for (size_t i = 0; i < k; i++) {
        char where[48];
        if (many) snprintf(where, sizeof where, "%s[%zu]", key, i);
        else snprintf(where, sizeof where, "%s", key);
        ATLAS_TRY(one_input(many ? json_array_get(in, i) : in, where, tok, &q->ids[i], &q->n[i]));
    }
    *param = NULL;
    return ATLAS_OK;
}

atlas_status atlas_embed_dimensions(atlas_server *s, const json_t *body, atlas_embed_req *q,
                                    const char **param) {
    atlas_engine_embedding info;
    ATLAS_TRY(atlas_engine_embedding_info(s->engine, q->model, &info));
    if (!info.is_embedding) {
        *param = "model";
        return atlas_fail(ATLAS_ERR_INVALID, "model '%s' is not an embedding model (its "
                          "directory has no sentence-transformers modules.json with a Pooling "
                          "module): it generates text", q->model);
    }
    q->dims = info.dims;
    q->normalize = info.normalize != 0;
    const json_t *v = json_object_get(body, "dimensions");
    if (!v || json_is_null(v)) return ATLAS_OK;
    *param = "dimensions";
    if (!info.n_matryoshka && !info.matryoshka_any)
        return atlas_fail(ATLAS_ERR_INVALID, "model '%s' declares no Matryoshka dimensions "
                          "(is_matryoshka / matryoshka_dimensions in its config.json, or the "
                          "models file): 'dimensions' cannot shorten its vectors", q->model);
    int64_t want = 0;
    ATLAS_TRY(atlas_param_int(body, "dimensions", 1, info.dims, &want, NULL, param));
    bool ok = info.matryoshka_any;
    char list[256] = "";
    for (int i = 0; i < info.n_matryoshka; i++) {
        ok |= info.matryoshka[i] == want;
        size_t len = strlen(list);
        snprintf(list + len, sizeof list - len, "%s%d", i ? ", " : "", info.matryoshka[i]);
    }
    *param = "dimensions";
    if (!ok)
        return atlas_fail(ATLAS_ERR_INVALID, "'dimensions' %lld is not one of model '%s''s "
                          "Matryoshka dimensions (%s)", (long long)want, q->model, list);
    q->dims = (int)want;
    *param = NULL;
    return ATLAS_OK;
}

/* --- running ------------------------------------------------------------------------------ */

typedef struct embed_job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int in_flight;           /* submitted, END not yet seen */
    int full_dims;           /* the model's width: what the engine hands back */
    const atlas_embed_req *q;
    float *vecs;             /* [count * q->dims] */
    atlas_status st;         /* the first failure */
    char msg[512];
} embed_job;

typedef struct embed_one {
    embed_job *job;
    int index;
    atlas_request_handle *h;
} embed_one;

/* The engine's END (on its thread): the vector cut to the width asked and, cut, normalised
 * again when the model normalises (vLLM's order: cut, then normalise). */
static void on_event(const atlas_event *ev, void *user) {
    embed_one *one = user;
    embed_job *job = one->job;
    if (ev->type != ATLAS_EVENT_END) return;
    pthread_mutex_lock(&job->mu);
    int d = job->q->dims;
    if (ev->embedding && ev->n_embedding >= d) {
        float *out = job->vecs + (size_t)one->index * d;
        double norm = 0;
        for (int k = 0; k < d; k++) norm += (double)ev->embedding[k] * ev->embedding[k];
        double scale = d < ev->n_embedding && job->q->normalize ? 1 / fmax(sqrt(norm), 1e-12) : 1;
        for (int k = 0; k < d; k++) out[k] = (float)(ev->embedding[k] * scale);
    } else if (job->st == ATLAS_OK) {
        job->st = ev->finish == ATLAS_FINISH_ERROR ? ev->status : ATLAS_ERR_UNAVAILABLE;
        snprintf(job->msg, sizeof job->msg, "%s", ev->finish == ATLAS_FINISH_ERROR
                 ? ev->message : "the request was cancelled (the server stops)");
    }
    job->in_flight--;
    pthread_cond_signal(&job->cv);
    pthread_mutex_unlock(&job->mu);
}

/* Inputs longer than the context: cut to it (truncate), else refused naming the input. */
static atlas_status fit_context(atlas_server *s, atlas_embed_req *q, long *tokens,
                                const char **param) {
    int ctx = 0;
    ATLAS_TRY(atlas_engine_ctx_size(s->engine, q->model, &ctx));
    *tokens = 0;
    for (int i = 0; i < q->count; i++) {
        if (q->n[i] > (size_t)ctx && !q->truncate) {
            *param = "input";
            return atlas_fail(ATLAS_ERR_RANGE, "input %d has %zu tokens, the context of model "
                              "'%s' holds %d (Ollama's /api/embed cuts it with \"truncate\": "
                              "true)", i, q->n[i], q->model, ctx);
        }
        if (q->n[i] > (size_t)ctx) q->n[i] = (size_t)ctx; /* the head is kept, as Ollama does */
        *tokens += (long)q->n[i];
    }
    return ATLAS_OK;
}

/* Submits input i; ATLAS_ERR_BUSY when the engine's queue is full (tried again later). */
static atlas_status submit_one(atlas_server *s, embed_job *job, embed_one *one, int i) {
    const atlas_embed_req *q = job->q;
    atlas_request r = {.model = q->model, .prompt = q->ids[i], .n_prompt = q->n[i],
                       .sampling = atlas_sampler_default_params(), .embed = 1,
                       .keep_alive_ms = q->keep_alive_ms};
    one->job = job;
    one->index = i;
    return atlas_engine_submit(s->engine, &r, on_event, one, &one->h);
}

static void cancel_all(embed_one *ones, int n) {
    for (int i = 0; i < n; i++) atlas_engine_cancel(ones[i].h);
}

/* Keeps up to EMBED_IN_FLIGHT of q's inputs in the engine until every one has ended, the
 * first failure stops the rest, or the client leaves. Under job->mu. */
static atlas_status pump(atlas_server *s, atlas_http_call *call, embed_job *job,
                         embed_one *ones, atlas_embed_end *end) {
    int next = 0, count = job->q->count;
    bool stopped = false; /* nothing more is submitted; those in flight are cancelled */
    while (next < count || job->in_flight > 0) {
        while (!stopped && next < count && job->in_flight < EMBED_IN_FLIGHT) {
            job->in_flight++;
            pthread_mutex_unlock(&job->mu);
            atlas_status st = submit_one(s, job, &ones[next], next);
            pthread_mutex_lock(&job->mu);
            if (st == ATLAS_OK) {
                next++;
                continue;
            }
            job->in_flight--;
            if (st == ATLAS_ERR_BUSY && job->in_flight > 0) break; /* after one of ours ends */
            if (job->st == ATLAS_OK) {
                job->st = st;
                snprintf(job->msg, sizeof job->msg, "%s", atlas_last_error());
            }
        }
        if (!stopped && (job->st != ATLAS_OK || *end != ATLAS_EMBED_DONE)) {
            stopped = true;
            next = count;
            cancel_all(ones, count);
        }
        if (job->in_flight == 0 && next >= count) break;
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_nsec += 50 * 1000 * 1000; /* the client's socket is looked at 20 times a second */
        if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&job->cv, &job->mu, &t);
        if (*end == ATLAS_EMBED_DONE && atomic_load(&s->stopping)) *end = ATLAS_EMBED_STOPPING;
        else if (*end == ATLAS_EMBED_DONE && atlas_http_client_gone(call->fd))
            *end = ATLAS_EMBED_GONE;
    }
    return job->st;
}

atlas_status atlas_embed_run(atlas_server *s, atlas_http_call *call, atlas_embed_req *q,
                             float **vecs, long *tokens, atlas_embed_end *end,
                             const char **param) {
    *vecs = NULL;
    *end = ATLAS_EMBED_DONE;
    ATLAS_TRY(fit_context(s, q, tokens, param));
    embed_job job = {.q = q, .st = ATLAS_OK};
    embed_one *ones = calloc((size_t)q->count, sizeof *ones);
    job.vecs = malloc((size_t)q->count * (size_t)q->dims * sizeof *job.vecs);
    if (!ones || !job.vecs) {
        free(ones);
        free(job.vecs);
        return atlas_fail(ATLAS_ERR_NOMEM, "embeddings: out of memory");
    }
    pthread_mutex_init(&job.mu, NULL);
    pthread_cond_init(&job.cv, NULL);
    pthread_mutex_lock(&job.mu);
    atlas_status st = pump(s, call, &job, ones, end);
    pthread_mutex_unlock(&job.mu);
    for (int i = 0; i < q->count; i++) atlas_engine_handle_free(ones[i].h);
    free(ones);
    pthread_cond_destroy(&job.cv);
    pthread_mutex_destroy(&job.mu);
    if (st != ATLAS_OK || *end != ATLAS_EMBED_DONE) {
        free(job.vecs);
        if (st != ATLAS_OK) return atlas_fail(st, "%s", job.msg);
        return ATLAS_OK;
    }
    *vecs = job.vecs;
    return ATLAS_OK;
}

void atlas_embed_fail(atlas_http_reply *r, atlas_status st, atlas_embed_end end,
                      const char *param) {
    if (end == ATLAS_EMBED_GONE)
        atlas_api_error_reply(r, ATLAS_API_ERR_CLIENT_GONE, ATLAS_OK, NULL,
                              "the client closed the connection");
    else if (end == ATLAS_EMBED_STOPPING)
        atlas_api_error_reply(r, ATLAS_API_ERR_SHUTDOWN, ATLAS_OK, NULL, "the server is stopping");
    else
        atlas_api_error_fail(r, st, param);
}

/* --- OpenAI's /v1/embeddings ---------------------------------------------------------------- */

/* float32 little-endian bytes of v[n], base64 (RFC 4648, padded): OpenAI's "base64". */
static json_t *base64_vector(const float *v, int n) {
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t bytes = (size_t)n * 4, len = (bytes + 2) / 3 * 4;
    unsigned char *raw = malloc(bytes ? bytes : 1);
    char *out = malloc(len + 1);
    json_t *j = NULL;
    if (raw && out) {
        for (int i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &v[i], 4);
            for (int b = 0; b < 4; b++) raw[4 * i + b] = (unsigned char)(u >> (8 * b));
        }
        size_t o = 0;
        for (size_t i = 0; i < bytes; i += 3) {
            uint32_t w = (uint32_t)raw[i] << 16;
            if (i + 1 < bytes) w |= (uint32_t)raw[i + 1] << 8;
            if (i + 2 < bytes) w |= raw[i + 2];
            out[o++] = abc[(w >> 18) & 63];
            out[o++] = abc[(w >> 12) & 63];
            out[o++] = i + 1 < bytes ? abc[(w >> 6) & 63] : '=';
            out[o++] = i + 2 < bytes ? abc[w & 63] : '=';
        }
        j = json_stringn(out, o);
    }
    free(raw);
    free(out);
    return j;
}

/* A vector as JSON numbers (float32, printed as the shortest double that reads back). */
json_t *atlas_embed_floats(const float *v, int n) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_real((double)v[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static json_t *openai_answer(const atlas_embed_req *q, const float *vecs, long tokens,
                             bool b64) {
    json_t *data = json_array();
    for (int i = 0; data && i < q->count; i++) {
        const float *v = vecs + (size_t)i * q->dims;
        json_t *e = b64 ? base64_vector(v, q->dims) : atlas_embed_floats(v, q->dims);
        json_t *item = e ? json_pack("{s:s,s:i,s:o}", "object", "embedding", "index", i,
                                     "embedding", e) : NULL;
        if (!item || json_array_append_new(data, item)) {
            json_decref(data);
            return NULL;
        }
    }
    if (!data) return NULL;
    return json_pack("{s:s,s:o,s:s,s:{s:I,s:I}}", "object", "list", "data", data, "model",
                     q->model, "usage", "prompt_tokens", (json_int_t)tokens, "total_tokens",
                     (json_int_t)tokens);
}

/* "encoding_format": "float" (default) or "base64". */
static atlas_status encoding(const json_t *body, bool *b64, const char **param) {
    const char *f = "float";
    ATLAS_TRY(atlas_param_string(body, "encoding_format", &f, param));
    *b64 = !strcmp(f, "base64");
    if (*b64 || !strcmp(f, "float")) return ATLAS_OK;
    *param = "encoding_format";
    return atlas_fail(ATLAS_ERR_INVALID, "'encoding_format' must be \"float\" or \"base64\"");
}

void atlas_api_embeddings(atlas_http_call *call, json_t *body, const char *arg,
                          atlas_http_reply *r) {
    (void)arg;
    atlas_server *s = call->ctx;
    const char *param = NULL;
    atlas_embed_req q = {0};
    bool b64 = false;
    float *vecs = NULL;
    long tokens = 0;
    atlas_embed_end end = ATLAS_EMBED_DONE;
    atlas_status st = atlas_api_model(s, body, NULL, &q.model, &param);
    if (st == ATLAS_OK) st = encoding(body, &b64, &param);
    if (st == ATLAS_OK) st = atlas_embed_dimensions(s, body, &q, &param);
    if (st == ATLAS_OK) st = atlas_embed_inputs(s, body, "input", &q, &param);
    if (st == ATLAS_OK) st = atlas_embed_run(s, call, &q, &vecs, &tokens, &end, &param);
    call->log.tokens_in = tokens;
    json_t *answer = st == ATLAS_OK && vecs ? openai_answer(&q, vecs, tokens, b64) : NULL;
    if (answer) atlas_http_reply_json(r, 200, answer);
    else if (st == ATLAS_OK && vecs) atlas_api_error_fail(r, atlas_fail(ATLAS_ERR_NOMEM,
                                                          "embeddings: out of memory"), NULL);
    else atlas_embed_fail(r, st, end, param);
    free(vecs);
    atlas_embed_req_free(&q);
}

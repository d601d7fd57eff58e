/* engine/output.c — from a sampled token to the client's events: stop ids, incremental
 * detokenization, stop strings (text that may begin one is held back until it cannot),
 * length limits, and the END event.  Below the scheduler: it calls only seq.c (the clock,
 * failing a sequence) and hands events to the request's own callback. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "engine/engine_internal.h"

static int is_stop_id(const atlas_engine *e, const seq *s, int32_t id) {
    const eng_model *md = &e->models[s->model];
    if (!s->ignore_eos)
        for (int i = 0; i < md->n_eos; i++)
            if (md->eos[i] == id) return 1;
    for (int i = 0; i < s->n_stop_ids; i++)
        if (s->stop_ids[i] == id) return 1;
    return 0;
}

static atlas_status pending_append(seq *s, const char *text, size_t len) {
    /* allocated on the first token even when it adds no text (a partial UTF-8 sequence):
     * memmove, memmem and friends must never see a NULL buffer, even for 0 bytes */
    if (!s->pending || s->n_pending + len > s->pending_cap) {
        size_t cap = s->pending_cap ? s->pending_cap : 64;
        while (cap < s->n_pending + len) cap *= 2;
        char *p = realloc(s->pending, cap);
        if (!p) return atlas_fail(ATLAS_ERR_NOMEM, "engine: %zu bytes of output text", cap);
        s->pending = p;
        s->pending_cap = cap;
    }
    if (len) memcpy(s->pending + s->n_pending, text, len);
    s->n_pending += len;
    return ATLAS_OK;
}

/* Earliest occurrence of any stop string in the pending text: its offset, and which one in
 * *which; -1 if none. */
static long find_stop(const seq *s, int *which) {
    long best = -1;
    for (int k = 0; k < s->n_stop; k++) {
        size_t len = strlen(s->stop[k]);
        const char *p = memmem(s->pending, s->n_pending, s->stop[k], len);
        if (p && (best < 0 || p - s->pending < best)) {
            best = p - s->pending;
            *which = k;
        }
    }
    return best;
}

/* Length of the longest suffix of the pending text that is a proper prefix of a stop
 * string: that much must wait for the next token. */
static size_t held_back(const seq *s) {
    size_t best = 0;
    for (int k = 0; k < s->n_stop; k++) {
        size_t len = strlen(s->stop[k]);
        size_t max = len - 1 < s->n_pending ? len - 1 : s->n_pending;
        for (size_t l = max; l > best; l--)
            if (!memcmp(s->pending + s->n_pending - l, s->stop[k], l)) {
                best = l;
                break;
            }
    }
    return best;
}

static void observe_token(atlas_engine *e, seq *s) {
    double now = atlas_engine_now();
    pthread_mutex_lock(&e->mu);
    e->metrics.generated_tokens++;
    if (s->t_first == 0) {
        s->t_first = now;
        atlas_engine_hist_observe(&e->metrics.ttft, now - s->t_submit);
    } else {
        atlas_engine_hist_observe(&e->metrics.itl, now - s->t_last);
    }
    pthread_mutex_unlock(&e->mu);
    s->t_last = now;
}

int atlas_engine_seq_accept(atlas_engine *e, seq *s, int32_t id, float logprob,
                            const atlas_top_logprob *top, int n_top) {
    s->tokens[s->n_tokens++] = id;
    observe_token(e, s);
    if (is_stop_id(e, s, id)) {
        s->finish = ATLAS_FINISH_STOP;
        s->stop_id = id;
        s->stop_logprob = logprob;
        s->n_stop_top = n_top < ATLAS_ENGINE_MAX_TOP_LOGPROBS ? n_top : ATLAS_ENGINE_MAX_TOP_LOGPROBS;
        if (s->n_stop_top > 0) memcpy(s->stop_top, top, (size_t)s->n_stop_top * sizeof *top);
        return 1;
    }
    const char *piece = "";
    size_t len = 0;
    atlas_status st = atlas_detok_push(s->detok, id, &piece, &len);
    if (st == ATLAS_OK) st = pending_append(s, piece, len);
    if (st != ATLAS_OK) {
        atlas_engine_seq_fail(s, st, atlas_last_error());
        return 1;
    }
    int which = -1, ended = 0;
    long at = find_stop(s, &which);
    size_t release;
    if (at >= 0) {
        release = (size_t)at;
        s->finish = ATLAS_FINISH_STOP;
        s->stop_string = which;
        ended = 1;
    } else {
        release = s->n_pending - held_back(s);
    }
    atlas_event ev = {.type = ATLAS_EVENT_TOKEN, .text = s->pending, .text_len = release,
                      .id = id, .logprob = logprob, .top = top, .n_top = n_top,
                      .message = "", .stop_id = -1,
                      .usage = {.prompt_tokens = s->n_prompt,
                                .completion_tokens = s->n_tokens - s->n_prompt,
                                .cached_tokens = s->n_cached}};
    s->cb(&ev, s->user);
    if (ended) {
        s->n_pending = 0; /* the stop string and whatever followed it are dropped */
        return 1;
    }
    memmove(s->pending, s->pending + release, s->n_pending - release);
    s->n_pending -= release;
    if (s->n_tokens - s->n_prompt >= s->max_tokens || s->n_tokens >= s->cap) {
        s->finish = ATLAS_FINISH_LENGTH;
        return 1;
    }
    return 0;
}

void atlas_engine_seq_emit_end(atlas_engine *e, seq *s) {
    int release = (s->finish == ATLAS_FINISH_STOP && s->stop_string < 0) ||
                  s->finish == ATLAS_FINISH_LENGTH;
    if (release && s->detok) {
        const char *tail = "";
        size_t len = 0;
        if (atlas_detok_flush(s->detok, &tail, &len) == ATLAS_OK) pending_append(s, tail, len);
    }
    atlas_event ev = {
        .type = ATLAS_EVENT_END,
        .text = release ? s->pending : "",
        .text_len = release ? s->n_pending : 0,
        .finish = s->finish,
        .status = s->finish == ATLAS_FINISH_ERROR ? s->status : ATLAS_OK,
        /* no message kept (the copy of it failed for want of memory): the status's name */
        .message = s->finish != ATLAS_FINISH_ERROR ? ""
                   : s->message                    ? s->message
                                                   : atlas_status_str(s->status),
        .stop_string = s->stop_string >= 0 ? s->stop[s->stop_string] : NULL,
        .stop_id = s->finish == ATLAS_FINISH_STOP ? s->stop_id : -1,
        .logprob = s->finish == ATLAS_FINISH_STOP && s->stop_id >= 0 ? s->stop_logprob : 0,
        .top = s->stop_top,
        .n_top = s->finish == ATLAS_FINISH_STOP && s->stop_id >= 0 ? s->n_stop_top : 0,
        .usage = {.prompt_tokens = s->n_prompt,
                  .completion_tokens = s->n_tokens - s->n_prompt,
                  .cached_tokens = s->n_cached},
        .ttft_s = s->t_first > 0 ? s->t_first - s->t_submit : 0,
        .queue_s = s->t_admit > 0 ? s->t_admit - s->t_submit : 0,
        .embedding = s->finish == ATLAS_FINISH_STOP ? s->vec : NULL,
    };
    if (ev.embedding) ev.n_embedding = e->models[s->model].cfg.hidden;
    if (!ev.text) ev.text = "";
    atomic_store(&s->ended, 1);
    s->cb(&ev, s->user);
}
